"""OpenAI-compatible HTTP server with continuous batching.

    from llambda.server import ServerConfig, create_app, serve
    model = llambda.load("smollm2-135m", n_slots=8)
    serve(model, ServerConfig(parallel=8, port=8080))

`create_app` gives the ASGI app (Starlette) for any ASGI server; `serve` runs it
under uvicorn with a graceful SIGTERM.
"""
from .app import create_app
from .config import ServerConfig
from .runner import serve
from .scheduler import Scheduler

__all__ = ["ServerConfig", "create_app", "serve", "Scheduler"]

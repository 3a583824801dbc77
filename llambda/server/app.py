"""The HTTP side: Starlette routes, auth, body limits, SSE streaming, errors as OpenAI error objects."""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import ServerConfig
from .errors import APIError, bad_request
from .generation import ClientGone, Generation, Service
from .metrics import Metrics
from .openai_format import dumps
from .scheduler import Scheduler
from .schemas import parse_chat, parse_completion

log = logging.getLogger("llambda.server")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
PUBLIC = ("/health",)


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj).encode(), status_code=status, media_type="application/json", headers=headers)


def error_response(err: APIError) -> Response:
    return Response(err.json_bytes(), status_code=err.status, media_type="application/json", headers=err.headers)


async def read_json(request: Request, cap: int):
    """The body as JSON, refusing more than `cap` bytes (413) before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise bad_request("invalid Content-Length header") from None
        if size > cap:
            raise APIError(413, f"request body of {size} bytes exceeds the limit of {cap} bytes",
                           code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise APIError(413, f"request body exceeds the limit of {cap} bytes", code="request_too_large")
    if not body.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"malformed JSON in the request body: {e.msg} at line {e.lineno} column {e.colno}") \
            from None
    except RecursionError:
        raise bad_request("the JSON in the request body is nested too deeply") from None


async def _watch_disconnect(receive, gen: Generation) -> None:
    """Tell the generation when the client hangs up (after the body, the next message is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gen.client_gone()
            return


class EventStream:
    """An SSE response fed by a Generation; a client that hangs up cancels it at once."""

    def __init__(self, gen: Generation):
        self.gen = gen

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.create_task(_watch_disconnect(receive, self.gen))
        chunks = self.gen.stream()
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:     # the client went away mid-write
            pass
        finally:
            await chunks.aclose()
            watcher.cancel()
            self.gen.cancel()


class Gatekeeper:
    """ASGI middleware: API key (constant-time compare), request counting for /metrics."""

    def __init__(self, app, cfg: ServerConfig, metrics: Metrics):
        self.app, self.cfg, self.metrics = app, cfg, metrics
        self._key = cfg.api_key.encode() if cfg.api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        status = [499]   # nginx's "client closed request" unless a response starts

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.request_started(+1)
        try:
            if self._key is not None and path not in PUBLIC and not self._authorized(scope):
                err = APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await error_response(err)(scope, receive, send_counted)
                return
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.request_started(-1)
            self.metrics.request_done(endpoint, status[0])

    def _authorized(self, scope) -> bool:
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        # compare_digest runs in time independent of where the bytes differ
        ok = hmac.compare_digest(token.strip(), self._key)
        return ok and scheme.lower() == b"bearer"


def create_app(model, cfg: ServerConfig, scheduler: Scheduler | None = None,
               metrics: Metrics | None = None) -> Starlette:
    """The ASGI app serving `model` (a llambda.api.Model loaded with n_slots >= cfg.parallel)."""
    metrics = metrics or (scheduler.metrics if scheduler is not None else Metrics())
    if scheduler is None:
        scheduler = Scheduler(model.transformer, metrics, n_slots=cfg.parallel, prefill_chunk=cfg.prefill_chunk,
                              queue_size=cfg.queue_size)
    service = Service(model, scheduler, cfg)

    async def generate(request: Request, parse) -> Response:
        spec = parse(await read_json(request, cfg.max_body_bytes))
        gen = await service.start(spec)
        if spec.stream:
            return EventStream(gen)
        watcher = asyncio.create_task(_watch_disconnect(request.receive, gen))
        try:
            result = await gen.collect()
        except ClientGone:
            return Response(status_code=499)
        finally:
            watcher.cancel()
        return json_response(result)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, parse_chat)

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion)

    async def models(request: Request) -> Response:
        card = {"id": cfg.model_id, "object": "model", "created": int(metrics.started), "owned_by": "llambda",
                "meta": {"n_ctx": model.n_ctx, "n_vocab": model.config.vocab_size, "slots": scheduler.n_slots}}
        return json_response({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        s = scheduler.stats()
        w = service.workers.stats()
        # "stalled": no completion could start (every prompt worker stuck), though the loop answers
        status = "shutting_down" if scheduler.draining else "stalled" if service.prompts_stalled() else "ok"
        return json_response({"status": status, "slots_idle": s["slots"] - s["busy_slots"],
                              "slots_processing": s["busy_slots"], "queue": s["waiting"],
                              "prompts_preparing": w["busy"], "prompts_waiting": w["waiting"]},
                             status=200 if status == "ok" else 503)

    async def metrics_text(request: Request) -> Response:
        s = scheduler.stats()
        gauges = {
            "queue_depth": ("sequences waiting for a slot", s["waiting"]),
            "sequences_active": ("sequences holding a slot (prefilling or decoding)", s["active"]),
            "slots_busy": ("KV-cache slots in use", s["busy_slots"]),
            "slots_total": ("KV-cache slots", s["slots"]),
        }
        return Response(metrics.render(gauges), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def on_api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc)

    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            err = APIError(404, f"no route {request.method} {request.url.path}", code="not_found")
        elif exc.status_code == 405:
            err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                           kind="invalid_request_error", code="method_not_allowed")
        else:
            err = APIError(exc.status_code, str(exc.detail))
        return error_response(err)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(APIError(500, f"internal server error: {type(exc).__name__}"))

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        try:
            yield
        finally:
            service.workers.close()
            await asyncio.to_thread(scheduler.stop)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(Gatekeeper, cfg=cfg, metrics=metrics)],
                    exception_handlers={APIError: on_api_error, HTTPException: on_http_error, Exception: on_crash})
    app.state.service = service
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    app.state.config = cfg
    return app

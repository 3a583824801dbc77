"""`llambda serve`: the OpenAI-compatible server."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def register(sub, add_model_args) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching",
                       description="Serve /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", "-np", type=int, default=4,
                   help="sequences decoded together = KV-cache slots, each of --ctx-size tokens (default 4)")
    p.add_argument("--queue-size", type=int, default=64,
                   help="sequences that may wait for a slot; beyond that requests get 429 (default 64)")
    p.add_argument("--api-key", default=os.environ.get("LLAMBDA_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $LLAMBDA_API_KEY)")
    p.add_argument("--alias", default=None, help="model id to serve under (default: the -m name)")
    p.add_argument("--max-tokens-cap", type=int, default=None,
                   help="most tokens one request may generate (default: up to the context)")
    p.add_argument("--max-body", type=int, default=4 * 2**20, help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--prefill-chunk", type=int, default=256,
                   help="prompt tokens evaluated per step while other streams run (default 256)")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGTERM (default 30)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(fn=cmd_serve)


def model_id_for(name: str) -> str:
    """What /v1/models calls the model: a catalogued name as given, a file by its stem."""
    from .hub import CATALOG
    if name in CATALOG:
        return name
    return Path(name).stem or name


def cmd_serve(a: argparse.Namespace) -> int:
    from .api import load
    from .server import ServerConfig, serve
    from .server.config import DEFAULT_KV_TYPE

    if a.parallel < 1:
        raise ValueError("--parallel must be >= 1")
    if a.queue_size < 0 or a.max_body < 1 or a.prefill_chunk < 1:
        raise ValueError("--queue-size must be >= 0, --max-body and --prefill-chunk >= 1")
    if a.max_tokens_cap is not None and a.max_tokens_cap < 1:
        raise ValueError("--max-tokens-cap must be >= 1")
    model = load(a.model, backend=a.backend, threads=a.threads, n_ctx=a.ctx_size, n_slots=a.parallel,
                 activations=a.activations, kv_type=a.kv_type or DEFAULT_KV_TYPE)
    model_id = a.alias or model_id_for(a.model)
    aliases = {model.name, Path(a.model).name, Path(a.model).stem, a.model} - {model_id}
    cfg = ServerConfig(model_id=model_id, aliases=aliases, host=a.host, port=a.port, parallel=a.parallel,
                       queue_size=a.queue_size, max_tokens_cap=a.max_tokens_cap, max_body_bytes=a.max_body,
                       api_key=a.api_key, prefill_chunk=a.prefill_chunk, shutdown_grace=a.shutdown_grace)
    mem = model.memory_report()
    print(f"[llambda] serving {model_id} ({model.config.arch}, backend {model.backend.name}) on "
          f"http://{a.host}:{a.port}/v1 with {a.parallel} slots of {model.n_ctx} tokens; "
          f"memory {sum(mem.values()) / 2**20:.0f} MiB", file=sys.stderr, flush=True)
    try:
        return serve(model, cfg, log_level=a.log_level)
    finally:
        model.close()

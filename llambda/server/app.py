"""The HTTP side: Starlette routes, auth, body limits, SSE streaming, errors as OpenAI error objects."""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, nullcontext

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import web
from .accesslog import AccessLog
from . import anthropic_api, embeddings_api, llama_api, ollama_api, ollama_models, responses_api
from .config import ServerConfig
from .deltas import SSE_TYPE, Http, disconnected
from ..errors import ModelClosedError
from .errors import APIError, bad_request, model_not_found
from .generation import Generation, Service
from .metrics import Metrics
from .openai_format import adapter_cards, dumps
from .response_store import ResponseStore
from .scheduler import Scheduler
from .schemas import parse_chat, parse_completion, parse_json

log = logging.getLogger("llambda.server")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
             "/v1/responses", "/v1/responses/input_tokens", "/v1/messages", "/v1/messages/count_tokens",
             "/infill", "/tokenize", "/detokenize", "/apply-template") + ollama_api.PATHS
STORED_RESPONSE = "/v1/responses/{id}"    # the endpoint label of GET/DELETE /v1/responses/<id>[/input_items]
# "/": the chat page, or (without it) Ollama's "is running" line that clients probe
PUBLIC = ("/health", ollama_models.ROOT)
POOL_PROBE_SECONDS = 1.0   # /health: a worker thread must pick up a no-op within this long
_PARSERS = ThreadPoolExecutor(2, thread_name_prefix="llambda-json")   # request bodies (read_json)


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(obj).encode(), status_code=status, media_type="application/json", headers=headers)


def error_response(err: APIError) -> Response:
    return Response(err.json_bytes(), status_code=err.status, media_type="application/json", headers=err.headers)


def error_response_for(path: str):
    """The error shape a path's clients read: Anthropic's on /v1/messages, Ollama's under /api/,
    else OpenAI's."""
    if path in anthropic_api.PATHS:
        return anthropic_api.error_response
    return ollama_api.error_response if ollama_api.is_ollama_path(path) else error_response


async def read_body(request: Request, cap: int, timeout: float) -> bytes:
    """The body's bytes, refusing more than `cap` bytes (413) before reading them all, and a body
    still arriving after `timeout` seconds (408: a client trickling it would hold the connection)."""
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("identity", ""):      # read as it came, a gzip body was "not UTF-8 text"
        raise APIError(415, f"Content-Encoding {coding[:40]!r} is not supported: send the request body "
                       "uncompressed", code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None:
        # digits only: int() would take " 12", "1_0" and raise on 5000 digits
        if not (declared.isascii() and declared.isdigit() and len(declared) <= 18):
            raise bad_request("invalid Content-Length header")
        size = int(declared)
        if size > cap:
            raise APIError(413, f"request body of {size} bytes exceeds the limit of {cap} bytes",
                           code="request_too_large")
    body = bytearray()

    async def receive_all():
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > cap:
                raise APIError(413, f"request body exceeds the limit of {cap} bytes", code="request_too_large")

    try:
        await asyncio.wait_for(receive_all(), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout",
                       headers={"Connection": "close"}) from None
    return bytes(body)


async def read_json(request: Request, cap: int, timeout: float):
    """The body as JSON (limits as read_body's); an empty body is a 400."""
    body = await read_body(request, cap, timeout)
    if not body.strip():
        raise bad_request("the request body is empty; expected a JSON object")
    # in a thread of its own pool: a body of a million small values takes a second or more to parse
    # and check, which on the event loop would stall every running stream meanwhile, and in the
    # default pool could starve /health's probe of it
    return await asyncio.get_running_loop().run_in_executor(_PARSERS, parse_json, body)


def _noop() -> None:
    pass


async def _pool_answers(within: float) -> bool:
    """Whether the default executor, where Service.start renders and tokenizes, runs a task in time."""
    try:
        await asyncio.wait_for(asyncio.to_thread(_noop), within)
        return True
    except asyncio.TimeoutError:
        return False


def image_worker_state(service) -> dict:
    """/health's view of the image worker (a model with a vision tower): "idle", "encoding", or "stalled" (on one
    request's images past image_stall_seconds: text completions go on, so /health stays 200; requests with
    images wait, then get 429 once its queue is full), the requests waiting and the queue's size, and how long
    the current encoding has run."""
    pool = service.image_workers
    s = pool.stats()
    state = ("idle" if not s["busy"] else "stalled" if s["oldest_seconds"] > service.cfg.image_stall_seconds
             else "encoding")
    return {"state": state, "waiting": s["waiting"], "queue_size": pool.backlog,
            "encoding_seconds": round(s["oldest_seconds"], 3)}


async def _watch_disconnect(receive, gen: Generation) -> None:
    """Tell the generation when the client hangs up."""
    await disconnected(receive)
    gen.client_gone()


class EventStream:
    """A streamed response fed by a Generation: SSE of OpenAI chunks, or `chunks` in another API's
    format and `media_type` (Ollama's is newline-delimited JSON); a client that hangs up cancels it at once."""

    def __init__(self, gen: Generation, chunks=None, media_type: str = SSE_TYPE):
        self.gen = gen
        self.chunks = chunks
        self.media_type = media_type.encode("latin-1")

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.create_task(_watch_disconnect(receive, self.gen))
        chunks = self.chunks if self.chunks is not None else self.gen.stream()
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", self.media_type),
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


def is_loopback(host: str) -> bool:
    """Whether `host` (the address bound) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def local_host_header(value: bytes) -> bool:
    """Whether a Host header names this machine by an IP address or a local name. A browser tricked by
    DNS rebinding sends the attacker's domain here, which the server must then refuse."""
    text = value.decode("latin-1").strip().lower()
    name = text[1:text.find("]")] if text.startswith("[") else text.rsplit(":", 1)[0]
    name = name.rstrip(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or name == socket.gethostname().lower()


def cross_site(headers: dict[bytes, bytes]) -> bool:
    """Whether a browser sent this request for a page of another origin (a hostile page POSTing to the
    local server: a text/plain body needs no CORS preflight, so it would run unasked). Browsers say so
    in Sec-Fetch-Site; older ones only in Origin. Non-browser clients send neither. A browser extension or
    an app's web view (chrome-extension://, vscode-webview://...) is let through: no web page has its origin."""
    origin = headers.get(b"origin")
    if origin is not None and not origin.lower().startswith((b"http://", b"https://", b"null")):
        return False
    site = headers.get(b"sec-fetch-site")
    if site is not None:
        return site.lower() not in (b"same-origin", b"none")
    return origin is not None and origin.partition(b"://")[2].lower() != headers.get(b"host", b"").lower()


class Gatekeeper:
    """ASGI middleware: Host and cross-site checks, API key (constant-time compare), request counting
    for /metrics."""

    def __init__(self, app, cfg: ServerConfig, metrics: Metrics):
        self.app, self.cfg, self.metrics = app, cfg, metrics
        self._key = cfg.api_key.encode() if cfg.api_key else None
        self._public = PUBLIC + (web.PATHS if cfg.webui else ())   # the page asks for the key itself
        # bound to loopback, only local names are right in Host (bound wider, the machine's names are unknown)
        self._check_host = is_loopback(cfg.host)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else STORED_RESPONSE if path.startswith("/v1/responses/") else "other"
        status = [499]   # nginx's "client closed request" unless a response starts

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.metrics.request_started(+1)
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response_for(path)(refusal)(scope, receive, send_counted)
                return
            if self._key is not None and path not in self._public and not self._authorized(scope):
                err = APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>' "
                               "(or 'x-api-key: <key>')", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
                # Anthropic's and Ollama's clients read errors in their own shapes
                await error_response_for(path)(err)(scope, receive, send_counted)
                return
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.request_started(-1)
            self.metrics.request_done(endpoint, status[0])

    def _refusal(self, scope) -> APIError | None:
        """A 403 for a request from a DNS-rebound name or, unless a GET or HEAD, from another site's page."""
        headers = {name: value for name, value in scope.get("headers", [])
                   if name in (b"host", b"origin", b"sec-fetch-site")}
        host = headers.get(b"host")
        if self._check_host and host is not None and not local_host_header(host):
            return APIError(403, f"the Host header {host.decode('latin-1')[:100]!r} is not a local name; this "
                            f"server is bound to {self.cfg.host} and answers requests for localhost or an IP "
                            "address only (a guard against DNS rebinding)", code="forbidden_host")
        if scope.get("method") not in ("GET", "HEAD") and cross_site(headers):
            return APIError(403, "cross-origin requests are refused: a page of another site may not call this "
                            "server", code="forbidden_origin")
        return None

    def _authorized(self, scope) -> bool:
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
                break
            if name == b"x-api-key":        # how Anthropic's clients send the key
                given = b"Bearer " + value
        scheme, _, token = given.partition(b" ")
        # compare_digest runs in time independent of where the bytes differ
        ok = hmac.compare_digest(token.strip(), self._key)
        return ok and scheme.lower() == b"bearer"


def _http(cfg: ServerConfig) -> Http:
    """What the endpoint modules get from this one (so that they never import it)."""
    return Http(read_body=lambda request: read_json(request, cfg.max_body_bytes, cfg.body_timeout),
                watch_disconnect=_watch_disconnect, event_stream=EventStream, json_response=json_response)


async def _on_api_error(request: Request, exc: APIError) -> Response:
    return error_response_for(request.url.path)(exc)     # in the shape the path's clients read


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    """The router's 404 (no route) and 405 (a route, not for this method: its Allow header kept), the same
    on a decoder's app and an encoder's."""
    if exc.status_code == 404:
        err = APIError(404, f"no route {request.method} {request.url.path}", code="not_found")
    elif exc.status_code == 405:
        err = APIError(405, f"method {request.method} is not allowed on {request.url.path}",
                       code="method_not_allowed", headers=dict(exc.headers or {}))
    else:
        err = APIError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    return error_response_for(request.url.path)(err)


CLOSED = ("the model was closed (Model.close() by the program serving it): this server can no longer answer; "
          "restart it")


async def _on_closed(request: Request, exc: ModelClosedError) -> Response:
    """A request reaching a model its program closed while serving it: a 503 saying so, not a 500 and
    a stack trace in the log per request."""
    return error_response_for(request.url.path)(APIError(503, CLOSED, code="model_closed"))


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return error_response_for(request.url.path)(APIError(500, f"internal server error: {type(exc).__name__}"))


def _encoder_app(model, cfg: ServerConfig, metrics: Metrics) -> Starlette:
    """An encoder (embedding model, reranker) serves /v1/embeddings, /v1/rerank, /rerank, /v1/models,
    /health and /metrics: no scheduler, no generation; auth, limits and errors as for a decoder."""
    from types import SimpleNamespace

    def check_model(name):
        if not cfg.accepts(name):
            raise model_not_found(name, cfg.model_id)

    service = SimpleNamespace(model=model, cfg=cfg, scheduler=None, check_model=check_model)

    async def models(request: Request) -> Response:
        card = {"id": cfg.model_id, "object": "model", "created": int(metrics.started), "owned_by": "llambda",
                "meta": {"n_ctx": model.n_ctx, "n_vocab": model.config.vocab_size,
                         "n_embd": model.config.hidden, "reranker": model.is_reranker}}
        return json_response({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        if model.closed:
            return json_response({"status": "unavailable", "reason": CLOSED}, status=503)
        return json_response({"status": "ok"})

    async def metrics_text(request: Request) -> Response:
        return Response(metrics.render({}), media_type="text/plain; version=0.0.4; charset=utf-8")

    http = _http(cfg)
    routes = [Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics_text, methods=["GET"]), ollama_models.root_route()] \
        + embeddings_api.routes(service, http) + ollama_api.embedding_routes(service, http)
    app = Starlette(routes=routes,
                    middleware=[Middleware(AccessLog), Middleware(Gatekeeper, cfg=cfg, metrics=metrics)],
                    exception_handlers={APIError: _on_api_error, HTTPException: _on_http_error,
                                        ModelClosedError: _on_closed, Exception: _on_crash})
    app.state.service, app.state.scheduler, app.state.metrics, app.state.config = service, None, metrics, cfg
    return app


def create_app(model, cfg: ServerConfig, scheduler: Scheduler | None = None,
               metrics: Metrics | None = None) -> Starlette:
    """The ASGI app serving `model` (a llambda.api.Model loaded with n_slots >= cfg.parallel)."""
    metrics = metrics or (scheduler.metrics if scheduler is not None else Metrics())
    if getattr(model, "is_encoder", False):
        return _encoder_app(model, cfg, metrics)
    if scheduler is None:
        scheduler = Scheduler(model.transformer, metrics, n_slots=cfg.parallel, prefill_chunk=cfg.prefill_chunk,
                              queue_size=cfg.queue_size)
    service = Service(model, scheduler, cfg)
    http = _http(cfg)

    async def generate(request: Request, parse, in_thread: bool = False) -> Response:
        # a Generation streams OpenAI's chunks and collects OpenAI's answer itself
        return await http.generate(request, service, lambda body: (parse(body), lambda gen: gen), in_thread)

    async def chat_completions(request: Request) -> Response:
        # in a worker thread: decoding a body's base64 images would stall the event loop's streams
        return await generate(request, parse_chat, in_thread=True)

    async def completions(request: Request) -> Response:
        return await generate(request, parse_completion)

    async def models(request: Request) -> Response:
        # vision: the model takes images (a vision tower is attached): the chat page shows its image input then
        card = {"id": cfg.model_id, "object": "model", "created": int(metrics.started), "owned_by": "llambda",
                "meta": {"n_ctx": model.n_ctx, "n_vocab": model.config.vocab_size, "slots": scheduler.n_slots,
                         "vision": not model.closed and model.accepts_images}}
        adapters = adapter_cards(model)     # merged at load, by file name: where they lie on the server's
        if adapters:                        # disk is not the clients' business
            card["meta"]["adapters"] = adapters
        return json_response({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        """200 when a completion can be served now; 503 with the reason when it cannot."""
        s = scheduler.stats()
        w = service.workers.stats()
        reason = CLOSED if model.closed else scheduler.health(cfg.stall_timeout)
        if reason is None and service.prompts_stalled():
            reason = (f"every prompt worker has been on one prompt for over {cfg.prompt_stall_seconds:g} s: "
                      "no completion can start")
        if reason is None and not await _pool_answers(POOL_PROBE_SECONDS):
            reason = (f"no worker thread picked up a task within {POOL_PROBE_SECONDS:g} s: the event loop's "
                      "thread pool is exhausted")
        status = ("ok" if reason is None else "shutting_down" if scheduler.draining
                  else "stalled" if service.prompts_stalled() else "unavailable")
        body = {"status": status, "slots_idle": s["slots"] - s["busy_slots"],
                "slots_processing": s["busy_slots"], "queue": s["waiting"],
                "prompts_preparing": w["busy"], "prompts_waiting": w["waiting"]}
        if not model.closed and model.vision is not None:
            body["image_worker"] = image_worker_state(service)
        if reason is not None:
            body["reason"] = reason
            if not scheduler.draining:      # expected while draining; otherwise worth a (rate-limited) line
                log.warning("/health: %s", reason)
        return json_response(body, status=200 if reason is None else 503)

    def render_metrics() -> str:
        s, i, rows = scheduler.stats(), service.image_workers.stats(), service.image_rows.stats()
        gauges = {
            "queue_depth": ("sequences waiting for a slot", s["waiting"]),
            "sequences_active": ("sequences holding a slot (prefilling or decoding)", s["active"]),
            "slots_busy": ("KV-cache slots in use", s["busy_slots"]),
            "slots_total": ("KV-cache slots", s["slots"]),
            "image_queue_depth": ("requests waiting for the image worker (the vision tower)", i["waiting"]),
            "image_worker_busy": ("1 while the image worker encodes a request's images", i["busy"]),
            "image_rows_bytes": ("bytes of encoded image rows reserved by requests (waiting for the image worker, "
                                 "encoding, queued or prefilling)", rows["held"]),
            "image_rows_budget_bytes": ("the most bytes of encoded image rows requests hold at once "
                                        "(--image-rows-memory)", rows["limit"]),
            "image_rows_waiting": ("requests waiting for room for their images' rows", rows["waiting"]),
        }
        return metrics.render(gauges)

    async def metrics_text(request: Request) -> Response:
        return Response(render_metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @asynccontextmanager
    async def lifespan(app):
        # a library call computing on the model now finishes first; later ones get ModelBusyError, on
        # the draft model too (the scheduler drafts with it)
        drafter = getattr(model, "drafter", None)
        with getattr(model, "_lock", None) or nullcontext():
            scheduler.start(also=[drafter.model] if drafter is not None else [])
        # llguidance's view of the vocabulary (~0.3-1 s), built now rather than in the first
        # constrained request's time to first token
        asyncio.get_running_loop().run_in_executor(None, service.warm_grammars)
        try:
            yield
        finally:
            service.close_workers()
            await asyncio.to_thread(scheduler.stop)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]
    routes += web.routes() if cfg.webui else [ollama_models.root_route()]
    # the other APIs' endpoints, each in its own module
    responses = ResponseStore(cfg.stored_responses, cfg.stored_bytes, cfg.replica_tag)
    routes += responses_api.routes(service, http, responses)
    for module in (llama_api, anthropic_api, embeddings_api, ollama_api):
        routes += module.routes(service, http)
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(AccessLog), Middleware(Gatekeeper, cfg=cfg, metrics=metrics)],
                    exception_handlers={APIError: _on_api_error, HTTPException: _on_http_error,
                                        ModelClosedError: _on_closed, Exception: _on_crash})
    app.state.service = service
    app.state.scheduler = scheduler
    app.state.metrics = metrics
    app.state.config = cfg
    app.state.responses = responses     # what /v1/responses stored
    app.state.render_metrics = render_metrics     # /metrics' text (a replica under Ray reports it)
    return app

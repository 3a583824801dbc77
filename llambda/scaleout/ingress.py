"""The ingress deployment: reads each HTTP request, computes its prefix keys, and forwards it through
a handle whose router (routers.py) picks the replica; streams the answer back. It also answers
/metrics for the whole deployment. A replica that dies before the client got anything costs a retry on
another (a JSON answer is read whole first); one that dies mid-stream ends that stream with an error
(an SSE error event, or Ollama's last {"error"} line). Errors have the shape of the path's API."""
from __future__ import annotations

import hmac
from collections import Counter
from typing import AsyncIterator

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from ..server.app import error_response, error_response_for, read_body
from ..server.errors import APIError
from ..server.ollama_api import NDJSON, ndjson_error
from ..server.openai_format import SSE_DONE, sse
from . import metrics_merge, router_state
from .forwarding import FORWARDED_HEADERS, ForwardedRequest, route_of
from .options import ScaleoutOptions

REPLICA_GONE = (RayActorError, ActorUnavailableError)
TRIES = 2     # a request nothing was sent back for yet goes to a second replica if the first dies


STREAMED = (b"text/event-stream", NDJSON.encode())     # SSE, and Ollama's newline-delimited JSON


def _stream_type(headers) -> bytes | None:
    """The streamed media type of a replica's answer, or None for a whole one."""
    for k, v in headers:
        if k.lower() == b"content-type":
            return next((t for t in STREAMED if v.startswith(t)), None)
    return None


def _app_path(scope) -> str:
    """The path within the application: Serve keeps its route prefix in the path (and in root_path)."""
    path, root = scope.get("path", "/"), scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path or "/"


class IngressServer:
    def __init__(self, engine, options: dict):
        opts = ScaleoutOptions.from_dict(options)
        self.cfg = opts.server_config()
        self.engine = engine.options(stream=True)
        self.counts: Counter[str] = Counter()

    async def __call__(self, request: Request) -> Response:
        path = _app_path(request.scope)
        if path == "/metrics" and request.method == "GET":
            return self._metrics(request)
        try:
            body = await read_body(request, self.cfg.max_body_bytes, self.cfg.body_timeout)
        except APIError as e:
            return error_response_for(path)(e)
        except ClientDisconnect:
            return Response(status_code=499)
        prefix, tag = route_of(request.method, path, body)
        req = ForwardedRequest(request.method, path, request.scope.get("query_string", b""),
                               [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED_HEADERS], body,
                               prefix, tag)
        return await self._forward(req)

    async def _forward(self, req: ForwardedRequest) -> Response:
        respond_error = error_response_for(req.path)      # in the shape the path's clients read
        for attempt in range(1, TRIES + 1):
            stream = self.engine.handle.remote(req)
            try:
                head = await stream.__anext__()
                headers = [(k, v) for k, v in head["headers"] if k.lower() != b"content-length"]
                streamed = _stream_type(headers)
                if streamed is not None:
                    response = StreamingResponse(self._rest(stream, streamed), status_code=head["status"])
                    response.raw_headers = headers
                    return response
                # a whole JSON answer: read it all here, so a replica dying mid-body costs a retry
                body = b"".join([chunk async for chunk in stream])
            except BackPressureError:
                self.counts["rejected_full"] += 1
                return respond_error(APIError(429, "every replica is busy and the queue is full; retry later",
                                              code="server_busy",
                                              headers={"Retry-After": str(self.cfg.retry_after)}))
            except REPLICA_GONE as e:
                stream.cancel()
                if attempt < TRIES:
                    self.counts["retried"] += 1
                    continue
                self.counts["failed"] += 1
                return respond_error(APIError(503, f"the replica serving this request failed: {type(e).__name__}",
                                              headers={"Retry-After": str(self.cfg.retry_after)}))
            except StopAsyncIteration:
                return respond_error(APIError(502, "the replica sent no response"))
            response = Response(body, status_code=head["status"])
            response.raw_headers = headers + [(b"content-length", str(len(body)).encode())]
            return response
        raise AssertionError("unreachable")

    async def _rest(self, stream, media_type: bytes) -> AsyncIterator[bytes]:
        ndjson, ended = media_type == NDJSON.encode(), False
        try:
            async for chunk in stream:
                ended = _ends_stream(chunk, ndjson)
                yield chunk
        except REPLICA_GONE as e:
            self.counts["failed_mid_stream"] += 1
            if ended:       # it died after its stream's last event: the client has the whole answer
                return
            # the client reads an error and the end of the stream, as when a server drains
            err = APIError(503, f"the replica serving this stream failed: {type(e).__name__}")
            if ndjson:
                yield ndjson_error(err)
            else:
                yield sse(err.body())
                yield SSE_DONE
        finally:
            stream.cancel()     # a client gone mid-stream: the replica cancels the generation

    def _metrics(self, request: Request) -> Response:
        if self.cfg.api_key and not self._authorized(request):
            return error_response(APIError(401, "missing or invalid API key", code="invalid_api_key"))
        replicas = router_state.live_replicas()
        lines = ["# HELP llambda_replicas replicas the router sends requests to",
                 "# TYPE llambda_replicas gauge", f"llambda_replicas {len(replicas)}",
                 "# HELP llambda_replica_up a replica (its id and process) that reported its metrics",
                 "# TYPE llambda_replica_up gauge"]
        lines += [f'llambda_replica_up{{replica="{rid}",pid="{stats.get("pid", "")}"}} 1'
                  for rid, stats in sorted(replicas.items()) if "metrics" in stats]
        lines += ["# HELP llambda_router_requests_total requests routed, by how the replica was chosen",
                  "# TYPE llambda_router_requests_total counter"]
        lines += [f'llambda_router_requests_total{{decision="{k}"}} {n}'
                  for k, n in sorted(router_state.decisions().items())]
        lines += ["# HELP llambda_ingress_replica_failures_total requests whose replica failed or was full",
                  "# TYPE llambda_ingress_replica_failures_total counter"]
        lines += [f'llambda_ingress_replica_failures_total{{outcome="{k}"}} {n}' for k, n in sorted(self.counts.items())]
        merged = metrics_merge.merge(s["metrics"] for s in replicas.values() if "metrics" in s)
        return Response("\n".join(lines) + "\n" + merged, media_type="text/plain; version=0.0.4; charset=utf-8")

    def _authorized(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.cfg.api_key.encode())


def _ends_stream(chunk: bytes, ndjson: bool) -> bool:
    """Whether a replica's chunk closes its stream: SSE's [DONE], or an Ollama line whose "done" is true (a
    "done" inside a text is escaped, \\"done\\", so it cannot match)."""
    if not ndjson:
        return chunk.endswith(SSE_DONE)
    last = chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return b'"done":true' in last or b'"done": true' in last

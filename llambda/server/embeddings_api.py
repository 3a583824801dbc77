"""POST /v1/embeddings (OpenAI's shape) and POST /v1/rerank, /rerank (llama-server's shape).

Embeddings: `input` is a string, a list of strings, a list of token ids or a list of lists of ids;
`encoding_format` "float" (default) or "base64" (the float32 little-endian bytes, as OpenAI's
client decodes them); `dimensions` only when it equals the model's (no Matryoshka truncation here).
Encoders (BERT family) pool as the model says (mean for sentence-transformers models) and
truncate each text at the model's length; a decoder model is pooled on its last token. Vectors
are L2-normalized.

Rerank: {query, documents, top_n} -> results sorted by relevance_score, for cross-encoders (a BERT
with a sequence-classification head); any other model answers 400 "this model is not a reranker".

Encoders run on their own (the server holds no generation scheduler for them); a decoder's
embeddings run on the scheduler thread between its steps (Scheduler.call), in a slot kept out of
generation, so they never share the model's buffers with a running step.
"""
from __future__ import annotations

import asyncio
import base64
import threading
from types import SimpleNamespace

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ContextOverflowError, InvalidInputError, TokenizerError
from .deltas import Http
from .errors import APIError, bad_request
from .generation import ClientGone
from .scheduler import ShuttingDown
from .schemas import _Body, _type, check_text_chars

MAX_INPUTS = 2048           # OpenAI's limit on inputs per request
MAX_DOCUMENTS = 1024


def parse_input(value) -> list:
    """`input` -> a list of strings or of lists of ids; 400 naming what is wrong."""
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(type(i) is int for i in value):
        value = [value]      # one input as token ids
    if not isinstance(value, list):
        raise bad_request(f"'input' must be a string, an array of strings, an array of token ids or an array "
                          f"of arrays of token ids, got {_type(value)}", param="input")
    if not value:
        raise bad_request("'input' must not be empty", param="input")
    if len(value) > MAX_INPUTS:
        raise bad_request(f"'input' has {len(value)} items; at most {MAX_INPUTS}", param="input")
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise bad_request(f"'input[{i}]' is an empty string", param="input")
        elif isinstance(item, list):
            if not item or not all(type(t) is int for t in item):
                raise bad_request(f"'input[{i}]' must be a non-empty array of token ids (integers)", param="input")
        else:
            raise bad_request(f"'input[{i}]' must be a string or an array of token ids, got {_type(item)}",
                              param="input")
    check_text_chars(value, "input")
    return value


def embed(service, body, gone: threading.Event, truncate: bool | None = None) -> dict:
    """The vectors of `body`'s inputs as OpenAI returns them (`gone`: set when the client left). An
    input longer than the model's context is cut to its start with truncate=True (Ollama's default),
    refused with False; None (/v1/embeddings) is the model's own way: an encoder cuts at its length,
    a decoder refuses (as OpenAI's API refuses a text too long)."""
    b = _Body(body)
    service.check_model(b.string("model"))     # a string: a list or object would be a 500 in the lookup
    items = parse_input(b.get("input"))
    fmt = b.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", param="encoding_format")
    model = service.model
    dim = model.config.hidden if model.is_encoder else model.config.d_model
    dims = b.integer("dimensions", None, lo=1)
    if dims is not None and dims != dim:
        raise bad_request(f"'dimensions' {dims} is not supported: {service.cfg.model_id!r} gives vectors of "
                          f"{dim} dimensions only", param="dimensions")
    cut = model.is_encoder if truncate is None else truncate
    try:
        counts = model.embed_token_counts(items, truncate=cut)
        if truncate is False:
            _refuse_longer(service, counts)
        rows = vectors(service, items, counts, gone, cut)
    except (InvalidInputError, TokenizerError, ContextOverflowError) as e:
        raise bad_request(str(e), param="input") from None
    data = []
    for i, v in enumerate(rows):
        if fmt == "base64":
            le = v.astype("<f4", copy=False)
            emb = base64.b64encode(le.tobytes()).decode("ascii")
        else:
            emb = v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = int(sum(counts))
    return {"object": "list", "data": data, "model": service.cfg.model_id,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def _refuse_longer(service, counts: list[int]) -> None:
    n_ctx = service.model.n_ctx
    for i, n in enumerate(counts):
        if n > n_ctx:
            raise bad_request(f"'input[{i}]' has {n} tokens, more than {service.cfg.model_id!r}'s context of "
                              f"{n_ctx}; shorten it, or send truncate: true to cut it", param="input",
                              code="context_length_exceeded")


def rerank(service, body) -> dict:
    b = _Body(body)
    service.check_model(b.string("model"))
    model = service.model
    if not getattr(model, "is_reranker", False):
        raise bad_request(f"this model is not a reranker: {service.cfg.model_id!r} has no cross-encoder "
                          "(sequence-classification) head", code="not_a_reranker")
    query = b.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request(f"'query' must be a non-empty string, got {_type(query)}", param="query")
    docs = b.get("documents")
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise bad_request("'documents' must be a non-empty array of strings", param="documents")
    if len(docs) > MAX_DOCUMENTS:
        raise bad_request(f"'documents' has {len(docs)} items; at most {MAX_DOCUMENTS}", param="documents")
    top_n = b.integer("top_n", len(docs), lo=1)
    with_text = b.boolean("return_documents", False) or b.boolean("return_text", False)
    try:
        scores = model.score(query, docs)
        tokens = sum(len(ids) for ids, _ in model.tokenizer.encode_for_encoder(
            [(query, d) for d in docs], model.config.max_tokens))
    except (InvalidInputError, TokenizerError) as e:
        raise bad_request(str(e), param="documents") from None
    order = sorted(range(len(docs)), key=lambda i: -float(scores[i]))[:top_n]
    results = []
    for i in order:
        r = {"index": i, "relevance_score": float(scores[i])}
        if with_text:
            r["document"] = {"text": docs[i]}
        results.append(r)
    return {"object": "list", "model": service.cfg.model_id, "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def vectors(service, items, counts, gone: threading.Event, truncate: bool = False) -> np.ndarray:
    """The inputs' vectors (any thread): an encoder's own (cut at its length), or a decoder's on the
    scheduler thread (cut at the context with truncate, else refused past it)."""
    model, scheduler = service.model, service.scheduler
    if model.is_encoder:
        return model.embed(items)
    # a decoder: on the scheduler thread, between steps, in a slot generation does not use
    spare = model.transformer.n_slots - 1
    if spare < scheduler.n_slots:
        raise bad_request(f"{service.cfg.model_id!r} has no KV-cache slot to spare for embeddings: load it "
                          "with more slots than the server's parallel sequences (`llambda serve` does)")
    # a call per prefill chunk's worth of tokens (a long input alone): running streams get a step
    # between calls instead of waiting for all the inputs (thousands of long ones would stall every
    # stream for minutes), and a client that left stops costing anything at the next call
    groups, size = [[]], 0
    for item, n in zip(items, counts):
        if groups[-1] and size + n > service.cfg.prefill_chunk:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += n
    rows = []
    for group in groups:
        if gone.is_set():
            raise ClientGone()
        try:
            rows.append(scheduler.call(lambda group=group: model.embed(group, slot=spare, truncate=truncate)))
        except ShuttingDown as e:
            raise APIError(503, str(e)) from None
    return np.concatenate(rows)


async def answer(http: Http, request: Request, fn, service=None) -> Response:
    """`fn(body, gone)` run in a thread as JSON; `gone` is set when the client hangs up. A decoder's
    (`service` a generation.Service): in its embedding workers, not the event loop's default executor,
    where requests waiting for the scheduler took every thread (chats hung, /health said 503)."""
    body = await http.body(request)
    if body is None:
        return Response(status_code=499)
    gone = threading.Event()
    # the watcher wants a generation; only its client_gone() is called
    watcher = asyncio.create_task(http.watch_disconnect(request.receive, SimpleNamespace(client_gone=gone.set)))
    try:
        if hasattr(service, "in_worker"):          # a decoder's Service (an encoder's app has none)
            return http.json_response(await service.in_worker(fn, body, gone, pool=service.embed_workers))
        return http.json_response(await asyncio.to_thread(fn, body, gone))
    except ClientGone:
        return Response(status_code=499)
    finally:
        watcher.cancel()


def routes(service, http: Http) -> list[Route]:
    async def embeddings_route(request: Request) -> Response:
        return await answer(http, request, lambda body, gone: embed(service, body, gone), service)

    async def rerank_route(request: Request) -> Response:
        return await answer(http, request, lambda body, gone: rerank(service, body), service)

    return [Route("/v1/embeddings", embeddings_route, methods=["POST"]),
            Route("/v1/rerank", rerank_route, methods=["POST"]),
            Route("/rerank", rerank_route, methods=["POST"])]

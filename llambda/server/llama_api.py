"""llama-server's own endpoints, in its request and response shapes: /tokenize, /detokenize,
/apply-template and /infill (fill-in-the-middle, what editor plugins such as llama.vim call).

/infill takes input_prefix, input_suffix, input_extra ([{filename, text}] context files) and
prompt (text typed after the prefix), with the sampling fields /v1/completions takes (and
llama-server's `n_predict` for max_tokens); it answers as llama-server's /completion does:
`content`, `stop`, `stop_type`, token counts; streamed as `data: {"content", "stop"}` lines.
"""
from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ChatTemplateError, TokenizerError
from .deltas import Http, array_of, deltas, stop_sequence
from .errors import APIError, bad_request
from .fim import require_fim
from .generation import Generation, Service
from .openai_format import sse
from .schemas import _Body, _type, check_text_chars, parse_chat, parse_completion

MAX_EXTRA_FILES = 256


def _tokenizer(service: Service):
    tok = service.model.tokenizer
    if tok is None:
        why = service.model.source.tokenizer_error or "the model has no tokenizer"
        raise bad_request(f"this model cannot tokenize text: {why}")
    return tok


def tokenize(service: Service, body) -> dict:
    b = _Body(body)
    content = b.get("content")
    if not isinstance(content, str):
        raise bad_request(f"'content' must be a string, got {_type(content)}", param="content")
    check_text_chars([content], "content")
    add_special = b.boolean("add_special", False)
    parse_special = b.boolean("parse_special", True)
    with_pieces = b.boolean("with_pieces", False)
    tok = _tokenizer(service)
    try:
        ids = tok.encode(content, add_bos=add_special, parse_special=parse_special)
    except TokenizerError as e:
        raise bad_request(str(e), param="content") from None
    if not with_pieces:
        return {"tokens": ids}
    out = []
    for i in ids:
        raw = tok.token_bytes(i)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:      # part of a character: llama-server gives the bytes
            piece = list(raw)
        out.append({"id": i, "piece": piece})
    return {"tokens": out}


def detokenize(service: Service, body) -> dict:
    tokens = _Body(body).get("tokens")
    if tokens is None:
        tokens = []
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise bad_request("'tokens' must be an array of token ids (integers)", param="tokens")
    try:
        return {"content": _tokenizer(service).decode(tokens)}
    except TokenizerError as e:
        raise bad_request(str(e), param="tokens") from None


def apply_template(service: Service, body) -> dict:
    spec = parse_chat(body)
    try:
        return {"prompt": service.chat_prompt(spec)}
    except ChatTemplateError as e:
        raise bad_request(f"cannot render the messages: {e}", param="messages") from None


def parse_infill(body):
    """An /infill body as a completion spec in FIM mode (prompt: the text before the gap)."""
    b = _Body(body)
    prefix = b.string("input_prefix", "")
    suffix = b.string("input_suffix", "")
    typed = b.string("prompt", "")
    files = _extra(b.get("input_extra"))
    check_text_chars([prefix, suffix, typed] + [text for _, text in files], "input_prefix")
    as_completion = {k: v for k, v in body.items() if k not in ("prompt", "suffix", "echo")}
    n_predict = b.integer("n_predict", None, -1)
    if n_predict is not None and body.get("max_tokens") is None:
        as_completion["max_tokens"] = None if n_predict < 0 else n_predict     # -1: llama-server's "no limit"
    as_completion["prompt"] = prefix + typed
    spec = parse_completion(as_completion)
    if spec.n != 1:
        raise bad_request("/infill generates one completion: 'n' must be 1", param="n")
    spec.suffix = suffix
    spec.fim_files = files
    return spec


def _extra(v) -> list[tuple[str, str]]:
    out = []
    for i, chunk in enumerate(array_of(v, "input_extra", "{filename, text} objects", MAX_EXTRA_FILES)):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict):
            raise bad_request(f"{where} must be an object with 'filename' and 'text', got {_type(chunk)}",
                              param=where)
        c = _Body(chunk)
        try:
            out.append((c.string("filename", "tmp"), c.string("text", "")))
        except APIError as e:
            raise bad_request(f"{where}: {e.message}", param=where) from None
    return out


class Infill:
    """One /infill request: llama-server's /completion answer over a Generation."""

    def __init__(self, service: Service, gen: Generation):
        self.service, self.gen = service, gen

    def summary(self, content: str, finish: str | None) -> dict:
        u = self.gen.usage()
        word = stop_sequence(self.gen)
        stop_type = "limit" if finish == "length" else "word" if word else "eos"
        prompt = self.service.model.tokenizer.decode(self.gen.prompts[0])
        return {"index": 0, "content": content, "id_slot": -1, "stop": True, "model": self.gen.model_id,
                "tokens_predicted": u.completion, "tokens_evaluated": u.prompt, "tokens_cached": u.cached,
                "prompt": prompt, "truncated": False, "has_new_line": "\n" in content,
                "stop_type": stop_type, "stopping_word": word or ""}

    async def collect(self) -> dict:
        parts, finish = [], None
        async for d in deltas(self.gen):
            parts.append(d.text)
            finish = d.finish
        return self.summary("".join(parts), finish)

    async def stream(self):
        try:
            async for d in deltas(self.gen):
                if d.text:
                    yield sse({"index": 0, "content": d.text, "stop": False})
                if d.finish:
                    yield sse(self.summary("", d.finish))
        except APIError as e:
            yield sse(e.body())


def routes(service: Service, http: Http) -> list[Route]:
    async def run(request: Request, fn) -> Response:
        body = await http.body(request)
        if body is None:
            return Response(status_code=499)
        # tokenizing or rendering a long text must not stall the event loop's streams; in the prompt workers
        # (bounded: 429 past their backlog), as a chat's own render and tokenizing
        return http.json_response(await service.in_worker(fn, service, body))

    async def tokenize_route(request: Request) -> Response:
        return await run(request, tokenize)

    async def detokenize_route(request: Request) -> Response:
        return await run(request, detokenize)

    async def apply_template_route(request: Request) -> Response:
        return await run(request, apply_template)

    def parse(body):
        spec = parse_infill(body)
        require_fim(service.fim, service.cfg.model_id, "input_prefix")    # before queueing anything
        return spec, lambda gen: Infill(service, gen)

    async def infill_route(request: Request) -> Response:
        return await http.generate(request, service, parse)

    return [Route("/tokenize", tokenize_route, methods=["POST"]),
            Route("/detokenize", detokenize_route, methods=["POST"]),
            Route("/apply-template", apply_template_route, methods=["POST"]),
            Route("/infill", infill_route, methods=["POST"])]


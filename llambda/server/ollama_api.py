"""Ollama's REST API (/api/chat, /api/generate, ...) over the same scheduler as chat completions.

A request becomes a chat-completions (or, for `raw` and `suffix` generations, a completions) body
and is validated by `schemas.parse_chat` / `parse_completion`, so every sampling rule and limit is
the one those routes have; `options` map onto their fields (num_predict -> max_tokens), `format`
onto `response_format`/`json_schema`, Ollama's messages (tool_calls with object arguments,
tool_name, images as image parts before the text: images.py) onto OpenAI's. Answers stream as newline-delimited JSON objects, the last with
`done: true`, the finish and the durations in nanoseconds; `stream: false` gives that last object
with the whole answer. Every error is `{"error": "message"}` with a 4xx status, or, once a stream
has started, its last line. The model-management calls (pull, push, create, copy, delete) are
refused: this server serves the one model it was started with. The model listings are in
ollama_models.py.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..chat import image_content
from ..thinking import think_template_kwargs
from . import embeddings_api, ollama_models
from .deltas import Http, array_of, deltas
from .errors import APIError, bad_request, shown
from .generation import Generation, Service
from .images import ImageCount, decode_base64
from .openai_format import chat_logprobs, dumps
from .partial_json import partial_object
from .schemas import REASONING_EFFORTS, GenerationSpec, _Body, _type, parse_chat, parse_completion
from .tools import merge_call_deltas

NDJSON = "application/x-ndjson"
# the options that set a chat-completions field: option -> field
OPTION_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "seed": "seed", "num_predict": "max_tokens", "stop": "stop", "repeat_penalty": "repeat_penalty",
                 "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
                 "frequency_penalty": "frequency_penalty"}
# sampling methods this server does not have: refused unless they hold their "off" value (sampling
# without them would not be what was asked for). Other options (num_ctx, num_gpu, num_thread,
# num_batch, use_mmap, ...: how Ollama loads and runs a model, which `llambda serve`'s flags decide
# here) and unknown ones are ignored, as Ollama ignores options it does not know.
UNSUPPORTED = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
PASSED = ("grammar", "regex")       # llama-server's constraint fields, taken here as on the other APIs
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}
REFUSED = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")
PATHS = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings") + ollama_models.PATHS + REFUSED


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def error_response(err: APIError) -> Response:
    return Response(dumps({"error": err.message}).encode(), status_code=err.status, media_type="application/json",
                    headers=err.headers)


def ndjson_line(obj: dict) -> bytes:
    """One line of an Ollama stream."""
    return dumps(obj).encode() + b"\n"


def ndjson_error(err: APIError) -> bytes:
    """The line that ends an Ollama stream an error cut short."""
    return ndjson_line({"error": err.message})


def _created_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- request -----------------------------------------------------------------------------

def served_name(service, name) -> str | None:
    """The request's model name as the served one accepts it: Ollama's default tag `:latest` is the
    model itself. An unknown name is a 404, as on the OpenAI routes."""
    if name is not None and not isinstance(name, str):
        raise bad_request(f"'model' must be a string, got {_type(name)}", param="model")
    if isinstance(name, str) and name.endswith(":latest") and service.cfg.accepts(name[:-len(":latest")]):
        name = name[:-len(":latest")]
    try:
        service.check_model(name)
    except APIError:
        raise APIError(404, f"model {shown(name)} not found: this server serves {service.cfg.model_id!r} only "
                       "(start `llambda serve -m NAME` for another)", param="model") from None
    return name


def _options(b: _Body) -> tuple[dict, dict]:
    """`options` -> (chat-completions fields, field -> the option's name for errors)."""
    opts = b.get("options")
    if opts is None:
        return {}, {}
    if not isinstance(opts, dict):
        raise bad_request(f"'options' must be an object, got {_type(opts)}", param="options")
    for name, off in UNSUPPORTED.items():
        v = opts.get(name)
        if v is not None and v != off:
            raise bad_request(f"'options.{name}' is not supported by this server (only {off!r}, off)",
                              param=f"options.{name}")
    out, names = {}, {}
    for option, fld in OPTION_FIELDS.items():
        v = opts.get(option)
        if v is None:
            continue
        if option == "seed" and v == -1:
            continue        # Ollama's "a random seed"
        if option == "num_predict" and v in (-1, -2):
            continue        # "no limit" and "fill the context": until the end, the server's cap or the context
        if option == "num_predict" and isinstance(v, int) and v < 0:
            raise bad_request(f"'options.num_predict' must be -1 (no limit), -2 (fill the context) or >= 0, got {v}",
                              param="options.num_predict")
        out[fld], names[fld] = v, f"options.{option}"
    return out, names


def _format(v) -> dict:
    """`format`: "json" or a JSON schema -> the constraint fields chat takes."""
    if v is None or v == "":
        return {}
    if v == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(v, dict):
        return {"json_schema": v}
    raise bad_request(f"'format' must be \"json\" or a JSON schema object, got {_type(v)}", param="format")


IMAGE_ROLES = ("user", "tool")      # the messages an image may come with


def _images(v, where: str, count: ImageCount) -> list[bytes]:
    """`images` (base64 strings, as Ollama takes them) decoded: they go before the text (chat.image_content),
    where Ollama's prompt puts them."""
    return [decode_base64(text, f"{where}[{j}]", count) for j, text in enumerate(array_of(v, where, "base64 strings"))]


def _think(b: _Body) -> tuple[bool, dict]:
    """Whether a reasoning model's thinking is returned, and the chat fields `think` sets: false turns
    thinking off in templates that read `enable_thinking` (Qwen3, SmolLM3), true and a level turn it
    on, a level is also the template's `reasoning_effort` (gpt-oss). Unset, the model thinks as the
    template and the server's defaults (--no-think) say and the thought is returned apart. Templates
    that read neither ignore it."""
    v = b.get("think")
    if v is not None and not isinstance(v, bool) and v not in REASONING_EFFORTS:
        raise bad_request(f"'think' must be a boolean or one of {', '.join(REASONING_EFFORTS)}, got {_type(v)}",
                          param="think")
    if v is None:
        return True, {}
    kw = think_template_kwargs(v)
    effort = kw.pop("reasoning_effort", None)      # through the request's field: its levels, its checks
    on = {"chat_template_kwargs": kw}
    return v is not False, {**on, "reasoning_effort": effort} if effort is not None else on


def _message(m, i: int, count: ImageCount) -> dict:
    """One Ollama message as an OpenAI chat message (chat's own checks follow in parse_chat); its
    `images` as canonical image parts before its text."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object, got {_type(m)}", param=where)
    out = {k: v for k, v in m.items() if k not in ("images", "tool_name", "tool_calls")}
    if out.get("content") is None:
        out["content"] = ""     # Ollama's content is a string that defaults to empty (its client leaves "" out)
    images = _images(m.get("images"), f"{where}.images", count)
    if images:
        if m.get("role") not in IMAGE_ROLES:
            raise bad_request(f"{where}.images: images come with a user (or tool) message, not "
                              f"{shown(m.get('role'))}", param=f"{where}.images")
        if not isinstance(out["content"], str):
            raise bad_request(f"{where}.content must be a string, got {_type(out['content'])}",
                              param=f"{where}.content")
        out["content"] = image_content(images, out["content"])
    if m.get("tool_name") is not None:
        if not isinstance(m["tool_name"], str):
            raise bad_request(f"{where}.tool_name must be a string, got {_type(m['tool_name'])}",
                              param=f"{where}.tool_name")
        out["name"] = m["tool_name"]
    calls = []
    for j, call in enumerate(array_of(m.get("tool_calls"), f"{where}.tool_calls", "tool calls")):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not isinstance(fn.get("arguments", {}), dict):
            raise bad_request(f"{where}.tool_calls[{j}] must be {{\"function\": {{\"name\": \"...\", \"arguments\": "
                              "{...}}}}} (arguments as an object)", param=f"{where}.tool_calls[{j}]")
        calls.append({"id": f"call_{i}_{j}", "type": "function",
                      "function": {"name": fn["name"], "arguments": json.dumps(fn.get("arguments", {}),
                                                                               ensure_ascii=False)}})
    if calls:
        out["tool_calls"] = calls
    return out


def _tools(v):
    """Ollama's tools are OpenAI's, with `type` optional (function)."""
    if not isinstance(v, list):
        return v        # null or a wrong type: chat's check says which
    return [dict(t, type=t.get("type") or "function") if isinstance(t, dict) else t for t in v]


def _parse(parse, body: dict, names: dict[str, str]) -> GenerationSpec:
    """parse_chat / parse_completion on the translated body, errors naming the Ollama field."""
    try:
        spec = parse(body)
    except APIError as e:
        name = names.get(e.param or "")
        if name is None:
            raise
        raise bad_request(e.message.replace(f"'{e.param}'", f"'{name}'"), param=name) from None
    # errors found later (a schema that does not compile, too many tokens) name Ollama's fields too
    spec.max_tokens_param = "options.num_predict"
    spec.constraint_param = names.get(spec.constraint_param or "", spec.constraint_param)
    return spec


def _common(body: dict, b: _Body, service) -> tuple[dict, dict]:
    """The fields /api/chat and /api/generate share, as chat-completions fields (+ names for errors)."""
    fields, names = _options(b)
    fields.update(_format(b.get("format")))
    fields.update({k: body[k] for k in PASSED if k in body})
    names.update(json_schema="format", response_format="format")
    fields["model"] = served_name(service, b.get("model"))
    fields["stream"] = b.boolean("stream", True)      # Ollama streams unless told not to
    if b.boolean("logprobs", False):
        fields.update(logprobs=True, top_logprobs=body.get("top_logprobs"))
    elif b.integer("top_logprobs", 0, 0):       # checked as an integer even unused ("", [], false were taken)
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    keep_alive(b)
    return fields, names


def keep_alive(b: _Body) -> None:
    """`keep_alive` (how long Ollama keeps a model loaded; here it stays loaded while the server runs):
    ignored, but of a type Ollama takes, a duration string ("5m", "-1") or a number of seconds."""
    v = b.get("keep_alive")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
        raise bad_request(f"'keep_alive' must be a duration (\"5m\") or a number of seconds, got {_type(v)}",
                          param="keep_alive")


@dataclass
class OllamaAsk:
    """What an /api/chat or /api/generate request asks for."""
    spec: GenerationSpec | None     # None: Ollama's "load the model" call, nothing to generate
    model: str                      # the model's name as the answer gives it back
    stream: bool
    think: bool                     # whether to return a reasoning model's thinking

    @classmethod
    def of(cls, spec: GenerationSpec | None, b: _Body, fields: dict, think: bool, service) -> "OllamaAsk":
        return cls(spec, b.get("model") or service.cfg.model_id, fields["stream"], think)


def parse_ollama_chat(body, service) -> OllamaAsk:
    """The chat spec; none for Ollama's "load the model" call with no messages."""
    b = _Body(body)
    fields, names = _common(body, b, service)
    think, think_fields = _think(b)
    messages = b.get("messages")
    if messages is None or messages == []:
        return OllamaAsk.of(None, b, fields, think, service)
    if not isinstance(messages, list):
        raise bad_request(f"'messages' must be an array of message objects, got {_type(messages)}",
                          param="messages")
    count = ImageCount()
    fields.update(messages=[_message(m, i, count) for i, m in enumerate(messages)], tools=_tools(b.get("tools")),
                  **think_fields)
    return OllamaAsk.of(_parse(parse_chat, fields, names), b, fields, think, service)


def parse_ollama_generate(body, service) -> OllamaAsk:
    """The spec: chat with the prompt as the user's message, or a completion for `raw` and `suffix`;
    none for an empty prompt, Ollama's "load the model" call."""
    b = _Body(body)
    fields, names = _common(body, b, service)
    think, think_fields = _think(b)
    images = _images(b.get("images"), "images", ImageCount())
    for name in ("template", "context"):
        if b.get(name):
            raise bad_request(f"'{name}' is not supported: the model's own chat template renders the prompt; "
                              "send the whole conversation (/api/chat) or the whole prompt with raw: true",
                              param=name)
    prompt, system, suffix = b.string("prompt", ""), b.string("system"), b.string("suffix", "")
    raw = b.boolean("raw", False)
    if not prompt and not suffix:
        return OllamaAsk.of(None, b, fields, think, service)
    if images and (raw or suffix):
        # Ollama places a raw prompt's images at [img-N] markers written into it; a completion here
        # has no place for them
        given = "raw: true" if raw else "a suffix (fill-in-the-middle)"
        raise bad_request(f"'images' cannot go with {given}: such a prompt has no place for images here; send "
                          "them without it (the chat template puts them in the user message), or use /api/chat",
                          param="images")
    if raw or suffix:
        if system:
            raise bad_request("'system' has no place in a raw or fill-in-the-middle (suffix) prompt; put it in "
                              "the prompt", param="system")
        fields.update(prompt=prompt, suffix=suffix or None)
        top = fields.pop("top_logprobs", None)
        if fields.get("logprobs"):
            fields["logprobs"] = top or 0       # a completion's `logprobs` is its count of alternatives
            names["logprobs"] = "top_logprobs"
        return OllamaAsk.of(_parse(parse_completion, fields, names), b, fields, think, service)
    user = image_content(images, prompt) if images else prompt
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    fields.update(messages=messages, **think_fields)
    return OllamaAsk.of(_parse(parse_chat, fields, names), b, fields, think, service)


# -- response ----------------------------------------------------------------------------

def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _call(index: int, name: str, arguments: str) -> dict:
    """An Ollama tool call, its arguments as an object: for a call num_predict cut off, the members
    finished so far (as /v1/messages gives a cut tool_use's input), so streamed and whole answers agree."""
    return {"function": {"index": index, "name": name, "arguments": partial_object(arguments or "{}")}}


class OllamaRun:
    """One /api/chat or /api/generate request over a Generation."""

    def __init__(self, gen: Generation, model: str, chat: bool, think: bool, t_request: float):
        """`chat`: answer as /api/chat does (a message), else as /api/generate (a response)."""
        self.gen, self.model, self.chat, self.think, self.t_request = gen, model, chat, think, t_request
        self.sent_logprobs = 0      # tokens whose logprobs went out already

    def _with_logprobs(self, obj: dict) -> dict:
        """`obj` with the logprobs of the tokens generated since the last object that carried them (when
        asked for); a streamed call or a held-back stop string may hold tokens over to a later one."""
        if self.gen.spec.logprobs:
            entries = self.gen.states[0].logprobs[self.sent_logprobs:]
            self.sent_logprobs += len(entries)
            obj["logprobs"] = chat_logprobs(entries, self.gen.service.strings)["content"]
        return obj

    def _object(self, text: str, thinking: str = "", calls: list | None = None) -> dict:
        obj = {"model": self.model, "created_at": _created_at()}
        if self.chat:
            msg = {"role": "assistant", "content": text}
            if thinking and self.think:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            obj["message"] = msg
        else:
            obj["response"] = text
            if thinking and self.think:
                obj["thinking"] = thinking
        return obj

    def _done(self, obj: dict, finish: str | None) -> dict:
        job, u = self.gen.jobs[0], self.gen.usage()
        self._with_logprobs(obj)
        end = time.monotonic()
        first = job.t_first if job.t_first is not None else end
        obj.update(done=True, done_reason=DONE_REASONS.get(finish or "stop", "stop"),
                   total_duration=_ns(end - self.t_request), load_duration=0, prompt_eval_count=u.prompt,
                   prompt_eval_duration=_ns(first - job.t_submit), eval_count=u.completion,
                   eval_duration=_ns(end - first))
        return obj

    async def collect(self) -> dict:
        answer = await self.gen.collect()
        choice = answer["choices"][0]
        if self.gen.spec.kind != "chat":        # a raw or fill-in-the-middle generation
            return self._done(self._object(choice["text"]), choice["finish_reason"])
        msg = choice["message"]
        calls = [_call(i, c["function"]["name"], c["function"]["arguments"]) for i, c in
                 enumerate(msg.get("tool_calls") or [])]
        obj = self._object(msg.get("content") or "", msg.get("reasoning_content") or "", calls)
        return self._done(obj, choice["finish_reason"])

    async def stream(self):
        call_deltas: list[dict] = []    # the OpenAI call deltas so far, merged into whole calls at the finish
        try:
            async for d in deltas(self.gen):
                call_deltas += d.calls
                if d.text or (d.reasoning and self.think):
                    yield ndjson_line(self._with_logprobs(dict(self._object(d.text, d.reasoning), done=False)))
                if d.finish:
                    # Ollama sends a call whole, with its arguments as an object
                    made = [_call(c["index"], c["function"]["name"], c["function"]["arguments"])
                            for c in merge_call_deltas(call_deltas)]
                    if made:
                        yield ndjson_line(dict(self._object("", calls=made), done=False))
                    yield ndjson_line(self._done(self._object(""), d.finish))
        except APIError as e:
            yield ndjson_error(e)


def _loaded(model: str, chat: bool, t_request: float, stream: bool, http: Http) -> Response:
    """The answer to a request with nothing to generate: Ollama's way to load a model (here: it is)."""
    obj = {"model": model, "created_at": _created_at()}
    obj.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    obj.update(done=True, done_reason="load", total_duration=_ns(time.monotonic() - t_request), load_duration=0)
    if stream:
        return Response(ndjson_line(obj), media_type=NDJSON)
    return http.json_response(obj)


def _embed_inputs(b: _Body, field: str) -> list | None:
    """/api/embed's `input` (a string or strings) or /api/embeddings' `prompt`; None when empty
    (Ollama's "load the model" call, answered with no vectors)."""
    if field == "prompt":
        prompt = b.string("prompt", "")
        return [prompt] if prompt else None
    v = b.get("input")
    return None if v is None or v in ("", []) else v


def routes(service: Service, http: Http) -> list[Route]:
    async def generate(request: Request, parse, chat: bool) -> Response:
        t_request = time.monotonic()
        body = await http.body(request)
        if body is None:
            return Response(status_code=499)
        # in a worker thread: decoding a body's base64 images would stall the event loop's streams
        ask = await asyncio.to_thread(parse, body, service)
        if ask.spec is None:
            return _loaded(ask.model, chat, t_request, ask.stream, http)
        return await http.run(request, service, ask.spec,
                              lambda gen: OllamaRun(gen, ask.model, chat, ask.think, t_request),
                              media_type=NDJSON)

    async def chat_route(request: Request) -> Response:
        return await generate(request, parse_ollama_chat, True)

    async def generate_route(request: Request) -> Response:
        return await generate(request, parse_ollama_generate, False)

    return [Route("/api/chat", chat_route, methods=["POST"]),
            Route("/api/generate", generate_route, methods=["POST"])] + embedding_routes(service, http)


def embedding_routes(service, http: Http) -> list[Route]:
    """/api/embed, /api/embeddings, the listings and the refused model management: what an encoder
    serves too."""
    async def embed(request: Request, field: str) -> Response:
        t_request = time.monotonic()

        def answer(body, gone):
            b = _Body(body)
            name = served_name(service, b.get("model"))
            keep_alive(b)
            if b.get("options") is not None and not isinstance(b.get("options"), dict):
                raise bad_request(f"'options' must be an object, got {_type(b.get('options'))}", param="options")
            inputs = _embed_inputs(b, field)
            # /api/embed's truncate (default true) cuts an input longer than the context to its start,
            # as Ollama does; false refuses it
            truncate = b.boolean("truncate", True) if field == "input" else True
            rows, count = [], 0
            if inputs is not None:
                # dimensions as on /v1/embeddings: only the model's own
                openai_body = {"model": name, "input": inputs, "dimensions": b.get("dimensions")}
                out = embeddings_api.embed(service, openai_body, gone, truncate=truncate)
                rows, count = [d["embedding"] for d in out["data"]], out["usage"]["prompt_tokens"]
            if field == "prompt":
                return {"embedding": rows[0] if rows else []}
            return {"model": b.get("model") or service.cfg.model_id, "embeddings": rows,
                    "total_duration": _ns(time.monotonic() - t_request), "load_duration": 0,
                    "prompt_eval_count": count}

        return await embeddings_api.answer(http, request, answer, service)

    async def embed_route(request: Request) -> Response:
        return await embed(request, "input")

    async def embeddings_route(request: Request) -> Response:
        return await embed(request, "prompt")

    async def refused(request: Request) -> Response:
        return error_response(APIError(
            501, f"{request.url.path} is not supported: this server serves one model, {service.cfg.model_id!r}; "
                 "fetch models with `llambda pull NAME` and serve one with `llambda serve -m NAME`",
            code="not_implemented"))

    return ([Route("/api/embed", embed_route, methods=["POST"]),
             Route("/api/embeddings", embeddings_route, methods=["POST"])]
            + ollama_models.routes(service, http, served_name)
            + [Route(path, refused, methods=["POST", "DELETE"]) for path in REFUSED])

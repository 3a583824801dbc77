"""POST /v1/messages: Anthropic's Messages API over the same scheduler as chat completions.

The request becomes a chat-completions body (system, messages with text, image
(base64 sources, as image parts: images.py), tool_use and tool_result blocks, tools with input_schema,
tool_choice) validated
by `schemas.parse_chat`; a last assistant turn of text is the answer's start (prefill);
generation goes through `Service`. The answer is a
`message` with thinking (a harmony answer's analysis channel, unsigned), text and tool_use
content blocks and Anthropic's stop reasons; streamed, it is Anthropic's event sequence
(message_start, content_block_start, content_block_delta with thinking_delta, text_delta or
input_json_delta, content_block_stop,
message_delta with the stop reason and usage, message_stop). POST /v1/messages/count_tokens takes
the same body without max_tokens and answers `{"input_tokens": N}`: the tokens of the prompt that
body would generate from (rendered, prefill and tool prompt included). Every error,
including one found before any route runs (authentication), has Anthropic's
shape: `{"type": "error", "error": {"type", "message"}}`.
"""
from __future__ import annotations

import json
import secrets

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .deltas import Http, array_of, deltas, sse_event, stop_sequence
from .errors import APIError, bad_request
from .generation import Generation, Service
from .images import REMOTE, ImageCount, check_media_type, decode_base64, image_part, joined_parts
from .openai_format import dumps
from .partial_json import partial_object
from .schemas import MAX_STOP, MAX_TOOLS, GenerationSpec, _Body, _type, check_function, parse_chat

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
PATHS = (PATH, COUNT_PATH)      # answered in Anthropic's shape, errors included
# Anthropic's error types by HTTP status (529 is its "overloaded")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
MIN_BUDGET_TOKENS = 1024     # Anthropic's least thinking.budget_tokens
PASSED = ("model", "temperature", "top_p", "top_k", "stream", "seed", "ignore_eos", "grammar", "regex")


def error_body(err: APIError) -> dict:
    kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_response(err: APIError) -> Response:
    return Response(dumps(error_body(err)).encode(), status_code=err.status, media_type="application/json",
                    headers=err.headers)


# -- request -----------------------------------------------------------------------------

def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or an array of content blocks, got {_type(content)}",
                          param=where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}[{j}] must be a content block object with a 'type'", param=f"{where}[{j}]")
    return content


def _plain(content, where: str, count: ImageCount | None = None):
    """Text blocks (or a string) as one string: system prompts, tool results. With `count` (a tool
    result) image blocks are taken too: then the content is a list of canonical parts, the text
    blocks' text joined between images."""
    parts: list = []
    for j, block in enumerate(_blocks(content, where)):
        if block["type"] == "image" and count is not None:
            parts.append(_image(block, f"{where}[{j}]", count))
            continue
        if block["type"] != "text":
            only = "text and image blocks are" if count is not None else "only text blocks are"
            raise bad_request(f"{where}[{j}] is a {block['type']!r} block; {only} supported here",
                              param=f"{where}[{j}]")
        if not isinstance(block.get("text"), str):
            raise bad_request(f"{where}[{j}]: a text block needs a string 'text', got {_type(block.get('text'))}",
                              param=f"{where}[{j}]")
        parts.append(block["text"])
    return joined_parts(parts)


def _image(block: dict, at: str, count: ImageCount) -> dict:
    """An image block, {"type": "image", "source": {"type": "base64", "media_type", "data"}}, as a
    canonical image part; a url source is refused (nothing is fetched), a file source too (no Files API)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    where = f"{at}.source"
    if kind == "url":
        raise bad_request(f"{where}: {REMOTE}", param=where)
    if kind == "file":
        raise bad_request(f"{where}: file sources are not supported (this server has no file store); send the "
                          "image as a base64 source", param=where)
    if kind != "base64":
        raise bad_request(f"{where} must be {{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": "
                          "\"...\"}}", param=where)
    check_media_type(source.get("media_type"), f"{where}.media_type")
    return image_part(decode_base64(source.get("data"), f"{where}.data", count))


def _string(block: dict, key: str, at: str, required: bool = True) -> str | None:
    """A block's id field: a string (an id of another type was written into the prompt as its text)."""
    v = block.get(key)
    if isinstance(v, str) or (v is None and not required):
        return v
    raise bad_request(f"{at}.{key} must be a string, got {_type(v)}", param=f"{at}.{key}")


def _messages(system, messages) -> list[dict]:
    count = ImageCount()        # the request's images
    # checked whatever it holds (0, false, {} are not a system prompt); empty, it adds no turn
    text = _plain(system, "system") if system is not None else ""
    out = [{"role": "system", "content": text}] if text else []
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"'messages' must be a non-empty array, got {_type(messages)}", param="messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}.role must be 'user' or 'assistant'", param=where)
        texts, calls, results, thinking = [], [], [], []
        for j, block in enumerate(_blocks(m.get("content"), f"{where}.content")):
            at, kind = f"{where}.content[{j}]", block["type"]
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "image" and role == "user":
                texts.append(_image(block, at, count))
            elif kind == "tool_use" and role == "assistant":
                name, args = block.get("name"), block.get("input", {})
                if not isinstance(name, str) or not isinstance(args, dict):
                    raise bad_request(f"{at}: a tool_use block needs a string 'name' and an object 'input'",
                                      param=at)
                calls.append({"id": _string(block, "id", at, required=False) or f"toolu_{j}", "type": "function",
                              "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
            elif kind == "tool_result" and role == "user":
                text = _plain(block.get("content", ""), f"{at}.content", count)
                if block.get("is_error"):
                    text = _error_result(text)
                results.append({"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text})
            elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])     # given back as the turn's reasoning (harmony wants it)
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise bad_request(f"{at} is a {kind!r} block, which a {role} message cannot carry here (text, "
                                  "tool_use from the assistant, image and tool_result from the user are supported)",
                                  param=at)
        # tool results answer the previous turn's calls: they come before the user's own text
        out += results
        if role == "assistant":
            msg = {"role": "assistant", "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "\n".join(thinking)
            out.append(msg)
        elif texts or not results:
            out.append({"role": "user", "content": joined_parts(texts)})
    return out


def _error_result(content):
    """A tool result marked is_error: "Error: " before its text (before its first text part)."""
    if isinstance(content, str):
        return "Error: " + content
    return [{"type": "text", "text": "Error:"}] + content if content[0]["type"] != "text" else \
        [{"type": "text", "text": "Error: " + content[0]["text"]}] + content[1:]


def _tools(v) -> list | None:
    out: list = []
    names: set[str] = set()
    for i, t in enumerate(array_of(v, "tools", "tools", MAX_TOOLS)):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or not isinstance(t.get("name"), str):
            raise bad_request(f"tools[{i}] must be a custom tool with a 'name' and an 'input_schema' (Anthropic's "
                              "built-in tools are not supported)", param=f"tools[{i}]")
        # here: chat's check of the tool this becomes would name tools[i].function.parameters
        check_function(t, f"tools[{i}]", f"tools[{i}]", names, schema="input_schema")
        # keys in the order OpenAI documents them: templates render the tool as given
        fn = {"name": t["name"], "description": t.get("description"), "parameters": t.get("input_schema")}
        fn = {k: v for k, v in fn.items() if v is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(v, chat: dict) -> None:
    if v is None:
        return
    if not isinstance(v, dict) or v.get("type") not in ("auto", "any", "tool", "none"):
        raise bad_request("'tool_choice' must be an object with type 'auto', 'any', 'tool' or 'none'",
                          param="tool_choice")
    kind = v["type"]
    chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
        {"type": "function", "function": {"name": v.get("name")}}
    if v.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _ignored(b: _Body) -> None:
    """`metadata` (an object with an optional string `user_id`) and `service_tier` (a string), which change
    nothing here: accepted and ignored, of Anthropic's types."""
    b.string("service_tier")
    meta = b.get("metadata")
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise bad_request(f"'metadata' must be an object, got {_type(meta)}", param="metadata")
    user = meta.get("user_id")
    if user is not None and not isinstance(user, str):
        raise bad_request(f"metadata.user_id must be a string, got {_type(user)}", param="metadata.user_id")


def parse_messages(body, counting: bool = False) -> GenerationSpec:
    """The chat spec of a /v1/messages body; `counting`: a count_tokens body, which has no max_tokens."""
    b = _Body(body)
    if b.string("model") is None:
        raise bad_request("'model' is required", param="model")
    max_tokens = None if counting else b.integer("max_tokens", None, 1)
    if max_tokens is None and not counting:
        raise bad_request("'max_tokens' is required", param="max_tokens")
    b.number("temperature", None, 0.0, 1.0)      # Anthropic's range is narrower than OpenAI's
    _ignored(b)
    stops = b.get("stop_sequences")
    chat = {k: body[k] for k in PASSED if k in body}
    chat.update(_thinking(b.get("thinking"), max_tokens))
    chat.update(messages=_messages(b.get("system"), b.get("messages")), max_tokens=max_tokens,
                tools=_tools(b.get("tools")))
    if stops is not None:
        # checked here: chat's own check would name its 'stop'
        if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
            raise bad_request(f"'stop_sequences' must be an array of non-empty strings, got {_type(stops)}",
                              param="stop_sequences")
        if len(stops) > MAX_STOP:
            raise bad_request(f"'stop_sequences' may hold at most {MAX_STOP} strings, got {len(stops)}",
                              param="stop_sequences")
        chat["stop"] = stops
    _tool_choice(b.get("tool_choice"), chat)
    prefill = _prefill(chat["messages"])
    spec = parse_chat(chat)
    spec.prefill = prefill
    return spec


def _thinking(v, max_tokens: int | None) -> dict:
    """The chat fields `thinking` sets: disabled turns thinking off in templates that read
    `enable_thinking` (Qwen3, SmolLM3); enabled turns it on, and its budget_tokens (checked as
    Anthropic checks it: at least 1024, below max_tokens) bounds a `<think>` thought (thinking.py).
    `max_tokens` None: a count_tokens body, which has none to compare with."""
    if v is None:
        return {}
    kind = v.get("type") if isinstance(v, dict) else None
    if kind not in ("enabled", "disabled"):
        raise bad_request('\'thinking\' must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}',
                          param="thinking")
    out: dict = {"chat_template_kwargs": {"enable_thinking": kind == "enabled"}}
    if kind == "disabled":
        return out
    budget, where = v.get("budget_tokens"), "thinking.enabled.budget_tokens"
    if budget is None:
        raise bad_request(f"{where}: Field required", param="thinking.budget_tokens")
    if type(budget) is not int:
        raise bad_request(f"{where}: Input should be a valid integer", param="thinking.budget_tokens")
    if budget < MIN_BUDGET_TOKENS:
        raise bad_request(f"{where}: Input should be greater than or equal to {MIN_BUDGET_TOKENS}",
                          param="thinking.budget_tokens")
    if max_tokens is not None and max_tokens <= budget:
        raise bad_request("max_tokens must be greater than thinking.budget_tokens", param="max_tokens")
    out["thinking_token_budget"] = budget
    return out


def _prefill(messages: list[dict]) -> str:
    """A last assistant turn of text is the start of the answer (Anthropic's prefill): taken off the
    messages (it is not a finished turn) and returned; the reply holds only what follows it."""
    last = messages[-1]
    if last["role"] != "assistant" or last.get("tool_calls") or not last["content"]:
        return ""
    if len(messages) == 1:
        raise bad_request("'messages' holds only an assistant turn, which is the start of the answer (a prefill): "
                          "put a user turn (or a system prompt) before it", param="messages")
    messages.pop()
    return last["content"]


# -- response ----------------------------------------------------------------------------

class MessageRun:
    """One /v1/messages request over a Generation."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.id = f"msg_{secrets.token_hex(12)}"

    def stop_reason(self, finish: str | None) -> tuple[str, str | None]:
        word = stop_sequence(self.gen) if finish == "stop" else None
        return ("stop_sequence", word) if word else (STOP_REASONS.get(finish, "end_turn"), None)

    def message(self, content: list, finish: str | None) -> dict:
        reason, word = self.stop_reason(finish) if finish else (None, None)
        u = self.gen.usage()
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.gen.model_id,
                "content": content, "stop_reason": reason, "stop_sequence": word,
                "usage": {"input_tokens": u.prompt, "output_tokens": u.completion}}

    async def collect(self) -> dict:
        chat = await self.gen.collect()
        choice = chat["choices"][0]
        msg = choice["message"]
        content = [{"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""}] \
            if msg.get("reasoning_content") else []       # no signature: nothing here signs its thinking
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            content.append({"type": "tool_use", "id": call["id"], "name": fn["name"],
                            "input": partial_object(fn["arguments"])})
        return self.message(content, choice["finish_reason"])

    async def stream(self):
        def event(kind: str, **fields) -> bytes:
            return sse_event(kind, {"type": kind, **fields})

        start = self.message([], None)
        start["usage"] = {"input_tokens": len(self.gen.prompts[0]), "output_tokens": 0}
        yield event("message_start", message=start)
        index, open_kind = -1, None          # the content block being written

        def close():
            nonlocal open_kind
            if open_kind is not None:
                open_kind = None
                yield event("content_block_stop", index=index)

        try:
            async for d in deltas(self.gen):
                for kind, piece_text in (("thinking", d.reasoning), ("text", d.text)):
                    if not piece_text:
                        continue
                    if open_kind != kind:
                        for piece in close():
                            yield piece
                        index, open_kind = index + 1, kind
                        block = {"type": kind, kind: ""}
                        if kind == "thinking":
                            block["signature"] = ""
                        yield event("content_block_start", index=index, content_block=block)
                    yield event("content_block_delta", index=index,
                                delta={"type": f"{kind}_delta", kind: piece_text})
                for call in d.calls:
                    if "id" in call:
                        for piece in close():
                            yield piece
                        index, open_kind = index + 1, "tool_use"
                        block = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
                        yield event("content_block_start", index=index, content_block=block)
                    args = call["function"].get("arguments", "")
                    if args:
                        yield event("content_block_delta", index=index,
                                    delta={"type": "input_json_delta", "partial_json": args})
                if d.finish:
                    for piece in close():
                        yield piece
                    reason, word = self.stop_reason(d.finish)
                    yield event("message_delta", delta={"stop_reason": reason, "stop_sequence": word},
                                usage={"output_tokens": self.gen.usage().completion})
                    yield event("message_stop")
        except APIError as e:
            yield sse_event("error", error_body(e))


def routes(service: Service, http: Http) -> list[Route]:
    # an APIError raised here is answered in Anthropic's shape by the app's handler (error_response_for)
    async def create(request: Request) -> Response:
        # in a worker thread: decoding a body's base64 images would stall the event loop's streams
        return await http.generate(request, service, lambda body: (parse_messages(body), MessageRun), in_thread=True)

    async def count_tokens(request: Request) -> Response:
        return await http.count(request, service, lambda body: parse_messages(body, counting=True),
                                lambda n: {"input_tokens": n}, in_thread=True)

    return [Route(PATH, create, methods=["POST"]), Route(COUNT_PATH, count_tokens, methods=["POST"])]

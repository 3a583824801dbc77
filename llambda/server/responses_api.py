"""POST /v1/responses: OpenAI's Responses API over the same scheduler as chat completions.

A request is turned into a chat-completions body (input items -> messages, flat
function tools -> chat tools, text.format -> response_format) and validated by
`schemas.parse_chat`, so every sampling rule and limit is the one chat has;
generation goes through `Service`. The answer is a `response` object whose
`output` holds a reasoning item (a harmony answer's analysis channel, as `reasoning_text`
content; no summary), a message item and/or function_call items; streamed, it is the
typed event sequence (response.created, response.output_item.added, ...,
response.reasoning_text.delta, response.output_text.delta,
response.function_call_arguments.delta, ..., response.completed or response.incomplete).

Nothing is stored: `previous_response_id` (and `conversation`) are refused,
the client sends the whole conversation in `input`.
"""
from __future__ import annotations

import re
import secrets

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .deltas import Http, array_of, deltas, sse_event
from .errors import APIError, bad_request
from .generation import Generation, Service
from .openai_format import now
from .schemas import MAX_TOOLS, GenerationSpec, _Body, _type, parse_chat

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")
# sampling fields passed on as they are (llama-server's extensions included)
PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
          "repeat_penalty", "ignore_eos", "parallel_tool_calls", "stream", "grammar", "regex")
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# -- request -----------------------------------------------------------------------------

def _text(content, where: str) -> str:
    """A string, or an array of text parts (input_text / output_text), as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or an array of content parts, got {_type(content)}", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            shown = repr(kind) if isinstance(kind, str) else _type(part)
            raise bad_request(f"{where}[{j}] is a {shown} part; only input_text and output_text parts are "
                              "supported (no images, files or audio)", param=f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(inp, instructions: str | None) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(inp, str):
        return msgs + [{"role": "user", "content": inp}]
    if not isinstance(inp, list) or not inp:
        raise bad_request(f"'input' must be a string or a non-empty array of items, got {_type(inp)}", param="input")
    for i, item in enumerate(inp):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object, got {_type(item)}", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise bad_request(f"{where}.role must be one of user, assistant, system, developer", param=where)
            msgs.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise bad_request(f"{where}: a function_call item needs string 'call_id', 'name' and 'arguments'",
                                  param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)      # calls of one turn stay one message
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call_output item needs a string 'call_id'", param=where)
            msgs.append({"role": "tool", "tool_call_id": call_id,
                         "content": _text(item.get("output", ""), f"{where}.output")})
        elif kind == "reasoning":
            continue        # another model's reasoning: nothing this one can use
        else:
            shown = repr(kind) if isinstance(kind, str) else _type(kind)
            raise bad_request(f"{where}.type {shown} is not supported (message, function_call and "
                              "function_call_output items are)", param=where)
    return msgs


def _tools(v) -> list | None:
    """The Responses API's flat function tools as chat tools."""
    out = []
    for i, t in enumerate(array_of(v, "tools", "tools", MAX_TOOLS)):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_request(f"tools[{i}] has type {kind!r}; only function tools are supported (no built-in "
                              "tools such as web_search or file_search)", param=f"tools[{i}]")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(v):
    if not isinstance(v, dict):
        return v        # "auto", "none", "required" or a wrong type: chat's check says which
    # checked here: chat's own message would ask for chat's nested {"function": {"name"}} shape
    if v.get("type") != "function" or not isinstance(v.get("name"), str):
        raise bad_request('tool_choice as an object must be {"type": "function", "name": "..."} (no built-in, '
                          "custom or allowed_tools choices)", param="tool_choice")
    return {"type": "function", "function": {"name": v["name"]}}


def _text_format(v) -> tuple[dict, dict | None]:
    """`text.format` -> (as echoed in the response, the chat response_format or None for text)."""
    if v is None:
        return {"type": "text"}, None
    if not isinstance(v, dict):
        raise bad_request(f"'text' must be an object, got {_type(v)}", param="text")
    fmt = v.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return {"type": "text"}, None
    if not isinstance(fmt, dict):
        raise bad_request(f"'text.format' must be an object, got {_type(fmt)}", param="text.format")
    if fmt.get("type") == "json_object":
        return fmt, {"type": "json_object"}
    if fmt.get("type") != "json_schema":
        raise bad_request("'text.format.type' must be 'text', 'json_object' or 'json_schema'", param="text.format")
    name, schema, strict = fmt.get("name"), fmt.get("schema"), fmt.get("strict")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise bad_request("'text.format.name' must be 1 to 64 letters, digits, '_' or '-'", param="text.format.name")
    if not isinstance(schema, dict):
        raise bad_request(f"'text.format.schema' must be a JSON Schema object, got {_type(schema)}",
                          param="text.format.schema")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request("'text.format.strict' must be a boolean", param="text.format.strict")
    inner = {"name": name, "schema": schema, "strict": bool(strict)}
    if isinstance(fmt.get("description"), str):
        inner["description"] = fmt["description"]
    return fmt, {"type": "json_schema", "json_schema": inner}


def parse_responses(body) -> tuple[GenerationSpec, dict]:
    """(the chat spec, the request's fields a response object repeats)."""
    b = _Body(body)
    for name in ("previous_response_id", "conversation"):
        if b.get(name) is not None:
            raise bad_request(f"'{name}' is not supported: this server stores no responses; send the whole "
                              "conversation as 'input' items", param=name)
    if b.boolean("background", False):
        raise bad_request("'background' responses are not supported", param="background")
    if b.get("input") is None:
        raise bad_request("'input' is required", param="input")
    instructions = b.string("instructions")
    max_output = b.integer("max_output_tokens", None, 1)
    shown_format, response_format = _text_format(b.get("text"))
    chat = {k: body[k] for k in PASSED if k in body}
    chat.update(messages=_messages(b.get("input"), instructions), max_tokens=max_output,
                tools=_tools(b.get("tools")), tool_choice=_tool_choice(b.get("tool_choice")))
    if response_format is not None:
        chat["response_format"] = response_format
    try:
        spec = parse_chat(chat)
    except APIError as e:
        if e.param == "response_format":    # a format chat refuses: name the Responses field
            raise bad_request(f"text.format {response_format['type']!r} is invalid: {e.message}",
                              param="text.format") from None
        raise
    spec.max_tokens_param = "max_output_tokens"     # errors name the Responses field
    if response_format is not None:
        spec.constraint_param = "text.format"        # a schema that does not compile, too
    metadata = b.get("metadata")
    echo = {"instructions": instructions, "max_output_tokens": max_output, "metadata": metadata or {},
            "parallel_tool_calls": spec.parallel_tool_calls, "temperature": spec.sampling["temperature"],
            "top_p": spec.sampling["top_p"], "text": {"format": shown_format},
            "tool_choice": b.get("tool_choice") or "auto", "tools": b.get("tools") or []}
    return spec, echo


# -- response ----------------------------------------------------------------------------

def _usage(u) -> dict:
    return {"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt + u.completion}


def _message_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [part] if status != "in_progress" else []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "reasoning_text", "text": text}
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [part] if status != "in_progress" else []}


# the items whose text streams as one content part: item type -> (make the item, the part's events, empty part)
_TEXT_ITEMS = {"message": (_message_item, "response.output_text", {"type": "output_text", "text": "", "annotations": []}),
               "reasoning": (_reasoning_item, "response.reasoning_text", {"type": "reasoning_text", "text": ""})}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


class ResponseRun:
    """One /v1/responses request over a Generation."""

    def __init__(self, gen: Generation, echo: dict):
        self.gen, self.echo = gen, echo
        self.id = _id("resp")
        self.created = now()

    def response(self, status: str, output: list, finish: str | None = None, error: dict | None = None) -> dict:
        incomplete = status == "incomplete"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": error, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "model": self.gen.model_id, "output": output, "previous_response_id": None,
                "reasoning": {"effort": None, "summary": None}, "store": False, "truncation": "disabled",
                "usage": _usage(self.gen.usage()) if status not in ("in_progress", "failed") else None,
                **self.echo}

    @staticmethod
    def status(finish: str | None) -> str:
        return "incomplete" if finish == "length" else "completed"

    async def collect(self) -> dict:
        chat = await self.gen.collect()
        choice = chat["choices"][0]
        status = self.status(choice["finish_reason"])
        msg = choice["message"]
        output = []
        if msg.get("reasoning_content"):
            output.append(_reasoning_item(_id("rs"), msg["reasoning_content"], status))
        if msg.get("content"):
            output.append(_message_item(_id("msg"), msg["content"], status))
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            output.append(_call_item(_id("fc"), call["id"], fn["name"], fn["arguments"], "completed"))
        return self.response(status, output)

    async def stream(self):
        seq = [0]

        def event(kind: str, **fields) -> bytes:
            seq[0] += 1
            return sse_event(kind, {"type": kind, "sequence_number": seq[0] - 1, **fields})

        output: list[dict] = []       # items, in their output_index order, as they stand
        open_item: dict | None = None
        text: list[str] = []

        def close(status: str):
            nonlocal open_item
            item, open_item = open_item, None
            if item is None:
                return
            at = output.index(item)
            if item["type"] in _TEXT_ITEMS:
                make, events, _ = _TEXT_ITEMS[item["type"]]
                full = "".join(text)
                text.clear()
                where = {"item_id": item["id"], "output_index": at, "content_index": 0}
                extra = {"logprobs": []} if item["type"] == "message" else {}
                yield event(f"{events}.done", **where, text=full, **extra)
                done = make(item["id"], full, status)
                yield event("response.content_part.done", **where, part=done["content"][0])
            else:
                done = dict(item, status=status if status == "completed" else "incomplete")
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                            name=item["name"], arguments=item["arguments"])
            output[at] = done
            yield event("response.output_item.done", output_index=at, item=done)

        def open_(item: dict):
            nonlocal open_item
            open_item = item
            output.append(item)
            yield event("response.output_item.added", output_index=len(output) - 1, item=dict(item))
            if item["type"] in _TEXT_ITEMS:
                yield event("response.content_part.added", item_id=item["id"], output_index=len(output) - 1,
                            content_index=0, part=dict(_TEXT_ITEMS[item["type"]][2]))

        yield event("response.created", response=self.response("in_progress", []))
        yield event("response.in_progress", response=self.response("in_progress", []))
        try:
            async for d in deltas(self.gen):
                for kind, piece_text in (("reasoning", d.reasoning), ("message", d.text)):
                    if not piece_text:
                        continue
                    if open_item is None or open_item["type"] != kind:
                        for piece in close("completed"):
                            yield piece
                        make, _, _ = _TEXT_ITEMS[kind]
                        for piece in open_(make(_id("rs" if kind == "reasoning" else "msg"), "", "in_progress")):
                            yield piece
                    text.append(piece_text)
                    extra = {"logprobs": []} if kind == "message" else {}
                    yield event(f"{_TEXT_ITEMS[kind][1]}.delta", item_id=open_item["id"],
                                output_index=len(output) - 1, content_index=0, delta=piece_text, **extra)
                for call in d.calls:
                    if "id" in call:
                        for piece in close("completed"):
                            yield piece
                        for piece in open_(_call_item(_id("fc"), call["id"], call["function"]["name"], "",
                                                      "in_progress")):
                            yield piece
                    args = call["function"].get("arguments", "")
                    if args:
                        open_item["arguments"] += args
                        yield event("response.function_call_arguments.delta", item_id=open_item["id"],
                                    output_index=len(output) - 1, delta=args)
                if d.finish:
                    status = self.status(d.finish)
                    for piece in close(status):
                        yield piece
                    kind = "response.completed" if status == "completed" else "response.incomplete"
                    yield event(kind, response=self.response(status, output))
        except APIError as e:
            err = {"code": e.code or e.kind, "message": e.message}
            yield event("response.failed", response=self.response("failed", output, error=err))


def routes(service: Service, http: Http) -> list[Route]:
    def parse(body):
        spec, echo = parse_responses(body)
        return spec, lambda gen: ResponseRun(gen, echo)

    async def create(request: Request) -> Response:
        return await http.generate(request, service, parse)

    return [Route("/v1/responses", create, methods=["POST"])]


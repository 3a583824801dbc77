"""POST /v1/responses: OpenAI's Responses API over the same scheduler as chat completions.

A request is turned into a chat-completions body (input items -> messages, a user's input_image
parts -> image parts (images.py), flat
function tools -> chat tools, text.format -> response_format) and validated by
`schemas.parse_chat`, so every sampling rule and limit is the one chat has;
generation goes through `Service`. The answer is a `response` object whose
`output` holds a reasoning item (a harmony answer's analysis channel, as `reasoning_text`
content; no summary), a message item and/or function_call items; streamed, it is the
typed event sequence (response.created, response.output_item.added, ...,
response.reasoning_text.delta, response.output_text.delta,
response.function_call_arguments.delta, ..., response.completed or response.incomplete).
`chat_template_kwargs` is chat's; `include` is checked (INCLUDABLE): "message.output_text.logprobs"
is chat's `logprobs` (with `top_logprobs` alternatives), given on output_text parts and their text
events without the reasoning's tokens (text_logprobs.py); the other values add nothing.

Responses are stored (`store`, true by default, as in OpenAI's API) in a bounded in-memory
`ResponseStore`: `previous_response_id` continues one (its input items and its output items come
before the new input, e.g. function_call_output items answering its calls; its `instructions` are
not carried over), GET /v1/responses/{id} returns it as it was answered, DELETE removes it, and
GET /v1/responses/{id}/input_items lists the items before its answer (`limit`, `order`, `after`).
A stream that fails or is left is not stored, nor one deleted while it streams. A finished response is encoded once, in a worker
thread: the bytes stored are the bytes sent. `conversation` (the Conversations API) is refused.
POST /v1/responses/input_tokens counts the tokens of the prompt a request would generate from (a stored
conversation alone, `previous_response_id` without `input`, included).
"""
from __future__ import annotations

import asyncio
import re
from typing import Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .deltas import Http, array_of, deltas, sse_event
from .errors import APIError, bad_request, shown
from .generation import Generation, Service
from .images import ImageCount, check_detail, from_url, image_part, joined_parts
from .openai_format import dumps, now
from .response_items import check_annotations, new_id as _id, stored_items
from .response_store import ResponseStore, Stored, encode_response
from .schemas import (MAX_MESSAGES, MAX_TOOLS, MAX_TOP_LOGPROBS, GenerationSpec, _Body, _type, check_function,
                      parse_chat, with_reasoning_effort)
from .text_logprobs import TextLogprobs, event_logprobs

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")      # a message's content
REASONING_PARTS, SUMMARY_PARTS = ("reasoning_text",), ("summary_text",)    # a reasoning item's content, summary
# sampling fields passed on as they are (llama-server's extensions included)
PASSED = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
          "repeat_penalty", "ignore_eos", "parallel_tool_calls", "stream", "grammar", "regex", "thinking_token_budget",
          "chat_template_kwargs")
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 20, 100     # input items a page holds (OpenAI's default and cap)
# OpenAI's bounds on `metadata`: pairs, a key's and a value's characters
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
# OpenAI's `include` values. Those about built-in tools and images name outputs this server never makes
# (such tools and parts are refused), and a reasoning item here is plain `reasoning_text` content: there
# is no encrypted_content to give. So each is accepted and adds nothing, except the logprobs.
INCLUDABLE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
              "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
              "web_search_call.action.sources", "web_search_call.results")
MAX_INCLUDE = 64        # repeats are harmless, but bounded
LOGPROBS = "message.output_text.logprobs"


# -- request -----------------------------------------------------------------------------

def _text(parts, where: str, kinds: tuple = TEXT_PARTS, images: ImageCount | None = None):
    """Text parts of `kinds` as one string: a message's content (or a string), or a reasoning item's
    content or summary (or absent). An output_text part's annotations are checked: they are stored.
    With `images` (a user message's content, a call's output) input_image parts are taken too: the
    content is then a list of canonical parts, runs of text joined as without images."""
    message = kinds is TEXT_PARTS
    if isinstance(parts, str) and message:
        return parts
    if parts is None and not message:
        return ""
    if not isinstance(parts, list):
        wanted = "a string or an array of content parts" if message else f"an array of {kinds[0]} parts"
        raise bad_request(f"{where} must be {wanted}, got {_type(parts)}", param=where)
    texts = []
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images is not None:
            texts.append(_image(part, at, images))
            continue
        if kind == "input_image" and message:
            raise bad_request(f"{at}: input_image parts come in user messages (and function call outputs) only",
                              param=at)
        if kind not in kinds:
            what = shown(kind) if isinstance(kind, str) else _type(part)
            taken = "input_text, input_image" if images is not None else "input_text"
            only = f"{taken} and output_text parts are supported (no files or audio)" if message \
                else f"{kinds[0]} parts are"
            raise bad_request(f"{at} is a {what} part; only {only}", param=at)
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{at}: a {kind} part needs a string 'text', got {_type(part.get('text'))}", param=at)
        if kind == "output_text":
            check_annotations(part.get("annotations"), f"{at}.annotations")
        texts.append(part["text"])
    return joined_parts(texts)


def _image(part: dict, at: str, images: ImageCount) -> dict:
    """An input_image part ({"image_url": "data:...", "detail": ...}) as a canonical image part; a
    file_id is refused (no file store), an http(s) URL too (nothing is fetched)."""
    check_detail(part.get("detail"), f"{at}.detail")
    if part.get("file_id") is not None:
        raise bad_request(f"{at}.file_id: file ids are not supported (this server has no file store); send the "
                          "image in image_url as a data: URL", param=f"{at}.file_id")
    return image_part(from_url(part.get("image_url"), f"{at}.image_url", images))


def _messages(items: list, field: str, msgs: list[dict], images: ImageCount) -> list[dict]:
    """Input items (from the request's `field`, for errors) appended to chat messages.

    A reasoning item's text goes onto the assistant turn that follows it (its calls or its answer)
    as chat's `reasoning_content`, which a harmony template gives back for a turn that called a tool
    (a template that reads no reasoning ignores it); followed by anything else, it is dropped."""
    reasoning = ""          # a reasoning item's text, waiting for its assistant turn
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object, got {_type(item)}", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            text = _text(item.get("content"), f"{where}.content", REASONING_PARTS)
            _text(item.get("summary"), f"{where}.summary", SUMMARY_PARTS)     # stored: checked, not read
            secret = item.get("encrypted_content")      # stored too (another server's): not read
            if secret is not None and not isinstance(secret, str):
                raise bad_request(f"{where}.encrypted_content must be a string, got {_type(secret)}",
                                  param=f"{where}.encrypted_content")
            reasoning = f"{reasoning}\n{text}" if reasoning and text else reasoning or text
            continue
        if kind == "message":
            role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None    # a list: unhashable
            if role is None:
                raise bad_request(f"{where}.role must be one of user, assistant, system, developer", param=where)
            msgs.append({"role": role, "content": _text(item.get("content"), f"{where}.content",
                                                         images=images if role == "user" else None)})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise bad_request(f"{where}: a function_call item needs string 'call_id', 'name' and 'arguments'",
                                  param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)      # calls of one turn stay one message
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call_output item needs a string 'call_id'", param=where)
            msgs.append({"role": "tool", "tool_call_id": call_id,
                         "content": _text(item.get("output", ""), f"{where}.output", images=images)})
        else:
            what = shown(kind) if isinstance(kind, str) else _type(kind)
            raise bad_request(f"{where}.type {what} is not supported (message, function_call, "
                              "function_call_output and reasoning items are)", param=where)
        if reasoning and msgs[-1]["role"] == "assistant":
            msgs[-1]["reasoning_content"] = reasoning
        reasoning = ""
    return msgs


def _continued(b: _Body, store: ResponseStore) -> tuple[Stored | None, list[dict]]:
    """The entry `previous_response_id` names and the items it continues: that response's input
    items, then its output (parsed for the prompt; the entry's bytes are what is stored again)."""
    prev = b.get("previous_response_id")
    if prev is None:
        return None, []
    if not isinstance(prev, str):
        raise bad_request(f"'previous_response_id' must be a string, got {_type(prev)}", param="previous_response_id")
    entry = store.get(prev, param="previous_response_id")
    return entry, entry.input_items() + entry.output_items()


def _tools(v) -> list | None:
    """The Responses API's flat function tools as chat tools."""
    out: list = []
    names: set[str] = set()
    for i, t in enumerate(array_of(v, "tools", "tools", MAX_TOOLS)):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_request(f"tools[{i}] has type {shown(kind)}; only function tools are supported (no built-in "
                              "tools such as web_search or file_search)", param=f"tools[{i}]")
        check_function(t, f"tools[{i}]", f"tools[{i}]", names)     # flat: chat's check would name tools[i].function
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


def _effort(v):
    """`reasoning.effort`, unchecked (with_reasoning_effort checks it)."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad_request(f"'reasoning' must be an object, got {_type(v)}", param="reasoning")
    return v.get("effort")


def _include(v) -> list[str]:
    """`include`: a list of OpenAI's known values (INCLUDABLE), checked; only LOGPROBS changes the answer."""
    items = array_of(v, "include", "strings", MAX_INCLUDE)
    for i, name in enumerate(items):
        if not isinstance(name, str) or name not in INCLUDABLE:
            what = shown(name) if isinstance(name, str) else _type(name)
            raise bad_request(f"include[{i}] is {what}; known values: {', '.join(INCLUDABLE)}", param=f"include[{i}]")
    return items


def _prompt_fields(instructions, continued: bool, inp) -> str:
    """The fields a prompt came from, as an error that cannot render it names them."""
    fields = (["'instructions'"] if instructions else []) + (["the items of 'previous_response_id'"] if continued
                                                             else []) + (["'input'"] if inp is not None else [])
    return " and ".join(fields)


def _metadata(v) -> dict:
    """`metadata`, echoed in the response (and so stored): string pairs within OpenAI's bounds."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad_request(f"'metadata' must be an object of strings, got {_type(v)}", param="metadata")
    if len(v) > MAX_METADATA_PAIRS:
        raise bad_request(f"'metadata' has {len(v)} keys; at most {MAX_METADATA_PAIRS}", param="metadata")
    for key, value in v.items():
        shown = repr(key[:MAX_METADATA_KEY])
        if len(key) > MAX_METADATA_KEY:
            raise bad_request(f"'metadata' key {shown}... has {len(key)} characters; at most {MAX_METADATA_KEY}",
                              param="metadata")
        if not isinstance(value, str):
            raise bad_request(f"'metadata' value of {shown} must be a string, got {_type(value)}", param="metadata")
        if len(value) > MAX_METADATA_VALUE:
            raise bad_request(f"'metadata' value of {shown} has {len(value)} characters; at most "
                              f"{MAX_METADATA_VALUE}", param="metadata")
    return v


# fields OpenAI's API takes that change nothing here (no truncation of a conversation: one past the
# context is a 400; no user tracking, tiers or prompt-cache routing): accepted and ignored, of their type
IGNORED_STRINGS = ("user", "service_tier", "safety_identifier", "prompt_cache_key")
TRUNCATIONS = ("auto", "disabled")


def _ignored(b: _Body) -> None:
    for name in IGNORED_STRINGS:
        b.string(name)
    v = b.get("truncation")
    if v is not None and v not in TRUNCATIONS:
        what = shown(v) if isinstance(v, str) else _type(v)
        raise bad_request(f"'truncation' must be \"auto\" or \"disabled\", got {what}", param="truncation")


def parse_responses(body, store: ResponseStore,
                    counting: bool = False) -> tuple[GenerationSpec, dict, Stored | None, list[dict]]:
    """(the chat spec, the request's fields a response object repeats, the stored response
    `previous_response_id` continues, this request's input items as stored). `counting`: an
    input_tokens body, which may leave `input` out when it names a stored conversation (that alone
    is a prompt)."""
    b = _Body(body)
    if b.get("conversation") is not None:
        raise bad_request("'conversation' is not supported: continue a stored response with "
                          "'previous_response_id', or send the whole conversation as 'input' items",
                          param="conversation")
    if b.boolean("background", False):
        raise bad_request("'background' responses are not supported", param="background")
    inp = b.get("input")
    if inp is None and not (counting and b.get("previous_response_id") is not None):
        raise bad_request("'input' is required" + (" (or 'previous_response_id')" if counting else ""),
                          param="input")
    if inp is not None and (not isinstance(inp, (str, list)) or not inp):
        raise bad_request(f"'input' must be a string or a non-empty array of items, got {_type(inp)}", param="input")
    instructions = b.string("instructions")
    _ignored(b)
    keep = b.boolean("store", True)
    max_output = b.integer("max_output_tokens", None, 1)
    shown_format, response_format = _text_format(b.get("text"))
    continued, earlier = _continued(b, store)
    # instructions are this request's alone: a continued response's are not carried over (as OpenAI's API)
    msgs = [{"role": "system", "content": instructions}] if instructions else []
    images = ImageCount()       # the conversation's, the continued response's included
    _messages(earlier, "previous_response_id", msgs, images)
    _messages([{"role": "user", "content": inp}] if isinstance(inp, str) else inp or [], "input", msgs, images)
    # chat's own checks of these would name 'messages', a field this request does not have
    if not msgs:
        raise bad_request("'input' holds no message, function call or call output: nothing to answer (a reasoning "
                          "item alone reaches no prompt)", param="input")
    if len(msgs) > MAX_MESSAGES:
        raise bad_request(f"this conversation ('input' after any 'previous_response_id') makes {len(msgs)} chat "
                          f"messages; at most {MAX_MESSAGES}", param="input")
    logprobs = LOGPROBS in _include(b.get("include"))
    # checked here: chat's own check would ask for a 'logprobs' field this request does not have
    top_logprobs = b.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    chat = {k: body[k] for k in PASSED if k in body}
    if logprobs:
        chat.update(logprobs=True, top_logprobs=top_logprobs)
    chat.update(messages=msgs, max_tokens=max_output,
                tools=_tools(b.get("tools")), tool_choice=_tool_choice(b.get("tool_choice")))
    if response_format is not None:
        chat["response_format"] = response_format
    effort = _effort(b.get("reasoning"))
    with_reasoning_effort({}, effort, "reasoning.effort")      # checked before the rest, as it was
    try:
        spec = parse_chat(chat)
    except APIError as e:
        if e.param == "response_format":    # a format chat refuses: name the Responses field
            raise bad_request(f"text.format {response_format['type']!r} is invalid: {e.message}",
                              param="text.format") from None
        raise
    # chat_template_kwargs was checked as chat checks it; an effort it contradicts is a 400 there too
    spec.template_kwargs = with_reasoning_effort(spec.template_kwargs, effort, "reasoning.effort")
    spec.max_tokens_param = "max_output_tokens"     # errors name the Responses fields
    spec.messages_param = "input"
    spec.logprobs_param = "include"
    spec.text_logprobs = logprobs                   # of output_text only: the tokens' ends pick them
    spec.messages_shown = _prompt_fields(instructions, continued is not None, inp)
    if response_format is not None:
        spec.constraint_param = "text.format"        # a schema that does not compile, too
    echo = {"instructions": instructions, "max_output_tokens": max_output, "metadata": _metadata(b.get("metadata")),
            "parallel_tool_calls": spec.parallel_tool_calls, "temperature": spec.sampling["temperature"],
            "top_p": spec.sampling["top_p"], "top_logprobs": top_logprobs, "text": {"format": shown_format},
            "tool_choice": b.get("tool_choice") or "auto", "tools": b.get("tools") or [],
            "reasoning": {"effort": effort, "summary": None},
            "previous_response_id": b.get("previous_response_id"), "store": keep}
    return spec, echo, continued, stored_items(inp or [], earlier)


# -- response ----------------------------------------------------------------------------

def _usage(u) -> dict:
    return {"input_tokens": u.prompt, "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens": u.completion, "output_tokens_details": {"reasoning_tokens": u.reasoning},
            "total_tokens": u.prompt + u.completion}


def _message_item(item_id: str, text: str, status: str, logprobs: list | None = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
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
    """One /v1/responses request over a Generation; `finish(response)` is called, in a worker thread,
    with the finished (completed or incomplete) response object: it keeps it if asked (and may set
    its `store` false) and returns its JSON, which is sent as it is."""

    def __init__(self, gen: Generation, echo: dict, response_id: str, finish: Callable[[dict], bytes]):
        self.gen, self.echo, self.finish = gen, echo, finish
        self.id = response_id
        self.created = now()
        # the text's logprobs, when include asked for them (chat's `logprobs` is then on)
        self.logprobs = TextLogprobs(gen.states[0], gen.service.strings) if gen.spec.logprobs else None

    def response(self, status: str, output: list, finish: str | None = None, error: dict | None = None) -> dict:
        incomplete = status == "incomplete"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": error, "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "model": self.gen.model_id, "output": output,
                "truncation": "disabled",
                "usage": _usage(self.gen.usage()) if status not in ("in_progress", "failed") else None,
                **self.echo}

    @staticmethod
    def status(finish: str | None) -> str:
        return "incomplete" if finish == "length" else "completed"

    async def collect(self) -> bytes:
        chat = await self.gen.collect()
        choice = chat["choices"][0]
        status = self.status(choice["finish_reason"])
        msg = choice["message"]
        output = []
        if msg.get("reasoning_content"):
            output.append(_reasoning_item(_id("rs"), msg["reasoning_content"], "completed"))
        if msg.get("content"):
            logprobs = self.logprobs.take(end=True) if self.logprobs is not None else None
            output.append(_message_item(_id("msg"), msg["content"], "completed", logprobs))
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            output.append(_call_item(_id("fc"), call["id"], fn["name"], fn["arguments"], "completed"))
        if output:      # as streamed: an item ends complete when the next begins; the last, as the answer did
            output[-1]["status"] = status
        # the echo (instructions, tools) and the answer may be megabytes: encoded off the event loop
        return await asyncio.to_thread(self.finish, self.response(status, output))

    async def stream(self):
        seq = [0]

        def event(kind: str, **fields) -> bytes:
            seq[0] += 1
            return sse_event(kind, {"type": kind, "sequence_number": seq[0] - 1, **fields})

        def response_event(kind: str, response: bytes) -> bytes:
            """An event holding a response object encoded already (in a worker thread)."""
            head = event(kind)[:-len(b"}\n\n")]
            return head + b',"response":' + response + b"}\n\n"

        output: list[dict] = []       # items, in their output_index order, as they stand
        open_item: dict | None = None
        text: list[str] = []
        waiting: list[dict] = []      # text logprobs settled but not sent yet (a message's next delta takes them)
        given: list[dict] = []        # the open message's text logprobs sent so far

        def text_delta(piece_text: str):
            """The open message's next text, with the logprobs settled by now."""
            sent = list(waiting)
            given.extend(sent)
            waiting.clear()
            return event("response.output_text.delta", item_id=open_item["id"], output_index=len(output) - 1,
                         content_index=0, delta=piece_text, logprobs=event_logprobs(sent))

        def close(status: str):
            nonlocal open_item
            item = open_item
            if item is None:
                return
            if item["type"] == "message" and waiting:
                yield text_delta("")        # tokens settled after the message's last text are still its own
            open_item = None
            at = output.index(item)
            if item["type"] in _TEXT_ITEMS:
                make, events, _ = _TEXT_ITEMS[item["type"]]
                full, logprobs = "".join(text), list(given)
                text.clear()
                given.clear()
                where = {"item_id": item["id"], "output_index": at, "content_index": 0}
                if item["type"] == "message":       # only output_text carries logprobs, never the reasoning
                    yield event(f"{events}.done", **where, text=full, logprobs=event_logprobs(logprobs))
                    done = make(item["id"], full, status, logprobs)
                else:
                    yield event(f"{events}.done", **where, text=full)
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

        started = await asyncio.to_thread(_encoded, self.response("in_progress", []))
        yield response_event("response.created", started)
        yield response_event("response.in_progress", started)
        try:
            async for d in deltas(self.gen):
                if self.logprobs is not None:
                    waiting.extend(self.logprobs.take(end=d.finish is not None))
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
                    if kind == "message":
                        yield text_delta(piece_text)
                    else:
                        yield event("response.reasoning_text.delta", item_id=open_item["id"],
                                    output_index=len(output) - 1, content_index=0, delta=piece_text)
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
                    yield response_event(kind, await asyncio.to_thread(self.finish, self.response(status, output)))
        except APIError as e:
            err = {"code": e.code or e.kind, "message": e.message}
            yield event("response.failed", response=self.response("failed", output, error=err))


def _encoded(obj) -> bytes:
    return dumps(obj).encode()


def _list_query(request: Request) -> tuple[int, bool, str | None]:
    """input_items' (limit, descending, after) from the query string, checked."""
    q = request.query_params
    limit = q.get("limit", str(DEFAULT_LIST_LIMIT))
    if not (limit.isascii() and limit.isdigit() and len(limit) <= 3 and 1 <= int(limit) <= MAX_LIST_LIMIT):
        raise bad_request(f"'limit' must be an integer from 1 to {MAX_LIST_LIMIT}, got {limit[:20]!r}",
                          param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"'order' must be 'asc' or 'desc', got {order[:20]!r}", param="order")
    return int(limit), order == "desc", q.get("after")


def list_page(items: list[dict], limit: int, descending: bool, after: str | None) -> dict:
    """One page of a stored response's input items, as OpenAI's list objects hold them."""
    ordered = items[::-1] if descending else items
    start = 0
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if at is None:
            raise bad_request(f"'after' names no input item of this response: {after[:100]!r}", param="after")
        start = at + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}


def routes(service: Service, http: Http, store: ResponseStore) -> list[Route]:
    """The endpoints; `store` keeps the responses (create_app makes it, of the server config's bounds)."""
    def parse(body):
        spec, echo, continued, items = parse_responses(body, store)
        if not store.keeps_any:
            echo["store"] = False       # the answer says what happened: nothing is kept
        # checked now (a 400 if too big to keep), not once the answer is generated
        stored = store.conversation(continued, items) if echo["store"] else None

        def finish(response: dict) -> bytes:
            encoded = encode_response(response)
            # store: false leaves nothing behind; an answer that made the entry larger than the
            # whole store's budget is not kept, and says so (the stream's response.created said true)
            if stored is not None and not store.put(response["id"], encoded, stored):
                response["store"] = False
                encoded = encode_response(response)
            return encoded.data
        def run_of(gen):
            run = ResponseRun(gen, echo, store.new_id(), finish)
            if stored is not None:      # a DELETE while it streams is honoured, a GET says it is not done
                store.pending(run.id, run)
            return run
        return spec, run_of

    # a continued conversation is parsed (and, stored, written back) off the event loop: up to
    # 16 MiB of JSON each way would stall every running stream
    async def create(request: Request) -> Response:
        return await http.generate(request, service, parse, in_thread=True)

    async def input_tokens(request: Request) -> Response:
        return await http.count(request, service, lambda body: parse_responses(body, store, counting=True)[0],
                                lambda n: {"object": "response.input_tokens", "input_tokens": n}, in_thread=True)

    async def retrieve(request: Request) -> Response:
        if request.query_params.get("stream") == "true":
            raise bad_request("'stream' is not supported here: a stored response is returned whole",
                              param="stream")
        entry = store.get(request.path_params["response_id"])
        return Response(entry.response, media_type="application/json")

    async def delete(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        store.delete(response_id)
        return http.json_response({"id": response_id, "object": "response", "deleted": True})

    async def input_items(request: Request) -> Response:
        limit, descending, after = _list_query(request)
        entry = store.get(request.path_params["response_id"])
        # a page of a few items may still be megabytes: parsed and encoded in a worker thread
        page = await asyncio.to_thread(lambda: _encoded(list_page(entry.input_items(), limit, descending, after)))
        return Response(page, media_type="application/json")

    async def not_allowed(request: Request) -> Response:
        raise HTTPException(405)

    return [Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
            # not a stored response's id: without this, GET or DELETE here was a 404 for 'input_tokens'
            Route("/v1/responses/input_tokens", not_allowed, methods=["GET", "DELETE"]),
            Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"])]

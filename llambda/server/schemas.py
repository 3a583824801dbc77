"""Request validation: JSON bodies of /v1/chat/completions and /v1/completions → typed specs.

Every check names the field and what was wrong, and raises APIError(400). Unknown
fields are ignored (clients add their own, e.g. `user`); known fields with the
wrong type or range are rejected, never coerced. Features we do not implement
(audio, files) are refused, not ignored; image_url parts become canonical image parts
(images.py). Output constraints (`response_format`,
llama-server's `json_schema` and `grammar`, and `regex`) become a GrammarSpec here;
whether it compiles is checked against the model (generation.py). `parse_json` reads a body
with bounded depth and number sizes, so no input reaches a RecursionError, an
int-conversion limit or an infinity later on.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..chat import DEFAULT_MAX_OUTPUT_CHARS, check_template_kwargs
from ..constraints import GrammarSpec
from ..errors import InvalidInputError
from .errors import bad_request, shown
from .images import ImageCount, openai_content

MAX_N = 16              # choices per request
MAX_STOP = 16           # stop strings per request
MAX_TOP_LOGPROBS = 20   # OpenAI's cap (chat); completions allow up to 5
MAX_COMPLETION_LOGPROBS = 5
MAX_MESSAGES = 4096     # chat messages per request
MAX_TOOLS = 128         # OpenAI's cap
MAX_LOGIT_BIAS = 1024   # logit_bias entries per request
MAX_TOKEN_ID = 2**31 - 1   # ids travel as int32; the vocabulary check comes later
MAX_COUNT = 2**31 - 1      # max_tokens, top_k, repeat_last_n: anything larger is a mistake
# OpenAI's reasoning efforts; templates (gpt-oss's) know low/medium/high, so the others take the nearest
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TEMPLATE_EFFORT = {"none": "low", "minimal": "low", "xhigh": "high"}

# The body parser's bounds. 64 levels hold any real tool schema, and keep every later recursive walk
# (template rendering, tojson) far from Python's recursion limit; no field needs a number of more than
# 40 characters (a 64-bit seed has 20 digits), and Python refuses to convert ints of over 4300 digits.
MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 40
# a \uD800-\uDFFF escape in the body's bytes (UTF-8 itself cannot hold one): maybe a lone surrogate
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE = "a lone surrogate escape (\\uD800-\\uDFFF without its pair): not Unicode text"

# Text a request asks to tokenize (a completion's prompts, /tokenize's content, /infill's pieces, embedding
# inputs), in characters: the tokenizer holds a few hundred bytes a character while it works (a 4 MB
# /tokenize with pieces took 1.3 GB); the same cap as a rendered chat prompt's.
MAX_TEXT_CHARS = DEFAULT_MAX_OUTPUT_CHARS


def check_text_chars(texts, param: str) -> None:
    """400 when the strings among texts hold more than MAX_TEXT_CHARS characters together."""
    size = sum(len(t) for t in texts if isinstance(t, str))
    if size > MAX_TEXT_CHARS:
        raise bad_request(f"'{param}' holds {size} characters of text; at most {MAX_TEXT_CHARS} a request",
                          param=param)


class _OutOfRange:
    """A JSON number no field can hold (too long, not finite, NaN/Infinity); rejected by path once parsed."""
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def _parse_int(s: str):
    return int(s) if len(s) <= MAX_NUMBER_CHARS else _OutOfRange(s)


def _parse_float(s: str):
    if len(s) > MAX_NUMBER_CHARS:
        return _OutOfRange(s)
    v = float(s)
    return v if math.isfinite(v) else _OutOfRange(s)    # 1e400 parses as inf


def parse_json(raw: bytes) -> Any:
    """A request body as JSON: at most MAX_JSON_DEPTH deep, every number finite and of a sane size.

    Raises APIError(400) naming where the problem is; never ValueError or RecursionError.
    """
    try:
        obj = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_OutOfRange)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"malformed JSON in the request body: {e.msg} at line {e.lineno} column {e.colno}") \
            from None
    except RecursionError:
        raise bad_request(f"the JSON in the request body is nested more than {MAX_JSON_DEPTH} levels deep") \
            from None
    except ValueError as e:    # anything else the decoder refuses; never a 500
        raise bad_request(f"the request body is not valid JSON: {str(e)[:200]}") from None
    _check_tree(obj, strings=_SURROGATE_ESCAPE.search(raw) is not None)
    return obj


def _check_tree(root: Any, strings: bool = False) -> None:
    """Depth and numbers of a parsed body, without recursion; errors name the JSON path. `strings`:
    refuse a lone surrogate in a string or key too (no UTF-8 answer or stored response can hold it)."""
    if type(root) is _OutOfRange:
        raise bad_request(f"the request body is the number {_clip(root.text)}, not a JSON object")
    stack: list[tuple[Any, tuple]] = [(root, ())] if type(root) in (dict, list) else []
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            raise bad_request(f"the JSON in the request body is nested more than {MAX_JSON_DEPTH} levels deep "
                              f"(at {_path(path)})", param=_path(path))
        items = node.items() if type(node) is dict else enumerate(node)
        for key, v in items:
            t = type(v)
            if strings and type(key) is str and _SURROGATE.search(key):
                where = _path(path)         # not the key itself: it cannot be written back
                raise bad_request(f"a key in '{where}' holds {_LONE}", param=where)
            if strings and t is str and _SURROGATE.search(v):
                where = _path(path + (key,))
                raise bad_request(f"'{where}' holds {_LONE}", param=where)
            if t is dict or t is list:
                stack.append((v, path + (key,)))
            elif t is _OutOfRange:
                where = _path(path + (key,))
                raise bad_request(f"'{where}' holds the number {_clip(v.text)}, which is out of range "
                                  f"(numbers must be finite and at most {MAX_NUMBER_CHARS} characters long)",
                                  param=where)


def _path(keys: tuple) -> str:
    """('messages', 0, 'content') -> messages[0].content"""
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(body)"


def _clip(text: str, n: int = 24) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


MAX_DRAFT = 64   # draft_max per request (the server also caps drafts by its step's rows)


@dataclass
class GenerationSpec:
    kind: str                               # "chat" | "completion"
    model: str | None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None           # None: until EOS, the server's cap or the context
    max_tokens_param: str = "max_tokens"    # the request's name for it, for errors (Responses: max_output_tokens)
    logprobs_param: str = "logprobs"        # the field that asked for logprobs, for errors (Responses: include)
    text_logprobs: bool = False             # logprobs of the answer's text only (Responses' output_text)
    stop: list[str] = field(default_factory=list)
    sampling: dict = field(default_factory=dict)   # SamplingParams keyword arguments (without logprobs)
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    constraint: GrammarSpec | None = None   # what the output must follow (response_format, grammar, ...)
    constraint_param: str | None = None     # the field that gave it, for errors
    speculative: str | None = None          # "draft" | "lookup" | "off"; None: the server's default
    draft_max: int | None = None            # None: the server's
    # chat
    messages: list | None = None
    messages_param: str = "messages"        # the request's name for them, for errors (Responses: input)
    messages_shown: str = "the messages"    # what errors call them (Responses: the fields they came from)
    tools: list | None = None
    tool_choice: str = "auto"               # "auto" | "required" | "function" (forced_tool) ; "none" drops tools
    forced_tool: str | None = None          # the function a forced tool_choice names
    parallel_tool_calls: bool = True
    prefill: str = ""                       # the answer's given start (Anthropic's trailing assistant turn)
    template_kwargs: dict = field(default_factory=dict)   # extra chat-template variables (enable_thinking, ...)
    thinking_budget: int | None = None      # tokens a `<think>` thought may run before it is closed (thinking.py)
    # completion
    prompts: list = field(default_factory=list)   # each a str or a list of token ids
    echo: bool = False
    # fill-in-the-middle (server/fim.py): set, the prompts are the text before the gap, this the text after
    suffix: str | None = None
    fim_files: list = field(default_factory=list)  # (filename, text) context files (/infill's input_extra)


class _Body:
    """Typed accessors over a JSON object; `null` means "use the default"."""

    def __init__(self, body: Any):
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object, got {_type(body)}")
        self.d = body

    def get(self, name: str):
        return self.d.get(name)

    def boolean(self, name: str, default: bool) -> bool:
        v = self.d.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise bad_request(f"'{name}' must be a boolean, got {_type(v)}", param=name)
        return v

    def integer(self, name: str, default, lo: int | None = None, hi: int | None = None):
        v = self.d.get(name)
        if v is None:
            return default
        return _check_int(v, name, lo, hi)

    def number(self, name: str, default, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False):
        v = self.d.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise bad_request(f"'{name}' must be a number, got {_type(v)}", param=name)
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise bad_request(f"'{name}' must be {'>' if lo_open else '>='} {lo}, got {v}", param=name)
        if hi is not None and v > hi:
            raise bad_request(f"'{name}' must be <= {hi}, got {v}", param=name)
        return float(v)

    def string(self, name: str, default: str | None = None) -> str | None:
        v = self.d.get(name)
        if v is None:
            return default
        if not isinstance(v, str):
            raise bad_request(f"'{name}' must be a string, got {_type(v)}", param=name)
        return v


def _type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"a number ({_clip(repr(v))})"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _check_int(v: Any, name: str, lo: int | None, hi: int | None) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer, got {_type(v)}", param=name)
    if lo is not None and v < lo:
        raise bad_request(f"'{name}' must be >= {lo}, got {_clip(str(v))}", param=name)
    if hi is not None and v > hi:
        raise bad_request(f"'{name}' must be <= {hi}, got {_clip(str(v))}", param=name)
    return v


def _common(b: _Body, kind: str) -> GenerationSpec:
    spec = GenerationSpec(kind=kind, model=b.string("model"))
    spec.n = b.integer("n", 1, 1, MAX_N)
    spec.stream = b.boolean("stream", False)
    opts = b.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request(f"'stream_options' must be an object, got {_type(opts)}", param="stream_options")
        if not spec.stream:     # as OpenAI answers it: the options are about a stream
            raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        spec.include_usage = _Body(opts).boolean("include_usage", False)
    max_tokens = b.integer("max_tokens", None, 0, MAX_COUNT)
    if kind == "chat":
        mct = b.integer("max_completion_tokens", None, 0, MAX_COUNT)
        if mct is not None:
            if max_tokens is not None and max_tokens != mct:
                raise bad_request("give 'max_completion_tokens' or 'max_tokens', not both with different values",
                                  param="max_completion_tokens")
            max_tokens = mct
    spec.max_tokens = max_tokens
    spec.stop = _stop(b.get("stop"))
    seed = b.integer("seed", None, -(2**63), 2**64 - 1)
    if seed == -1:
        seed = None             # -1 is "a random seed" (llama-server's and the library's convention)
    elif seed is not None and seed < 0:
        seed = seed % 2**64     # any other integer is a valid seed; the sampler wants it unsigned
    spec.sampling = dict(
        temperature=b.number("temperature", 1.0, 0.0, 2.0),
        top_p=b.number("top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=b.integer("top_k", 0, 0, MAX_COUNT),
        min_p=b.number("min_p", 0.0, 0.0, 1.0),
        presence_penalty=b.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=b.number("frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=b.number("repeat_penalty", 1.0, 0.0, None, lo_open=True),
        repeat_last_n=b.integer("repeat_last_n", 64, -1, MAX_COUNT),
        seed=seed,
        logit_bias=_logit_bias(b.get("logit_bias")),
    )
    spec.ignore_eos = b.boolean("ignore_eos", False)
    best_of = b.integer("best_of", None, 1, MAX_N)
    if best_of is not None and best_of != spec.n:
        raise bad_request("'best_of' other than n is not supported", param="best_of")
    _constraint(b, spec)
    spec.speculative = b.string("speculative")
    if spec.speculative not in (None, "draft", "lookup", "off"):
        raise bad_request(f"'speculative' must be \"draft\", \"lookup\" or \"off\", got {_clip(repr(spec.speculative))}",
                          param="speculative")
    spec.draft_max = b.integer("draft_max", None, 1, MAX_DRAFT)
    return spec


def _constraint(b: _Body, spec: GenerationSpec) -> None:
    """OpenAI's response_format, llama-server's json_schema and grammar, and regex: at most one."""
    given = []
    fmt = b.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            raise bad_request("response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                              "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                              param="response_format")
        if fmt["type"] == "json_object":
            given.append(("response_format", GrammarSpec("json_schema", '{"type": "object"}')))
        elif fmt["type"] == "json_schema":
            js = fmt.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("name"), str) or not js["name"]:
                raise bad_request("response_format.json_schema must be an object with a non-empty string 'name'",
                                  param="response_format.json_schema")
            if js.get("strict") is not None and not isinstance(js["strict"], bool):
                raise bad_request("response_format.json_schema.strict must be a boolean",
                                  param="response_format.json_schema.strict")
            schema = js.get("schema", {"type": "object"})
            if not isinstance(schema, dict):
                raise bad_request(f"response_format.json_schema.schema must be a JSON Schema object, got "
                                  f"{_type(schema)}", param="response_format.json_schema.schema")
            given.append(("response_format", GrammarSpec("json_schema", json.dumps(schema))))
    schema = b.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise bad_request(f"'json_schema' must be a JSON Schema object, got {_type(schema)}", param="json_schema")
        given.append(("json_schema", GrammarSpec("json_schema", json.dumps(schema))))
    for name, kind in (("grammar", "grammar"), ("regex", "regex")):
        v = b.get(name)
        if v is not None and v != "":
            if not isinstance(v, str):
                raise bad_request(f"'{name}' must be a string, got {_type(v)}", param=name)
            given.append((name, GrammarSpec(kind, v)))
    if len(given) > 1:
        raise bad_request(f"give at most one of response_format, json_schema, grammar and regex "
                          f"(got {' and '.join(n for n, _ in given)})", param=given[1][0])
    if given:
        spec.constraint_param, spec.constraint = given[0]


def _stop(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise bad_request(f"'stop' must be a string or an array of strings, got {_type(v)}", param="stop")
    if len(v) > MAX_STOP:
        raise bad_request(f"'stop' may hold at most {MAX_STOP} strings, got {len(v)}", param="stop")
    for s in v:
        if not isinstance(s, str) or not s:
            raise bad_request("'stop' entries must be non-empty strings", param="stop")
    return list(v)


def _logit_bias(v: Any) -> dict[int, float] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad_request(f"'logit_bias' must be an object mapping token ids to numbers, got {_type(v)}",
                          param="logit_bias")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' may hold at most {MAX_LOGIT_BIAS} entries, got {len(v)}",
                          param="logit_bias")
    out = {}
    for k, bias in v.items():
        # a short run of ASCII digits: int() alone would take "+1", "1_0", " 1" and fail on 5000 digits
        if not (k.isascii() and k.isdigit() and len(k) <= 10) or int(k) > MAX_TOKEN_ID:
            raise bad_request(f"'logit_bias' keys must be token ids (non-negative integers), got {_clip(repr(k))}",
                              param="logit_bias")
        tok = int(k)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"'logit_bias' values must be numbers in [-100, 100], got {_clip(repr(bias))}",
                              param="logit_bias")
        out[tok] = float(bias)
    return out or None


def parse_chat(body: Any) -> GenerationSpec:
    b = _Body(body)
    spec = _common(b, "chat")
    messages = b.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", param="messages")
    if not isinstance(messages, list):
        raise bad_request(f"'messages' must be an array of message objects, got {_type(messages)}", param="messages")
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' may hold at most {MAX_MESSAGES} messages, got {len(messages)}",
                          param="messages")
    images = ImageCount()
    converted = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object, got {_type(m)}", param=f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str):
            raise bad_request(f"messages[{i}].role must be a string, got {_type(role)}", param=f"messages[{i}].role")
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise bad_request(f"messages[{i}].role {role!r} is not one of system, developer, user, assistant, tool",
                              param=f"messages[{i}].role")
        _message_names(m, i, role)
        content = openai_content(m.get("content"), f"messages[{i}].content", role, images)
        converted.append(m if content is m.get("content") else {**m, "content": content})
    spec.messages = converted
    spec.logprobs = b.boolean("logprobs", False)
    spec.top_logprobs = b.integer("top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if spec.top_logprobs and not spec.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    spec.tools = _tools(b.get("tools"))
    spec.parallel_tool_calls = b.boolean("parallel_tool_calls", True)
    _tool_choice(b.get("tool_choice"), spec)
    spec.template_kwargs = _template_kwargs(b)
    # vLLM's name for it; None: the model thinks as long as it likes
    spec.thinking_budget = b.integer("thinking_token_budget", None, 0, MAX_COUNT)
    return spec


# the string fields of a message a template may read, and the role that requires each (as OpenAI does)
MESSAGE_STRINGS = {"tool_call_id": "tool", "name": "function"}


def _message_names(m: dict, i: int, role: str) -> None:
    """A message's `tool_call_id` and `name`: strings when given, and not null where its role requires it
    (they reach the template as they are: a number or an object would be rendered, or break it)."""
    for key, needed_by in MESSAGE_STRINGS.items():
        if key not in m or isinstance(m[key], str) or (m[key] is None and role != needed_by):
            continue
        where = f"messages[{i}].{key}"
        raise bad_request(f"{where} must be a string, got {_type(m[key])}", param=where)


def _template_kwargs(b: _Body) -> dict:
    """`chat_template_kwargs` (extra template variables, as vLLM and llama-server take them) with
    `reasoning_effort` among them; a template that does not read a variable ignores it."""
    try:
        out = check_template_kwargs(b.get("chat_template_kwargs"))
    except InvalidInputError as e:
        raise bad_request(f"'chat_template_kwargs': {e}", param="chat_template_kwargs") from None
    return with_reasoning_effort(out, b.get("reasoning_effort"), "reasoning_effort")


def with_reasoning_effort(kwargs: dict, effort: Any, param: str) -> dict:
    """`kwargs` with the template variable `reasoning_effort` (gpt-oss's template reads it) set to
    `effort`, one of REASONING_EFFORTS (those a template does not know as their nearest), unless None."""
    if effort is None:
        return kwargs
    if effort not in REASONING_EFFORTS:
        shown = repr(effort) if isinstance(effort, str) else _type(effort)
        raise bad_request(f"'{param}' must be one of {', '.join(REASONING_EFFORTS)}, got {_clip(shown)}",
                          param=param)
    level = TEMPLATE_EFFORT.get(effort, effort)
    if kwargs.get("reasoning_effort", level) != level:
        raise bad_request(f"'{param}' is {effort!r} but 'chat_template_kwargs' sets reasoning_effort to "
                          f"{_clip(repr(kwargs['reasoning_effort']))}; give it once", param=param)
    return {**kwargs, "reasoning_effort": level}


def _tool_choice(v: Any, spec: GenerationSpec) -> None:
    """"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}, as OpenAI takes it."""
    if v is None or v == "auto":
        return
    if v == "none":
        spec.tools = None             # the model is not told about tools and its answer is not parsed
        spec.tool_choice = "none"
        return
    if v == "required":
        if not spec.tools:
            raise bad_request("tool_choice 'required' needs 'tools'", param="tool_choice")
        spec.tool_choice = "required"
        return
    if isinstance(v, dict):
        fn = v.get("function")
        if v.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request("tool_choice as an object must be {\"type\": \"function\", "
                              "\"function\": {\"name\": \"...\"}}", param="tool_choice")
        offered = [t["function"]["name"] for t in spec.tools or []]
        if fn["name"] not in offered:
            raise bad_request(f"tool_choice names the function {fn['name']!r}, which is not among 'tools' "
                              f"({', '.join(map(repr, offered)) or 'none given'})", param="tool_choice")
        spec.tool_choice = "function"
        spec.forced_tool = fn["name"]
        return
    shown = repr(v) if isinstance(v, str) else _type(v)
    raise bad_request(f"tool_choice must be 'none', 'auto', 'required' or a function object, got {shown}",
                      param="tool_choice")


def _tools(v: Any) -> list | None:
    if v is None:
        return None
    if not isinstance(v, list):
        raise bad_request(f"'tools' must be an array, got {_type(v)}", param="tools")
    if len(v) > MAX_TOOLS:
        raise bad_request(f"'tools' may hold at most {MAX_TOOLS} tools, got {len(v)}", param="tools")
    names: set[str] = set()
    for i, t in enumerate(v):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad_request(f"{where} must be an object with type 'function'", param=where)
        check_function(t.get("function"), f"{where}.function", where, names)
    return v or None


def check_function(fn: Any, where: str, param: str, names: set[str], schema: str = "parameters") -> None:
    """A function tool's definition (`where`: the request's name for it, chat's tools[i].function or
    a Responses or Anthropic tools[i]; `schema`: its arguments' JSON Schema field, Anthropic's
    input_schema); `names`: those of the tools before it, this one's added."""
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad_request(f"{where} must be an object with a non-empty string 'name'", param=param)
    # a call is known by its name alone: two tools of one name make it unclear which was called
    if fn["name"] in names:
        raise bad_request(f"{where}.name {shown(fn['name'])} is taken by an earlier tool", param=param)
    names.add(fn["name"])
    params = fn.get(schema)
    if params is not None and not isinstance(params, dict):
        raise bad_request(f"{where}.{schema} must be a JSON Schema object", param=param)
    # arguments are an object (as OpenAI requires): under a forcing tool_choice the grammar would
    # make the model write a string or a number, which no parser takes for a call
    kind = (params or {}).get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise bad_request(f"{where}.{schema} must describe an object (the arguments), "
                          f"got type {json.dumps(kind)}", param=param)


def parse_completion(body: Any) -> GenerationSpec:
    b = _Body(body)
    spec = _common(b, "completion")
    prompt = b.get("prompt")
    if prompt is None:
        raise bad_request("'prompt' is required", param="prompt")
    spec.prompts = _prompts(prompt)
    spec.echo = b.boolean("echo", False)
    lp = b.integer("logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    spec.logprobs = lp is not None
    spec.top_logprobs = lp or 0
    suffix = b.string("suffix")
    if suffix:      # OpenAI: an empty suffix is no suffix
        if spec.echo:
            raise bad_request("'echo' cannot be combined with 'suffix'", param="echo")
        if not all(isinstance(p, str) for p in spec.prompts):
            raise bad_request("with 'suffix' (fill-in-the-middle) the prompt must be text, not token ids",
                              param="prompt")
        spec.suffix = suffix
    return spec


def _prompts(v: Any) -> list:
    """A string, an array of token ids, or an array of either (a batch)."""
    def is_ids(x, where):
        if not (isinstance(x, list) and x and all(type(t) is int for t in x)):
            return False
        bad = next((t for t in x if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:     # the vocabulary check comes with the model; this one keeps ids in int32
            raise bad_request(f"{where} holds the token id {_clip(str(bad))}, out of range", param="prompt")
        return True

    if isinstance(v, str):
        check_text_chars([v], "prompt")
        return [v]
    if is_ids(v, "'prompt'"):
        return [v]
    if isinstance(v, list):
        if not v:
            raise bad_request("'prompt' must not be empty", param="prompt")
        for i, p in enumerate(v):
            if not (isinstance(p, str) or is_ids(p, f"prompt[{i}]")):
                raise bad_request(f"prompt[{i}] must be a string or a non-empty array of token ids", param="prompt")
        check_text_chars(v, "prompt")
        return list(v)
    raise bad_request(f"'prompt' must be a string, an array of strings or of token ids, got {_type(v)}",
                      param="prompt")

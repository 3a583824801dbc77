"""Tool calls in model output (Qwen/Hermes style), parsed as the text streams in.

The documented form is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
Small Qwen models often drop the tags and answer with the bare JSON object,
sometimes in a ``` fence; like llama.cpp we take that as a call too, but only
when the whole answer starts with it.

`ToolCallParser` turns text into content and OpenAI-style tool-call deltas while
it arrives: as soon as `{"name": "X", "arguments": {` is seen (X an offered tool)
it announces the call (id, type, name), then passes the arguments object through
in pieces, ending where its braces balance. Other shapes (keys in another order,
arguments as a string) are held and parsed whole at `</tool_call>` or the end.
A call must name an offered tool and carry an object as arguments; anything else
stays content, so nothing the model wrote is lost. The non-streaming answer runs
the same parser over the whole text (`extract_tool_calls`), so both agree.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from ..constraints.grammar import JSON_STYLE

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:')
_FENCE_OPEN = re.compile(r"\s*```([A-Za-z]*)[ \t]*\n")
_FENCE_CLOSE = re.compile(r"\s*```\s*$")

# parser states
START, TEXT, HEADER, ARGS, TAIL, WHOLE, SKIP = "start", "text", "header", "args", "tail", "whole", "skip"


def tool_names(tools: list | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


@dataclass
class ToolSetup:
    """How one request's answers are read for tool calls."""
    names: set[str] = field(default_factory=set)   # offered tools (empty: no parsing)
    prefix: str = ""                                # what we started the answer with (forced choice)
    parallel: bool = True                           # parallel_tool_calls
    harmony: bool = False                           # the model answers in harmony's channels (gpt-oss)
    thinks: bool = False                            # the model reasons in <think>...</think> first (think.py)
    thought_open: bool = False                      # ...and the prompt already opened that <think>

    def parser(self) -> "ToolCallParser":
        return ToolCallParser(self.names, self.prefix, self.parallel)

    def extract(self, text: str) -> tuple[str, list[dict]]:
        return extract_tool_calls(text, self.names, self.prefix, self.parallel)

    def text_spans(self, text: str) -> list[tuple[int, int]]:
        """Where extract(text)'s content lies in `text` (the calls left out)."""
        return split_answer(text, self.names, self.prefix, self.parallel)[2]


def hermes_prefix(choice) -> str:
    """Text that starts the assistant's answer so the model must call a tool (Hermes-style templates).

    `choice` is "required" (the model picks the name) or the name of the forced function.
    """
    if choice == "required":
        return OPEN_TAG + '\n{"name": "'
    return OPEN_TAG + '\n{"name": ' + json.dumps(choice, ensure_ascii=False) + ', "arguments":'


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _whole_call(body: str, names: set[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) of a complete call object, or None when it is not a valid call."""
    m = _FENCE_OPEN.match(body)
    if m and m.group(1) in ("", "json"):
        body = _FENCE_CLOSE.sub("", body[m.end():])
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):       # arguments given as a JSON string
        try:
            if not isinstance(json.loads(args), dict):
                return None
        except ValueError:
            return None
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (held back: the tag may be arriving)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolCallParser:
    """Feed text as it is generated; get (content, tool-call deltas) back.

    names: the tools the request offered; prefix: text we put at the start of the
    answer (forced tool choice), parsed but never echoed as content unless the
    model fails to make a call of it; parallel: False keeps only the first call.
    """

    def __init__(self, names: set[str], prefix: str = "", parallel: bool = True):
        self.names = names
        self.parallel = parallel
        self.state = START
        self.buf = ""            # text not yet decided on
        self.block = ""          # raw text of the call being parsed, from its tag (the content fallback)
        self.bare = False        # the call has no <tool_call> tag (a bare JSON answer)
        self.calls: list[dict] = []   # {"id", "name", "arguments", "complete"}
        self._name = ""
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._started = False    # the arguments object has begun (the call is announced)
        self._out: list[tuple] = []
        self.seen = 0            # characters fed, the prefix's included (buf is always their tail)
        self.block_at = 0        # where the call being parsed began (its tag or the blanks before it, or a
                                 # bare call's first blank)
        self.lead = ""           # the blanks just before the call's tag: none of the content's if it is a call
        self._spans: list[tuple[int, int]] = []   # (start, end) of each piece of content, as fed
        self._skip = len(prefix)   # the prefix is ours, not generated: spans are counted after it
        # The prefix only opens a call; whatever it yields goes out with the first real output.
        self._carry = self._step_all(prefix) if prefix else ([], [])

    # -- output ------------------------------------------------------------------------------
    def _content(self, text: str, at: int) -> None:
        """Content that began `at` characters into the text fed."""
        if text and not (self.calls and not text.strip()):   # whitespace between calls is not content
            self._out.append(("content", text))
            if self._spans and self._spans[-1][1] == at:
                self._spans[-1] = (self._spans[-1][0], at + len(text))
            else:
                self._spans.append((at, at + len(text)))

    def _here(self) -> int:
        """Where `buf` begins in the text fed."""
        return self.seen - len(self.buf)

    def content_spans(self) -> list[tuple[int, int]]:
        """Where the content lies in the generated text fed so far (no call, no whitespace between
        calls; a call that fell back to text is content)."""
        out = []
        for s, e in self._spans:
            s, e = max(s - self._skip, 0), e - self._skip
            if e > s:
                out.append((s, e))
        return out

    def settled(self) -> int:
        """How much of the generated text fed so far is decided (content or call): not what is held,
        nor a call not yet announced, which may still turn out to be text."""
        undecided = self.state in (HEADER, WHOLE) or (self.state == ARGS and not self._started)
        return max((self.block_at if undecided else self._here()) - self._skip, 0)

    def reasoning_spans(self) -> list[tuple[int, int]]:
        return []            # no reasoning channel (see take_reasoning)

    def _announce(self) -> None:
        self.calls.append({"id": new_call_id(), "name": self._name, "arguments": "", "complete": False})
        c = self.calls[-1]
        self._out.append(("delta", {"index": len(self.calls) - 1, "id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": ""}}))

    def _args(self, text: str) -> None:
        if text:
            self.calls[-1]["arguments"] += text
            self._out.append(("delta", {"index": len(self.calls) - 1, "function": {"arguments": text}}))

    def _step_all(self, text: str) -> tuple[list[str], list[dict]]:
        self.buf += text
        self.seen += len(text)
        while self._advance():
            pass
        return self._take()

    def _take(self) -> tuple[list[str], list[dict]]:
        out, self._out = self._out, []
        return [v for k, v in out if k == "content"], [v for k, v in out if k == "delta"]

    def _result(self, content: list[str], deltas: list[dict]) -> tuple[str, list[dict]]:
        if self._carry is not None:
            c0, d0 = self._carry
            self._carry = None
            content, deltas = c0 + content, d0 + deltas
        return "".join(content), merge_call_deltas(deltas)

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, text: str) -> tuple[str, list[dict]]:
        """Content to emit now and tool-call deltas (OpenAI `delta.tool_calls` entries)."""
        return self._result(*self._step_all(text))

    def take_reasoning(self) -> str:
        return ""            # this format has no reasoning channel (harmony's parser has one)

    def _advance(self) -> bool:
        """One state transition over `buf`; False when it needs more text."""
        s = self.state
        if s == START:
            head = self.buf.lstrip()
            if not head or (len(head) < 3 and "```".startswith(head)):
                return False
            if head.startswith("```"):
                m = _FENCE_OPEN.match(self.buf)
                if m is None:
                    if "\n" not in head:
                        return False          # the fence's language word may still be arriving
                    self.state = TEXT
                    return True
                if m.group(1) not in ("", "json"):
                    self.state = TEXT
                    return True
                return self._open_block(bare=True)
            if head.startswith("{"):
                return self._open_block(bare=True)
            self.state = TEXT
            return True
        if s == TEXT:
            at = self.buf.find(OPEN_TAG)
            if at < 0:
                if self.calls and not self.buf.strip():
                    return False          # whitespace after a call: content only if text follows
                keep = _partial_suffix(self.buf, OPEN_TAG)
                text = self.buf[:len(self.buf) - keep]
                keep += len(text) - len(text.rstrip())    # trailing blanks wait: a call may follow them
                self._content(self.buf[:len(self.buf) - keep], self._here())
                self.buf = self.buf[len(self.buf) - keep:]
                return False
            text = self.buf[:at].rstrip()     # the blanks just before a call are not content (as an answer
            self._content(text, self._here())     # read whole is stripped): held with the call, its text's if not
            self.lead = self.buf[len(text):at]
            self.block_at = self._here() + len(text)
            self.buf = self.buf[at + len(OPEN_TAG):]
            if self.calls and not self.parallel:
                self.state = SKIP
                return True
            self.block = OPEN_TAG
            self.bare = False
            self.state = HEADER
            return True
        if s == SKIP:                 # a further call while parallel_tool_calls is false: dropped
            return self._drop_through_close()
        if s == HEADER:
            body = self.buf
            if self.bare:
                m = _FENCE_OPEN.match(body)
                if m:
                    body = body[m.end():]
            m = _HEADER.match(body)
            if m is not None:
                if m.group(1) not in self.names:
                    self.state = WHOLE
                    return True
                self._name = m.group(1)
                consumed = len(self.buf) - len(body) + m.end()
                self.block += self.buf[:consumed]
                self.buf = self.buf[consumed:]
                self.state = ARGS
                self._started = False
                return True
            if not self.bare and CLOSE_TAG in self.buf:
                self.state = WHOLE
                return True
            return False
        if s == ARGS:
            return self._scan_args()
        if s == TAIL:
            if self.bare:
                self.buf = ""         # the closing brace (and fence) of a bare call
                return False
            return self._drop_through_close()
        if s == WHOLE:
            if self.bare:
                return False          # parsed at the end
            at = self.buf.find(CLOSE_TAG)
            if at < 0:
                return False
            raw, self.buf = self.block + self.buf[:at], self.buf[at + len(CLOSE_TAG):]
            self._whole(raw[len(OPEN_TAG):], raw + CLOSE_TAG)
            self.state = TEXT
            return True
        return False

    def _drop_through_close(self) -> bool:
        """Drop text up to and including the closing tag (back to TEXT); keep a partial tag for later."""
        at = self.buf.find(CLOSE_TAG)
        if at < 0:
            keep = _partial_suffix(self.buf, CLOSE_TAG)
            self.buf = self.buf[len(self.buf) - keep:]
            return False
        self.buf = self.buf[at + len(CLOSE_TAG):]
        self.state = TEXT
        return True

    def _open_block(self, bare: bool) -> bool:
        self.bare = bare
        self.block = ""
        self.lead = ""
        self.block_at = self._here()
        self.state = HEADER
        return True

    def _whole(self, body: str, raw: str) -> None:
        """A call parsed in one piece, or its raw text as content."""
        call = _whole_call(body, self.names)
        if call is None:
            self._content(self.lead + raw, self.block_at)
            return
        self._name = call[0]
        self._announce()
        self._args(call[1])
        self.calls[-1]["complete"] = True

    def _scan_args(self) -> bool:
        """Pass the arguments object through until its braces balance."""
        i = 0
        buf = self.buf
        if not self._started:
            while i < len(buf) and buf[i].isspace():
                i += 1
            if i == len(buf):
                return False
            if buf[i] != "{":                 # a string or other value: parse the call whole
                self.state = WHOLE
                return True
            self._announce()
            self._started = True
            self.block += buf[:i]
            buf = buf[i:]
            i = 0
            self._depth, self._in_str, self._esc = 0, False, False
        end = -1
        for k, ch in enumerate(buf):
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif ch == "\\":
                    self._esc = True
                elif ch == '"':
                    self._in_str = False
            elif ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = k + 1
                    break
        piece = buf if end < 0 else buf[:end]
        self._args(piece)
        self.block += piece
        self.buf = "" if end < 0 else buf[end:]
        if end < 0:
            return False
        self.calls[-1]["complete"] = True
        self.state = TAIL
        return True

    def finish(self) -> tuple[str, list[dict]]:
        """Whatever is still held, at the end of the answer."""
        s, buf = self.state, self.buf
        self.buf = ""
        if s in (START, TEXT):
            self._content(buf, self.seen - len(buf))
        elif s in (HEADER, WHOLE) or (s == ARGS and not self._started):
            raw = self.block + buf
            body = raw[len(OPEN_TAG):] if not self.bare and raw.startswith(OPEN_TAG) else raw
            self._whole(body, raw)
        # ARGS (started): a call cut short (max_tokens); TAIL/SKIP: nothing left to say
        self.state = TEXT
        return self._result(*self._take())


def merge_call_deltas(deltas: list[dict]) -> list[dict]:
    """One delta per call index (arguments concatenated), in index order."""
    by_index: dict[int, dict] = {}
    for d in deltas:
        have = by_index.get(d["index"])
        if have is None:
            by_index[d["index"]] = {**d, "function": dict(d["function"])}
        else:
            have["function"]["arguments"] += d["function"].get("arguments", "")
            for key in ("id", "type"):
                if key in d:
                    have[key] = d[key]
            if "name" in d["function"]:
                have["function"]["name"] = d["function"]["name"]
    return [by_index[k] for k in sorted(by_index)]


def _valid_call(call: dict) -> bool:
    try:
        return call["complete"] and isinstance(json.loads(call["arguments"]), dict)
    except ValueError:
        return False


def extract_tool_calls(text: str, names: set[str], prefix: str = "",
                       parallel: bool = True) -> tuple[str, list[dict]]:
    """(content, tool calls) of a finished answer: split_answer's, without where the content lies."""
    content, calls, _ = split_answer(text, names, prefix, parallel)
    return content, calls


def split_answer(text: str, names: set[str], prefix: str = "",
                 parallel: bool = True) -> tuple[str, list[dict], list[tuple[int, int]]]:
    """(content, tool calls, where the content lies in `text`) of a finished answer; `text` is what
    the model generated after `prefix`.

    Calls must be complete with arguments that parse as a JSON object; otherwise the whole
    answer (with the prefix) is returned as content and no call. An answer that ends inside a
    call's arguments (cut by max_tokens) is the exception: its calls come back as streaming sent
    them, the last one's arguments as far as they got (as OpenAI returns a call cut by the limit).
    """
    p = ToolCallParser(names, prefix, parallel)
    content, _ = p.feed(text)
    rest, _ = p.finish()
    content += rest
    calls = []
    cut = bool(p.calls) and not p.calls[-1]["complete"]
    for c in p.calls:
        if not cut and not _valid_call(c):
            return prefix + text, [], [(0, len(text))] if text else []
        calls.append({"id": c["id"], "type": "function",
                      "function": {"name": c["name"], "arguments": c["arguments"]}})
    if not calls:
        return content, [], p.content_spans()
    return content.strip(), calls, _stripped(p.content_spans(), text)


def _stripped(spans: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
    """`spans` of `text` less the blanks their joined text starts and ends with (as str.strip())."""
    spans = list(spans)
    while spans and not text[spans[0][0]:spans[0][1]].strip():
        spans.pop(0)
    while spans and not text[spans[-1][0]:spans[-1][1]].strip():
        spans.pop()
    if spans:
        s, e = spans[0]
        spans[0] = (e - len(text[s:e].lstrip()), e)
        s, e = spans[-1]
        spans[-1] = (s, s + len(text[s:e].rstrip()))
    return spans


# -- constrained calls -------------------------------------------------------------------------
# A call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` whatever the template, so
# the parser above reads calls of Hermes-style templates and of the generic prompt alike. The
# grammar makes it valid by construction: the name one of the offered tools, the arguments valid
# against that tool's parameter schema.

def call_schema(tools: list, names: set[str]) -> dict:
    """JSON schema of one call object to any of `names` (name first, as the streaming parser wants)."""
    alts = []
    for i, t in enumerate(tools):
        fn = t["function"]
        if fn["name"] not in names:
            continue
        params = fn.get("parameters") or {"type": "object"}
        # a schema resource of its own: its "#/$defs/..." refs (pydantic writes them) resolve against
        # the parameters, where they were written, not against this call schema's root
        params = {"$id": f"urn:llambda:tool-parameters:{i}", **params}
        alts.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                     "required": ["name", "arguments"], "additionalProperties": False})
    schema = alts[0] if len(alts) == 1 else {"anyOf": alts}
    return {**schema, "x-guidance": JSON_STYLE}


def tool_grammar(tools: list, names: set[str], choice: str, parallel: bool, opening: str = "") -> str:
    """A Lark grammar (llguidance's dialect) for an answer under tools.

    choice "required" or "function" (names: the forced one): the prompt already ends with
    `hermes_prefix(...)` (prefilled, cheaper than forced decode steps), and the grammar goes on
    from there: a tool name, its arguments, the closing tag; more calls with `parallel`. Where the
    answer comes after a thought, the prompt cannot end with it: `opening` (that prefix) is then
    the grammar's first text.
    "auto": free text, but from a `<tool_call>` tag on (a lazy lexeme: it ends at the first
    occurrence of the tag) the call must be valid, and text may follow a call, as the parser
    expects. An answer that opens with `{` or a ``` fence is what the parser takes for a bare
    call (small models drop the tags), so there it must be a valid call too.
    """
    def schema(obj) -> str:
        return json.dumps({**obj, "x-guidance": JSON_STYLE}, ensure_ascii=False)

    rules = (f'call: %json {json.dumps(call_schema(tools, names), ensure_ascii=False)}\n'
             f'body: "\\n"? call "\\n"? "{CLOSE_TAG}"\n'
             'TEXT: /(.|\\n)*/\n')
    if choice == "auto":
        start = (f'start: first body (lead body)* TEXT | FIRST | bare\n'
                 f'first[lazy]: FIRST "{OPEN_TAG}"\n'
                 f'lead[lazy]: TEXT "{OPEN_TAG}"\n'
                 'bare: call | "```json\\n" call "\\n```" | "```\\n" call "\\n```"\n'
                 # text that does not open a bare call: its first visible character is not "{",
                 # and a ``` fence there names a language other than json
                 'FIRST: /\\s*|\\s*([^\\s{`]|`[^`]|``[^`]|```([A-Za-ik-z]|j[^s]|js[^o]|jso[^n]|json[^ \\t\\n]'
                 '|[^A-Za-z \\t\\n]))(.|\\n)*/')
        return f'%llguidance {{}}\n{start}\n{rules}'
    heads = []
    for i, t in enumerate(x for x in tools if x["function"]["name"] in names):
        fn = t["function"]
        rules += f'args_{i}: %json {schema(fn.get("parameters") or {"type": "object"})}\n'
        # after the prefix `{"name": "` comes the rest of the name; a forced name is in the prefix
        head = "" if choice == "function" else json.dumps(fn["name"], ensure_ascii=False)[1:] + ', "arguments":'
        heads.append(f'{json.dumps(head, ensure_ascii=False)} " "? args_{i}' if head else f'" "? args_{i}')
    more = f' ("\\n"? "{OPEN_TAG}" body)*' if parallel else ""
    lead = f'{json.dumps(opening, ensure_ascii=False)} ' if opening else ""
    start = f'start: {lead}({" | ".join(heads)}) "}}" "\\n"? "{CLOSE_TAG}"{more}'
    return f'%llguidance {{}}\n{start}\n{rules}'


GENERIC_TOOLS = """You can call these tools (functions), given as JSON schemas:
{tools}

To call a tool, answer with the call and nothing else, in this form:
<tool_call>
{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}
</tool_call>
{rule}"""


def generic_tool_messages(messages: list, tools: list, choice: str, forced: str | None) -> list:
    """Messages for a template that knows nothing of tools: a system message describing the tools
    and the call format, earlier calls written in that format, tool results as user turns."""
    listing = json.dumps([{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                           "parameters": t["function"].get("parameters") or {"type": "object"}}
                          for t in tools], ensure_ascii=False, indent=1)
    rule = {"required": "You must call one of the tools.",
            "function": f"You must call the tool {forced}."}.get(choice, "If no tool helps, answer directly.")
    text = GENERIC_TOOLS.format(tools=listing, rule=rule)
    out = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer") and not out:
            out.append({"role": "system", "content": f"{_text(m.get('content'))}\n\n{text}"})
            continue
        if not out:
            out.append({"role": "system", "content": text})
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_written_call(c) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (_text(m.get("content")) + "\n" + calls).strip()})
        elif role in ("tool", "function"):
            out.append({"role": "user", "content": f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"})
        else:
            out.append(m)
    return out


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _written_call(call: dict) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return f"{OPEN_TAG}\n{json.dumps({'name': fn.get('name'), 'arguments': args}, ensure_ascii=False)}\n{CLOSE_TAG}"

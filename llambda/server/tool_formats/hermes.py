"""Hermes' (and Qwen's) calls, the default format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Small Qwen models often drop the tags and answer with the bare JSON object, sometimes in a ``` fence
(```json or no language); as llama.cpp does, that is a call too, but only when the whole answer starts
with it (`bare_start`), and then nothing after its arguments is read.

A call is announced once `{"name": "X", "arguments": {` is seen, its arguments then streamed as they
come, and read to where their braces balance: what stands between them and `</tool_call>` (the call
object's own closing brace) is not looked at. Other shapes (keys in another order, "parameters",
arguments as a JSON string of an object, a fence inside the tags) are read whole at `</tool_call>` or
the end of the answer.
"""
from __future__ import annotations

import json
import re

from ...constraints.grammar import JSON_STYLE
from .base import ClosedByTag, prefix_of
from .forcing import Joins, Lark, Spelling, forced_call
from .json_text import call_object, json_end

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*\{')
_FENCE_OPEN = re.compile(r"\s*```([A-Za-z]*)[ \t]*\n")
_FENCE_CLOSE = re.compile(r"\s*```\s*$")
FENCE = "```"


def _unfenced(body: str) -> int:
    """Where a call's JSON starts in `body`: after a ```json (or bare ```) fence line, if it has one."""
    m = _FENCE_OPEN.match(body)
    return m.end() if m and m.group(1) in ("", "json") else 0


class HermesFormat(ClosedByTag):
    name = "hermes"
    openers, close = (OPEN,), CLOSE
    markers = (OPEN, CLOSE)
    bare = True

    def bare_start(self, text: str) -> bool | None:
        head = text.lstrip()
        if not head or prefix_of(head, FENCE):
            return None
        if head.startswith(FENCE):
            m = _FENCE_OPEN.match(text)
            if m is None:
                return None if "\n" not in head else False     # the fence's language may still be arriving
            return m.group(1) in ("", "json")
        return head.startswith("{")

    def _header(self, body: str, opener: str):
        at = 0 if opener else _unfenced(body)
        return _HEADER.match(body, at)

    def unit_end(self, body, opener, memo):
        if not opener:
            return None           # a bare call is the rest of the answer
        m = self._header(body, opener)
        if m is None:
            return super().unit_end(body, opener, memo)
        end = json_end(body, m.end() - 1, memo)     # the arguments' braces: a tag in a string is no end
        if end is None:
            return None
        at = body.find(CLOSE, max(end, memo.get("close", 0)))
        if at < 0:
            memo["close"] = max(len(body) - len(CLOSE) + 1, end)
            return None
        return at + len(CLOSE)

    def head(self, body, opener):
        m = self._header(body, opener)
        return m.group(1) if m else None

    def args_at(self, body, opener):
        m = self._header(body, opener)
        return m.end() - 1 if m else None

    def parse(self, body, opener, params):
        m = self._header(body, opener)
        if m is not None:
            end = json_end(body, m.end() - 1)
            if end is None:
                return None
            try:
                args = json.loads(body[m.end() - 1:end])
            except ValueError:
                return None
            return [(m.group(1), args)]
        text = self.inner(body) if opener else body
        at = _unfenced(text)
        if at:
            text = _FENCE_CLOSE.sub("", text[at:])
        try:
            call = call_object(json.loads(text))
        except ValueError:
            return None
        return [call] if call is not None else None

    def forced(self, tools, names, choice, spell=None, parallel=False):
        """The call's opening `<tool_call>\\n{"name": "` (a named one: up to `"arguments":`), then its name and
        arguments (a blank may come first), `}` and the closing tag (a newline may come before it); a
        further call is a whole call object in the tags (`body`, as tools.tool_grammar's "auto" reads)."""
        spell = spell or Spelling()
        return forced_call(tools, names, choice, opening,
                           lambda n: json.dumps(n, ensure_ascii=False)[1:] + ', "arguments":',
                           Lark(f'"}}" "\\n"? {spell(CLOSE)}'), spell,
                           Joins(OPEN, '"\\n"?', call="body", rules=call_rules(tools, names, spell)), parallel,
                           lead='" "?')


def opening(name: str) -> str:
    """What a forced call starts with: up to its name's opening quote, or for a named one to `"arguments":`."""
    return OPEN + '\n{"name": ' + (json.dumps(name, ensure_ascii=False) + ', "arguments":' if name else '"')


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


def call_rules(tools: list, names: set[str], spell: Spelling) -> tuple[str, ...]:
    """The Lark rules of a whole call: `call` (its JSON object), `body` (that and the closing tag, a
    newline allowed around it), and TEXT (any text)."""
    return (f"call: %json {json.dumps(call_schema(tools, names), ensure_ascii=False)}",
            f'body: "\\n"? call "\\n"? {spell(CLOSE)}',
            "TEXT: /(.|\\n)*/")

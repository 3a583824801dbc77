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

from .base import ClosedByTag, prefix_of
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
        return None       # tools.tool_grammar writes the Hermes form's grammars (auto, parallel calls too)

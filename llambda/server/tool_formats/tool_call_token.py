"""Granite 3.x's and Phi-4-mini's calls: `<|tool_call|>` then a JSON array of {"name", "arguments"}
objects (Phi-4-mini closes it with `<|/tool_call|>`, Granite does not)."""
from __future__ import annotations

from .base import ToolFormat, first_visible, prefix_of, skip_blanks
from .forcing import json_call
from .json_text import call_objects, json_call_args, json_call_name, json_end

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"


class ToolCallTokenFormat(ToolFormat):
    name = "tool_call_token"
    openers = (OPEN,)
    markers = (OPEN, CLOSE)

    def unit_end(self, body, opener, memo):
        i = first_visible(body)
        end = i if i is None or body[i] not in "[{" else json_end(body, i, memo)   # not JSON: its text is content
        if end is None or end == i:
            return end
        k = skip_blanks(body, end)
        if body.startswith(CLOSE, k):
            return k + len(CLOSE)
        if prefix_of(body, CLOSE, k):
            return None         # the closing tag may be arriving (or the answer ends here)
        return end

    def head(self, body, opener):
        return json_call_name(body)

    def args_at(self, body, opener):
        return json_call_args(body)

    def forced(self, tools, names, choice, spell=None, parallel=False):
        return json_call("arguments", OPEN + "[", "]", ", ")(tools, names, choice, spell, parallel)

    def parse(self, body, opener, params):
        body = body.strip()
        if body.endswith(CLOSE):
            body = body[:-len(CLOSE)].strip()
        return call_objects(body) if body[:1] in ("[", "{") else None

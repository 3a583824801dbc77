"""Llama 3.x's calls: a JSON object {"name", "parameters"} (or "arguments"), as the whole answer or
after `<|python_tag|>`; several are separated by `;`."""
from __future__ import annotations

import re

from .base import ToolFormat, call_objects, first_visible, json_end, skip_blanks

PYTHON_TAG = "<|python_tag|>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,')


class Llama3Format(ToolFormat):
    name = "llama3"
    openers = (PYTHON_TAG,)
    bare = True

    def unit_end(self, body, opener):
        i = first_visible(body)
        # not a JSON call (a built-in tool's code): its text is content
        return i if i is None or body[i] != "{" else json_end(body, i)

    def head(self, body, opener):
        m = _HEAD.match(body)
        return m.group(1) if m else None

    def parse(self, body, opener, params):
        calls = call_objects(body.strip())
        return calls if calls is not None and len(calls) == 1 and body.strip().startswith("{") else None

    def after(self, rest):
        i = skip_blanks(rest)
        if i == len(rest):
            return None         # a `;` and another call may follow the blanks
        if rest[i] != ";":
            return ("text", 0)
        j = skip_blanks(rest, i + 1)
        if j == len(rest):
            return None
        return ("unit", j) if rest[j] == "{" else ("text", 0)

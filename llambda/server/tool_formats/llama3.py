"""Llama 3.x's calls: a JSON object {"name", "parameters"} (or "arguments"), as the whole answer or
after `<|python_tag|>`; several are separated by `;`."""
from __future__ import annotations

from .base import ToolFormat, first_visible, skip_blanks
from .forcing import json_call
from .json_text import call_objects, json_call_args, json_call_name, json_end

PYTHON_TAG = "<|python_tag|>"


class Llama3Format(ToolFormat):
    name = "llama3"
    openers = (PYTHON_TAG,)
    bare = True
    markers = (PYTHON_TAG,)

    def unit_end(self, body, opener, memo):
        i = first_visible(body)
        # not a JSON call (a built-in tool's code): its text is content
        return i if i is None or body[i] != "{" else json_end(body, i, memo)

    def head(self, body, opener):
        return json_call_name(body)

    def args_at(self, body, opener):
        return json_call_args(body)

    def parse(self, body, opener, params):
        calls = call_objects(body.strip())
        return calls if calls is not None and len(calls) == 1 and body.strip().startswith("{") else None

    def forced(self, tools, names, choice, spell=None, parallel=False):
        return json_call("parameters", "", "", "; ")(tools, names, choice, spell, parallel)

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

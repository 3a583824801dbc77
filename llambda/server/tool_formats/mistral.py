"""Mistral's calls, after `[TOOL_CALLS]`: a JSON array of {"name", "arguments"} objects in older
templates (Mistral 7B v0.3, Nemo), or `NAME[ARGS]{json}` in newer ones (Mistral Small 3.2,
Devstral, Magistral), each call behind its own `[TOOL_CALLS]`; a `[CALL_ID]id` may stand between
the name and `[ARGS]`, and `[ARGS]` may be missing (the tokenizer's control tokens not shown)."""
from __future__ import annotations

import json
import re

from .base import ToolFormat, first_visible, prefix_of, skip_blanks
from .forcing import Joins, forced_call, json_call
from .json_text import call_objects, json_call_args, json_call_name, json_end

OPEN, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9_\-]+")


def _named(body: str, i: int) -> tuple[str | None, int | None]:
    """(name, where its JSON object starts) of `NAME[CALL_ID]id[ARGS]{`; (name, None) while more text
    is needed; (None, k) when the text at k cannot be such a call."""
    m = _NAME.match(body, i)
    if m is None:
        return None, i
    name, k = m.group(0), m.end()
    if k == len(body):
        return name, None
    for marker, tail in ((CALL_ID, _ID), (ARGS, None)):
        if prefix_of(body, marker, k):
            return name, None
        if body.startswith(marker, k):
            k += len(marker)
            if tail is not None:
                r = tail.match(body, k)
                if r is None:
                    return (name, None) if k == len(body) else (None, k)
                if r.end() == len(body):
                    return name, None
                k = r.end()
    k = skip_blanks(body, k)
    if k == len(body):
        return name, None
    return (name, k) if body[k] == "{" else (None, k)


class MistralFormat(ToolFormat):
    name = "mistral"
    openers = (OPEN,)
    markers = (OPEN, ARGS, CALL_ID)

    def __init__(self, tagged: bool = True):
        self.tagged = tagged        # the template writes `NAME[ARGS]{...}` (else a JSON array)

    def forced(self, tools, names, choice, spell=None, parallel=False):
        if not self.tagged:
            return json_call("arguments", OPEN + "[", "]", ", ")(tools, names, choice, spell, parallel)
        # each further call behind its own [TOOL_CALLS]
        return forced_call(tools, names, choice, lambda n: OPEN + n + ARGS if n else OPEN, lambda n: n + ARGS, "",
                           spell, Joins(OPEN), parallel)

    def unit_end(self, body, opener, memo):
        i = first_visible(body)
        if i is None or body[i] == "[":
            return i if i is None else json_end(body, i, memo)
        if "named" not in memo:
            name, k = _named(body, i)
            if k is None:
                return None
            if name is None:
                return k            # not a call: its text is content
            memo["named"] = k
        return json_end(body, memo["named"], memo)

    def head(self, body, opener):
        i = skip_blanks(body)
        if i < len(body) and body[i] == "[":
            return json_call_name(body)
        m = _NAME.match(body, i)       # the name is complete once `[ARGS]` (or `[CALL_ID]`, `{`) begins
        return m.group(0) if m and body[m.end():m.end() + 1] in ("[", "{") else None

    def args_at(self, body, opener):
        i = skip_blanks(body)
        if i < len(body) and body[i] == "[":
            return json_call_args(body)
        return _named(body, i)[1]

    def parse(self, body, opener, params):
        i = skip_blanks(body)
        if i < len(body) and body[i] == "[":
            return call_objects(body[i:])
        name, k = _named(body, i)
        if name is None or k is None:
            return None
        try:
            args = json.loads(body[k:])
        except ValueError:
            return None
        return [(name, args)] if isinstance(args, dict) else None

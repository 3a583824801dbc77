"""DeepSeek's calls, inside `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>`, each
`<｜tool▁call▁begin｜>` ... `<｜tool▁call▁end｜>`:

    V3 / R1:  function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    V3.1:     NAME<｜tool▁sep｜>{...}

(the bars are U+FF5C, the blanks U+2581, as the tokenizer spells these tokens)."""
from __future__ import annotations

import json
import re

from .base import ClosedByTag, prefix_of, skip_blanks
from .forcing import Joins, forced_call

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE_OPEN = re.compile(r"\s*```(?:json)?[ \t]*\n")
_FENCED = re.compile(r"\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*$", re.S)


def _call_text(body: str, opener: str) -> str:
    """The call's own text after the wrapper's and the call's openings (its closing taken off already)."""
    if opener == CALLS_BEGIN:
        i = skip_blanks(body)
        if body.startswith(CALL_BEGIN, i):
            body = body[i + len(CALL_BEGIN):]
    return body


def _split(text: str) -> tuple[str, str] | None:
    """(name, arguments text) of a call's text, or None while it is not yet plain."""
    at = text.find(SEP)
    if at < 0:
        return None
    before, after = text[:at].strip(), text[at + len(SEP):]
    if after.lstrip().startswith("{"):
        return before, after                       # V3.1
    nl = after.find("\n")
    if before != "function" or nl < 0:
        return None
    return after[:nl].strip(), after[nl + 1:]      # V3, R1


class DeepSeekFormat(ClosedByTag):
    name = "deepseek"
    openers, close = (CALLS_BEGIN, CALL_BEGIN), CALL_END
    markers = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def __init__(self, v31: bool = False):
        self.v31 = v31              # the template writes V3.1's `NAME<｜tool▁sep｜>{...}` (else V3/R1's form)

    def forced(self, tools, names, choice, spell=None, parallel=False):
        # further calls: each in its own call tags (a newline before it, as V3/R1's template writes),
        # all of them in the one calls wrapper
        begin = CALLS_BEGIN + CALL_BEGIN
        if self.v31:
            return forced_call(tools, names, choice, lambda n: begin + n + SEP if n else begin, lambda n: n + SEP,
                               CALL_END, spell, Joins(CALL_BEGIN, '"\\n"?', CALLS_END), parallel)
        fence = "\n```json\n"
        return forced_call(tools, names, choice, lambda n: begin + "function" + SEP + (n + fence if n else ""),
                           lambda n: n + fence, "\n```" + CALL_END, spell,
                           Joins(CALL_BEGIN + "function" + SEP, '"\\n"?', CALLS_END), parallel)

    def head(self, body, opener):
        got = _split(_call_text(body, opener))
        return got[0] if got and got[0] else None

    def args_at(self, body, opener):
        got = _split(_call_text(body, opener))
        if got is None:
            return None
        args = got[1]
        m = _FENCE_OPEN.match(args)
        at = len(body) - len(args) + (m.end() if m else 0)
        at = skip_blanks(body, at)
        return at if at < len(body) and body[at] == "{" else None

    def parse(self, body, opener, params):
        got = _split(_call_text(self.inner(body), opener))
        if got is None or not got[0]:
            return None
        name, args = got
        m = _FENCED.match(args)
        if m is not None:
            args = m.group(1)
        try:
            value = json.loads(args)
        except ValueError:
            return None
        return [(name, value)] if isinstance(value, dict) else None

    def after(self, rest):
        i = skip_blanks(rest)
        if rest.startswith(CALLS_END, i):
            return ("text", i + len(CALLS_END))
        if prefix_of(rest, CALLS_END, i):
            return None
        return ("text", 0)

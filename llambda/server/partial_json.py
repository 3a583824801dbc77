"""The object a JSON text cut short holds so far (a tool call's arguments cut off by max_tokens).

Anthropic's `tool_use.input` must be an object even when the output limit cut the call, and its
SDK reads a streamed input that way: containers as far as they got, a string, number or literal
that did not finish left out (with its key). `partial_object` reads a non-streamed answer's
arguments by the same rule, so both come out the same. Text that stops being JSON counts as the end;
so does a value the answer could not be written back as JSON from (the SDK's reader refuses them too):
NaN or Infinity, a number too large for a float or too long for an int, a lone surrogate escape.
"""
from __future__ import annotations

import json
import re

from .schemas import _SURROGATE     # left by an unpaired \uD8xx escape: not encodable as UTF-8

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"true": True, "false": False, "null": None}
_MAX_DEPTH = 200       # nesting deeper than this counts as the end (recursion stays bounded)


class _Cut(Exception):
    """The text ended (or stopped being JSON) inside a value."""


def _not_json(word: str):
    raise ValueError(f"{word} is no JSON number")


def _finite(word: str) -> float:
    value = float(word)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{word[:20]} overflows a float")
    return value


def _loads(text: str):
    """json.loads, refusing (ValueError) values that could not be written back as JSON; too long an
    int is refused by Python itself."""
    value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    if isinstance(value, str) and _SURROGATE.search(value):
        raise ValueError("a lone surrogate escape")
    return value


def _has_surrogate(root) -> bool:
    """Whether a parsed value holds a lone surrogate in any string or key (walked without recursion)."""
    stack = [root]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def partial_object(text: str) -> dict:
    """The members of the JSON object `text` begins, as far as they are finished; {} if none."""
    try:
        whole = _loads(text)
    except (ValueError, RecursionError):     # json recurses too: a deep nest is no whole object
        whole = None
    if isinstance(whole, dict) and not _has_surrogate(whole):
        return whole
    reader = _Reader(text)
    try:
        value = reader.value()
    except _Cut:
        return {}
    return value if isinstance(value, dict) else {}


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.stopped = False     # a container ended early: every enclosing one ends there too
        self.depth = 0

    def value(self):
        self._skip_space()
        if self.pos >= len(self.text):
            raise _Cut
        ch = self.text[self.pos]
        if ch in "{[" and self.depth >= _MAX_DEPTH:
            raise _Cut
        if ch == "{":
            out: dict = {}
            self._members("}", lambda: self._member(out))
            return out
        if ch == "[":
            items: list = []
            self._members("]", lambda: items.append(self.value()))
            return items
        if ch == '"':
            return self._string()
        return self._scalar()

    def _members(self, close: str, read_one) -> None:
        """Read `{`/`[` ... `close`, calling read_one per member; an early end keeps what was read."""
        self.pos += 1
        self.depth += 1
        first = True
        try:
            while True:
                self._skip_space()
                if self.text.startswith(close, self.pos):
                    self.pos += 1
                    return
                if not first:
                    self._expect(",")
                read_one()
                if self.stopped:
                    raise _Cut
                first = False
        except _Cut:
            self.stopped = True
        finally:
            self.depth -= 1

    def _member(self, out: dict) -> None:
        self._skip_space()
        if not self.text.startswith('"', self.pos):
            raise _Cut
        key = self._string()
        self._skip_space()
        self._expect(":")
        out[key] = self.value()

    def _string(self) -> str:
        i = self.pos + 1
        while i < len(self.text):
            ch = self.text[i]
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                try:
                    s = _loads(self.text[self.pos:i + 1])
                except ValueError:
                    raise _Cut from None
                self.pos = i + 1
                return s
            i += 1
        raise _Cut

    def _scalar(self):
        """A number or true/false/null; one the text ends in counts only if it is already whole."""
        start = end = self.pos
        text = self.text
        if text[start] in _NUMBER_CHARS:
            while end < len(text) and text[end] in _NUMBER_CHARS:
                end += 1
            word = text[start:end]
            if not _NUMBER.fullmatch(word):
                raise _Cut
            try:
                number = _loads(word)
            except ValueError:
                raise _Cut from None
            self.pos = end
            return number
        while end < len(text) and text[end].isalpha():
            end += 1
        word = text[start:end]
        if word not in _LITERALS:
            raise _Cut
        self.pos = end
        return _LITERALS[word]

    def _skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1

    def _expect(self, ch: str) -> None:
        self._skip_space()
        if not self.text.startswith(ch, self.pos):
            raise _Cut
        self.pos += 1

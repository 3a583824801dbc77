"""A forced tool_choice ("required" or a named function) written in a format's own syntax.

The call's fixed start (`ForcedCall.opening`: the format's marker, and the name where it is forced)
is prefilled, so the model never has to choose to call; a Lark grammar (llguidance's dialect) makes
the rest one call of an offered tool with arguments valid against its parameters' JSON schema, ending
where the format ends a call. With parallel_tool_calls (`parallel`), as OpenAI's "required" means one
or more calls, further calls may follow in the format's own syntax (`Joins`: what opens a further
call, the blanks allowed before it, what ends the last), each again of an offered tool (a named
function: of that one); without it exactly one. After a `<think>` thought the prompt cannot end with the opening: it is
then the grammar's first text instead (`grammar(inline=True)`), which waits for the thought's end.

The parser of the answer reads the prefilled opening as the call's start (ToolSetup.prefix), so the
answer does too. A format's markers are written as the vocabulary's control tokens where they are
ones (`Spelling`): a grammar's text never produces a control token, and a model taught the marker as
one token should not be made to spell it out byte by byte.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...constraints.grammar import JSON_STYLE


class Lark(str):
    """Lark grammar text where a text to spell is expected: written as it is (Spelling passes it on)."""


class Spelling:
    """How a grammar writes text holding a format's markers: each marker that is one control token of
    the vocabulary as that token (`<[id]>`, llguidance's syntax), the rest as Lark string literals
    (a `Lark` is grammar text already: written as it is)."""

    def __init__(self, ids: dict[str, int] | None = None):
        self.ids = dict(ids or {})

    @classmethod
    def of(cls, tokenizer, markers) -> "Spelling":
        """The markers that are one control token of `tokenizer` (None: none, all written as text)."""
        ids = {}
        for m in markers if tokenizer is not None else ():
            got = tokenizer.encode(m, parse_special=True)
            if len(got) == 1 and tokenizer.is_special(got[0]):
                ids[m] = int(got[0])
        return cls(ids)

    def token(self, marker: str) -> int | None:
        return self.ids.get(marker)

    def __call__(self, text: str) -> str:
        """A Lark sequence writing `text` ('""' for none)."""
        if isinstance(text, Lark):
            return str(text)
        parts, i = [], 0
        while i < len(text):
            hits = [(text.find(m, i), -len(m), m) for m in self.ids if text.find(m, i) >= 0]
            at, _, marker = min(hits) if hits else (len(text), 0, None)
            if at > i:
                parts.append(literal(text[i:at]))
            if marker is None:
                break
            parts.append(f"<[{self.ids[marker]}]>")
            i = at + len(marker)
        return " ".join(parts) or '""'


def literal(text: str) -> str:
    """A Lark string literal of `text`."""
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class ForcedCall:
    """One forced call: its fixed start, and the grammar of the rest (a Lark expression and its rules)."""
    opening: str                    # text the call starts with (the prompt's end)
    rest: str                       # Lark expression of what follows the opening
    rules: tuple[str, ...] = ()
    spell: Spelling = field(default_factory=Spelling)

    def grammar(self, inline: bool = False) -> str:
        """The Lark grammar of the answer: the rest of the call; inline: the opening too (after a
        thought, where the prompt cannot end with it)."""
        lead = f"{self.spell(self.opening)} " if inline and self.opening else ""
        return "%llguidance {}\n" + f"start: {lead}({self.rest})\n" + "".join(r + "\n" for r in self.rules)


def offered(tools: list, names: set[str]) -> list[dict]:
    """The offered tools' function objects, in the request's order."""
    return [t["function"] for t in tools if t["function"]["name"] in names]


@dataclass(frozen=True)
class Joins:
    """How a format writes further calls after the first: `again`, the text that opens one up to its
    name (the opening of a call the model names); `gap`, a Lark expression of what may stand before it
    (blanks); `end`, the text after the last call (a closing bracket or wrapper), written once; `call`,
    a Lark expression of the rest of a further call, where it is not the first one's alternatives and
    tail (Hermes': its whole JSON object), with the `rules` it needs."""
    again: str
    gap: str = ""
    end: str = ""
    call: str = ""
    rules: tuple[str, ...] = ()


def forced_call(tools: list, names: set[str], choice: str, opening, head, tail: str,
                spell: Spelling | None = None, joins: Joins | None = None, parallel: bool = False,
                lead: str = "") -> ForcedCall:
    """A call whose arguments are one JSON object. opening(name): the text before the arguments object
    when the name is forced (then all of it is the opening); head(name): the text from the name on to
    the arguments, when the model chooses the name (the opening is then opening("")); tail: the text
    after the arguments (or a Lark expression); lead: a Lark expression of what may stand before the
    arguments (blanks); joins: how further calls are written (with `parallel`: one or more calls)."""
    spell = spell or Spelling()
    joins = joins or Joins("")
    fns = offered(tools, names)
    rules = list(joins.rules) + [args_rule(i, fn) for i, fn in enumerate(fns)]
    args = [f"{lead} args_{i}" if lead else f"args_{i}" for i in range(len(fns))]
    named = [f"{spell(head(fn['name']))} {a}" for fn, a in zip(fns, args)]     # the model writes the name
    end = f" {spell(tail)}" if tail else ""
    if choice == "function":
        start, first = opening(fns[0]["name"]), args[0]
    else:
        start, first = opening(""), " | ".join(named)
    rest = f"({first}){end}"
    if parallel:
        gap = f"{joins.gap} " if joins.gap else ""
        rest += f' ({gap}{spell(joins.again)} {joins.call or "(" + " | ".join(named) + ")" + end})*'
    if joins.end:
        rest += f" {spell(joins.end)}"
    return ForcedCall(start, rest, tuple(rules), spell)


def args_rule(i: int, fn: dict) -> str:
    """The Lark rule `args_{i}`: a JSON object valid against function `fn`'s parameters."""
    # each tool's parameters a schema resource of its own (their "#/$defs/..." refs resolve there)
    params = {"$id": f"urn:llambda:tool-parameters:{i}", **(fn.get("parameters") or {"type": "object"}),
              "x-guidance": JSON_STYLE}
    return f"args_{i}: %json {json.dumps(params, ensure_ascii=False)}"


def json_call(key: str, before: str, after: str, sep: str):
    """`forced` of a format writing a call as {"name": NAME, key: {...}} between `before` and `after`,
    further calls after `sep`."""
    def forced(tools, names, choice, spell=None, parallel=False):
        return forced_call(tools, names, choice,
                           lambda n: before + ('{"name": ' + json.dumps(n, ensure_ascii=False) + f', "{key}": '
                                               if n else '{"name": "'),
                           lambda n: json.dumps(n, ensure_ascii=False)[1:] + f', "{key}": ', "}", spell,
                           Joins(sep + '{"name": "', end=after), parallel)
    return forced

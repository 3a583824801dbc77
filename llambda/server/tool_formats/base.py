"""What every native tool-call format shares: the interface a format implements, and the pieces of
text reading they have in common (blanks, a marker still arriving, a value typed by its schema; JSON
text is json_text's).

A format (one module each) says where its calls are in the answer:

- `openers`: the markers a call (a "unit": one call, or an array of calls) starts with;
- `bare`: whether an answer may start with a unit without a marker: `bare_start(text)` says whether
  the answer's first text begins one (True), does not (False), or cannot tell yet (None); by default
  a unit starts where the first visible character is `{`;
- `unit_end(body, opener, memo)`: how much of `body` (the text after the marker) the unit takes, its
  closing marker included, or None while it cannot tell yet; a unit that cannot be a call ends where
  that shows (its text then comes back as content); memo: a dict of the unit's own, kept while its
  body grows (json_end's resume points), so a long unit is not re-read at every piece;
- `head(body, opener)`: the unit's first call's name once it is surely complete (the call is then
  announced before its arguments are read), or None;
- `args_at(body, opener)`: where the announced call's JSON arguments object starts in `body`, once
  known (its text then goes out in pieces as it arrives, as the model wrote it), or None (formats
  whose arguments are not JSON text go out whole at the unit's end);
- `parse(body, opener, params)`: the unit's calls as [(name, arguments dict)], or None when it is not
  a call (body may lack its closing marker: the answer ended there); params: each tool's JSON schema;
- `after(rest)`: what follows a unit: ("text", n) (n characters of glue, such as a closing wrapper,
  are dropped), ("unit", n) (another unit begins after n characters), or None while it cannot tell;
- `forced(tools, names, choice, spell, parallel)`: a forced tool_choice written in the format (a
  forcing.ForcedCall, its markers written by `spell`, a forcing.Spelling; `parallel`: one or more
  calls, else exactly one), or None;
- `markers`: the texts of the format's own tags (those a vocabulary may hold as control tokens).

`blocks.BlockParser` runs any format over streamed text (hermes.py, the default, too).
"""
from __future__ import annotations

import json
import re

_BLANKS = re.compile(r"\s*")


class ToolFormat:
    name = "base"
    openers: tuple[str, ...] = ()
    bare = False
    markers: tuple[str, ...] = ()

    def bare_start(self, text: str) -> bool | None:
        head = text.lstrip()
        return head.startswith("{") if head else None

    def unit_end(self, body: str, opener: str, memo: dict) -> int | None:
        raise NotImplementedError

    def head(self, body: str, opener: str) -> str | None:
        return None

    def args_at(self, body: str, opener: str) -> int | None:
        return None

    def parse(self, body: str, opener: str, params: dict) -> list[tuple[str, dict]] | None:
        raise NotImplementedError

    def after(self, rest: str) -> tuple[str, int] | None:
        return ("text", 0)

    def forced(self, tools: list, names: set[str], choice: str, spell=None, parallel: bool = False):
        """A forced call in this format (forcing.ForcedCall: its opening, the grammar of the rest; with
        `parallel`, further calls may follow); None: not written in this format (the Hermes form is
        forced instead)."""
        return None

    def force(self, tools: list, names: set[str], choice: str, tokenizer, parallel: bool = False):
        """`forced`, its markers written as `tokenizer`'s control tokens where they are ones."""
        from .forcing import Spelling
        return self.forced(tools, names, choice, Spelling.of(tokenizer, self.markers), parallel)

    def parser(self, names: set[str], parallel: bool = True, params: dict | None = None, prefix: str = ""):
        from .blocks import BlockParser
        return BlockParser(self, names, parallel, params or {}, prefix)


class ClosedByTag(ToolFormat):
    """A format whose unit ends with a closing tag (`close`)."""
    close = ""

    def unit_end(self, body: str, opener: str, memo: dict) -> int | None:
        at = body.find(self.close, memo.get("find", 0))
        if at < 0:
            memo["find"] = max(len(body) - len(self.close) + 1, 0)     # the tag may begin in what follows
            return None
        return at + len(self.close)

    def inner(self, body: str) -> str:
        """The unit's text without its closing tag (the answer may have ended before it)."""
        return body[:-len(self.close)] if body.endswith(self.close) else body


def first_visible(body: str) -> int | None:
    """Where the first character that is not a blank stands; None while there are only blanks."""
    i = skip_blanks(body)
    return None if i == len(body) else i


def skip_blanks(s: str, i: int = 0) -> int:
    """Where the first character at or after i that is not a blank stands (len(s): none)."""
    return _BLANKS.match(s, i).end()


def prefix_of(text: str, marker: str, at: int = 0) -> bool:
    """`text[at:]` is a proper start of `marker` (the marker may still be arriving)."""
    return len(text) - at < len(marker) and marker.startswith(text[at:])


def typed_value(raw: str, schema) -> object:
    """A parameter's value written as text (GLM's <arg_value>, Qwen3-Coder's <parameter>): kept as
    text where the tool's schema says string (or the text is no JSON), else read as JSON."""
    kinds = value_kinds(schema)
    if "string" in kinds and raw.strip() != "null":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        pass
    low = raw.strip()
    if "boolean" in kinds and low in ("True", "False"):
        return low == "True"
    return raw


def value_kinds(schema) -> list:
    """The JSON types a parameter's schema names ([None] where it names none): a value is kept as
    text where they hold "string" (typed_value; forced calls' grammars write it so, tagged.py)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    return kind if isinstance(kind, list) else [kind]


def param_schema(params: dict, name: str, key: str):
    """The schema of parameter `key` of tool `name`, or None."""
    schema = params.get(name)
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props.get(key) if isinstance(props, dict) else None

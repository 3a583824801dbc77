"""Formats whose arguments are tagged values, not one JSON object: GLM-4.5's
`<arg_key>K</arg_key>\\n<arg_value>V</arg_value>` pairs and Qwen3-Coder's `<parameter=K>\\nV\\n</parameter>`
(`TaggedFormat`: what they share), and the grammar of a forced call in them (`tagged_call`).

As far as that shape allows, the arguments satisfy the tool's parameters schema: the declared
parameter names only, in any order, each at most once, the required ones present (past
MAX_PARAMETRIC parameters, in the schema's order); a value its schema types as a
string is text (its enum's values where it has one; its minLength, maxLength, pattern and format as
llguidance enforces them in JSON, text_value.py, or refused naming the keyword), any other value JSON text valid against its schema (numbers, booleans,
null, objects and arrays) as the formats' parsers read it (base.typed_value). No value holds
the value's closing tag or the call's (nor, in Qwen3-Coder's, `<parameter=` or `</function>`), where the
parsers (ours, and the models' own) would end it: not a text value, nor a string or key at any depth
of a JSON one (tag_free), so the call reads back as written. A marker that is a control
token of the vocabulary is written as that token (forcing.Spelling); a text value is then followed
by the token, else its terminal ends with the tag's text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ...constraints.grammar import JSON_STYLE, ConstraintError
from .base import ClosedByTag, value_kinds
from .forcing import ForcedCall, Spelling, literal, offered
from .hermes import CLOSE, OPEN
from .json_text import call_objects
from .tag_free import tag_free
from .text_value import text_regexes

MAX_PARAMETRIC = 64      # parameters in any order: one bit each of llguidance's 64-bit rule parameter


@dataclass(frozen=True)
class TaggedShape:
    """Where a format's tags stand in a call."""
    call_open: str          # before the name: "<tool_call>"
    name_close: str         # after the name: "" (GLM), ">\n" (Qwen3-Coder)
    key_open: str           # before a parameter's name
    key_close: str          # after it, up to the value
    value_end: str          # between the value and its closing tag: "" (GLM), "\n" (Qwen3-Coder)
    value_close: str        # the value's closing tag
    after_value: str        # after that tag
    call_close: str         # after the last value: "\n</tool_call>" (GLM)
    unit_close: str         # the tag the parser ends the call at ("</tool_call>")
    reserved: tuple[str, ...] = ()      # other texts the model's own parser ends a value at

    @property
    def unspoken(self) -> tuple[str, ...]:
        """The texts no value may hold: the value's closing tag, the call's, the reserved ones."""
        return tuple(dict.fromkeys((self.value_close, self.unit_close, *self.reserved)))

    def opening(self, name: str) -> str:
        return self.call_open + (name + self.name_close if name else "")


class TaggedFormat(ClosedByTag):
    """A call in `<tool_call>` ... `</tool_call>` with tagged values (`shape`, `parse_tagged`); a
    Hermes-style JSON call in the tags (which models trained on both drift into) is read too."""
    shape: TaggedShape
    openers, close = (OPEN,), CLOSE

    def forced(self, tools, names, choice, spell: Spelling | None = None, parallel: bool = False):
        return tagged_call(tools, names, choice, self.shape, spell, parallel)

    def parse(self, body, opener, params):
        body = self.inner(body)
        if body.lstrip().startswith("{"):
            return call_objects(body.strip())
        return self.parse_tagged(body, params)

    def parse_tagged(self, body: str, params: dict) -> list[tuple[str, dict]] | None:
        raise NotImplementedError


def tagged_call(tools: list, names: set[str], choice: str, shape: TaggedShape,
                spell: Spelling | None = None, parallel: bool = False) -> ForcedCall:
    """The forced call ("required": the model picks the name; "function": `names` holds the one);
    parallel: further calls may follow, each in its own call tags (a newline before it)."""
    spell = spell or Spelling()
    fns = offered(tools, names)
    rules, named = [], []
    for i, fn in enumerate(fns):
        params = fn.get("parameters") or {}
        written = []            # (rule, required) of each parameter a call may hold
        for j, (key, schema, required) in enumerate(_parameters(params)):
            try:
                value = _value(f"V_{i}_{j}", schema, params, shape, spell, rules) if writable(key) else None
            except ConstraintError as e:        # a keyword its value cannot be held to: named, not left out
                raise ConstraintError(f"tool {fn['name']!r}, parameter {key!r}: {e}") from None
            if value is None:
                if required:
                    raise ConstraintError(f"tool {fn['name']!r} requires the parameter {key!r}, which a call in "
                                          "this model's format cannot write (a name with blanks at its ends, <, > "
                                          "or a newline; or only values holding the format's closing tags)")
                continue            # an optional one the tags cannot hold: never written
            rule = f"p_{i}_{j}"
            after = f" {spell(shape.after_value)}" if shape.after_value else ""
            rules.append(f"{rule}: {spell(shape.key_open + key + shape.key_close)} {value}{after}")
            written.append((rule, required))
        named.append((spell(fn["name"] + shape.name_close), _any_order(f"args_{i}", written, rules)))
    close = spell(shape.call_close)
    first = named[0][1] if choice == "function" else " | ".join(f"{h} {a}" for h, a in named)
    rest = f"({first}) {close}"
    if parallel:
        rest += f' ("\\n"? {spell(shape.call_open)} ({" | ".join(f"{h} {a}" for h, a in named)}) {close})*'
    start = shape.opening(fns[0]["name"] if choice == "function" else "")
    return ForcedCall(start, rest, tuple(rules), spell)


def _any_order(name: str, written: list[tuple[str, bool]], rules: list) -> str:
    """A Lark expression of the parameters' rules in any order, each at most once, the required ones
    all present (an llguidance parametric rule: bit k says parameter k was written; the required ones
    take the low bits); past MAX_PARAMETRIC parameters, in the schema's order instead."""
    if not written:
        return '""'
    if len(written) > MAX_PARAMETRIC:
        return " ".join(rule if required else f"{rule}?" for rule, required in written)
    written = [w for w in written if w[1]] + [w for w in written if not w[1]]
    n_required = sum(required for _, required in written)
    done = f"is_ones([0:{n_required}])" if n_required else "true"
    alts = [f'""  %if {done}'] + [f"{rule} {name}::set_bit({k})  %if bit_clear({k})"
                                  for k, (rule, _) in enumerate(written)]
    rules.append(f"{name}::_: " + "\n    | ".join(alts))
    return f"{name}::0x0"


def writable(key: str) -> bool:
    """A parameter name the tags hold as it is (the parsers cut a name at `<`, `>` or a newline, and
    strip its blanks)."""
    return bool(key) and key == key.strip() and not any(c in key for c in "<>\n")


def _parameters(params: dict) -> list[tuple[str, object, bool]]:
    """(name, schema, required) of each declared parameter, in the schema's order (required names it
    does not describe after them, any value); a parameter whose schema is false is left out."""
    props = params.get("properties") if isinstance(params, dict) else None
    props = props if isinstance(props, dict) else {}
    required = params.get("required") if isinstance(params, dict) else None
    required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    out = [(k, s, k in required) for k, s in props.items() if s is not False]
    return out + [(k, {}, True) for k in dict.fromkeys(required) if k not in props]


def _value(term: str, schema, params: dict, shape: TaggedShape, spell: Spelling, rules: list) -> str | None:
    """A Lark expression of one value and its closing tag (rules it needs are added to `rules`); None
    where no value can be written (string choices that all hold a closing tag)."""
    close = spell(shape.value_end + shape.value_close)
    schema = schema if isinstance(schema, dict) else {}
    if "string" not in value_kinds(schema):
        # JSON text, no string or key in it holding a tag (tag_free); the parameters' $defs go along
        # (a "#/$defs/..." ref resolves against them)
        defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
        value = tag_free({**schema, **defs}, shape.unspoken)
        if value is False:
            return None
        rules.append(f"{term.lower()}: %json " + json.dumps({**value, "x-guidance": JSON_STYLE}, ensure_ascii=False))
        return f"{term.lower()} {close}"
    regexes = text_regexes(schema)          # its length, pattern, format (a ConstraintError names one it cannot)
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        choices = [c for c in choices if not any(t in c for t in shape.unspoken)]
        if not choices:
            return None
        if not regexes:
            return f'({" | ".join(literal(c) for c in choices)}) {close}'
        regexes.append(_alternatives(*choices))
    # the text: each regex of its schema matched whole, no tag in it
    text = " & ".join(f"/{_slashless(r)}/" for r in regexes or ["(?s:.*)"])
    forbid = _alternatives(*shape.unspoken)
    if spell.token(shape.value_close) is not None:
        # the closing tag is a control token (no text spells it): the text, then the token
        rules.append(f"{term}: (({text}){_end(shape.value_end)}) & ~/(?s:.*)({forbid})(?s:.*)/")
        return f"{term} <[{spell.token(shape.value_close)}]>"
    # the text ends with the closing tag, and holds no tag before it
    tag = _rx(shape.value_close)
    others = _alternatives(*(t for t in shape.unspoken if t != shape.value_close))
    rules.append(f"{term}: (({text}) /{_rx(shape.value_end)}{tag}/) & "
                 f"~/(?s:.*)({tag}(?s:.+)|({others})(?s:.*))/")
    return term


def _slashless(rx: str) -> str:
    """A regex with each `/` not escaped written as its code point (a Lark regex ends at a bare `/`)."""
    out, i = [], 0
    while i < len(rx):
        step = 2 if rx[i] == "\\" else 1
        out.append("\\x{2F}" if rx[i] == "/" else rx[i:i + step])
        i += step
    return "".join(out)


def _end(text: str) -> str:
    """A terminal's tail writing `text` ('' for none)."""
    return f" /{_rx(text)}/" if text else ""


def _alternatives(*texts: str) -> str:
    return "|".join(_rx(t) for t in dict.fromkeys(texts))


def _rx(text: str) -> str:
    """`text` as a regex matching it literally (every character that is not a letter or digit as its
    code point: nothing in it is then an operator, a word boundary or the grammar's `/`)."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)

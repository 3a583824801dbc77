"""JSON values that never spell a format's tags: a GLM-4.5 or Qwen3-Coder parameter typed as an object,
an array (any non-string type) is JSON text between tags, and the parsers (ours, as the models' own:
vLLM's and llama.cpp's read a value up to the first closing tag, with no escape) would end it at a
closing tag inside one of its strings or keys. llguidance writes JSON strings with `<` and `/` as
themselves (no `\\/` or `\\u003c` escape), so a string holds a tag's text exactly when the string's
value does: `tag_free(schema, words)` is the schema less the values whose strings or keys hold any of
`words` (a pattern on every string it allows, one $defs entry each refers to, through nesting, $defs and
alternatives; enum and const values holding one are left out). A key the schema leaves free (not one of
its object's declared properties) holds no `<` at all (`other_keys`: the tags' first character), a
declared one is taken as declared unless it holds a tag.

`avoiding(words)` is that pattern: an anchored regex without lookarounds (llguidance has none) of the
strings in which no word occurs, for words that all start with one character found nowhere else in
them (the formats' tags: `<` then no other `<`), built from the words' trie.
"""
from __future__ import annotations

import copy
import json

from ...constraints.grammar import ConstraintError

ANY = "llambda-tag-free-any"          # the $defs entry of any value with no such string
ANY_REF = {"$ref": f"#/$defs/{ANY}"}
TEXT = "llambda-tag-free-string"      # ... and of the pattern (once: each string refers to it)
TEXT_REF = {"$ref": f"#/$defs/{TEXT}"}
_COMBINED = ("anyOf", "oneOf", "allOf", "$ref", "enum", "const")
_TYPES = ("null", "boolean", "number", "integer", "string", "array", "object")


def avoiding(words) -> str:
    """An anchored regex of the strings holding none of `words` (see the module's docstring)."""
    words = sorted(set(words))
    words = [w for w in words if not any(v != w and w.startswith(v) for v in words)]   # avoiding v avoids w
    lead = words[0][0]
    if any(not w or w[0] != lead or lead in w[1:] for w in words):
        raise ValueError(f"words must all start with one character found nowhere else in them: {words}")
    trie: dict = {}
    for w in words:
        node = trie
        for c in w[1:-1]:
            node = node.setdefault(c, {})
        node.setdefault(w[-1], None)       # None: the word ends here (never entered)

    def walk(node, at_node) -> str:
        """Alternatives from a trie node on: at_node(node) there, or a child's character then its walk."""
        alts = [at_node(node)] + [_char(c) + walk(child, at_node) for c, child in node.items() if child is not None]
        return "(?:" + "|".join(alts) + ")"

    back = walk(trie, lambda node: _char(lead))                                  # back to having read `lead`
    escape = walk(trie, lambda node: "[^" + "".join(_char(c, True) for c in [lead, *node]) + "]")
    tail = walk(trie, lambda node: "")                                           # the text ends in a start of a word
    first = "[^" + _char(lead, True) + "]"
    return f"^(?:{first}|{_char(lead)}{back}*{escape})*(?:{_char(lead)}{back}*{tail})?$"


# ASCII punctuation that no regex syntax here (llguidance's, ECMAScript's, Python's) reads as special, in a
# class or out: written as itself (a tag's `<`, `/`, `_`, `=`, `>` as \u003c and the like had made the pattern
# 2.5 times as long, and it stands in every object's patternProperties: 20 object parameters in 3 tools had
# passed the grammar's size limit)
_LITERAL = frozenset("<>/_=:;,@!")


def _char(c: str, in_class: bool = False) -> str:
    if c.isascii() and (c.isalnum() or c in _LITERAL):
        return c
    return f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c if in_class else f"[{c}]"


def tag_free(schema, words) -> object:
    """`schema` (a parameter's, its $defs merged in) less the values whose strings or keys hold any of
    `words`; false where no value is left. A ConstraintError where that cannot be written as a schema
    llguidance takes (patternProperties: its keys would need two patterns at once)."""
    safe = avoiding(words)
    out = _walk(copy.deepcopy(schema), safe, words)
    if isinstance(out, dict) and any(name in json.dumps(out) for name in (ANY, TEXT)):     # where referred to
        out.setdefault("$defs", {})[TEXT] = {"pattern": safe}
        out["$defs"][ANY] = {"anyOf": [
            {"type": ["null", "boolean", "number"]}, {"type": "string", "allOf": [TEXT_REF]},
            {"type": "array", "items": ANY_REF},
            {"type": "object", "patternProperties": {other_keys((), min(words)[0]): ANY_REF},
             "additionalProperties": False}]}
    return out


def _holds(value, words) -> bool:
    text = json.dumps(value, ensure_ascii=False)
    return any(w in text or json.dumps(w, ensure_ascii=False)[1:-1] in text for w in words)


def _walk(node, safe: str, words):
    if node is True or node == {}:
        return dict(ANY_REF)
    if not isinstance(node, dict):
        return node                           # false, or no schema (llguidance says what is wrong)
    for key in ("$defs", "definitions", "properties"):
        if isinstance(node.get(key), dict):
            node[key] = {k: (False if key == "properties" and any(w in k for w in words) else _walk(v, safe, words))
                         for k, v in node[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [_walk(v, safe, words) for v in node[key]]
    for key in ("items", "additionalItems", "additionalProperties"):
        if isinstance(node.get(key), list):          # items as a list (a tuple, before prefixItems)
            node[key] = [_walk(v, safe, words) for v in node[key]]
        elif key in node and node[key] is not False:
            node[key] = _walk(node[key], safe, words)
    if isinstance(node.get("enum"), list):
        node["enum"] = [v for v in node["enum"] if not _holds(v, words)]
        if not node["enum"]:
            return False
    if "const" in node and _holds(node["const"], words):
        return False
    kinds = node.get("type", None)
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else None
    if kinds is None and any(k in node for k in _COMBINED):
        return node                           # its alternatives, $ref target or values say what it is
    kinds = set(kinds or _TYPES)
    if "string" in kinds:
        node["allOf"] = node.get("allOf", []) + [dict(TEXT_REF)]
    if "array" in kinds and "items" not in node:
        node["items"] = dict(ANY_REF)
    if "object" in kinds and node.get("additionalProperties", True) is not False:
        if node.get("patternProperties"):
            raise ConstraintError("a parameter written as JSON in this model's tags cannot use 'patternProperties' "
                                  "with keys left free (they could spell the format's closing tag); give "
                                  "\"additionalProperties\": false")
        names = [k for k in node.get("properties") or {} if isinstance(k, str)]
        node["patternProperties"] = {other_keys(names, min(words)[0]): node.get("additionalProperties", dict(ANY_REF))}
        node["additionalProperties"] = False
    return node


def other_keys(names, lead: str) -> str:
    """An anchored regex of the keys that are none of `names` and hold no `lead` (the tags' first character):
    an object's free keys beside its declared ones. A free key that could be a declared one makes llguidance
    intersect the two schemas, and that of two objects each with free keys recurses until it refuses the schema
    ("Schema intersection stack level exceeded": any object parameter holding an object had been refused). No
    `lead` at all keeps the regex a walk of the names' trie (a tag cannot start in one part and end in the next)
    and short (the tags' pattern in every object had put 20 object parameters in 3 tools past the grammar's
    size limit)."""
    trie: dict = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[None] = {}         # a name ends here

    def walk(node) -> str:
        alts = [] if None in node else [""]                      # ending here: not a name
        alts.append("[^" + "".join(_char(c, True) for c in dict.fromkeys([lead, *(c for c in node if c is not None)]))
                    + "]" + rest)
        alts += [_char(c) + walk(child) for c, child in node.items() if c is not None and c != lead]
        return "(?:" + "|".join(alts) + ")"

    rest = "[^" + _char(lead, True) + "]*"
    return "^" + walk(trie) + "$"

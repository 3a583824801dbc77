"""A forced tool_choice ("required", a named function) in a format's own syntax: the opening the
prompt ends with (prefilled: its control tokens tokenized as such) and the grammar (llguidance's
Lark) of the rest: the tool's name where the model chooses it, then its arguments, valid against
the tool's parameters, then the format's closing text. One call: the grammar ends there, so the
answer does too."""
from __future__ import annotations

import json

from ...constraints.grammar import JSON_STYLE


def forced_call(tools: list, names: set[str], choice: str, opening, head, tail: str) -> tuple[str, str]:
    """(prefix, grammar) of one call. opening(name): the text before the arguments object when the
    name is forced (then all of it is the prefix); head(name): the text from the name on to the
    arguments, when the model chooses the name (the prefix is then opening's part before the name)."""
    offered = [t["function"] for t in tools if t["function"]["name"] in names]
    if choice == "function":
        prefix, heads = opening(offered[0]["name"]), [""]
    else:
        prefix, heads = opening(""), [head(fn["name"]) for fn in offered]
    rules, alts = [], []
    for i, (fn, h) in enumerate(zip(offered, heads)):
        # each tool's parameters a schema resource of its own (their "#/$defs/..." refs resolve there)
        params = {"$id": f"urn:llambda:tool-parameters:{i}", **(fn.get("parameters") or {"type": "object"}),
                  "x-guidance": JSON_STYLE}
        rules.append(f"args_{i}: %json {json.dumps(params, ensure_ascii=False)}")
        alts.append(f"{json.dumps(h, ensure_ascii=False)} args_{i}" if h else f"args_{i}")
    end = f" {json.dumps(tail, ensure_ascii=False)}" if tail else ""
    return prefix, "%llguidance {}\n" + f'start: ({" | ".join(alts)}){end}\n' + "\n".join(rules) + "\n"


def json_call(key: str, before: str, after: str):
    """`forced` of a format writing a call as {"name": NAME, key: {...}} between `before` and `after`."""
    def forced(tools, names, choice):
        return forced_call(tools, names, choice,
                           lambda n: before + ('{"name": ' + json.dumps(n, ensure_ascii=False) + f', "{key}": '
                                               if n else '{"name": "'),
                           lambda n: json.dumps(n, ensure_ascii=False)[1:] + f', "{key}": ', "}" + after)
    return forced

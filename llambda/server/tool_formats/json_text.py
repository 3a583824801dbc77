"""JSON text as the JSON-based formats write calls: where a value ends, a call object's name and
where its arguments start (while it streams), a call object or an array of them read whole."""
from __future__ import annotations

import json
import re

_CALL_HEAD = re.compile(r'\s*\[?\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,')
_CALL_ARGS = re.compile(r'\s*"(?:arguments|parameters)"\s*:\s*\{')


def json_end(s: str, i: int, memo: dict | None = None) -> int | None:
    """Where the JSON object or array starting at s[i] ends (just past its closing bracket), or None
    when the text stops before it balances. Brackets inside strings do not count. memo: where an
    earlier call on a shorter start of the same text stopped, so a growing text is scanned once."""
    start, depth, in_str, esc = memo.get(i, (i, 0, False, False)) if memo is not None else (i, 0, False, False)
    for k in range(start, len(s)):
        ch = s[k]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return k + 1
    if memo is not None:
        memo[i] = (len(s), depth, in_str, esc)
    return None


def json_call_name(body: str) -> str | None:
    """The name of a JSON call object (or of an array's first) the body starts with, once complete."""
    m = _CALL_HEAD.match(body)
    return m.group(1) if m else None


def json_call_args(body: str) -> int | None:
    """Where that call's arguments object starts, when "arguments" (or "parameters") follows the name."""
    m = _CALL_HEAD.match(body)
    a = _CALL_ARGS.match(body, m.end()) if m else None
    return a.end() - 1 if a else None


def loaded(value):
    """The value a JSON text stands for, where `value` is a string that is one; else `value` itself
    (call arguments come as an object or as its JSON text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


def call_object(obj) -> tuple[str, dict] | None:
    """(name, arguments) of a JSON call object {"name", "arguments" or "parameters"}; arguments may
    be given as a JSON string of an object. None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = loaded(obj.get("arguments", obj.get("parameters", {})))
    return (obj["name"], args) if isinstance(args, dict) else None


def call_objects(text: str) -> list[tuple[str, dict]] | None:
    """The calls of a JSON text holding one call object or an array of them."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_object(v) for v in items]
    return calls if calls and None not in calls else None

"""A string parameter written as text between tags (GLM-4.5's `<arg_value>`, Qwen3-Coder's `<parameter=K>`):
the regexes its text must match, from its schema, as llguidance enforces the same keywords on a JSON
string (its `format`s and `pattern` alike), or a ConstraintError naming the keyword where a text value
cannot be held to it (never silently left out).

- minLength/maxLength: a count of characters, up to MAX_COUNTED (past it llguidance's compile runs out
  of fuel on the count meeting the tags' exclusion: refused);
- pattern: an ECMAScript regex (llguidance's regex_to_lark reads it), searched for as JSON schema says
  (not anchored unless it says `^`/`$`, per top-level alternative; an anchor deeper in is refused);
- format: date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid (those OpenAI's strict
  mode takes), written here from their RFCs (3339, 5321, 1123, 4291, 4122) as llguidance reads them:
  a date's day up to 29 in any February, a time with its offset, an email's dot-atom local part and a
  domain or [IPv4], an IPv6 address in hex groups only; any other format (uri, one llguidance knows, or
  one no one does) is refused;
- anything else llguidance would refuse in a JSON string is refused with its words (validated by
  llguidance itself), and anyOf/oneOf/allOf/$ref, which a text value does not follow, are refused.
"""
from __future__ import annotations

import json

from ...constraints.grammar import ConstraintError

MAX_COUNTED = 2000       # a longer minLength/maxLength is refused (a counted regex of that size is costly)
_UNFOLLOWED = ("anyOf", "oneOf", "allOf", "$ref")


def _days(n: int) -> str:
    """Days 01..n of a month (n of 29, 30, 31)."""
    return {29: "(?:0[1-9]|1[0-9]|2[0-9])", 30: "(?:0[1-9]|[12][0-9]|30)", 31: "(?:0[1-9]|[12][0-9]|3[01])"}[n]


_MONTHS = {31: ("01", "03", "05", "07", "08", "10", "12"), 30: ("04", "06", "09", "11"), 29: ("02",)}
DATE = "[0-9]{4}-(?:" + "|".join(f"(?:{'|'.join(ms)})-{_days(n)}" for n, ms in _MONTHS.items()) + ")"
_OFFSET = "(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
TIME = f"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?{_OFFSET}"


def _duration() -> str:
    """RFC 3339's duration (its appendix A): P then date units (each optionally followed by the next
    smaller), a T and time units likewise, or weeks alone."""
    def chain(units):      # a unit, then optionally the chain of the smaller ones after it
        if not units:
            return ""
        rest = chain(units[1:])
        return f"[0-9]+{units[0]}" + (f"(?:{rest})?" if rest else "")

    def any_start(units):
        return "(?:" + "|".join(chain(units[k:]) for k in range(len(units))) + ")"
    time = "T" + any_start("HMS")
    return f"P(?:{any_start('YMD')}(?:{time})?|{time}|[0-9]+W)"


_LABEL = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"
_ATEXT = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]"
_SUBDOMAIN = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
EMAIL = f"{_ATEXT}+(?:\\.{_ATEXT}+)*@(?:{_SUBDOMAIN}(?:\\.{_SUBDOMAIN})*|\\[{IPV4}\\])"


def _ipv6() -> str:
    """RFC 4291's text forms: eight groups, or `::` standing for one or more zero groups, with at most
    seven groups written around it (the last two groups as hex, not a dotted IPv4)."""
    h = "[0-9a-fA-F]{1,4}"
    forms = [f"(?:{h}:){{7}}{h}"]
    for after in range(0, 8):            # groups written after the ::
        tail = "" if after == 0 else f"(?:{h}:){{{after - 1}}}{h}" if after > 1 else h
        before = 7 - after               # at most this many before it
        head = "" if before == 0 else f"(?:(?:{h}:){{0,{before - 1}}}{h})?"
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(f"(?:{f})" for f in forms) + ")"


FORMATS = {
    "date": DATE, "time": TIME, "date-time": f"{DATE}[tT]{TIME}", "duration": _duration(), "email": EMAIL,
    "hostname": f"{_LABEL}(?:\\.{_LABEL})*", "ipv4": IPV4, "ipv6": _ipv6(),
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}


def text_regexes(schema: dict) -> list[str]:
    """The regexes (llguidance's syntax, each matched whole) a text value of `schema` must all match:
    its length, pattern and format; a ConstraintError naming the keyword it cannot be held to."""
    for key in _UNFOLLOWED:
        if key in schema:
            raise ConstraintError(f"a string written as text in this model's tags cannot follow '{key}'")
    _llguidance_takes(schema)
    out = []
    count = _count(schema)
    if count:
        out.append(f"(?s:.){count}")
    if "pattern" in schema:
        out.append(search(schema["pattern"]))
    if "format" in schema:
        fmt = schema["format"]
        if fmt not in FORMATS:
            raise ConstraintError(f"'format' {json.dumps(fmt)} cannot be enforced on a string written as text "
                                  f"in this model's tags (these can: {', '.join(FORMATS)})")
        out.append(FORMATS[fmt])
    return out


def _llguidance_takes(schema: dict) -> None:
    """What llguidance refuses in a JSON string (an unknown format, a lookaround, an unimplemented keyword)
    is refused here too, in its words."""
    import llguidance
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(schema))
    except ValueError as e:
        error = str(e)
    if error:
        raise ConstraintError(" ".join(error.split()))


def _count(schema: dict) -> str:
    """The regex count of a string's characters from its minLength/maxLength ("" for any)."""
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    for key, n in (("minLength", lo), ("maxLength", hi)):
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
            raise ConstraintError(f"'{key}' must be a non-negative integer")
        if n is not None and n > MAX_COUNTED:
            raise ConstraintError(f"'{key}' past {MAX_COUNTED} cannot be enforced on a string written as "
                                  "text in this model's tags")
    lo = lo or 0
    if hi is not None:
        return f"{{{lo},{hi}}}"
    return f"{{{lo},}}" if lo else ""


def search(pattern) -> str:
    """JSON schema's `pattern` (an ECMAScript regex, found anywhere in the string unless anchored) as a
    regex matched whole: each top-level alternative anchored at a `^`/`$` of its own end, else open there."""
    import llguidance
    if not isinstance(pattern, str):
        raise ConstraintError("'pattern' must be a string")
    try:
        rx = llguidance.regex_to_lark(pattern, "dw")
    except ValueError as e:
        raise ConstraintError(f"'pattern' {json.dumps(pattern)}: {e}") from None
    branches = []
    for branch in _top_level(rx):
        start = branch.startswith("^")
        end = branch.endswith("$") and not _escaped(branch, len(branch) - 1)
        inner = branch[1 if start else 0:len(branch) - 1 if end else len(branch)]
        if _has_anchor(inner):
            raise ConstraintError(f"'pattern' {json.dumps(pattern)}: an anchor (^, $) inside a group or "
                                  "mid-way cannot be enforced on a string written as text in this model's tags")
        branches.append(("" if start else "(?s:.*)") + f"(?:{inner})" + ("" if end else "(?s:.*)"))
    return "|".join(f"(?:{b})" for b in branches)


def _scan(rx: str):
    """(index, character, depth, in a class) of each character of a regex that is not escaped."""
    depth, klass, i = 0, False, 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            i += 2
            continue
        if klass:
            if c == "]":
                klass = False
        elif c == "[":
            klass = True
            if rx[i + 1:i + 2] == "^":
                i += 1
            if rx[i + 1:i + 2] == "]":          # a leading ] is a character of the class
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        else:
            yield i, c, depth
        i += 1


def _top_level(rx: str) -> list[str]:
    cuts = [i for i, c, depth in _scan(rx) if c == "|" and depth == 0]
    return [rx[a + 1:b] for a, b in zip([-1] + cuts, cuts + [len(rx)])]


def _escaped(rx: str, at: int) -> bool:
    return all(i != at for i, _, _ in _scan(rx))


def _has_anchor(rx: str) -> bool:
    return any(c in "^$" for _, c, _ in _scan(rx))

"""GLM-4.5/4.6's calls: `<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs
(blank lines between), then `</tool_call>`. A value is text where the tool's schema says string,
else JSON when it parses (numbers, booleans, objects), else text. A JSON call object in the tags
(the Hermes form, which models trained on both drift into) is read too."""
from __future__ import annotations

import re

from .base import ClosedByTag, param_schema, typed_value
from .json_text import call_objects

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"\s*([^\s<]+)[ \t]*(?:\n|<arg_key>|</tool_call>)")
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


class GLMFormat(ClosedByTag):
    name = "glm"
    openers, close = (OPEN,), CLOSE

    def head(self, body, opener):
        m = _NAME.match(body)
        return m.group(1) if m else None

    def parse(self, body, opener, params):
        body = self.inner(body)
        if body.lstrip().startswith("{"):
            return call_objects(body.strip())      # a Hermes-style JSON call in the tags: read too
        m = re.match(r"\s*([^\s<]+)", body)
        if m is None:
            return None
        name, at, args = m.group(1), m.end(), {}
        while (p := _PAIR.match(body, at)) is not None:
            key = p.group(1).strip()
            args[key] = typed_value(p.group(2), param_schema(params, name, key))
            at = p.end()
        if body[at:].strip():
            return None
        return [(name, args)]

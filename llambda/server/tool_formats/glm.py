"""GLM-4.5/4.6's calls: `<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs
(blank lines between), then `</tool_call>`. A value is text where the tool's schema says string,
else JSON when it parses (numbers, booleans, objects), else text. A JSON call object in the tags
(the Hermes form, which models trained on both drift into) is read too."""
from __future__ import annotations

import re

from .base import param_schema, typed_value
from .tagged import CLOSE, OPEN, TaggedFormat, TaggedShape
_NAME = re.compile(r"\s*([^\s<]+)[ \t]*(?:\n|<arg_key>|</tool_call>)")
SHAPE = TaggedShape(call_open=OPEN, name_close="", key_open="\n<arg_key>", key_close="</arg_key>\n<arg_value>",
                    value_end="", value_close="</arg_value>", after_value="", call_close="\n" + CLOSE,
                    unit_close=CLOSE)
_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


class GLMFormat(TaggedFormat):
    name = "glm"
    shape = SHAPE
    markers = (OPEN, CLOSE, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

    def head(self, body, opener):
        m = _NAME.match(body)
        return m.group(1) if m else None

    def parse_tagged(self, body, params):
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

"""Qwen3-Coder's calls (XML-like):

    <tool_call>
    <function=NAME>
    <parameter=K>
    V
    </parameter>
    </function>
    </tool_call>

A value is the text between its tags less the one newline after the opening tag and the one before
the closing tag, typed by the tool's schema: text where it says string, else JSON when it parses.
A JSON call object in the tags (the Hermes form) is read too."""
from __future__ import annotations

import re

from .base import param_schema, typed_value
from .tagged import CLOSE, OPEN, TaggedFormat, TaggedShape
SHAPE = TaggedShape(call_open=OPEN + "\n<function=", name_close=">\n", key_open="<parameter=", key_close=">\n",
                    value_end="\n", value_close="</parameter>", after_value="\n",
                    call_close="</function>\n" + CLOSE, unit_close=CLOSE,
                    reserved=("<parameter=", "</function>"))      # where vLLM's parser also ends a value
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_END = re.compile(r"\s*(?:</function>\s*)?$")


class Qwen3CoderFormat(TaggedFormat):
    name = "qwen3_coder"
    shape = SHAPE
    markers = (OPEN, CLOSE)

    def head(self, body, opener):
        m = _FUNCTION.match(body)
        return m.group(1).strip() if m else None

    def parse_tagged(self, body, params):
        m = _FUNCTION.match(body)
        if m is None:
            return None
        name, at, args = m.group(1).strip(), m.end(), {}
        while (p := _PARAM.match(body, at)) is not None:
            raw = p.group(2)
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            key = p.group(1).strip()
            args[key] = typed_value(raw, param_schema(params, name, key))
            at = p.end()
        if _END.match(body, at) is None:
            return None
        return [(name, args)]

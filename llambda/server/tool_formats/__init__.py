"""Tool calls in each model family's own syntax, chosen by what the model's chat template contains.

A template that renders tools also teaches the model how to call them; as llama.cpp does, the
format is told from the template's source (`detect`): GLM-4.5's `<arg_key>`, Qwen3-Coder's
`<function=`/`<parameter=`, DeepSeek's `<｜tool▁calls▁begin｜>`, Mistral's `[TOOL_CALLS]`, Granite's
and Phi-4-mini's `<|tool_call|>`/`<|tool|>`, Llama 3.x's `ipython` role or `<|python_tag|>`. None
(no known marker, or Qwen/Hermes' `<tool_call>` with JSON) leaves the answer to the Hermes form
(hermes.py, FORMATS["hermes"]), the default. Each format is one module (base.ToolFormat's interface),
read by blocks.BlockParser (ToolSetup.parser()/extract()).
"""
from __future__ import annotations

import re

from .base import ToolFormat
from .deepseek import DeepSeekFormat
from .glm import GLMFormat
from .hermes import HermesFormat
from .llama3 import Llama3Format
from .mistral import MistralFormat
from .qwen3_coder import Qwen3CoderFormat
from .tool_call_token import ToolCallTokenFormat

FORMATS = {f.name: f for f in (GLMFormat(), Qwen3CoderFormat(), DeepSeekFormat(), MistralFormat(),
                               ToolCallTokenFormat(), Llama3Format(), HermesFormat())}


def detect(template: str) -> ToolFormat | None:
    """The native call format a chat template's source asks for; None: the Hermes parser's."""
    if not template or "tool" not in template:
        return None
    if "<arg_key>" in template:
        return FORMATS["glm"]
    if "<function=" in template and "<parameter=" in template:
        return FORMATS["qwen3_coder"]
    if "tool▁calls▁begin" in template or "tool▁call▁begin" in template:
        # V3.1 writes the arguments right after the separator, V3/R1 the type, then the name and a fence
        return DeepSeekFormat(v31=re.search(r"tool▁sep｜>'\s*\+\s*\w+\['function'\]\['arguments'\]", template)
                              is not None)
    if "[TOOL_CALLS]" in template:
        return MistralFormat(tagged="[ARGS]" in template)
    if "<|tool_call|>" in template or "<|tool|>" in template:
        return FORMATS["tool_call_token"]
    if "<tool_call>" in template:
        return None
    if "<|python_tag|>" in template or "<|start_header_id|>ipython" in template:
        return FORMATS["llama3"]
    return None

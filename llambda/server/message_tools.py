"""Tools for templates that read them from a message rather than from the `tools` variable.

Phi-4-mini's chat template writes a system turn's `message['tools']` (a JSON text of the functions,
between `<|tool|>` and `<|/tool|>`) and never reads `tools`: offered tools passed the usual way never
reach its prompt. Such a template is told from its source (`reads_message_tools`), as tool_formats tells
the call formats; `with_message_tools` then puts the request's tools on the system message, as the JSON
text of their function definitions (the shape Phi-4-mini's model card gives), adding an empty system
message first when the conversation has none.
"""
from __future__ import annotations

import json
import re

# the names a template gives a message: `message`, and its loops' (`{% for m in messages %}`)
_LOOP = re.compile(r"\bfor\s+(\w+)\s+in\s+\w*messages\b")


def reads_message_tools(template: str) -> bool:
    """Whether a chat template's source reads the tools from a message: `message['tools']`,
    `message["tools"]` or `message.tools` (not `message.tool_calls`), under any name its loops give one."""
    if not template or "tools" not in template:
        return False
    names = {"message"} | set(_LOOP.findall(template))
    pattern = rf"""\b(?:{'|'.join(map(re.escape, sorted(names)))})\s*(?:\[\s*['"]tools['"]\s*\]|\.tools\b)"""
    return re.search(pattern, template) is not None


def tools_text(tools: list) -> str:
    """The offered (chat-completions) tools as the JSON text such a template expects: their functions."""
    return json.dumps([t["function"] for t in tools], ensure_ascii=False)


def with_message_tools(messages: list, tools: list) -> list:
    """`messages` with the tools on the first system message (a copy; the request's own `tools` there,
    if any, replaced by the offered ones), or on a new empty system message put first."""
    text = tools_text(tools)
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "system":
            return messages[:i] + [{**m, "tools": text}] + messages[i + 1:]
    return [{"role": "system", "content": "", "tools": text}] + list(messages)

"""Tool calls in model output (Qwen/Hermes style), whole and while streaming.

The documented form is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(chat.parse_tool_calls reads it). Small Qwen models often drop the tags and answer
with the bare JSON object, sometimes in a ``` fence; like llama.cpp we take that
as a call too, but only when the whole answer is such an object and it names one
of the tools the request offered, so ordinary JSON answers stay content.
"""
from __future__ import annotations

import json
import re
import secrets

from ..chat import parse_tool_calls

OPEN_TAG = "<tool_call>"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _bare_call(text: str, names: set[str]) -> dict | None:
    body = text.strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1)
    if not body.startswith("{"):
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": obj["name"], "arguments": args}}


def tool_names(tools: list | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


def extract_tool_calls(text: str, names: set[str]) -> tuple[str, list[dict]]:
    """(content, tool calls) of a finished answer."""
    content, calls = parse_tool_calls(text)
    if calls:
        return content, calls
    call = _bare_call(text, names)
    if call is not None:
        return "", [call]
    return text, []


class ToolCallFilter:
    """Streams content but holds back what may be a tool call; `finish()` parses it.

    Held back: everything from `<tool_call>` on, and a whole answer that starts
    like a bare JSON object or a code fence (decided at its first visible character).
    """

    def __init__(self, names: set[str]):
        self.names = names
        self.mode = "start"      # start | text | held
        self.held = ""           # text not yet emitted

    def feed(self, text: str) -> str:
        self.held += text
        if self.mode == "start":
            head = self.held.lstrip()
            if not head or "```".startswith(head[:3]) and len(head) < 3:
                return ""                       # undecided: whitespace or a partial fence
            self.mode = "held" if head[0] == "{" or head.startswith("```") else "text"
        if self.mode == "held":
            return ""
        at = self.held.find(OPEN_TAG)
        if at >= 0:
            out, self.held, self.mode = self.held[:at], self.held[at:], "held"
            return out
        keep = 0
        for k in range(min(len(OPEN_TAG) - 1, len(self.held)), 0, -1):
            if self.held.endswith(OPEN_TAG[:k]):
                keep = k
                break
        out = self.held[:len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to emit, tool calls)."""
        held, self.held = self.held, ""
        if self.mode == "held":
            return extract_tool_calls(held, self.names)
        return held, []

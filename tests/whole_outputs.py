"""A finished output read whole by the server's streaming parsers: what the tests compare the parsers fed
in pieces against. The server itself never reads an output whole (it parses once, as the text streams)."""
from __future__ import annotations

from llambda.server.harmony import HarmonyParser
from llambda.server.think import ThinkParser


def split_thinking(text: str, opened: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a finished <think> output; opened: the prompt opened the thought."""
    p = ThinkParser(None, opened)
    content, _ = p.feed(text)
    rest, _ = p.finish()
    return p.take_reasoning(), content + rest


def extract_harmony(text: str, names: set[str] | None = None,
                    parallel: bool = True) -> tuple[str, str, list[dict]]:
    """(content, reasoning, tool calls) of a finished harmony answer; a call cut by max_tokens keeps its
    arguments as far as they got."""
    p = HarmonyParser(names, parallel)
    content, _ = p.feed(text)
    rest, _ = p.finish()
    return content + rest, p.take_reasoning(), p.finished_calls()

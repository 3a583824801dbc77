"""How many of a choice's generated tokens went into its reasoning: usage's `reasoning_tokens`
(chat completions' `completion_tokens_details`, /v1/responses' `output_tokens_details`).

The thought (`<think>...</think>`) or harmony's analysis messages are found in the text as it is
generated, by a parser of their own fed one token's text at a time; at the end, a token counts when
any of its text lies in them, tags and headers included, so a token that straddles the edge
counts as reasoning. The answer is the same however the client reads it (streamed or whole), since
it depends only on the tokens.
"""
from __future__ import annotations

from .harmony import HarmonyParser
from .think import ThinkParser
from .tools import ToolSetup


class ReasoningTokens:
    def __init__(self, parser):
        self.parser = parser           # a ThinkParser or HarmonyParser that sees only this choice's tokens
        self.ends: list[int] = []      # each token's end, as a character offset into the generated text

    def add(self, text: str, token: bool = True) -> None:
        """A generated token's text; token=False: text an end of generation let out (held back for
        a stop string or an unfinished character), the last token's."""
        self.parser.feed(text)
        self.parser.take_reasoning()   # the text is not kept: only where it lies
        if token:
            self.ends.append(self.parser.seen)
        elif self.ends:
            self.ends[-1] = self.parser.seen

    def count(self) -> int:
        """The tokens so far that overlap the reasoning (a token with no text: one inside it)."""
        spans = self.parser.reasoning_spans()
        n, start = 0, 0
        for end in self.ends:
            if any(start < e and (end > s if end > start else start >= s) for s, e in spans):
                n += 1
            start = end
        return n


def reasoning_tokens(tools: ToolSetup | None) -> ReasoningTokens | None:
    """A counter for an answer read as harmony's channels or with a `<think>` thought; None otherwise."""
    if tools is not None and tools.harmony:
        return ReasoningTokens(HarmonyParser())
    if tools is not None and tools.thinks:
        return ReasoningTokens(ThinkParser(None, tools.thought_open))
    return None

"""How many of a choice's generated tokens went into its reasoning: usage's `reasoning_tokens`
(chat completions' `completion_tokens_details`, /v1/responses' `output_tokens_details`).

Only where each token's text ends is recorded here; where the thought (`<think>...</think>`) or
harmony's analysis messages lie comes from the parser that already splits the answer
(`reasoning_spans()`), so the count is not a second parse and cannot disagree with the split. A
token counts when any of its text lies in those spans, tags and headers included, so a token that
straddles the edge counts as reasoning. The parsers' spans do not depend on how the text was cut
into pieces, so the count is the same however the client reads the answer (streamed or whole).
The same token ends pick the tokens of the answer's text for /v1/responses' logprobs (text_logprobs.py).
"""
from __future__ import annotations

from bisect import bisect_right

from .tools import ToolSetup


class TokenEnds:
    """Each generated token's end, as a character offset into the generated text."""

    def __init__(self):
        self.ends: list[int] = []
        self.chars = 0                 # characters of generated text so far

    def add(self, text: str, token: bool = True) -> None:
        """A generated token's text; token=False: text an end of generation let out (held back for
        a stop string or an unfinished character), the last token's."""
        self.chars += len(text)
        if token:
            self.ends.append(self.chars)
        elif self.ends:
            self.ends[-1] = self.chars

    def within(self, spans: list[tuple[int, int]]) -> int:
        """The tokens that overlap any of `spans` (sorted, disjoint (start, end) character ranges)."""
        return sum(self.inside(spans))

    def inside(self, spans: list[tuple[int, int]], first: int = 0, stop: int | None = None) -> list[bool]:
        """Whether each of the tokens first..stop overlaps any of `spans`; a token with no text is
        inside when it stands inside one. One pass over both lists."""
        out, j = [], 0
        start = self.ends[first - 1] if first else 0
        for end in self.ends[first:stop]:
            while j < len(spans) and spans[j][1] <= start:
                j += 1                 # spans wholly before this token cannot hold it or any later one
            s = spans[j][0] if j < len(spans) else None
            out.append(s is not None and ((end > s) if end > start else (start >= s)))
            start = end
        return out

    def settled(self, chars: int) -> int:
        """How many tokens end within the first `chars` characters."""
        return bisect_right(self.ends, chars)


def counts_reasoning(tools: ToolSetup | None) -> bool:
    """The answer is read as harmony's channels or with a `<think>` thought: it has reasoning to count."""
    return tools is not None and (tools.harmony or tools.thinks)

"""The logprobs of an answer's text, as /v1/responses' output_text parts carry them.

They are chat completions' own per-token entries (`ChoiceState.logprobs`, formatted by
`chat_logprobs`) of the tokens whose text overlaps the answer's text, as the parser that splits the
answer found it (`content_spans()`: after a `<think>` thought and the blank lines that follow it, or
the bodies of harmony's final and commentary messages), so no token of a thought, of its tags or of a
harmony header is among them. An answer without a reasoning format has no such split: every token.
Streamed, a token is given out once the parser has settled the text it spells (text it holds back,
such as a `</think>` that may be arriving, could still turn out to be the thought's).
"""
from __future__ import annotations

from .openai_format import ChoiceState, TokenStrings, chat_logprobs


class TextLogprobs:
    """One choice's text logprobs, taken as they are settled."""

    def __init__(self, state: ChoiceState, strings: TokenStrings):
        self.state, self.strings = state, strings
        self.seen = 0           # tokens looked at already

    def take(self, end: bool = False) -> list[dict]:
        """The logprobs ({token, logprob, bytes, top_logprobs}) of the text's tokens settled since the
        last call; end: the choice finished, so every token is settled."""
        st = self.state
        ends, parser = st.token_ends, st.tool_parser
        first = self.seen
        if ends is None or parser is None:      # no reasoning format: every token is the text's
            self.seen = len(st.logprobs)
            return chat_logprobs(st.logprobs[first:], self.strings)["content"]
        self.seen = len(st.logprobs) if end else min(ends.settled(parser.settled()), len(st.logprobs))
        if self.seen <= first:
            self.seen = first
            return []
        text = ends.inside(parser.content_spans(), first, self.seen)
        kept = [e for e, is_text in zip(st.logprobs[first:self.seen], text) if is_text]
        return chat_logprobs(kept, self.strings)["content"]


def event_logprobs(logprobs: list[dict]) -> list[dict]:
    """Text logprobs as the stream's text events carry them: OpenAI's event types have no `bytes`
    (the content part's do)."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]}
            for e in logprobs]

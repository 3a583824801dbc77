"""The logprobs of an answer's text, as /v1/responses' output_text parts carry them.

They are chat completions' own per-token entries (`ChoiceState.logprobs`, formatted by
`chat_logprobs`) of the tokens whose text overlaps the answer's text, as the parser that splits the
answer found it (`content_spans()`: after a `<think>` thought and the blank lines that follow it, the
bodies of harmony's final and commentary messages, the text around `<tool_call>` blocks), so no
token of a thought, of its tags, of a harmony header or of a tool call is among them. An answer read
whole has its tool calls taken out at the end (`ToolSetup.extract`); the same split says where its
text lies. An answer with neither a reasoning format nor tools has no split: every token.
Streamed, a token is given out once the parser has settled the text it spells (text it holds back,
such as a `</think>` that may be arriving or a call not yet announced, could still turn out otherwise).
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
        if ends is None:                        # nothing splits the answer: every token is the text's
            self.seen = len(st.logprobs)
            return chat_logprobs(st.logprobs[first:], self.strings)["content"]
        if end:
            self.seen = len(st.logprobs)
        elif parser is not None:
            self.seen = min(ends.settled(parser.settled()), len(st.logprobs))
        if self.seen <= first:
            self.seen = first
            return []
        text = ends.inside(_text_spans(st), first, self.seen)
        kept = [e for e, is_text in zip(st.logprobs[first:self.seen], text) if is_text]
        return chat_logprobs(kept, self.strings)["content"]


def _text_spans(st: ChoiceState) -> list[tuple[int, int]]:
    """Where the answer's text lies in the generated text, as far as it is parsed."""
    tools, parser = st.tools, st.tool_parser
    if not (st.whole and tools.names and not tools.harmony):
        return parser.content_spans()
    # read whole, the calls are taken out of the answer (after any thought) at the end, not by the parser
    start = 0
    if parser is not None:
        spans = parser.content_spans()
        if not spans:
            return []
        start = spans[0][0]
    return [(start + s, start + e) for s, e in tools.text_spans(st.text[start:])]


def event_logprobs(logprobs: list[dict]) -> list[dict]:
    """Text logprobs as the stream's text events carry them: OpenAI's event types have no `bytes`
    (the content part's do)."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]}
            for e in logprobs]

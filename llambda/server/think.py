"""Reasoning in `<think> ... </think>` (Qwen3, SmolLM3, QwQ, DeepSeek-R1 distills), parsed as the text streams in.

Such a model thinks first, then answers:

    <think>
    The user wants the capital. It is Paris.
    </think>

    The capital of France is Paris.

The thought becomes the OpenAI `reasoning_content` (and the other APIs' reasoning or thinking),
what follows `</think>` the answer. Some templates open `<think>` in the prompt themselves
(QwQ, DeepSeek-R1), so the output starts mid-thought and only `</think>` appears; one that was
told not to think (Qwen3's `enable_thinking: false`) closes an empty thought in the prompt. Only a
`<think>` at the very start of the output opens a thought: one later in the answer is text the
model wrote. A thought never closed (cut off by max_tokens) is all reasoning.

`ThinkParser` has blocks.BlockParser's interface (feed/finish -> content and tool-call deltas, `.calls`,
`take_reasoning()`) and hands the answer after the thought to the tool-call parser, if any.
"""
from __future__ import annotations

from ..thinking import CLOSE, MAX_HELD_BLANKS, OPEN
from .tool_formats.pieces import partial_suffix

# parser states
START, THOUGHT, ANSWER = "start", "thought", "answer"
# Blanks held back at most (MAX_HELD_BLANKS, before a `</think>` that may come, or a `<think>` that may
# start the output): re-reading an ever longer run of them at every token made a model writing nothing
# but blanks cost time quadratic in its output. Of the blanks before `</think>`, only the last this many
# are dropped from the thought, and a `<think>` after more leading blanks than this is answer text.


class ThinkParser:
    """Feed generated text; get (content, tool-call deltas) back, and the thought by take_reasoning().

    inner: the parser of the answer after the thought (tool calls), or None for plain text;
    opened: the prompt already opened the thought.
    """

    def __init__(self, inner=None, opened: bool = False):
        self.inner = inner
        self.state = THOUGHT if opened else START
        self.buf = ""
        self.lead = True           # nothing of the thought emitted yet: its leading blank lines are dropped
        self._reasoning: list[str] = []
        self.seen = 0              # characters fed (buf is always their tail)
        self.closed_at = 0         # where the thought ended, </think> included (0: no thought closed)
        self.answer_at: int | None = None   # where the answer's text began (after the blanks that follow </think>)

    @property
    def calls(self) -> list[dict]:
        return self.inner.calls if self.inner is not None else []

    def take_reasoning(self) -> str:
        """The thought's text that arrived since the last call."""
        out, self._reasoning = "".join(self._reasoning), []
        return out

    def reasoning_spans(self) -> list[tuple[int, int]]:
        """Where the thought lies in the text fed so far, its tags included: [(start, end)] or [].
        An unclosed thought runs to the end (as finish() reads it)."""
        end = self.seen if self.state == THOUGHT else self.closed_at
        return [(0, end)] if end else []

    def content_spans(self) -> list[tuple[int, int]]:
        """Where the answer's text lies in the text fed so far: [(start, end)], [], or the tool-call
        parser's spans of the answer (its calls left out)."""
        if self.answer_at is None:
            return []
        if self.inner is None:
            return [(self.answer_at, self.seen)]
        return [(self.answer_at + s, self.answer_at + e) for s, e in self.inner.content_spans()]

    def settled(self) -> int:
        """How much of the text fed so far has its place (thought, answer, call) decided: all but what
        is held, here or by the tool-call parser."""
        if self.inner is not None and self.answer_at is not None:
            return min(self.seen - len(self.buf), self.answer_at + self.inner.settled())
        return self.seen - len(self.buf)

    def _think(self, text: str) -> None:
        if self.lead:
            text = text.lstrip()
            self.lead = not text
        if text:
            self._reasoning.append(text)

    def _answer(self, text: str) -> tuple[str, list[dict]]:
        if self.inner is None:
            return text, []
        return self.inner.feed(text) if text else ("", [])

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """Content to emit now and tool-call deltas (OpenAI `delta.tool_calls` entries)."""
        self.buf += text
        self.seen += len(text)
        if self.state == START:
            head = self.buf.lstrip()
            blanks = len(self.buf) - len(head)
            if blanks <= MAX_HELD_BLANKS and (not head or (len(head) < len(OPEN) and OPEN.startswith(head))):
                return "", []                   # `<think>` may be arriving
            if blanks <= MAX_HELD_BLANKS and head.startswith(OPEN):
                self.buf, self.state = head[len(OPEN):], THOUGHT
            else:
                self.state, self.lead = ANSWER, False     # no thought: the answer as written
        if self.state == THOUGHT:
            at = self.buf.find(CLOSE)
            if at < 0:
                # hold back a tag that may be arriving and trailing blanks (they may end the thought)
                keep = partial_suffix(self.buf, CLOSE)
                ready = self.buf[:len(self.buf) - keep]
                ready_end = _unheld(ready)
                self._think(ready[:ready_end])
                self.buf = self.buf[ready_end:]
                return "", []
            thought = self.buf[:at]
            self._think(thought[:_unheld(thought)])
            self.buf, self.state = self.buf[at + len(CLOSE):], ANSWER
            self.closed_at = self.seen - len(self.buf)
            self.lead = True
        # ANSWER: the blank lines after `</think>` are format, not the answer's start
        if self.lead:
            self.buf = self.buf.lstrip()
            if not self.buf:
                return "", []
            self.lead = False
        if self.answer_at is None:
            self.answer_at = self.seen - len(self.buf)
        out, self.buf = self.buf, ""
        return self._answer(out)

    def finish(self) -> tuple[str, list[dict]]:
        """Whatever is still held, at the end of the output: an unclosed thought is all reasoning."""
        held, self.buf = self.buf, ""
        content, calls = "", []
        if self.state == THOUGHT:
            self._think(held.rstrip())
        elif self.state == START or not self.lead:
            content, calls = self._answer(held)     # blank or a cut-off `<thi`: the model's text
            if self.answer_at is None and held:
                self.answer_at = self.seen - len(held)
        if self.inner is not None:
            rest, more = self.inner.finish()
            content, calls = content + rest, calls + more
        return content, calls


def _unheld(text: str) -> int:
    """Where the blanks `text` ends with start, but no more than MAX_HELD_BLANKS before its end."""
    return max(len(text.rstrip()), len(text) - MAX_HELD_BLANKS)


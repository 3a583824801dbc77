"""A thinking budget: a `<think>` thought that has run N generated tokens is closed.

Reasoning models (Qwen3, SmolLM3, QwQ, DeepSeek-R1 distills) think in `<think> ... </think>` before
they answer, as long as they like. With a budget of N, once a sequence has generated N tokens in
its thought (the `<think>` tag included; a thought the prompt opened counts from the first
generated token) and the thought is still open, the closing tag and what the chat template puts
after it ("\n\n" in Qwen3's) are forced as the next tokens, and the model answers from there. A
newline goes before the tag unless the thought already ends with one, as the templates write it.

What is here is per sequence and reads only that sequence's tokens (batch invariance holds);
`engine.Sequence` asks `ThoughtBudget.forced()` before it samples. Where the thought lies is
decided as `server/think.py`'s parser decides it: only a `<think>` at the very start of the
output (after MAX_HELD_BLANKS blanks at most) opens one, the first `</think>` closes it.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from .errors import ChatTemplateError, InvalidInputError

OPEN, CLOSE = "<think>", "</think>"
# Blanks that may come before a `<think>` that opens the thought (server/think.py holds as many)
MAX_HELD_BLANKS = 64
DEFAULT_AFTER = "\n\n"        # after `</think>`, where the template does not show it

START, THOUGHT, DONE = "start", "thought", "done"


def template_thinks(source: str | None) -> bool:
    """The chat template is a `<think>` reasoner's: it writes or strips the tags."""
    return bool(source) and (OPEN in source or CLOSE in source)


def prompt_opens_thought(prompt: str, prefill: str = "") -> bool:
    """The output starts mid-thought: the rendered prompt ends with `<think>` (blanks after it aside),
    or the given start of the answer (prefill) opens a thought it does not close."""
    if OPEN in prefill or CLOSE in prefill:
        return prefill.rfind(OPEN) > prefill.rfind(CLOSE)
    return prompt.rstrip(" \n").endswith(OPEN)


def text_after_close(render) -> str:
    """What the chat template writes after `</think>`: the blanks after the empty thought it closes
    when told not to think (`render(messages, enable_thinking=False)`, Qwen3's and SmolLM3's
    switch); DEFAULT_AFTER where it shows none."""
    try:
        text = render([{"role": "user", "content": "x"}], enable_thinking=False)
    except (ChatTemplateError, InvalidInputError):
        return DEFAULT_AFTER
    at = text.rfind(CLOSE)
    tail = text[at + len(CLOSE):] if at >= 0 else None
    return tail if tail is not None and not tail.strip() else DEFAULT_AFTER


def check_budget(n, what: str = "thinking_budget") -> int:
    """A budget as a count of tokens (a non-negative integer; not a bool or a float)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise InvalidInputError(f"{what} must be a non-negative integer (tokens), got {n!r}")
    return int(n)


@dataclass(frozen=True)
class ThinkingBudget:
    """A request's budget: at most `tokens` generated in the thought, then the closing tokens.

    opened: the prompt opened the thought (the output starts inside it); close: the spellings of the
    closing tag and what follows it as token ids (the tag as its control token, then as plain text),
    newline_close: the same after a newline."""
    tokens: int
    close: tuple[tuple[int, ...], ...]
    newline_close: tuple[tuple[int, ...], ...]
    opened: bool = False

    @classmethod
    def build(cls, tokenizer, tokens: int, opened: bool, after: str = DEFAULT_AFTER) -> "ThinkingBudget":
        def spellings(text: str) -> tuple[tuple[int, ...], ...]:
            out: list[tuple[int, ...]] = []
            for special in (True, False):
                ids = tuple(tokenizer.encode(text, add_bos=False, parse_special=special))
                if ids and ids not in out:
                    out.append(ids)
            return tuple(out)
        return cls(check_budget(tokens), spellings(CLOSE + after), spellings("\n" + CLOSE + after), bool(opened))

    def start(self) -> "ThoughtBudget":
        return ThoughtBudget(self)


class ThoughtBudget:
    """One sequence's thought and its budget: `forced()` before sampling, `record()` after each token."""

    def __init__(self, budget: ThinkingBudget):
        self.budget = budget
        self.state = THOUGHT if budget.opened else START
        self.text = ""                     # START: the output so far; THOUGHT: its last characters
        self.used = 0                      # tokens generated in the thought
        self._forcing: tuple[int, ...] = ()

    def forced(self, allows=None) -> int | None:
        """The token the budget forces next, or None (sample as usual). A closing starts with the
        first spelling `allows(ids)` (the output's grammar, if any) takes whole; where it takes none,
        none is forced now (the budget tries again before the next token)."""
        if not self._forcing and self.state == THOUGHT and self.used >= self.budget.tokens:
            b = self.budget
            for ids in b.close if self.text.endswith("\n") else b.newline_close:
                if allows is None or allows(ids):
                    self._forcing = ids
                    break
        return self._forcing[0] if self._forcing else None

    def record(self, text: str, forced: bool = False) -> None:
        """A generated token's text; forced: it was `forced()`'s."""
        if forced:
            self._forcing = self._forcing[1:]
            if not self._forcing:
                self.state = DONE                         # closed, whatever the tokens spelled
                return
        if self.state == DONE:
            return
        self.used += 1
        self.text += text
        if self.state == START:
            head = self.text.lstrip()
            if len(self.text) - len(head) > MAX_HELD_BLANKS:
                self.state = DONE
            elif not head or (len(head) < len(OPEN) and OPEN.startswith(head)):
                return                                    # `<think>` may be arriving
            elif head.startswith(OPEN):
                self.state, self.text = THOUGHT, head[len(OPEN):]
            else:
                self.state = DONE                         # no thought: the answer as written
                return
        if CLOSE in self.text:
            self.state = DONE
        else:
            self.text = self.text[-len(CLOSE):]           # a tag that may be arriving, the last newline

"""A `<think>` thought per sequence: a budget closes one that has run N generated tokens, and the
output's grammar waits while one may come or is open.

Reasoning models (Qwen3, SmolLM3, QwQ, DeepSeek-R1 distills) think in `<think> ... </think>` before
they answer, as long as they like. With a budget of N, once a sequence has generated N tokens in
its thought (the `<think>` tag included; a thought the prompt opened counts from the first
generated token) and the thought is still open, the closing tag and what the chat template puts
after it ("\n\n" in Qwen3's) are forced as the next tokens, and the model answers from there. A
newline goes before the tag unless the thought already ends with one, as the templates write it.

The same per-sequence state holds back the output's grammar (a JSON schema, a regex) while a
thought is open: the thought is the model's free text, and the grammar starts after `</think>` and
the blanks the template writes after it (forced where the model closed the thought itself, as
the budget forces them), as vLLM applies structured output to the answer only. The sampling
rules of a thought under a waiting grammar are `engine.Sequence`'s (`holds_grammar`).

What is here is per sequence and reads only that sequence's tokens (batch invariance holds);
`engine.Sequence` asks `ThoughtBudget.forced()` before it samples. Where the thought lies is
decided as `server/think.py`'s parser decides it: only a `<think>` at the very start of the
output (after MAX_HELD_BLANKS blanks at most; under a waiting grammar a blank is the answer's)
opens one, the first `</think>` closes it.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ChatTemplateError, InvalidInputError

OPEN, CLOSE = "<think>", "</think>"
# Blanks that may come before a `<think>` that opens the thought (server/think.py holds as many)
MAX_HELD_BLANKS = 64
DEFAULT_AFTER = "\n\n"        # after `</think>`, where the template does not show it

START, THOUGHT, DONE = "start", "thought", "done"


def think_template_kwargs(think: bool | str | None) -> dict:
    """The chat-template variables Ollama's `think` sets, as its API's JSON field (true, false or a level)
    and `ollama run --think=VALUE` ("true", "false" or a level) give it: none when unset; enable_thinking
    false for false, else true (Qwen3, SmolLM3); a level is also the template's reasoning_effort (gpt-oss).
    The callers check which values they take (commands/run_flags.py, server/ollama_api.py)."""
    if think is None:
        return {}
    if think in ("true", "false"):
        think = think == "true"
    kw = {"enable_thinking": think is not False}
    if isinstance(think, str):
        kw["reasoning_effort"] = think
    return kw


def template_thinks(source: str | None) -> bool:
    """The chat template is a `<think>` reasoner's: it writes or strips the tags."""
    return bool(source) and (OPEN in source or CLOSE in source)


def prompt_opens_thought(prompt: str, prefill: str = "") -> bool:
    """The output starts mid-thought: the rendered prompt ends with `<think>` (blanks after it aside),
    or the given start of the answer (prefill) opens a thought it does not close."""
    if OPEN in prefill or CLOSE in prefill:
        return prefill.rfind(OPEN) > prefill.rfind(CLOSE)
    return prompt.rstrip(" \n").endswith(OPEN)


def prompt_closes_thought(prompt: str, prefill: str = "") -> bool:
    """The prompt closed the thought itself (Qwen3's and SmolLM3's `enable_thinking: false` write an
    empty one), or the given start of the answer (prefill) closes one or is the answer's text: the
    output is the answer from its first token."""
    if prefill.strip():
        return not prompt_opens_thought(prompt, prefill)
    return prompt.rstrip(" \n").endswith(CLOSE)


def grammar_spells_thought(kind: str, source: str) -> bool:
    """A grammar or regex that writes the thought itself (its text has `</think>`) governs the whole
    output, thought included; any other (a JSON schema always) waits for the thought to end."""
    return kind != "json_schema" and CLOSE in source


@dataclass(frozen=True)
class PromptThought:
    """Where a `<think>` template's rendered prompt (and the given start of the answer) leaves the
    thought: what the library's chat and the server both decide the output's thinking from."""
    opened: bool       # the output starts inside the thought
    may_come: bool     # the prompt did not close it: the output may start with a thought, or is in one


def prompt_thought(thinks: bool, prompt: str, prefill: str = "") -> PromptThought | None:
    """The prompt's thought where the template has one (thinks: template_thinks), else None."""
    if not thinks:
        return None
    return PromptThought(prompt_opens_thought(prompt, prefill), not prompt_closes_thought(prompt, prefill))


def output_thinking(thought: PromptThought | None, tokens: int | None, constraint, tokenizer: Callable[[], object],
                    after: Callable[[], str]) -> "ThinkingBudget | None":
    """The ThinkingBudget of a chat's output, or None where it has no thought, or neither a budget
    (tokens) nor a grammar that waits. The output's grammar (constraint: a GrammarSpec or None)
    waits for the thought's end unless the prompt closed the thought or the grammar spells it.
    tokenizer, after: the model's tokenizer and what its template writes after `</think>`, both
    callables, asked only when a budget is built (a model without a tokenizer fails there)."""
    if thought is None:
        return None
    holds = thought.may_come and constraint is not None and \
        not grammar_spells_thought(constraint.kind, constraint.source)
    if tokens is None and not holds:
        return None
    return ThinkingBudget.build(tokenizer(), tokens, thought.opened, after(), holds_grammar=holds)


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
    """A request's budget: at most `tokens` generated in the thought (None: no bound), then the
    closing tokens.

    opened: the prompt opened the thought (the output starts inside it); close: the spellings of the
    closing tag and what follows it as token ids (the tag as its control token, then as plain text),
    newline_close: the same after a newline. holds_grammar: the output's grammar waits for the
    thought's end; then after_rest holds the tokens of each proper tail of `after` (the blanks the
    template writes after `</think>`: forced after a close the model wrote) and open_first the first
    token of each spelling of `<think>`, open_rest the text tokens of each proper tail of it."""
    tokens: int | None
    close: tuple[tuple[int, ...], ...]
    newline_close: tuple[tuple[int, ...], ...]
    opened: bool = False
    holds_grammar: bool = False
    after: str = DEFAULT_AFTER
    after_rest: tuple[tuple[str, tuple[int, ...]], ...] = ()
    open_first: tuple[int, ...] = ()
    open_rest: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def build(cls, tokenizer, tokens: int | None, opened: bool, after: str = DEFAULT_AFTER,
              holds_grammar: bool = False) -> "ThinkingBudget":
        def spellings(text: str) -> tuple[tuple[int, ...], ...]:
            out: list[tuple[int, ...]] = []
            for special in (True, False):
                ids = tuple(tokenizer.encode(text, add_bos=False, parse_special=special))
                if ids and ids not in out:
                    out.append(ids)
            return tuple(out)

        def tails(text: str, first: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
            return tuple((text[k:], tuple(tokenizer.encode(text[k:], add_bos=False, parse_special=False)))
                         for k in range(first, len(text)))
        tokens = check_budget(tokens) if tokens is not None else None
        extra = {}
        if holds_grammar:
            extra = dict(after_rest=tails(after, 0), open_rest=tails(OPEN, 1),
                         open_first=tuple(sorted({ids[0] for ids in spellings(OPEN)})))
        return cls(tokens, spellings(CLOSE + after), spellings("\n" + CLOSE + after), bool(opened),
                   bool(holds_grammar), after, **extra)

    def start(self) -> "ThoughtBudget":
        return ThoughtBudget(self)


class ThoughtBudget:
    """One sequence's thought and its budget: `forced()` before sampling, `record()` after each token.
    Under a waiting grammar (`holds_grammar`) also what the sampler asks: whether a token opens the
    thought (`opens`), runs past its close into the answer (`crosses`), and `holding`."""

    def __init__(self, budget: ThinkingBudget):
        self.budget = budget
        self.state = THOUGHT if budget.opened else START
        self.text = ""                     # START: the output so far; THOUGHT: its last characters
        self.used = 0                      # tokens generated in the thought
        self._forcing: tuple[int, ...] = ()

    @property
    def holding(self) -> bool:
        """The output's grammar waits: the thought may still come, is open, or its closing is being forced."""
        return self.budget.holds_grammar and (self.state != DONE or bool(self._forcing))

    def forced(self, allows=None) -> int | None:
        """The token the budget forces next, or None (sample as usual). A closing starts with the
        first spelling `allows(ids)` (the output's grammar, if any) takes whole; where it takes none,
        none is forced now (the budget tries again before the next token)."""
        b = self.budget
        if not self._forcing and self.state == THOUGHT and b.tokens is not None and self.used >= b.tokens:
            for ids in b.close if self.text.endswith("\n") else b.newline_close:
                if allows is None or allows(ids):
                    self._forcing = ids
                    break
        return self._forcing[0] if self._forcing else None

    def force_close(self) -> None:
        """Close the thought now (the grammar's wait must end): the closing's first spelling."""
        b = self.budget
        self._forcing = (b.close if self.text.endswith("\n") else b.newline_close)[0]

    def opens(self, text: str) -> bool:
        """START under a waiting grammar: the output so far and `text` are `<think>` or a start of it
        (no blanks before it: a blank is the answer's)."""
        head = self.text + text
        return bool(head) and (head.startswith(OPEN) or OPEN.startswith(head))

    def finish_tag(self) -> None:
        """START: the output began `<think>` and the model turned away: the tag is completed."""
        for rest, ids in self.budget.open_rest:
            if self.text + rest == OPEN:
                self._forcing = ids
                return
        self.answer()

    def answer(self) -> None:
        """START: the output is the answer (no thought), the grammar's from here."""
        self.state, self._forcing = DONE, ()

    def crosses(self, text: str) -> bool:
        """THOUGHT: `text` closes the thought and goes on into the answer (more than blanks)."""
        at = (self.text + text).find(CLOSE)
        return at >= 0 and bool((self.text + text)[at + len(CLOSE):].strip())

    def record(self, text: str, forced: bool = False) -> None:
        """A generated token's text; forced: it was `forced()`'s."""
        if forced:
            self._forcing = self._forcing[1:]
            if self.state == THOUGHT:                     # a closing: done once all of it is written,
                if not self._forcing:                     # whatever the tokens spelled
                    self.state = DONE
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
        at = self.text.find(CLOSE)
        if at >= 0:
            self.state = DONE
            if self.budget.holds_grammar:                 # the template's blanks, then the grammar
                written = self.text[at + len(CLOSE):]
                self._forcing = next((ids for rest, ids in self.budget.after_rest
                                      if written + rest == self.budget.after), ())
        else:
            self.text = self.text[-len(CLOSE):]           # a tag that may be arriving, the last newline

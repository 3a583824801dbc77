"""Sequences on KV-cache slots: prefill, decode, and the per-token bookkeeping.

`Sequence` holds everything one generation needs between steps (its slot, the
tokens in its cache, sampler, stop-string matcher, streaming detokenizer) and
turns a row of logits into the next `TokenEvent`. The same object serves the
single-stream API (one sequence, decode steps of one token) and the server's
scheduler (many sequences, one batched decode step for all).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import ContextOverflowError, InvalidInputError, ModelFormatError
from .models.images import BatchImages, chunk_end, image_keys, rope_delta, rope_rows
from .sampling import Sampler, SamplingParams, StopMatcher, TokenChoice, _is_int
from .thinking import START

MAX_REDRAWS = 16     # draws of a thought's token refused under a waiting grammar before it is closed


@dataclass
class GenerationParams:
    max_tokens: int | None = 256          # None: until EOS or the context is full
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    grammar: object = None                # a constraints.Grammar the output must follow, or None
    thinking: object = None               # a thinking.ThinkingBudget for a `<think>` thought, or None

    def validate(self) -> None:
        # _is_int: True is not a count of 1, a NumPy integer is a count
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 0):
            raise InvalidInputError(f"max_tokens must be a non-negative integer, got {self.max_tokens!r}")
        if self.max_tokens is not None:
            self.max_tokens = int(self.max_tokens)   # np.uint8(0) - 1 wrapped to 255 in the draft count
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidInputError("stop must be a list of strings")
        # not truthiness: ignore_eos="no" or [0] would ignore the end of text
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise InvalidInputError(f"ignore_eos must be a boolean, got {type(self.ignore_eos).__name__}")
        self.sampling.validate()


@dataclass
class TokenEvent:
    token: int                       # -1 when the event only closes the stream
    text: str                        # text to emit now (complete characters, stop strings held back)
    logprob: float = 0.0
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" on the last event
    context_full: bool = False        # with "length": ended because the context had no room left


def token_ids(ids, vocab_size: int, what: str = "token ids") -> list[int]:
    """`ids` as a list of plain ints, each a Python or NumPy integer (not a bool, float or string)
    in [0, vocab_size); anything else is an InvalidInputError naming the first bad value."""
    if isinstance(ids, (str, bytes, bytearray)):   # iterable, but of characters/bytes, not ids
        raise InvalidInputError(f"{what} must be a sequence of integers, got {type(ids).__name__}")
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise InvalidInputError(f"{what} must be a 1-D integer array, got {ids.dtype} of shape {ids.shape}")
        out = ids.tolist()
    else:
        try:
            out = list(ids)
        except TypeError:
            raise InvalidInputError(f"{what} must be a sequence of integers, got {type(ids).__name__}") from None
        for i in out:
            # int(1.7), int("5") and int(True) all succeed: check the type, not the conversion
            if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
                raise InvalidInputError(f"{what} must be integers, got {i!r} ({type(i).__name__})")
        out = [int(i) for i in out]
    bad = [i for i in out if not 0 <= i < vocab_size]
    if bad:
        raise InvalidInputError(f"{what} out of range [0, {vocab_size}): {bad[:5]}")
    return out


def common_prefix(held: list[int], ids: list[int]) -> int:
    """How many leading tokens a slot holding `held` shares with `ids` (the keys/values it can keep)."""
    n = len(held)
    if n <= len(ids) and held == ids[:n]:
        return n       # the usual next step of one generation: a C-level compare, no Python loop
    common = 0
    for a, b in zip(held, ids):
        if a != b:
            break
        common += 1
    return common


def prefill(model, slot: int, ids, start: int, images=()) -> np.ndarray:
    """Run ids (positions start..) through the model on a slot in chunks; logits of the last one (a copy).
    images: the sequence's image blocks (models/images.py, positions from 0): their soft tokens get the
    tower's rows and see their whole block, and no chunk ends inside one (chunk_end); blocks with a grid
    (Qwen2-VL) give the chunk's M-RoPE positions, those after them too (rope_rows)."""
    n = len(ids)
    if start + n > model.n_ctx:
        raise ContextOverflowError(f"{start + n} tokens do not fit the context of {model.n_ctx}")
    chunk = model.ws.max_tokens
    ids = np.asarray(ids, dtype=np.int32)
    logits = None
    s = 0
    while s < n:
        e = min(n, s + chunk)
        batch = None
        if images:
            e = chunk_end(images, start + s, start + e, start + s + chunk) - start
            if e <= s:
                raise ContextOverflowError(f"an image block does not fit a forward of {chunk} tokens (max_batch)")
            batch = BatchImages()
            batch.add(0, images, start + s, start + e)
        part = ids[s:e]
        m = len(part)
        pos = np.arange(start + s, start + s + m, dtype=np.int32)
        extra = {"images": batch} if batch else {}
        rope = rope_rows(images, start + s, start + e) if images else None
        if rope is not None:
            extra["rope"] = rope
        logits = model.forward(part, np.full(m, slot, np.int32), pos, [m - 1], **extra)
        s = e
    out = logits[0].copy()
    if not np.isfinite(out).all():
        # NaN/inf logits come from corrupt weights (or values past float range): refuse to hand them out.
        # Decoding is guarded by the sampler, which refuses non-finite logits itself.
        where = getattr(model.cfg, "source", "") or "the model"
        raise ModelFormatError(f"{where}: the forward pass gave non-finite logits (NaN or inf); "
                               "its weights are corrupt or out of range")
    return out


def decode(model, slots, tokens, positions, rope=None) -> np.ndarray:
    """One token for each sequence in one batched step; logits rows in order (a workspace view). rope: each
    row's RoPE position where it is not its cache position (Sequence.rope_pos: after an image, M-RoPE)."""
    n = len(tokens)
    if rope is None:
        return model.forward(tokens, slots, positions, range(n))    # range: a recorded step's fast path
    return model.forward(tokens, slots, positions, range(n), rope=rope)


class Sequence:
    def __init__(self, tokenizer, prompt_ids: list[int], params: GenerationParams, slot: int, n_ctx: int,
                 images=()):
        """images: the prompt's image blocks (models/images.py; checked by the caller, images.check_prompt)."""
        params.validate()
        if len(prompt_ids) == 0:
            raise InvalidInputError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {n_ctx} (prompt plus at least one new token)")
        self.tokenizer, self.params, self.slot, self.n_ctx = tokenizer, params, slot, n_ctx
        self.prompt_ids = list(prompt_ids)
        self.images = tuple(images)
        self.rope_delta = rope_delta(self.images)   # RoPE positions after the images: cache position + this
        self.tokens = list(prompt_ids)        # everything the sequence holds, generated tokens appended
        self.generated: list[int] = []
        self.sampler = Sampler(params.sampling)
        self.stop = StopMatcher(params.stop) if params.stop else None
        self.detok = tokenizer.stream() if tokenizer is not None else None
        self.finish_reason: str | None = None
        self.eot = set() if (params.ignore_eos or tokenizer is None) else set(tokenizer.eot_ids)
        # each sequence has its own parser state; the grammar is shared (n choices, many requests)
        self.constraint = params.grammar.start() if params.grammar is not None else None
        self.thought = params.thinking.start() if params.thinking is not None else None
        self._eos_banned = params.ignore_eos and tokenizer is not None
        self._thought_ban: np.ndarray | None = None    # _sample_thought's mask, made once (see _thought_mask)

    def drop_image_rows(self) -> None:
        """The prompt's image rows are read no more (its prompt's keys and values are in the cache, or it ended):
        only where each block lies and which image it is are kept (models/images.ImageKey, what a prefix cache
        compares), so their memory goes (the server: Job.drop_images)."""
        if self.images:
            self.images = image_keys(self.images)

    @property
    def live_constraint(self):
        """The grammar the next token follows: None without one, and while it waits for a thought."""
        if self.thought is not None and self.thought.holding:
            return None
        return self.constraint

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def next_pos(self) -> int:
        """Position of the last sampled token, which the next decode step feeds."""
        return len(self.tokens) - 1

    def rope_pos(self, pos: int) -> int:
        """The RoPE position of a token at cache position `pos` past the prompt's images (M-RoPE's: behind by
        rope_delta after Qwen2-VL's images; else pos itself)."""
        return pos + self.rope_delta

    def _closing_text(self) -> str:
        tail = self.detok.flush() if self.detok else ""
        if self.stop:
            emit, stopped = self.stop.feed(tail)
            return emit if stopped else emit + self.stop.flush()
        return tail

    def _sample_constrained(self, logits: np.ndarray, c) -> TokenChoice:
        """A token the grammar allows (advancing it), or an EOS where the grammar may end.

        The grammar's mask costs ~50 us per token at a 49k vocabulary, as much as the rest of the
        sampling: where rejection sampling is exact (Sampler.rejection_exact) the token is drawn
        unmasked first and the mask is computed only if the grammar refuses it, which it seldom
        does (the model mostly writes the format it is asked for)."""
        if self.sampler.rejection_exact:
            choice = self.sampler.sample(logits, self.tokens)
            if choice.token in self.eot:
                if c.accepting:
                    return choice
            elif c.try_advance(choice.token):
                return choice
        banned = c.banned()
        if self._eos_banned:      # ignore_eos: the grammar may end there, the caller wants more
            banned[list(self.tokenizer.eot_ids)] = True
        choice = self.sampler.sample(logits, self.tokens, banned)
        if choice.token not in self.eot:
            c.advance(choice.token)
        return choice

    def _forced(self, c) -> int | None:
        """The token the thinking budget forces now (the grammar, if any, advanced over it), or None:
        none is due, or the grammar allows no spelling of the closing here."""
        token = self.thought.forced(c.allows if c is not None else None)
        if token is not None and c is not None:
            c.advance(token)
        return token

    def _piece_of(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def _sample_thought(self, logits: np.ndarray) -> TokenChoice | None:
        """A token of the thought while the grammar waits (thinking.py): free text, but not an end of
        the output (the answer must come) nor a token that runs past `</think>` into the answer (the
        grammar starts at a token's start). Such a draw is banned and drawn again; None after
        MAX_REDRAWS of them (the caller closes the thought)."""
        t = self.thought
        mask = self._thought_mask(len(logits))
        # a truncated distribution: the ban comes first; an exact one: only once a draw is refused
        banned = None if self.sampler.rejection_exact else mask
        refused: list[int] = []
        try:
            for _ in range(MAX_REDRAWS):
                choice = self.sampler.sample(logits, self.tokens, banned)
                if choice.token not in self.eot and not t.crosses(self._piece_of(choice.token)):
                    return choice
                banned = mask
                if not mask[choice.token]:            # an end is banned already, and stays so
                    mask[choice.token] = True
                    refused.append(choice.token)
            return None
        finally:                    # the next token starts from the ends alone
            mask[refused] = False

    def _thought_mask(self, vocab: int) -> np.ndarray:
        """The ends of the output (EOS tokens) banned, over the vocabulary: one array per sequence,
        made at its first use and reused at every token of the thought, not one array per token."""
        if self._thought_ban is None:
            self._thought_ban = np.zeros(vocab, np.bool_)
            self._thought_ban[list(self.tokenizer.eot_ids)] = True
        return self._thought_ban

    def _sample_start(self, logits: np.ndarray, c) -> TokenChoice | None:
        """The output's first tokens while the grammar waits for a thought that may come: a token
        that writes `<think>` (or a start of it) is free; any other is the answer's, which the grammar
        must take from the output's start. Drawn unmasked first where that is exact, else under the
        grammar's mask with the tag's first tokens allowed too. None: the output began the tag and
        turned away, the tag is being completed (forced)."""
        t = self.thought
        pending = list(self.generated)             # a start of `<think>`, nothing the grammar saw

        def take(token: int) -> bool:
            if t.opens(self._piece_of(token)):
                return True
            if token in self.eot:
                return not pending and c.accepting
            if pending and not c.allows(pending + [token]):
                return False
            for p in pending:
                c.advance(p)
            if not c.try_advance(token):
                return False
            t.answer()
            return True

        if self.sampler.rejection_exact:
            choice = self.sampler.sample(logits, self.tokens)
            if take(choice.token):
                return choice
        if pending:
            t.finish_tag()
            return None
        banned = c.banned()
        banned[list(t.budget.open_first)] = False
        if self._eos_banned:
            banned[list(self.tokenizer.eot_ids)] = True
        choice = self.sampler.sample(logits, self.tokens, banned)
        if choice.token not in self.eot and not t.opens(self._piece_of(choice.token)):
            c.advance(choice.token)
            t.answer()
        return choice

    def step(self, logits: np.ndarray) -> TokenEvent:
        """Sample from the logits of the last position and advance."""
        mt = self.params.max_tokens
        if mt is not None and len(self.generated) >= mt:
            self.finish_reason = "length"
            return TokenEvent(-1, self._closing_text(), finish_reason="length")
        waiting = self.constraint if self.thought is not None and self.thought.holding else None
        c = self.constraint if waiting is None else None      # the grammar in force now
        if c is not None and c.done:      # e.g. a grammar of one fixed string, already written
            self.finish_reason = "stop"
            return TokenEvent(-1, self._closing_text(), finish_reason="stop")
        forced = self._forced(c) if self.thought is not None else None
        choice = None
        if forced is None and waiting is not None:
            if self.thought.state == START:
                choice = self._sample_start(logits, waiting)
            else:
                choice = self._sample_thought(logits)
                if choice is None:
                    self.thought.force_close()
            if choice is None:
                forced = self._forced(None)
                c = self.live_constraint
        if forced is not None:
            choice = self.sampler.forced(logits, forced)
        elif choice is not None:
            pass
        elif c is None:
            choice = self.sampler.sample(logits, self.tokens)
        else:
            choice = self._sample_constrained(logits, c)
        if choice.token in self.eot:
            self.finish_reason = "stop"
            return TokenEvent(-1, self._closing_text(), finish_reason="stop")
        self.tokens.append(choice.token)
        self.generated.append(choice.token)
        piece = self.detok.feed(choice.token) if self.detok else ""
        if self.thought is not None:
            self.thought.record(piece, forced=forced is not None)
        ev = TokenEvent(choice.token, piece, choice.logprob, choice.top)
        if self.stop:
            ev.text, stopped = self.stop.feed(piece)
            if stopped:
                self.finish_reason = ev.finish_reason = "stop"
                return ev
        c = self.live_constraint
        if c is not None and c.done:   # the grammar is complete and can take nothing more
            self.finish_reason = ev.finish_reason = "stop"
            ev.text += self._closing_text()
            return ev
        if (mt is not None and len(self.generated) >= mt) or len(self.tokens) >= self.n_ctx:
            self.finish_reason = ev.finish_reason = "length"
            ev.context_full = len(self.tokens) >= self.n_ctx and (mt is None or len(self.generated) < mt)
            ev.text += self._closing_text()
        return ev

"""Speculative decoding: draft a few tokens cheaply, verify them in one forward of the target.

Two drafters propose tokens: `PromptLookup` (the tokens that followed the latest earlier
occurrence of the sequence's last n-gram, from the prompt and the output so far) and
`DraftModel` (a small model of the same vocabulary, decoding greedily on its own KV cache).

The accept rule. Both drafters are deterministic given the tokens so far, so the draft
distribution q is a point mass on the drafted token x. The standard rule (accept x with
probability min(1, p(x)/q(x)) = p(x), else draw from norm(max(0, p - q)) = p without x) is then
the same as drawing y from the target's own distribution p and accepting the draft while y == x:
P(y = x) = p(x), and y given y != x is p renormalized without x. So every verified position goes
through `Sequence.step`, the plain decoding path: penalties, logit bias, top-k/top-p/min-p,
temperature, grammars and stop strings apply exactly as without speculation, and the random
generator is consumed once per emitted token, as in plain decoding: with the same seed the output
is the same text, token for token, not only the same distribution.

Verification feeds [last token, d1..dk] in one forward and asks logits for every row. Its rows
equal plain decode's bit for bit because decode rows are computed batch-invariantly (a row never
depends on what else shares its forward; `api.Model` does so for decode steps, the server always). Rejected drafts
leave keys/values past the accepted length in the cache; attention reads only positions up to
each query's own, and the next forward overwrites them, so rolling back is forgetting that length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import engine
from .errors import InvalidInputError, ModelClosedError, VocabularyMismatchError

MODES = ("draft", "lookup")
DEFAULT_DRAFT_MAX = {"draft": 8, "lookup": 10}
LOOKUP_NGRAM_MAX = 4        # longest n-gram prompt lookup matches (longer first: fewer false matches)
DRAFT_P_MIN = 0.4           # a draft model stops drafting when its top token is less likely than this
VOCAB_PAD_MAX = 128         # draft and target vocab sizes may differ by padding rows, no more


def check_mode(mode) -> str | None:
    """None (plain decoding) or one of MODES; anything else is an InvalidInputError."""
    if mode is None or mode == "off":
        return None
    if mode not in MODES:
        raise InvalidInputError(f"speculative must be one of {', '.join(MODES)}, 'off' or None, got {mode!r}")
    return mode


def check_rollback(cfg, what: str = "this model") -> None:
    """InvalidInputError for a hybrid model (models/config.TransformerConfig.recurrent): speculative
    decoding rolls rejected drafts back, and a recurrent state (LFM2's convolution window) cannot be."""
    if getattr(cfg, "recurrent", False):
        raise InvalidInputError(f"speculative decoding is not supported with {what} ({cfg.arch}): rejected drafts "
                                "are rolled back, and its recurrent layers' state cannot be")


def check_draft_max(n, limit: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= limit:
        raise InvalidInputError(f"draft_max must be an integer in 1..{limit}, got {n!r}")
    return int(n)


@dataclass
class SpecStats:
    """Tokens drafted and accepted (drafts equal to what the target chose), over a run."""
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class DraftLength:
    """How many tokens to draft next: grows by one after a round where all were accepted, falls
    to one more than were accepted otherwise (the acceptance rate sets the length)."""

    def __init__(self, maximum: int, start: int | None = None):
        self.maximum = maximum
        self.k = min(maximum, start or maximum)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if accepted >= drafted:
            self.k = min(self.maximum, self.k + 1)
        else:
            self.k = max(1, min(self.maximum, accepted + 1))


class PromptLookup:
    """Drafts the continuation of the latest earlier match of the sequence's last n tokens
    (n from LOOKUP_NGRAM_MAX down to 1). One per sequence: it indexes the tokens as they grow."""

    def __init__(self, ngram_max: int = LOOKUP_NGRAM_MAX):
        self.ngram_max = ngram_max
        self._index: list[dict] = [{} for _ in range(ngram_max + 1)]   # per n: n-gram -> end of latest
        self._indexed = 0          # n-grams ending before this position are in the index
        self._seen: list[int] = []  # a copy of the tokens indexed

    def draft(self, tokens: list[int], k: int, slot: int = 0) -> list[int]:
        if self._seen != tokens[:len(self._seen)]:      # not a continuation (the caller reused us): reindex
            self._index = [{} for _ in range(self.ngram_max + 1)]
            self._indexed = 0
            self._seen = []
        self._seen.extend(tokens[len(self._seen):])
        # index every n-gram that has a continuation (ends before the last token)
        for end in range(max(self._indexed, 1), len(tokens)):
            for n in range(1, min(self.ngram_max, end) + 1):
                self._index[n][tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, len(tokens))
        for n in range(min(self.ngram_max, len(tokens)), 0, -1):
            end = self._index[n].get(tuple(tokens[-n:]))
            if end is not None:
                return list(tokens[end:end + k])
        return []


class DraftModel:
    """Greedy drafts from a smaller model of the same vocabulary, on its own KV cache (a slot per
    target slot; each slot remembers the tokens it holds, so a new round reuses them)."""

    def __init__(self, transformer, tokenizer, target_tokenizer, target_vocab: int, n_slots: int = 1,
                 threads: int | None = None, owner=None):
        check_vocabularies(tokenizer, target_tokenizer, transformer.cfg.vocab_size, target_vocab)
        if transformer.n_slots < n_slots:
            raise InvalidInputError(f"the draft model holds {transformer.n_slots} sequences, the target {n_slots}")
        self.model = transformer
        self.target_vocab = target_vocab
        self.p_min = DRAFT_P_MIN
        # threads of the draft's forwards (its backend's calls capped at it while it drafts); None: the
        # draft model's own. Its small ops pay the pool's fork/join more than the target's.
        self.threads = threads
        if threads is not None and self._native():
            from .backends.native import grow_pool
            grow_pool(threads, "draft_threads: ")
        self._cached: dict[int, list[int]] = {}
        # the draft's api.Model (load(..., draft=)): its own calls (m.draft.complete) use slot 0 too
        self.owner = owner

    def draft(self, tokens: list[int], k: int, slot: int = 0) -> list[int]:
        if self.owner is not None and self.owner._closed:     # m.draft.close() while m still drafts with it
            raise ModelClosedError("the draft model was closed: set_draft(None) to decode without it, "
                                   "or set_draft() a loaded one")
        owner = self.owner if slot == 0 else None
        if owner is None:
            return self._draft_on_threads(tokens, k, slot)
        # One at a time with the owner's calls, and each learns what the other left in slot 0:
        # else m.draft.complete() after a speculative call reused keys/values of another text.
        with owner._lock:
            self._cached[0], owner._cached = owner._cached, []     # [] until the draft completes
            try:
                return self._draft_on_threads(tokens, k, slot)
            finally:
                owner._cached = list(self._cached.get(0, []))

    def _native(self) -> bool:
        return getattr(self.model.backend, "name", "") == "native"

    def _draft_on_threads(self, tokens: list[int], k: int, slot: int) -> list[int]:
        if self.threads is None or not self._native():
            return self._draft(tokens, k, slot)
        with self.model.backend.run_on(self.threads):
            return self._draft(tokens, k, slot)

    def _draft(self, tokens: list[int], k: int, slot: int) -> list[int]:
        t = self.model
        room = t.n_ctx - len(tokens)
        k = min(k, room)
        if k <= 0:
            return []
        # the last token is fed for its logits
        common = min(engine.common_prefix(self._cached.get(slot, []), tokens), len(tokens) - 1)
        self._cached[slot] = []                  # invalid until the prefill below completes
        logits = engine.prefill(t, slot, tokens[common:], common)
        held = list(tokens)
        out: list[int] = []
        while True:
            tok = int(np.argmax(logits))
            if tok >= self.target_vocab or _top_probability(logits, tok) < self.p_min:
                break
            out.append(tok)
            if len(out) == k:
                break
            logits = engine.decode(t, np.array([slot], np.int32), np.array([tok], np.int32),
                                   np.array([len(held)], np.int32))[0]
            held.append(tok)
        self._cached[slot] = held
        return out


def _top_probability(logits: np.ndarray, tok: int) -> float:
    x = logits.astype(np.float64, copy=False)
    return float(1.0 / np.exp(x - x[tok]).sum())


def check_vocabularies(draft_tok, target_tok, draft_vocab: int, target_vocab: int) -> None:
    """Raise VocabularyMismatchError unless both models' token ids mean the same text."""
    if draft_tok is None and target_tok is None:    # token ids in, token ids out: the sizes must agree
        if draft_vocab != target_vocab:
            raise VocabularyMismatchError(f"the draft model has {draft_vocab} tokens, the target {target_vocab}")
        return
    if draft_tok is None or target_tok is None:
        raise VocabularyMismatchError("one of the target and the draft model has no tokenizer: their "
                                      "vocabularies cannot be compared")
    if abs(draft_vocab - target_vocab) > VOCAB_PAD_MAX:
        raise VocabularyMismatchError(f"the draft model has {draft_vocab} tokens, the target {target_vocab}: "
                                      "a draft model must share the target's vocabulary")
    a, b = draft_tok.vocab.tokens, target_tok.vocab.tokens
    n = min(len(a), len(b))
    if abs(len(a) - len(b)) > VOCAB_PAD_MAX:
        raise VocabularyMismatchError(f"the draft tokenizer has {len(a)} tokens, the target's {len(b)}")
    for i in range(n):
        if a[i] != b[i]:
            raise VocabularyMismatchError(f"token {i} is {a[i]!r} in the draft model and {b[i]!r} in the target: "
                                          "a draft model must share the target's vocabulary")
    if set(draft_tok.eot_ids) != set(target_tok.eot_ids):
        raise VocabularyMismatchError("the draft model ends text with other tokens than the target")


def verify(seq: engine.Sequence, drafts: list[int], logits: np.ndarray, stats: SpecStats | None = None,
           go_on=None) -> list:
    """Step `seq` through the target's logits rows (row i follows drafts[:i]) while the target's
    choice equals the draft; the events of the tokens it emitted (at least one). `go_on()` False
    stops before a row past the first (the server's step mask budget is spent): the next step
    feeds the last token again, and draws what the rows left would have."""
    events = []
    for i in range(len(drafts) + 1):
        if i and go_on is not None and not go_on():
            break
        ev = seq.step(logits[i])
        events.append(ev)
        if seq.finished or i == len(drafts) or ev.token != drafts[i]:
            break
    if stats is not None:
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += accepted_count(drafts, events)
    return events


def accepted_count(drafts: list[int], events: list) -> int:
    n = 0
    for d, ev in zip(drafts, events):
        if ev.token != d:
            break
        n += 1
    return n


class Speculation:
    """One sequence's speculative decoding: its drafter, its draft length and its counts."""

    def __init__(self, drafter, draft_max: int, stats: SpecStats | None = None):
        self.drafter = drafter
        self.length = DraftLength(draft_max)
        self.stats = stats if stats is not None else SpecStats()

    def propose(self, seq: engine.Sequence, room: int, slot: int = 0) -> list[int]:
        """Drafts to verify after the sequence's last token: at most `room`, none past max_tokens
        or the context."""
        k = min(self.length.k, room, _tokens_left(seq) - 1, seq.n_ctx - len(seq.tokens))
        return self.drafter.draft(seq.tokens, k, slot) if k > 0 else []

    def settle(self, seq: engine.Sequence, drafts: list[int], logits: np.ndarray, go_on=None) -> tuple[list, int]:
        """Step the sequence through the verification rows; (its events, drafts accepted). go_on: verify's."""
        events = verify(seq, drafts, logits, self.stats, go_on)
        kept = accepted_count(drafts, events)
        self.length.update(len(drafts), kept)
        return events, kept


def stream(model, seq: engine.Sequence, spec: Speculation):
    """Speculative decoding of one sequence on the library model's slot 0 (api.Model): yields
    TokenEvents as plain decoding would. The model's lock is held per round, never across a yield."""
    t = model.transformer
    while True:
        with model._lock:
            model._check_open()                 # closed since the last round: its arrays are gone
            held = len(seq.tokens)              # the last one's keys/values are computed below
            drafts = spec.propose(seq, t.ws.max_logit_rows - 1)
            model._sync(seq.tokens[:-1])
            n = len(drafts) + 1
            ids = np.asarray(seq.tokens[-1:] + drafts, np.int32)
            pos = np.arange(held - 1, held - 1 + n, dtype=np.int32)
            with model.rows_invariant():
                logits = t.forward(ids, np.zeros(n, np.int32), pos, np.arange(n))
            events, kept = spec.settle(seq, drafts, logits)
            del logits          # a view of the workspace: held across the yield, it kept it alive after close()
            model._cached = seq.tokens[:held + kept]   # accepted drafts were appended to seq.tokens
        yield from events
        if seq.finished:
            return


def _tokens_left(seq: engine.Sequence) -> int:
    """Tokens the sequence may still generate (drafts past that would be wasted)."""
    mt = seq.params.max_tokens
    return seq.n_ctx if mt is None else mt - len(seq.generated)

"""Choosing the next token from logits, and cutting text at stop strings.

The chain follows llama.cpp's default order: repetition/presence/frequency penalties, logit
bias, then (temperature <= 0) greedy argmax, or top-k -> top-p -> min-p -> temperature -> a
categorical draw. top-p and min-p see the temperature-1 distribution, as in llama.cpp, where
temperature is the last step before the draw. Reported logprobs are log_softmax of the logits as
the model produced them (before penalties, bias and truncation), like OpenAI and llama.cpp.

Speed matters at 262k vocab: no step sorts the whole vocabulary (top_p with top_k off sorts the
values of the tokens it may keep, not their ids). Top-k takes a threshold from a strided sample
(its k-th largest is a lower bound for the true k-th largest), so only a few hundred candidates
get partitioned and sorted. The chosen token's logprob needs one exp pass over the vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import LlambdaError
from .finite import finite_as_float

MAX_LOGPROBS = 20          # OpenAI's cap on top_logprobs
_DIRECT_EXP_RANGE = (-30.0, 60.0)   # max logit range where exp(x) needs no shift: no overflow/underflow
_BLOCK = 2048                       # block size of the two-level running-sum search


class SamplingError(LlambdaError, ValueError):
    """Sampling parameters or the arrays handed to the sampler are invalid."""


class _PrefixSums:
    """Running sums of non-negative weights, searchable like np.searchsorted(np.cumsum(w), t).

    A float64 cumsum runs at ~8 ns/element here (2 ms at 262k), so long arrays are searched in
    two levels: block sums (SIMD einsum) pick the block, a cumsum inside that block the index.
    """

    def __init__(self, weights: np.ndarray):
        self.weights = weights
        n = weights.size
        if n <= _BLOCK:
            self.blocks = None
            self.cum = np.cumsum(weights, dtype=np.float64)
            self.total = float(self.cum[-1])
            return
        full = n - n % _BLOCK
        sums = np.einsum("ij->i", weights[:full].reshape(-1, _BLOCK)).astype(np.float64)
        if full < n:
            sums = np.append(sums, float(weights[full:].sum(dtype=np.float64)))
        self.blocks = np.cumsum(sums)
        self.total = float(self.blocks[-1])

    def search(self, target: float, side: str) -> int:
        """First index whose running sum is >= (side="left") or > (side="right") target, clamped
        to the last index (block sums and inner sums round differently)."""
        if self.blocks is None:
            return min(int(np.searchsorted(self.cum, target, side=side)), self.cum.size - 1)
        b = min(int(np.searchsorted(self.blocks, target, side=side)), self.blocks.size - 1)
        start = b * _BLOCK
        inner = np.cumsum(self.weights[start:start + _BLOCK], dtype=np.float64)
        before = self.blocks[b - 1] if b else 0.0
        return start + min(int(np.searchsorted(inner, target - before, side=side)), inner.size - 1)

    def draw(self, u: float) -> int:
        """Index drawn with probability weight/total, u uniform in [0, 1); never a zero weight."""
        i = self.search(u * self.total, "right")
        if self.weights[i] == 0:   # only via the clamp (rounding): step back to a weighted entry
            i = int(np.flatnonzero(self.weights[: i + 1])[-1])
        return i


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40              # 0 = off
    top_p: float = 0.95          # 1.0 = off
    min_p: float = 0.05          # 0.0 = off; relative to the most likely token
    repeat_penalty: float = 1.0  # 1.0 = off
    repeat_last_n: int = 64      # window of history the penalties look at; 0 = off, -1 = all
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None      # None (or -1) = fresh entropy
    logprobs: int = 0            # number of top alternatives to report; the chosen token's logprob is always there
    logit_bias: dict[int, float] | None = None
    # False: skip the chosen token's logprob (NaN) unless logprobs > 0; it costs a pass over the
    # vocabulary per token that a server not asked for logprobs never reads
    chosen_logprob: bool = True

    def validate(self) -> None:
        """Raise SamplingError (a ValueError) naming the first out-of-range field."""
        def real(name, lo=None, hi=None, lo_open=False):
            v = getattr(self, name)
            if not (_is_real(v) and finite_as_float(v)):
                raise SamplingError(f"{name} must be a finite number, got {v!r}")
            v = float(v)
            if lo is not None and (v <= lo if lo_open else v < lo):
                raise SamplingError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
            if hi is not None and v > hi:
                raise SamplingError(f"{name} must be <= {hi}, got {v}")
            setattr(self, name, v)     # a Python float: 1 / np.float16(1e-5) is inf

        def integer(name, lo, hi=None):
            v = getattr(self, name)
            if not _is_int(v):
                raise SamplingError(f"{name} must be an integer, got {v!r}")
            if v < lo or (hi is not None and v > hi):
                raise SamplingError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
            setattr(self, name, int(v))   # a Python int: top_k=np.int8(40) overflowed (k * 128) in top-k

        real("temperature", 0.0)
        integer("top_k", 0)
        real("top_p", 0.0, 1.0)
        real("min_p", 0.0, 1.0)
        real("repeat_penalty", 0.0, lo_open=True)
        integer("repeat_last_n", -1)
        real("presence_penalty", -2.0, 2.0)
        real("frequency_penalty", -2.0, 2.0)
        integer("logprobs", 0, MAX_LOGPROBS)
        if not isinstance(self.chosen_logprob, bool):
            raise SamplingError(f"chosen_logprob must be a bool, got {self.chosen_logprob!r}")
        if self.seed is not None:
            integer("seed", -1, 2**64 - 1)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise SamplingError("logit_bias must be a dict of token id -> bias, "
                                    f"got {type(self.logit_bias).__name__}")
            for tok, bias in self.logit_bias.items():
                if not _is_int(tok) or tok < 0:
                    raise SamplingError(f"logit_bias keys must be non-negative token ids, got {tok!r}")
                # -inf bans a token; +inf or NaN would make the distribution meaningless.
                if not _is_real(bias) or not (finite_as_float(bias) or bias == -math.inf):
                    raise SamplingError(f"logit_bias[{tok}] must be a finite number or -inf, got {bias!r}")


@dataclass
class TokenChoice:
    token: int
    logprob: float                                   # log_softmax of the unmodified logits
    top: list[tuple[int, float]] = field(default_factory=list)   # (token, logprob), most likely first


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values of 1-D `x`, largest first; ties broken by the lower id."""
    n = x.size
    if k >= n:
        idx = np.arange(n)
    else:
        idx = np.flatnonzero(x >= _kth_largest_lower_bound(x, k))
        if idx.size > k:
            vals = x[idx]
            kth = np.partition(vals, idx.size - k)[idx.size - k]   # the true k-th largest value
            above = idx[vals > kth]
            tied = idx[vals == kth][: k - above.size]              # idx ascending: lowest ids win
            idx = np.concatenate((above, tied))
    return idx[np.lexsort((idx, -x[idx]))]


def _kth_largest_lower_bound(x: np.ndarray, k: int):
    """A value t with at least k elements >= t, cheaply.

    The k-th largest of any subset is <= the k-th largest of the whole, so a strided sample gives
    an exact lower bound; with ~128 samples per wanted element, about k*stride candidates pass it.
    """
    n = x.size
    stride = max(1, min(32, n // (k * 128)))
    sample = x[::stride] if stride > 1 else x
    s = sample.size
    return np.partition(sample, s - k)[s - k]


class Sampler:
    """Samples tokens for one sequence; owns its random generator (seeded: reproducible)."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.params = params
        seed = params.seed if params.seed is not None and params.seed >= 0 else None
        self._rng = np.random.default_rng(seed)
        if params.logit_bias:
            ids = np.fromiter((int(t) for t in params.logit_bias), dtype=np.int64)
            vals = np.fromiter((float(b) for b in params.logit_bias.values()), dtype=np.float64)
            self._bias = (ids, vals)
        else:
            self._bias = None
        self._scratch: np.ndarray | None = None

    # -- public -----------------------------------------------------------------------------

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), banned: np.ndarray | None = None) -> TokenChoice:
        """Choose the next token. `history` is the sequence so far (prompt + generated), for penalties;
        `banned` a bool mask over the vocabulary of tokens never to choose (a grammar's, applied
        after penalties and bias, like a -inf bias: logprobs stay those of the model)."""
        x = self._check_logits(logits)
        work = self._apply_penalties_and_bias(x, history)
        if banned is not None:
            if banned.shape != x.shape:
                raise SamplingError(f"the mask has {banned.size} entries for {x.size} logits")
            if work is x:
                work = x.copy()
            np.copyto(work, work.dtype.type(-math.inf), where=banned)
        p = self.params
        greedy = p.temperature <= 0
        if greedy and work is x:
            token = int(np.argmax(x))   # argmax finds a NaN or the max, saving a pass
            m = x[token]
        else:
            m = x.max()
        if not np.isfinite(m):
            what = "NaN" if np.isnan(m) else ("+inf" if m > 0 else "only -inf")
            raise SamplingError(f"logits contain {what}")
        m_work = float(m) if work is x else float(work.max())
        if m_work == math.inf:
            # a huge logit_bias or a tiny repeat_penalty went past the float range: inf - inf would
            # make the weights NaN (an IndexError, or always the first such token); the largest
            # finite value keeps them a tie, drawn as one
            np.minimum(work, np.finfo(work.dtype).max, out=work)
            m_work = float(work.max())
        if m_work == -math.inf:
            raise SamplingError("every token has -inf logit after penalties/logit_bias/grammar")
        top_k_ids = None
        if greedy:
            if work is not x:
                token = int(np.argmax(work))   # first maximum: ties go to the lowest id
        else:
            token, top_k_ids = self._draw(work, m_work)
        known_top = top_k_ids if work is x else None
        return self._report(x, float(m), token, known_top)

    def forced(self, logits: np.ndarray, token: int) -> TokenChoice:
        """`token` as the choice, not drawn (a thinking budget's closing tag): its logprob and the
        top alternatives as sample() reports them; the random generator does not advance."""
        x = self._check_logits(logits)
        m = x.max()
        if not np.isfinite(m):
            raise SamplingError(f"logits contain {'NaN' if np.isnan(m) else 'inf'}")
        return self._report(x, float(m), int(token), None)

    def _report(self, x: np.ndarray, m: float, token: int, top_k_ids: np.ndarray | None) -> TokenChoice:
        """The choice with its logprob (log_softmax of the unmodified logits `x`, max `m`) and top
        alternatives as asked; `top_k_ids`: the top-k already found over x, or None."""
        p = self.params
        if not p.chosen_logprob and p.logprobs == 0:
            return TokenChoice(token, math.nan)
        lse = self._logsumexp(x, m)
        top: list[tuple[int, float]] = []
        if p.logprobs > 0:
            if top_k_ids is not None and top_k_ids.size >= min(p.logprobs, x.size):
                best = top_k_ids[: p.logprobs]
            else:
                best = top_k_indices(x, p.logprobs)
            top = [(int(t), float(x[t]) - lse) for t in best]
        return TokenChoice(token, float(x[token]) - lse, top)

    @property
    def rejection_exact(self) -> bool:
        """Whether drawing from the whole distribution and, when the token is not allowed, drawing
        again under the mask gives exactly the masked distribution (rejection sampling): greedy,
        or no truncation (top-k, top-p and min-p off), whose masked distribution is the full one
        renormalized over the allowed tokens. With truncation, which tokens survive depends on the
        mask, so a grammar's mask must come first."""
        p = self.params
        return p.temperature <= 0 or (p.top_k == 0 and p.top_p >= 1.0 and p.min_p <= 0.0)

    # -- steps ------------------------------------------------------------------------------

    @staticmethod
    def _check_logits(logits) -> np.ndarray:
        x = np.asarray(logits)
        if x.ndim != 1 or x.size == 0:
            raise SamplingError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
        if x.dtype not in (np.float32, np.float64):
            if x.dtype.kind not in "fiu":
                raise SamplingError(f"logits must be floating point, got dtype {x.dtype}")
            x = x.astype(np.float32)
        return x

    def _penalty_window(self, history: Sequence[int], n_vocab: int) -> np.ndarray | None:
        last_n = self.params.repeat_last_n
        if last_n == 0 or len(history) == 0:
            return None
        window = history if last_n < 0 else history[-last_n:]
        h = np.asarray(window)
        if h.ndim != 1 or h.dtype.kind not in "iu":
            raise SamplingError(f"history must be a sequence of token ids, got dtype {h.dtype} shape {h.shape}")
        if h.min() < 0 or h.max() >= n_vocab:
            raise SamplingError(f"history holds a token id outside [0, {n_vocab})")
        return h

    def adjust_logits(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The logits after penalties and logit_bias, as the rest of the chain sees them (a copy)."""
        x = self._check_logits(logits)
        work = self._apply_penalties_and_bias(x, history)
        return work.copy() if work is x else work

    def _apply_penalties_and_bias(self, x: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Return x itself when nothing changes it (the common case: no copy), else a modified copy."""
        p = self.params
        penalize = p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        window = self._penalty_window(history, x.size) if penalize else None
        if window is None and self._bias is None:
            return x
        work = x.copy()
        if window is not None:
            toks, counts = np.unique(window, return_counts=True)
            v = work[toks].astype(np.float64)
            if p.repeat_penalty != 1.0:
                # llama.cpp: shrink positive logits, push negative ones further down.
                v = np.where(v <= 0, v * p.repeat_penalty, v / p.repeat_penalty)
            v -= counts * p.frequency_penalty + p.presence_penalty
            with np.errstate(over="ignore"):     # past float32: -inf bans, +inf is capped in sample()
                work[toks] = v
        if self._bias is not None:
            ids, vals = self._bias
            if ids.max() >= x.size:
                raise SamplingError(f"logit_bias names token {int(ids.max())}, outside the vocabulary of {x.size}")
            with np.errstate(over="ignore"):
                work[ids] += vals.astype(work.dtype)
        return work

    def _draw(self, work: np.ndarray, m: float) -> tuple[int, np.ndarray | None]:
        """top-k -> top-p -> min-p -> temperature -> categorical; `m` = work.max().

        Returns (token, the top-k ids or None)."""
        p = self.params
        cand = None      # candidate ids, or a boolean mask over the vocabulary; None = everything
        top_k_ids = None
        if 0 < p.top_k < work.size:
            cand = top_k_ids = top_k_indices(work, p.top_k)   # sorted, most likely first
        if p.top_p < 1.0:
            cand = self._top_p(work, m, cand)
        if p.min_p > 0.0:
            threshold = m + math.log(p.min_p)   # p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p)
            if cand is None:
                cand = np.flatnonzero(work >= threshold)
            elif cand.dtype == np.bool_:
                cand &= work >= threshold
            else:
                cand = cand[work[cand] >= threshold]
        u = self._rng.random()
        if cand is None or cand.dtype == np.bool_:   # over the whole vocabulary, maybe masked
            weights = self._exp_shifted(work, m, p.temperature)
            if cand is not None:
                weights *= cand
            return _PrefixSums(weights).draw(u), None
        weights = np.exp((work[cand].astype(np.float64) - m) / p.temperature)
        return int(cand[_PrefixSums(weights).draw(u)]), top_k_ids

    def _top_p(self, work: np.ndarray, m: float, cand: np.ndarray | None) -> np.ndarray:
        """The shortest most-likely-first prefix whose probability (at temperature 1) reaches top_p:
        ids, or a boolean mask over the vocabulary when the prefix is a large part of it."""
        top_p = self.params.top_p
        if cand is not None:   # already sorted: softmax over the candidates, as llama.cpp does
            sums = _PrefixSums(np.exp(work[cand].astype(np.float64) - m))
            return cand[: sums.search(top_p * sums.total, "left") + 1]
        weights = self._exp_shifted(work, m, 1.0)
        target = top_p * float(np.einsum("i->", weights))
        # Any set of most likely tokens holding the target mass contains the prefix: find a
        # small one, widening it until it holds enough.
        floor = 1e-4
        while True:
            upper = weights >= floor
            mass = float(np.sum(weights, where=upper))
            if mass >= target or floor < 1e-36:
                break
            floor *= 1e-6   # coarse steps: a too-large set only costs a longer sort
        if mass < target:   # sums rounded differently with top_p ~ 1: keep every token with mass
            upper = weights > 0
        small = np.count_nonzero(upper) <= max(_BLOCK, work.size // 8)
        ids = np.flatnonzero(upper) if small else None
        w = weights[ids] if small else weights
        # The prefix is "every weight above a cut-off value v, plus the lowest ids tied at v":
        # sorting the values alone finds v (sorting ids along with them is ~50x slower).
        desc = np.sort(w)[::-1]
        c = _PrefixSums(desc).search(target, "left")
        keep = w > desc[c]
        tied = np.flatnonzero(w == desc[c])[: c + 1 - np.count_nonzero(keep)]
        if small:
            return np.concatenate((ids[keep], ids[tied]))   # in id order: the draw needs no sorting
        keep[tied] = True
        return keep

    def _exp_shifted(self, work: np.ndarray, m: float, temperature: float) -> np.ndarray:
        """exp((work - m) / temperature) in the scratch buffer (valid until the next call)."""
        buf = self._buffer_like(work)
        np.subtract(work, work.dtype.type(m), out=buf)
        if temperature != 1.0:
            # kept a normal float: below ~3e-39, 1/temperature is inf in float32 and 0 * inf (the top
            # token) NaN; above ~1e38 it rounds to 0 and -inf * 0 (a banned token) NaN. The products
            # that overflow to -inf are weights of 0, as they should be.
            fi = np.finfo(work.dtype)
            with np.errstate(over="ignore"):
                np.multiply(buf, work.dtype.type(min(max(1.0 / temperature, float(fi.tiny)), float(fi.max))), out=buf)
        return np.exp(buf, out=buf)

    def _buffer_like(self, x: np.ndarray) -> np.ndarray:
        buf = self._scratch
        if buf is None or buf.shape != x.shape or buf.dtype != x.dtype:
            buf = self._scratch = np.empty_like(x)
        return buf

    def _logsumexp(self, x: np.ndarray, m: float) -> float:
        buf = self._buffer_like(x)
        lo, hi = _DIRECT_EXP_RANGE
        if lo < m < hi:   # skip the shift: one pass less over the vocabulary
            np.exp(x, out=buf)
            return math.log(float(np.einsum("i->", buf)))   # einsum: SIMD sum, ~3x numpy's sum here
        np.subtract(x, x.dtype.type(m), out=buf)
        np.exp(buf, out=buf)
        return m + math.log(float(np.einsum("i->", buf)))


class StopMatcher:
    """Cuts streamed text at the first stop string, never emitting any part of it.

    `feed(piece)` returns the text that is safe to show now and whether a stop was hit. Text
    that could be the start of a stop string is held back until the next piece settles it;
    `flush()` releases it at the end of generation. Generation stops as soon as any stop string
    is complete: the match that ends first wins (on a tie, the one that starts first), the text
    before it is emitted and the rest dropped. That rule makes the result independent of how the
    text was split into pieces.
    """

    def __init__(self, stops: Sequence[str]):
        if isinstance(stops, str) or not isinstance(stops, (list, tuple)):
            raise SamplingError(f"stop must be a list of strings, got {type(stops).__name__}")
        for s in stops:
            if not isinstance(s, str) or not s:
                raise SamplingError(f"stop strings must be non-empty strings, got {s!r}")
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(stops))   # dedupe, keep order
        self.matched: str | None = None    # the stop string that ended the text
        self._held = ""

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, piece: str) -> tuple[str, bool]:
        if self.matched is not None:
            return "", True
        text = self._held + piece
        best = None   # (end, start, stop) of the match that ends first
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0 and (best is None or (at + len(stop), at) < best[:2]):
                best = (at + len(stop), at, stop)
        if best is not None:
            self.matched, self._held = best[2], ""
            return text[:best[1]], True
        hold = self._partial_suffix(text)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold], False

    def flush(self) -> str:
        """The held-back tail (generation ended without completing a stop string)."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:length]):
                    best = length
                    break
        return best

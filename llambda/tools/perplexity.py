"""Perplexity the way llama.cpp's perplexity tool computes it.

The text is tokenized once (BOS first only if the model asks for one) and cut
into non-overlapping windows of n_ctx tokens; each window is evaluated from an
empty cache (its first token replaced by BOS when the model uses one) and only
its second half is scored: the logits at position j predict token j+1 for
n_ctx/2 <= j < n_ctx-1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InvalidInputError, LlambdaError


@dataclass
class PerplexityResult:
    ppl: float
    nll: float            # mean negative log-likelihood per scored token
    n_scored: int
    n_windows: int


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return x[np.arange(len(targets)), targets] - lse


def perplexity(model, text: str, n_ctx: int = 512, max_windows: int | None = None,
               progress: Callable[[int, float], None] | None = None) -> PerplexityResult:
    if max_windows is not None and (isinstance(max_windows, bool) or not isinstance(max_windows, (int, np.integer))
                                    or max_windows < 1):
        # a negative count once scored no window at all and ended in a ZeroDivisionError
        raise InvalidInputError(f"max_windows (--chunks) must be a positive number of windows, got {max_windows!r}")
    tok = model._tok()
    ids = tok.encode(text, add_bos=tok.add_bos, parse_special=False)
    if n_ctx < 4 or n_ctx > model.n_ctx:
        raise LlambdaError(f"--ctx {n_ctx} must be between 4 and the model's loaded context {model.n_ctx}")
    n_windows = len(ids) // n_ctx
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows == 0:
        raise LlambdaError(f"the text has {len(ids)} tokens; perplexity needs at least one window of {n_ctx}")
    tr = model.transformer
    first = n_ctx // 2
    rows = np.arange(first, n_ctx - 1)
    step = tr.ws.max_tokens
    # one forward step's rows at a time: the whole half-window's (rows x vocab) logits plus their float64 copy
    # took 3 GB at -c 4096 on a 49k vocabulary and grew with -c past any memory plan
    logits = np.empty((min(step, len(rows)), model.config.vocab_size), np.float32)
    total, count = 0.0, 0
    with model._lock:
        model._cached = []
        for w in range(n_windows):
            window = np.array(ids[w * n_ctx:(w + 1) * n_ctx], dtype=np.int32)
            if tok.add_bos and tok.bos_id is not None:
                window[0] = tok.bos_id
            for s in range(0, n_ctx, step):
                part = window[s:s + step]
                m = len(part)
                want = rows[(rows >= s) & (rows < s + m)]
                pos = np.arange(s, s + m, dtype=np.int32)
                if len(want):
                    out = tr.forward(part, np.zeros(m, np.int32), pos, want - s, out=logits[:len(want)])
                    total -= float(_log_softmax_at(out, window[want + 1]).sum())
                else:
                    tr.forward(part, np.zeros(m, np.int32), pos, [m - 1])
            count += len(rows)
            if progress:
                progress(w + 1, math.exp(total / count))
    nll = total / count
    return PerplexityResult(math.exp(nll), nll, count, n_windows)

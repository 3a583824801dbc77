"""How far a model's logits are from the FP32 oracle's (our NumPy backend on the same file).

The error at a position is the worst |difference| over the oracle's top-20 logits there; callers take
its mean and worst over every position of a few prompts. Used by the fast-mode accuracy tests and
bench/bench_accuracy.py (ours in each mode, and llama.cpp's through llama-cpp-python, on the same file).
"""
from __future__ import annotations

import numpy as np

from ..api import load


def all_logits(m, ids) -> np.ndarray:
    """Logits at every position of `ids`, one forward from an empty cache."""
    n = len(ids)
    return np.array(m.transformer.forward(np.asarray(ids, np.int32), np.zeros(n, np.int32),
                                          np.arange(n, dtype=np.int32), list(range(n))))


def top20_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    top = np.argsort(want, axis=1)[:, -20:]
    return np.abs(np.take_along_axis(got, top, 1) - np.take_along_axis(want, top, 1)).max(axis=1)


def oracle(path, prompts, n_ctx: int = 256):
    """The prompts' token ids and the FP32 oracle's logits for each."""
    with load(path, backend="numpy", n_ctx=n_ctx) as m:
        ids = [m.tokenize(p) for p in prompts]
        return ids, [all_logits(m, i) for i in ids]


def errors(path, ids, refs, n_ctx: int = 256, **kw) -> np.ndarray:
    """Our error at every position (load keywords: backend, activations, ...)."""
    with load(path, n_ctx=n_ctx, **kw) as m:
        return np.concatenate([top20_error(all_logits(m, i), r) for i, r in zip(ids, refs)])


def llama_cpp_errors(path, ids, refs, threads: int = 1, n_ctx: int = 256) -> np.ndarray:
    """llama.cpp's error at every position (llama-cpp-python, logits_all)."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), logits_all=True, n_ctx=n_ctx, n_threads=threads, verbose=False)
    try:
        out = []
        for i, r in zip(ids, refs):
            llm.reset()
            llm.eval(i)
            out.append(top20_error(np.asarray(llm.scores[:len(i)], np.float32), r))
        return np.concatenate(out)
    finally:
        llm.close() if hasattr(llm, "close") else None

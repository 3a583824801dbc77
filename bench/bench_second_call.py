"""Decode speed of a first and a second generate() on one loaded model at a given depth.

Issue 16 reported a second `generate` at depth 4096 decoding at half the speed of the first
on Qwen2.5-Coder-0.5B (2 threads) while depth 2048 ran both at the same speed. This runs the
library's own path (Model.generate: prefix reuse on slot 0, prefill, decode) `--calls` times
with prompts of `--depth` tokens and prints each call's prefill and decode tokens/s, so a
call that is slower than the first shows at once, with the thread pool's stalls during it (a
worker descheduled mid-chunk: other load on the machine). Not a test: run it by hand.

    python bench/bench_second_call.py -m qwen2.5-coder-0.5b -d 4096 -n 64 -t 2
    python bench/bench_second_call.py -d 4096 --same-prompt    # the second call reuses the prefix
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout this script is in
import llambda  # noqa: E402

try:
    from llambda import _native
except ImportError:  # numpy backend only
    _native = None


def stalls() -> int:
    """Pool calls so far that found a worker descheduled mid-chunk: a busy machine, not the engine."""
    return _native.pool_stalls() if _native is not None else 0


def run(model: str, depth: int, n_gen: int, threads: int | None, calls: int, same_prompt: bool, seed: int,
        n_ctx: int | None) -> None:
    m = llambda.load(model, threads=threads, n_ctx=n_ctx or depth + n_gen + 16)
    rng = np.random.default_rng(seed)
    vocab = m.config.vocab_size
    base = [int(t) for t in rng.integers(100, min(vocab, 30000), depth)]
    print(f"{model}: depth {depth}, context {m.n_ctx}, {n_gen} tokens per call, threads {m.backend.threads}")
    for call in range(calls):
        ids = base if same_prompt else [int(t) for t in rng.integers(100, min(vocab, 30000), depth)]
        s0 = stalls()
        t0 = time.perf_counter()
        first = None
        count = 0
        for _ in m.generate(ids, max_tokens=n_gen, temperature=0.0, ignore_eos=True):
            count += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        decode = (count - 1) / (end - first) if count > 1 else float("nan")
        print(f"  call {call + 1}: prefill {depth / (first - t0):8.1f} tok/s   decode {decode:7.1f} tok/s"
              f"   (pool stalls: {stalls() - s0})")
    m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("-d", "--depth", type=int, default=4096)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--same-prompt", action="store_true", help="one prompt for every call (prefix reuse)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-c", "--ctx-size", type=int, default=None, help="context (default depth + n-gen + 16)")
    a = ap.parse_args()
    run(a.model, a.depth, a.n_gen, a.threads, a.calls, a.same_prompt, a.seed, a.ctx_size)


if __name__ == "__main__":
    main()

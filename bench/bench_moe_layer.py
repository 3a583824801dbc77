"""An MoE layer's decode step alone: Qwen3-30B-A3B's experts at 1 and 2 threads (not a test).

    python bench/bench_moe_layer.py [--layers 2] [--reps 7] [--tokens 1] [--steps 48]

Packs --layers layers of 128 random experts (gate, up 768x2048 Q4_K; down 2048x768 Q6_K: ~390 MB a layer)
and runs the native backend's moe op on one token's row with random router logits, --steps calls per
repetition cycling over the layers, each thread count in turn, the order alternated per repetition. Prints
per thread count the median microseconds per call, the GB/s of the 8 chosen experts' bytes, the process's
CPU time per call, the pool's join waits per call (2 threads), and the C core's read probe at the same
working set: the bound a call's active bytes could stream at.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402
from llambda.backends.native import NativeBackend  # noqa: E402
from llambda.formats.quants import QType, random_blocks  # noqa: E402
from llambda.formats.weights import WeightTensor  # noqa: E402

D, FF, E, K = 2048, 768, 128, 8


class Scratch:
    def __init__(self, n):
        self.moe_f = np.zeros(n * K * (2 * D + 2 * FF + 1), np.float32)
        self.moe_i = np.zeros(3 * n * K + E + 1, np.int32)


def experts(rng, qtype, rows, cols):
    bs, ts = {QType.Q4_K: (256, 144), QType.Q6_K: (256, 210)}[qtype]
    raw = random_blocks(rng, qtype, E * rows * cols // bs, spread=1e-2).reshape(-1)
    assert raw.size == E * rows * cols // bs * ts
    return WeightTensor("w", qtype, (E, rows, cols), raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    be = NativeBackend(activations="q8")
    layers = [be.prepare_experts(experts(rng, QType.Q4_K, FF, D), experts(rng, QType.Q4_K, FF, D),
                                 experts(rng, QType.Q6_K, D, FF)) for _ in range(args.layers)]
    per_expert = 2 * FF * D // 256 * 144 + D * FF // 256 * 210
    n = args.tokens
    x = rng.standard_normal((n, D), dtype=np.float32)
    logits = [rng.standard_normal((n, E), dtype=np.float32) for _ in range(args.steps)]
    out, ws = np.empty((n, D), np.float32), Scratch(n)
    active = [len(np.unique(np.argsort(-lg, axis=1)[:, :K])) * per_expert for lg in logits]
    total = args.layers * E * per_expert
    print(f"{args.layers} layers of {E} experts ({total / 1e6:.0f} MB), {n} token(s), {K} experts each: "
          f"{statistics.mean(active) / 1e6:.1f} MB per call; isa {nat.isa()}; load {os.getloadavg()[0]:.1f}")

    def run():
        for s, lg in enumerate(logits):
            be.moe(x, lg, layers[s % args.layers], K, "softmax_topk", True, out, scratch=ws)

    res = {1: [], 2: []}
    for rep in range(args.reps):
        for th in ((1, 2) if rep % 2 == 0 else (2, 1)):
            nat.set_threads(th)
            run()
            s0, c0, t0 = nat.pool_stats(), time.process_time(), time.perf_counter()
            run()
            wall, cpu, s1 = time.perf_counter() - t0, time.process_time() - c0, nat.pool_stats()
            res[th].append((wall, cpu, s1["join_wait_us"] - s0["join_wait_us"], s1["calls"] - s0["calls"]))
    for th in (1, 2):
        probe = max(nat.read_bandwidth(total, th, 2))
        wall = statistics.median(r[0] for r in res[th]) / args.steps
        cpu = statistics.median(r[1] for r in res[th]) / args.steps
        wait = statistics.median(r[2] for r in res[th]) / args.steps
        calls = statistics.median(r[3] for r in res[th]) / args.steps
        gbs = statistics.mean(active) / wall / 1e9
        print(f"{th} thread(s): {wall * 1e6:7.1f} us/call (CPU {cpu * 1e6:7.1f}), {gbs:5.1f} GB/s = "
              f"{100 * gbs / probe:3.0f}% of the {probe:.1f} GB/s probe; {calls:.1f} parallel calls, "
              f"join waits {wait:.0f} us per call")
    be.close()


if __name__ == "__main__":
    main()

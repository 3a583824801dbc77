"""A decode step's GEMVs per tensor shape at 1 and 2 threads, over a model-sized working set (not a test).

    python bench/bench_decode_shapes.py [--type Q4_K] [--head Q6_K] [--layers 28] [--reps 6]

Packs random weights of one type in Qwen2.5-Coder-1.5B's decode shapes (per layer q, k, v, o, gate, up,
down; then the 151936-row head, of --head's type), ~0.9 GB for Q4_K, and runs them as a decode step
does (one activation row, fast mode), each thread count in turn, the order alternated per repetition.
Per shape class: milliseconds per step and GB/s of packed weights (medians); the process's CPU time per
step; and the pool's counters per 2-thread step (calls, chunks one thread took over from the other's
share, calls the caller ran alone, stalls), which tell a second thread that never ran (a loaded machine)
from one that ran and did not help. Beside: the C core's read probe at the same working set.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402
from llambda.formats.quants import random_blocks  # noqa: E402

TABLE = {t["name"]: t for t in nat.qtypes()}
HIDDEN, KV, FFN, VOCAB = 1536, 256, 8960, 151936
LAYER = [("q/o", HIDDEN, HIDDEN), ("k/v", KV, HIDDEN), ("k/v", KV, HIDDEN), ("q/o", HIDDEN, HIDDEN),
         ("gate/up", FFN, HIDDEN), ("gate/up", FFN, HIDDEN), ("down", HIDDEN, FFN)]
POOL = ("calls", "stolen_chunks", "solo_calls", "stalls")


def packed(tname, rows, cols, rng):
    q = TABLE[tname]["id"]
    raw = random_blocks(rng, tname, rows * cols // TABLE[tname]["block"], spread=1e-2).reshape(rows, -1)
    dst = np.empty(nat.packed_size(q, rows, cols), np.uint8)
    return q, nat.pack(q, raw, dst, rows, cols), dst, rows, cols


def step(ops, xs, outs, acc):
    for name, (q, layout, w, rows, cols) in ops:
        t0 = time.perf_counter()
        nat.matmul(q, layout, w, rows, cols, xs[cols], outs[rows], 1, 0)
        acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", default="Q4_K", choices=sorted(TABLE))
    ap.add_argument("--head", default=None, help="the head's type (default: --type)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--reps", type=int, default=6)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ops = [(name, packed(args.type, r, c, rng)) for _ in range(args.layers) for name, r, c in LAYER]
    ops.append(("head", packed(args.head or args.type, VOCAB, HIDDEN, rng)))
    nbytes = {}
    for name, op in ops:
        nbytes[name] = nbytes.get(name, 0) + op[2].nbytes
    total = sum(nbytes.values())
    xs = {c: rng.standard_normal((1, c), dtype=np.float32) for c in (HIDDEN, FFN)}
    outs = {r: np.empty((1, r), np.float32) for r in (KV, HIDDEN, FFN, VOCAB)}
    print(f"{args.type} (head {args.head or args.type}), {args.layers} layers, {total / 1e6:.0f} MB per step, isa {nat.isa()}; "
          f"load average {os.getloadavg()[0]:.1f}")
    nat.set_threads(2)
    times, cpu, pool, probe = {}, {1: [], 2: []}, [], {1: [], 2: []}
    for rep in range(args.reps):
        for th in ((1, 2) if rep % 2 == 0 else (2, 1)):
            nat.set_threads(th)
            step(ops, xs, outs, {})                      # warm: the pool's threads up, caches as a step leaves them
            s0, c0, acc = nat.pool_stats(), time.process_time(), {}
            step(ops, xs, outs, acc)
            cpu[th].append(time.process_time() - c0)
            if th == 2:
                s1 = nat.pool_stats()
                pool.append({k: s1.get(k, 0) - s0.get(k, 0) for k in POOL})
            acc["total"] = sum(acc.values())
            for k, v in acc.items():
                times.setdefault((th, k), []).append(v)
            probe[th].append(max(nat.read_bandwidth(total, th, 2)))
    nbytes["total"] = total
    med = lambda v: float(np.median(v))  # noqa: E731
    print("| threads | " + " | ".join(f"{k} ms (GB/s)" for k in nbytes) + " | CPU ms | read probe GB/s |")
    print("|---|" + "---|" * (len(nbytes) + 2))
    for th in (1, 2):
        cells = [f"{med(times[th, k]) * 1e3:.2f} ({b / med(times[th, k]) / 1e9:.1f})" for k, b in nbytes.items()]
        print(f"| {th} | " + " | ".join(cells) + f" | {med(cpu[th]) * 1e3:.1f} | {med(probe[th]):.1f} |")
    print("pool per 2-thread step (medians): " + ", ".join(f"{k} {med([p[k] for p in pool]):.0f}" for k in POOL))
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

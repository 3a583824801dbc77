"""The decode step's GEMVs from DRAM per quantized type, beside the C read probe (not a test).

    python bench/bench_gemv_dram.py [--types Q4_K Q6_K ...] [--threads 1 2] [--layers 28] [--head] [--reps 5]

Packs random weights of each type in Qwen2.5-Coder-1.5B's shapes (per layer q, k, v, o, gate, up, down;
--head adds the 151936-row output) into one buffer advised into 2 MB pages, as the weight arena is, and runs
them in turn with one activation row (fast mode): a working set past the 480 MiB L3 of the development
host streams from DRAM as a decode step does. Per type and thread count (alternated per repetition): GB/s
of packed weights per wall second and per CPU second (the process's), medians, per shape class, beside
`_native.read_bandwidth` at the same size. On a shared machine read the CPU column.
"""
import argparse
import gc
import mmap
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402
from llambda.formats.quants import random_blocks  # noqa: E402

TABLE = {t["name"]: t for t in nat.qtypes()}
HIDDEN, KV, FFN, VOCAB = 1536, 256, 8960, 151936
LAYER = [("q/o", HIDDEN, HIDDEN), ("k/v", KV, HIDDEN), ("k/v", KV, HIDDEN), ("q/o", HIDDEN, HIDDEN),
         ("gate/up", FFN, HIDDEN), ("gate/up", FFN, HIDDEN), ("down", HIDDEN, FFN)]


def pack_all(tname, shapes, rng):
    """(name, layout, packed view, rows, cols) per shape, all in one buffer of 2 MB pages."""
    q, blk = TABLE[tname]["id"], TABLE[tname]["block"]
    sizes = [nat.packed_size(q, r, c) for _, r, c in shapes]
    offs = np.cumsum([0] + [(s + 4095) // 4096 * 4096 for s in sizes])
    buf = mmap.mmap(-1, int(offs[-1]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    arr, raws, ops = np.frombuffer(buf, np.uint8), {}, []
    for (name, r, c), s, o in zip(shapes, sizes, offs):
        if (r, c) not in raws:  # one random matrix per shape, packed into every copy
            raws[r, c] = random_blocks(rng, tname, r * c // blk, spread=1e-2).reshape(r, -1)
        ops.append((name, nat.pack(q, raws[r, c], arr[o:o + s], r, c), arr[o:o + s], r, c))
    return q, ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS", "Q4_0", "Q8_0"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--head", action="store_true", help="add the output matrix (151936 x 1536)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    nat.set_threads(max(args.threads))
    shapes = [s for _ in range(args.layers) for s in LAYER] + ([("head", VOCAB, HIDDEN)] if args.head else [])
    xs = {c: rng.standard_normal((1, c), dtype=np.float32) for c in (HIDDEN, FFN)}
    outs = {r: np.empty((1, r), np.float32) for r in (KV, HIDDEN, FFN, VOCAB)}
    med = lambda v: float(np.median(v))  # noqa: E731
    print(f"isa {nat.isa()}, load average {os.getloadavg()[0]:.1f}")
    print("| type | threads | MB | GB/s (wall) | GB/s (CPU) | probe GB/s | per shape GB/s (wall) |")
    print("|---|---|---|---|---|---|---|")
    for tname in args.types:
        q, ops = pack_all(tname, shapes, rng)
        nbytes = {}
        for name, _, w, _, _ in ops:
            nbytes[name] = nbytes.get(name, 0) + w.nbytes
        total = sum(nbytes.values())

        def step(acc):
            for name, layout, w, rows, cols in ops:
                t0 = time.perf_counter()
                nat.matmul(q, layout, w, rows, cols, xs[cols], outs[rows], 1, 0)
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0

        wall, cpu, per = ({th: [] for th in args.threads} for _ in range(3))
        for rep in range(args.reps):
            for th in (args.threads if rep % 2 == 0 else args.threads[::-1]):
                nat.set_threads(th)
                step({})  # the pool's threads up
                acc, c0, t0 = {}, time.process_time(), time.perf_counter()
                step(acc)
                wall[th].append(time.perf_counter() - t0)
                cpu[th].append(time.process_time() - c0)
                per[th].append(acc)
        for th in args.threads:
            probe = max(nat.read_bandwidth(total, th, 3))
            shape = " ".join(f"{k} {b / med([a[k] for a in per[th]]) / 1e9:.1f}" for k, b in nbytes.items())
            print(f"| {tname} | {th} | {total / 1e6:.0f} | {total / med(wall[th]) / 1e9:.1f} | "
                  f"{total / med(cpu[th]) / 1e9:.1f} | {probe:.1f} | {shape} |", flush=True)
        del ops
        gc.collect()
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

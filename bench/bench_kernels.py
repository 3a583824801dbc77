"""Micro-benchmark of the native matmul kernels (not a test).

    python bench/bench_kernels.py [--threads 1 2] [--isa avx512 avx2] [--quick]
    python bench/bench_kernels.py --dram [--types Q4_K Q6_K ...] [--threads 1 2] [--layers 28] [--head] [--reps 5]

GEMV (n=1, decode): microseconds per call and GB/s of packed weights read,
for the real models' shapes with the weights hot in cache, and for a cold
4096x4096 Q4_1 matrix (cycling through copies larger than the caches).
GEMM (n=512, prefill): GOP/s counting a multiply-add as 2 operations.
--dram: per quantized type, the decode step's GEMVs from DRAM: random weights of each type in
Qwen2.5-Coder-1.5B's shapes (--head adds the 151936-row output) packed into one buffer of 2 MB pages, a
working set past the 480 MiB L3 of the development host; GB/s per wall and per CPU second (on a shared
machine read the CPU column), medians of alternated repetitions, per shape class, beside the C core's
read probe (_native.read_bandwidth) at the same size: the kernel's share of the memory-bandwidth bound.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # NumPy's BLAS threads would compete with the pool's
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402

from llambda.formats.quants import random_blocks  # noqa: E402

# Every type the C core runs, from its type table (name -> row: id, block, simd ISAs).
TABLE = {t["name"]: t for t in nat.qtypes()}
TYPES = {name: t["id"] for name, t in TABLE.items()}


def random_weights(tname, rows, cols, rng):
    """Random file-layout bytes with finite, small scales (values do not matter for speed)."""
    if tname == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8)
    if tname in ("F16", "BF16"):
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        return (w.astype(np.float16) if tname == "F16" else (w.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8)
    return random_blocks(rng, tname, rows * cols // TABLE[tname]["block"], spread=1e-2).reshape(rows, -1)


def packed(tname, rows, cols, rng):
    raw = random_weights(tname, rows, cols, rng)
    dst = np.empty(nat.packed_size(TYPES[tname], rows, cols), np.uint8)
    t0 = time.perf_counter()
    layout = nat.pack(TYPES[tname], raw, dst, rows, cols)
    return layout, dst, time.perf_counter() - t0, raw.nbytes


def timeit(fn, min_time=0.2, min_calls=5):
    fn()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        el = time.perf_counter() - t0
        if el >= min_time and calls >= min_calls:
            return el / calls


def bench_gemv(tname, rows, cols, exact, rng, min_time):
    layout, w, _, _ = packed(tname, rows, cols, rng)
    x = rng.standard_normal((1, cols), dtype=np.float32)
    out = np.empty((1, rows), np.float32)
    q = TYPES[tname]
    dt = timeit(lambda: nat.matmul(q, layout, w, rows, cols, x, out, 1, exact), min_time)
    return dt * 1e6, w.nbytes / dt / 1e9


def bench_cold_gemv(tname, rows, cols, copies, rng, min_time):
    mats = [packed(tname, rows, cols, rng)[:2] for _ in range(copies)]
    x = rng.standard_normal((1, cols), dtype=np.float32)
    out = np.empty((1, rows), np.float32)
    q = TYPES[tname]
    state = {"k": 0}

    def one():
        layout, w = mats[state["k"] % copies]
        state["k"] += 1
        nat.matmul(q, layout, w, rows, cols, x, out, 1, 0)

    dt = timeit(one, min_time, min_calls=2 * copies)
    return dt * 1e6, mats[0][1].nbytes / dt / 1e9


# --dram: Qwen2.5-Coder-1.5B's decode-step matrices per layer (q, k, v, o, gate, up, down).
HIDDEN, KV, FFN, VOCAB = 1536, 256, 8960, 151936
DRAM_LAYER = [("q/o", HIDDEN, HIDDEN), ("k/v", KV, HIDDEN), ("k/v", KV, HIDDEN), ("q/o", HIDDEN, HIDDEN),
              ("gate/up", FFN, HIDDEN), ("gate/up", FFN, HIDDEN), ("down", HIDDEN, FFN)]


def pack_in_pages(tname, shapes, rng):
    """(name, layout, packed view, rows, cols) per shape, all in one buffer advised into 2 MB pages as the
    weight arena is; one random matrix per shape, packed into every copy."""
    import mmap
    q = TYPES[tname]
    sizes = [nat.packed_size(q, r, c) for _, r, c in shapes]
    offs = np.cumsum([0] + [(s + 4095) // 4096 * 4096 for s in sizes])
    buf = mmap.mmap(-1, int(offs[-1]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    arr, raws, ops = np.frombuffer(buf, np.uint8), {}, []
    for (name, r, c), s, o in zip(shapes, sizes, offs):
        if (r, c) not in raws:
            raws[r, c] = random_weights(tname, r, c, rng)
        ops.append((name, nat.pack(q, raws[r, c], arr[o:o + s], r, c), arr[o:o + s], r, c))
    return ops


def dram_table(types, threads, layers, head, reps):
    """Per type and thread count (alternated per repetition), the decode step's GEMVs over a working set past
    the L3: GB/s of packed weights per wall second and per CPU second (the process's: a memory stall counts,
    waiting for a core does not), medians, per shape class, beside the C core's read probe at the same size
    (the bound)."""
    rng = np.random.default_rng(0)
    nat.set_threads(max(threads))
    shapes = [s for _ in range(layers) for s in DRAM_LAYER] + ([("head", VOCAB, HIDDEN)] if head else [])
    xs = {c: rng.standard_normal((1, c), dtype=np.float32) for c in (HIDDEN, FFN)}
    outs = {r: np.empty((1, r), np.float32) for r in (KV, HIDDEN, FFN, VOCAB)}
    med = lambda v: float(np.median(v))  # noqa: E731
    print(f"GEMV n=1 over Qwen2.5-Coder-1.5B's shapes x {layers} layers (fast mode, isa {nat.isa()}); "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| type | threads | MB | GB/s (wall) | GB/s (CPU) | probe GB/s | % of probe (wall) | per shape GB/s (wall) |")
    print("|---|---|---|---|---|---|---|---|")
    for tname in types:
        q, ops = TYPES[tname], pack_in_pages(tname, shapes, rng)
        nbytes = {}
        for name, _, w, _, _ in ops:
            nbytes[name] = nbytes.get(name, 0) + w.nbytes
        total = sum(nbytes.values())

        def step(acc):
            for name, layout, w, rows, cols in ops:
                t0 = time.perf_counter()
                nat.matmul(q, layout, w, rows, cols, xs[cols], outs[rows], 1, 0)
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0

        wall, cpu, per = ({th: [] for th in threads} for _ in range(3))
        for rep in range(reps):
            for th in (threads if rep % 2 == 0 else threads[::-1]):
                nat.set_threads(th)
                step({})  # the pool's threads up
                acc, c0, t0 = {}, time.process_time(), time.perf_counter()
                step(acc)
                wall[th].append(time.perf_counter() - t0)
                cpu[th].append(time.process_time() - c0)
                per[th].append(acc)
        for th in threads:
            probe = max(nat.read_bandwidth(total, th, 3))
            gbs = total / med(wall[th]) / 1e9
            shape = " ".join(f"{k} {b / med([a[k] for a in per[th]]) / 1e9:.1f}" for k, b in nbytes.items())
            print(f"| {tname} | {th} | {total / 1e6:.0f} | {gbs:.1f} | {total / med(cpu[th]) / 1e9:.1f} | "
                  f"{probe:.1f} | {100 * gbs / probe:.0f}% | {shape} |", flush=True)
        del ops
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def bench_gemm(tname, rows, cols, n, exact, rng, min_time):
    layout, w, _, _ = packed(tname, rows, cols, rng)
    x = rng.standard_normal((n, cols), dtype=np.float32)
    out = np.empty((n, rows), np.float32)
    q = TYPES[tname]
    dt = timeit(lambda: nat.matmul(q, layout, w, rows, cols, x, out, n, exact), min_time, min_calls=3)
    return dt * 1e3, 2.0 * n * rows * cols / dt / 1e9


GEMV_SHAPES = [  # (type, rows, cols, what)
    ("Q4_1", 576, 576, "smollm q/o"), ("Q4_1", 192, 576, "smollm k/v"), ("Q4_1", 1536, 576, "smollm gate/up"),
    ("Q4_1", 576, 1536, "smollm down"), ("Q8_0", 49152, 576, "smollm head (28 MB)"),
    ("Q5_0", 896, 896, "qwen0.5 q/o"), ("Q5_0", 4864, 896, "qwen0.5 gate/up"), ("Q4_K", 896, 4864, "qwen0.5 down"),
    ("Q6_K", 896, 4864, "qwen0.5 down"), ("Q8_0", 151936, 896, "qwen0.5 head (145 MB)"),
    ("Q4_K", 640, 2048, "gemma down"), ("Q4_0", 1536, 576, "Q4_0 gate/up"), ("F16", 1536, 576, "F16 gate/up"),
]
GEMM_SHAPES = [
    ("Q4_1", 576, 576), ("Q4_1", 1536, 576), ("Q4_1", 576, 1536), ("Q4_0", 1536, 576), ("Q8_0", 1536, 576),
    ("Q5_0", 4864, 896), ("Q4_K", 896, 4864), ("Q6_K", 896, 4864), ("F16", 576, 576),
]
TYPE_SHAPE = (896, 4864)  # Qwen2.5-0.5B's down projection: 2-4 MB of weights, a multiple of every block
# SmolLM2-135M per token: 30 layers x (q, k, v, o, gate, up, down) + the tied Q8_0 head.
SMOLLM_LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--isa", nargs="+", default=None, help="default: every ISA this CPU has except scalar")
    ap.add_argument("--quick", action="store_true", help="shorter timing, skip the cold and exact runs")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--dram", action="store_true", help="only the DRAM-sized GEMV table against a read probe")
    ap.add_argument("--types", nargs="+", default=None, help="--dram's types (default: every quantized type)")
    ap.add_argument("--layers", type=int, default=28, help="--dram's layers of the 1.5B's matrices")
    ap.add_argument("--head", action="store_true", help="--dram: add the output matrix (151936 x 1536)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.dram:
        if args.isa:
            nat.set_isa(args.isa[0])
        dram_table(args.types or [n for n, t in TABLE.items() if t["block"] > 1], args.threads, args.layers, args.head,
                   args.reps)
        return
    isas = args.isa or [i for i in nat.isa_available() if i != "scalar"] or ["scalar"]
    rng = np.random.default_rng(0)
    mt = 0.05 if args.quick else 0.25

    for isa in isas:
        nat.set_isa(isa)
        for th in args.threads:
            nat.set_threads(th)
            print(f"\n=== isa={isa} threads={th} ===")
            print("GEMV n=1, weights hot in cache (fast mode):")
            for tname, rows, cols, what in GEMV_SHAPES:
                us, gbs = bench_gemv(tname, rows, cols, 0, rng, mt)
                line = f"  {tname:5s} {rows:6d}x{cols:<5d} {what:22s} {us:9.1f} us  {gbs:6.1f} GB/s"
                if not args.quick and tname.startswith("Q"):
                    us_e, _ = bench_gemv(tname, rows, cols, 1, rng, mt)
                    line += f"   (exact {us_e:8.1f} us)"
                print(line)
            tok = 30 * sum(bench_gemv("Q4_1", r, c, 0, rng, mt)[0] for r, c in SMOLLM_LAYER)
            tok += bench_gemv("Q8_0", 49152, 576, 0, rng, mt)[0]
            print(f"  SmolLM2-135M Q4_1 matmuls per token (sum of the above, hot): {tok / 1e3:.2f} ms")
            if not (args.quick or args.no_cold):
                us, gbs = bench_cold_gemv("Q4_1", 4096, 4096, 40, rng, mt)
                print(f"  cold Q4_1 4096x4096 (40 copies, 420 MB): {us:8.1f} us  {gbs:6.1f} GB/s")
            print(f"GEMV n=1 on every quantized type, {TYPE_SHAPE[0]}x{TYPE_SHAPE[1]} (fast mode; '*' = scalar "
                  f"fallback on this ISA):")
            for tname, t in TABLE.items():
                if t["block"] > 1:
                    us, gbs = bench_gemv(tname, *TYPE_SHAPE, 0, rng, mt)
                    us_e, gbs_e = bench_gemv(tname, *TYPE_SHAPE, 1, rng, mt)
                    mark = " " if isa in t["simd"] else "*"
                    print(f"  {tname:6s}{mark} {us:9.1f} us  {gbs:6.1f} GB/s   (exact {gbs_e:6.1f} GB/s)")
            print("GEMM n=512 (prefill):")
            for tname, rows, cols in GEMM_SHAPES:
                ms, gops = bench_gemm(tname, rows, cols, 512, 0, rng, mt)
                line = f"  {tname:5s} {rows:5d}x{cols:<5d} {ms:8.2f} ms  {gops:7.1f} GOP/s"
                if not args.quick and tname.startswith("Q"):
                    ms_e, gops_e = bench_gemm(tname, rows, cols, 512, 1, rng, mt)
                    line += f"   (exact {gops_e:6.1f} GOP/s)"
                print(line)
            pre = 30 * sum(bench_gemm("Q4_1", r, c, 512, 0, rng, mt)[0] for r, c in SMOLLM_LAYER)
            print(f"  SmolLM2-135M matmuls for a 512-token prefill: {pre:.0f} ms ({512 / pre * 1e3:.0f} tok/s, no head)")

    nat.set_threads(1)
    print("\npack() cost (1 thread):")
    for tname, rows, cols in [("Q4_1", 1536, 576), ("Q8_0", 49152, 576), ("Q5_0", 4864, 896), ("Q4_K", 896, 4864),
                              ("Q6_K", 896, 4864)]:
        _, w, dt, src = packed(tname, rows, cols, rng)
        print(f"  {tname:5s} {rows:6d}x{cols:<5d} {dt * 1e3:8.2f} ms  {src / dt / 1e9:5.2f} GB/s  "
              f"size {w.nbytes / src:.3f}x the file's")


if __name__ == "__main__":
    main()

"""One prefill broken down per op, and each GEMM in the model beside the same GEMM alone (not a test).

    python bench/bench_prefill_ops.py MODEL.gguf [-p 128] [-t 2] [-r 5] [--exact] [--flush]

1. In the model: prefills of p tokens through the Python forward, each C call timed (wall, and the
   process's CPU time across the call: the pool's threads included), medians per op name and shape.
2. The prefill's GEMMs alone, in the model's order (the same weights and inputs, nothing between them):
   what the other ops cost the GEMMs (evicted activations, cold pool threads, ...).
3. Each GEMM shape alone, repeated on one matrix (its weights then come from L3, as in
   bench_kernels.py's GEMM modes), and with --flush also after a read of 2x the L3's size (weights and
   activations from DRAM).
Medians over repetitions; the first prefill (page faults, scratch growth) is a warm-up.
"""
import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from llambda import _native, engine  # noqa: E402
from llambda.api import load  # noqa: E402
from llambda.backends import native  # noqa: E402

GEMMS = ("matmul", "matmul_many")
POOL_KEYS = ("calls", "solo_calls", "joins_waited", "join_wait_us", "worker_chunks", "stolen_chunks",
             "worker_sleeps", "absent_calls", "stalls")


def key(name, a):
    if name == "matmul":
        return (a[3], a[4])
    if name == "matmul_many":
        return (tuple(p[2] for p in a[5]), a[1])
    return ()


def gemm_bytes(name, a):
    return a[2].nbytes if name == "matmul" else sum(p[1].nbytes for p in a[5])


class Timed:
    """Stands in for the _native module inside backends/native.py: times each call, keeps the GEMMs'."""

    def __init__(self, mod):
        self.mod, self.on, self.keep = mod, False, False
        self.t, self.c = defaultdict(list), defaultdict(list)
        self.calls = []     # (name, key, args with x copied) of the kept prefill's GEMMs, in order
        for name in dir(mod):
            f = getattr(mod, name)
            if callable(f) and name[0].islower():
                setattr(self, name, self._timing(name, f))

    def __getattr__(self, name):    # what is not a function (constants, the Plan type)
        return getattr(self.mod, name)

    def _timing(self, name, f):
        def call(*a):
            if not self.on:
                return f(*a)
            dt, dc, r = timed_call(f, a)
            k = (name, key(name, a))
            self.t[k].append(dt)
            self.c[k].append(dc)
            if self.keep and name in GEMMS:
                a = list(a)
                i = 5 if name == "matmul" else 2    # x: matmul(qt, layout, w, rows, cols, x, ...), matmul_many(qt, cols, x, ...)
                a[i] = a[i].copy()     # the input as it was (the workspace is reused)
                self.calls.append((name, k[1], tuple(a)))
            return r
        return call


def timed_call(f, a):
    """(wall ns, process CPU ns, result) of f(*a)."""
    c0, t0 = time.process_time_ns(), time.perf_counter_ns()
    r = f(*a)
    t1, c1 = time.perf_counter_ns(), time.process_time_ns()
    return t1 - t0, c1 - c0, r


def report(title, t, c, per_run, bytes_of=None):
    rows, total = [], 0.0
    for k, v in t.items():
        n = len(v) // per_run
        med, cmed = float(np.median(v)) / 1e3, float(np.median(c[k])) / 1e3
        rows.append((med * n, k, n, med, cmed))
        total += med * n
    print(f"\n== {title}: sum of ops {total / 1e3:.1f} ms (wall), "
          f"{sum(r[2] * r[4] for r in rows) / 1e3:.1f} ms (CPU)")
    for tot, (name, k), n, med, cmed in sorted(rows, reverse=True):
        print(f"  {name:12s} {str(k):30s} x{n:3d} {med:9.1f} us = {tot / 1e3:7.2f} ms {100 * tot / total:5.1f}%  "
              f"CPU {cmed:9.1f} us/call")
    return {k: (float(np.median(v)) / 1e3, float(np.median(c[k])) / 1e3) for k, v in t.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--flush", action="store_true", help="also each GEMM shape after reading 2x the L3")
    args = ap.parse_args()
    m = load(args.model, activations="f32" if args.exact else None, n_ctx=args.p + 16, threads=args.threads)
    tr = m.transformer
    _native.set_threads(args.threads)
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(100, 30000, args.p)]
    timed = Timed(_native)
    native.C = timed
    engine.prefill(tr, 0, ids, 0)              # warm-up
    whole = []
    for r in range(args.reps):
        native.C = _native                      # the whole prefill, untimed calls
        s0, c0, t0 = _native.pool_stats(), time.process_time(), time.perf_counter()
        engine.prefill(tr, 0, ids, 0)
        whole.append((time.perf_counter() - t0, time.process_time() - c0))
        s1 = _native.pool_stats()
        print("  pool: " + ", ".join(f"{k} {s1[k] - s0[k]}" for k in POOL_KEYS if k in s1))
        native.C = timed
        timed.on, timed.keep = True, r == 0
        engine.prefill(tr, 0, ids, 0)
        timed.on = timed.keep = False
    native.C = _native
    w, c = np.median([x[0] for x in whole]), np.median([x[1] for x in whole])
    print(f"{Path(args.model).name}: pp{args.p} on {args.threads} threads, {'exact' if args.exact else 'fast'}: "
          f"prefill {w * 1e3:.1f} ms wall ({args.p / w:.0f} tok/s), {c * 1e3:.1f} ms CPU (medians of {args.reps})")
    inmodel = report("in the model, each C call timed", timed.t, timed.c, args.reps)

    # 2. the GEMMs alone in the model's order
    t2, c2 = defaultdict(list), defaultdict(list)
    for r in range(args.reps + 1):
        for name, k, a in timed.calls:
            dt, dc, _ = timed_call(getattr(_native, name), a)
            if r:
                t2[(name, k)].append(dt)
                c2[(name, k)].append(dc)
    seq = report("the GEMMs alone, in the model's order", t2, c2, args.reps)

    # 3. each shape alone, one matrix repeated (hot), and optionally after a flush
    first = {}
    for name, k, a in timed.calls:
        first.setdefault((name, k), a)
    t3, c3, t4, c4 = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    flush = np.ones(2 * 480 * 2**20 // 8, np.float64) if args.flush else None
    for (name, k), a in first.items():
        f = getattr(_native, name)
        f(*a)
        for r in range(max(args.reps, 5)):
            dt, dc, _ = timed_call(f, a)
            t3[(name, k)].append(dt)
            c3[(name, k)].append(dc)
            if flush is not None:
                flush.sum()
                dt, dc, _ = timed_call(f, a)
                t4[(name, k)].append(dt)
                c4[(name, k)].append(dc)
    hot = report("each GEMM alone, one matrix repeated", t3, c3, max(args.reps, 5))
    cold = report("each GEMM alone after a 960 MiB read", t4, c4, max(args.reps, 5)) if flush is not None else {}

    print("\n== per GEMM shape, us per call (wall / CPU): in the model, alone in order, alone hot"
          + (", alone cold" if cold else "") + "; in-model CPU / hot CPU")
    nbytes = {}
    for name, k, a in timed.calls:
        nbytes.setdefault((name, k), gemm_bytes(name, a))
    for k in first:
        cols = [inmodel[k], seq[k], hot[k]] + ([cold[k]] if cold else [])
        print(f"  {str(k[1]):28s} {nbytes[k] / 1e6:6.1f} MB  " + "  ".join(f"{x[0]:8.0f}/{x[1]:8.0f}" for x in cols)
              + f"  {inmodel[k][1] / hot[k][1]:5.2f}x")


if __name__ == "__main__":
    main()

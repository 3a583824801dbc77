"""One decode step broken down per op: wall time, bytes read, GB/s (not a test).

    python bench/bench_decode_ops.py MODEL.gguf [--threads 1 2] [--steps 64] [--depth 128] [--exact] [--kv-type f16]

Runs decode steps through the Python forward (no plan), each C call timed alone (perf_counter around
the call: the Python between calls is not counted), per op name and shape; a matmul's bytes are its
packed weights. Then the same steps replayed from a plan, whole-step wall and CPU time: the gap between
the replay's step and the sum of the ops is what the C calls do not account for (Python dispatch is
absent from a replay). Medians over steps. Last, the plan replayed on exactly that many threads (no
thread tuner), each call timed inside the replay (Plan.replay's times), per op name and shape, with the
pool's counters per step: forks, the caller's wait at the joins, chunks the worker ran or either stole.
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


class Timed:
    """Stands in for the _native module inside backends/native.py: times each call."""

    def __init__(self, mod):
        self.mod, self.t, self.c, self.on = mod, defaultdict(list), defaultdict(list), False
        self.order = []     # (name, key) of each C call of the last step, in order

    def __getattr__(self, name):
        f = getattr(self.mod, name)
        if not callable(f) or name[0].isupper():
            return f

        def call(*a):
            if not self.on:
                return f(*a)
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            r = f(*a)
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            self.t[(name, key(name, a))].append(t1 - t0)
            self.c[(name, key(name, a))].append(c1 - c0)
            self.order.append((name, key(name, a)))
            return r
        return call


def key(name, a):
    if name == "matmul":
        return (a[3], a[4], a[2].nbytes)
    if name == "matmul_many":
        return (tuple(p[2] for p in a[5]), a[1], sum(p[1].nbytes for p in a[5]))
    if name == "get_rows":
        return (a[4], a[5].nbytes if hasattr(a[5], "nbytes") else 0, a[4] * a[2].nbytes // max(a[3], 1))
    return ()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--kv-type", default=None, help="f32 (default), f16 or q8_0")
    args = ap.parse_args()
    m = load(args.model, activations="f32" if args.exact else None, kv_type=args.kv_type,
             n_ctx=max(4096, args.depth + args.steps + 8), threads=max(args.threads))   # its steps' most
    tr = m.transformer
    timed = Timed(_native)
    native.C = timed
    rng = np.random.default_rng(0)
    engine.prefill(tr, 0, [int(t) for t in rng.integers(100, 5000, args.depth)], 0)
    for t in args.threads:
        _native.set_threads(t)
        timed.t.clear()
        timed.c.clear()
        steps = []
        out = np.empty((1, tr.cfg.vocab_size), np.float32)
        for i in range(args.steps):
            timed.on = i >= 4
            timed.order = []
            t0 = time.perf_counter_ns()
            tr.forward([7], [0], [args.depth], [0], out=out)
            if i >= 4:
                steps.append(time.perf_counter_ns() - t0)
        timed.on = False
        n = args.steps - 4
        print(f"\n== {Path(args.model).name}, {t} thread(s), {n} steps through Python: "
              f"step {np.median(steps) / 1e3:.0f} us")
        rows, total, wbytes = [], 0, 0
        for (name, k), v in timed.t.items():
            per = len(v) // n
            med = float(np.median(v)) / 1e3
            cmed = float(np.median(timed.c[(name, k)])) / 1e3
            b = k[-1] if name in ("matmul", "matmul_many", "get_rows") else 0
            rows.append((med * per, name, k, per, med, b, cmed))
            total += med * per
            wbytes += b * per
        for tot, name, k, per, med, b, cmed in sorted(rows, reverse=True):
            gbs = f"{b / med / 1e3:6.1f} GB/s" if b and name != "get_rows" else ""
            print(f"  {name:12s} {str(k[:-1] if b else k):34s} x{per:3d} {med:8.1f} us = {tot:7.0f} us "
                  f"{100 * tot / total:5.1f}%  {gbs}  caller CPU {cmed:7.1f} us")
        print(f"  read probe: {max(_native.read_bandwidth(max(int(wbytes), 64 << 20), t, 3)):.1f} GB/s")
        print(f"  sum of ops {total:.0f} us; {len(rows)} kinds, "
              f"{sum(r[3] for r in rows)} calls; matmul bytes {wbytes / 1e6:.1f} MB "
              f"-> {wbytes / total / 1e3:.1f} GB/s over the step's op time")
        # the same step from a plan
        native.C = _native
        plan_steps, cpu = [], []
        logits = None
        for i in range(args.steps):
            c0, t0 = time.process_time(), time.perf_counter_ns()
            logits = engine.decode(tr, [0], [7], [args.depth])
            if i >= 4:
                plan_steps.append(time.perf_counter_ns() - t0)
                cpu.append(time.process_time() - c0)
        native.C = timed
        print(f"  plan replay: step {np.median(plan_steps) / 1e3:.0f} us wall, "
              f"{np.median(cpu) * 1e6:.0f} us CPU (process) per step; logits[0,:3] {logits[0, :3]}; "
              f"(threads, threads run on): steps {dict(tr.backend.replays)} (the thread tuner's choices)")
        replay_ops(tr, timed.order, t, args.steps)


POOL_KEYS = ("calls", "solo_calls", "joins_waited", "join_wait_us", "caller_work_us", "worker_chunks",
             "stolen_chunks", "worker_sleeps", "absent_calls", "stalls")


def replay_ops(tr, order, threads, steps):
    """The decode plan replayed on `threads` threads (not the tuner's choice), each call timed."""
    plan = tr._plans.get(1)
    ops = list(plan.ops) if plan is not None else []
    kept, j = [], 0
    for name, k in order:   # the step's calls a plan keeps (a switch such as set_batch_invariant is not one)
        if j < len(ops) and name == ops[j]:
            kept.append((name, k))
            j += 1
    order = kept
    if plan is None or j != len(ops):
        print("  (replay per op: the plan's calls do not match the Python step's; skipped)")
        return
    times = np.zeros(len(plan), np.int64)
    plan.replay(threads=threads)
    s0, c0, w0 = _native.pool_stats(), time.process_time(), time.perf_counter()
    for _ in range(steps):
        plan.replay(threads=threads, times=times)
    wall, cpu, s1 = time.perf_counter() - w0, time.process_time() - c0, _native.pool_stats()
    per = defaultdict(float)
    for (name, k), ns in zip(order, times):
        per[(name, k)] += ns / steps / 1e3
    total = sum(per.values())
    print(f"  replay on {threads} thread(s), each call timed: step {wall / steps * 1e6:.0f} us wall, "
          f"{cpu / steps * 1e6:.0f} us CPU; calls {total:.0f} us")
    for (name, k), us in sorted(per.items(), key=lambda kv: -kv[1]):
        n = order.count((name, k))
        b = k[-1] if name in ("matmul", "matmul_many") else 0
        gbs = f"{b * n / us / 1e3:6.1f} GB/s" if b else ""
        print(f"    {name:12s} {str(k[:-1] if b else k):34s} x{n:3d} {us / n:8.2f} us = {us:7.0f} us "
              f"{100 * us / total:5.1f}%  {gbs}")
    print("    pool per step: " + ", ".join(f"{k} {(s1[k] - s0[k]) / steps:.1f}" for k in POOL_KEYS if k in s1))


if __name__ == "__main__":
    main()

"""Where a decode step's wall time goes beyond its ops (not a test).

    python bench/bench_step_gap.py MODEL.gguf [--depth 128] [--steps 64] [--threads 2] [--kv-type f16] [--rounds 5]

Fills DEPTH tokens, then times decode steps at position DEPTH (rewritten each step) several ways, each over --steps steps, rounds alternated
(medians of the per-round means; CPU is the process's, both threads):
  loop     what `llambda bench` times: engine.decode + argmax (the tuner picks the threads)
  parts    the same step cut in three: forward()'s Python before the replay, Backend.replay (tuner
           included), argmax over the logits
  replay0  Plan.replay() back to back (no tuner, no Python between steps but the loop)
  replayN  Plan.replay(threads=N) back to back
  ops      Plan.replay(threads=N, times=...): the sum of the calls against the step's wall time
Then per step: the pool's forks (parallel calls), calls run on the caller alone, worker sleeps and the
caller's join waits; and the ops grouped (GEMVs, attention, the rest).
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

from llambda import _native, engine  # noqa: E402
from llambda.api import load  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n_ctx = args.depth + 64
    m = load(args.model, kv_type=args.kv_type, n_ctx=n_ctx, threads=args.threads)
    tr = m.transformer
    _native.set_threads(args.threads)
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(100, 5000, args.depth)]
    for i in range(0, len(ids), 512):
        engine.prefill(tr, 0, ids[i:i + 512], i)
    pos = [args.depth]
    tok = [7]

    def step():
        lg = engine.decode(tr, [0], [tok[0]], [pos[0]])
        tok[0] = int(np.argmax(lg[0]))

    for _ in range(8):
        step()
    plan = tr._plans[1]
    B = tr.backend
    # the fast path of forward(), cut in parts
    views = tr._input_views
    parts = {"py": [], "replay": [], "argmax": []}

    def step_parts():
        t0 = time.perf_counter_ns()
        vals = [tok[0]], [0], [pos[0]]
        tr._check_values(*vals)
        for view, v in zip(views, vals):
            view[0] = v[0]
        B.enter_forward()
        t1 = time.perf_counter_ns()
        try:
            B.replay(plan)
        finally:
            B.exit_forward()
        t2 = time.perf_counter_ns()
        tok[0] = int(np.argmax(tr.ws.logits[:1][0]))
        t3 = time.perf_counter_ns()
        parts["py"].append(t1 - t0)
        parts["replay"].append(t2 - t1)
        parts["argmax"].append(t3 - t2)

    times = np.zeros(len(plan), np.int64)
    N = args.threads

    def replay_times():
        plan.replay(threads=N, times=times)

    modes = {"loop": step, "parts": step_parts, "replay0": lambda: plan.replay(),
             f"replay{N}": lambda: plan.replay(threads=N), "ops": replay_times}
    res = {k: ([], []) for k in modes}
    stats = {k: [] for k in modes}
    for r in range(args.rounds):
        for name, fn in modes.items():
            times[:] = 0
            s0, c0, w0 = _native.pool_stats(), time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                fn()
            w, c, s1 = time.perf_counter() - w0, time.process_time() - c0, _native.pool_stats()
            res[name][0].append(w / args.steps * 1e6)
            res[name][1].append(c / args.steps * 1e6)
            stats[name].append({k: (s1[k] - s0[k]) / args.steps for k in s1 if k != "join_wait_max_us"})
            if name == "ops":
                res.setdefault("ops_sum", ([], []))[0].append(times.sum() / args.steps / 1e3)
    la = os.getloadavg()
    print(f"{Path(args.model).name} depth {args.depth} kv {args.kv_type} threads {N}, {args.steps} steps x "
          f"{args.rounds} rounds; load {la[0]:.2f} {la[1]:.2f}")
    print(f"  {'mode':9s} {'wall us':>9s} {'CPU us':>9s}  forks solo sleeps joinwait_us absent stolen")
    for name in modes:
        w, c = statistics.median(res[name][0]), statistics.median(res[name][1])
        s = {k: statistics.median(r[k] for r in stats[name]) for k in stats[name][0]}  # as the times: medians
        print(f"  {name:9s} {w:9.0f} {c:9.0f}  {s['calls']:5.1f} {s['solo_calls']:4.1f} {s['worker_sleeps']:6.2f} "
              f"{s['join_wait_us']:11.1f} {s['absent_calls']:6.1f} {s['stolen_chunks']:6.1f}")
    print(f"  ops sum {statistics.median(res['ops_sum'][0]):.0f} us (ops' wall, summed)")
    print("  parts: " + ", ".join(f"{k} {statistics.median(v) / 1e3:.1f} us" for k, v in parts.items()))
    # ops grouped, from the last 'ops' round
    groups = {}
    for op, ns in zip(plan.ops, times):
        g = op if op in ("matmul", "matmul_many", "attention") else "other"
        a = groups.setdefault(g, [0, 0])
        a[0] += 1
        a[1] += ns / args.steps / 1e3
    print("  ops: " + ", ".join(f"{g} x{n} {us:.0f} us" for g, (n, us) in groups.items()))
    print(f"  replays (threads, run on): {dict(B.replays)}")


if __name__ == "__main__":
    main()

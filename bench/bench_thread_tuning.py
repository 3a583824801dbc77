"""Decode tokens/s with the decode step's thread tuner on and off (backends/thread_tuner.py), and where the
time goes in the thread pool.

Alternates, in one process and one run: N threads with the tuner, N threads without it (every
op on every thread) and 1 thread, each repetition in an order reversed from the last, optionally
beside `--load` busy-loop processes (as `llambda bench --load`). The tuner must not lose on an idle
machine and must bring N threads up to at least 1 thread's speed on a busy one. Per configuration it
prints the median tokens/s, the process CPU seconds per token (all our threads, spinning included) and,
with `--pool-stats`, the pool's counters over the runs (`_native.pool_stats()`): calls run on several
threads or by the back-off on the caller alone, stalls, joins that waited for a worker's chunk and for
how long, chunks stolen. Not a test: run it by hand.

    python bench/bench_thread_tuning.py -m smollm2-135m -n 128 -r 5 --load 1 --pool-stats
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout this script is in
from llambda import _native  # noqa: E402
from llambda.backends import native  # noqa: E402
from llambda.tools.bench import BusyLoad, OurEngine, _tokens  # noqa: E402


def add_stats(into: dict[str, int], before: dict[str, int], after: dict[str, int]) -> None:
    for k in after:
        if k == "join_wait_max_us":
            into[k] = max(into.get(k, 0), after[k])      # since start: an upper bound
        else:
            into[k] = into.get(k, 0) + after[k] - before[k]


def print_stats(s: dict[str, int]) -> None:
    if s.get("calls") or s.get("solo_calls"):
        per_call = s["join_wait_us"] / s["calls"] if s.get("calls") else 0.0
        print(f"      calls {s['calls']} parallel, {s['solo_calls']} solo; stalls {s['stalls']}; joins waited "
              f"{s['joins_waited']} ({s['join_wait_us'] / 1e3:.1f} ms, {per_call:.1f} us/call); "
              f"stolen {s['stolen_chunks']}, worker chunks {s['worker_chunks']}, worker sleeps {s['worker_sleeps']}, "
              f"absent {s['absent_calls']}, takeovers {s.get('takeovers', 0)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-d", "--depth", type=int, default=0)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes beside the run")
    ap.add_argument("--pool-stats", action="store_true", help="print the pool's counters per configuration")
    a = ap.parse_args()
    from llambda.hub import resolve
    eng = OurEngine(resolve(a.model), n_ctx=a.depth + a.n_gen + 16)
    fill = _tokens(eng.model.config.vocab_size, a.depth, seed=1)
    configs = [(f"{a.threads} threads, tuned", a.threads, True), (f"{a.threads} threads, untuned", a.threads, False),
               ("1 thread", 1, False)]
    samples: dict[str, list[float]] = {c[0]: [] for c in configs}
    cpu: dict[str, list[float]] = {c[0]: [] for c in configs}
    stats: dict[str, dict[str, int]] = {c[0]: {} for c in configs}
    load0 = os.getloadavg()[0]
    with BusyLoad(a.load):
        for name, t, tuned in configs:      # warm-up
            eng.set_threads(t)
            native.THREAD_TUNING = tuned
            eng.tg(8, 100, [])
        for r in range(a.repetitions):
            for name, t, tuned in (configs if r % 2 == 0 else configs[::-1]):
                eng.set_threads(t)
                native.THREAD_TUNING = tuned
                s0, c0 = _native.pool_stats(), time.process_time()
                samples[name].append(eng.tg(a.n_gen, 100, fill))
                cpu[name].append((time.process_time() - c0) / a.n_gen)
                add_stats(stats[name], s0, _native.pool_stats())
        changes = [tu.changes for tu in eng.model.backend._tuners.values()]
    print(f"{Path(a.model).name}: tg{a.n_gen} at depth {a.depth}, --load {a.load}, {a.repetitions} alternated "
          f"repetitions, load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
    for name, vals in samples.items():
        print(f"  {name:24s} {statistics.median(vals):7.1f} tok/s (median; {min(vals):.1f}-{max(vals):.1f}), "
              f"{1e3 * statistics.median(cpu[name]):.2f} CPU ms/token")
        if a.pool_stats:
            print_stats(stats[name])
    print(f"  tuner count changes: {changes}")


if __name__ == "__main__":
    main()

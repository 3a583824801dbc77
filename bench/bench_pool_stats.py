"""Where a decode step's time goes in the thread pool, beside `--load` busy loops.

Alternates, in one process: 1 thread, N threads untuned (every op on every thread) and N threads
tuned (backends/thread_tuner.py), each repetition in an order reversed from the last, and prints
per configuration the median tokens/s, the process CPU seconds per token (all our threads, spinning
included) and the pool's counters over the runs (`_native.pool_stats()`): calls run on several
threads or by the back-off on the caller alone, stalls, joins that waited for a worker's chunk and
for how long. Not a test: run it by hand.

    python bench/bench_pool_stats.py -m smollm2-135m -n 64 -r 5 --load 1
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
from llambda.tools.bench import BusyLoad, OurEngine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes beside the run")
    a = ap.parse_args()
    from llambda.hub import resolve
    eng = OurEngine(resolve(a.model), n_ctx=a.n_gen + 16)
    configs = [("1 thread", 1, False), (f"{a.threads} threads, untuned", a.threads, False),
               (f"{a.threads} threads, tuned", a.threads, True)]
    tps = {c[0]: [] for c in configs}
    cpu = {c[0]: [] for c in configs}
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
                tps[name].append(eng.tg(a.n_gen, 100, []))
                cpu[name].append((time.process_time() - c0) / a.n_gen)
                s1 = _native.pool_stats()
                for k in s1:
                    if k == "join_wait_max_us":
                        stats[name][k] = max(stats[name].get(k, 0), s1[k])   # since start: an upper bound
                    else:
                        stats[name][k] = stats[name].get(k, 0) + s1[k] - s0[k]
    print(f"{Path(a.model).name}: tg{a.n_gen}, --load {a.load}, {a.repetitions} alternated repetitions, "
          f"load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after")
    for name in tps:
        s = stats[name]
        per_call = s["join_wait_us"] / s["calls"] if s.get("calls") else 0.0
        print(f"  {name:22s} {statistics.median(tps[name]):7.1f} tok/s ({min(tps[name]):.1f}-{max(tps[name]):.1f}), "
              f"{1e3 * statistics.median(cpu[name]):.2f} CPU ms/token")
        if s.get("calls") or s.get("solo_calls"):
            print(f"      calls {s['calls']} parallel, {s['solo_calls']} solo; stalls {s['stalls']}; joins waited "
                  f"{s['joins_waited']} ({s['join_wait_us'] / 1e3:.1f} ms, {per_call:.1f} us/call); "
                  f"stolen {s['stolen_chunks']}, worker chunks {s['worker_chunks']}, worker sleeps {s['worker_sleeps']}, "
                  f"absent {s['absent_calls']}")


if __name__ == "__main__":
    main()

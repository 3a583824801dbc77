"""Decode tokens/s with the decode step's thread tuner on and off (backends/thread_tuner.py).

Alternates, in one process and one run: N threads with the tuner, N threads without it (every
op on every thread) and 1 thread, each repetition in an order reversed from the last, optionally
beside `--load` busy-loop processes (as `llambda bench --load`). The tuner must not lose on an idle
machine and must bring N threads up to at least 1 thread's speed on a busy one. Not a test: run it
by hand.

    python bench/bench_thread_tuning.py -m smollm2-135m -n 128 -r 5 --load 1
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout this script is in
from llambda import _native  # noqa: E402
from llambda.backends import native  # noqa: E402
from llambda.tools.bench import BusyLoad, OurEngine, _tokens  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-d", "--depth", type=int, default=0)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes beside the run")
    a = ap.parse_args()
    from llambda.hub import resolve
    eng = OurEngine(resolve(a.model), n_ctx=a.depth + a.n_gen + 16)
    fill = _tokens(eng.model.config.vocab_size, a.depth, seed=1)
    configs = [(f"{a.threads} threads, tuned", a.threads, True), (f"{a.threads} threads, untuned", a.threads, False),
               ("1 thread", 1, False)]
    samples: dict[str, list[float]] = {c[0]: [] for c in configs}
    changes = []
    with BusyLoad(a.load):
        for name, t, tuned in configs:      # warm-up
            eng.set_threads(t)
            native.THREAD_TUNING = tuned
            eng.tg(8, 100, [])
        for r in range(a.repetitions):
            for name, t, tuned in (configs if r % 2 == 0 else configs[::-1]):
                eng.set_threads(t)
                native.THREAD_TUNING = tuned
                samples[name].append(eng.tg(a.n_gen, 100, fill))
        changes = [tu.changes for tu in eng.model.backend._tuners.values()]
    print(f"{Path(a.model).name}: tg{a.n_gen} at depth {a.depth}, --load {a.load}, {a.repetitions} alternated "
          f"repetitions, load average {os.getloadavg()[0]:.1f}")
    for name, vals in samples.items():
        print(f"  {name:24s} {statistics.median(vals):7.1f} tok/s (median; {min(vals):.1f}-{max(vals):.1f})")
    print(f"  tuner count changes: {changes}")


if __name__ == "__main__":
    main()

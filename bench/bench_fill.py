"""A fill of DEPTH tokens (batches of 512, as `llambda bench -d`) then N decode steps, timed in wall and
process CPU time: `python bench/bench_fill.py MODEL_PATH DEPTH N` (T=threads, default 2). For A/B
of two builds on a loaded machine: alternate them, compare CPU seconds. Run with the checkout on
PYTHONPATH (a script's directory, not the cwd, starts sys.path)."""
import os
import sys
import time

import numpy as np

from llambda import engine
from llambda.tools.bench import OurEngine, _tokens


def main() -> None:
    path, depth, n = os.path.expanduser(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    e = OurEngine(path, None, None, depth + n + 8, "f16")
    e.set_threads(int(os.environ.get("T", "2")))
    ids = _tokens(e.model.config.vocab_size, depth, seed=1)
    w0, c0 = time.perf_counter(), time.process_time()
    e.fill(ids)
    wf, cf = time.perf_counter() - w0, time.process_time() - c0
    tok = ids[-1]
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        tok = int(np.argmax(engine.decode(e.tr, [0], [tok], [depth + i])[0]))
    wd, cd = time.perf_counter() - w0, time.process_time() - c0
    print(f"fill{depth}: {depth / wf:.1f} tok/s ({wf:.1f} s, cpu {cf:.1f} s) | tg{n}: {n / wd:.1f} tok/s "
          f"(cpu {cd:.2f} s) | load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""Decode steps at a depth without the prefill: `python bench/bench_decode_depth.py MODEL DEPTH [STEPS [KV_TYPE]]`.

Every layer's cache is filled with random K/V at positions 0..DEPTH-1 (what attention reads costs
the same whatever the values), then STEPS greedy decode steps run at DEPTH..; prints the median wall
and process CPU time per step (the first two left out). T=threads (default 2). A 16384-token fill
through `llambda bench -d` takes minutes; this takes seconds, so builds can be alternated. Run with the
checkout on PYTHONPATH (a script's directory, not the cwd, starts sys.path)."""
import os
import sys
import time

import numpy as np

from llambda import engine
from llambda.api import load


def main() -> None:
    path, depth = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    kv = sys.argv[4] if len(sys.argv) > 4 else "f16"
    threads = int(os.environ.get("T", "2"))
    model = load(path, n_ctx=depth + steps + 8, kv_type=kv, threads=threads)
    tr, cache = model.transformer, model.transformer.cache
    rng = np.random.default_rng(0)
    for layer in range(cache.n_layers):
        for s in range(0, depth, 4096):
            e = min(depth, s + 4096)
            k, v = rng.standard_normal((2, e - s, cache.n_kv, cache.head_dim), dtype=np.float32)
            model.backend.kv_store(cache, layer, k, v, np.zeros(e - s, np.int32), np.arange(s, e, dtype=np.int32))
    tok, wall, cpu = 100, [], []
    for i in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        logits = engine.decode(tr, [0], [tok], [depth + i])
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        tok = int(np.argmax(logits[0]))
    w, c = np.median(wall[2:]), np.median(cpu[2:])
    print(f"{os.path.basename(path)} {kv} depth {depth}, {threads} threads: {1 / w:.1f} tok/s, wall {w * 1e3:.1f} ms, "
          f"cpu {c * 1e3:.1f} ms per step, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

"""The attention op alone at depth: `python bench/bench_attention.py DEPTH N_QUERIES [REPS]`.

Queries at positions DEPTH.. over a random cache, Qwen2.5-Coder-1.5B's shape (12 query heads over
2 kv heads of 128); prints the median wall and process CPU time of one call per layer (on a loaded
machine compare CPU times of alternated runs). T=threads (default 2), KV=f16|q8_0|f32 (the cache
type, default f16), SHAPE=heads,kv_heads,head_dim (default 12,2,128; Qwen2.5-Coder-0.5B's is
14,2,64), LAYERS=the layers each rep goes through one after the other (default 1: one layer's
cache, which at depth 16384 stays in a 32 MB L3 from rep to rep; a model's 28 do not, so
LAYERS=28 reads K/V from memory as a decode step does); INV=0 turns batch invariance (the
backend's default) off; the decode shape is N_QUERIES 1. Run with the checkout on PYTHONPATH (a
script's directory, not the cwd, starts sys.path)."""
import os
import sys
import time

import numpy as np

from llambda.backends.native import NativeBackend


def random_attention(be, depth: int, nq: int, layers: int, heads: int, n_kv: int, hd: int):
    """A cache of `layers` layers filled with random K/V at positions 0..depth+nq-1 and nq random
    queries at depth..: (cache, q, slots, positions), the same values for every backend."""
    cache = be.create_kv_cache(layers, 1, depth + nq, n_kv, hd)
    r = np.random.default_rng(0)
    for layer in range(layers):
        kv = r.standard_normal((2, depth + nq, n_kv, hd), dtype=np.float32)
        be.kv_store(cache, layer, kv[0], kv[1], np.zeros(depth + nq, np.int32), np.arange(depth + nq, dtype=np.int32))
    q = r.standard_normal((nq, heads, hd)).astype(np.float32)
    return cache, q, np.zeros(nq, np.int32), np.arange(depth, depth + nq, dtype=np.int32)


def main() -> None:
    depth, nq = int(sys.argv[1]), int(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    layers = int(os.environ.get("LAYERS", "1"))
    be = NativeBackend(threads=int(os.environ.get("T", "2")), kv_type=os.environ.get("KV", "f16"))
    be.set_batch_invariant(os.environ.get("INV", "1") != "0")
    heads, n_kv, hd = (int(x) for x in os.environ.get("SHAPE", "12,2,128").split(","))
    cache, q, slots, pos = random_attention(be, depth, nq, layers, heads, n_kv, hd)
    out = np.zeros_like(q)
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        for layer in range(layers):
            be.attention(q, cache, layer, slots, pos, out, 1 / np.sqrt(hd), 0, 0.0)
        wall.append((time.perf_counter() - w0) / layers)
        cpu.append((time.process_time() - c0) / layers)
    macs = 2 * nq * heads * hd * (depth + nq / 2)
    kv_bytes = cache.k[0].nbytes * (depth + nq / 2) / cache.n_ctx * 2
    print(f"{os.environ.get('KV', 'f16')} depth {depth}, {nq} queries, {layers} layer(s): "
          f"{kv_bytes / np.median(cpu) / 1e9:.1f} GB of K/V per CPU second, per layer wall {np.median(wall) * 1e3:.2f} ms, "
          f"cpu {np.median(cpu) * 1e3:.4f} ms ({macs / np.median(cpu) / 1e9:.1f} GMAC per CPU second), "
          f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

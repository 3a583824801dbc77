"""Hashes of the attention op's outputs over many configurations: `python bench/bench_attention_hashes.py`.

For changes that must keep every result bit-identical: run it with the old and the new build on
PYTHONPATH (a copy of the package per build) and compare the per-configuration lines and the
TOTAL. Covers cache types f16/q8_0/f32, 1 and 2 threads, batch invariance on and off, head
shapes (0.5B's 14,2,64, 1.5B's 12,2,128, MHA, head_dim 96 and 256), depths to 4100 (several
256-key chunks), query counts from 1 to 130, sliding windows, softcap, two interleaved slots.
QUICK=1 skips the deepest and head_dim 256."""
import hashlib
import os

import numpy as np
from llambda.backends.native import NativeBackend

def run(be, heads, n_kv, hd, depth, nq, window, softcap, two_slots, rng):
    n_ctx = depth + nq + 8
    cache = be.create_kv_cache(1, 2, n_ctx, n_kv, hd)
    total = depth + nq
    kv = rng.standard_normal((2, total, n_kv, hd), dtype=np.float32) * 1.5
    for s in range(2):
        be.kv_store(cache, 0, kv[0], kv[1], np.full(total, s, np.int32), np.arange(total, dtype=np.int32))
    q = (rng.standard_normal((nq, heads, hd)) * 2).astype(np.float32)
    if two_slots:
        slots = (np.arange(nq) % 2).astype(np.int32)
        pos = (depth + np.arange(nq) // 2).astype(np.int32)
    else:
        slots, pos = np.zeros(nq, np.int32), np.arange(depth, depth + nq, dtype=np.int32)
    out = np.zeros_like(q)
    be.attention(q, cache, 0, slots, pos, out, 1 / np.sqrt(hd), window, softcap)
    return out.tobytes()

def main():
    h = hashlib.sha256()
    count = 0
    quick = os.environ.get("QUICK") == "1"
    for kvt in ("f16", "q8_0", "f32"):
        for threads in (1, 2):
            be = NativeBackend(threads=threads, kv_type=kvt)
            for inv in (True, False):
                be.set_batch_invariant(inv)
                rng = np.random.default_rng(1)
                for (heads, n_kv, hd) in ((14, 2, 64), (12, 2, 128), (8, 8, 64), (16, 2, 96), (4, 1, 256), (32, 8, 128)):
                    for depth, nq in ((0, 1), (0, 37), (5, 64), (300, 3), (700, 50), (1000, 130), (2100, 24), (4100, 17)):
                        for window, softcap, two in ((0, 0.0, False), (333, 0.0, False), (0, 30.0, True), (96, 0.0, True)):
                            if quick and (depth > 1000 or hd == 256):
                                continue
                            b = run(be, heads, n_kv, hd, depth, nq, window, softcap, two, rng)
                            h.update(b); count += 1
                            hh = hashlib.sha256(b).hexdigest()[:12]
                            print(kvt, threads, inv, heads, n_kv, hd, depth, nq, window, softcap, two, hh)
    print("TOTAL", count, h.hexdigest())

main()

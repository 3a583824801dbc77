"""The attention op of several builds of the C core in one process, alternated call by call:
`SOS=name=path.so,name=path.so python bench/bench_attention_ab.py DEPTH N_QUERIES REPS`.

On a host whose speed drifts by 1.5-2x from minute to minute (other tenants), alternating whole
processes could not resolve a 10% change; here every rep times each build once, in rotating order,
and the ratio to the first build is taken rep by rep. Each build's `_native` module is loaded from its
own file under the usual name, with a private copy of backends/native.py bound to it. Same
environment knobs as bench_attention.py (SHAPE, LAYERS, T, KV, INV; T defaults to 1 here), and the
same cache and queries for every build: the last line says whether their outputs are bit-identical.
Keep a build's .so aside (`cp llambda/_native*.so /tmp/before.so`) before rebuilding."""
import importlib.machinery
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import llambda  # noqa: E402
import llambda.backends.native as native  # noqa: E402
from bench_attention import random_attention  # noqa: E402  (this script's directory starts sys.path)


def backend_module(index: int, so_path: str):
    """backends/native.py executed anew with `from .. import _native` resolving to the build at so_path."""
    loader = importlib.machinery.ExtensionFileLoader("llambda._native", so_path)
    spec = importlib.util.spec_from_file_location("llambda._native", so_path, loader=loader)
    core = importlib.util.module_from_spec(spec)
    loader.exec_module(core)
    saved = sys.modules["llambda._native"]
    sys.modules["llambda._native"], llambda._native = core, core
    try:
        name = f"llambda.backends.native_ab{index}"
        spec = importlib.util.spec_from_file_location(name, native.__file__)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    finally:
        sys.modules["llambda._native"], llambda._native = saved, saved
    return mod


def main() -> None:
    depth, nq, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    builds = dict(item.split("=", 1) for item in os.environ["SOS"].split(","))
    layers, threads = int(os.environ.get("LAYERS", "1")), int(os.environ.get("T", "1"))
    heads, n_kv, hd = (int(x) for x in os.environ.get("SHAPE", "12,2,128").split(","))
    runs = {}
    for i, (name, path) in enumerate(builds.items()):
        be = backend_module(i, path).NativeBackend(threads=threads, kv_type=os.environ.get("KV", "f16"))
        be.set_batch_invariant(os.environ.get("INV", "1") != "0")
        cache, q, slots, pos = random_attention(be, depth, nq, layers, heads, n_kv, hd)
        runs[name] = (be, cache, np.zeros_like(q))

    def once(name: str) -> float:
        be, cache, out = runs[name]
        t0 = time.perf_counter()
        for layer in range(layers):
            be.attention(q, cache, layer, slots, pos, out, 1 / np.sqrt(hd), 0, 0.0)
        return (time.perf_counter() - t0) / layers * 1e3

    names = list(runs)
    for name in names:
        once(name)
    times = {n: [] for n in names}
    ratios = {n: [] for n in names[1:]}
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        t = {n: once(n) for n in order}
        for n in names:
            times[n].append(t[n])
        for n in names[1:]:
            ratios[n].append(t[n] / t[names[0]])
    for n in names:
        print(f"{n}: median {statistics.median(times[n]):.4f} ms a layer, min {min(times[n]):.4f}")
    for n in names[1:]:
        v = sorted(ratios[n])
        print(f"{n}/{names[0]}: median {statistics.median(v):.3f} (quartiles {v[len(v) // 4]:.3f} .. {v[3 * len(v) // 4]:.3f})")
    same = all(np.array_equal(runs[names[0]][2], runs[n][2]) for n in names[1:])
    print("outputs bit-identical" if same else "outputs DIFFER")


if __name__ == "__main__":
    main()

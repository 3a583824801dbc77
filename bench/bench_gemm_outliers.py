"""The 32-block GEMMs with real prefills' share of outlier blocks (not a test).

    python bench/bench_gemm_outliers.py [-t TYPES] [-n ROWS] [--threads 1] [-r 7] [--out 0,0.17]
    python bench/bench_gemm_outliers.py --model FILE.gguf [-p 128]

Random activations almost never carry a residual (a block's absmax over LLB_OUTLIER = 5 times its row's
RMS, kernels.h), real ones often do: 14-19% of the blocks of Qwen2.5-0.5B's GEMM inputs, where each adds
a second integer dot. So a GEMM timed on random rows misses that path. Mode 1: the 0.5B's shapes (random
weights) with a fraction of each row's blocks given one value at 8 (the rest N(0, 1)), median CPU time
per call. Mode 2 (--model): a prefill of p random tokens, its GEMM inputs' share of outlier blocks
per depth, and per 4-row tile (the AMD pair tile's) how many rows carry one, at thresholds 4, 5 and 6.
Mode 3 (--model F --rules): per matrix role (q/k/v, o, gate/up, down) its share of the GEMM work, and for
two outlier rules at several thresholds the share of blocks flagged and the rounding-error energy left
(sum over unflagged blocks of |x - d q|^2 over the row's sum x^2, relative to no residual at all):
"amax" is the kernels' test; "energy" flags a block by its own rounding error, 12 * 127^2 / 32 * |x - d q|^2
> T^2 * mean(x^2) (the same as amax where the 31 neighbours fill their steps; less where they are small).
Run it from a checkout's root so that `import llambda` is that checkout's build."""
import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402

SHAPES = [(4864, 896), (896, 4864), (896, 896), (128, 896)]  # gate/up, down, q/o, k/v (rows, cols)


def gemm_times(types, n, threads, reps, outs):
    from bench_kernels import TYPES, packed
    nat.set_threads(threads)
    print(f"CPU ms per call (median of {reps}), n = {n}, {threads} thread(s); shapes "
          + ", ".join(f"{r}x{c}" for r, c in SHAPES))
    for t in types:
        for fr in outs:
            row = []
            for rows, cols in SHAPES:
                rng = np.random.default_rng(1)
                layout, w, _, _ = packed(t, rows, cols, rng)
                x = rng.standard_normal((n, cols), dtype=np.float32)
                r, b = np.nonzero(rng.random((n, cols // 32)) < fr)
                x[r, 32 * b + rng.integers(0, 32, len(r))] = 8.0
                out = np.empty((n, rows), np.float32)
                nat.matmul(TYPES[t], layout, w, rows, cols, x, out, n, 0)
                ts = []
                for _ in range(reps):
                    c0 = time.process_time()
                    for _ in range(3):
                        nat.matmul(TYPES[t], layout, w, rows, cols, x, out, n, 0)
                    ts.append((time.process_time() - c0) / 3)
                row.append(1e3 * float(np.median(ts)))
            print(f"  {t:8s} outliers {fr:4.2f}: " + "  ".join(f"{v:7.3f}" for v in row), flush=True)
    print(f"  load average {os.getloadavg()[0]:.1f}")


def _prefill_inputs(path, p):
    """Each GEMM input (rows >= 4) of a prefill of p random tokens, with its role and its GEMM work."""
    import bench_prefill_ops as B
    from llambda import engine
    from llambda.api import load
    from llambda.backends import native
    m = load(path, n_ctx=p + 16)
    ids = [int(t) for t in np.random.default_rng(0).integers(100, 30000, p)]
    timed = B.Timed(nat)
    native.C = timed
    timed.on = timed.keep = True
    engine.prefill(m.transformer, 0, ids, 0)
    native.C = nat
    for name, _, a in timed.calls:
        x = a[5] if name == "matmul" else a[2]
        x = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        if len(x) < 4:
            continue  # the head's one row
        if name == "matmul":
            role, rows = ("down" if x.shape[1] >= 2 * a[3] else "o"), a[3]
        else:
            role, rows = ("q/k/v" if len(a[5]) >= 3 else "gate/up"), sum(t[2] for t in a[5])
        yield role, rows * x.size, x


def rule_curves(path, p):
    thresholds = (4, 5, 6, 8)
    agg = defaultdict(lambda: [0, 0, 0.0, 0.0])  # flagged, blocks, error energy left, without residual
    work = defaultdict(float)
    for role, w, x in _prefill_inputs(path, p):
        K = x.shape[1]
        work[role] += w
        ss = (x.astype(np.float64) ** 2).sum(1)
        xb = x.reshape(len(x), K // 32, 32)
        am = np.abs(xb).max(2)
        q = np.rint(xb * np.where(am > 0, np.float32(127) / np.where(am > 0, am, 1), 0)[..., None])
        d = (am / np.float32(127)).astype(np.float64)
        e = ((xb - d[..., None] * q) ** 2).sum(2)
        for rule in ("amax", "energy"):
            for t in thresholds:
                v = am.astype(np.float64) ** 2 if rule == "amax" else e * (12 * 127 ** 2 / 32)
                flag = v * K > t * t * ss[:, None]
                g = agg[role, rule, t]
                g[0] += int(flag.sum())
                g[1] += flag.size
                g[2] += float((np.where(flag, 0, e).sum(1) / ss).sum())
                g[3] += float((e.sum(1) / ss).sum())
    total = sum(work.values())
    for (role, rule, t), (f, n, left, none) in sorted(agg.items()):
        print(f"  {role:8s} {100 * work[role] / total:4.1f}% of the work, {rule:6s} {t}: {100 * f / n:5.1f}% of blocks "
              f"flagged, {100 * left / none:5.1f}% of the rounding error energy left")


def model_outliers(path, p):
    agg = defaultdict(lambda: defaultdict(lambda: [0, 0, Counter()]))
    for _, _, x in _prefill_inputs(path, p):
        K = x.shape[-1]
        x = x.astype(np.float64)
        ss = (x * x).sum(1) / K
        am = np.abs(x.reshape(len(x), K // 32, 32)).max(2)
        for thr in (4, 5, 6):
            o = am * am > thr * thr * ss[:, None]
            g = agg[K][thr]
            g[0] += int(o.sum())
            g[1] += o.size
            for i in range(0, len(x) - 3, 4):
                g[2].update(o[i:i + 4].sum(0).tolist())
    for K, by in sorted(agg.items()):
        for thr, (s, tot, c) in sorted(by.items()):
            nt = sum(c.values())
            print(f"  K = {K:5d}, threshold {thr}: {100 * s / tot:5.1f}% of blocks; 4-row tiles with 0..4 such rows: "
                  + " ".join(f"{100 * c[k] / nt:4.1f}%" for k in range(5)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-t", "--types", default="Q4_0,IQ4_NL,MXFP4")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-r", "--reps", type=int, default=7)
    ap.add_argument("--out", default="0,0.17", help="fractions of blocks with an outlier")
    ap.add_argument("--model")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("--rules", action="store_true", help="with --model: the outlier rules' curves (mode 3)")
    a = ap.parse_args()
    if a.model and a.rules:
        rule_curves(a.model, a.p)
    elif a.model:
        model_outliers(a.model, a.p)
    else:
        gemm_times(a.types.split(","), a.n, a.threads, a.reps, [float(v) for v in a.out.split(",")])


if __name__ == "__main__":
    main()

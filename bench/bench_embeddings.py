"""Embedding throughput on all-MiniLM-L6-v2 (not a test).

    python bench/bench_embeddings.py [--threads 1 2] [--rounds 20] [--st-python PYTHON]

Sentences/s for batches of 32 short sentences: llambda (native backend, f32 activations) and,
where it can be imported, sentence-transformers on PyTorch CPU with the same number of threads
(torch.set_num_threads; our NumPy's BLAS gets the same count). `--st-python` names an interpreter
that has sentence-transformers (a venv with the CPU torch wheel, say), since PyTorch is not one of
llambda's dependencies. Each run is its own process, so thread settings do not leak between them.
It also prints the lowest cosine similarity between the two sets of vectors.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SUBJECTS = ["The cat", "A young man", "My neighbour", "The old train", "Our team", "The committee",
            "A small bird", "The new phone"]
VERBS = ["quietly watched", "was looking for", "could not find", "happily repaired"]
OBJECTS = ["the red door.", "a forgotten letter in the attic.", "the bridge over the river.", "an answer."]


def sentences(n: int = 32) -> list[str]:
    out = []
    for i in range(n):
        out.append(f"{SUBJECTS[i % 8]} {VERBS[(i // 8) % 4]} {OBJECTS[(i * 3) % 4]}")
    return out


def worker(kind: str, threads: int, rounds: int, model_dir: str, out_npy: str) -> None:
    import numpy as np
    batch = sentences(32)
    if kind == "ours":
        import llambda
        m = llambda.load(model_dir, backend="native", threads=threads)
        run = m.embed
    else:
        import torch
        from sentence_transformers import SentenceTransformer
        torch.set_num_threads(threads)
        st = SentenceTransformer(model_dir, device="cpu")

        def run(texts):
            return st.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    for _ in range(3):
        vecs = run(batch)                       # warm-up (allocations, first-call paths)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        run(batch)
        times.append(time.perf_counter() - t0)
    np.save(out_npy, np.asarray(vecs, dtype=np.float32))
    times.sort()
    print(json.dumps({"median_s": times[len(times) // 2], "best_s": times[0]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--model", default="all-minilm-l6-v2", help="catalogued name or HF directory")
    ap.add_argument("--st-python", default=sys.executable,
                    help="an interpreter with sentence-transformers (default: this one)")
    ap.add_argument("--worker", choices=["ours", "st"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.threads[0], a.rounds, a.model_dir, a.out)
        return

    import numpy as np
    from llambda import hub
    model_dir = str(hub.resolve(a.model))
    print(f"model {a.model}: batches of 32 short sentences, {a.rounds} timed rounds, median (best)")
    with tempfile.TemporaryDirectory() as tmp:
        for t in a.threads:
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
            res = {}
            for kind, py in (("ours", sys.executable), ("st", a.st_python)):
                out = os.path.join(tmp, f"{kind}{t}.npy")
                proc = subprocess.run([py, __file__, "--worker", kind, "--threads", str(t), "--rounds",
                                       str(a.rounds), "--model-dir", model_dir, "--out", out],
                                      env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
                    print(f"  {t} thread(s) {kind:>4}: not run ({tail[0]})")
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                res[kind] = (r, np.load(out))
                label = "llambda" if kind == "ours" else "sentence-transformers"
                print(f"  {t} thread(s) {label:>21}: {32 / r['median_s']:8.1f} sentences/s "
                      f"({32 / r['best_s']:.1f})", flush=True)
            if len(res) == 2:
                (ro, vo), (rs, vs) = res["ours"], res["st"]
                cos = (vo * vs).sum(1) / (np.linalg.norm(vo, axis=1) * np.linalg.norm(vs, axis=1))
                print(f"  {t} thread(s): llambda / sentence-transformers = {rs['median_s'] / ro['median_s']:.2f}x, "
                      f"lowest cosine {cos.min():.6f}")


if __name__ == "__main__":
    main()

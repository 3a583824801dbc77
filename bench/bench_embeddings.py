"""Embedding throughput on all-MiniLM-L6-v2 (not a test).

    python bench/bench_embeddings.py [--threads 1 2] [--rounds 20] [--repeats 5] [--activations f32 q8]
                                     [--st-python PYTHON]

Sentences/s for batches of 32 short sentences: llambda (native backend; `--activations f32`, the
encoders' default, is the exact mode with float32 weights, `q8` the fast mode with bfloat16 weights
and activations) and, where it can be imported, sentence-transformers on PyTorch CPU with the same
number of threads (torch.set_num_threads; our NumPy's BLAS gets the same count). `--st-python` names
an interpreter that has sentence-transformers (a venv with the CPU torch wheel, say), since PyTorch is
not one of llambda's dependencies. Each run is its own process, so thread settings do not leak between
them; the engines alternate, `--repeats` times each, and each run reports the median of its rounds:
the figures are the medians of those (and the range), with the load average before and after.
Sentences per CPU-second of the process (all its threads: a thread spinning in a pool counts) is
printed beside wall-clock: on a loaded machine it is the steadier figure.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]      # this checkout's llambda, not an installed one

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
    if kind.startswith("ours"):
        import llambda
        print(f"llambda from {Path(llambda.__file__).parent}", file=sys.stderr)
        m = llambda.load(model_dir, backend="native", threads=threads, activations=kind.split("-")[1])
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
    times, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        run(batch)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    np.save(out_npy, np.asarray(vecs, dtype=np.float32))
    print(json.dumps({"median_s": sorted(times)[len(times) // 2], "cpu_s": sorted(cpu)[len(cpu) // 2]}))


def _run(kind: str, py: str, t: int, rounds: int, model_dir: str, out: str) -> dict | str:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
    if kind.startswith("ours"):
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([py, __file__, "--worker", kind, "--threads", str(t), "--rounds", str(rounds),
                           "--model-dir", model_dir, "--out", out], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines()[-1:] or ["?"])[0]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=20, help="timed batches in each run")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each engine, alternated")
    ap.add_argument("--activations", nargs="+", default=["f32"], choices=["f32", "q8"],
                    help="llambda's modes to run (f32 exact, q8 fast: bfloat16 products)")
    ap.add_argument("--model", default="all-minilm-l6-v2", help="catalogued name or HF directory")
    ap.add_argument("--st-python", default=sys.executable,
                    help="an interpreter with sentence-transformers (default: this one)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.threads[0], a.rounds, a.model_dir, a.out)
        return

    import numpy as np
    sys.path.insert(0, str(ROOT))
    from llambda import hub
    model_dir = str(hub.resolve(a.model))
    kinds = [(f"ours-{act}", sys.executable, f"llambda {act}") for act in a.activations]
    kinds.append(("st", a.st_python, "sentence-transformers"))
    print(f"model {a.model}: batches of 32 short sentences, {a.repeats} alternated runs of {a.rounds} "
          f"timed batches each; sentences/s, median of the runs' medians (min-max)")
    with tempfile.TemporaryDirectory() as tmp:
        for t in a.threads:
            load0 = os.getloadavg()[0]
            rates: dict[str, list[float]] = {k: [] for k, _, _ in kinds}
            cpu_rates: dict[str, list[float]] = {k: [] for k, _, _ in kinds}
            vecs, failed = {}, {}
            for _ in range(a.repeats):
                for kind, py, _ in kinds:
                    if kind in failed:
                        continue
                    out = os.path.join(tmp, f"{kind}{t}.npy")
                    r = _run(kind, py, t, a.rounds, model_dir, out)
                    if isinstance(r, str):
                        failed[kind] = r
                        continue
                    rates[kind].append(32 / r["median_s"])
                    cpu_rates[kind].append(32 / max(r["cpu_s"], 1e-9))
                    vecs[kind] = np.load(out)
            print(f"  {t} thread(s), load average {load0:.1f} -> {os.getloadavg()[0]:.1f}:")
            med, cmed = {}, {}
            for kind, _, label in kinds:
                if kind in failed:
                    print(f"    {label:>21}: not run ({failed[kind]})")
                    continue
                med[kind], cmed[kind] = float(np.median(rates[kind])), float(np.median(cpu_rates[kind]))
                print(f"    {label:>21}: {med[kind]:8.1f} sentences/s ({min(rates[kind]):.1f}-{max(rates[kind]):.1f}); "
                      f"{cmed[kind]:8.1f} per CPU-second of the process")
            if "st" in med:
                vs = vecs["st"]
                for kind, _, label in kinds[:-1]:
                    if kind in med:
                        vo = vecs[kind]
                        cos = (vo * vs).sum(1) / (np.linalg.norm(vo, axis=1) * np.linalg.norm(vs, axis=1))
                        print(f"    {label} / sentence-transformers = {med[kind] / med['st']:.2f}x wall-clock, "
                              f"{cmed[kind] / cmed['st']:.2f}x per CPU-second, lowest cosine {cos.min():.6f}",
                              flush=True)


if __name__ == "__main__":
    main()

"""Our engine and llama.cpp side by side in CPU time (not a test): one thread each, in one process,
repetitions alternated, medians. CPU time counts a memory stall but not a wait for a core, so the
ratios hold on a machine other work shares (wall-clock tokens/s do not); decode CPU time still
grows when a memory-bound step shares the memory.

    python bench/bench_cpu_ratio.py FILE [FILE ...] [--reps 5] [--pp 128] [--tg 16]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda

from llambda.tools.bench import LlamaCppEngine, OurEngine, _tokens  # noqa: E402


def measure(path: str, reps: int, pp: int, tg: int) -> dict[str, float]:
    engines = {"ours": OurEngine(path, n_ctx=pp + tg + 64), "llama.cpp": LlamaCppEngine(path, n_ctx=pp + tg + 64)}
    ids = _tokens(engines["llama.cpp"].n_vocab, pp)
    samples: dict[str, list[float]] = {}
    for e in engines.values():
        e.set_threads(1)
        e.pp(ids, [])  # warm-up
    for _ in range(reps):
        for name, e in engines.items():
            c = time.process_time()
            e.pp(ids, [])
            samples.setdefault(f"{name} pp", []).append(time.process_time() - c)
            if tg:
                c = time.process_time()
                e.tg(tg, ids[0], [])
                samples.setdefault(f"{name} tg", []).append((time.process_time() - c) / tg)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=16)
    args = ap.parse_args()
    print(f"| file | pp{args.pp} CPU s ours / llama.cpp | ratio | tg CPU ms/token ours / llama.cpp | ratio |")
    print("|---|---|---|---|---|")
    for f in args.files:
        m = measure(f, args.reps, args.pp, args.tg)
        tg = (f"{1e3 * m['ours tg']:.2f} / {1e3 * m['llama.cpp tg']:.2f} | {m['llama.cpp tg'] / m['ours tg']:.2f}x"
              if args.tg else "- | -")
        pp = f"{m['ours pp']:.4f} / {m['llama.cpp pp']:.4f} | {m['llama.cpp pp'] / m['ours pp']:.2f}x"
        print(f"| {Path(f).name} | {pp} | {tg} |", flush=True)


if __name__ == "__main__":
    main()

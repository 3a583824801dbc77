"""`llambda bench`: tokens/s for prefill and decode, optionally against llama.cpp."""
from __future__ import annotations

import sys
from pathlib import Path


def _ints(s: str, what: str = "value") -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated positive integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{what}: expected comma-separated positive integers, got {s!r}")
    return vals


def register(sub, add_model_args) -> None:
    p = sub.add_parser("bench", help="prefill/decode tokens/s (llama-bench style)")
    add_model_args(p)
    p.add_argument("-p", "--n-prompt", default="512", help="prompt lengths, comma-separated (default 512)")
    p.add_argument("-n", "--n-gen", default="128", help="generation lengths, comma-separated (default 128)")
    p.add_argument("--threads-list", default=None, help="thread counts, comma-separated (default: -t or all cores)")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--vs", choices=["llama-cpp"], default=None, help="also run llama.cpp (llama-cpp-python) on the same file")
    p.set_defaults(fn=run)


def run(a) -> int:
    from .backends.native import physical_cores
    from .bench import markdown, run_bench
    from .hub import resolve

    path = resolve(a.model)
    threads = _ints(a.threads_list, "--threads-list") if a.threads_list else [a.threads or physical_cores()]
    if a.repetitions < 1:
        raise ValueError("-r/--repetitions must be at least 1")
    rows = run_bench(path, _ints(a.n_prompt, "-p"), _ints(a.n_gen, "-n"), threads, a.repetitions, a.vs == "llama-cpp",
                     backend=a.backend, activations=a.activations, log=lambda s: print(s, file=sys.stderr))
    print(markdown(rows, Path(path).name))
    return 0

"""Every weight type side by side with llama.cpp, from one source model (not a test).

    python bench/bench_types.py [--models smollm2-135m qwen2.5-coder-0.5b] [--types q2_k q4_k_m ...]
                                [--threads 1 2] [--reps 3] [--pp 128] [--tg 32]
    python bench/bench_types.py --preset dram   # every type, pure, on DRAM-bound models (issue 13's table)

An F16 copy of each catalogued model is made by llama.cpp's own quantizer (from the cached file,
allow_requantize), then every file type from that F16 (bench/llamacpp_files.py; cached under
$LLAMBDA_HOME/bench_types). Each file runs in our engine and in llama.cpp through `llambda bench`'s runner:
repetitions alternate the engines, medians are printed. Per type: the bytes a decoded token reads, tok/s of
decode (tgN) and prefill (ppN) for both, our/llama.cpp ratios, and our decode's implied GB/s as a % of the
machine's read bandwidth measured (same threads, same moment) at that working set.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # this checkout's llambda
from llamacpp_files import DEFAULT_WORKDIR, FILE_TYPES, f16_source, llama_file  # noqa: E402

from llambda.tools.bench import run_bench  # noqa: E402

DEFAULT_TYPES = ["q2_k", "q3_k_m", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k", "q8_0", "iq4_nl",
                 "iq4_xs", "mxfp4_moe"]
# --preset dram: (model, types) with every matrix in the type (--pure). Qwen2.5-Coder-0.5B's 896-wide
# matrices are no multiple of 256 (llama.cpp keeps them out of the 256-block types), so those run on the 1.5B.
PRESETS = {"dram": [("qwen2.5-coder-0.5b", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "mxfp4_moe"]),
                    ("qwen2.5-coder-1.5b", ["q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"])]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES, choices=sorted(FILE_TYPES))
    ap.add_argument("--pure", action="store_true", help="every matrix in the type (llama-quantize --pure)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="models and types together (implies --pure)")
    a = ap.parse_args()
    plan = PRESETS[a.preset] if a.preset else [(m, a.types) for m in a.models]
    a.pure = a.pure or bool(a.preset)
    head = ("| model | type | threads | MB/token | tg llambda | tg llama.cpp | tg ratio | pp llambda | pp llama.cpp | "
            "pp ratio | decode GB/s (% of read bw) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    print(f"load average at start: {os.getloadavg()}", file=sys.stderr)
    for model, types in plan:
        f16 = f16_source(model, a.workdir)
        for ft in types:
            path = llama_file(f16, ft, a.pure)
            t0 = time.time()
            b = run_bench(path, [a.pp], [a.tg], a.threads, a.reps, vs_llama_cpp=True,
                          log=lambda s: print(s, file=sys.stderr))
            rows = {(r.engine, r.test, r.threads): r for r in b.rows}
            w, kv = b.decode_bytes[f"tg{a.tg}"]
            for t in a.threads:
                tg_o, tg_l = rows[("llambda", f"tg{a.tg}", t)].median, rows[("llama.cpp", f"tg{a.tg}", t)].median
                pp_o, pp_l = rows[("llambda", f"pp{a.pp}", t)].median, rows[("llama.cpp", f"pp{a.pp}", t)].median
                gbs = tg_o * (w + kv) / 1e9
                line = (f"| {model} | {ft.upper()} | {t} | {(w + kv) / 1e6:.1f} | {tg_o:.1f} | {tg_l:.1f} | "
                        f"{tg_o / tg_l:.2f}x | {pp_o:.1f} | {pp_l:.1f} | {pp_o / pp_l:.2f}x | "
                        f"{gbs:.1f} ({100 * gbs / b.bandwidth[t]:.0f}% of {b.bandwidth[t]:.1f}) |")
                lines.append(line)
                print(line, flush=True)
            print(f"  ({time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

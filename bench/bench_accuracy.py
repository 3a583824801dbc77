"""Fast-mode accuracy per weight type, beside our exact mode and llama.cpp (not a test).

    python bench/bench_accuracy.py [--model smollm2-135m] [--types q4_0 q8_0 ...] [--prompts-file FILE]
                                   [--no-llama-cpp] [--json OUT]

For each type, llama.cpp's own pure requantization of an F16 export of the model (every matrix in the
type where its rows are whole blocks: llama.cpp gives a K-quant file's other matrices a 32-block type;
bench/llamacpp_files.py; cached under $LLAMBDA_HOME/bench_types) runs in: our NumPy backend (the
FP32 oracle: the file's weights dequantized, FP32 activations), our native fast mode (8-bit activations),
our native exact mode (activations="f32") and llama.cpp (llama-cpp-python, logits_all). The error at a
position is the worst |difference| from the oracle over the oracle's top-20 logits; the table gives its
mean and worst over every position of the prompts (by default six prompts that are not in this
repository's tests; --prompts-file: one prompt per paragraph, blank-line separated, or a .json list).
The worst over a few hundred positions is one position's and swings with any change of rounding (2026-12-05:
LLB_OUTLIER 4 -> 5 -> 6 took SmolLM2 Q4_0's position 1 from 1.29 to 0.84 to 2.65); --json also holds the 99th percentile, and
--save DIR keeps every position's error (FILE.MODE.npy) to compare builds position by position.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np


sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # this checkout's llambda
from llamacpp_files import DEFAULT_WORKDIR, FILE_TYPES, f16_source, llama_file  # noqa: E402

from llambda.tools.logit_error import errors, llama_cpp_errors, oracle  # noqa: E402

DEFAULT_TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "mxfp4_moe", "q2_k", "q3_k_s", "q4_k_s", "q5_k_s",
                 "q6_k", "iq4_xs"]

PROMPTS = [
    "The migration of monarch butterflies from Canada to central Mexico covers nearly five thousand kilometres, and",
    "import numpy as np\n\ndef moving_average(values, window):\n    \"\"\"Return the moving average.\"\"\"\n",
    "<|im_start|>user\nExplain in two sentences why the sky looks blue during the day.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Die Bibliothek öffnet morgens um neun Uhr, aber am Wochenende bleibt sie geschlossen, weil",
    "Step 1: Preheat the oven to 180 degrees. Step 2: Mix 200 g of flour with 100 g of sugar. Step 3:",
    "SELECT customer_id, SUM(amount) AS total FROM orders WHERE created_at >= '2024-01-01' GROUP BY",
]


def measure(path, prompts, with_llama, threads, save=None):
    ids, refs = oracle(path, prompts)
    row = {"fast": errors(path, ids, refs, backend="native"),
           "exact": errors(path, ids, refs, backend="native", activations="f32")}
    if with_llama:
        row["llama.cpp"] = llama_cpp_errors(path, ids, refs, threads)
    if save:
        save.mkdir(parents=True, exist_ok=True)
        for k, v in row.items():
            np.save(save / f"{Path(path).name}.{k}.npy", v)
    return {k: (float(v.mean()), float(v.max()), float(np.quantile(v, 0.99))) for k, v in row.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a catalogued model or a GGUF path (its F16 export is made)")
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES, choices=sorted(FILE_TYPES))
    ap.add_argument("--prompts-file", type=Path)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--json", type=Path, help="write the figures here too (mean, worst, 99th percentile)")
    ap.add_argument("--save", type=Path, help="a directory for every position's error per file and mode")
    a = ap.parse_args()
    prompts = PROMPTS
    if a.prompts_file and a.prompts_file.suffix == ".json":
        prompts = json.loads(a.prompts_file.read_text())
    elif a.prompts_file:
        prompts = [p.strip("\n") for p in a.prompts_file.read_text().split("\n\n") if p.strip()]
    f16 = f16_source(a.model, a.workdir)
    cols = ["fast", "exact"] + ([] if a.no_llama_cpp else ["llama.cpp"])
    print(f"top-20 logit error vs the FP32 oracle, {len(prompts)} prompts, {f16.name.removesuffix('.F16.gguf')}")
    print("| type | " + " | ".join(f"{c} mean | {c} worst" for c in cols) + " |")
    print("|---" * (1 + 2 * len(cols)) + "|")
    out = {}
    for ft in a.types:
        path = llama_file(f16, ft, pure=True)
        r = measure(path, prompts, not a.no_llama_cpp, a.threads, a.save)
        out[FILE_TYPES[ft]] = r
        print(f"| {FILE_TYPES[ft]} | " + " | ".join(f"{r[c][0]:.3f} | {r[c][1]:.3f}" for c in cols) + " |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

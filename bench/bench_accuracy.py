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
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # this checkout's llambda
from llamacpp_files import DEFAULT_WORKDIR, FILE_TYPES, f16_source, llama_file  # noqa: E402

import llambda  # noqa: E402

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


def all_logits(m, ids):
    n = len(ids)
    return np.array(m.transformer.forward(np.asarray(ids, np.int32), np.zeros(n, np.int32),
                                          np.arange(n, dtype=np.int32), list(range(n))))


def top20_error(got, want):
    top = np.argsort(want, axis=1)[:, -20:]
    return np.abs(np.take_along_axis(got, top, 1) - np.take_along_axis(want, top, 1)).max(axis=1)


def ours(path, ids, refs, **kw):
    with llambda.load(path, n_ctx=256, **kw) as m:
        return np.concatenate([top20_error(all_logits(m, i), r) for i, r in zip(ids, refs)])


def llama_cpp(path, ids, refs, threads):
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), logits_all=True, n_ctx=256, n_threads=threads, verbose=False)
    errs = []
    for i, r in zip(ids, refs):
        llm.reset()
        llm.eval(i)
        errs.append(top20_error(np.asarray(llm.scores[:len(i)], np.float32), r))
    del llm
    return np.concatenate(errs)


def measure(path, prompts, with_llama, threads):
    with llambda.load(path, backend="numpy", n_ctx=256) as m:
        ids = [m.tokenize(p) for p in prompts]
        refs = [all_logits(m, i) for i in ids]
    row = {"fast": ours(path, ids, refs, backend="native"),
           "exact": ours(path, ids, refs, backend="native", activations="f32")}
    if with_llama:
        row["llama.cpp"] = llama_cpp(path, ids, refs, threads)
    return {k: (float(v.mean()), float(v.max())) for k, v in row.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a catalogued model or a GGUF path (its F16 export is made)")
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES, choices=sorted(FILE_TYPES))
    ap.add_argument("--prompts-file", type=Path)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--json", type=Path, help="write the figures here too")
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
        r = measure(path, prompts, not a.no_llama_cpp, a.threads)
        out[FILE_TYPES[ft]] = r
        print(f"| {FILE_TYPES[ft]} | " + " | ".join(f"{r[c][0]:.3f} | {r[c][1]:.3f}" for c in cols) + " |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Perplexity per quant type: our engine against llama.cpp on the same files, and our quantizer against
llama.cpp's (not a test).

    python bench/bench_perplexity.py [--model smollm2-135m] [--types q2_k q3_k_m ...] [--chunks 4]
                                     [--ctx 512] [--text FILE ...] [--threads 2]

From an F16 copy of the model made by llama.cpp's quantizer (bench/llamacpp_files.py), each file type is
made twice: by llama.cpp's quantizer and by `llambda quantize` (tools/export.py). The text (default: the
repository's own prose: tests/fixtures/text, README.md, docs/) is tokenized once by our tokenizer and cut
into windows of --ctx tokens as `llambda perplexity` does (tools/perplexity.py: the first token of a window
replaced by BOS, the second half scored); llama.cpp scores the same token windows from its own logits
(llama-cpp-python, every row's logits). Columns: llama.cpp's file in our engine and in llama.cpp (their
difference: our arithmetic), and our quantizer's file in our engine (its difference to llama.cpp's file:
our quantizer).
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this checkout's llambda, not an installed one
from llamacpp_files import DEFAULT_WORKDIR, FILE_TYPES, _llama_cpp, f16_source, llama_file  # noqa: E402

from llambda.tools.perplexity import _log_softmax_at, perplexity  # noqa: E402

DEFAULT_TYPES = ["q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0", "iq4_xs"]
REPO = HERE.parent
DEFAULT_TEXT = sorted((REPO / "tests" / "fixtures" / "text").glob("*.txt")) + [REPO / "README.md"] + sorted(
    (REPO / "docs").glob("*.md"))


def ours(path, text: str, ctx: int, chunks: int) -> float:
    from llambda import load
    model = load(str(path), n_ctx=ctx)
    return perplexity(model, text, n_ctx=ctx, max_windows=chunks).ppl


def token_windows(path, text: str, ctx: int, chunks: int) -> list[np.ndarray]:
    """The windows `llambda perplexity` scores (our tokenizer; BOS first when the model uses one)."""
    from llambda import load
    tok = load(str(path), n_ctx=ctx, backend="numpy")._tok()
    ids = tok.encode(text, add_bos=tok.add_bos, parse_special=False)
    out = []
    for w in range(min(len(ids) // ctx, chunks)):
        win = np.array(ids[w * ctx:(w + 1) * ctx], np.int32)
        if tok.add_bos and tok.bos_id is not None:
            win[0] = tok.bos_id
        out.append(win)
    return out


def llama_cpp_ppl(path, windows: list[np.ndarray], ctx: int, threads: int) -> float:
    L = _llama_cpp()
    llm = L.Llama(model_path=str(path), n_ctx=ctx, n_batch=ctx, logits_all=True, n_threads=threads,
                  n_threads_batch=threads, verbose=False)
    first, total, count = ctx // 2, 0.0, 0
    for win in windows:
        llm.reset()
        llm.eval([int(t) for t in win])
        logits = np.asarray(llm.scores[first:ctx - 1], np.float32)
        total -= float(_log_softmax_at(logits, win[first + 1:]).sum())
        count += ctx - 1 - first
    llm.close()
    return math.exp(total / count)


def ours_quantized(f16: Path, ftype: str) -> Path:
    from llambda.tools.export import export
    out = f16.parent / f"{f16.name.removesuffix('.F16.gguf')}.{ftype.upper()}.llambda.gguf"
    # made afresh each run (seconds for small models): a kept file would hide a change to our quantizer
    t0 = time.time()
    export(f16, out.with_suffix(".part"), qtype=ftype, progress=False)
    out.with_suffix(".part").rename(out)
    print(f"  llambda quantize {ftype}: {time.time() - t0:.0f} s", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES, choices=sorted(FILE_TYPES))
    ap.add_argument("--text", nargs="+", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    a = ap.parse_args()
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in a.text)
    f16 = f16_source(a.model, a.workdir)
    windows = token_windows(f16, text, a.ctx, a.chunks)
    print(f"{a.model}: {len(windows)} windows of {a.ctx} tokens; load average {os.getloadavg()[0]:.1f}",
          file=sys.stderr)
    head = ("| type | llama.cpp's file: llambda | llama.cpp | difference | our quantizer's file: llambda | "
            "vs llama.cpp's file |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for ft in ["f16"] + a.types:
        theirs = f16 if ft == "f16" else llama_file(f16, ft)
        p_ours = ours(theirs, text, a.ctx, a.chunks)
        p_ref = llama_cpp_ppl(theirs, windows, a.ctx, a.threads)
        line = f"| {ft.upper()} | {p_ours:.4f} | {p_ref:.4f} | {100 * (p_ours / p_ref - 1):+.2f}% |"
        if ft != "f16":
            q = ours_quantized(f16, ft)
            p_q = ours(q, text, a.ctx, a.chunks)
            line += f" {p_q:.4f} | {100 * (p_q / p_ours - 1):+.2f}% |"
        else:
            line += " - | - |"
        lines.append(line)
        print(line, flush=True)
    print(f"load average at end: {os.getloadavg()}", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

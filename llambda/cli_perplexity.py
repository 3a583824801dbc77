"""`llambda perplexity -m MODEL -f TEXT [--ctx 512]`."""
from __future__ import annotations

import sys


def register(sub, add_model_args) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)")
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="text file")
    p.add_argument("--ctx", type=int, default=512, help="window length in tokens (default 512)")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many windows")
    p.set_defaults(fn=run)


def run(a) -> int:
    from .api import load
    from .perplexity import perplexity

    with open(a.file, encoding="utf-8") as f:
        text = f.read()
    model = load(a.model, backend=a.backend, threads=a.threads, n_ctx=max(a.ctx, a.ctx_size or 0),
                 activations=a.activations)

    def show(i, ppl):
        print(f"[{i}]{ppl:.4f}", end=" ", flush=True, file=sys.stderr)

    res = perplexity(model, text, n_ctx=a.ctx, max_windows=a.chunks, progress=show)
    print(file=sys.stderr)
    print(f"{res.n_windows} windows of {a.ctx} tokens, {res.n_scored} tokens scored")
    print(f"perplexity: {res.ppl:.4f}")
    return 0

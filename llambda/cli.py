"""The `llambda` command: run | chat | serve | bench | perplexity | tokenize | pull | export."""
from __future__ import annotations

import argparse
import os
import sys
import time

# Our C thread pool owns the cores; a second pool (OpenBLAS) spinning beside it collapses both.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .errors import LlambdaError
from .hub import DEFAULT_MODEL


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=DEFAULT_MODEL,
                   help=f"catalogued name, .gguf file or HF directory (default {DEFAULT_MODEL})")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--backend", choices=["native", "numpy"], default=None, help="default: native where it built")
    p.add_argument("--activations", choices=["q8", "f32"], default=None,
                   help="native backend: q8 (fast, default) or f32 (exact)")
    p.add_argument("--kv-type", choices=["f32", "f16"], default=None,
                   help="native backend: KV cache precision (default f32, for serve f16; f16 halves its memory)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, help="context length (default min(train, 4096))")
    p.add_argument("-v", "--verbose", action="store_true", help="print memory budget and tokens/s")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256)
    p.add_argument("--temperature", "--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def _sampling_kwargs(a) -> dict:
    return dict(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, repeat_last_n=a.repeat_last_n,
                presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty, seed=a.seed,
                stop=a.stop, ignore_eos=a.ignore_eos)


def _load(a, **extra):
    from .api import load
    t0 = time.perf_counter()
    model = load(a.model, backend=a.backend, threads=a.threads, n_ctx=a.ctx_size, activations=a.activations,
                 kv_type=a.kv_type, **extra)
    if a.verbose:
        mem = model.memory_report()
        parts = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in mem.items())
        print(f"[llambda] {model.name}: {model.config.arch}, backend {model.backend.name} ({model.backend.precision}), "
              f"ctx {model.n_ctx}, loaded in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        print(f"[llambda] memory: {parts}", file=sys.stderr)
    return model


def _stream_out(events, verbose: bool, t_start: float) -> str:
    n, first, text = 0, None, []
    for ev in events:
        if ev.token >= 0:
            n += 1
            if first is None:
                first = time.perf_counter()
        if ev.text:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            text.append(ev.text)
    end = time.perf_counter()
    if verbose:
        pre = (first or end) - t_start
        dec = (n - 1) / (end - first) if first and n > 1 and end > first else 0.0
        print(f"\n[llambda] {n} tokens; first token after {pre * 1000:.0f} ms; decode {dec:.1f} tokens/s",
              file=sys.stderr)
    return "".join(text)


def cmd_run(a) -> int:
    model = _load(a)
    prompt = a.prompt if a.prompt is not None else sys.stdin.read()
    t0 = time.perf_counter()
    _stream_out(model.stream(prompt, **_sampling_kwargs(a)), a.verbose, t0)
    sys.stdout.write("\n")
    return 0


def cmd_chat(a) -> int:
    model = _load(a)
    model.chat_template()    # a clear error now for a model without a template
    history = [{"role": "system", "content": a.system}] if a.system else []
    interactive = sys.stdin.isatty()
    while True:
        try:
            if interactive:
                line = input("> ")
            else:
                line = sys.stdin.readline()
                if not line:
                    break
                line = line.rstrip("\n")
        except (EOFError, KeyboardInterrupt):
            break
        if not line.strip():
            continue
        if line.strip() in ("/exit", "/quit"):
            break
        history.append({"role": "user", "content": line})
        t0 = time.perf_counter()
        reply = _stream_out(model.chat_stream(history, **_sampling_kwargs(a)), a.verbose, t0)
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": reply})
    return 0


def cmd_pull(a) -> int:
    from .hub import pull
    print(pull(a.name, progress=True))
    return 0


def cmd_tokenize(a) -> int:
    from pathlib import Path
    from .hub import resolve
    from .loader import open_model
    src = open_model(Path(resolve(a.model)))
    tok = src.tokenizer
    if tok is None:
        raise LlambdaError(src.tokenizer_error or "no tokenizer")
    ids = tok.encode(a.text, add_bos=a.add_bos, parse_special=not a.no_parse_special)
    if a.ids:
        print(ids)
    else:
        for i in ids:
            print(f"{i:>8} {tok.token_text(i)!r}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llambda", description="CPU inference for LLMs")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="complete a prompt, streaming to stdout")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="interactive chat with history")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("pull", help="download a catalogued model into the cache")
    p.add_argument("name")
    p.set_defaults(fn=cmd_pull)

    p = sub.add_parser("tokenize", help="show the tokens of a text")
    p.add_argument("-m", "--model", default=DEFAULT_MODEL)
    p.add_argument("text")
    p.add_argument("--ids", action="store_true", help="print only the id list")
    p.add_argument("--add-bos", action="store_true")
    p.add_argument("--no-parse-special", action="store_true")
    p.set_defaults(fn=cmd_tokenize)

    for extra in ("bench", "perplexity", "serve", "export"):
        try:
            mod = __import__(f"llambda.cli_{extra}", fromlist=["register"])
        except ImportError:
            continue
        mod.register(sub, _add_model_args)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.fn(a) or 0
    except KeyboardInterrupt:
        return 130
    except (LlambdaError, FileNotFoundError, ValueError) as e:
        print(f"llambda: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""`llambda pull | list | rm | show`: the model cache and what a model holds, as Ollama's commands of
those names (their parsers are in cli.py's build_parser)."""
from __future__ import annotations

import sys

from ..hub import DEFAULT_MODEL
from ..models import ENCODERS


def cmd_pull(a) -> int:
    from ..hub import pull
    # progress (a bar, pip's own) only to a terminal: a redirected stderr got the bar's every redraw
    # (its one-line outcome, sha256 verified, always: a log wants it too)
    print(pull(a.name, progress=sys.stderr.isatty(), force=a.force, report=True))
    return 0


def cmd_list(a) -> int:
    from .. import hub
    rows = [("NAME", "ARCH", "QUANT", "SIZE", "STATE", "PATH")]
    for name, e in sorted(hub.CATALOG.items()):
        state = "downloaded" if hub.is_downloaded(name) else (
            "unverified" if hub.is_cached(name) else "-")
        rows.append((name + (" (default)" if name == DEFAULT_MODEL else ""), e.arch, hub.quant_type(e),
                     f"{e.size / 1e6:.0f} MB", state, str(hub.cached_path(name))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths)) + "  " + r[-1])
    print(f"\ncache: {hub.models_dir()} (LLAMBDA_HOME={hub.home()})")
    return 0


def cmd_rm(a) -> int:
    from ..hub import remove
    for name in a.names:
        print(f"removed {remove(name)}")
    return 0


def cmd_show(a) -> int:
    from .. import hub
    from ..formats.open import open_named
    from ..tools.model_info import describe, format_description

    if hub.is_catalogued(a.model) and not hub.is_cached(a.model):
        e = hub.CATALOG[a.model]
        print(f"{a.model}: {e.arch}, {hub.quant_type(e)}, {e.size / 1e6:.0f} MB, not downloaded "
              f"(`llambda pull {a.model}` fetches it)")
        return 0
    if a.ctx_size is not None and a.ctx_size < 0:      # was planned as printed: "-0.2 MiB of KV cache"
        raise ValueError(f"-c/--ctx-size must be >= 0 (0: the default), got {a.ctx_size}")
    _, src = open_named(a.model)
    try:
        c = src.config
        if getattr(c, "arch", None) in ENCODERS:      # an encoder: no KV cache, no generation
            import math
            params = sum(math.prod(src.tensor(n).shape) for n in src.tensor_names)
            kind = "cross-encoder (reranker)" if c.n_labels else f"embedding model, {c.pooling} pooling"
            print(f"{src.name}: {c.arch} encoder, {kind}\n  {c.n_layers} layers, hidden {c.hidden}, {c.n_heads} heads, "
                  f"ffn {c.ffn}, vocab {c.vocab_size}, up to {c.max_tokens} tokens\n  {params / 1e6:.1f}M parameters")
            if a.verbose:
                _print_default_plan(src, a)
            return 0
        print(format_description(describe(src, a.ctx_size, a.kv_type or "f32")))
        if a.verbose:
            _print_default_plan(src, a)
    finally:
        src.close()
    return 0


def _print_default_plan(src, a) -> None:
    """The memory plan `llambda run -m MODEL` would make: the default backend's (the types it converts
    counted as it keeps them, not at the file's size), with the vision tower the model's files hold."""
    from ..api import DEFAULT_CTX, plan_memory
    from ..backends import create_backend
    be = create_backend(None, threads=1, kv_type=a.kv_type or "f32")
    trained = getattr(src.config, "n_ctx_train", DEFAULT_CTX)      # (an encoder's plan has no context)
    p = plan_memory(src, be, a.ctx_size or min(trained, DEFAULT_CTX), vision=True)
    print(f"memory plan ({be.name} backend):\n" + "\n".join(f"  {line}" for line in p.lines()))

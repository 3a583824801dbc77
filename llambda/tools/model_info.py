"""What a model file holds, read from its header alone (`llambda show`): no weights are loaded."""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

from ..formats.quants import tensor_nbytes
from ..formats.source import ModelSource
from ..models.memory import kv_value_bytes


def describe(src: ModelSource, n_ctx: int | None = None, kv_type: str = "f32") -> dict:
    """Architecture, parameters, context, quant mix (bytes per type), template, memory at `n_ctx` with a
    KV cache of kv_type."""
    cfg = src.config
    shares = src.shares_by_type()
    params = sum(s.params for s in shares.values())
    bytes_by_type = Counter({k: s.nbytes for k, s in shares.items()})
    weights = sum(bytes_by_type.values())
    active = params
    if cfg.n_experts:   # a token uses k of each MoE layer's experts
        experts = sum(int(np.prod(src.tensor(n).shape)) for n in src.tensor_names if is_expert_tensor(n))
        active = params - experts + experts * cfg.n_experts_used // cfg.n_experts
    ctx = n_ctx or min(cfg.n_ctx_train, 4096)
    # only the layers that keep keys and values: none in a state-space model (Mamba), a hybrid's attention layers
    kept = len(cfg.cache_layers())
    attends = bool(kept)
    kv = int(2 * kept * ctx * kv_value_bytes(kv_type, cfg.kv_dim))   # one sequence
    return {
        "name": src.name, "path": str(src.path), "format": src.format, "architecture": cfg.arch,
        "parameters": params, "active_parameters": active, "layers": cfg.n_layers, "d_model": cfg.d_model,
        "heads": f"{cfg.n_heads} (kv {cfg.n_kv_heads}, dim {cfg.head_dim})" if attends else "none (no attention layer)",
        "vocab": cfg.vocab_size,
        "context_train": cfg.n_ctx_train, "weights_bytes": weights,
        "quant_mix": {k: (shares[k].tensors, v) for k, v in bytes_by_type.most_common()},
        "chat_template": bool(src.chat_template), "tokenizer": src.tokenizer is not None,
        "context": ctx, "kv_cache_bytes": kv, "kv_type": kv_type, "memory_bytes": weights + kv,
    }


_EXPERT_NAME = re.compile(r"blk\.\d+\.ffn_(gate|up|down)(_exps|\.\d+)\.(weight|bias)")


def is_expert_tensor(name: str) -> bool:
    """A routed expert's weights: GGUF's 3-D `*_exps`, or an older file's one tensor per expert."""
    return bool(_EXPERT_NAME.fullmatch(name))


def decode_weight_bytes(src: ModelSource) -> int:
    """Weight bytes one decode token reads: every tensor but the embedding table, of which it
    reads one row, unless the table is also the output head (tied), which reads all of it; of an
    MoE layer's routed experts (`*_exps`), the k a token uses (its active parameters)."""
    cfg = src.config
    total, embd = 0, 0
    for name, t in src.tensors():
        nbytes = tensor_nbytes(t.qtype, t.shape)
        if cfg.n_experts and is_expert_tensor(name):
            nbytes = nbytes * cfg.n_experts_used // cfg.n_experts
        if name == "token_embd.weight":
            embd = nbytes
        else:
            total += nbytes
    tied = "output.weight" not in src.tensor_names
    return total + (embd if tied else embd // max(src.config.vocab_size, 1))


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def format_description(d: dict) -> str:
    mix = ", ".join(f"{k} {c} tensors {_mib(b)}" for k, (c, b) in d["quant_mix"].items())
    rows = [
        ("metadata name", d["name"]), ("file", f"{d['path']} ({d['format']})"), ("architecture", d["architecture"]),
        ("parameters", f"{d['parameters'] / 1e6:.1f} M" + (
            f" ({d['active_parameters'] / 1e6:.1f} M active per token)" if d["active_parameters"] != d["parameters"]
            else "")), ("layers", d["layers"]), ("width", d["d_model"]),
        ("heads", d["heads"]), ("vocabulary", d["vocab"]), ("trained context", d["context_train"]),
        ("weights", f"{_mib(d['weights_bytes'])}: {mix}"),
        ("chat template", "yes" if d["chat_template"] else "no (a base model: use `llambda run`)"),
        ("tokenizer", "yes" if d["tokenizer"] else "no"),
        ("memory", f"{_mib(d['memory_bytes'])} at a context of {d['context']} "
                   f"(weights + {_mib(d['kv_cache_bytes'])} of {d.get('kv_type', 'f32')} KV cache)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

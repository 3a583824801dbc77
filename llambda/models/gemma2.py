"""Gemma 2: Gemma's (1 + w) RMSNorms, four per layer (sandwich), GELU-tanh, embeddings
scaled by sqrt(d_model), soft-capped attention scores and logits, and sliding-window
layers alternating with global ones (layer i slides when i is even)."""
from __future__ import annotations

import math

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, hf_sliding_flags, is_flag

# llama.cpp facts: GGUF stores neither the layer pattern nor the attention scale for
# Gemma 2; the 27B model (46 layers) scales by (d_model / n_heads)^-0.5, the others by head_dim^-0.5.
_GGUF_27B_LAYERS = 46


def _alternating(n: int) -> list[bool]:
    return [i % 2 == 0 for i in range(n)]


def _gguf_layer_sliding(hp: GGUFHParams, n: int) -> list[bool]:
    """Per-layer flags from `{arch}.attention.sliding_window_pattern` (an int period, or one bool
    per layer, true = sliding), else Gemma 2's alternation."""
    key = f"{hp.arch}.attention.sliding_window_pattern"
    pat = hp.meta.get(key)
    if pat is None:
        return _alternating(n)
    if isinstance(pat, (list, tuple)):
        if len(pat) != n:
            raise ModelFormatError(f"{key!r} lists {len(pat)} layers, the model has {n}")
        if not all(is_flag(x) for x in pat):
            # a string (even "false") would count as true
            raise ModelFormatError(f"{key!r} must hold a bool per layer, got {[type(x).__name__ for x in pat][:4]}...")
        return [bool(x) for x in pat]
    period = hp.int("attention.sliding_window_pattern", limit="window_pattern")
    return [(i % period) < period - 1 for i in range(n)]   # every period-th layer is global


def _gguf_attn_scale(hp: GGUFHParams, c: dict, big_layers: int) -> float:
    if f"{hp.arch}.attention.scale" in hp.meta:
        return hp.float("attention.scale", limit="attn_scale")
    if c["n_layers"] == big_layers:
        return (c["d_model"] / c["n_heads"]) ** -0.5
    return c["head_dim"] ** -0.5


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "gemma2")
    c = hp.common()
    return TransformerConfig(
        **c, rope_neox=True, activation="gelu_tanh", post_norms=True,   # GGUF norms already hold 1 + w
        embed_scale=math.sqrt(c["d_model"]),
        sliding_window=hp.int("attention.sliding_window", 4096, "sliding_window"),
        layer_sliding=_gguf_layer_sliding(hp, c["n_layers"]),
        attn_scale=_gguf_attn_scale(hp, c, _GGUF_27B_LAYERS),
        attn_softcap=hp.float("attn_logit_softcapping", 50.0, "attn_softcap"),
        final_softcap=hp.float("final_logit_softcapping", 30.0, "final_softcap"),
    )


def check_hf_activation(cfg: dict) -> None:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh", "gelu"):
        # plain "gelu" appears in early Gemma configs, whose checkpoints were trained with the tanh form
        raise ModelFormatError(f"config.json activation {act!r} is not supported for Gemma (gelu_pytorch_tanh)")


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_activation(cfg)
    hf = HFConfig(cfg)
    c = hf.common("gemma2")
    n = c["n_layers"]
    flags = hf_sliding_flags(cfg.get("layer_types"), n)
    flags = _alternating(n) if flags is None else flags
    c["tie_embeddings"] = hf.flag("tie_word_embeddings", True)
    return TransformerConfig(
        **c, activation="gelu_tanh", post_norms=True, norm_offset=1.0,
        embed_scale=math.sqrt(c["d_model"]),
        sliding_window=hf.get("sliding_window", 4096, int, "sliding_window"),
        layer_sliding=flags,
        attn_scale=hf.get("query_pre_attn_scalar", c["head_dim"], float, "positive") ** -0.5,
        attn_softcap=hf.get("attn_logit_softcapping", 0.0, float, "attn_softcap"),
        final_softcap=hf.get("final_logit_softcapping", 0.0, float, "final_softcap"),
    )

"""Phi-3: Llama-shaped, with fused projections: `qkv_proj` (q, k, v rows) and
`gate_up_proj` (gate rows, then up rows). Both HF and GGUF keep them fused; the
loader serves the separate tensors from them (models/base.py: unfused_lookup).
A sliding window, when configured, applies to every layer."""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "phi3")
    if "phi3.rope.scaling.attn_factor" in meta:
        raise ModelFormatError("Phi-3 long-context RoPE (LongRoPE) is not supported")
    return TransformerConfig(**hp.common(), rope_neox=True, sliding_window=hp.int("attention.sliding_window", 0, "sliding_window"))


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common("phi3")
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ModelFormatError(f"config.json partial_rotary_factor {partial!r} must be in (0, 1]")
    c["rope_dim"] = int(c["head_dim"] * partial)
    return TransformerConfig(**c, sliding_window=hf.window())

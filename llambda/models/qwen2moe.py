"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases), MoE MLPs whose
top-k weights are not renormalised by default, plus a shared expert on every token scaled by
sigmoid(h . shared_expert_gate), a vector every checkpoint with a shared expert holds."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams
from .mistral import hf_common_sliding
from .moe import gguf_moe, hf_moe


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen2moe")
    return TransformerConfig(**hp.common(), rope_neox=True, attn_bias=True, shared_expert_gate=True,
                             **gguf_moe(hp, norm_default=False))


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "qwen2moe", default_sliding=False)
    return TransformerConfig(**c, attn_bias=True, shared_expert_gate=True,
                             **hf_moe(cfg, c["n_layers"], norm_default=False))

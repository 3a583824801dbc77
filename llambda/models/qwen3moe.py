"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention (q/k norms), MoE MLPs with
a softmax router over all experts, top-k, renormalised when `norm_topk_prob`; no shared expert."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .mistral import hf_common_sliding
from .moe import gguf_moe, hf_moe


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen3moe")
    # llama.cpp always renormalises Qwen3-MoE's top-k weights (every released model sets norm_topk_prob)
    return TransformerConfig(**hp.common(), rope_neox=True, qk_norm=True, **gguf_moe(hp, norm_default=True))


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "qwen3moe", default_sliding=False)
    return TransformerConfig(**c, qk_norm=True, attn_bias=HFConfig(cfg).flag("attention_bias", False),
                             **hf_moe(cfg, c["n_layers"], norm_default=False))

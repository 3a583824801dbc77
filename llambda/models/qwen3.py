"""Qwen3 (dense): Llama with RMSNorm on each q and k head before RoPE, an explicit
head_dim (128 in the real models, independent of hidden_size / heads), no biases."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .mistral import hf_common_sliding


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen3")
    return TransformerConfig(**hp.common(), rope_neox=True, qk_norm=True)


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "qwen3", default_sliding=False)
    return TransformerConfig(**c, qk_norm=True, attn_bias=HFConfig(cfg).flag("attention_bias", False))

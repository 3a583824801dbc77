"""Qwen2 / Qwen2.5: Llama with q/k/v biases and NeoX RoPE."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams
from .mistral import hf_common_sliding


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen2")
    return TransformerConfig(**hp.common(), rope_neox=True, attn_bias=True)


def config_from_hf(cfg: dict) -> TransformerConfig:
    return TransformerConfig(**hf_common_sliding(cfg, "qwen2", default_sliding=False), attn_bias=True)

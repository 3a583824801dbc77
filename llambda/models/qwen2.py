"""Qwen2 / Qwen2.5: Llama with q/k/v biases and NeoX RoPE."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp
from .mistral import hf_layer_sliding


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen2")
    return TransformerConfig(**hp.common(), rope_neox=True, attn_bias=True)


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    c = HFConfig(cfg).common("qwen2")
    window, flags = hf_layer_sliding(cfg, c["n_layers"], default_sliding=False)
    return TransformerConfig(**c, attn_bias=True, sliding_window=window, layer_sliding=flags)

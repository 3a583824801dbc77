"""Gemma 1 (HF GemmaForCausalLM; llama.cpp `gemma`): Llama's block with Gemma's RMSNorms computing x * (1 + w)
(HF stores w; GGUF stores 1 + w), embeddings scaled by sqrt(hidden_size), a gated GELU (tanh approximation) MLP,
half-split RoPE and an explicit head_dim (7B: 16 heads of 256 over a hidden size of 3072). No soft-capping,
sliding windows or post-norms (Gemma 2's).

Attention scale head_dim^-0.5 in both formats (llama.cpp's gemma scales q by 1 / sqrt(head_dim)). Biases where
config.json's `attention_bias` says so (q/k/v/o), or where a GGUF holds them. A tied head (the embedding).
"""
from __future__ import annotations

import math

from ..errors import ModelFormatError
from .config import TransformerConfig
from .gemma2 import check_hf_activation
from .hparams import GGUFHParams, HFConfig

SHAPE = dict(activation="gelu_tanh", rope_neox=True)


def config_from_gguf(meta: dict) -> TransformerConfig:
    c = GGUFHParams(meta, "gemma").common()
    return TransformerConfig(**c, **SHAPE, embed_scale=math.sqrt(c["d_model"]))     # GGUF norms hold 1 + w


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_activation(cfg)
    hf = HFConfig(cfg)
    if hf.flag("use_bidirectional_attention", False):
        raise ModelFormatError("config.json use_bidirectional_attention=true (an encoder's attention) is not supported")
    c = {**hf.common("gemma"), "tie_embeddings": hf.flag("tie_word_embeddings", True)}
    c["attn_bias"] = c["attn_out_bias"] = hf.flag("attention_bias", False)      # q/k/v and o alike
    return TransformerConfig(**c, activation="gelu_tanh", norm_offset=1.0, embed_scale=math.sqrt(c["d_model"]))

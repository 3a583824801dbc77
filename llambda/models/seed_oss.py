"""Seed-OSS (HF SeedOssForCausalLM; llama.cpp's `seed_oss`): Llama with q/k/v biases (`attention_bias`, true by
default) and an optional o_proj bias (`attention_out_bias`, false in the released model), a head_dim of its own
(128 over hidden 5120), SiLU-gated MLP, half-split RoPE in both formats.

GGUF: llama.cpp names the norm before the MLP `post_attention_norm` (the canonical ffn_norm), and its seed_oss
reads no o_proj bias: a file with one runs here, not there.
"""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp

GGUF_NAMES = {"ffn_norm.weight": "post_attention_norm.weight"}


def config_from_gguf(meta: dict) -> TransformerConfig:
    # q/k/v (and o) biases: read from the tensors the file holds (formats/gguf_model.biases_from_tensors)
    return TransformerConfig(**GGUFHParams(meta, "seed_oss").common(), rope_neox=True)


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    return TransformerConfig(**hf.common("seed_oss"), attn_bias=hf.flag("attention_bias", True),
                             attn_out_bias=hf.flag("attention_out_bias", False))


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """An o_proj bias wherever the file holds one (no key says so)."""
    if any(n.endswith("attn_output.bias") for n in names):
        cfg.attn_out_bias = True

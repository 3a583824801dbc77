"""Granite (3.x, dense): Llama with four scalar multipliers: the embeddings are multiplied by
`embedding_multiplier`, every sublayer output by `residual_multiplier` before the residual add,
attention scores by `attention_multiplier` (instead of head_dim^-0.5), and the logits are
divided by `logits_scaling`. GGUF (llama.cpp's keys): `{arch}.embedding_scale`,
`{arch}.residual_scale`, `{arch}.attention.scale`, `{arch}.logit_scale`; q/k rows permuted
for adjacent-pair RoPE, as in `llama` files. The MoE and hybrid Granite families
(granitemoe.py, granitehybrid.py) take the multipliers from here.
"""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp


def gguf_scales(hp: GGUFHParams, head_dim: int) -> dict:
    """Granite's four multipliers from llama.cpp's keys (each optional, 1 / head_dim^-0.5 without)."""
    return dict(embed_scale=hp.float("embedding_scale", 1.0, "embed_scale"),
                residual_scale=hp.float("residual_scale", 1.0, "residual_scale"),
                attn_scale=hp.float("attention.scale", head_dim ** -0.5, "attn_scale"),
                logit_scale=hp.float("logit_scale", 1.0, "logit_scale"))


def hf_scales(hf: HFConfig, head_dim: int) -> dict:
    """Granite's four multipliers from config.json."""
    return dict(embed_scale=hf.get("embedding_multiplier", 1.0, float, "embed_scale"),
                residual_scale=hf.get("residual_multiplier", 1.0, float, "residual_scale"),
                attn_scale=hf.get("attention_multiplier", head_dim ** -0.5, float, "attn_scale"),
                logit_scale=hf.get("logits_scaling", 1.0, float, "logit_scale"))


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "granite")
    c = hp.common()
    return TransformerConfig(**c, rope_neox=False, **gguf_scales(hp, c["head_dim"]))


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common("granite")
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False), **hf_scales(hf, c["head_dim"]))

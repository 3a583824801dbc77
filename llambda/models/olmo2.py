"""OLMo 2: no pre-norms; RMSNorms on each sublayer's output before the residual add
(`post_attention_layernorm`, `post_feedforward_layernorm`), and q/k RMSNorms over the whole
q and k projections (not per head), before RoPE. GGUF `olmo2` keeps the half-split RoPE layout.
"""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp

_SHAPE = dict(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_whole=True)


def config_from_gguf(meta: dict) -> TransformerConfig:
    return TransformerConfig(**GGUFHParams(meta, "olmo2").common(), rope_neox=True, **_SHAPE)


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    return TransformerConfig(**HFConfig(cfg).common("olmo2"), attn_bias=HFConfig(cfg).flag("attention_bias", False),
                             **_SHAPE)

"""Arcee AFM (HF ArceeForCausalLM; llama.cpp's `arcee`): Llama's attention and norms with an MLP without a gate,
down(relu(up(x))^2) (`hidden_act` relu2), and RoPE that may be YaRN-scaled (AFM-4.5B: factor 20).

GGUF: llama.cpp runs `arcee` with its NORM (adjacent-pair) rope, its converter permuting the q/k rows as for
`llama` (formats/rope_rows.py); YaRN under the usual rope.scaling.* keys.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig


def config_from_gguf(meta: dict) -> TransformerConfig:
    return TransformerConfig(**GGUFHParams(meta, "arcee").common(), rope_neox=False, activation="relu2")


def check_hf_ungated_mlp(cfg: dict, act: str, family: str) -> None:
    """An MLP without a gate (Arcee's, Apertus'): config.json's hidden_act must be the family's, no MLP biases."""
    have = cfg.get("hidden_act", act)
    if have != act:
        raise ModelFormatError(f"config.json hidden_act {have!r} is not supported for {family} ({act})"[:200])
    if HFConfig(cfg).flag("mlp_bias", False):
        raise ModelFormatError("config.json mlp_bias=true is not supported")


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_ungated_mlp(cfg, "relu2", "Arcee")
    hf = HFConfig(cfg)
    return TransformerConfig(**hf.common("arcee"), attn_bias=hf.flag("attention_bias", False), activation="relu2")

"""Llama (and SmolLM2, Mistral-style): RMSNorm, RoPE, GQA, SwiGLU."""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .moe import gguf_moe


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "llama")
    # GGUF llama files store q/k rows permuted for adjacent-pair RoPE.
    # Mistral v0.1 converts to `llama` too; a window key, when a writer stored one, applies to every layer.
    # Mixtral converts to `llama` too, with expert tensors and llama.expert_count (renormalised top-k).
    return TransformerConfig(**hp.common(), rope_neox=False,
                             sliding_window=hp.int("attention.sliding_window", 0, "sliding_window"),
                             **gguf_moe(hp, norm_default=True))


def check_hf_mlp(cfg: dict) -> None:
    """The Llama family's MLP is SiLU-gated without biases; refuse anything else rather than run it wrong."""
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelFormatError(f"config.json hidden_act {act!r} is not supported for this architecture (silu)")
    if HFConfig(cfg).flag("mlp_bias", False):
        raise ModelFormatError("config.json mlp_bias=true is not supported")


def config_from_hf(cfg: dict) -> TransformerConfig:
    hf = HFConfig(cfg)
    check_hf_mlp(cfg)
    return TransformerConfig(**hf.common("llama"), attn_bias=hf.flag("attention_bias", False))

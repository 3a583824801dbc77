"""Cohere Command-R / Aya (HF CohereForCausalLM; llama.cpp `command-r`): one LayerNorm without bias per layer
feeding attention and the MLP in parallel (x += attn(h) + mlp(h), h the one norm of x), the logits multiplied
by `logit_scale`, optional per-head q/k LayerNorms (`use_qk_norm`: a weight per head, (heads, head_dim)),
RoPE in adjacent pairs.

RoPE: transformers' Cohere rotates (2i, 2i + 1) (its rotate_half interleaves); llama.cpp runs `command-r` with
its NORM (adjacent-pair) rope and its converter keeps HF's q/k rows, so both formats hold one layout.
Logit scale: HF's `logit_scale` and GGUF's `{arch}.logit_scale` multiply the logits (TransformerConfig's
logit_scale divides them: its reciprocal here); llama.cpp skips a scale of 0. The norm epsilon is
`layer_norm_eps` / `{arch}.attention.layer_norm_epsilon`. q/k norms of a GGUF are read from its tensors
(llama.cpp loads them only in a model of at least 64 layers, Command R+).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp

# q/k rows in adjacent-pair order in the HF files too (formats/hf_dir.py keeps rope_neox as read)
HF_ROPE_NEOX = False
BLOCK = dict(norm_kind="layer", parallel_block=True, rope_neox=False)


def logit_divisor(scale: float, what: str) -> float:
    """TransformerConfig's logit_scale (a divisor) from Cohere's multiplier; 0 is no scale (llama.cpp's rule)."""
    if scale == 0:
        return 1.0
    if scale < 0:
        raise ModelFormatError(f"{what} = {scale!r}: a negative logit scale is not supported")
    return 1.0 / scale


def hf_common(cfg: dict, arch: str) -> dict:
    """The fields config.json spells alike in Cohere and Cohere2 (MLP checked first)."""
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "Cohere")
    hf = HFConfig(cfg)
    c = hf.common(arch)
    pct = hf.get("rotary_pct", 1.0, float, "any")
    if pct != 1.0:      # transformers rotates every dim whatever it says; llama.cpp's converter would not
        raise ModelFormatError(f"config.json 'rotary_pct' = {pct!r}: only 1.0 (every dim rotated) is supported")
    bias = hf.flag("attention_bias", False)
    c.update(BLOCK, norm_eps=hf.get("layer_norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", True), attn_bias=bias, attn_out_bias=bias,
             logit_scale=logit_divisor(hf.get("logit_scale", 0.0625, float, "any"), "config.json 'logit_scale'"))
    return c


def gguf_common(meta: dict, arch: str) -> tuple[GGUFHParams, dict]:
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    c.update(BLOCK, norm_eps=hp.float("attention.layer_norm_epsilon", limit="norm_eps"),
             logit_scale=logit_divisor(hp.float("logit_scale"), f"GGUF metadata '{arch}.logit_scale'"))
    return hp, c


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """What a GGUF says by its tensors only: per-head q/k norms, an output bias (attention_bias)."""
    if any(n.endswith("attn_q_norm.weight") for n in names):
        cfg.qk_norm = cfg.qk_norm_heads = True
    if any(n.endswith("attn_output.bias") for n in names):
        cfg.attn_out_bias = True


def gguf_metadata(cfg: TransformerConfig, arch: str = "command-r") -> dict:
    """llama.cpp's keys for the LayerNorm epsilon and the logit multiplier."""
    return {f"{arch}.attention.layer_norm_epsilon": cfg.norm_eps, f"{arch}.logit_scale": 1.0 / cfg.logit_scale}


def config_from_gguf(meta: dict) -> TransformerConfig:
    return TransformerConfig(**gguf_common(meta, "command-r")[1])


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common(cfg, "cohere")
    qk = HFConfig(cfg).flag("use_qk_norm", False)
    return TransformerConfig(**c, qk_norm=qk, qk_norm_heads=qk)

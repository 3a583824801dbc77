"""ERNIE 4.5 dense (HF Ernie4_5ForCausalLM, ERNIE-4.5-0.3B; llama.cpp's `ernie4_5`): Llama's block (pre-norm
RMSNorms, GQA, a SiLU-gated MLP) with RoPE in ADJACENT pairs (2i, 2i + 1).

RoPE: transformers' Ernie4_5 rotates x[0::2] against x[1::2] (GLM's rotate_half, cos/sin repeat-interleaved),
and llama.cpp runs `ernie4_5` with its NORM (adjacent-pair) rope on all of head_dim (it asserts
rope.dimension_count == key_length); its converter keeps HF's q/k rows. Both formats hold one layout, rope_neox
False, and export permutes nothing.

config.json's `use_bias` puts biases on q/k/v/o, on every MLP projection and on lm_head (the released models:
false). Only the first three have a place here and in llama.cpp (which reads optional q/k/v biases from a GGUF,
nothing else): use_bias true is refused, a GGUF's q/k/v biases are read where it holds them.

transformers' defaults where config.json is silent: head_dim 128 (NOT hidden_size / num_attention_heads:
refused where the two differ, as the original code and llama.cpp's converter take the quotient), rope theta
500000, tied embeddings, 131072 positions.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp

# q/k rows in adjacent-pair order in the HF files too (formats/hf_dir.py keeps rope_neox as read)
HF_ROPE_NEOX = False
_HF_HEAD_DIM = 128           # Ernie4_5Config's default head_dim
_HF_ROPE_THETA = 500000.0    # its default_theta


def hf_common(cfg: dict, arch: str) -> dict:
    """The TransformerConfig fields both ERNIE 4.5 configs spell alike."""
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "ERNIE 4.5")
    hf = HFConfig(cfg)
    if hf.flag("use_bias", False):
        raise ModelFormatError("config.json use_bias=true (biases on q/k/v/o, the MLPs and lm_head) is not supported")
    if cfg.get("head_dim") is None:
        heads, d = hf.get("num_attention_heads", kind=int, limit="n_heads"), hf.get("hidden_size", kind=int,
                                                                                       limit="d_model")
        if d // heads != _HF_HEAD_DIM:
            raise ModelFormatError(f"config.json lacks 'head_dim': transformers reads {_HF_HEAD_DIM}, the original code "
                                   f"hidden_size / num_attention_heads = {d // heads}")
    c = hf.common(arch)
    if cfg.get("rope_parameters") is None and cfg.get("rope_theta") is None:
        c["rope_theta"] = _HF_ROPE_THETA
    c.update(rope_neox=False, norm_eps=hf.get("rms_norm_eps", 1e-5, float, "norm_eps"),
             n_ctx_train=hf.get("max_position_embeddings", 131072, int, "n_ctx_train"),
             tie_embeddings=hf.flag("tie_word_embeddings", True))
    return c


def gguf_common(meta: dict, arch: str) -> tuple[GGUFHParams, dict]:
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    if c["rope_dim"] != c["head_dim"]:
        raise ModelFormatError(f"GGUF metadata '{arch}.rope.dimension_count' = {c['rope_dim']}: llama.cpp's {arch} "
                               f"rotates every dimension of the {c['head_dim']}-wide heads")
    return hp, dict(c, rope_neox=False)


def config_from_hf(cfg: dict) -> TransformerConfig:
    return TransformerConfig(**hf_common(cfg, "ernie4_5"))


def config_from_gguf(meta: dict) -> TransformerConfig:
    # q/k/v biases wherever the file holds them: formats/gguf_model.py's biases_from_tensors
    return TransformerConfig(**gguf_common(meta, "ernie4_5")[1])

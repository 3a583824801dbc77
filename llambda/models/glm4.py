"""GLM-4-0414 and GLM-Z1 (HF Glm4ForCausalLM; llama.cpp's `glm4`): Llama-shaped attention with q/k/v biases,
sandwich norms (Gemma 2's placement: a norm after attention and after the MLP, before each residual add),
a fused gate_up MLP, and RoPE on the first half of each head in adjacent pairs.

Names: HF's `post_self_attn_layernorm` is the norm after attention (GGUF `post_attention_norm`),
`post_attention_layernorm` the one BEFORE the MLP (GGUF `ffn_norm`), `post_mlp_layernorm` the one after it
(GGUF `post_ffw_norm`). `mlp.gate_up_proj` holds the gate rows, then the up rows; GGUF keeps it fused as a
double-height `ffn_up` (the loader splits it: models/base.py unfused_lookup).

RoPE: transformers' Glm4 rotates (2i, 2i + 1) of the first `partial_rotary_factor` (0.5) of head_dim, and
llama.cpp runs `glm4` with its NORM (adjacent-pair) rope on rope.dimension_count dims; its converter keeps
the q/k rows as HF has them. So both formats hold one layout, rope_neox False.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp
from .qwen2vl import gguf_metadata as qwen2vl_metadata, gguf_sections
from .qwen3next import partial_rope_dim

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py)
HF_LAYER_NAMES = {
    "post_self_attn_layernorm.weight": "post_attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_mlp_layernorm.weight": "post_ffw_norm.weight",
}
# q/k rows in adjacent-pair order in the HF files too (formats/hf_dir.py keeps rope_neox as read)
HF_ROPE_NEOX = False


def config_from_gguf(meta: dict) -> TransformerConfig:
    c = GGUFHParams(meta, "glm4").common()
    if "glm4.rope.dimension_sections" not in meta:
        return TransformerConfig(**c, rope_neox=False, post_norms=True)
    # GLM-4.1V / GLM-4.6V's text model (models/glm4v.py): llama.cpp's converter permuted each head's rotated q/k
    # rows to the half-split order its M-RoPE turns
    c["arch"] = "glm4v"
    return TransformerConfig(**c, rope_neox=True, post_norms=True,
                             rope_sections=gguf_sections(meta, "glm4", ("rope.dimension_sections",)))


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """GLM-4.1V's M-RoPE sections as llama.cpp's glm4 reads them (four int32 counts, the fourth 0), where the model
    has them."""
    return {f"glm4.{k.split('.', 1)[1]}": v for k, v in qwen2vl_metadata(cfg).items()} if cfg.rope_sections else {}


def refuse_mrope(meta: dict, arch: str) -> None:
    """llama.cpp runs a glm4moe file with rope.dimension_sections (the text model of GLM-4.5V) with its
    multi-section M-RoPE, which is not implemented here for it: refused, not run as plain RoPE (a glm4 file
    with sections is GLM-4.1V's: models/glm4v.py)."""
    if f"{arch}.rope.dimension_sections" in meta:
        raise ModelFormatError(f"GGUF metadata '{arch}.rope.dimension_sections': M-RoPE (a GLM-4.xV vision model's "
                               "text part) is not supported")


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "GLM-4")
    hf = HFConfig(cfg)
    c = hf.common("glm4")
    c.update(rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.5), rope_neox=False,
             norm_eps=hf.get("rms_norm_eps", 1.5625e-7, float, "norm_eps"))
    # transformers' Glm4Config defaults attention_bias to true (the released models all have the biases)
    return TransformerConfig(**c, post_norms=True, attn_bias=hf.flag("attention_bias", True))

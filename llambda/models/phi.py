"""Phi-1 / Phi-1.5 / Phi-2 (HF PhiForCausalLM; llama.cpp `phi2`): one LayerNorm WITH bias per layer feeding
attention and the MLP in parallel (x += attn(h) + mlp(h), h the norm of x), biases on q/k/v and on the output
projection (`dense`), an MLP without a gate (fc1 -> GELU, tanh approximation (`gelu_new`) -> fc2, both with
biases), RoPE on the first `partial_rotary_factor` of each head (half-split pairs within them), a final
LayerNorm with bias and an lm_head WITH a bias.

GGUF: llama.cpp's keys (`phi2.attention.layer_norm_epsilon`, `phi2.rope.dimension_count`) and names (q/k/v as
separate tensors, or one fused `attn_qkv` with its bias as older converters wrote it; `output.bias`). The q/k rows
keep HF's half-split layout (llama.cpp's NEOX rope). Phi's optional q/k LayerNorms (`qk_layernorm`, with biases)
are not supported.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import HFConfig, refuse_quantized
from .layernorm_models import NORM_BIAS_NAMES, eps_metadata, gguf_config, hf_activation
from .qwen3next import partial_rope_dim
from .starcoder2 import TANH_GELUS

HF_LAYER_NAMES = {
    **NORM_BIAS_NAMES,
    "self_attn.dense.weight": "attn_output.weight",
    "self_attn.dense.bias": "attn_output.bias",
    "mlp.fc1.weight": "ffn_up.weight",
    "mlp.fc1.bias": "ffn_up.bias",
    "mlp.fc2.weight": "ffn_down.weight",
    "mlp.fc2.bias": "ffn_down.bias",
}
HF_GLOBAL_NAMES = {"model.final_layernorm.weight": "output_norm.weight",
                   "model.final_layernorm.bias": "output_norm.bias", "lm_head.bias": "output.bias"}
SHAPE = dict(norm_kind="layer", norm_bias=True, parallel_block=True, ffn_gated=False, activation="gelu_tanh",
             rope_neox=True, attn_bias=True, attn_out_bias=True, ffn_bias=True, output_bias=True)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, "phi2")


def config_from_gguf(meta: dict) -> TransformerConfig:
    return gguf_config(meta, "phi2", **SHAPE, tie_embeddings=False)


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Phi")
    hf_activation(cfg, ("gelu_new",) + tuple(g for g in TANH_GELUS if g != "gelu_new"), "Phi")
    hf = HFConfig(cfg)
    if hf.flag("qk_layernorm", False):
        raise ModelFormatError("config.json qk_layernorm=true (Phi's q/k LayerNorms with biases) is not supported")
    c = hf.common("phi")
    c.update(norm_eps=hf.get("layer_norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", False), rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.5))
    return TransformerConfig(**c, **{k: v for k, v in SHAPE.items() if k != "rope_neox"})

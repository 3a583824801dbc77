"""Qwen3-Next: gated delta-net (linear attention) layers mixed with gated attention layers, MoE MLPs.

A delta-net layer: q, k, v, z = in_proj_qkvz(h), b, a = in_proj_ba(h) (rows grouped per key head, as
the checkpoints store them; models/base.py regroups them at load); [q, k, v] through a causal depthwise
convolution (width `linear_conv_kernel_dim`) and SiLU; q, k L2-normalised per head, q scaled by
dk^-0.5; per value head the dk x dv state S decays by exp(g), g = -exp(A_log) softplus(a + dt_bias),
takes in k with the delta rule (beta = sigmoid(b)) and is read by q; then an RMSNorm per head times
silu(z), and out_proj. The conv window and S are each sequence's state beside the KV cache.
Attention layers: q_proj gives per head the query and a gate (the output is multiplied by
sigmoid(gate)); per-head q/k norms; RoPE on the first `partial_rotary_factor` of each head. Every
RMSNorm but the delta net's computes x (1 + w). MoE on every layer with a sigmoid-gated shared expert.

config.json only (Hugging Face directories); llama.cpp's `qwen3next` GGUF files are not read yet.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import HFConfig, hf_layer_kinds
from .llama import check_hf_mlp
from .moe import hf_moe

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py)
HF_LAYER_NAMES = {
    "linear_attn.in_proj_qkvz.weight": "ssm_in.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a_log.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}


def partial_rope_dim(cfg: dict, head_dim: int) -> int:
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ModelFormatError(f"config.json partial_rotary_factor {partial!r} must be in (0, 1]")
    return max(2, int(head_dim * partial) // 2 * 2)


def layer_kinds(cfg: dict, n_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        every = cfg.get("full_attention_interval", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ModelFormatError(f"config.json 'full_attention_interval' = {every!r} is not valid")
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n_layers)]
    return hf_layer_kinds(types, n_layers, {"linear_attention": "deltanet", "full_attention": "attention"})


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    if hf.get("attention_bias", False):
        raise ModelFormatError("config.json attention_bias=true is not supported for qwen3_next")
    c = hf.common("qwen3next")
    c["rope_dim"] = partial_rope_dim(cfg, c["head_dim"])
    moe = hf_moe(cfg, c["n_layers"], norm_default=True) if cfg.get("num_experts") else {}
    return TransformerConfig(
        **c, qk_norm=True, norm_offset=1.0, attn_out_gate=True, layer_kinds=layer_kinds(cfg, c["n_layers"]),
        conv_kernel=hf.get("linear_conv_kernel_dim", 4, int, "conv_kernel"),
        ssm_k_heads=hf.get("linear_num_key_heads", kind=int, limit="ssm_k_heads"),
        ssm_v_heads=hf.get("linear_num_value_heads", kind=int, limit="ssm_v_heads"),
        ssm_k_dim=hf.get("linear_key_head_dim", kind=int, limit="ssm_k_dim"),
        ssm_v_dim=hf.get("linear_value_head_dim", kind=int, limit="ssm_v_dim"), **moe)

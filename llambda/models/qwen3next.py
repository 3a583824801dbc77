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

GGUF (`qwen3next`, as llama.cpp's converter writes it): norms already hold 1 + w; `ssm_a` is
-exp(A_log); in_proj_qkvz arrives regrouped as `attn_qkv` (q, k, v heads) and `attn_gate` (z);
`ssm_ba` and `attn_q` keep the checkpoint's grouping; the pre-MLP norm is `post_attention_norm`;
`ssm.group_count` / `ssm.time_step_rank` are the key / value head counts, `ssm.state_size` the key
head size, `ssm.inner_size` all value heads; layer i is attention iff (i + 1) % full_attention_interval == 0.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, hf_layer_kinds
from .llama import check_hf_mlp
from .moe import gguf_moe, hf_moe

# canonical name -> the name llama.cpp's qwen3next files use
GGUF_NAMES = {"ffn_norm.weight": "post_attention_norm.weight"}

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


def partial_rope_dim(cfg: dict, head_dim: int, default: float = 0.25) -> int:
    """The rotated dims of a head from config.json's partial_rotary_factor (`default` where absent)."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", default))
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise ModelFormatError(f"config.json partial_rotary_factor {partial!r} must be in (0, 1]")
    return max(2, int(head_dim * partial) // 2 * 2)


def every_nth_attention(n_layers: int, every, where: str) -> list[str]:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ModelFormatError(f"{where} 'full_attention_interval' = {every!r} is not valid")
    return ["attention" if (i + 1) % every == 0 else "deltanet" for i in range(n_layers)]


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "qwen3next")
    c = hp.common()
    hv = hp.int("ssm.time_step_rank", limit="ssm_v_heads")
    inner = hp.int("ssm.inner_size", limit="ffn_dim")
    if hv < 1 or inner % hv:
        raise ModelFormatError(f"GGUF metadata 'qwen3next.ssm.inner_size' ({inner}) is not a multiple of the value "
                               f"heads ({hv})")
    kinds = every_nth_attention(c["n_layers"], hp.int("full_attention_interval", 4), "GGUF metadata qwen3next")
    return TransformerConfig(
        **c, rope_neox=True, qk_norm=True, attn_out_gate=True, layer_kinds=kinds, shared_expert_gate=True,
        conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"),
        ssm_k_heads=hp.int("ssm.group_count", limit="ssm_k_heads"), ssm_v_heads=hv,
        ssm_k_dim=hp.int("ssm.state_size", limit="ssm_k_dim"),
        ssm_v_dim=HFConfig.check("GGUF metadata 'qwen3next.ssm.inner_size' / value heads", inner // hv, int,
                                 "ssm_v_dim"), **gguf_moe(hp, norm_default=True))


def layer_kinds(cfg: dict, n_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:
        return every_nth_attention(n_layers, cfg.get("full_attention_interval", 4), "config.json")
    return hf_layer_kinds(types, n_layers, {"linear_attention": "deltanet", "full_attention": "attention"})


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    if hf.flag("attention_bias", False):
        raise ModelFormatError("config.json attention_bias=true is not supported for qwen3_next")
    c = hf.common("qwen3next")
    c["rope_dim"] = partial_rope_dim(cfg, c["head_dim"])
    moe = hf_moe(cfg, c["n_layers"], norm_default=True) if cfg.get("num_experts") else {}
    return TransformerConfig(
        **c, qk_norm=True, norm_offset=1.0, attn_out_gate=True, layer_kinds=layer_kinds(cfg, c["n_layers"]),
        shared_expert_gate=True,
        conv_kernel=hf.get("linear_conv_kernel_dim", 4, int, "conv_kernel"),
        ssm_k_heads=hf.get("linear_num_key_heads", kind=int, limit="ssm_k_heads"),
        ssm_v_heads=hf.get("linear_num_value_heads", kind=int, limit="ssm_v_heads"),
        ssm_k_dim=hf.get("linear_key_head_dim", kind=int, limit="ssm_k_dim"),
        ssm_v_dim=hf.get("linear_value_head_dim", kind=int, limit="ssm_v_dim"), **moe)

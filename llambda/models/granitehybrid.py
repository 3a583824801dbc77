"""Granite 4.0 (HF GraniteMoeHybridForCausalLM; GGUF `granitehybrid`): Mamba2 layers mixed with attention
layers, Granite's multipliers (granite.py), every MLP either dense (the `shared_mlp`) or Granite MoE's
experts plus that shared MLP (granitemoe.py). Ollama's granite4 models are this family.

A Mamba2 layer (`mamba2` in config.LAYER_KINDS): in_proj(h) rows -> z (d_inner), xBC (d_inner + 2 G N),
dt (H); xBC through a causal depthwise convolution of width `mamba_d_conv` with a bias, then SiLU; x
(H heads of P = d_inner / H), B and C (G groups of N = `mamba_d_state`; head h reads group h // (H / G));
dt = softplus(dt + dt_bias); per head the N x P state decays by exp(dt A), A = -exp(A_log), and takes in
dt B x^T; y = C . state + D x; then y * silu(z) RMS-normed in G groups of d_inner / G (its weight after),
and out_proj. The convolution's last d_conv - 1 inputs and the state are each sequence's (base.py keeps
them beside the KV cache). Attention layers may have no RoPE: `position_embedding_type` "nope" (Granite
4's hybrids), or in GGUF `rope.scaling.finetuned` false, which llama.cpp's converter writes for hybrids.

config.json: `layer_types` ("mamba"/"attention", or transformers 5's "linear_attention"/"full_attention"),
`mamba_n_heads`, `mamba_d_head` ("auto": d_inner / heads), `mamba_d_state`, `mamba_n_groups`,
`mamba_d_conv`, `mamba_expand` (d_inner = expand x hidden), `mamba_conv_bias`; `num_local_experts` 0 makes
the shared MLP the dense MLP (`shared_intermediate_size` wide). GGUF (llama.cpp's converter): per-layer
`attention.head_count_kv` (0: a Mamba2 layer), `ssm.conv_kernel` / `state_size` / `group_count` /
`inner_size` / `time_step_rank` (the head count); tensors `ssm_in`, `ssm_conv1d` (+ bias), `ssm_dt.bias`,
`ssm_a` (-exp(A_log), (H, 1)), `ssm_d` ((H, 1)), `ssm_norm` ((G, d_inner / G)), `ssm_out`; q/k rows
permuted as in `llama` files; a dense model's MLP as `ffn_{gate,up,down}`.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .granite import gguf_scales, hf_scales
from .granitemoe import HF_LAYER_NAMES as MOE_NAMES, hf_experts, hf_splitter  # noqa: F401 (the family's splitter)
from .hparams import GGUFHParams, HFConfig, gguf_layer_kinds, hf_layer_kinds
from .llama import check_hf_mlp
from .moe import gguf_moe

HF_LAYER_NAMES = {
    **MOE_NAMES,
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a_log.weight",
    "mamba.D": "ssm_d.weight",
    "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
}
KINDS = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention", "full_attention": "attention"}


def config_from_gguf(meta: dict) -> TransformerConfig:
    meta, kinds = gguf_layer_kinds(meta, "granitehybrid", "mamba2")
    hp = GGUFHParams(meta, "granitehybrid")
    c = hp.common()
    heads, inner = hp.int("ssm.time_step_rank", limit="ssm_v_heads"), hp.int("ssm.inner_size", limit="ffn_dim")
    if heads < 1 or inner % heads:
        raise ModelFormatError(f"GGUF metadata 'granitehybrid.ssm.inner_size' ({inner}) is not a multiple of the "
                               f"heads ({heads})")
    moe = gguf_moe(hp, norm_default=True)
    if not moe:          # a dense model's MLP is the shared one
        c["ffn_dim"] = hp.int("expert_shared_feed_forward_length", c["ffn_dim"], "ffn_dim")
    rope = hp.flag("rope.scaling.finetuned", True)      # llama.cpp: Granite's switch for RoPE, on by default
    return TransformerConfig(
        **c, rope_neox=False, **gguf_scales(hp, c["head_dim"]), layer_kinds=kinds or [],
        layer_rope=[rope] * c["n_layers"], conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"),
        ssm_k_heads=hp.int("ssm.group_count", limit="ssm_k_heads"), ssm_v_heads=heads,
        ssm_k_dim=hp.int("ssm.state_size", limit="ssm_k_dim"),
        ssm_v_dim=HFConfig.check("GGUF metadata 'granitehybrid.ssm.inner_size' / heads", inner // heads, int,
                                 "ssm_v_dim"),
        **(dict(moe, moe_routing="topk_softmax") if moe else {}))


def mamba_sizes(hf: HFConfig, d_model: int) -> dict:
    heads = hf.get("mamba_n_heads", 128, int, "ssm_v_heads")
    inner = hf.get("mamba_expand", 2, int, "n_heads") * d_model
    head = hf.cfg.get("mamba_d_head", "auto")
    head = inner // max(heads, 1) if head == "auto" else hf.get("mamba_d_head", kind=int, limit="ssm_v_dim")
    if heads * head != inner:
        raise ModelFormatError(f"config.json mamba_n_heads {heads} x mamba_d_head {head} is not mamba_expand x "
                               f"hidden_size ({inner})")
    if hf.flag("mamba_proj_bias", False):
        raise ModelFormatError("config.json mamba_proj_bias=true is not supported (Granite's projections have none)")
    if not hf.flag("mamba_conv_bias", True):
        raise ModelFormatError("config.json mamba_conv_bias=false is not supported (Granite's convolutions have one)")
    limit = hf.cfg.get("time_step_limit", (0.0, float("inf")))
    if limit is not None and (not isinstance(limit, (list, tuple)) or len(limit) != 2
                              or limit[0] not in (0, 0.0) or not _infinite(limit[1])):
        raise ModelFormatError(f"config.json time_step_limit {limit!r} is not supported (only (0, inf): no clamp)")
    return dict(conv_kernel=hf.get("mamba_d_conv", 4, int, "conv_kernel"),
                ssm_k_heads=hf.get("mamba_n_groups", 1, int, "ssm_k_heads"), ssm_v_heads=heads,
                ssm_k_dim=hf.get("mamba_d_state", 256, int, "ssm_k_dim"), ssm_v_dim=head)


def _infinite(v) -> bool:
    """+inf as config.json holds it: JSON's Infinity, or transformers 5's {"__float__": "Infinity"}."""
    return (isinstance(v, float) and v == float("inf")) or v == {"__float__": "Infinity"}


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common("granitehybrid")
    n = c["n_layers"]
    kinds = hf_layer_kinds(cfg.get("layer_types", ["mamba"] * n), n, KINDS)
    position = cfg.get("position_embedding_type")
    if position not in (None, "rope", "nope"):
        raise ModelFormatError(f"config.json position_embedding_type {position!r} is neither 'rope' nor 'nope'")
    moe = hf_experts(cfg, n) if cfg.get("num_local_experts") else {}
    if not moe:
        c["ffn_dim"] = hf.get("shared_intermediate_size", kind=int, limit="ffn_dim")
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False), **hf_scales(hf, c["head_dim"]),
                             layer_kinds=kinds, layer_rope=[position == "rope"] * n,
                             **mamba_sizes(hf, c["d_model"]), **moe)

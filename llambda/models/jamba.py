"""Jamba (HF JambaForCausalLM, model_type `jamba`: AI21-Jamba-Reasoning-3B, Jamba Mini / Large 1.5-1.7; llama.cpp's
`jamba`): attention layers among Mamba 1 layers, every layer's feed-forward a dense SwiGLU MLP or a mixture of
experts. Every layer x += mixer(rmsnorm(x)), then x += ffn(rmsnorm(x)); final_layernorm and the head (untied by
default). Attention has no positions (no RoPE; GQA, no biases). The Mamba layers are Mamba 1's mixer (layer kind
`mamba`, models/mamba.py) with RMS norms WITH weights over dt_low, B and C (dt_layernorm, b_layernorm,
c_layernorm; epsilon rms_norm_eps). The MoE: a softmax over every expert's router logit, the k largest weights
not renormalised; each expert down(silu(gate(h)) * up(h)) of `intermediate_size`, as the dense MLP.

config.json: layer i is attention when i % `attn_layer_period` == `attn_layer_offset`, and MoE when
i % `expert_layer_period` == `expert_layer_offset` and `num_experts` > 1 (one expert: every MLP dense): the
checkpoint's tensors say the same (a router and experts there, a dense MLP elsewhere), and are what is read, as
llama.cpp reads a GGUF;
`num_experts_per_tok`; `mamba_d_state`, `mamba_d_conv`, `mamba_expand` (d_inner = expand x hidden),
`mamba_dt_rank` ("auto": ceil(hidden / 16)). Refused: `mamba_proj_bias`, no `mamba_conv_bias`, an activation other
than SiLU. `use_mamba_kernels`, `use_mambapy`, `use_associative_scan` only choose how transformers computes the
same sums: not read. Checkpoints keep one tensor per expert (`feed_forward.experts.N.{gate,up,down}_proj`), or
transformers 5's fused `experts.gate_up_proj` (E, 2I, d) and `experts.down_proj`.

GGUF (llama.cpp's converter): `jamba.attention.head_count_kv` one value per layer (0: a Mamba layer),
`ssm.conv_kernel` / `inner_size` / `state_size` / `time_step_rank` (the dt rank), `expert_count`,
`expert_used_count`, `feed_forward_length` (the dense MLP's and each expert's width); a layer with a router
(`ffn_gate_inp`) is MoE; tensors `ssm_in`, `ssm_conv1d` (+ bias), `ssm_x`, `ssm_dt` (+ bias), `ssm_dt_norm`,
`ssm_b_norm`, `ssm_c_norm`, `ssm_a` (-exp(A_log), (d_inner, N)), `ssm_d`, `ssm_out`; no RoPE (q/k rows as HF's).
llama.cpp runs only d_inner = 2 x hidden (its loader asserts it).
"""
from __future__ import annotations

import math

from ..errors import ModelFormatError
from ..formats.experts import expert_matrix
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, gguf_layer_kinds, refuse_quantized
from .mamba2 import check_mixer_flags, gguf_positive, positive

ARCH = "jamba"
HF_GLOBAL_NAMES = {"model.final_layernorm.weight": "output_norm.weight"}
# the feed-forward's norm and its dense MLP under Jamba's names (Bamba's too)
FFN_NAMES = {"pre_ff_layernorm.weight": "ffn_norm.weight",
             **{f"feed_forward.{w}_proj.weight": f"ffn_{w}.weight" for w in ("gate", "up", "down")}}
HF_LAYER_NAMES = {
    **FFN_NAMES,
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.x_proj.weight": "ssm_x.weight",
    "mamba.dt_layernorm.weight": "ssm_dt_norm.weight",
    "mamba.b_layernorm.weight": "ssm_b_norm.weight",
    "mamba.c_layernorm.weight": "ssm_c_norm.weight",
    "mamba.dt_proj.weight": "ssm_dt.weight",
    "mamba.dt_proj.bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a_log.weight",
    "mamba.D": "ssm_d.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
    "feed_forward.router.weight": "ffn_gate_inp.weight",
}
_EXPERT_PARTS = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
                 "down_proj": "ffn_down_exps.weight"}


def _period(hf: HFConfig, key: str, default: int, offset_key: str, offset_default: int) -> tuple[int, int]:
    period = positive(hf, key, default, "n_layers")
    offset = hf.get(offset_key, offset_default, int, "n_experts")
    if not 0 <= offset < period:
        raise ModelFormatError(f"config.json {offset_key!r} = {offset} should be in [0, {key} = {period})")
    return period, offset


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Jamba")
    hf = HFConfig(cfg)
    check_mixer_flags(hf, {"hidden_act": cfg.get("hidden_act", "silu")})
    if hf.flag("mamba_proj_bias", False):
        raise ModelFormatError("config.json mamba_proj_bias=true is not supported (in_proj and out_proj biases)")
    if not hf.flag("mamba_conv_bias", True):
        raise ModelFormatError("config.json mamba_conv_bias=false is not supported (llama.cpp's Mamba layers need "
                               "the convolution's bias)")
    c = hf.common(ARCH)
    n, d = c["n_layers"], c["d_model"]
    attn_period, attn_offset = _period(hf, "attn_layer_period", 8, "attn_layer_offset", 4)
    kinds = ["attention" if i % attn_period == attn_offset else "mamba" for i in range(n)]
    key = "num_experts" if cfg.get("num_experts") is not None else "num_local_experts"
    n_experts = hf.get(key, 16, int, "n_experts")
    moe = {}
    if n_experts > 1:
        _period(hf, "expert_layer_period", 2, "expert_layer_offset", 1)
        # every layer may be MoE: those whose checkpoint holds a router are (base.layer_is_moe), as in a GGUF,
        # whose keys cannot say which (the checkpoint's MoE layers are the period's, as transformers builds them)
        moe = dict(n_experts=n_experts, n_experts_used=hf.get("num_experts_per_tok", 2, int, "n_experts_used"),
                   expert_ffn_dim=c["ffn_dim"], moe_routing="softmax_topk", moe_norm_topk=False,
                   moe_layers=[True] * n)
    rank = cfg.get("mamba_dt_rank", "auto")
    rank = math.ceil(d / 16) if rank == "auto" else positive(hf, "mamba_dt_rank", 0, "ssm_dt_rank")
    c.update(rope_theta=10000.0, rope_scaling=None)       # no positions: nothing of RoPE is read
    return TransformerConfig(
        **c, layer_kinds=kinds, layer_rope=[False] * n, conv_kernel=positive(hf, "mamba_d_conv", 4, "conv_kernel"),
        ssm_k_dim=positive(hf, "mamba_d_state", 16, "ssm_k_dim"),
        ssm_inner=positive(hf, "mamba_expand", 2, "n_heads") * d, ssm_dt_rank=rank, ssm_dt_b_c_norms=True, **moe)


def hf_splitter(config: TransformerConfig):
    """split(suffix, t, name) -> [(canonical leaf, expert or None, tensor)] for a layer's experts: one tensor per
    expert (`feed_forward.experts.N.gate_proj.weight`, the Hub's checkpoints) or transformers 5's fused
    `feed_forward.experts.gate_up_proj` (E, 2I, d: gate rows, then up rows) and `down_proj` (E, d, I); None for
    any other tensor."""
    def split(suffix: str, t, name: str):
        if not suffix.startswith("feed_forward.experts."):
            return None
        rest = suffix[len("feed_forward.experts."):]
        if rest in ("gate_up_proj", "down_proj"):
            if len(t.shape) != 3:
                raise ModelFormatError(f"tensor {name!r} has shape {t.shape}: not one matrix per expert")
            if rest == "down_proj":
                return [("ffn_down_exps.weight", None, t)]
            out = []
            for e in range(t.shape[0]):
                m = expert_matrix(t, e)
                if m.shape[0] % 2:
                    raise ModelFormatError(f"tensor {name!r} has shape {t.shape}: not gate and up rows")
                gate, up = m.split_rows([m.shape[0] // 2] * 2)
                out += [("ffn_gate_exps.weight", e, gate), ("ffn_up_exps.weight", e, up)]
            return out
        num, _, part = rest.partition(".")
        leaf = _EXPERT_PARTS.get(part[:-len(".weight")]) if part.endswith(".weight") else None
        if not num.isdigit() or len(num) > 6 or leaf is None or int(num) >= max(config.n_experts, 1):
            raise ModelFormatError(f"tensor {name!r} is not supported (not an expert of this {config.n_experts}-"
                                   "expert model)")
        return [(leaf, int(num), t)]

    return split


def config_from_gguf(meta: dict) -> TransformerConfig:
    meta, kinds = gguf_layer_kinds(meta, ARCH, "mamba")
    hp = GGUFHParams(meta, ARCH)
    c = hp.common()
    n = c["n_layers"]
    if kinds is None:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.attention.head_count_kv' should list one value per layer "
                               "(0: a Mamba layer)")
    n_experts = hp.int("expert_count", 0, "n_experts")
    moe = {}
    if n_experts > 1:      # which layers: those whose file holds a router (base.layer_is_moe)
        moe = dict(n_experts=n_experts, n_experts_used=hp.int("expert_used_count", limit="n_experts_used"),
                   expert_ffn_dim=c["ffn_dim"], moe_routing="softmax_topk", moe_norm_topk=False,
                   moe_layers=[True] * n)
    c.update(rope_theta=10000.0, rope_scaling=None, rope_dim=c["head_dim"])
    return TransformerConfig(
        **c, layer_kinds=kinds, layer_rope=[False] * n, conv_kernel=gguf_positive(hp, "ssm.conv_kernel", "conv_kernel"),
        ssm_k_dim=gguf_positive(hp, "ssm.state_size", "ssm_k_dim"),
        ssm_inner=gguf_positive(hp, "ssm.inner_size", "ssm_inner"),
        ssm_dt_rank=gguf_positive(hp, "ssm.time_step_rank", "ssm_dt_rank"), ssm_dt_b_c_norms=True, **moe)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's jamba keys (export): the per-layer kv heads, the Mamba sizes; the experts' width is the MLP's."""
    a = ARCH
    if cfg.n_experts and cfg.expert_ffn_dim != cfg.ffn_dim:
        raise ModelFormatError(f"GGUF 'jamba' has one MLP width: experts of {cfg.expert_ffn_dim} beside dense MLPs "
                               f"of {cfg.ffn_dim}")
    return {f"{a}.attention.head_count_kv": [cfg.n_kv_heads if k == "attention" else 0 for k in cfg.layer_kinds],
            f"{a}.ssm.conv_kernel": cfg.conv_kernel, f"{a}.ssm.state_size": cfg.ssm_k_dim,
            f"{a}.ssm.inner_size": cfg.ssm_inner, f"{a}.ssm.time_step_rank": cfg.ssm_dt_rank}

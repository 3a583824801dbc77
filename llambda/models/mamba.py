"""Mamba 1 (HF MambaForCausalLM, model_type `mamba`: state-spaces/mamba-130m-hf .. mamba-2.8b-hf) and FalconMamba
(`falcon_mamba`: tiiuae/falcon-mamba-7b), both llama.cpp's `mamba`: every layer x += mixer(rmsnorm(x)), no attention
and no MLP, then norm_f and the head (tied by default). The mixer (layer kind `mamba`, base.Transformer._mamba_block):
in_proj(h) rows x (d_inner), z (d_inner); x through a causal depthwise convolution with its bias, then SiLU;
x_proj(x) rows dt_low (dt rank R), B (N), C (N) (FalconMamba: each RMS-normed without a weight); dt =
softplus(dt_proj(dt_low) + its bias); per channel c an N-value state S_c = exp(dt_c A_c) * S_c + dt_c x_c B with
A = -exp(A_log) of shape (d_inner, N) (the ssm_scan1 op); y_c = S_c . C + D_c x_c; out_proj(y * silu(z)).

config.json: `hidden_size`, `intermediate_size` (d_inner; without it `expand` x hidden_size, as transformers reads
them), `state_size`, `conv_kernel`, `time_step_rank` ("auto": ceil(hidden /
16)), `layer_norm_epsilon`, `tie_word_embeddings`; FalconMamba's `mixer_rms_eps` (the dt/B/C norms' epsilon).
Refused as for Mamba2 (mamba2.check_mixer_flags): projection biases, no convolution bias, an activation other than
SiLU. The `use_mambapy`, `use_associative_scan` and `residual_in_fp32` switches change how transformers computes the
same sums: not read.

GGUF (llama.cpp's converter): `mamba.ssm.conv_kernel` / `inner_size` / `state_size` / `time_step_rank` (the dt
rank), `mamba.ssm.dt_b_c_rms` (FalconMamba's norms, with the model's one RMS epsilon
`attention.layer_norm_rms_epsilon`: llama.cpp has no key for mixer_rms_eps); tensors `ssm_in`, `ssm_conv1d`
(+ bias), `ssm_x`, `ssm_dt` (+ bias), `ssm_a` (-exp(A_log), (d_inner, N)), `ssm_d`, `ssm_out`, the norm `attn_norm`.
"""
from __future__ import annotations

import math

from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .mamba2 import (HF_GLOBAL_NAMES, HF_PREFIXES, check_mixer_flags, gguf_common, gguf_positive,  # noqa: F401
                     positive, ssm_only_metadata, ssm_only_sizes)

ARCH = "mamba"
HF_LAYER_NAMES = {
    "norm.weight": "attn_norm.weight",
    "mixer.in_proj.weight": "ssm_in.weight",
    "mixer.conv1d.weight": "ssm_conv1d.weight",
    "mixer.conv1d.bias": "ssm_conv1d.bias",
    "mixer.x_proj.weight": "ssm_x.weight",
    "mixer.dt_proj.weight": "ssm_dt.weight",
    "mixer.dt_proj.bias": "ssm_dt.bias",
    "mixer.A_log": "ssm_a_log.weight",
    "mixer.D": "ssm_d.weight",
    "mixer.out_proj.weight": "ssm_out.weight",
}


def config_from_hf(cfg: dict) -> TransformerConfig:
    falcon = cfg.get("model_type") == "falcon_mamba"
    refuse_quantized(cfg, "FalconMamba" if falcon else "Mamba")
    hf = HFConfig(cfg)
    check_mixer_flags(hf, cfg)
    d = hf.get("hidden_size", kind=int, limit="d_model")
    # transformers sets intermediate_size to expand x hidden_size, then the file's own value over it where it has one
    # (falcon-mamba-7b's config says expand 16 beside intermediate_size 8192 = 2 x 4096)
    inner = positive(hf, "intermediate_size", 0, "ssm_inner") if cfg.get("intermediate_size") is not None else \
        positive(hf, "expand", 2, "n_heads") * d
    rank = cfg.get("time_step_rank", "auto")
    rank = math.ceil(d / 16) if rank == "auto" else positive(hf, "time_step_rank", 0, "ssm_dt_rank")
    n = hf.get("num_hidden_layers", kind=int, limit="n_layers")
    return TransformerConfig(
        arch=ARCH, vocab_size=hf.get("vocab_size", kind=int, limit="vocab_size"), n_layers=n, d_model=d,
        norm_eps=hf.get("layer_norm_epsilon", 1e-5, float, "norm_eps"),
        n_ctx_train=hf.get("max_position_embeddings", 1 << 20, int, "n_ctx_train"),
        tie_embeddings=hf.flag("tie_word_embeddings", True), **ssm_only_sizes(), layer_kinds=["mamba"] * n,
        layer_rope=[False] * n, conv_kernel=hf.get("conv_kernel", 4, int, "conv_kernel"),
        ssm_k_dim=positive(hf, "state_size", 16, "ssm_k_dim"), ssm_inner=inner, ssm_dt_rank=rank,
        ssm_dt_b_c_eps=hf.get("mixer_rms_eps", 1e-6, float, "norm_eps") if falcon else 0.0)


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, ARCH)
    c = gguf_common(hp)
    return TransformerConfig(
        **c, layer_kinds=["mamba"] * c["n_layers"], conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"),
        ssm_k_dim=gguf_positive(hp, "ssm.state_size", "ssm_k_dim"),
        ssm_inner=gguf_positive(hp, "ssm.inner_size", "ssm_inner"),
        ssm_dt_rank=gguf_positive(hp, "ssm.time_step_rank", "ssm_dt_rank"),
        ssm_dt_b_c_eps=c["norm_eps"] if hp.flag("ssm.dt_b_c_rms", False) else 0.0)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's mamba keys (export). FalconMamba's dt/B/C norms take the model's RMS epsilon there: a config whose
    own epsilon differs (transformers' mixer_rms_eps 1e-6 beside layer_norm_epsilon 1e-5) is written as llama.cpp's
    converter writes it, and runs as llama.cpp runs it (the logits move by about 1e-3)."""
    a = ARCH
    return {**ssm_only_metadata(a), f"{a}.ssm.conv_kernel": cfg.conv_kernel, f"{a}.ssm.state_size": cfg.ssm_k_dim,
            f"{a}.ssm.inner_size": cfg.ssm_inner, f"{a}.ssm.time_step_rank": cfg.ssm_dt_rank,
            f"{a}.ssm.dt_b_c_rms": bool(cfg.ssm_dt_b_c_eps)}

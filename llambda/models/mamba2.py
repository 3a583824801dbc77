"""Mamba2 (HF Mamba2ForCausalLM, model_type `mamba2`: Mamba-Codestral-7B, the mamba2-130m..2.7b ports; llama.cpp's
`mamba2`): every layer x += mixer(rmsnorm(x)), the mixer Granite 4's Mamba2 (granitehybrid.py: in_proj -> z, xBC,
dt; a causal depthwise convolution with its bias, then SiLU; the selective scan with a per-head decay; y * silu(z)
RMS-normed in n_groups groups of d_inner / n_groups; out_proj), no attention and no MLP; then norm_f and the head
(untied by default). A pure state-space model keeps no keys or values: the attention sizes it is given
(ssm_only_sizes) only size buffers no layer reads.

config.json: `num_heads` x `head_dim` = `expand` x `hidden_size` (d_inner, as transformers checks), `n_groups`,
`state_size`, `conv_kernel`, `layer_norm_epsilon` (the block norms and the gated norm), `tie_word_embeddings`.
`chunk_size` only cuts transformers' prefill into blocks (the same sums): not read. Refused: `use_bias` (in/out
projection biases), `use_conv_bias` false, a `time_step_limit` other than (0, inf) (transformers clamps dt to it
in prefill and not in decode steps), `norm_before_gate` true, `rms_norm` false, an activation other than SiLU.

GGUF (llama.cpp's converter): `mamba2.ssm.conv_kernel` / `inner_size` / `state_size` / `time_step_rank` (the
heads) / `group_count`, `attention.layer_norm_rms_epsilon`; head counts and MLP width 0; tensors `ssm_in`,
`ssm_conv1d` (+ bias), `ssm_dt.bias`, `ssm_a` (-exp(A_log), (H, 1)), `ssm_d` ((H, 1)), `ssm_norm` ((G, d_inner / G)),
`ssm_out`, the block norm `attn_norm`.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .granitehybrid import HF_LAYER_NAMES as GRANITE_NAMES, _infinite
from .hparams import GGUFHParams, HFConfig, refuse_quantized

ARCH = "mamba2"
HF_PREFIXES = (("backbone.layers.", "model.layers."),)
HF_GLOBAL_NAMES = {f"{top}.{hf}": ours for top in ("model", "backbone")
                   for hf, ours in (("embeddings.weight", "token_embd.weight"),
                                    ("embedding.weight", "token_embd.weight"), ("norm_f.weight", "output_norm.weight"))}
HF_LAYER_NAMES = {"norm.weight": "attn_norm.weight",
                  **{"mixer." + k.split(".", 1)[1]: v for k, v in GRANITE_NAMES.items() if k.startswith("mamba.")}}


def ssm_only_sizes() -> dict:
    """The attention and MLP sizes of a model whose every layer is a state-space mixer: the smallest the config
    takes (one head of 2, an MLP width of 1); no layer reads their buffers and no layer keeps keys."""
    return dict(n_heads=1, n_kv_heads=1, head_dim=2, ffn_dim=1, ffn_own_layers=True)


def check_mixer_flags(hf: HFConfig, cfg: dict) -> None:
    """What transformers' Mamba and Mamba2 mixers read beside their sizes: SiLU, no projection biases, a
    convolution bias (llama.cpp requires it)."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelFormatError(f"config.json hidden_act {cfg.get('hidden_act')!r} is not supported (only "
                               "'silu')"[:200])
    if hf.flag("use_bias", False):
        raise ModelFormatError("config.json use_bias=true is not supported (in_proj and out_proj biases)")
    if not hf.flag("use_conv_bias", True):
        raise ModelFormatError("config.json use_conv_bias=false is not supported (llama.cpp's Mamba layers need "
                               "the convolution's bias)")


def positive(hf: HFConfig, key: str, default: int, limit: str) -> int:
    """A size from config.json that must be at least 1 (the config's ranges start at 0: unused)."""
    v = hf.get(key, default, int, limit)
    if v < 1:
        raise ModelFormatError(f"config.json {key!r} = {v} should be at least 1")
    return v


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Mamba2")
    hf = HFConfig(cfg)
    check_mixer_flags(hf, cfg)
    if hf.flag("norm_before_gate", False):
        raise ModelFormatError("config.json norm_before_gate=true is not supported (transformers' Mamba2 gates, "
                               "then norms)")
    if not hf.flag("rms_norm", True):
        raise ModelFormatError("config.json rms_norm=false is not supported (the gated norm is always there)")
    limit = cfg.get("time_step_limit", (0.0, float("inf")))
    if limit is not None and (not isinstance(limit, (list, tuple)) or len(limit) != 2
                              or limit[0] not in (0, 0.0) or not _infinite(limit[1])):
        raise ModelFormatError(f"config.json time_step_limit {limit!r} is not supported (only (0, inf): no "
                               "clamp)"[:200])
    d = hf.get("hidden_size", kind=int, limit="d_model")
    heads, head = positive(hf, "num_heads", 128, "ssm_v_heads"), positive(hf, "head_dim", 64, "ssm_v_dim")
    expand = hf.get("expand", 2, int, "n_heads")
    if heads * head != expand * d:
        raise ModelFormatError(f"config.json num_heads {heads} x head_dim {head} is not expand x hidden_size "
                               f"({expand * d}), the inner size")
    n = hf.get("num_hidden_layers", kind=int, limit="n_layers")
    return TransformerConfig(
        arch=ARCH, vocab_size=hf.get("vocab_size", kind=int, limit="vocab_size"), n_layers=n, d_model=d,
        norm_eps=hf.get("layer_norm_epsilon", 1e-5, float, "norm_eps"),
        n_ctx_train=hf.get("max_position_embeddings", 1 << 20, int, "n_ctx_train"),
        tie_embeddings=hf.flag("tie_word_embeddings", False), **ssm_only_sizes(),
        layer_kinds=["mamba2"] * n, layer_rope=[False] * n,
        conv_kernel=hf.get("conv_kernel", 4, int, "conv_kernel"),
        ssm_k_heads=positive(hf, "n_groups", 8, "ssm_k_heads"), ssm_v_heads=heads,
        ssm_k_dim=positive(hf, "state_size", 128, "ssm_k_dim"), ssm_v_dim=head)


def gguf_common(hp: GGUFHParams) -> dict:
    """What a state-space GGUF (mamba, mamba2) holds beside its mixer's keys."""
    n = hp.int("block_count", limit="n_layers")
    return dict(arch=hp.arch, vocab_size=hp.vocab_size(), n_layers=n,
                d_model=hp.int("embedding_length", limit="d_model"),
                norm_eps=hp.float("attention.layer_norm_rms_epsilon", 1e-5, "norm_eps"),
                n_ctx_train=hp.int("context_length", 1 << 20, limit="n_ctx_train"), **ssm_only_sizes(),
                layer_rope=[False] * n)


def gguf_positive(hp: GGUFHParams, key: str, limit: str) -> int:
    """A size from the GGUF's keys that must be at least 1."""
    v = hp.int(key, limit=limit)
    if v < 1:
        raise ModelFormatError(f"GGUF metadata '{hp.arch}.{key}' = {v} should be at least 1")
    return v


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, ARCH)
    c = gguf_common(hp)
    heads = gguf_positive(hp, "ssm.time_step_rank", "ssm_v_heads")
    inner = gguf_positive(hp, "ssm.inner_size", "ssm_inner")
    if inner % heads:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.ssm.inner_size' ({inner}) is not a multiple of "
                               f"'{ARCH}.ssm.time_step_rank' ({heads}), the heads")
    return TransformerConfig(
        **c, layer_kinds=["mamba2"] * c["n_layers"], conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"),
        ssm_k_heads=gguf_positive(hp, "ssm.group_count", "ssm_k_heads"), ssm_v_heads=heads,
        ssm_k_dim=gguf_positive(hp, "ssm.state_size", "ssm_k_dim"),
        ssm_v_dim=HFConfig.check(f"GGUF metadata '{ARCH}.ssm.inner_size' / heads", inner // heads, int, "ssm_v_dim"))


def ssm_only_metadata(a: str) -> dict:
    """llama.cpp's converter's keys of a model without attention or MLP: no heads, no MLP width."""
    return {f"{a}.attention.head_count": 0, f"{a}.attention.head_count_kv": 0, f"{a}.feed_forward_length": 0}


def gguf_metadata(cfg: TransformerConfig) -> dict:
    a = ARCH
    return {**ssm_only_metadata(a), f"{a}.ssm.conv_kernel": cfg.conv_kernel, f"{a}.ssm.state_size": cfg.ssm_k_dim,
            f"{a}.ssm.group_count": cfg.ssm_k_heads, f"{a}.ssm.time_step_rank": cfg.ssm_v_heads,
            f"{a}.ssm.inner_size": cfg.ssm_v_heads * cfg.ssm_v_dim}

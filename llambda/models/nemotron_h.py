"""Nemotron-H (HF NemotronHForCausalLM; llama.cpp's `nemotron_h`): NVIDIA Nemotron-H 8B and Nemotron Nano 9B v2.
Every layer is one norm and one mixer added to the residual, x += mixer(rmsnorm(x)), the mixer one of Mamba2
(`M`: Granite 4's mixer, granitehybrid.py, with its gated group norm and conv bias), attention without
positions (`*`: GQA, no RoPE, no biases) or an MLP alone (`-`: down(relu(up(h))^2), no gate; layer kind `mlp`,
config.ffn_own_layers: the other layers have no MLP). RMSNorm throughout (`layer_norm_epsilon`).

config.json: `hybrid_override_pattern` (a string of M, * and -) or transformers 5's `layers_block_type`
("mamba"/"attention"/"mlp"; "linear_attention"/"full_attention" too), its length the layer count;
`mamba_num_heads` x `mamba_head_dim` the Mamba2 inner size, `n_groups`, `ssm_state_size`, `conv_kernel`
(or the older mamba_* names). Tensors under `model.` (transformers 5) or `backbone.` (NVIDIA's checkpoints):
`embeddings`, `layers.N.norm`, `layers.N.mixer.*`, `norm_f`. Refused: MoE layers (`E`, Nemotron 3's
nemotron_h_moe), attention or Mamba projection biases, a Mamba2 without conv bias, a time_step_limit clamp,
activations other than ReLU^2 (MLP) and SiLU (Mamba2).

GGUF (llama.cpp's converter): `nemotron_h.attention.head_count_kv` and `feed_forward_length` one value per layer
(a layer with neither is Mamba2, with kv heads attention, with an MLP width an MLP layer), the Mamba2 keys as
granitehybrid's, the norms' epsilon as `attention.layer_norm_rms_epsilon` (llama.cpp 0.3's loader read
`attention.layer_norm_epsilon`: an export writes both); every layer's norm is `blk.N.attn_norm`; the MLP `ffn_up` / `ffn_down`; no RoPE (q/k rows as
HF's).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .config import TransformerConfig
from .granitehybrid import HF_LAYER_NAMES as GRANITE_NAMES, _infinite
from .hparams import GGUFHParams, HFConfig, gguf_layer_kinds, hf_layer_kinds, refuse_quantized

ARCH = "nemotron_h"
HF_PREFIXES = (("backbone.layers.", "model.layers."),)
HF_GLOBAL_NAMES = {f"{top}.{hf}": ours for top in ("model", "backbone")
                   for hf, ours in (("embeddings.weight", "token_embd.weight"), ("norm_f.weight", "output_norm.weight"))}
HF_LAYER_NAMES = {
    "norm.weight": "attn_norm.weight",          # every layer's one norm (llama.cpp's attn_norm, whatever the mixer)
    **{f"mixer.{p}_proj.weight": f"attn_{q}.weight" for p, q in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))},
    "mixer.up_proj.weight": "ffn_up.weight", "mixer.down_proj.weight": "ffn_down.weight",
    "mixer.up_proj.bias": "ffn_up.bias", "mixer.down_proj.bias": "ffn_down.bias",
    **{"mixer." + k.split(".", 1)[1]: v for k, v in GRANITE_NAMES.items() if k.startswith("mamba.")},
}
PATTERN = {"M": "mamba2", "*": "attention", "-": "mlp"}
BLOCK_TYPES = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention",
               "full_attention": "attention", "mlp": "mlp"}


def layer_kinds(cfg: dict) -> list[str]:
    """The layer kinds from hybrid_override_pattern (M, *, -) or layers_block_type; MoE layers refused."""
    pattern, types = cfg.get("hybrid_override_pattern"), cfg.get("layers_block_type")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise ModelFormatError(f"config.json hybrid_override_pattern should be a string of M, * and -, got "
                                   f"{pattern!r}"[:200])
        bad = sorted(set(pattern) - set(PATTERN))
        if bad:
            why = " (MoE layers, Nemotron 3's nemotron_h_moe, are not supported)" if "E" in bad else ""
            raise ModelFormatError(f"config.json hybrid_override_pattern has {bad[0]!r}: only M (Mamba2), * (attention) "
                                   f"and - (MLP) layers are supported{why}")
        kinds = [PATTERN[c] for c in pattern]
    elif types is not None:
        if isinstance(types, list) and "moe" in types:
            raise ModelFormatError("config.json layers_block_type has 'moe' layers (Nemotron 3's nemotron_h_moe): "
                                   "not supported")
        kinds = hf_layer_kinds(types, len(types) if isinstance(types, list) else -1, BLOCK_TYPES)
    else:
        raise ModelFormatError("config.json has neither hybrid_override_pattern nor layers_block_type (the layers)")
    n = cfg.get("num_hidden_layers")
    if n is not None and n != len(kinds):
        raise ModelFormatError(f"config.json num_hidden_layers {n!r} is not the {len(kinds)} layers of its "
                               "hybrid_override_pattern / layers_block_type")
    return kinds


def _refuse(hf: HFConfig, why: str, *keys: str) -> None:
    for key in keys:
        if hf.flag(key, False):
            raise ModelFormatError(f"config.json {key}=true is not supported ({why})")


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Nemotron-H")
    hf = HFConfig(cfg)
    kinds = layer_kinds(cfg)
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if cfg.get(key, want) != want:
            raise ModelFormatError(f"config.json {key} {cfg.get(key)!r} is not supported (only {want!r})"[:200])
    _refuse(hf, "transformers' Nemotron-H attention has no biases", "attention_bias")
    _refuse(hf, "no Nemotron-H has biases on the Mamba2 projections", "use_bias", "mamba_proj_bias")
    if not hf.flag("use_conv_bias", hf.flag("mamba_conv_bias", True)):
        raise ModelFormatError("config.json use_conv_bias=false is not supported (every Nemotron-H convolution has "
                               "a bias, and llama.cpp's nemotron_h adds one)")
    if cfg.get("sliding_window") is not None:
        raise ModelFormatError(f"config.json sliding_window {cfg['sliding_window']!r} is not supported (Nemotron-H "
                               "attends over the whole context)"[:200])
    limit = cfg.get("time_step_limit", cfg.get("mamba_dt_limit", (0.0, float("inf"))))
    if limit is not None and (not isinstance(limit, (list, tuple)) or len(limit) != 2
                              or limit[0] not in (0, 0.0) or not _infinite(limit[1])):
        raise ModelFormatError(f"config.json time_step_limit {limit!r} is not supported (only (0, inf): no clamp)"[:200])
    c = hf.common(ARCH) if "num_hidden_layers" in cfg else HFConfig(dict(cfg, num_hidden_layers=len(kinds))).common(ARCH)
    c["norm_eps"] = hf.get("layer_norm_epsilon", 1e-5, float, "norm_eps")
    heads = hf.get("mamba_num_heads", 128, int, "ssm_v_heads")
    head = hf.get("mamba_head_dim", 64, int, "ssm_v_dim")
    groups = cfg.get("n_groups", cfg.get("mamba_n_groups", 8))
    groups = HFConfig.check("config.json n_groups", groups, int, "ssm_k_heads")
    state = HFConfig.check("config.json ssm_state_size", cfg.get("ssm_state_size", 128), int, "ssm_k_dim")
    conv = HFConfig.check("config.json conv_kernel", cfg.get("conv_kernel", cfg.get("mamba_d_conv", 4)), int,
                          "conv_kernel")
    n = len(kinds)
    return TransformerConfig(**c, activation="relu2", ffn_gated=False, ffn_bias=hf.flag("mlp_bias", False),
                             ffn_own_layers=True, layer_kinds=kinds, layer_rope=[False] * n, conv_kernel=conv,
                             ssm_k_heads=groups, ssm_v_heads=heads, ssm_k_dim=state, ssm_v_dim=head)


def _per_layer_ffn(meta: dict) -> tuple[dict, list[bool]]:
    """`nemotron_h.feed_forward_length` as llama.cpp writes it, one value per layer (0: no MLP): the metadata with
    the one common width in its place, and which layers have an MLP."""
    key = f"{ARCH}.feed_forward_length"
    ff = meta.get(key)
    ff = ff.tolist() if isinstance(ff, np.ndarray) else ff
    if not isinstance(ff, (list, tuple)):
        raise ModelFormatError(f"GGUF metadata {key!r} should list one MLP width per layer (0: none), got {ff!r}"[:200])
    widths = sorted({v for v in ff if v != 0}) if all(type(v) is int and v >= 0 for v in ff) else None
    if widths is None or len(widths) > 1:
        raise ModelFormatError(f"GGUF metadata {key!r}: per-layer values {list(ff)[:8]!r} are not 0 or one common "
                               "MLP width")
    return dict(meta, **{key: widths[0] if widths else 1}), [v != 0 for v in ff]


def config_from_gguf(meta: dict) -> TransformerConfig:
    meta, kinds = gguf_layer_kinds(meta, ARCH, "mamba2")
    meta, mlp = _per_layer_ffn(meta)
    hp = GGUFHParams(meta, ARCH)
    c = hp.common()
    if f"{ARCH}.attention.layer_norm_rms_epsilon" not in meta:      # what llama.cpp's older nemotron_h read
        c["norm_eps"] = hp.float("attention.layer_norm_epsilon", 1e-5, "norm_eps")
    n = c["n_layers"]
    if kinds is None or len(kinds) != n or len(mlp) != n:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.attention.head_count_kv' and '{ARCH}.feed_forward_length' "
                               f"should each list the {n} layers")
    both = [i for i in range(n) if mlp[i] and kinds[i] == "attention"]
    if both:
        raise ModelFormatError(f"GGUF layer {both[0]} has both kv heads and an MLP width: a Nemotron-H layer has one "
                               "mixer")
    kinds = ["mlp" if mlp[i] else kinds[i] for i in range(n)]
    heads, inner = hp.int("ssm.time_step_rank", limit="ssm_v_heads"), hp.int("ssm.inner_size", limit="ffn_dim")
    if heads < 1 or inner % heads:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.ssm.inner_size' ({inner}) is not a multiple of "
                               f"'{ARCH}.ssm.time_step_rank' ({heads}), the Mamba2 heads")
    return TransformerConfig(
        **c, activation="relu2", ffn_gated=False, ffn_own_layers=True, layer_kinds=kinds, layer_rope=[False] * n,
        conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"),
        ssm_k_heads=hp.int("ssm.group_count", limit="ssm_k_heads"), ssm_v_heads=heads,
        ssm_k_dim=hp.int("ssm.state_size", limit="ssm_k_dim"),
        ssm_v_dim=HFConfig.check(f"GGUF metadata '{ARCH}.ssm.inner_size' / heads", inner // heads, int, "ssm_v_dim"))


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """MLP biases (config.json's mlp_bias) where the file holds them."""
    cfg.ffn_bias = any(n.endswith(".ffn_up.bias") for n in names)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's per-layer kv heads and MLP widths (a layer with neither is Mamba2) and its Mamba2 keys (export)."""
    a = ARCH
    return {f"{a}.attention.head_count_kv": [cfg.n_kv_heads if k == "attention" else 0 for k in cfg.layer_kinds],
            f"{a}.feed_forward_length": [cfg.ffn_dim if k == "mlp" else 0 for k in cfg.layer_kinds],
            # llama.cpp reads the RMSNorms' epsilon under layer_norm_rms_epsilon now; 0.3.x's nemotron_h under this
            f"{a}.attention.layer_norm_epsilon": cfg.norm_eps,
            f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
            f"{a}.ssm.conv_kernel": cfg.conv_kernel, f"{a}.ssm.state_size": cfg.ssm_k_dim,
            f"{a}.ssm.group_count": cfg.ssm_k_heads, f"{a}.ssm.time_step_rank": cfg.ssm_v_heads,
            f"{a}.ssm.inner_size": cfg.ssm_v_heads * cfg.ssm_v_dim}

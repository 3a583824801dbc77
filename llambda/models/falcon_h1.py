"""Falcon-H1 (HF FalconH1ForCausalLM; llama.cpp's `falcon-h1`): every layer runs attention and a Mamba2 mixer side
by side on the same normed input and adds both outputs to the residual (layer kind `attn_mamba2`), then a
SiLU-gated MLP. Llama-style attention (half-split RoPE, GQA, no biases); the Mamba2 mixer is Granite 4's
(granitehybrid.py) with `mamba_d_ssm` inner channels (default mamba_expand x hidden), an optional conv bias
(`mamba_conv_bias`) and an optional gated group norm (`mamba_rms_norm`: y * silu(z), then RMS-normed in
groups; off: y * silu(z) alone).

µP multipliers, all linear, are folded into the weights as llama.cpp's converter does, so both formats hold
the same model and the config carries none: the embeddings times `embedding_multiplier`, lm_head times
`lm_head_multiplier`, q/v times `attention_in_multiplier`, k times that and `key_multiplier`, o_proj times
`attention_out_multiplier`, the MLP's gate and down times `mlp_multipliers`, in_proj times
`ssm_in_multiplier` and, by row, `ssm_multipliers` (z, x, B, C, dt: transformers' mup_vector), out_proj times
`ssm_out_multiplier`. A HF checkpoint's weights are scaled as they are read (hf_tensors: in their own type,
a 16-bit weight rounded again once, as the converter's); a tied head gets a scaled copy of the embeddings
(unless both multipliers are one number), and
a mixer without a conv bias (`mamba_conv_bias` false) a zero one: llama.cpp's falcon-h1 adds that bias
whether the file has it or not (it crashes on a file without), so an export must hold it.

GGUF (llama.cpp's converter): the weights folded; `falcon-h1.ssm.conv_kernel` / `inner_size` / `state_size` /
`time_step_rank` (the Mamba2 heads) / `group_count`, `attention.key_length`; tensors as Granite 4's Mamba2
(`ssm_in`, `ssm_conv1d` (+ bias), `ssm_dt.bias`, `ssm_a` = -exp(A_log), `ssm_d`, `ssm_norm` as (groups,
d_ssm / groups), `ssm_out`) beside llama's attention and MLP (its norm `blk.N.ffn_norm`, no suffix); q/k rows
as HF's (NEOX rope). Whether the
mixer has its norm is read from the tensors (gguf_flags); a file without conv biases reads as zero ones
(gguf_lookup), as a HF checkpoint without them.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..formats.quants import QType, quantize
from ..formats.weights import WeightTensor
from .config import TransformerConfig, check_number
from .granitehybrid import HF_LAYER_NAMES as GRANITE_NAMES, _infinite
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp

HF_LAYER_NAMES = {
    "pre_ff_layernorm.weight": "ffn_norm.weight",
    **{f"feed_forward.{part}_proj.weight": f"ffn_{part}.weight" for part in ("gate", "up", "down")},
    **{k: v for k, v in GRANITE_NAMES.items() if k.startswith("mamba.")},     # the mixer's, named as Granite 4's
}
HF_GLOBAL_NAMES = {"model.final_layernorm.weight": "output_norm.weight"}
# llama.cpp's falcon-h1 reads the MLP's norm without the `.weight` suffix (its converter writes it so)
GGUF_NAMES = {"ffn_norm.weight": "ffn_norm"}
ARCH = "falcon-h1"
# formats/lora_merge.py: an adapter's update of q_proj adds to W, this model holds W times its multipliers
LORA_REFUSED = "its µP multipliers are folded into the weights here, and an adapter's updates would need them too"
MULTIPLIER_LIMIT = 1e4     # |multiplier| at most this: a weight scaled further is no trained model's


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, ARCH)
    c = hp.common()
    heads, inner = hp.int("ssm.time_step_rank", limit="ssm_v_heads"), hp.int("ssm.inner_size", limit="ffn_dim")
    if heads < 1 or inner % heads:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.ssm.inner_size' ({inner}) is not a multiple of "
                               f"'{ARCH}.ssm.time_step_rank' ({heads}), the Mamba2 heads")
    return TransformerConfig(
        **c, rope_neox=True, tie_embeddings=True, layer_kinds=["attn_mamba2"] * c["n_layers"],
        conv_kernel=hp.int("ssm.conv_kernel", limit="conv_kernel"), ssm_k_heads=hp.int("ssm.group_count", limit="ssm_k_heads"),
        ssm_v_heads=heads, ssm_k_dim=hp.int("ssm.state_size", limit="ssm_k_dim"),
        ssm_v_dim=HFConfig.check(f"GGUF metadata '{ARCH}.ssm.inner_size' / heads", inner // heads, int, "ssm_v_dim"))


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """The mixer's gated norm, optional in llama.cpp's falcon-h1, is there when the file has it. Its conv bias always
    is: a file without any reads as zero ones (gguf_lookup), as a HF checkpoint without them does (hf_tensors), so
    that an export holds them (llama.cpp's loader takes the bias as optional, its graph adds it unchecked: a file
    without one is a segmentation fault there)."""
    cfg.mamba_norm = any(n.endswith(".ssm_norm.weight") for n in names)
    cfg.mamba_conv_bias = True


def gguf_lookup(get, cfg: TransformerConfig):
    """A file with no conv bias in any layer: each layer's a zero one (one read-only array they all read), held by
    no tensor of the file. A file with some layers' biases keeps the others missing (refused by name)."""
    bare = all(get(f"blk.{i}.ssm_conv1d.bias") is None for i in range(cfg.n_layers))
    zeros = []

    def made(name: str) -> bool:
        return bare and name.startswith("blk.") and name.endswith(".ssm_conv1d.bias")

    def lookup(name: str):
        if not made(name):
            return get(name)
        if not zeros:
            z = np.zeros(2 * cfg.ssm_k_heads * cfg.ssm_k_dim + cfg.ssm_v_heads * cfg.ssm_v_dim, np.float32)
            z.flags.writeable = False
            zeros.append(z)
        return WeightTensor.from_float(name, zeros[0])

    def holders(name: str) -> list[str]:
        return [] if made(name) else [name]
    return lookup, holders


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """The Mamba2 keys llama.cpp's falcon-h1 reads (export)."""
    return {f"{ARCH}.ssm.conv_kernel": cfg.conv_kernel, f"{ARCH}.ssm.state_size": cfg.ssm_k_dim,
            f"{ARCH}.ssm.group_count": cfg.ssm_k_heads, f"{ARCH}.ssm.time_step_rank": cfg.ssm_v_heads,
            f"{ARCH}.ssm.inner_size": cfg.ssm_v_heads * cfg.ssm_v_dim}


def _refuse(hf: HFConfig, key: str, default: bool, why: str) -> None:
    if hf.flag(key, default) != default:
        raise ModelFormatError(f"config.json {key}={str(not default).lower()} is not supported ({why})")


def mamba_sizes(hf: HFConfig, d_model: int) -> dict:
    cfg = hf.cfg
    heads = hf.get("mamba_n_heads", 128, int, "ssm_v_heads")
    inner = hf.get("mamba_d_ssm", None, int, "ffn_dim")
    if inner is None:
        inner = hf.get("mamba_expand", 2, int, "n_heads") * d_model
    head = cfg.get("mamba_d_head", "auto")
    head = inner // max(heads, 1) if head in ("auto", None) else hf.get("mamba_d_head", kind=int, limit="ssm_v_dim")
    if heads * head != inner:
        raise ModelFormatError(f"config.json mamba_n_heads {heads} x mamba_d_head {head} is not the Mamba2 inner size "
                               f"{inner} (mamba_d_ssm, or mamba_expand x hidden_size)")
    limit = cfg.get("time_step_limit", (0.0, float("inf")))
    if limit is not None and (not isinstance(limit, (list, tuple)) or len(limit) != 2
                              or limit[0] not in (0, 0.0) or not _infinite(limit[1])):
        raise ModelFormatError(f"config.json time_step_limit {limit!r} is not supported (only (0, inf): no clamp)"[:200])
    norm = hf.flag("mamba_rms_norm", False)
    if norm and hf.flag("mamba_norm_before_gate", True):
        raise ModelFormatError("config.json mamba_norm_before_gate=true (norm(y) * silu(z)) is not supported: only "
                               "y * silu(z) normed after, as the released Falcon-H1 models (and llama.cpp) have it")
    return dict(conv_kernel=hf.get("mamba_d_conv", 4, int, "conv_kernel"),
                ssm_k_heads=hf.get("mamba_n_groups", 1, int, "ssm_k_heads"), ssm_v_heads=heads,
                ssm_k_dim=hf.get("mamba_d_state", 256, int, "ssm_k_dim"), ssm_v_dim=head, mamba_norm=norm,
                mamba_conv_bias=hf.flag("mamba_conv_bias", True))


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "Falcon-H1")
    hf = HFConfig(cfg)
    _refuse(hf, "mamba_proj_bias", False, "no Falcon-H1 has a bias on the mixer's in_proj, nor does llama.cpp")
    _refuse(hf, "projectors_bias", False, "no Falcon-H1 has a bias on the mixer's out_proj, nor does llama.cpp")
    _refuse(hf, "attention_bias", False, "no Falcon-H1 has attention biases")
    multipliers(cfg)            # every one checked before any weight is read
    c = hf.common("falcon_h1")
    n = c["n_layers"]
    return TransformerConfig(**c, layer_kinds=["attn_mamba2"] * n, **mamba_sizes(hf, c["d_model"]))


def multipliers(cfg: dict) -> dict:
    """config.json's µP multipliers, each a finite number of magnitude at most MULTIPLIER_LIMIT (1 where absent)."""
    hf = HFConfig(cfg)

    def one(what: str, v) -> float:
        v = check_number(what, v, "any")
        if abs(v) > MULTIPLIER_LIMIT:
            raise ModelFormatError(f"{what} = {v!r}: a multiplier past +-{MULTIPLIER_LIMIT:g} is not supported")
        return v

    def vector(key: str, n: int) -> list[float]:
        v = cfg.get(key)
        if v is None:
            return [1.0] * n
        if not isinstance(v, list) or len(v) != n:
            raise ModelFormatError(f"config.json {key!r} should list {n} numbers, got {v!r}"[:200])
        return [one(f"config.json {key!r}[{i}]", x) for i, x in enumerate(v)]

    out = {k: one(f"config.json {k!r}", hf.get(k, 1.0)) for k in (
        "embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier", "attention_out_multiplier",
        "key_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")}
    out["ssm_multipliers"] = vector("ssm_multipliers", 5)
    out["mlp_multipliers"] = vector("mlp_multipliers", 2)
    return out


class ScaledTensor(WeightTensor):
    """A float tensor times `scale` (a number, or one per row), computed each time its bytes are read (a backend
    packs a weight once): opening the checkpoint copies nothing, and nothing is kept. Kept in the source's type
    (F32, BF16; F16, whose range a multiplier may leave, and any other type as F32). take_rows scales only the
    rows taken (in_proj's z, xBC and dt parts, each packed apart)."""

    def __init__(self, src: WeightTensor, scale):
        self.name, self.shape = src.name, src.shape
        self.qtype = src.qtype if src.qtype in (QType.F32, QType.BF16) else QType.F32
        self._src, self._scale = src, scale

    @property
    def data(self) -> np.ndarray:
        return self._compute()

    def take_rows(self, index) -> "ScaledTensor":
        scale = np.asarray(self._scale, dtype=np.float32)
        return ScaledTensor(self._src.take_rows(index), scale[np.asarray(index, dtype=np.intp)] if scale.ndim else scale)

    def _compute(self) -> np.ndarray:
        vals = self._src.to_float32().reshape(self.shape)
        scale = np.asarray(self._scale, dtype=np.float32)
        with np.errstate(over="ignore"):          # refused just below
            vals = vals * (scale.reshape(-1, *([1] * (vals.ndim - 1))) if scale.ndim else scale)
        if not np.isfinite(vals).all():
            raise ModelFormatError(f"tensor {self.name!r} times its Falcon-H1 multiplier is not finite (past float32's "
                                   "range): the model file is corrupt")
        return quantize(vals, self.qtype).reshape(-1)


def hf_tensors(cfg_dict: dict, config: TransformerConfig, tensors: dict) -> dict:
    """The checkpoint's canonical tensors with the multipliers folded in, as llama.cpp's converter writes them; a
    tied head becomes a head of its own (the embedding times lm_head_multiplier), the config untied."""
    m = multipliers(cfg_dict)
    d_ssm, gn, heads = config.ssm_v_heads * config.ssm_v_dim, config.ssm_k_heads * config.ssm_k_dim, config.ssm_v_heads
    z, x, b, c, dt = m["ssm_multipliers"]
    mup = m["ssm_in_multiplier"] * np.concatenate([np.full(d_ssm, z), np.full(d_ssm, x), np.full(gn, b), np.full(gn, c),
                                                   np.full(heads, dt)]).astype(np.float32)
    by_leaf = {"attn_q.weight": m["attention_in_multiplier"], "attn_v.weight": m["attention_in_multiplier"],
               "attn_k.weight": m["attention_in_multiplier"] * m["key_multiplier"],
               "attn_output.weight": m["attention_out_multiplier"], "ffn_gate.weight": m["mlp_multipliers"][0],
               "ffn_down.weight": m["mlp_multipliers"][1], "ssm_out.weight": m["ssm_out_multiplier"],
               "ssm_in.weight": mup}
    out = {}
    for name, t in tensors.items():
        leaf = name.split(".", 2)[2] if name.startswith("blk.") else name
        if leaf.endswith(".bias") and leaf not in ("ssm_conv1d.bias", "ssm_dt.bias"):
            raise ModelFormatError(f"tensor {t.name!r}: a Falcon-H1 checkpoint has no such bias (not supported)")
        if leaf == "ssm_in.weight" and t.shape[:1] != mup.shape:
            raise ModelFormatError(f"tensor {t.name!r} has shape {t.shape}, expected ({len(mup)}, {config.d_model}): "
                                   "z, x, B, C and dt rows of the config's Mamba2 sizes")
        scale = by_leaf.get(leaf)
        out[name] = t if scale is None else ScaledTensor(t, scale)
    if not config.mamba_conv_bias:    # llama.cpp's falcon-h1 adds the conv bias unread-checked (no bias: it crashes)
        # one read-only array of zeros that every layer's bias reads: the memory of one layer's, whatever
        # n_layers and the sizes config.json says before any tensor is checked against them
        zeros = np.zeros(2 * gn + d_ssm, np.float32)
        zeros.flags.writeable = False
        for i in range(config.n_layers):
            name = f"blk.{i}.ssm_conv1d.bias"
            if name in tensors:
                raise ModelFormatError(f"tensor {tensors[name].name!r}: config.json says mamba_conv_bias false")
            out[name] = WeightTensor.from_float(name, zeros)
        config.mamba_conv_bias = True
    embd = tensors["token_embd.weight"]
    head = tensors.get("output.weight")
    if head is None and config.tie_embeddings and m["lm_head_multiplier"] != m["embedding_multiplier"]:
        head, config.tie_embeddings = embd, False       # the head is the embeddings scaled otherwise
    if head is not None:
        out["output.weight"] = ScaledTensor(head, m["lm_head_multiplier"])
    out["token_embd.weight"] = ScaledTensor(embd, m["embedding_multiplier"])
    return out

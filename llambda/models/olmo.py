"""OLMo 1 (HF OlmoForCausalLM: OLMo-1B-hf, OLMo-7B-hf; llama.cpp's `olmo`): Llama's attention (half-split RoPE in
HF files, no biases) and SiLU-gated MLP, with LayerNorms that have NO parameters: x - mean over
sqrt(var + 1e-5), no weight, no bias (transformers' OlmoLayerNorm, its epsilon fixed at 1e-5), before attention,
before the MLP and at the end. Neither format holds a norm tensor: the norms' weights are ones made here (one
shared read-only array, hf_tensors / gguf_lookup), and an export leaves them out (gguf_export_tensors), as llama.cpp's
converter writes an olmo file. `clip_qkv` (q, k and v clamped to +-clip after their projections: OLMo-7B-0424)
is refused: no backend op here clamps (llama.cpp: `olmo.attention.clamp_kqv`, refused as well).

GGUF (llama.cpp's converter): llama's keys, `olmo.attention.layer_norm_epsilon`; q/k rows permuted as in `llama`
files (llama.cpp runs olmo with its NORM rope).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .hparams import HFConfig, refuse_quantized
from .layernorm_models import eps_metadata, gguf_config
from .llama import check_hf_mlp

ARCH = "olmo"
EPS = 1e-5          # OlmoLayerNorm's, whatever config.json says
SHAPE = dict(norm_kind="layer", norm_bias=False)


def norm_names(n_layers: int) -> list[str]:
    return ["output_norm.weight"] + [f"blk.{i}.{leaf}" for i in range(n_layers)
                                     for leaf in ("attn_norm.weight", "ffn_norm.weight")]


def _ones(cfg: TransformerConfig) -> np.ndarray:
    ones = np.ones(cfg.d_model, np.float32)
    ones.flags.writeable = False
    return ones


def _clip(value, where: str) -> None:
    if value not in (None, 0, 0.0):
        raise ModelFormatError(f"{where} {value!r} is not supported (OLMo's q/k/v clamp: no backend op here clamps; "
                               "OLMo-1B-hf and OLMo-7B-hf have none)"[:200])


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "OLMo")
    hf = HFConfig(cfg)
    _clip(cfg.get("clip_qkv"), "config.json clip_qkv")
    if hf.flag("attention_bias", False):
        raise ModelFormatError("config.json attention_bias=true is not supported (no OLMo 1 has attention biases)")
    return TransformerConfig(**{**hf.common(ARCH), "norm_eps": EPS, **SHAPE})


def config_from_gguf(meta: dict) -> TransformerConfig:
    _clip(meta.get(f"{ARCH}.attention.clamp_kqv"), f"GGUF metadata '{ARCH}.attention.clamp_kqv'")
    return gguf_config(meta, ARCH, **SHAPE, rope_neox=False)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, ARCH)


def hf_tensors(cfg_dict: dict, config: TransformerConfig, tensors: dict) -> dict:
    """The checkpoint's tensors and the parameter-free norms' weights: ones, held by no tensor of the file."""
    ones = _ones(config)
    out = dict(tensors)
    for name in norm_names(config.n_layers):
        if name in tensors:
            raise ModelFormatError(f"tensor {tensors[name].name!r}: OLMo's LayerNorms have no weights")
        out[name] = WeightTensor.from_float(name, ones)
    return out


def gguf_lookup(get, cfg: TransformerConfig):
    """The norms' weights, which an olmo file does not hold, as ones (one read-only array); a file holding any is
    another model (refused by name when it is read)."""
    names, made = set(norm_names(cfg.n_layers)), []

    def lookup(name: str):
        if name not in names:
            return get(name)
        if get(name) is not None:
            raise ModelFormatError(f"GGUF tensor {name!r}: an olmo file's LayerNorms have no weights")
        if not made:
            made.append(_ones(cfg))
        return WeightTensor.from_float(name, made[0])      # (no copy: a view of the one array)

    def holders(name: str) -> list[str]:
        return [] if name in names else [name]
    return lookup, holders


def gguf_export_tensors(cfg: TransformerConfig, tensors: dict) -> tuple[dict, dict]:
    """(the tensors less the norms' weights, which llama.cpp's olmo does not read, no keys); weights that are not
    all ones (another model) refused."""
    names = set(norm_names(cfg.n_layers))
    for name in names & set(tensors):
        if not np.all(tensors[name].to_float32() == 1.0):
            raise ModelFormatError(f"tensor {name!r}: GGUF 'olmo' has no norm weights, and these are not ones")
    return {n: t for n, t in tensors.items() if n not in names}, {}

"""Apertus (HF ApertusForCausalLM; llama.cpp's `apertus`): Llama's layer under its own norm names
(`attention_layernorm`, `feedforward_layernorm`), RMSNorms on each q and k head before RoPE (half-split in both
formats), Llama 3 RoPE scaling (transformers' default when config.json names no RoPE), and an MLP without a gate,
down(xielu(up(x))).

xIELU has four scalars per layer: transformers keeps alpha_p and alpha_n as parameters (stored raw: the function
takes softplus(alpha_p) and beta + softplus(alpha_n)) and beta, eps as buffers, `mlp.act_fn.*`; canonical tensors
`blk.N.xielu_{alpha_p,alpha_n,beta,eps}.weight` here. llama.cpp keeps the same raw values as per-layer float arrays
under the keys `xielu.alpha_p`, `xielu.alpha_n`, `xielu.beta`, `xielu.eps` (no architecture prefix; one value for
every layer also reads): served as those tensors (gguf_lookup) and written back as keys (gguf_export_tensors).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .arcee import check_hf_ungated_mlp
from .config import TransformerConfig, check_number
from .hparams import GGUFHParams, HFConfig

XIELU = ("alpha_p", "alpha_n", "beta", "eps")
HF_LAYER_NAMES = {
    "attention_layernorm.weight": "attn_norm.weight",
    "feedforward_layernorm.weight": "ffn_norm.weight",
    **{f"mlp.act_fn.{k}": f"xielu_{k}.weight" for k in XIELU},
}
# transformers' ApertusConfig's RoPE when config.json names none
DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
_SHAPE = dict(qk_norm=True, activation="xielu")


@dataclass
class ApertusConfig(TransformerConfig):
    # a GGUF's xIELU scalars by name, one value per layer (a HF directory's are tensors: empty)
    xielu: dict = field(default_factory=dict, compare=False, repr=False)


def config_from_gguf(meta: dict) -> TransformerConfig:
    c = GGUFHParams(meta, "apertus").common()
    values = {}
    for k in XIELU:
        key = f"xielu.{k}"
        if key not in meta:
            raise ModelFormatError(f"GGUF metadata lacks {key!r} (Apertus' xIELU scalars)")
        v = meta[key]
        v = v.tolist() if isinstance(v, np.ndarray) else v
        v = [v] * c["n_layers"] if not isinstance(v, (list, tuple)) else list(v)
        if len(v) != c["n_layers"]:
            raise ModelFormatError(f"GGUF metadata {key!r} holds {len(v)} values for {c['n_layers']} layers")
        values[k] = [check_number(f"GGUF metadata {key!r}", x, "any") for x in v]
    return ApertusConfig(**c, rope_neox=True, **_SHAPE, xielu=values)


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_ungated_mlp(cfg, "xielu", "Apertus")
    hf = HFConfig(cfg)
    if all(cfg.get(k) is None for k in ("rope_parameters", "rope_theta", "rope_scaling")):
        hf = HFConfig({**cfg, "rope_parameters": dict(DEFAULT_ROPE)})
    return ApertusConfig(**hf.common("apertus"), attn_bias=hf.flag("attention_bias", False), **_SHAPE)


def _name(name: str) -> tuple[int, str] | None:
    """(layer, scalar) of a canonical xIELU tensor name, else None."""
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2].startswith("xielu_") and parts[3] == "weight" \
            and parts[1].isdigit() and parts[2][len("xielu_"):] in XIELU:
        return int(parts[1]), parts[2][len("xielu_"):]
    return None


def gguf_lookup(get, cfg: ApertusConfig):
    """The xIELU scalars as one-value tensors from the file's keys; the file's tensors otherwise. Returns
    (lookup, holders: canonical name -> the file's tensors it reads: none for a scalar)."""
    def lookup(name: str):
        hit = _name(name)
        if hit is None or not cfg.xielu or hit[0] >= cfg.n_layers:
            return get(name)
        return WeightTensor.from_float(name, np.array([cfg.xielu[hit[1]][hit[0]]], np.float32))

    def holders(name: str) -> list[str]:
        return [] if _name(name) is not None else [name]

    return lookup, holders


def gguf_export_tensors(cfg: TransformerConfig, tensors: dict) -> tuple[dict, dict]:
    """(the tensors less the xIELU scalars, llama.cpp's keys holding them per layer)."""
    keys = {f"xielu.{k}": [] for k in XIELU}
    rest = {}
    for name, t in tensors.items():
        hit = _name(name)
        if hit is None:
            rest[name] = t
    for k in XIELU:
        for i in range(cfg.n_layers):
            t = tensors.get(f"blk.{i}.xielu_{k}.weight")
            if t is None:
                raise ModelFormatError(f"the model has no xIELU {k} for layer {i}")
            keys[f"xielu.{k}"].append(float(t.to_float32().reshape(-1)[0]))
    return rest, keys

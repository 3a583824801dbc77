"""Ministral 3 (HF Ministral3ForCausalLM, model_type `ministral3`; the 3B, 8B and 14B of December 2025) and the
text model of Mistral 3 (Mistral3ForConditionalGeneration, model_type `mistral3`: Ministral 3's released
checkpoints; its config nests this one under `text_config`). llama.cpp's `mistral3`.

Llama's layers (pre-norms, SiLU MLP, no biases) with an explicit head_dim (heads x head_dim need not be the
hidden size), YaRN RoPE, and a query temperature: after RoPE, each query row at position p
is multiplied by 1 + beta * ln(1 + floor(p / original_max_position_embeddings)), beta the rope parameters'
`llama_4_scaling_beta` (config.attn_temp_scale / attn_temp_length; exactly 1 below 16384 on the released models).
models/base.py applies it with the backend's pos_scale op, which reads each row's position when it runs: recorded
decode plans replay it past 16384 as below.

YaRN's attention factor follows transformers: `attention_factor` when given, else mscale(factor, mscale) /
mscale(factor, mscale_all_dim) when both are set (1 on the released models: mscale = mscale_all_dim = 1), else
mscale(factor) = 0.1 ln(factor) + 1; it is written into the scaling dict so config.scale() squares it.

GGUF (llama.cpp's keys): Llama's, with `mistral3.rope.scaling.yarn_log_multiplier` (mscale_all_dim, mscale taken
as 1), `mistral3.attention.temperature_scale` (beta; its positions are rope.scaling.original_context_length, and
`attention.temperature_length` where a file has it) and q/k rows permuted for adjacent-pair RoPE as in `llama`
files (llama.cpp runs mistral3 with its NORM rope). A Mistral 3 directory's Pixtral tower and projector are
llambda.vision's (vision/pixtral.py); the decoder's loader leaves their tensors to it.
"""
from __future__ import annotations

import math

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .mistral import hf_common_sliding


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _with_attention_factor(scaling: dict | None, where: str) -> dict | None:
    """YaRN's scaling dict with its attention factor spelled out as transformers computes it."""
    if not scaling or (scaling.get("rope_type") or scaling.get("type")) != "yarn" or \
            scaling.get("attention_factor") is not None:
        return scaling
    factor = float(scaling["factor"])
    mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    for key, v in (("mscale", mscale), ("mscale_all_dim", all_dim)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ModelFormatError(f"{where} {key!r} should be a number, got {v!r}"[:200])
    af = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim) if mscale and all_dim else yarn_mscale(factor)
    if not (math.isfinite(af) and af > 0):
        raise ModelFormatError(f"{where}: YaRN's attention factor {af!r} (mscale {mscale!r} over mscale_all_dim "
                               f"{all_dim!r}) is not a positive number")
    return dict(scaling, attention_factor=af)


def _temperature_hf(params: dict, where: str) -> dict:
    """(attn_temp_scale, attn_temp_length) from the rope parameters' llama_4_scaling_beta and
    original_max_position_embeddings; transformers needs both (a missing beta fails its forward)."""
    if params.get("llama_4_scaling_beta") is None:
        raise ModelFormatError(f"{where} lacks 'llama_4_scaling_beta' (the query temperature's slope; 0 for none)")
    beta = HFConfig.check(f"{where} 'llama_4_scaling_beta'", params["llama_4_scaling_beta"], float, "attn_temp_scale")
    if not beta:
        return {}
    length = params.get("original_max_position_embeddings")
    if length is not None:
        length = HFConfig.check(f"{where} 'original_max_position_embeddings'", length, int, "attn_temp_length")
    if not length:
        raise ModelFormatError(f"{where} lacks 'original_max_position_embeddings', the positions the query "
                               "temperature steps by")
    return {"attn_temp_scale": beta, "attn_temp_length": length}


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Ministral 3")
    key = "rope_parameters" if isinstance(cfg.get("rope_parameters"), dict) else "rope_scaling"
    params = cfg.get(key)
    if not isinstance(params, dict):
        raise ModelFormatError("config.json lacks 'rope_parameters' (Ministral 3's YaRN and query temperature)")
    if params.get("rope_type") is None and params.get("type") is not None:
        # transformers reads the older `type` as rope_type (hparams' rope_parameters reader takes rope_type only)
        cfg = dict(cfg, **{key: dict(params, rope_type=params["type"])})
    # transformers' Ministral 3 slides every layer when sliding_window is set; it reads no layer_types
    c = hf_common_sliding({k: v for k, v in cfg.items() if k != "layer_types"}, "ministral3", default_sliding=True)
    hf = HFConfig(cfg)
    c["rope_scaling"] = _with_attention_factor(c["rope_scaling"], f"config.json {key!r}")
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False),
                             **_temperature_hf(params, f"config.json {key!r}"))


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "mistral3")
    c = dict(hp.common(), arch="ministral3")     # one name whichever format (family_of finds it)
    sc = c["rope_scaling"]
    if sc and sc.get("rope_type") == "yarn":
        # llama.cpp: mscale 1, mscale_all_dim = yarn_log_multiplier; 0 (or none): mscale(factor) alone
        log_mul = hp.float("rope.scaling.yarn_log_multiplier", 0.0)
        sc = dict(sc, mscale=1.0, mscale_all_dim=log_mul) if log_mul else sc
        c["rope_scaling"] = _with_attention_factor(sc, "GGUF metadata 'mistral3.rope.scaling'")
    temp = {}
    beta = hp.float("attention.temperature_scale", 0.0, "attn_temp_scale")
    if beta:
        key = "attention.temperature_length" if "mistral3.attention.temperature_length" in meta else \
            "rope.scaling.original_context_length"
        if f"mistral3.{key}" not in meta:
            raise ModelFormatError("GGUF metadata 'mistral3.attention.temperature_scale' needs the positions it "
                                   "steps by: 'mistral3.rope.scaling.original_context_length'")
        temp = {"attn_temp_scale": beta, "attn_temp_length": hp.int(key, limit="attn_temp_length")}
    return TransformerConfig(**c, rope_neox=False, **temp,
                             sliding_window=hp.int("attention.sliding_window", 0, "sliding_window"))


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's keys for the query temperature and YaRN's attention factor (mscale_all_dim, mscale 1)."""
    meta = {}
    sc = cfg.rope_scaling or {}
    if (sc.get("rope_type") or sc.get("type")) == "yarn":
        af = float(sc.get("attention_factor", 1.0))
        factor = float(sc["factor"])
        # mscale(factor, 1) / mscale(factor, m) = af  =>  m = ((0.1 ln f + 1) / af - 1) / (0.1 ln f)
        m = ((yarn_mscale(factor) / af) - 1.0) / (0.1 * math.log(factor)) if factor > 1 else 0.0
        if m:
            meta["mistral3.rope.scaling.yarn_log_multiplier"] = m
    if cfg.attn_temp_scale:
        meta["mistral3.attention.temperature_scale"] = float(cfg.attn_temp_scale)
        meta["mistral3.attention.temperature_length"] = int(cfg.attn_temp_length)
        if "original_max_position_embeddings" in sc and sc["original_max_position_embeddings"] != cfg.attn_temp_length:
            raise ModelFormatError("llama.cpp steps mistral3's query temperature by YaRN's original context: "
                                   f"{sc['original_max_position_embeddings']} here, the temperature's "
                                   f"{cfg.attn_temp_length}")
    return meta

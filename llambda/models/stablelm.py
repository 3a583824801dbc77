"""StableLM (HF StableLmForCausalLM: StableLM-3B-4E1T, StableLM 2 1.6B / 12B, Zephyr; llama.cpp `stablelm`):
LayerNorms WITH bias, a SiLU-gated MLP without biases, RoPE on the first `partial_rotary_factor` of each head
(half-split pairs within them), optional q/k/v biases (`use_qkv_bias`), optional per-head q/k LayerNorms without
bias, each head with its own weight (`qk_layernorm`, StableLM 2 12B), and an optional parallel residual
(`use_parallel_residual`: x += attn(h) + mlp(h) on ONE norm h, no post_attention_layernorm). Untied head.

HF stores each head's q/k norm as its own tensor (`self_attn.q_layernorm.norms.{h}.weight`); they are stacked at
load into (heads, head_dim) as llama.cpp's converter stacks them (`attn_q_norm.weight`). A GGUF says by its
tensors what config.json says by flags: biases, q/k norms, and a parallel residual where no layer has an
`ffn_norm` (llama.cpp's rule). The norm epsilon is `layer_norm_eps` / `stablelm.attention.layer_norm_epsilon`.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .hparams import HFConfig, refuse_quantized
from .layernorm_models import FINAL_NORM_BIAS, NORM_BIAS_NAMES, eps_metadata, gguf_config
from .llama import check_hf_mlp
from .qwen3next import partial_rope_dim

HF_LAYER_NAMES, HF_GLOBAL_NAMES = NORM_BIAS_NAMES, FINAL_NORM_BIAS
SHAPE = dict(norm_kind="layer", norm_bias=True, rope_neox=True)
_HEAD_NORM = re.compile(r"self_attn\.(q|k)_layernorm\.norms\.(\d+)\.weight")
_STACKED = re.compile(r"(blk\.\d+\.attn_[qk]_norm)\.(\d+)\.weight")


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """Per-head q/k norms and a parallel residual where no layer has an ffn_norm (llama.cpp's rule)."""
    names = list(names)
    cfg.qk_norm = cfg.qk_norm_heads = any(n.endswith("attn_q_norm.weight") for n in names)
    cfg.parallel_block = not any(n.endswith("ffn_norm.weight") for n in names)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, "stablelm")


def config_from_gguf(meta: dict) -> TransformerConfig:
    return gguf_config(meta, "stablelm", **SHAPE, tie_embeddings=False)


def hf_splitter(config: TransformerConfig):
    """A head's q/k norm weight under a per-head name (`attn_q_norm.{h}.weight`), stacked by hf_tensors."""
    heads = {"q": config.n_heads, "k": config.n_kv_heads}

    def split(suffix: str, t, name: str):
        m = _HEAD_NORM.fullmatch(suffix)
        if m is None:
            return None
        if not config.qk_norm or int(m.group(2)) >= heads[m.group(1)]:
            raise ModelFormatError(f"tensor {name!r} is not part of the model config.json describes "
                                   f"(qk_layernorm {config.qk_norm}, {heads[m.group(1)]} {m.group(1)} heads)"[:200])
        return [(f"attn_{m.group(1)}_norm.{int(m.group(2))}.weight", None, t)]
    return split


def hf_tensors(cfg_dict: dict, config: TransformerConfig, tensors: dict) -> dict:
    """Each layer's per-head q/k norm weights stacked into one (heads, head_dim) tensor, head 0 first."""
    out, parts = {}, {}
    for name, t in tensors.items():
        m = _STACKED.fullmatch(name)
        if m is None:
            out[name] = t
        else:
            parts.setdefault(m.group(1), {})[int(m.group(2))] = t
    for base, got in parts.items():
        heads = config.n_heads if base.endswith("q_norm") else config.n_kv_heads
        if sorted(got) != list(range(heads)):
            missing = min(set(range(heads)) - set(got))
            raise ModelFormatError(f"tensor {got[min(got)].name!r}: the q/k norm of head {missing} of its layer is "
                                   "missing from the checkpoint")
        rows = []
        for h in range(heads):
            t = got[h]
            if t.shape != (config.head_dim,):
                raise ModelFormatError(f"tensor {t.name!r} has shape {t.shape}, expected ({config.head_dim},)")
            rows.append(t.to_float32().reshape(-1))
        out[base + ".weight"] = WeightTensor.from_float(got[0].name, np.stack(rows))
    return out


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "StableLM")
    hf = HFConfig(cfg)
    c = hf.common("stablelm")
    qk, bias = hf.flag("qk_layernorm", False), hf.flag("use_qkv_bias", False)
    c.update(norm_eps=hf.get("layer_norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", False), rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.25))
    return TransformerConfig(**c, **{k: v for k, v in SHAPE.items() if k != "rope_neox"}, attn_bias=bias,
                             qk_norm=qk, qk_norm_heads=qk, parallel_block=hf.flag("use_parallel_residual", False))

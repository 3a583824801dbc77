"""GPT-NeoX / Pythia (HF GPTNeoXForCausalLM; llama.cpp `gptneox`): LayerNorms WITH bias, one fused
`query_key_value` projection with a bias, RoPE on the first `rotary_pct` of each head (half-split pairs within
them), an output projection (`dense`) with a bias, an MLP without a gate (dense_h_to_4h -> GELU -> dense_4h_to_h,
both with biases) and, with `use_parallel_residual` (Pythia's default), attention and MLP reading the same x each
through its own norm: x += attn(ln1(x)) + mlp(ln2(x)) (TransformerConfig.parallel_ffn_norm). Untied head
(`embed_out`), no GQA.

HF's fused rows are grouped per head (head h: its q rows, k rows, v rows); llama.cpp's converter regroups them into
q of every head, then k, then v (`attn_qkv`, and its bias alike), and so do we at load, so both formats hold one
layout and the loader splits q, k and v from it (models/base.py: unfused_lookup).

Activation: `hidden_act` "gelu" (Pythia) is the exact GELU 0.5 x (1 + erf(x / sqrt 2)); "gelu_new", "gelu_fast"
and "gelu_pytorch_tanh" (GPT-NeoX-20B's "gelu_fast") are its tanh approximation. A GGUF says neither: it is read as
the exact GELU of Pythia (llama.cpp runs its tanh approximation on every gptneox file, within about 1e-3 of it),
and a tanh-GELU model is not exported to GGUF (the file could not say so).

RoPE: config.json's `rotary_pct` and `rotary_emb_base` (transformers 4) or `rope_parameters`'
partial_rotary_factor and rope_theta (5); GGUF's rope.dimension_count and rope.freq_base.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .layernorm_models import NORM_BIAS_NAMES, gguf_config, hf_activation
from .qwen3next import partial_rope_dim

HF_PREFIXES = (("gpt_neox.layers.", "model.layers."),)
HF_LAYER_NAMES = {
    **NORM_BIAS_NAMES,
    "attention.dense.weight": "attn_output.weight",
    "attention.dense.bias": "attn_output.bias",
    "mlp.dense_h_to_4h.weight": "ffn_up.weight",
    "mlp.dense_h_to_4h.bias": "ffn_up.bias",
    "mlp.dense_4h_to_h.weight": "ffn_down.weight",
    "mlp.dense_4h_to_h.bias": "ffn_down.bias",
}
HF_GLOBAL_NAMES = {"gpt_neox.embed_in.weight": "token_embd.weight",
                   "gpt_neox.final_layer_norm.weight": "output_norm.weight",
                   "gpt_neox.final_layer_norm.bias": "output_norm.bias", "embed_out.weight": "output.weight"}
ERF_GELUS = ("gelu",)
TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")
# old checkpoints' causal-mask buffers (transformers ignores them too)
_BUFFERS = ("attention.bias", "attention.masked_bias")
SHAPE = dict(norm_kind="layer", norm_bias=True, ffn_gated=False, rope_neox=True, ffn_bias=True)


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """The biases a GGUF holds (its fused qkv's among them)."""
    names = list(names)
    if any(n.endswith(("attn_qkv.bias", "attn_q.bias")) for n in names):
        cfg.attn_bias = True
    if any(n.endswith("attn_output.bias") for n in names):
        cfg.attn_out_bias = True


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return {"gptneox.attention.layer_norm_epsilon": cfg.norm_eps,
            "gptneox.use_parallel_residual": bool(cfg.parallel_ffn_norm)}


def config_from_gguf(meta: dict) -> TransformerConfig:
    return gguf_config(meta, "gptneox", **SHAPE, activation="gelu_erf", tie_embeddings=False,
                       parallel_ffn_norm=GGUFHParams(meta, "gptneox").flag("use_parallel_residual"))


def qkv_order(n_heads: int, head_dim: int) -> np.ndarray:
    """HF's fused row of each llama.cpp row: q of every head, then k, then v, from HF's per-head groups."""
    return np.arange(3 * n_heads * head_dim).reshape(n_heads, 3, head_dim).transpose(1, 0, 2).reshape(-1)


def hf_splitter(config: TransformerConfig):
    order = qkv_order(config.n_heads, config.head_dim)

    def split(suffix: str, t, name: str):
        if suffix in _BUFFERS:
            return []
        if suffix not in ("attention.query_key_value.weight", "attention.query_key_value.bias"):
            return None
        leaf = suffix.rsplit(".", 1)[1]
        want = (len(order),) if leaf == "bias" else (len(order), config.d_model)
        if tuple(t.shape) != want:
            raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected {want}")
        if leaf == "bias":
            part = WeightTensor.from_float(t.name, t.to_float32().reshape(-1)[order])
        else:
            part = t.take_rows(order)
        return [(f"attn_qkv.{leaf}", None, part)]
    return split


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "GPT-NeoX")
    act = hf_activation(cfg, ERF_GELUS + TANH_GELUS, "GPT-NeoX")
    hf = HFConfig(cfg)
    if "rope_parameters" not in cfg and "rotary_emb_base" in cfg:     # transformers 4's spelling
        cfg = {**cfg, "rope_theta": cfg["rotary_emb_base"]}
        hf = HFConfig(cfg)
    c = hf.common("gpt_neox")
    if c["n_heads"] * c["head_dim"] != c["d_model"]:
        raise ModelFormatError(f"config.json hidden_size {c['d_model']} is not num_attention_heads "
                               f"{c['n_heads']} times head_dim {c['head_dim']}")
    if c["n_kv_heads"] != c["n_heads"]:
        raise ModelFormatError("config.json num_key_value_heads: GPT-NeoX has a key/value head per query head")
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    if "partial_rotary_factor" not in params:       # transformers 4's rotary_pct (default 0.25)
        pct = hf.get("rotary_pct", 0.25, float, "positive")
        if pct > 1:
            raise ModelFormatError(f"config.json 'rotary_pct' = {pct!r} is more than every dim (1)")
        cfg = {**cfg, "partial_rotary_factor": pct}
    bias = hf.flag("attention_bias", True)
    c.update(norm_eps=hf.get("layer_norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", False), rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.25))
    return TransformerConfig(**c, **{k: v for k, v in SHAPE.items() if k != "rope_neox"},
                             activation="gelu_erf" if act in ERF_GELUS else "gelu_tanh", attn_bias=bias,
                             attn_out_bias=bias, parallel_ffn_norm=hf.flag("use_parallel_residual", True))

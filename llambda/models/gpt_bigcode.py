"""GPT-BigCode (HF GPTBigCodeForCausalLM: StarCoder 1, StarCoderBase, SantaCoder's later ports, tiny_starcoder,
WizardCoder; llama.cpp `starcoder`): GPT-2 (models/gpt2.py: learned positions, LayerNorms with bias, biases
everywhere, an ungated tanh-GELU MLP) with nn.Linear weights (out, in), not Conv1D, and multi-query attention.

multi_query (the default): c_attn's rows are q (n_embd), then ONE key head, then ONE value head, shared by every
query head: llama.cpp's `attn_qkv` as is, with `starcoder.attention.head_count_kv` 1. multi_query false: a key and
value head per query head, c_attn's rows grouped PER HEAD (head h: q, k, v rows), regrouped at load into q of every
head, then k, then v (llama.cpp's converter does not regroup them; our export writes the regrouped rows).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .gpt2 import BUFFERS, HF_GLOBAL_NAMES, SHAPE, gguf_common, hf_common  # noqa: F401
from .gpt2 import HF_LAYER_NAMES as GPT2_LAYER_NAMES
from .gpt_neox import qkv_order
from .hparams import HFConfig
from .layernorm_models import eps_metadata

HF_PREFIXES = (("transformer.h.", "model.layers."),)
HF_LAYER_NAMES = {**GPT2_LAYER_NAMES, "attn.c_attn.weight": "attn_qkv.weight", "attn.c_proj.weight": "attn_output.weight",
                  "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_proj.weight": "ffn_down.weight"}


def hf_splitter(config: TransformerConfig):
    mha = config.n_kv_heads == config.n_heads
    order = qkv_order(config.n_heads, config.head_dim)

    def split(suffix: str, t, name: str):
        if suffix in BUFFERS:
            return []
        if not mha or suffix not in ("attn.c_attn.weight", "attn.c_attn.bias"):
            return None
        leaf = suffix.rsplit(".", 1)[1]
        want = (len(order),) if leaf == "bias" else (len(order), config.d_model)
        if tuple(t.shape) != want:
            raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected {want}")
        part = WeightTensor.from_float(t.name, t.to_float32().reshape(-1)[order]) if leaf == "bias" else \
            t.take_rows(order)
        return [(f"attn_qkv.{leaf}", None, part)]
    return split


def lora_regrouped(cfg: TransformerConfig) -> tuple:
    """multi_query false's per-head c_attn is regrouped at load (a PEFT adapter's rows are in the checkpoint's
    order); multi-query rows are q|k|v already."""
    return ("attn_qkv.weight",) if cfg.n_kv_heads == cfg.n_heads else ()


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common(cfg, "gpt_bigcode", "GPT-BigCode")
    if HFConfig(cfg).flag("multi_query", True):
        c["n_kv_heads"] = 1
    return TransformerConfig(**c, **SHAPE)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, "starcoder")


def config_from_gguf(meta: dict) -> TransformerConfig:
    return TransformerConfig(**gguf_common(meta, "starcoder"))

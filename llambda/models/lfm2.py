"""LFM2 (LiquidAI): a hybrid of gated short-convolution layers and attention layers.

A conv layer: B, C, x = in_proj(h) (three d_model-wide parts), u = B * x, a causal depthwise
convolution of width L over the last L values of u per channel, out = out_proj(C * conv). The
last L - 1 values of u are each sequence's state (models/base.py keeps it beside the KV cache).
Attention layers have per-head q/k RMSNorms; every layer a SiLU MLP; the final norm is the one
config.json calls `embedding_norm` (llama.cpp: `token_embd_norm`). Embeddings are tied.

config.json: `layer_types` ("conv" / "full_attention"; older files: `full_attn_idxs`),
`conv_L_cache` (L), `norm_eps`, and the MLP width derived from `intermediate_size` (older:
`block_ff_dim`) as `block_auto_adjust_ff_dim` says. GGUF: `lfm2.attention.head_count_kv` is a
per-layer array, 0 for a conv layer; `lfm2.shortconv.l_cache`; `feed_forward_length` is the
derived width.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, gguf_layer_kinds, hf_layer_kinds

# canonical name -> the name llama.cpp's lfm2 files use
GGUF_NAMES = {"output_norm.weight": "token_embd_norm.weight"}

# HF names of this family (merged over the shared ones by formats/hf_dir.py)
HF_GLOBAL_NAMES = {"model.embedding_norm.weight": "output_norm.weight"}
HF_LAYER_NAMES = {
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
}


def refuse_non_lm(hp: GGUFHParams) -> None:
    """What llama.cpp's lfm2 files may say that is not the causal language model run here: bidirectional
    attention (LFM2.5-Embedding's Lfm2BidirectionalModel) or a sliding window (LFM2.5-Audio's detokenizer);
    each ran as a plain causal model before. (Their extra dense_2_out tensors are refused as unread.)"""
    if not hp.flag("attention.causal", True):
        raise ModelFormatError(f"GGUF metadata '{hp.arch}.attention.causal' = false: a bidirectional LFM2 (an "
                               "embedding model) is not supported")
    window = hp.int("attention.sliding_window", 0, "sliding_window")
    if window and hp.arch == "lfm2":      # (llama.cpp's lfm2moe does not read the key)
        raise ModelFormatError(f"GGUF metadata '{hp.arch}.attention.sliding_window' = {window}: LFM2 with windowed "
                               "attention is not supported")


def config_from_gguf(meta: dict) -> TransformerConfig:
    meta, kinds = gguf_layer_kinds(meta, "lfm2", "shortconv")
    hp = GGUFHParams(meta, "lfm2")
    refuse_non_lm(hp)
    c = hp.common()
    return TransformerConfig(**c, rope_neox=True, qk_norm=True, layer_kinds=kinds or [],
                             conv_kernel=hp.int("shortconv.l_cache", limit="conv_kernel"))


def ffn_width(hf: HFConfig) -> int:
    """The MLP's width: `intermediate_size`, or with block_auto_adjust_ff_dim 2/3 of it, times
    block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of (as transformers does)."""
    ff = hf.get("intermediate_size", kind=int, limit="ffn_dim")
    if not hf.flag("block_auto_adjust_ff_dim", True):
        return ff
    ff = int(2 * ff / 3)
    mult = hf.get("block_ffn_dim_multiplier", None, float, "positive")
    if mult is not None:
        ff = int(mult * ff)
    of = hf.get("block_multiple_of", 256, int, "ffn_dim")
    return HFConfig.check("config.json MLP width", of * ((ff + of - 1) // of), int, "ffn_dim")


def layer_kinds(hf: HFConfig, n_layers: int) -> list[str]:
    types = hf.cfg.get("layer_types")
    if types is None:
        idx = hf.cfg.get("full_attn_idxs")
        idx = list(range(n_layers)) if idx is None else idx
        if not isinstance(idx, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise ModelFormatError(f"config.json 'full_attn_idxs' should list layer numbers, got {idx!r}")
        types = ["full_attention" if i in idx else "conv" for i in range(n_layers)]
    return hf_layer_kinds(types, n_layers, {"conv": "shortconv", "full_attention": "attention"})


def config_from_hf(cfg: dict) -> TransformerConfig:
    if cfg.get("block_ff_dim") is not None:      # the first checkpoints' spelling (it wins, as in transformers)
        cfg = dict(cfg, intermediate_size=cfg["block_ff_dim"])
    hf = HFConfig(cfg)
    if hf.flag("conv_bias", False):
        raise ModelFormatError("config.json conv_bias=true is not supported (LFM2's convolutions have no biases)")
    c = hf.common("lfm2")
    c.update(ffn_dim=ffn_width(hf), norm_eps=hf.get("norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", hf.flag("tie_embedding", True)))
    return TransformerConfig(**c, qk_norm=True, layer_kinds=layer_kinds(hf, c["n_layers"]),
                             conv_kernel=hf.get("conv_L_cache", 3, int, "conv_kernel"))

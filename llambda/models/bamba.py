"""Bamba (HF BambaForCausalLM, model_type `bamba`: ibm-ai-platform/Bamba-9B and its v2): Granite 4's hybrid without
MoE and without Granite's multipliers. Mamba2 layers (granitehybrid.py's mixer: in_proj -> z, xBC, dt; the causal
convolution with its bias, SiLU; the selective scan with a per-head decay; y * silu(z) RMS-normed in n_groups
groups; out_proj) and attention layers (GQA, RoPE on the first HALF of each head: transformers hard-codes
partial_rotary_factor 0.5 for Bamba, the pairs (i, i + head_dim / 4) of the rotated half), each followed by a dense
SwiGLU MLP. Every layer x += mixer(rmsnorm(x)), then x += mlp(rmsnorm(x)); final_layernorm and the head.

config.json: `attn_layer_indices` (the attention layers; every other layer Mamba2), `mamba_n_heads`,
`mamba_d_head` ("auto": d_inner / heads), `mamba_n_groups`, `mamba_d_state`, `mamba_d_conv`, `mamba_expand`
(d_inner = expand x hidden), `mamba_conv_bias`, `rms_norm_eps` (the block norms and the gated norm),
`rope_parameters` / `rope_theta`. `attn_rotary_emb` (Bamba-9B's file: 64 of its heads' 128) is what the
hard-coded half gives; another value, or a partial_rotary_factor other than 0.5, is refused. `mamba_chunk_size`
only cuts transformers' prefill into blocks (the same sums): not read. Refused as for Granite 4: projection biases,
no convolution bias, a time_step_limit clamp; an MLP bias.

GGUF: llama.cpp's converter writes Bamba as `granitehybrid` (its `BambaForCausalLM`): the model here is that
architecture's (arch `bamba` only names where the file came from), RoPE on (`rope.scaling.finetuned` true), the
dense MLP `ffn_{gate,up,down}` of `expert_shared_feed_forward_length`, q/k rows permuted for adjacent-pair
rotation. llama.cpp's converter permutes each head's rows whole (then its RoPE turns the pairs (i, i + head_dim / 2)
of the first `rope.dimension_count` dims, not transformers' pairs): a file of its converter runs here as llama.cpp
runs it; our export permutes only the rotated half's rows, so llama.cpp computes transformers' model on it.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .granitehybrid import HF_LAYER_NAMES as GRANITE_NAMES, mamba_sizes
from .hparams import HFConfig, refuse_quantized
from .jamba import FFN_NAMES, HF_GLOBAL_NAMES  # noqa: F401 (Jamba's final norm: hf_dir reads it from here)
from .llama import check_hf_mlp

ARCH = "bamba"
HF_LAYER_NAMES = {**{k: v for k, v in GRANITE_NAMES.items() if k.startswith("mamba.")}, **FFN_NAMES}


def _attention_layers(cfg: dict, n: int) -> list[bool]:
    idx = cfg.get("attn_layer_indices") or []
    if not isinstance(idx, list) or not all(type(i) is int and 0 <= i < n for i in idx) or len(set(idx)) != len(idx):
        raise ModelFormatError(f"config.json 'attn_layer_indices' should list distinct layers in [0, {n}), got "
                               f"{idx!r}"[:200])
    return [i in idx for i in range(n)]


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Bamba")
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common(ARCH)
    c["norm_eps"] = hf.get("rms_norm_eps", 1e-5, float, "norm_eps")      # Bamba's default
    n, head_dim = c["n_layers"], c["head_dim"]
    for where, factor in (("partial_rotary_factor", cfg.get("partial_rotary_factor")),
                          ("rope_parameters.partial_rotary_factor",
                           (cfg.get("rope_parameters") or {}).get("partial_rotary_factor")
                           if isinstance(cfg.get("rope_parameters"), dict) else None)):
        if factor is not None and factor != 0.5:
            raise ModelFormatError(f"config.json {where} {factor!r} is not supported (transformers runs Bamba with "
                                   "RoPE over half of each head, 0.5, whatever the file says)"[:200])
    if head_dim % 4:
        raise ModelFormatError(f"Bamba's heads of {head_dim} do not split into a rotated half of pairs")
    rotary = cfg.get("attn_rotary_emb")
    if rotary is not None and rotary != head_dim // 2:
        raise ModelFormatError(f"config.json attn_rotary_emb {rotary!r} is not half of the heads' {head_dim} "
                               "(transformers rotates half of each head)"[:200])
    attention = _attention_layers(cfg, n)
    return TransformerConfig(
        **c, rope_dim=head_dim // 2, attn_bias=hf.flag("attention_bias", False),
        embed_scale=1.0,           # as llama.cpp's granitehybrid reads a file without embedding_scale
        layer_kinds=["attention" if a else "mamba2" for a in attention], layer_rope=[True] * n,
        **mamba_sizes(hf, c["d_model"]))

"""Mixtral: Mistral's attention, every MLP an MoE of `num_local_experts` experts (each of
`intermediate_size`), softmax router, top-k renormalised. llama.cpp writes Mixtral GGUFs as
arch `llama` with expert tensors (llama.py reads those)."""
from __future__ import annotations

from .config import TransformerConfig
from .mistral import hf_common_sliding
from .moe import hf_moe


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "mixtral", default_sliding=True)
    moe = hf_moe({**cfg, "norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1}, c["n_layers"],
                 norm_default=True, count_keys=("num_local_experts",), expert_ffn_key="intermediate_size")
    return TransformerConfig(**c, **moe)

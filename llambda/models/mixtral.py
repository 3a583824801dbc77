"""Mixtral: Mistral's attention, every MLP an MoE of `num_local_experts` experts (each of
`intermediate_size`), softmax router, top-k renormalised. llama.cpp writes Mixtral GGUFs as
arch `llama` with expert tensors (llama.py reads those)."""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import HFConfig
from .llama import check_hf_mlp
from .mistral import hf_layer_sliding
from .moe import hf_moe


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    c = HFConfig(cfg).common("mixtral")
    window, flags = hf_layer_sliding(cfg, c["n_layers"], default_sliding=True)
    moe = hf_moe({**cfg, "norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1}, c["n_layers"],
                 norm_default=True, count_keys=("num_local_experts",), expert_ffn_key="intermediate_size")
    return TransformerConfig(**c, sliding_window=window, layer_sliding=flags, **moe)

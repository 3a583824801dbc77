"""Mixture-of-experts hyper-parameters, read the same way for every MoE family.

An MoE layer replaces the dense MLP by a router (one logit per expert), k experts per token
and optionally an always-on shared expert. Which layers are MoE, how many experts there are
and how the router's logits become weights are read here; the math is models/base.py's.
"""
from __future__ import annotations

from .hparams import GGUFHParams, HFConfig


def hf_moe(cfg: dict, n_layers: int, *, norm_default: bool, count_keys=("num_experts", "num_local_experts"),
           expert_ffn_key: str = "moe_intermediate_size") -> dict:
    """The MoE fields of a Hugging Face config (Qwen2/3-MoE spelling; Mixtral passes its own keys).

    Layer i is MoE iff i is not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0."""
    hf = HFConfig(cfg)
    key = next((k for k in count_keys if cfg.get(k) is not None), count_keys[0])
    n_experts = hf.get(key, kind=int, limit="n_experts")
    step = hf.get("decoder_sparse_step", 1, int)
    if step < 1:
        raise_bad("decoder_sparse_step", step)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(i) is int for i in dense):
        raise_bad("mlp_only_layers", dense)
    return dict(
        n_experts=n_experts,
        n_experts_used=hf.get("num_experts_per_tok", kind=int, limit="n_experts_used"),
        expert_ffn_dim=hf.get(expert_ffn_key, kind=int, limit="expert_ffn_dim"),
        moe_norm_topk=hf.flag("norm_topk_prob", norm_default),
        shared_ffn_dim=hf.get("shared_expert_intermediate_size", 0, int, "shared_ffn_dim"),
        moe_layers=[n_experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n_layers)],
    )


def gguf_moe(hp: GGUFHParams, *, norm_default: bool, expert_ffn_key: str = "expert_feed_forward_length") -> dict:
    """The MoE fields of GGUF metadata (llama.cpp's keys); {} for a dense model.

    Layers before `leading_dense_block_count` are dense; so is any layer whose file holds a
    dense MLP and no router (models/base.py decides per layer from the tensors)."""
    n_experts = hp.int("expert_count", 0, "n_experts")
    if not n_experts:
        return {}
    n_layers = hp.int("block_count", limit="n_layers")
    lead = hp.int("leading_dense_block_count", 0, "n_experts")     # 0..4096, like the layer count
    return dict(
        n_experts=n_experts,
        n_experts_used=hp.int("expert_used_count", limit="n_experts_used"),
        expert_ffn_dim=hp.int(expert_ffn_key, hp.int("feed_forward_length", limit="ffn_dim"), "expert_ffn_dim"),
        moe_norm_topk=hp.flag("expert_weights_norm", norm_default),
        shared_ffn_dim=hp.int("expert_shared_feed_forward_length", 0, "shared_ffn_dim"),
        moe_layers=[i >= lead for i in range(n_layers)],
    )


def raise_bad(key: str, v) -> None:
    from ..errors import ModelFormatError
    raise ModelFormatError(f"config.json {key!r} = {v!r} is not valid")

"""LFM2-MoE (LiquidAI/LFM2-8B-A1B; HF Lfm2MoeForCausalLM, model_type `lfm2_moe`; llama.cpp `lfm2moe`): LFM2's
gated short-convolution and attention layers (lfm2.py) with the MLP of every layer past the first
`num_dense_layers` a mixture of experts.

Dense layers: w2(silu(w1(f)) * w3(f)) of `intermediate_size` as it is (no block_auto_adjust_ff_dim here, unlike
LFM2). MoE layers: s = sigmoid(router(f)); the k = `num_experts_per_tok` experts chosen by s + `expert_bias`
(use_expert_bias; the bias only ranks) are weighted by their s, renormalised (norm_topk_prob), times
`routed_scaling_factor` (config.MOE_ROUTINGS "sigmoid_topk" with a choice bias); each expert a SiLU MLP of
`moe_intermediate_size`. The Hub stores one tensor per expert (`feed_forward.experts.E.w1|w3|w2`: gate, up,
down), transformers 5 may save them fused (`hf_splitter` reads both); the router is `feed_forward.gate`, the
bias `feed_forward.expert_bias`.

GGUF (`lfm2moe`): lfm2's keys (per-layer head_count_kv, 0 for a conv layer; shortconv.l_cache; the final
norm named token_embd_norm), the expert counts and size, leading_dense_block_count, expert_gating_func 2
(sigmoid, required) and the bias as `exp_probs_b` (required on every MoE layer). llama.cpp's lfm2moe always
renormalises the k weights and never scales them: a file saying otherwise (expert_weights_norm false,
expert_weights_scale other than 1) is refused, and so is exporting such a model. A model without the bias
(use_expert_bias false) is written with a zero bias, which chooses the same experts.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError
from ..formats.experts import expert_matrix
from ..formats.weights import WeightTensor
from . import lfm2
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, gguf_layer_kinds
from .moe import gguf_moe

ARCH = "lfm2moe"
_SIGMOID = 2      # llama.cpp's expert_gating_func value

GGUF_NAMES = lfm2.GGUF_NAMES
HF_GLOBAL_NAMES = lfm2.HF_GLOBAL_NAMES
HF_LAYER_NAMES = {**lfm2.HF_LAYER_NAMES, "feed_forward.gate.weight": "ffn_gate_inp.weight",
                  "feed_forward.expert_bias": "exp_probs_b.bias"}
# one expert's matrix in the Hub layout -> the stacked canonical leaf
_EXPERT = re.compile(r"feed_forward\.experts\.(\d+)\.(w1|w2|w3)\.weight")
_PART = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}
_GATE_UP, _DOWN = "feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj"     # transformers 5's


def config_from_hf(cfg: dict) -> TransformerConfig:
    hf = HFConfig(cfg)
    if hf.flag("conv_bias", False):
        raise ModelFormatError("config.json conv_bias=true is not supported (LFM2's convolutions have no biases)")
    if cfg.get("layer_types") is None:
        raise ModelFormatError("config.json 'layer_types' is missing: LFM2-MoE names each layer's kind there")
    c = hf.common(ARCH)
    n = c["n_layers"]
    c.update(norm_eps=hf.get("norm_eps", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", hf.flag("tie_embedding", True)))
    lead = hf.get("num_dense_layers", 2, int, "n_experts")      # 0..4096, like the layer count
    moe = dict(n_experts=hf.get("num_experts", kind=int, limit="n_experts"),
               n_experts_used=hf.get("num_experts_per_tok", kind=int, limit="n_experts_used"),
               expert_ffn_dim=hf.get("moe_intermediate_size", kind=int, limit="expert_ffn_dim"),
               moe_layers=[i >= lead for i in range(n)], moe_routing="sigmoid_topk",
               moe_choice_bias=hf.flag("use_expert_bias", True), moe_norm_topk=hf.flag("norm_topk_prob", True),
               moe_scale=hf.get("routed_scaling_factor", 1.0, float, "positive"))
    return TransformerConfig(**c, qk_norm=True, layer_kinds=lfm2.layer_kinds(hf, n),
                             conv_kernel=hf.get("conv_L_cache", 3, int, "conv_kernel"), **moe)


def config_from_gguf(meta: dict) -> TransformerConfig:
    meta, kinds = gguf_layer_kinds(meta, ARCH, "shortconv")
    hp = GGUFHParams(meta, ARCH)
    lfm2.refuse_non_lm(hp)
    c = hp.common()
    moe = gguf_moe(hp, norm_default=True)
    if moe:
        gating = hp.int("expert_gating_func")
        if gating != _SIGMOID:
            raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_gating_func' = {gating} is not supported "
                                   "(2: sigmoid, what LFM2-MoE routes by)")
        if not moe["moe_norm_topk"]:
            raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_weights_norm' = false: llama.cpp's lfm2moe always "
                                   "renormalises the chosen experts' weights")
        scale = hp.float("expert_weights_scale", 1.0, "positive")
        if scale != 1.0:
            raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_weights_scale' = {scale}: llama.cpp's lfm2moe "
                                   "does not scale the experts' weights")
        moe.update(moe_routing="sigmoid_topk", moe_choice_bias=True)
    return TransformerConfig(**c, rope_neox=True, qk_norm=True, layer_kinds=kinds or [],
                             conv_kernel=hp.int("shortconv.l_cache", limit="conv_kernel"), **moe)


def hf_splitter(config: TransformerConfig):
    """split(suffix, t, name) -> [(canonical leaf, expert, matrix)] for a layer's expert tensors, None for any other:
    the Hub's one tensor per expert (`feed_forward.experts.E.w1|w3|w2.weight`), or transformers 5's fused ones
    (saved with save_original_format=False: `feed_forward.experts.gate_up_proj` (E, 2I, d), gate rows then up
    rows per expert, and `down_proj` (E, d, I)), as views of the file's rows."""
    n, d, inner = config.n_experts, config.d_model, config.expert_ffn_dim

    def split(suffix: str, t, name: str):
        m = _EXPERT.fullmatch(suffix)
        if m is not None:
            return [(_PART[m.group(2)], int(m.group(1)), t)]
        if suffix not in (_GATE_UP, _DOWN):
            return None
        want = (n, 2 * inner, d) if suffix == _GATE_UP else (n, d, inner)
        if tuple(t.shape) != want:
            raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, not {n} experts' {want[1:]} matrices")
        if suffix == _DOWN:
            return [("ffn_down_exps.weight", e, expert_matrix(t, e)) for e in range(n)]
        halves = [expert_matrix(t, e).split_rows([inner, inner]) for e in range(n)]
        return [(leaf, e, part) for e, parts in enumerate(halves)
                for leaf, part in zip(("ffn_gate_exps.weight", "ffn_up_exps.weight"), parts)]
    return split


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """The exporter's lfm2moe keys beyond the shared ones: the sigmoid gating; what llama.cpp cannot run refused."""
    if not cfg.n_experts:
        return {}
    if not cfg.moe_norm_topk:
        raise ModelFormatError("GGUF 'lfm2moe' always renormalises the experts' weights: a model with "
                               "norm_topk_prob false cannot be written")
    if cfg.moe_scale != 1.0:
        raise ModelFormatError(f"GGUF 'lfm2moe' does not scale the experts' weights: routed_scaling_factor "
                               f"{cfg.moe_scale} cannot be written")
    return {f"{ARCH}.expert_gating_func": _SIGMOID}


def gguf_export_tensors(cfg: TransformerConfig, tensors: dict) -> tuple[dict, dict]:
    """llama.cpp requires `exp_probs_b` on every MoE layer: a model without the bias gets zeros (the same choice)."""
    if not cfg.n_experts or cfg.moe_choice_bias:
        return tensors, {}
    out = dict(tensors)
    for i in range(cfg.n_layers):
        name = f"blk.{i}.exp_probs_b.bias"
        if f"blk.{i}.ffn_gate_inp.weight" in tensors and name not in out:
            out[name] = WeightTensor.from_float(name, np.zeros(cfg.n_experts, np.float32))
    return out, {}

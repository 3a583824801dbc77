"""GLM-4.5, GLM-4.5-Air and GLM-4.6 (HF Glm4MoeForCausalLM; llama.cpp's `glm4moe`): pre-norm attention with
q/k/v biases (attention_bias) and optional per-head q/k RMSNorms (use_qk_norm), RoPE on the first half of
each head in HF's half-split layout (partial_rotary_factor 0.5; llama.cpp's NEOX rope), and MLPs that are
dense for the first `first_k_dense_replace` layers, then mixture-of-experts.

Routing is DeepSeek-V3's noaux_tc (config.MOE_ROUTINGS "sigmoid_topk" with a choice bias): s = sigmoid(router
logits); experts chosen by s + e_score_correction_bias (within the `topk_group` best of `n_group` groups,
each ranked by its two best); their s are the weights, renormalised when `norm_topk_prob`, times
`routed_scaling_factor`; plus `n_shared_experts` always-on experts, one SiLU MLP of n_shared x
moe_intermediate_size, added unscaled.

GGUF (`glm4moe`): the norm before the MLP is named `post_attention_norm` (as HF's post_attention_layernorm);
the shared experts are a count (expert_shared_count); expert_gating_func 2 (sigmoid, llama.cpp's default for
this architecture when absent). llama.cpp has no expert groups for it: its files are one group.

The NextN / multi-token-prediction layers (num_nextn_predict_layers, the released models: one) are not run
and their tensors are skipped knowingly: in HF files the `model.layers.N` past num_hidden_layers
(hf_extra_layers), in GGUF files the blocks past block_count - nextn_predict_layers, whose tensors (the
layer's own and its `nextn.*`) the converter keeps (gguf_extra_layers; block_count counts them).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .glm4 import refuse_mrope
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp
from .qwen3next import partial_rope_dim

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py)
HF_LAYER_NAMES = {
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
}
# canonical -> llama.cpp's name in glm4moe files
GGUF_NAMES = {"ffn_norm.weight": "post_attention_norm.weight"}

# llama.cpp's expert_gating_func values
_SIGMOID = 2


def hf_extra_layers(cfg: dict) -> int:
    """The NextN (multi-token-prediction) layers a checkpoint holds past the decoder's: not run here."""
    return HFConfig(cfg).get("num_nextn_predict_layers", 0, int, "n_experts")   # 0..4096


def gguf_extra_layers(meta: dict) -> int:
    """The NextN blocks at the end of a glm4moe file (counted in its block_count): not run here."""
    return GGUFHParams(meta, "glm4moe").int("nextn_predict_layers", 0, "n_experts")   # 0..4096


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "GLM-4.5")
    hf = HFConfig(cfg)
    c = hf.common("glm4moe")
    c.update(rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.5), norm_eps=hf.get("rms_norm_eps", 1e-5, float, "norm_eps"))
    E = hf.get("n_routed_experts", kind=int, limit="n_experts")
    ffe = hf.get("moe_intermediate_size", kind=int, limit="expert_ffn_dim")
    lead = hf.get("first_k_dense_replace", 1, int, "n_layers")
    groups = hf.get("n_group", 1, int, "moe_groups")
    moe = dict(n_experts=E, n_experts_used=hf.get("num_experts_per_tok", kind=int, limit="n_experts_used"),
               expert_ffn_dim=ffe,
               shared_ffn_dim=HFConfig.check("config.json n_shared_experts * moe_intermediate_size",
                                             hf.get("n_shared_experts", 1, int, "n_experts") * ffe, int, "shared_ffn_dim"),
               moe_layers=[i >= lead for i in range(c["n_layers"])], moe_routing="sigmoid_topk", moe_choice_bias=True,
               moe_norm_topk=hf.flag("norm_topk_prob", True), moe_groups=groups,
               moe_groups_used=hf.get("topk_group", groups, int, "moe_groups_used"), moe_group_top=2,
               moe_scale=hf.get("routed_scaling_factor", 1.0, float, "positive"))
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False), qk_norm=hf.flag("use_qk_norm", False),
                             **moe)


def config_from_gguf(meta: dict) -> TransformerConfig:
    refuse_mrope(meta, "glm4moe")
    hp = GGUFHParams(meta, "glm4moe")
    c = hp.common()
    nextn = gguf_extra_layers(meta)
    if nextn >= c["n_layers"]:
        raise ModelFormatError(f"GGUF metadata 'glm4moe.nextn_predict_layers' = {nextn} leaves none of the "
                               f"{c['n_layers']} blocks to the decoder")
    c["n_layers"] -= nextn
    gating = hp.int("expert_gating_func", _SIGMOID)
    if gating != _SIGMOID:
        raise ModelFormatError(f"GGUF metadata 'glm4moe.expert_gating_func' = {gating} is not supported (2: sigmoid)")
    ffe = hp.int("expert_feed_forward_length", limit="expert_ffn_dim")
    lead = hp.int("leading_dense_block_count", 0, "n_layers")
    moe = dict(n_experts=hp.int("expert_count", limit="n_experts"),
               n_experts_used=hp.int("expert_used_count", limit="n_experts_used"), expert_ffn_dim=ffe,
               shared_ffn_dim=HFConfig.check("GGUF metadata 'glm4moe.expert_shared_count' times the experts' size",
                                             hp.int("expert_shared_count", limit="n_experts") * ffe, int,
                                             "shared_ffn_dim"),
               moe_layers=[i >= lead for i in range(c["n_layers"])], moe_routing="sigmoid_topk", moe_choice_bias=True,
               moe_norm_topk=hp.flag("expert_weights_norm", False), moe_group_top=2,
               moe_scale=hp.float("expert_weights_scale", limit="positive"))
    # q/k norms and q/k/v biases wherever the file holds them (no key says so): formats/gguf_model.py's
    # biases_from_tensors sets attn_bias, and qk_norm through gguf_flags
    return TransformerConfig(**c, rope_neox=True, **moe)


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """Settings a glm4moe file says by its tensors only: q/k norms (GLM-4.5's use_qk_norm)."""
    if any(n.endswith("attn_q_norm.weight") for n in names):
        cfg.qk_norm = True


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's glm4moe keys beyond the shared MoE ones (tools/export.py): the shared experts as a count,
    the weights' scale, the sigmoid gating; the routing's groups cannot be said."""
    a = "glm4moe"
    if cfg.moe_groups > 1:
        raise ModelFormatError("GGUF 'glm4moe' has no expert groups: a model routing within groups cannot be written")
    if cfg.shared_ffn_dim % cfg.expert_ffn_dim:
        raise ModelFormatError(f"GGUF 'glm4moe' counts shared experts: a shared expert of {cfg.shared_ffn_dim} is not "
                               f"a multiple of the experts' {cfg.expert_ffn_dim}")
    return {f"{a}.expert_shared_count": cfg.shared_ffn_dim // cfg.expert_ffn_dim,
            f"{a}.expert_weights_scale": float(cfg.moe_scale), f"{a}.expert_gating_func": _SIGMOID}

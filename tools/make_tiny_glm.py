"""Tiny random GLM-4 (GLM-4-0414 / GLM-Z1) and GLM-4.5 (GLM-4.5-Air / GLM-4.6) models with transformers
reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this
reuses; see tests/fixtures/reference/tiny/README_glm.md for the exact math).

    python tools/make_tiny_glm.py [--out tests/fixtures/reference/tiny] [glm4 glm4_moe]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny
from make_tiny_deepseek import correction_bias

GLM4_NOTES = [
    "Every layer (sandwich norms): h = x + post_self_attn_layernorm(attn(input_layernorm(x))); out = h + "
    "post_mlp_layernorm(mlp(post_attention_layernorm(h))). post_attention_layernorm is the norm BEFORE the MLP "
    "(llama.cpp: ffn_norm); post_self_attn_layernorm is llama.cpp's post_attention_norm, post_mlp_layernorm its "
    "post_ffw_norm. Every RMSNorm is plain x / sqrt(mean(x^2) + 1e-5) * w.",
    "MLP: gate_up_proj (256 rows) = [gate (128), up (128)]; down_proj(silu(gate) * up).",
    "Attention: q/k/v biases (attention_bias), none on o_proj; 4 heads of 16, 2 kv heads; scale 16^-0.5.",
    "RoPE (partial_rotary_factor 0.5): only the first 8 dims of each head rotate, in ADJACENT pairs (2i, 2i + 1) "
    "with inv_freq[i] = 10000^(-2i/8) (transformers' Glm4 rotate_half interleaves; llama.cpp's NORM rope); dims "
    "8..15 pass unrotated.",
    "Untied lm_head.",
]

GLM4_MOE_NOTES = [
    "Every layer (pre-norms only): x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x)) "
    "(llama.cpp names post_attention_layernorm post_attention_norm in glm4moe files). RMSNorms plain w, eps 1e-5.",
    "Attention: 6 heads of 16 (q is 96 wide, hidden 64), 2 kv heads; q/k/v biases (attention_bias), none on "
    "o_proj; use_qk_norm: q_norm / k_norm RMSNorms over each head's 16 dims, before RoPE; scale 16^-0.5.",
    "RoPE (partial_rotary_factor 0.5): the first 8 dims of each head, HALF-SPLIT pairs (i, i + 4) "
    "(rotate_half over the rotary part; llama.cpp's NEOX rope); dims 8..15 pass unrotated.",
    "MLP: layer 0 dense (first_k_dense_replace 1, SiLU, 128 wide); layers 1-2 MoE: 8 routed experts (SiLU "
    "MLPs of 16), top 2, plus shared_experts (n_shared_experts 1: one SiLU MLP of 16) added unscaled.",
    "Routing (as DeepSeek-V3's noaux_tc, one group): s = sigmoid(gate(h)) in float32; the choice ranks s + "
    "mlp.gate.e_score_correction_bias (drawn N(0, 0.1^2) here); n_group = topk_group = 1; the top-2 choices' s "
    "(bias not added) are the weights, divided by their sum + 1e-20 (norm_topk_prob), times "
    "routed_scaling_factor 2.5.",
    "num_nextn_predict_layers 1: transformers builds no MTP layer, so the file holds none (the tests add one).",
    "Untied lm_head.",
]


def glm4_config():
    from transformers import Glm4Config
    return Glm4Config(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def glm4_moe_config():
    from transformers import Glm4MoeConfig
    return Glm4MoeConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
        attention_bias=True, use_qk_norm=True, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
        routed_scaling_factor=2.5, n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
        num_nextn_predict_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


SPECS = {
    "glm4": {"class": "Glm4ForCausalLM", "config": glm4_config, "seed": 409, "notes": GLM4_NOTES,
             "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    "glm4_moe": {"class": "Glm4MoeForCausalLM", "config": glm4_moe_config, "seed": 413, "notes": GLM4_MOE_NOTES,
                 "post": correction_bias, "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

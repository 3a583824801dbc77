"""Tiny random DeepSeek-V2 and -V3 models (multi-head latent attention, MoE with shared experts) with
transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py,
whose generator this reuses; see tests/fixtures/reference/tiny/README_deepseek.md for the exact math).

    python tools/make_tiny_deepseek.py [--out tests/fixtures/reference/tiny] [deepseek_v2 deepseek_v3]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny

MLA_NOTES = [
    "Multi-head latent attention, 4 heads: kv_a_proj_with_mqa(h) (40 rows) = [c: 32 (kv_lora_rank), k_pe: 8 "
    "(qk_rope_head_dim)]; c = kv_a_layernorm(c) (RMSNorm, eps 1e-6); kv_b_proj(c) (112 rows) per head h: rows "
    "[28h, 28h + 16) k_nope, [28h + 16, 28h + 28) v (v_head_dim 12); k_pe is one head shared by all 4.",
    "RoPE on q_pe and k_pe only (8 dims), in ADJACENT pairs (2i, 2i + 1) (transformers' complex rotation / "
    "rope_interleave; llama.cpp's NORM rope); the query per head is [q_nope (16), q_pe (8)] (q_proj rows 24h .. "
    "24h + 24), the key [k_nope, k_pe]; scores q_nope.k_nope + q_pe.k_pe times the softmax scale; the output "
    "(4 heads x 12) through o_proj.",
    "MLP: layer 0 dense (first_k_dense_replace 1, intermediate 128); layers 1-2 MoE: 8 experts (SiLU MLPs of 32, "
    "saved in the Hub layout, one tensor per expert) in 4 groups of 2, top-2 within the best 2 groups, plus "
    "mlp.shared_experts (n_shared_experts 1: one SiLU MLP of 32) added unscaled. Untied lm_head.",
]

V2_NOTES = MLA_NOTES + [
    "No q_lora_rank (q_proj straight from h, as DeepSeek-V2-Lite).",
    "YaRN: rope_theta 10000, factor 4, original_max_position_embeddings 64, beta_fast 32, beta_slow 1, mscale = "
    "mscale_all_dim = 0.707: inv_freq ramps between dims floor/ceil of the correction range over the 8 rope dims; "
    "cos/sin are multiplied by mscale(4, 0.707) / mscale(4, 0.707) = 1; the softmax scale is 24^-0.5 * "
    "(0.1 * 0.707 * ln 4 + 1)^2 (mscale(f, m) = 0.1 m ln f + 1).",
    "Routing (V2, topk_method group_limited_greedy): p = softmax(router logits) over the 8 experts; a group's "
    "score is its best p; the 2 best groups' experts are kept (others masked to 0); the top-2 p among them are "
    "the weights, NOT renormalised (transformers ignores norm_topk_prob for V2; it is false here), times "
    "routed_scaling_factor 2.",
]

V3_NOTES = MLA_NOTES + [
    "q_lora_rank 24: q = q_b_proj(q_a_layernorm(q_a_proj(h))) (RMSNorm, eps 1e-6).",
    "No RoPE scaling (rope_theta 50000): softmax scale 24^-0.5.",
    "Routing (V3, noaux_tc): s = sigmoid(router logits); the choice ranks s + mlp.gate.e_score_correction_bias "
    "(drawn N(0, 0.1^2) here); a group's score is the sum of its 2 best choice values; the 2 best groups' experts "
    "are kept (others -inf); the top-2 choices' s (bias not added) are the weights, renormalised (norm_topk_prob: "
    "divided by their sum + 1e-20), times routed_scaling_factor 2.5.",
]


def v2_config():
    from transformers import DeepseekV2Config
    return DeepseekV2Config(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        routed_scaling_factor=2.0, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=12, topk_method="group_limited_greedy", n_group=4, topk_group=2, num_experts_per_tok=2,
        first_k_dense_replace=1, norm_topk_prob=False, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 0.707, "mscale_all_dim": 0.707},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def v3_config():
    from transformers import DeepseekV3Config
    return DeepseekV3Config(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
        routed_scaling_factor=2.5, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=12, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def correction_bias(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            with torch.no_grad():
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


SPECS = {
    "deepseek_v2": {"class": "DeepseekV2ForCausalLM", "config": v2_config, "seed": 308, "notes": V2_NOTES,
                    "legacy_rope_keys": {"rope_theta": 10000.0, "rope_scaling": {
                        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                        "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}}},
    "deepseek_v3": {"class": "DeepseekV3ForCausalLM", "config": v3_config, "seed": 311, "notes": V3_NOTES,
                    "post": correction_bias, "legacy_rope_keys": {"rope_theta": 50000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

"""Tiny random Nemotron-H models (Mamba2, attention and MLP-only layers, each one norm and one mixer) with
transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose
generator this reuses; the exact math is in tests/fixtures/reference/tiny/README_nemotron_h.md).

    python tools/make_tiny_nemotron_h.py [--out tests/fixtures/reference/tiny] [nemotron_h nemotron_h_bias]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, layer_norm_epsilon=1e-5, ssm_state_size=16, conv_kernel=4, chunk_size=16,
             use_conv_bias=True, use_bias=False, attention_bias=False, mlp_hidden_act="relu2",
             mamba_hidden_act="silu", bos_token_id=1, eos_token_id=2, pad_token_id=0)

COMMON = [
    "Every layer (NemotronHBlock): x += mixer(norm(x)), norm an RMSNorm x / sqrt(mean(x^2) + 1e-5) * w; the mixer "
    "by hybrid_override_pattern: M a Mamba2 mixer, * attention, - an MLP. norm_f before lm_head.",
    "Attention: 4 heads, 2 kv heads, no biases, NO positional encoding (no RoPE: Nemotron-H's attention is "
    "position-free, the Mamba2 layers carry order); scale head_dim^-0.5; causal.",
    "MLP: down_proj(relu(up_proj(h))^2), no gate (mlp_hidden_act relu2).",
    "Mamba2 mixer: in_proj(h) split into z (H P), xBC (H P + 2 G N), dt (H); xBC through a causal depthwise conv of "
    "width 4 plus its bias, then SiLU; d = softplus(dt + dt_bias); per head the N x P state S = exp(d A) S + d B x^T "
    "(A = -exp(A_log), head h reads group h // (H / G)); y = S^T C + D x; then y * silu(z), RMS-normed in G "
    "groups of H P / G, times mixer.norm.weight; out_proj. time_step_limit (0, inf): no clamp.",
    "Tensors are saved under model. (transformers 5); NVIDIA's checkpoints hold them under backbone.",
]
PLAIN = COMMON + [
    "hybrid_override_pattern MM-*-M*- (8 layers: two Mamba2 in a row, attention twice, MLP-only thrice); head_dim "
    "16; MLP intermediate_size 96; Mamba2 8 heads of 16 (inner 128 = 2 x hidden), 2 groups of d_state 16; untied "
    "lm_head; no MLP biases.",
]
BIASED = COMMON + [
    "hybrid_override_pattern M*-M- (5 layers); head_dim 24 (heads x head_dim 96 != hidden 64); MLP intermediate_size "
    "80 with biases on up_proj and down_proj (mlp_bias true); Mamba2 6 heads of 8 (inner 48, not 2 x hidden), 1 "
    "group of d_state 16; untied lm_head (transformers 5.25 leaves a NemotronH lm_head untied in memory even with tie_word_embeddings true, so no tied folder).",
]


def plain():
    from transformers import NemotronHConfig
    return NemotronHConfig(**SHAPE, hybrid_override_pattern="MM-*-M*-", head_dim=16, intermediate_size=96,
                           mamba_num_heads=8, mamba_head_dim=16, n_groups=2, mlp_bias=False, tie_word_embeddings=False)


def biased():
    from transformers import NemotronHConfig
    return NemotronHConfig(**SHAPE, hybrid_override_pattern="M*-M-", head_dim=24, intermediate_size=80,
                           mamba_num_heads=6, mamba_head_dim=8, n_groups=1, mlp_bias=True, tie_word_embeddings=False)


SPECS = {
    "nemotron_h": {"class": "NemotronHForCausalLM", "config": plain, "seed": 707, "notes": PLAIN,
                   "legacy_rope_keys": {}},
    "nemotron_h_bias": {"class": "NemotronHForCausalLM", "config": biased, "seed": 717, "notes": BIASED,
                        "legacy_rope_keys": {}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

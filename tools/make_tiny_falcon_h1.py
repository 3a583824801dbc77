"""Tiny random Falcon-H1 models (attention and a Mamba2 mixer side by side in every layer, µP multipliers) with
transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose
generator this reuses; the exact math is in tests/fixtures/reference/tiny/README_falcon_h1.md).

    python tools/make_tiny_falcon_h1.py [--out tests/fixtures/reference/tiny] [falcon_h1 falcon_h1_nonorm]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

# every multiplier away from 1, each a different value (a multiplier applied in the wrong place shows)
MULTIPLIERS = dict(embedding_multiplier=1.5, lm_head_multiplier=0.75, attention_in_multiplier=0.8,
                   attention_out_multiplier=0.6, key_multiplier=1.25, ssm_in_multiplier=1.3, ssm_out_multiplier=0.7,
                   ssm_multipliers=[0.5, 1.2, 0.8, 1.1, 0.9], mlp_multipliers=[1.4, 0.6])
SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
             mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16, mamba_proj_bias=False, projectors_bias=False,
             mamba_norm_before_gate=False, attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2,
             pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **MULTIPLIERS)

COMMON = [
    "Every layer (FalconH1DecoderLayer): h = input_layernorm(x); x += ssm_out_multiplier * mamba(h) + "
    "attention_out_multiplier * attn(attention_in_multiplier * h); x += mlp(pre_ff_layernorm(x)). RMSNorms plain "
    "x / sqrt(mean(x^2) + 1e-5) * w; final_layernorm before lm_head.",
    "Embeddings times embedding_multiplier 1.5; logits = lm_head(final_layernorm(x)) * lm_head_multiplier 0.75.",
    "Attention: 4 heads of 16, 2 kv heads, no biases; k = k_proj(.) * key_multiplier 1.25 (before RoPE); scale "
    "16^-0.5; RoPE theta 10000 half-split; the attention input is h * attention_in_multiplier 0.8, its output "
    "(after o_proj) times attention_out_multiplier 0.6.",
    "MLP: down_proj(up_proj(h) * silu(gate_proj(h) * 1.4)) * 0.6 (mlp_multipliers [gate, down]).",
    "Mamba2 mixer: zxbcdt = in_proj(h * ssm_in_multiplier 1.3) * mup_vector, the vector (a buffer computed from "
    "the config, not in the file) scaling z rows by 0.5, x rows by 1.2, B rows by 0.8, C rows by 1.1 and dt rows "
    "by 0.9 (ssm_multipliers). Split z (d_ssm), xBC (d_ssm + 2 G N), dt (H); xBC through a causal depthwise "
    "conv of width 4 and SiLU; d = softplus(dt + dt_bias); per head the N x P state S = exp(d A) S + d B x^T "
    "(A = -exp(A_log), head h reads group h // (H / G)); y = S^T C + D x; then the gate (below); out_proj; times "
    "ssm_out_multiplier 0.7. time_step_limit (0, inf): no clamp.",
    "Untied lm_head unless the folder says otherwise.",
]
NORMED = COMMON + [
    "mamba_d_ssm 96 (not mamba_expand x hidden = 128): 6 heads of 16, 2 groups of d_state 16; conv bias on. "
    "mamba_rms_norm on, mamba_norm_before_gate false: y * silu(z), then RMS-normed in 2 groups of 48, times "
    "mamba.norm.weight (Granite 4's order).",
]
UNNORMED = COMMON + [
    "mamba_d_ssm null: mamba_expand 2 x hidden 64 = 128 inner, 8 heads of 16, 1 group of d_state 16; no conv "
    "bias (mamba_conv_bias false). mamba_rms_norm off: the mixer's output is y * silu(z), no norm.",
    "Tied embeddings: the head is the embedding matrix, times lm_head_multiplier 0.75 (the embeddings' use times "
    "embedding_multiplier 1.5).",
]


def normed():
    from transformers import FalconH1Config
    return FalconH1Config(**SHAPE, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2,
                          mamba_expand=2, mamba_conv_bias=True, mamba_rms_norm=True, tie_word_embeddings=False)


def unnormed():
    from transformers import FalconH1Config
    return FalconH1Config(**SHAPE, mamba_d_ssm=None, mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=1,
                          mamba_expand=2, mamba_conv_bias=False, mamba_rms_norm=False, tie_word_embeddings=True)


SPECS = {
    "falcon_h1": {"class": "FalconH1ForCausalLM", "config": normed, "seed": 606, "notes": NORMED,
                  "legacy_rope_keys": {"rope_theta": 10000.0}},
    "falcon_h1_nonorm": {"class": "FalconH1ForCausalLM", "config": unnormed, "seed": 615, "notes": UNNORMED,
                         "legacy_rope_keys": {"rope_theta": 10000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

"""Writes the tiny `jamba` and `bamba` folders (random weights, transformers' outputs as reference.json) with
tools/make_tiny_hybrid.py's generator, weight scheme and reference inputs; tests/fixtures/reference/tiny/README_jamba.md
has their exact math. Run it with a Python that has torch and transformers, neither of which llambda needs:
`python tools/make_tiny_jamba.py [--out DIR] [jamba bamba]`. Seeded throughout: the same versions write the same
bytes.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

JAMBA = [
    "6 layers: attention at layers 1 and 4 (attn_layer_period 3, offset 1), Jamba's Mamba 1 mixer elsewhere; the "
    "feed-forward a mixture of 4 experts (top 2) at layers 1, 3 and 5 (expert_layer_period 2, offset 1), a dense "
    "SwiGLU MLP elsewhere. Every layer x += mixer(input_layernorm(x)); x += ffn(pre_ff_layernorm(x)); RMSNorms "
    "(eps 1e-6); final_layernorm, then the untied lm_head.",
    "Attention: GQA 4 heads of 16, 2 kv heads, no biases, NO positions (no RoPE), scale 16^-0.5.",
    "Mamba mixer: in_proj(h) rows x (d_inner 128 = 2 x 64), z (128); x through a causal depthwise conv of width 4 "
    "plus its bias, then SiLU; x_proj(x) rows dt_low (mamba_dt_rank 'auto' = ceil(64 / 16) = 4), B (16), C (16); "
    "dt_low, B and C each RMS-normed WITH a weight (dt_layernorm, b_layernorm, c_layernorm; eps rms_norm_eps); "
    "dt = softplus(dt_proj(dt_low) + dt_proj.bias); per channel the state S_c = exp(dt_c A_c) S_c + dt_c x_c B "
    "(A = -exp(A_log), (128, 16)); y_c = S_c . C + D_c x_c; out_proj(y * silu(z)).",
    "MoE: router logits -> softmax over the 4 experts -> the top 2 weights, NOT renormalised; each expert "
    "down(silu(gate(h)) * up(h)) of intermediate_size 96.",
]
BAMBA = [
    "4 layers: attention at layers 1 and 3 (attn_layer_indices), Mamba2 elsewhere; every layer's feed-forward a "
    "dense SwiGLU MLP (intermediate_size 96). Every layer x += mixer(input_layernorm(x)); x += "
    "mlp(pre_ff_layernorm(x)); RMSNorms (eps 1e-5); final_layernorm, then the untied lm_head.",
    "Attention: GQA 4 heads of 16, 2 kv heads, no biases; RoPE (theta 10000) on the first HALF of each head only "
    "(transformers hard-codes partial_rotary_factor 0.5 for Bamba): dims 0..7 rotate in the half-split pairs "
    "(i, i + 4), dims 8..15 pass through.",
    "Mamba2 mixer (Granite 4's): in_proj(h) rows z (128), xBC (128 + 2 G N = 192), dt (H = 8); xBC through a causal "
    "depthwise conv of width 4 plus its bias, then SiLU; 8 heads of 16, G = 2 groups of N = 16; d = softplus(dt + "
    "dt_bias); per head S = exp(d A) S + d B x^T; y = S^T C + D x; y * silu(z) RMS-normed (eps 1e-5) in 2 groups "
    "of 64 times mamba.norm.weight; out_proj. chunk_size 16 (the 40- and 100-token prefills cross chunks); "
    "time_step_limit (0, inf).",
]


def jamba():
    from transformers import JambaConfig
    return JambaConfig(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=4096,
                       num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
                       attn_layer_period=3, attn_layer_offset=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                       mamba_dt_rank="auto", mamba_conv_bias=True, mamba_proj_bias=False, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0)


def bamba():
    from transformers import BambaConfig
    return BambaConfig(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=4096,
                       attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head="auto", mamba_n_groups=2,
                       mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_conv_bias=True,
                       mamba_proj_bias=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def final_norm(model, seed: int) -> None:
    """final_layernorm drawn as the other folders' final norms (2.5 + 0.1 N(0, 1)); the router's rows 3x the
    scheme's (its weights then differ between experts)."""
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    w = model.model.final_layernorm.weight
    with torch.no_grad():
        w.copy_(2.5 + 0.1 * torch.randn(w.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):
                p.mul_(3.0)


SPECS = {
    "jamba": {"class": "JambaForCausalLM", "config": jamba, "seed": 901, "notes": JAMBA, "legacy_rope_keys": {},
              "post": final_norm},
    "bamba": {"class": "BambaForCausalLM", "config": bamba, "seed": 911, "notes": BAMBA,
              "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}, "post": final_norm},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

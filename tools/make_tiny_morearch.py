"""Tiny random OLMoE, Arcee (AFM), Seed-OSS and Apertus models with transformers reference outputs, in the
format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; see
tests/fixtures/reference/tiny/README_morearch.md for the exact math).

    python tools/make_tiny_morearch.py [--out tests/fixtures/reference/tiny] [olmoe arcee seed_oss apertus]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import math

import torch

import make_tiny_hybrid as tiny

OLMOE_NOTES = [
    "Every layer (pre-norms): x += o_proj(attn(input_layernorm(x))); x += moe(post_attention_layernorm(x)). "
    "RMSNorms plain w, eps 1e-5.",
    "Attention: 4 heads of 16, 4 kv heads (llama.cpp's olmoe sizes its k norm by the hidden size, so no GQA); "
    "q_norm and k_norm are RMSNorms over the WHOLE q (64) and k (64) projections, before RoPE (half-split); "
    "no biases; clip_qkv null; scale 16^-0.5.",
    "MoE on every layer: 8 experts (SiLU-gated MLPs of 32), top 2 of a softmax over all 8 router logits; "
    "norm_topk_prob false: the two probabilities are NOT renormalised. No shared expert. Experts as "
    "transformers 5 saves them.",
    "Untied lm_head.",
]

ARCEE_NOTES = [
    "Llama-shaped (pre-norms, no biases, 4 heads of 16, 2 kv heads, scale 16^-0.5), but the MLP has no gate: "
    "down_proj(relu(up_proj(h))^2) (hidden_act relu2), 128 wide.",
    "RoPE YaRN (rope_type yarn, factor 4, original_max_position_embeddings 64, theta 10000, beta_fast 32, "
    "beta_slow 1, truncate default true): inv_freq blends inv/4 and inv over the ramp; cos and sin are "
    "multiplied by 0.1 ln(4) + 1 (attention_scaling), so q.k by its square.",
    "Untied lm_head.",
]

SEED_OSS_NOTES = [
    "Llama-shaped (pre-norms; SiLU-gated MLP 128 wide) with 6 query heads of 16 (q 96 wide over hidden 64), "
    "2 kv heads; q_proj, k_proj and v_proj have biases (attention_bias true), o_proj none "
    "(attention_out_bias false, as the released model; llama.cpp's seed_oss reads no o_proj bias); "
    "scale 16^-0.5; RoPE half-split, theta 10000.",
    "Untied lm_head.",
]

APERTUS_NOTES = [
    "Every layer: x += o_proj(attn(attention_layernorm(x))); x += mlp(feedforward_layernorm(x)).",
    "Attention: 4 heads of 16, 2 kv heads, no biases; q_norm / k_norm RMSNorms over each head's 16 dims, "
    "before RoPE (half-split).",
    "RoPE llama3 scaling: theta 10000, factor 8, low_freq_factor 1, high_freq_factor 4, "
    "original_max_position_embeddings 64.",
    "MLP without gate: down_proj(xielu(up_proj(h))), 128 wide. xIELU per layer from mlp.act_fn's alpha_p, "
    "alpha_n (parameters, stored raw) and beta, eps (buffers): ap = softplus(alpha_p), an = beta + "
    "softplus(alpha_n); y = ap x^2 + beta x for x > 0, else (expm1(min(x, eps)) - x) an + beta x. Here "
    "alpha_p, alpha_n raw = log(expm1(0.8)) (resp. log(expm1(0.3))) + N(0, 0.2^2), beta = 0.5 + N(0, 0.1^2) "
    "per layer, eps -1e-6.",
    "Untied lm_head.",
]


def olmoe_config():
    from transformers import OlmoeConfig
    return OlmoeConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, clip_qkv=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def arcee_config():
    from transformers import ArceeConfig
    return ArceeConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="relu2",
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def seed_oss_config():
    from transformers import SeedOssConfig
    return SeedOssConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, attention_bias=True,
        attention_out_bias=False, attention_dropout=0.0, residual_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def apertus_config():
    from transformers import ApertusConfig
    return ApertusConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="xielu",
        rope_parameters=dict(LLAMA3), tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def hide_activation_parameters(redraw):
    """tools/make_tiny_hybrid.py's redraw without the xIELU scalars (it has no rule for them): they are
    drawn afterwards by xielu_scalars."""
    def wrapped(model, seed):
        every = model.named_parameters
        model.named_parameters = lambda *a, **k: ((n, p) for n, p in every(*a, **k) if ".act_fn." not in n)
        try:
            redraw(model, seed)
        finally:
            del model.named_parameters
    return wrapped


def xielu_scalars(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1000)
    raw_p, raw_n = math.log(math.expm1(0.8)), math.log(math.expm1(0.3))
    with torch.no_grad():
        for layer in model.model.layers:
            act = layer.mlp.act_fn
            act.alpha_p.copy_(raw_p + 0.2 * torch.randn(act.alpha_p.shape, generator=g))
            act.alpha_n.copy_(raw_n + 0.2 * torch.randn(act.alpha_n.shape, generator=g))
            act.beta.copy_(0.5 + 0.1 * torch.randn((), generator=g))
            act.eps.fill_(-1e-6)


def legacy(rope: dict) -> dict:
    """The transformers 4 spelling of `rope` (rope_theta apart, the rest as rope_scaling)."""
    rest = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": rope["rope_theta"], **({"rope_scaling": rest} if rest.get("rope_type") != "default" else {})}


SPECS = {
    "olmoe": {"class": "OlmoeForCausalLM", "config": olmoe_config, "seed": 501, "notes": OLMOE_NOTES,
              "legacy_rope_keys": {"rope_theta": 10000.0}},
    "arcee": {"class": "ArceeForCausalLM", "config": arcee_config, "seed": 511, "notes": ARCEE_NOTES,
              "legacy_rope_keys": legacy({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 64})},
    "seed_oss": {"class": "SeedOssForCausalLM", "config": seed_oss_config, "seed": 521, "notes": SEED_OSS_NOTES,
                 "legacy_rope_keys": {"rope_theta": 10000.0}},
    "apertus": {"class": "ApertusForCausalLM", "config": apertus_config, "seed": 531, "notes": APERTUS_NOTES,
                "post": xielu_scalars, "legacy_rope_keys": legacy(LLAMA3)},
}


if __name__ == "__main__":
    tiny.redraw = hide_activation_parameters(tiny.redraw)
    tiny.main(SPECS, __doc__)

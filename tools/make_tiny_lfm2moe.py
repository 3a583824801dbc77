"""A tiny random LFM2-MoE model (Lfm2MoeForCausalLM, LiquidAI/LFM2-8B-A1B's architecture) with transformers
reference outputs, written by tools/make_tiny_hybrid.py's generator in the format of the other tiny folders;
tests/fixtures/reference/tiny/README_lfm2moe.md has the exact math. Run with a Python that has torch and
transformers (never a runtime dependency of llambda); everything is seeded:

    python tools/make_tiny_lfm2moe.py [--out tests/fixtures/reference/tiny]
"""
import math

import make_tiny_hybrid as tiny

LFM2_MOE_NOTES = [
    "layer_types [conv, full_attention, conv, conv, full_attention]: a gated short convolution unless the type is "
    "full_attention. Every layer: h = x + op(operator_norm(x)); out = h + ffn(ffn_norm(h)). RMSNorms plain w, "
    "eps 1e-5.",
    "Short conv (conv_L_cache 3, no biases) and attention (q_layernorm / k_layernorm per head before RoPE, "
    "out_proj) exactly as LFM2's (README_hybrid.md's lfm2).",
    "FFN: layers 0-1 dense (num_dense_layers 2): w2(silu(w1(f)) * w3(f)), intermediate_size 96 as it is (no "
    "block_auto_adjust_ff_dim in LFM2-MoE). Layers 2-4 MoE: 8 experts, SiLU MLPs of moe_intermediate_size 32.",
    "Routing: s = sigmoid(feed_forward.gate(f)) (float32); the choice ranks s + feed_forward.expert_bias "
    "(use_expert_bias; drawn N(0, 0.3^2) here); the top-2 choices' s (bias not added) are the weights, divided "
    "by their sum + 1e-6 (norm_topk_prob), times routed_scaling_factor 1.0.",
    "model.embedding_norm is the FINAL norm (llama.cpp: token_embd_norm); tied embeddings (no lm_head.weight).",
    "Saved by save_pretrained in the Hub layout: one tensor per expert, feed_forward.experts.E.w1 (gate), "
    "w3 (up), w2 (down).",
]


def lfm2_moe_config():
    from transformers import Lfm2MoeConfig
    return Lfm2MoeConfig(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, conv_bias=False,
        conv_L_cache=3, num_dense_layers=2, num_experts=8, num_experts_per_tok=2, use_expert_bias=True,
        routed_scaling_factor=1.0, norm_topk_prob=True,
        layer_types=["conv", "full_attention", "conv", "conv", "full_attention"],
        bos_token_id=1, eos_token_id=2, pad_token_id=0)


def router_and_bias(model, seed: int) -> None:
    """What the shared scheme leaves: routers drawn 2 / sqrt(hidden) (decisive choices, as the other MoE folders'),
    and each MoE layer's expert_bias (a buffer) N(0, 0.3^2), large enough to change choices."""
    import torch
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("feed_forward.gate.weight"):
                p.copy_(2.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=g))


SPECS = {
    "lfm2_moe": {"class": "Lfm2MoeForCausalLM", "config": lfm2_moe_config, "seed": 610, "notes": LFM2_MOE_NOTES,
                 "post": router_and_bias, "legacy_rope_keys": {"rope_theta": 1000000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

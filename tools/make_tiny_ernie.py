"""Tiny random ERNIE 4.5 models with transformers reference outputs: dense `ernie4_5` (as ERNIE-4.5-0.3B) and
MoE `ernie4_5_moe` (as ERNIE-4.5-21B-A3B). The folders have the format of the other tiny ones; the generator is
tools/make_tiny_hybrid.py's, and tests/fixtures/reference/tiny/README_ernie.md gives the exact math. Run with a
Python that has torch and transformers (neither is a runtime dependency of llambda); it is seeded throughout:

    python tools/make_tiny_ernie.py [--out tests/fixtures/reference/tiny] [ernie4_5 ernie4_5_moe]
"""
from __future__ import annotations

import numpy as np
import torch

import make_tiny_hybrid as tiny

COMMON = [
    "Llama's block: x += o_proj(attn(input_layernorm(x))); x += mlp(post_attention_layernorm(x)); RMSNorms plain "
    "x / sqrt(mean(x^2) + 1e-5) * w; no biases anywhere (use_bias false: it would put biases on q/k/v/o, the "
    "MLPs and lm_head).",
    "Attention: 4 heads of 16, 2 kv heads; softmax scale 16^-0.5.",
    "RoPE on all 16 dims of each head in ADJACENT pairs (2i, 2i + 1), inv_freq[i] = 500000^(-2i/16): "
    "transformers' Ernie4_5 rotate_half takes x[0::2], x[1::2] with cos/sin repeat-interleaved (llama.cpp's NORM "
    "rope; its converter keeps HF's rows). The hybrid generator's note on the half-split layout does not apply.",
]

DENSE_NOTES = COMMON + [
    "3 layers, SiLU-gated MLP 128 wide; tied embeddings (no lm_head.weight), as ERNIE-4.5-0.3B.",
]

MOE_NOTES = COMMON + [
    "4 layers: layer 0 dense (moe_layer_start_index 1, SiLU MLP 128 wide); layers 1-3 MoE (moe_layer_interval 1, "
    "moe_layer_end_index -1: the last layer): 8 routed experts (SiLU MLPs of 16, saved in the Hub layout, one "
    "tensor per expert), top 2 (moe_k), plus shared_experts (moe_num_shared_experts 2: one SiLU MLP of 2 x 16 = "
    "32) added unscaled.",
    "Routing: p = softmax(gate(h)) over all 8 experts in float32; the choice ranks p + "
    "mlp.moe_statics.e_score_correction_bias (shape (1, 8), drawn N(0, 0.03^2) here: it changes the choice of "
    "some tokens); the 2 chosen experts' p (bias not added) are the weights, divided by max(their sum, "
    "moe_norm_min 1e-12).",
    "Untied lm_head (no bias).",
]


# what both configs share: 4 heads of 16 over hidden 64, 2 kv heads, no biases, RoPE theta 500000
SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, head_dim=16,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, use_bias=False,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, bos_token_id=1, eos_token_id=2,
             pad_token_id=0)


def dense_config():
    from transformers import Ernie4_5Config
    return Ernie4_5Config(**SHAPE, num_hidden_layers=3, tie_word_embeddings=True)


def moe_config():
    from transformers import Ernie4_5_MoeConfig
    moe = dict(moe_intermediate_size=16, moe_k=2, moe_num_experts=8, moe_num_shared_experts=2, moe_norm_min=1e-12,
               moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1)
    return Ernie4_5_MoeConfig(**SHAPE, **moe, num_hidden_layers=4, tie_word_embeddings=False)


def statics(model, seed: int) -> None:
    """The router's choice bias (a parameter the generic scheme drew as a matrix): small enough that most
    choices stand, large enough that some change (counted and printed over the reference inputs)."""
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            with torch.no_grad():
                p.copy_(0.03 * torch.randn(p.shape, generator=g))
    changed = total = 0
    hooks = []

    def count(module, args, out):
        nonlocal changed, total
        h = args[0].reshape(-1, args[0].shape[-1]).float()
        probs = torch.softmax(h @ module.weight.float().T, dim=-1)
        plain = torch.topk(probs, module.top_k, dim=-1).indices.sort(-1).values
        biased = torch.topk(module.moe_statics(probs), module.top_k, dim=-1).indices.sort(-1).values
        changed += int((plain != biased).any(-1).sum())
        total += len(h)
    for m in model.modules():
        if type(m).__name__.endswith("TopKRouter"):
            hooks.append(m.register_forward_hook(count))
    rng = np.random.default_rng(tiny.INPUT_SEED)
    with torch.no_grad():
        for length in tiny.LENGTHS:
            model(torch.tensor([rng.integers(0, tiny.VOCAB, size=length).tolist()]))
    for h in hooks:
        h.remove()
    print(f"correction bias changes the choice of {changed} of {total} token-layer routings")
    if not 0 < changed < total:
        raise SystemExit("the correction bias should change some choices, not none or all")


SPECS = {
    "ernie4_5": {"class": "Ernie4_5ForCausalLM", "config": dense_config, "seed": 451, "notes": DENSE_NOTES,
                 "legacy_rope_keys": {"rope_theta": 500000.0}},
    "ernie4_5_moe": {"class": "Ernie4_5_MoeForCausalLM", "config": moe_config, "seed": 457, "notes": MOE_NOTES,
                     "post": statics, "legacy_rope_keys": {"rope_theta": 500000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

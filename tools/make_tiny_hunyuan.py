"""A tiny random Hunyuan dense model (HF HunYuanDenseV1ForCausalLM) with transformers reference outputs, in the
format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; the exact math is in
tests/fixtures/reference/tiny/README_exahun.md).

    python tools/make_tiny_hunyuan.py [--out tests/fixtures/reference/tiny]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny
from make_tiny_exaone4 import SHAPE

ALPHA = 1000.0
THETA = 10000.0

HUNYUAN_NOTES = [
    "Every layer (pre-norms, as Llama): x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x)). "
    "Every RMSNorm is plain x / sqrt(mean(x^2) + 1e-5) * w.",
    "Attention: 4 heads of 16, 2 kv heads, no biases; RoPE (half-split) FIRST, then query_layernorm / "
    "key_layernorm RMSNorms over each head's 16 dims (after RoPE, unlike Qwen3's); scale 16^-0.5. The q/k norm "
    "weights are drawn 1 + N(0, 0.5^2) (not the scheme's 1 + N(0, 0.1^2)) so that their place matters.",
    f"RoPE: rope_type 'dynamic' with alpha {ALPHA:g} (transformers' ntk_alpha): base = {THETA:g} * "
    f"alpha^(16 / 14), inv_freq[i] = base^(-2i/16); fixed, independent of the sequence length.",
    "MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), 128 wide. Tied embeddings (no lm_head.weight).",
]


def hunyuan_config():
    from transformers import HunYuanDenseV1Config
    return HunYuanDenseV1Config(
        **SHAPE, num_hidden_layers=3, attention_bias=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "dynamic", "rope_theta": THETA, "alpha": ALPHA, "factor": 1.0})


def wide_qk_norms(model, seed: int) -> None:
    """The q/k norm weights redrawn 1 + N(0, 0.5^2): norming after RoPE differs from before it only by them."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("query_layernorm.weight") or name.endswith("key_layernorm.weight"):
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))


SPECS = {
    "hunyuan_dense": {"class": "HunYuanDenseV1ForCausalLM", "config": hunyuan_config, "seed": 608,
                      "notes": HUNYUAN_NOTES, "post": wide_qk_norms,
                      "legacy_rope_keys": {"rope_theta": THETA,
                                           "rope_scaling": {"type": "dynamic", "alpha": ALPHA, "factor": 1.0}}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

"""A tiny random EXAONE 4.0 model (HF Exaone4ForCausalLM) with transformers reference outputs, in the format of
the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; the exact math is in
tests/fixtures/reference/tiny/README_exahun.md).

    python tools/make_tiny_exaone4.py [--out tests/fixtures/reference/tiny]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

WINDOW = 8
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]

EXAONE4_NOTES = [
    "Every layer (no pre-norms; post-norms on each sublayer's output, as OLMo 2): "
    "h = x + post_attention_layernorm(attn(x)); out = h + post_feedforward_layernorm(mlp(h)). "
    "Every RMSNorm is plain x / sqrt(mean(x^2) + 1e-5) * w.",
    f"layer_types {LAYER_TYPES}: sliding layers attend to the last {WINDOW} positions (the query's own included: "
    f"key j is seen by query i when i - {WINDOW} < j <= i); full layers to every earlier position.",
    "Attention: 4 heads of 16, 2 kv heads, no biases; q_norm / k_norm RMSNorms over each head's 16 dims, then "
    "RoPE (theta 10000, half-split) on the SLIDING layers only: the full-attention layer uses no positional "
    "encoding at all (transformers: RoPE when sliding_window is None or the layer slides); scale 16^-0.5.",
    "MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), 128 wide. Untied lm_head.",
]


# the tiny shape both this folder and hunyuan_dense (tools/make_tiny_hunyuan.py) have
SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)


def exaone4_config():
    from transformers import Exaone4Config
    return Exaone4Config(**SHAPE, num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         sliding_window=WINDOW, sliding_window_pattern=4, layer_types=LAYER_TYPES,
                         tie_word_embeddings=False)


SPECS = {
    "exaone4": {"class": "Exaone4ForCausalLM", "config": exaone4_config, "seed": 507, "notes": EXAONE4_NOTES,
                "legacy_rope_keys": {"rope_theta": 10000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

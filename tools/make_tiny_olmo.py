"""Tiny random OLMo 1 models (LayerNorms without parameters) with transformers reference outputs, in the format of
the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; the exact math is in
tests/fixtures/reference/tiny/README_olmo.md).

    python tools/make_tiny_olmo.py [--out tests/fixtures/reference/tiny] [olmo olmo_tied]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny

SHAPE = dict(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             max_position_embeddings=256, hidden_act="silu", attention_bias=False, clip_qkv=None,
             bos_token_id=1, eos_token_id=2, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

COMMON = [
    "Every layer (OlmoDecoderLayer): x += o_proj(attn(ln(x))); x += down(silu(gate(ln(x))) * up(ln(x))); ln is "
    "OlmoLayerNorm: (x - mean) / sqrt(var + 1e-5), NO weight and NO bias (eps fixed at 1e-5); the same before lm_head.",
    "Attention: 4 heads of 16, no biases, RoPE theta 10000 half-split; scale 16^-0.5; clip_qkv null (no clamp).",
]
PLAIN = COMMON + ["num_key_value_heads 2 (GQA); 3 layers; untied lm_head."]
TIED = COMMON + ["num_key_value_heads 4 (MHA); 2 layers; tied embeddings (no lm_head.weight in the file)."]


def plain():
    from transformers import OlmoConfig
    return OlmoConfig(**SHAPE, num_hidden_layers=3, num_key_value_heads=2, tie_word_embeddings=False)


def tied():
    from transformers import OlmoConfig
    return OlmoConfig(**SHAPE, num_hidden_layers=2, num_key_value_heads=4, tie_word_embeddings=True)


def spec(config, seed: int, notes: list) -> dict:
    return {"class": "OlmoForCausalLM", "config": config, "seed": seed, "notes": notes,
            "legacy_rope_keys": {"rope_theta": 10000.0}}


SPECS = {"olmo": spec(plain, 808, PLAIN), "olmo_tied": spec(tied, 818, TIED)}

if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

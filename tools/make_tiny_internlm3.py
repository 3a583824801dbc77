"""A tiny random InternLM3 model (transformers runs it as LlamaForCausalLM; Dynamic NTK RoPE) with transformers
reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this
reuses; the exact math is in tests/fixtures/reference/tiny/README_internlm3.md).

    python tools/make_tiny_internlm3.py [--out tests/fixtures/reference/tiny]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import make_tiny_hybrid as tiny


def config():
    from transformers import InternLM3Config
    return InternLM3Config(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=256,
                           rms_norm_eps=1e-5, qkv_bias=False, bias=False, tie_word_embeddings=False,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0,
                           rope_parameters={"rope_type": "dynamic", "factor": 6.0, "rope_theta": 50000.0})


NOTES = [
    "InternLM3Config run by LlamaForCausalLM (transformers' auto mapping): RMSNorm eps 1e-5, 4 heads of head_dim 24 "
    "(4 x 24 = 96 != hidden 64), 2 kv heads, SiLU-gated MLP 128 wide, no biases (qkv_bias / bias false), 3 layers, "
    "untied lm_head.",
    "rope_parameters: dynamic, factor 6, theta 50000, max_position_embeddings 256: every reference position (< 100) "
    "is within 256, where Dynamic NTK RoPE is plain RoPE (half-split, theta 50000).",
]


SPECS = {"internlm3": {"class": "LlamaForCausalLM", "config": config, "seed": 909, "notes": NOTES,
                       "legacy_rope_keys": {"rope_theta": 50000.0, "rope_scaling": {"rope_type": "dynamic",
                                                                                      "factor": 6.0}}}}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

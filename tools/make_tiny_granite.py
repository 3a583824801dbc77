"""Tiny random Granite MoE (3.x) and Granite 4 hybrid models with transformers reference outputs, in the
format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; the exact math
is in tests/fixtures/reference/tiny/README_hybrid.md).

    python tools/make_tiny_granite.py [--out tests/fixtures/reference/tiny] [granitemoe ...]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny

# what every Granite folder shares: the tiny shape and the granite folder's multipliers
SHAPE = {"vocab_size": tiny.VOCAB, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
         "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0625,
         "logits_scaling": 2.0, "tie_word_embeddings": False}
ROPE = {"rope_type": "default", "rope_theta": 10000.0}

MULTIPLIERS = ("Granite's multipliers as in the granite folder: embeddings x12, every sublayer output x0.22 before "
               "its residual add, attention scores x0.0625 (instead of head_dim^-0.5), logits / 2. Untied lm_head.")
MOE = ("MoE: 4 experts of intermediate_size 32, top-2 by router logit, then a softmax over those 2 logits "
       "(the TopKRouter); an expert's gate_up rows (E, 64, 64) are gate rows [0:32] then up rows [32:64]; "
       "out = sum_k w_k down_k(silu(gate_k h) * up_k h).")


def granitemoe():
    from transformers import GraniteMoeConfig
    return GraniteMoeConfig(**SHAPE, intermediate_size=32, num_hidden_layers=2, rope_parameters=ROPE,
                            num_local_experts=4, num_experts_per_tok=2)


def routers_doubled(model, seed: int) -> None:
    """The routers' logits twice the scheme's (tools/make_tiny_hybrid.py doubles `mlp.gate`, the others' name)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.weight") or name.endswith("router.layer.weight"):
                p.mul_(2.0)


GRANITE = {
    "granitemoe": {"class": "GraniteMoeForCausalLM", "config": granitemoe, "seed": 304, "post": routers_doubled,
                   "notes": [MULTIPLIERS, MOE + " Both layers; no shared MLP (GraniteMoeForCausalLM)."],
                   "legacy_rope_keys": {"rope_theta": 10000.0}},
}

if __name__ == "__main__":
    tiny.main(GRANITE, __doc__)

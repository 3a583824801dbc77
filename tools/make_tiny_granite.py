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


def moe_note(i: int) -> str:
    return (f"MoE: 4 experts of intermediate_size {i}, top-2 by router logit, then a softmax over those 2 logits "
            f"(the TopKRouter); an expert's gate_up rows (E, {2 * i}, 64) are gate rows [0:{i}] then up rows "
            f"[{i}:{2 * i}]; out = sum_k w_k down_k(silu(gate_k h) * up_k h).")


def granitemoe():
    from transformers import GraniteMoeConfig
    return GraniteMoeConfig(**SHAPE, intermediate_size=32, num_hidden_layers=2, rope_parameters=ROPE,
                            num_local_experts=4, num_experts_per_tok=2)


MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_d_state=16, mamba_d_conv=4, mamba_conv_bias=True,
             mamba_proj_bias=False, mamba_chunk_size=16)
HYBRID_LAYERS = ["mamba", "attention", "mamba", "mamba"]
MAMBA_NOTES = (
    "layer_types [mamba, attention, mamba, mamba]. A Mamba2 layer: in_proj (328 rows) = z [0:128], xBC [128:320], "
    "dt [320:328]; xBC through a causal depthwise conv of width 4 WITH a bias, then SiLU; x = [0:128] (8 heads "
    "of 16), B = [128:160], C = [160:192] (G groups of 16 each; head h reads group h // (8 / G)); "
    "d = softplus(dt + dt_bias); per head the 16 x 16 state S (zero at position 0) becomes "
    "exp(d * -exp(A_log)) S + d B x^T; y = C . S + D x; out_proj(rmsnorm_groups(y * silu(z)) * norm.weight), the "
    "RMSNorm (eps 1e-6) over each of G groups of 128 / G channels. mamba_chunk_size 16: transformers' prefill "
    "of 40 and 100 tokens runs the chunked (SSD) form of the recurrence, the cached decode its step form.")


def hybrid_moe():
    from transformers import GraniteMoeHybridConfig
    return GraniteMoeHybridConfig(**SHAPE, **MAMBA, num_hidden_layers=4, layer_types=HYBRID_LAYERS, mamba_n_groups=1,
                                  intermediate_size=16, shared_intermediate_size=32, num_local_experts=4,
                                  num_experts_per_tok=2, position_embedding_type="rope", rope_parameters=ROPE)


def hybrid_dense():
    from transformers import GraniteMoeHybridConfig
    return GraniteMoeHybridConfig(**SHAPE, **MAMBA, num_hidden_layers=4, layer_types=HYBRID_LAYERS, mamba_n_groups=2,
                                  intermediate_size=32, shared_intermediate_size=96, num_local_experts=0,
                                  num_experts_per_tok=0, position_embedding_type="nope", rope_parameters=ROPE)


def routers_doubled(model, seed: int) -> None:
    """The routers' logits twice the scheme's (tools/make_tiny_hybrid.py doubles `mlp.gate`, the others' name)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.weight") or name.endswith("router.layer.weight"):
                p.mul_(2.0)


GRANITE = {
    "granitemoe": {"class": "GraniteMoeForCausalLM", "config": granitemoe, "seed": 304, "post": routers_doubled,
                   "notes": [MULTIPLIERS, moe_note(32) + " Both layers; no shared MLP (GraniteMoeForCausalLM)."],
                   "legacy_rope_keys": {"rope_theta": 10000.0}},
    "granitemoehybrid": {"class": "GraniteMoeHybridForCausalLM", "config": hybrid_moe, "seed": 407,
                         "post": routers_doubled, "legacy_rope_keys": {"rope_theta": 10000.0},
                         "notes": [MULTIPLIERS, MAMBA_NOTES + " Here G = 1.",
                                   "Attention (layer 1) with RoPE (position_embedding_type rope, theta 1e4, "
                                   "half-split pairs).", moe_note(16) + " Every layer, plus shared_mlp (SiLU MLP of 32: input_linear rows [0:32] gate, "
                                   "[32:64] up) added unscaled."]},
    "granitemoehybrid_dense": {"class": "GraniteMoeHybridForCausalLM", "config": hybrid_dense, "seed": 403,
                               "legacy_rope_keys": {"rope_theta": 10000.0},
                               "notes": [MULTIPLIERS, MAMBA_NOTES + " Here G = 2 (heads 0-3 read group 0).",
                                         "Attention (layer 1) WITHOUT RoPE (position_embedding_type nope).",
                                         "num_local_experts 0: every MLP is shared_mlp alone (SiLU, 96 wide: "
                                         "input_linear rows [0:96] gate, [96:192] up)."]},
}

if __name__ == "__main__":
    tiny.main(GRANITE, __doc__)

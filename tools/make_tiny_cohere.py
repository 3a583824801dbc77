"""Tiny random Cohere Command-R / Aya (`cohere`), Command R7B / Command A (`cohere2`) and StarCoder2 (`starcoder2`)
models with transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py,
whose generator this reuses; see tests/fixtures/reference/tiny/README_cohere.md for the exact math).

    python tools/make_tiny_cohere.py [--out tests/fixtures/reference/tiny] [cohere cohere2 starcoder2]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny

COHERE_NOTES = [
    "Every layer (parallel block): h = input_layernorm(x); x = x + o_proj(attn(h)) + mlp(h) (one norm, no "
    "post_attention_layernorm). Every CohereLayerNorm is (x - mean(x)) / sqrt(var(x) + 1e-5) * w, no bias.",
    "Attention: 4 heads of 16, 2 kv heads, no biases; use_qk_norm: q_norm / k_norm are such LayerNorms over each "
    "head's 16 dims with a weight PER HEAD (shape (heads, 16)), before RoPE; scale 16^-0.5.",
    "RoPE in ADJACENT pairs (2i, 2i + 1): transformers' Cohere rotate_half takes x[0::2], x[1::2] and "
    "repeat-interleaves cos/sin (llama.cpp's NORM rope on HF's rows as they are).",
    "MLP: down_proj(silu(gate_proj(h)) * up_proj(h)).",
    "Head: tied lm_head; logits = lm_head(norm(x)) * logit_scale (2.0: multiplied, not divided).",
]

COHERE2_NOTES = [
    "The Cohere block (parallel attention and MLP on one LayerNorm without bias, eps 1e-5), no q/k norms.",
    "layer_types from sliding_window_pattern 4: layers 0-2 sliding_attention (window 16: key j visible from "
    "query i when i - 16 < j <= i) WITH RoPE (adjacent pairs); layer 3 full_attention WITHOUT RoPE (NoPE).",
    "4 heads of 16 (head_dim is hidden / heads), 2 kv heads, no biases; scale 16^-0.5.",
    "Head: tied lm_head; logits = lm_head(norm(x)) * logit_scale (0.5).",
]

STARCODER2_NOTES = [
    "Every layer (sequential pre-norm): x += o_proj(attn(input_layernorm(x))); x += c_proj(gelu_tanh(c_fc("
    "post_attention_layernorm(x)))). nn.LayerNorm WITH bias (eps 1e-5), the final norm too; biases drawn "
    "N(0, 0.1^2) for the norms, N(0, 0.2^2) for the projections.",
    "Attention: 4 heads of 16, 2 kv heads; biases on q/k/v AND o_proj (use_bias); sliding window 16 on every "
    "layer; RoPE half-split (rotate_half, pairs i, i + 8), theta 100000; scale 16^-0.5.",
    "MLP without a gate: c_fc (128 rows, bias) -> gelu_pytorch_tanh -> c_proj (bias).",
    "Untied lm_head (no bias).",
]


# every folder: hidden 64, MLP 128, 4 heads of 16 over 2 kv heads, eps 1e-5, ids 1/2/0 for bos/eos/pad
SHARED = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def config(cls: str, theta: float, **own):
    """A transformers config class (by name) from SHARED, the vocabulary, RoPE theta and its own fields."""
    import transformers
    return getattr(transformers, cls)(vocab_size=tiny.VOCAB, rope_parameters={"rope_type": "default", "rope_theta": theta},
                                      **SHARED, **own)


def cohere_config():
    return config("CohereConfig", 10000.0, num_hidden_layers=3, layer_norm_eps=1e-5, use_qk_norm=True,
                  logit_scale=2.0, tie_word_embeddings=True)


def cohere2_config():
    return config("Cohere2Config", 50000.0, num_hidden_layers=4, layer_norm_eps=1e-5, logit_scale=0.5,
                  sliding_window=16, sliding_window_pattern=4, tie_word_embeddings=True)


def starcoder2_config():
    return config("Starcoder2Config", 100000.0, num_hidden_layers=3, norm_epsilon=1e-5, use_bias=True,
                  sliding_window=16, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False)


def layernorm_biases(model, seed: int) -> None:
    """The scheme draws every `*layernorm*` tensor around 1 (a weight's rule): LayerNorm biases N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name and name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


SPECS = {
    "cohere": {"class": "CohereForCausalLM", "config": cohere_config, "seed": 601, "notes": COHERE_NOTES,
               "legacy_rope_keys": {"rope_theta": 10000.0}},
    "cohere2": {"class": "Cohere2ForCausalLM", "config": cohere2_config, "seed": 614, "notes": COHERE2_NOTES,
                "legacy_rope_keys": {"rope_theta": 50000.0}},
    "starcoder2": {"class": "Starcoder2ForCausalLM", "config": starcoder2_config, "seed": 627,
                   "notes": STARCODER2_NOTES, "post": layernorm_biases, "legacy_rope_keys": {"rope_theta": 100000.0}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

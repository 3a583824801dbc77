"""Tiny random GPT-2 (`gpt2`, `gpt2_scaled`), GPT-BigCode / StarCoder 1 (`gpt_bigcode` multi-query, `gpt_bigcode_mha`) and Falcon
(`falcon` 7B-style, `falcon_new` 40B-style new_decoder_architecture with two norms, `falcon2` with one) models with
transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py's generator;
tests/fixtures/reference/tiny/README_legacy.md has the math).

    python tools/make_tiny_legacy.py [--out tests/fixtures/reference/tiny] [gpt2 falcon ...]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded. These checkpoints name
their tensors their own way (ln_1, c_attn, wpe, query_key_value, ln_attn ...), so the weights are drawn by this
file's scheme (legacy_redraw), not make_tiny_hybrid's.
"""
from __future__ import annotations

import math

import torch

import make_tiny_hybrid as tiny

GPT2_NOTES = [
    "x = wte[ids] + wpe[positions] (learned absolute positions, 256 rows: n_positions); no RoPE anywhere.",
    "Every layer (sequential): x += c_proj(attn(ln_1(x))); x += mlp.c_proj(gelu_new(mlp.c_fc(ln_2(x)))). nn.LayerNorm "
    "WITH bias, eps 1e-5, the final ln_f too. Every projection has a bias.",
    "c_attn, c_proj, c_fc, mlp.c_proj are Conv1D: weight stored (in, out), y = x @ W + b. c_attn's 192 output columns "
    "are q (64), k (64), v (64); 4 heads of 16, scale 16^-0.5.",
    "gelu_new is GELU's tanh approximation. Tied lm_head (the embedding wte), no head bias.",
]
GPT2_SCALED_NOTES = [
    "As gpt2 (learned positions, Conv1D weights, LayerNorms with bias, gelu_new) but scale_attn_by_inverse_layer_idx: "
    "layer i's attention scores are q.k * 16^-0.5 / (i + 1); reorder_and_upcast_attn (float32 scores: no change in "
    "a float32 run).",
    "n_inner null: the MLP is 4 * 64 = 256 wide. Untied lm_head (no bias).",
]
BIGCODE_NOTES = [
    "x = wte[ids] + wpe[positions] (256 rows); no RoPE. Sequential pre-LayerNorm blocks (ln_1, ln_2, ln_f, with bias, "
    "eps 1e-5), every projection nn.Linear (weight (out, in)) with a bias.",
    "multi_query: c_attn's 96 output rows are q (64: 4 heads of 16), then ONE key head (16), then ONE value head "
    "(16), shared by every query head; scale 16^-0.5.",
    "MLP: c_proj(gelu_pytorch_tanh(c_fc(h))), 128 wide. Untied lm_head (no bias).",
]
BIGCODE_MHA_NOTES = [
    "As gpt_bigcode but multi_query false: c_attn's 192 rows are grouped PER HEAD: head h's rows [48h, 48h + 16) "
    "are q, then 16 of k, then 16 of v (transformers views the output as (heads, 3 * 16)).",
    "x = wte[ids] + wpe[positions]; sequential LayerNorm blocks with biases; gelu_pytorch_tanh MLP; untied lm_head.",
]
FALCON_NOTES = [
    "Falcon-7B's shape: multi_query, parallel_attn, one input_layernorm (LayerNorm WITH bias, eps 1e-5) per layer: "
    "h = input_layernorm(x); x = x + dense(attn(h)) + dense_4h_to_h(gelu(dense_h_to_4h(h))). No linear biases.",
    "query_key_value's 96 rows: q (4 heads of 16), then ONE key head, then ONE value head (multi-query).",
    "RoPE over all 16 dims of each head, half-split pairs (rotate_half), theta 10000; scale 16^-0.5.",
    "gelu is the EXACT erf GELU. Final ln_f (with bias); tied lm_head (word_embeddings).",
]
FALCON_NEW_NOTES = [
    "Falcon-40B's shape (new_decoder_architecture, num_ln_in_parallel_attn 2): x = x + dense(attn(ln_attn(x))) + "
    "dense_4h_to_h(gelu(dense_h_to_4h(ln_mlp(x)))): both LayerNorms (with bias, eps 1e-5) read the same x.",
    "query_key_value is grouped per kv head: 2 groups of (4 / 2) + 2 = 4 rows of 16: group g's rows "
    "[64g, 64g + 32) are q of heads 2g, 2g + 1, then 16 of k head g, then 16 of v head g. No linear biases.",
    "RoPE over all 16 dims (half-split), theta 10000; exact erf GELU; final ln_f; untied lm_head.",
]
FALCON2_NOTES = [
    "Falcon 2 11B's shape (new_decoder_architecture, num_ln_in_parallel_attn 1): h = input_layernorm(x); "
    "x = x + dense(attn(h)) + mlp(h): one LayerNorm (with bias) feeds both.",
    "query_key_value grouped per kv head as in falcon_new (2 kv groups of 2 query heads, then k, then v).",
    "RoPE over all 16 dims (half-split), theta 42; exact erf GELU; final ln_f; untied lm_head.",
]
LEGACY = dict(vocab_size=tiny.VOCAB, bos_token_id=1, eos_token_id=2)


def gpt2_config(**own):
    from transformers import GPT2Config
    return GPT2Config(**LEGACY, n_positions=256, n_embd=64, n_layer=3, n_head=4, activation_function="gelu_new",
                      layer_norm_epsilon=1e-5, **{"n_inner": 128, "tie_word_embeddings": True, **own})


def bigcode_config(multi_query: bool):
    from transformers import GPTBigCodeConfig
    return GPTBigCodeConfig(**LEGACY, n_positions=256, n_embd=64, n_layer=3, n_head=4, n_inner=128,
                            activation_function="gelu_pytorch_tanh", layer_norm_epsilon=1e-5, multi_query=multi_query,
                            tie_word_embeddings=False)


def falcon_config(theta=10000.0, **own):
    from transformers import FalconConfig
    return FalconConfig(**LEGACY, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_hidden_size=128,
                        max_position_embeddings=256, layer_norm_epsilon=1e-5, bias=False, alibi=False,
                        activation="gelu", rope_parameters={"rope_type": "default", "rope_theta": theta}, **own)


def legacy_redraw(model, seed: int) -> None:
    """Every parameter from a seeded generator, in named_parameters() order: embeddings N(0, 1) (0.3 tied: the head
    too), position tables N(0, 0.5^2), LayerNorm weights 1 + N(0, 0.1^2) (the final one 2.5 + ...), biases
    N(0, 0.2^2) (LayerNorms' N(0, 0.1^2)), matrices N(0, 1 / fan_in) (Conv1D's fan-in is its first dim), the fused
    qkv times 1.5 and the output projections times 2."""
    g = torch.Generator().manual_seed(seed)
    tied = model.config.tie_word_embeddings
    for name, p in model.named_parameters():
        leaf = name.split(".")
        norm = any(k.startswith(("ln_", "ln", "input_layernorm", "post_attention_layernorm")) for k in leaf[-2:-1])
        with torch.no_grad():
            if leaf[-2] in ("wte", "word_embeddings"):
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if tied else 1.0))
            elif leaf[-2] == "wpe":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif norm and leaf[-1] == "weight":
                p.copy_((2.5 if leaf[-2] == "ln_f" else 1.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif norm and leaf[-1] == "bias":
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif leaf[-1] == "bias":
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                conv1d = type(dict(model.named_modules())[name.rsplit(".", 1)[0]]).__name__ == "Conv1D"
                fan_in = p.shape[0] if conv1d else p.shape[1]
                w = torch.randn(p.shape, generator=g) / math.sqrt(fan_in)
                if leaf[-2] in ("c_attn", "query_key_value"):
                    w *= 1.5
                if leaf[-2] == "dense" or (leaf[-2] == "c_proj" and leaf[-3] == "attn"):
                    w *= 2.0
                p.copy_(w)
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")


SPECS = {
    "gpt2": {"class": "GPT2LMHeadModel", "config": gpt2_config, "seed": 801, "notes": GPT2_NOTES,
             "base": "transformer", "legacy_rope_keys": {}},
    "gpt2_scaled": {"class": "GPT2LMHeadModel", "seed": 861, "notes": GPT2_SCALED_NOTES, "base": "transformer",
                    "config": lambda: gpt2_config(n_inner=None, tie_word_embeddings=False,
                                                  scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
                    "legacy_rope_keys": {}},
    "gpt_bigcode": {"class": "GPTBigCodeForCausalLM", "config": lambda: bigcode_config(True), "seed": 811,
                    "notes": BIGCODE_NOTES, "base": "transformer", "legacy_rope_keys": {}},
    "gpt_bigcode_mha": {"class": "GPTBigCodeForCausalLM", "config": lambda: bigcode_config(False), "seed": 821,
                        "notes": BIGCODE_MHA_NOTES, "base": "transformer", "legacy_rope_keys": {}},
    "falcon": {"class": "FalconForCausalLM", "seed": 831, "notes": FALCON_NOTES, "base": "transformer",
               "config": lambda: falcon_config(multi_query=True, parallel_attn=True, new_decoder_architecture=False,
                                               tie_word_embeddings=True),
               "legacy_rope_keys": {"rope_theta": 10000.0}},
    "falcon_new": {"class": "FalconForCausalLM", "seed": 841, "notes": FALCON_NEW_NOTES, "base": "transformer",
                   "config": lambda: falcon_config(new_decoder_architecture=True, num_kv_heads=2,
                                                   num_ln_in_parallel_attn=2, tie_word_embeddings=False),
                   "legacy_rope_keys": {"rope_theta": 10000.0}},
    "falcon2": {"class": "FalconForCausalLM", "seed": 851, "notes": FALCON2_NOTES, "base": "transformer",
                "config": lambda: falcon_config(42.0, new_decoder_architecture=True, num_kv_heads=2,
                                                num_ln_in_parallel_attn=1, tie_word_embeddings=False),
                "legacy_rope_keys": {"rope_theta": 42.0}},
}


if __name__ == "__main__":
    tiny.redraw = legacy_redraw       # make() draws every parameter by redraw()
    tiny.main(SPECS, __doc__)

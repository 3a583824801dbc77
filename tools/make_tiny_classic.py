"""Tiny random Gemma 1 (`gemma`), Phi-2 (`phi`), StableLM (`stablelm`, `stablelm_parallel`), GPT-NeoX / Pythia
(`gpt_neox`) and Nemotron (`nemotron`) models with transformers reference outputs, in the format of the other tiny
folders (tools/make_tiny_hybrid.py's generator; tests/fixtures/reference/tiny/README_classic.md has the math).

    python tools/make_tiny_classic.py [--out tests/fixtures/reference/tiny] [gemma phi ...]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny
from make_tiny_cohere import SHARED, layernorm_biases

GEMMA_NOTES = [
    "Every layer: x += o_proj(attn(input_layernorm(x))); x += down_proj(gelu_tanh(gate_proj(h)) * up_proj(h)), "
    "h = post_attention_layernorm(x). Every GemmaRMSNorm computes x / sqrt(mean(x^2) + 1e-6) * (1 + w): the file "
    "stores w (drawn so that 1 + w is 1 + N(0, 0.1^2), the final norm's 2.5 + ...).",
    "Embeddings multiplied by sqrt(64) = 8 before the first layer; tied lm_head (the unscaled embedding).",
    "Attention: 4 heads of head_dim 32 (explicit: 4 * 32 = 128 != hidden 64) over ONE kv head (multi-query), no "
    "biases, scale 32^-0.5; RoPE half-split over all 32 dims, theta 10000.",
]
PHI_NOTES = [
    "Every layer (parallel): h = input_layernorm(x) (nn.LayerNorm WITH bias, eps 1e-5); x = x + dense(attn(h)) + "
    "fc2(gelu_new(fc1(h))) (no second norm). fc1, fc2, q/k/v_proj and dense all have biases.",
    "Attention: 4 heads of 16 over 2 kv heads; RoPE on the first int(16 * 0.4) = 6 dims of each head (half-split "
    "pairs i, i + 3 within them), the other 10 dims untouched; theta 10000; scale 16^-0.5.",
    "Head: final_layernorm (LayerNorm with bias), then lm_head WITH a bias (N(0, 0.2^2)); untied.",
]
STABLELM_NOTES = [
    "Every layer (sequential, StableLM 2 1.6B's shape): x += o_proj(attn(input_layernorm(x))); x += "
    "down_proj(silu(gate_proj(h)) * up_proj(h)), h = post_attention_layernorm(x). nn.LayerNorm WITH bias, "
    "eps 1e-5, the final norm too.",
    "Attention: 4 heads of 16 over 2 kv heads; q/k/v biases (use_qkv_bias), none on o_proj; RoPE on the first "
    "int(16 * 0.25) = 4 dims of each head (pairs i, i + 2), theta 10000; scale 16^-0.5. Untied lm_head.",
]
STABLELM_PARALLEL_NOTES = [
    "Every layer (parallel residual, StableLM 2 12B's shape): h = input_layernorm(x); x = x + o_proj(attn(h)) + "
    "mlp(h) (no post_attention_layernorm); mlp(h) = down_proj(silu(gate_proj(h)) * up_proj(h)). LayerNorms WITH bias.",
    "qk_layernorm: q and k of each head through a LayerNorm over its 16 dims WITHOUT bias and with the head's OWN "
    "weight (self_attn.q_layernorm.norms.{h}.weight, 4 q heads and 2 k heads), before RoPE; no q/k/v biases.",
    "RoPE on the first 4 dims of each head (pairs i, i + 2), theta 10000; scale 16^-0.5. Untied lm_head.",
]
GPT_NEOX_NOTES = [
    "Every layer (use_parallel_residual, Pythia's): x = x + dense(attn(input_layernorm(x))) + "
    "mlp(post_attention_layernorm(x)): both norms read the same x. nn.LayerNorm WITH bias, eps 1e-5.",
    "attention.query_key_value (192 rows, bias) is grouped PER HEAD: head h's rows [48h, 48h + 16) are q, then 16 "
    "of k, then 16 of v. 4 heads of 16 (no GQA); dense (o_proj) has a bias; scale 16^-0.5.",
    "RoPE on the first int(16 * 0.25) = 4 dims of each head (pairs i, i + 2), theta 10000.",
    "MLP without a gate: dense_4h_to_h(gelu(dense_h_to_4h(x))), both with biases; gelu is the EXACT erf GELU.",
    "Head: gpt_neox.final_layer_norm (with bias), then the untied embed_out (no bias). The embedding is "
    "gpt_neox.embed_in.",
]
NEMOTRON_NOTES = [
    "Every layer (sequential): x += o_proj(attn(input_layernorm(x))); x += down_proj(relu(up_proj(h))^2), "
    "h = post_attention_layernorm(x). Every norm is LayerNorm1P: (x - mean) / sqrt(var + 1e-5) * (1 + w) + b; the "
    "file stores w (drawn so that 1 + w is 1 + N(0, 0.1^2), the final norm's 2.5 + ...), biases N(0, 0.1^2).",
    "Attention: 4 heads of head_dim 16 over 2 kv heads, no biases; RoPE on the first int(16 * 0.5) = 8 dims of "
    "each head (pairs i, i + 4), theta 10000; scale 16^-0.5. Untied lm_head.",
]


def config(cls: str, shared=None, **own):
    import transformers
    return getattr(transformers, cls)(vocab_size=tiny.VOCAB, **{**SHARED, **(shared or {})}, **own)


def rope(theta: float = 10000.0, partial: float | None = None) -> dict:
    params = {"rope_type": "default", "rope_theta": theta}
    if partial is not None:
        params["partial_rotary_factor"] = partial
    return {"rope_parameters": params}


def gemma_config():
    return config("GemmaConfig", dict(num_key_value_heads=1), num_hidden_layers=3, head_dim=32,
                  hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True, **rope())


def phi_config():
    return config("PhiConfig", num_hidden_layers=3, hidden_act="gelu_new", layer_norm_eps=1e-5,
                  tie_word_embeddings=False, qk_layernorm=False, **rope(partial=0.4))


def stablelm_config():
    return config("StableLmConfig", num_hidden_layers=3, layer_norm_eps=1e-5, use_qkv_bias=True, qk_layernorm=False,
                  use_parallel_residual=False, tie_word_embeddings=False, **rope(partial=0.25))


def stablelm_parallel_config():
    return config("StableLmConfig", num_hidden_layers=3, layer_norm_eps=1e-5, use_qkv_bias=False, qk_layernorm=True,
                  use_parallel_residual=True, tie_word_embeddings=False, **rope(partial=0.25))


def gpt_neox_config():
    return config("GPTNeoXConfig", dict(num_key_value_heads=None), num_hidden_layers=3, layer_norm_eps=1e-5,
                  hidden_act="gelu", use_parallel_residual=True, attention_bias=True, tie_word_embeddings=False,
                  **rope(partial=0.25))


def nemotron_config():
    return config("NemotronConfig", num_hidden_layers=3, head_dim=16, norm_eps=1e-5, hidden_act="relu2",
                  tie_word_embeddings=False, **rope(partial=0.5))


def stored_minus_one(model, seed: int) -> None:
    """Norms computing (1 + w) (Gemma's RMSNorm, Nemotron's LayerNorm1P): the stored w is the scheme's draw - 1, so
    that the applied weights are the scheme's (1 + N(0, 0.1^2), the final norm's 2.5 + ...); LayerNorm biases too."""
    layernorm_biases(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.sub_(1.0)


SPECS = {
    "gemma": {"class": "GemmaForCausalLM", "config": gemma_config, "seed": 701, "notes": GEMMA_NOTES,
              "post": stored_minus_one, "legacy_rope_keys": {"rope_theta": 10000.0}},
    "phi": {"class": "PhiForCausalLM", "config": phi_config, "seed": 718, "notes": PHI_NOTES, "post": layernorm_biases,
            "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.4}},
    "stablelm": {"class": "StableLmForCausalLM", "config": stablelm_config, "seed": 729, "notes": STABLELM_NOTES,
                 "post": layernorm_biases, "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    "stablelm_parallel": {"class": "StableLmForCausalLM", "config": stablelm_parallel_config, "seed": 739,
                          "notes": STABLELM_PARALLEL_NOTES, "post": layernorm_biases,
                          "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    "gpt_neox": {"class": "GPTNeoXForCausalLM", "config": gpt_neox_config, "seed": 741, "notes": GPT_NEOX_NOTES,
                 "post": layernorm_biases, "base": "gpt_neox",
                 "legacy_rope_keys": {"rotary_emb_base": 10000.0, "rotary_pct": 0.25}},
    "nemotron": {"class": "NemotronForCausalLM", "config": nemotron_config, "seed": 751, "notes": NEMOTRON_NOTES,
                 "post": stored_minus_one, "legacy_rope_keys": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
}


if __name__ == "__main__":
    tiny.main(SPECS, __doc__)

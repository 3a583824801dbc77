"""A tiny random Gemma 3n text decoder (Gemma3nForCausalLM) with transformers reference outputs, in the
format of the other tiny folders (tools/make_tiny_hybrid.py, whose helpers this reuses; the exact math is
in tests/fixtures/reference/tiny/README_gemma3n.md).

    python tools/make_tiny_gemma3n.py [--out tests/fixtures/reference/tiny]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded.

The shape follows what llama.cpp hard-codes for its `gemma3n` graph, so that our GGUF export of this folder
runs there too: 4 AltUp streams (active 0), LAuReL rank 64, activation sparsity 0.95 on the first 10 layers,
and K/V shared from layer 20 on (22 layers: layers 20 and 21 reuse layers 18 and 19). The weights are stored
as bfloat16 (the fixture stays under 1 MB); the reference computes in float32 from those rounded weights.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import torch

import make_tiny_hybrid as tiny

FOLDER = "gemma3n"
SEED = 38
LAYERS = 22
FULL = (4, 9, 14, 19, 21)
# Scales that keep this deep random model well-conditioned (float32 against float64 logits: ~1e-4 at the
# reference rows): larger AltUp coefficients blow the streams up, larger q/k norm weights (attention scale 1)
# make the softmax nearly an argmax, larger output projections amplify every layer's rounding.
OUT, QK = 2.0, 0.3
PREDICT, CORRECT = 0.05, 0.1       # AltUp coefficients: larger ones blow the streams up (ill-conditioned)

NOTES = [
    "Gemma3nForCausalLM (text decoder only), 22 layers, hidden 32, 2 heads of 16, 1 kv head, MLP 64, "
    "hidden_size_per_layer_input 4, altup_num_inputs 4 (active 0), laurel_rank 64, "
    "vocab_size_per_layer_input 480 (of 512).",
    "Every Gemma3nRMSNorm computes x * (mean(x^2) + 1e-6)^-0.5 * w with the stored w (NOT 1 + w); v_norm has no "
    "weight.",
    "layer_types: full_attention at layers 4, 9, 14, 19, 21, sliding (window 16) elsewhere; rope theta 1e4 "
    "sliding, 1e6 full; attention scale 1.0 (q and k are RMS-normed per head, v too).",
    "num_kv_shared_layers 2: layers 20 (sliding) and 21 (full) have no k/v projections; they attend over the "
    "keys/values of the last earlier layer of their type (18 and 19), with their own mask.",
    "activation_sparsity_pattern 0.95 on layers 0-9: gate = relu(gate - (mean + std * 1.6448536)) over the "
    "64 values of a token (std with 1/n, unbiased=False) before gelu_tanh.",
    "Row 0 of embed_tokens_per_layer is zero (as nn.Embedding's padding_idx leaves it): ids >= 480 take row 0 "
    "in transformers, a zero row in llama.cpp's padded GGUF table; both agree here.",
    "Final logit softcap 30; tied embeddings.",
]


def config():
    from transformers import Gemma3nTextConfig
    return Gemma3nTextConfig(
        vocab_size=tiny.VOCAB, vocab_size_per_layer_input=480, hidden_size=32, hidden_size_per_layer_input=4,
        intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=16,
        layer_types=["full_attention" if i in FULL else "sliding_attention" for i in range(LAYERS)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        final_logit_softcapping=30.0, altup_num_inputs=4, altup_active_idx=0, altup_coef_clip=120.0,
        altup_correct_scale=True, laurel_rank=64, num_kv_shared_layers=2,
        activation_sparsity_pattern=[0.95] * 10 + [0.0] * (LAYERS - 10), tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=2, eos_token_id=1)


def redraw(model, seed: int) -> None:
    """Every parameter from a seeded generator, in named_parameters() order, then rounded to bfloat16."""
    g = torch.Generator().manual_seed(seed)
    d = model.config.hidden_size
    for name, p in model.named_parameters():
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:                           # plain w
                base = 2.0 if name == "model.norm.weight" else QK if ("q_norm" in name or "k_norm" in name) else 1.0
                w = base + 0.1 * r
            elif name.endswith("correct_output_scale"):
                w = 1.0 + 0.3 * r
            elif name.endswith("modality_router.weight"):  # its input is norm(x) / d: tanh gets O(1) values
                w = math.sqrt(d) * r
            elif name.endswith("prediction_coefs.weight"):
                w = PREDICT * r
            elif name.endswith("correction_coefs.weight"):
                w = CORRECT * r
            elif name.endswith("embed_tokens.weight"):
                w = 0.2 * r
            elif name.endswith("embed_tokens_per_layer.weight"):
                w = 0.5 * r
                w[0] = 0
            elif p.dim() == 2:
                w = r / math.sqrt(p.shape[1])
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    w *= OUT
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")
            p.copy_(w.to(torch.bfloat16).float())


def make(out: Path) -> None:
    import transformers
    torch.manual_seed(0)
    model = transformers.Gemma3nForCausalLM(config()).float().eval()
    model.config._attn_implementation = "eager"
    redraw(model, SEED)
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    # saved from a copy: .to(bfloat16) would also round the model's float32 buffers (sqrt(d), the RoPE tables)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    cfg_json = json.loads((dest / "config.json").read_text())

    inputs = tiny.reference_inputs(model)
    rotary = model.model.rotary_emb
    inv = {t: [tiny.shortest(v) for v in getattr(rotary, f"{t}_inv_freq").float().tolist()]
           for t in ("sliding_attention", "full_attention")}
    ref = {
        "folder": FOLDER, "model_class": "Gemma3nForCausalLM", "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "weights_dtype": "bfloat16", "compute_dtype": "float32",
        "attn_implementation": "eager",
        "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED, "input_seed": tiny.INPUT_SEED,
                 "scheme": "tools/make_tiny_gemma3n.py: redraw()"},
        "notes": NOTES + tiny.COMMON_NOTES,
        "legacy_rope_keys": {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0},
        "rope_inv_freq": inv,
        "config": cfg_json,
        "inputs": inputs,
    }
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, "greedy matches recompute:", [i["greedy_matches_recompute"] for i in inputs],
          "min margin", min(min(i["greedy_top1_minus_top2_per_step"]) for i in inputs))


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

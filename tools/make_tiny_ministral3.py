"""Tiny random Ministral 3 text model (`ministral3`) and a tiny Mistral 3 composite (`mistral3`: a Pixtral
vision tower, the multimodal projector and the same kind of text model) with transformers reference outputs,
in the format of the other tiny folders (tools/make_tiny_hybrid.py, whose generator this reuses; see
tests/fixtures/reference/tiny/README_ministral3.md for the exact math).

    python tools/make_tiny_ministral3.py [--out tests/fixtures/reference/tiny] [ministral3 mistral3]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded. The reference of
`mistral3` is its text-only forward (input ids, no image): what llambda runs of that directory.
"""
from __future__ import annotations

import torch

import make_tiny_hybrid as tiny

REDRAW = tiny.redraw      # the tiny scheme (make() swaps tiny.redraw for the composite)

# original_max_position_embeddings 16: the query temperature 1 + 0.1 ln(1 + floor(pos / 16)) steps at 16, 32,
# ... inside the 40- and 100-token prompts. rope_theta 100 and beta_fast 2 / beta_slow 0.25 put YaRN's ramp
# across pairs 0..9 of 16 with so short an original context (beta 32 / 1 would interpolate every pair).
ROPE = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 16.0, "original_max_position_embeddings": 16,
        "max_position_embeddings": 256, "beta_fast": 2.0, "beta_slow": 0.25, "mscale": 1.0, "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1}

MINISTRAL3_NOTES = [
    "Llama layers: x += o_proj(attn(input_layernorm(x))); x += down(silu(gate(h)) * up(h)), "
    "h = post_attention_layernorm(x); RMSNorms plain w, eps 1e-5; no biases.",
    "Attention: 4 heads of head_dim 32 (explicit: q is 128 wide over hidden 64), 2 kv heads; scale 32^-0.5.",
    "RoPE: YaRN (rope_theta 100, factor 16, original_max_position_embeddings 16, beta_fast 2, beta_slow 0.25, "
    "truncated ramp): inv_freq = extrapolated * (1 - ramp_mask) + extrapolated / 16 * ramp_mask, the linear ramp "
    "from dim floor(low) to ceil(high); mscale = mscale_all_dim = 1: attention factor 1 (cos and sin unscaled).",
    "Query temperature (llama_4_scaling_beta 0.1): after RoPE every query row at position p is multiplied by "
    "1 + 0.1 * ln(1 + floor(p / 16)) (original_max_position_embeddings); keys and values are not.",
    "Untied lm_head.",
]

MISTRAL3_NOTES = [
    "Mistral3ForConditionalGeneration: model.vision_tower (Pixtral, 1 layer), model.multi_modal_projector and "
    "model.language_model (Ministral3Model, 2 layers) with lm_head tied to its embeddings (tie_word_embeddings). "
    "The reference is text only (input ids, no pixel_values): the vision tower and projector take no part.",
    "Text model as in the ministral3 folder (same rope_parameters, query temperature included): 4 heads of 32 "
    "over hidden 64, 2 kv heads, RMSNorm eps 1e-5, SiLU MLP 128 wide.",
    "Weights: the language model and lm_head drawn by the tiny scheme (seed in reference.json), the vision tower "
    "and projector 0.05 * N(0, 1) (their norms 1 + that).",
]


def text_kwargs(layers: int, tied: bool) -> dict:
    return dict(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                rms_norm_eps=1e-5, rope_parameters=dict(ROPE), sliding_window=None, tie_word_embeddings=tied,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)


def ministral3_config():
    from transformers import Ministral3Config
    return Ministral3Config(**text_kwargs(3, False))


def mistral3_config():
    from transformers import Ministral3Config, Mistral3Config, PixtralVisionConfig
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=16, num_channels=3, image_size=32, patch_size=8)
    return Mistral3Config(vision_config=vision, text_config=Ministral3Config(**text_kwargs(2, True)),
                          image_token_index=10, spatial_merge_size=2, tie_word_embeddings=True)


def draw_composite(model, seed: int) -> None:
    """The text part by the tiny scheme (drawn on a text-only model, copied in), the rest small and random."""
    from transformers import Ministral3ForCausalLM
    text = Ministral3ForCausalLM(model.config.text_config).float().eval()
    REDRAW(text, seed)
    model.model.language_model.load_state_dict(text.model.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("model.vision_tower.", "model.multi_modal_projector.")):
                w = 0.05 * torch.randn(p.shape, generator=g)
                p.copy_(1.0 + w if "norm" in name and p.dim() == 1 else w)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.language_model.embed_tokens.weight)


# transformers 4's spelling of the same settings (tests/test_tiny_models.py loads the folders with them too)
LEGACY_ROPE = {"rope_theta": 100.0, "rope_scaling": {k: v for k, v in ROPE.items() if k != "rope_theta"}}

SPECS = {
    "ministral3": {"class": "Ministral3ForCausalLM", "config": ministral3_config, "seed": 509,
                   "notes": MINISTRAL3_NOTES, "legacy_rope_keys": LEGACY_ROPE},
    "mistral3": {"class": "Mistral3ForConditionalGeneration", "config": mistral3_config, "seed": 515,
                 "notes": MISTRAL3_NOTES, "legacy_rope_keys": LEGACY_ROPE},
}


def make(folder: str, out) -> None:
    if folder != "mistral3":
        return tiny.make(folder, out)
    # tiny.make with the composite's own weight scheme: redraw() knows no vision tower, so it is swapped for
    # draw_composite for this one folder
    original = tiny.redraw
    tiny.redraw = draw_composite
    try:
        tiny.make(folder, out)
    finally:
        tiny.redraw = original
    # what tiny.make could not see in a composite: the scheme used and the text model's RoPE frequencies
    import json
    from transformers.models.ministral3.modeling_ministral3 import Ministral3RotaryEmbedding
    path = out / folder / "reference.json"
    ref = json.loads(path.read_text())
    ref["init"]["scheme"] = "tools/make_tiny_ministral3.py: draw_composite() (tools/make_tiny_hybrid.py: redraw())"
    inv = Ministral3RotaryEmbedding(mistral3_config().text_config).inv_freq
    ref["rope_inv_freq"] = {"all_layers": [tiny.shortest(v) for v in inv.float().tolist()]}
    path.write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    tiny.SPECS.update(SPECS)
    import argparse
    from pathlib import Path
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/reference/tiny")
    ap.add_argument("folders", nargs="*", default=list(SPECS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for f in args.folders:
        make(f, args.out)

"""A tiny random Gemma 3 with its vision tower (Gemma3ForConditionalGeneration: SigLIP encoder, the
average-pool + RMSNorm + projection that turns patches into soft tokens, the Gemma 3 text decoder) and
transformers reference outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py).

    python tools/make_tiny_gemma3_vision.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers and Pillow (never runtime dependencies of llambda). Everything is seeded.

The folder holds two test images (PNG files of odd, non-square sizes) and, in reference.json, every stage an
engine must reproduce: the pixel values of Gemma3ImageProcessor (Pillow's bilinear resize, then
(x / 255 - 0.5) / 0.5, channels first), the vision tower's last hidden state, the projector's soft tokens,
and the whole model's logits on token sequences holding image blocks (begin-of-image, the soft tokens,
end-of-image), run with token_type_ids so that each image's tokens attend to each other both ways.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

import make_tiny_hybrid as tiny

FOLDER = "gemma3_vision"
SEED = 41
VOCAB = tiny.VOCAB
BOI, EOI, IMAGE = 500, 501, 502          # begin/end-of-image and soft-token ids (Gemma 3: 255999, 256000, 262144)
TOKENS_PER_IMAGE = 16                    # 4 x 4 soft tokens from 8 x 8 patches (pool kernel 2)
IMAGE_SIZE, PATCH = 32, 4
IMAGES = {"image_a.png": (45, 37), "image_b.png": (20, 64)}     # file: (width, height), both resized to 32 x 32
N_NEW = 8

NOTES = [
    "Gemma3ForConditionalGeneration. Text decoder: as the tiny gemma3 folder (hidden 64, 4 heads of 16, 2 kv "
    "heads, MLP 128, layer_types [sliding, sliding, full, sliding]) but with a sliding window of 8, so that a "
    "16-token image block is wider than the window.",
    "Vision tower: SigLIP (siglip_vision_model), image 32 x 32, patch 4 (8 x 8 = 64 patches), hidden 32, 2 layers, "
    "2 heads, MLP 64, gelu_pytorch_tanh, LayerNorm eps 1e-6, learned position embeddings, no pooling head; "
    "its post_layernorm output is the last hidden state.",
    "Projector: the 64 patch rows as an 8 x 8 grid (row-major), 2 x 2 average pools -> 16 rows (row-major), "
    "Gemma RMSNorm x * (1 + w) (eps = the vision layer_norm_eps), then x @ mm_input_projection_weight [32, 64] "
    "(stored input-major: no transpose).",
    f"Token ids: begin-of-image {BOI}, end-of-image {EOI}, soft token {IMAGE}; a prompt's image is "
    f"[{BOI}] + [{IMAGE}] * {TOKENS_PER_IMAGE} + [{EOI}]. The soft tokens' embeddings are the projector's rows, "
    "NOT scaled by sqrt(hidden) (text embeddings are); the begin/end tokens are ordinary text tokens.",
    "Attention: causal, except that the soft tokens of one image see each other both ways (token_type_ids 1 "
    "marks them; a new block starts at each run of ones). Full layers: causal OR same-block. Sliding layers: "
    "(key > query - window) AND (causal OR same-block). An image never sees a later image.",
    "Pixel values: Pillow resize to 32 x 32 with BILINEAR (Pillow's own antialiased filter), /255, (x - 0.5) / 0.5, "
    "RGB, channels first.",
]


def config():
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig
    text = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        query_pre_attn_scalar=16, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_channels=3,
        image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
        vision_use_head=False)
    return Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                        mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=BOI, eoi_token_index=EOI,
                        image_token_index=IMAGE, tie_word_embeddings=True)


def redraw(model, seed: int, rms_norm=lambda r: 0.1 * r) -> None:
    """Every parameter from a seeded generator, in named_parameters() order (float32); `rms_norm` makes
    the RMSNorms' weights from the draw (Gemma's x * (1 + w): near 0)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            if "layernorm" in name or "layer_norm" in name:      # SigLIP LayerNorms: w near 1, b near 0
                w = (1.0 + 0.1 * r) if name.endswith("weight") else 0.1 * r
            elif "norm" in name:                                  # RMSNorms
                w = rms_norm(r)
            elif name.endswith("embed_tokens.weight"):
                w = 0.2 * r
            elif name.endswith("position_embedding.weight"):
                w = 0.5 * r
            elif name.endswith("patch_embedding.weight"):          # [32, 3, 4, 4]: fan-in 48
                w = r / math.sqrt(p[0].numel())
            elif name.endswith("mm_input_projection_weight"):      # [32 in, 64 out]
                w = r / math.sqrt(p.shape[0])
            elif p.dim() == 2:
                w = r / math.sqrt(p.shape[1])
            elif p.dim() == 1:                                    # biases of the vision tower
                w = 0.1 * r
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")
            p.copy_(w)


def make_images(dest: Path, sizes: dict = IMAGES) -> dict:
    """PNG files {name: (width, height)} under dest."""
    from PIL import Image
    rng = np.random.default_rng(tiny.INPUT_SEED)
    out = {}
    for name, (w, h) in sizes.items():
        # smooth gradients plus noise: bilinear resampling has something to average
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([255 * xx / w, 255 * yy / h, 127 + 100 * np.sin(xx / 3.0 + yy / 5.0)], -1)
        pix = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pix, "RGB").save(dest / name)
        out[name] = dest / name
    return out


def sequences(rng) -> list[dict]:
    """Token sequences: one image inside text, two images (the second must not see the first's future)."""
    block = [BOI] + [IMAGE] * TOKENS_PER_IMAGE + [EOI]

    def text(n):
        return rng.integers(3, 480, size=n).tolist()
    return [
        {"images": ["image_a.png"], "input_ids": text(5) + block + text(6)},
        {"images": ["image_b.png", "image_a.png"], "input_ids": text(3) + block + text(4) + block + text(5)},
    ]


def make(out: Path) -> None:
    import transformers
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config()).float().eval()
    model.config._attn_implementation = "eager"
    model.config.text_config._attn_implementation = "eager"
    model.config.vision_config._attn_implementation = "eager"
    redraw(model, SEED)
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_mean=[0.5] * 3,
                                        image_std=[0.5] * 3, resample=2, rescale_factor=1 / 255)
    processor.save_pretrained(dest)
    cfg_json = json.loads((dest / "config.json").read_text())
    files = make_images(dest)

    images = {}
    with torch.no_grad():
        for name, path in files.items():
            pv = processor(images=[Image.open(path)], return_tensors="pt")["pixel_values"].float()
            hidden = model.model.vision_tower(pixel_values=pv).last_hidden_state
            soft = model.model.multi_modal_projector(hidden)
            images[name] = {
                "size": list(IMAGES[name]),
                "pixel_values": [[[tiny.shortest(v) for v in row] for row in ch] for ch in pv[0].tolist()],
                "vision_last_hidden_state": [[tiny.shortest(v) for v in row] for row in hidden[0].tolist()],
                "soft_tokens": [[tiny.shortest(v) for v in row] for row in soft[0].tolist()],
            }

    rng = np.random.default_rng(tiny.INPUT_SEED)
    inputs = []
    for seq in sequences(rng):
        ids = seq["input_ids"]
        ids_t = torch.tensor([ids])
        ttype = (ids_t == IMAGE).long()
        pv = processor(images=[Image.open(files[n]) for n in seq["images"]], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            logits = model(input_ids=ids_t, pixel_values=pv, token_type_ids=ttype).logits[0].float().numpy()
            causal = model(input_ids=ids_t, pixel_values=pv).logits[0].float().numpy()
            gen = model.generate(input_ids=ids_t, pixel_values=pv, token_type_ids=ttype, max_new_tokens=N_NEW,
                                 do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
            gen = gen[0, len(ids):].tolist()
            seq_ids, recompute, margins = list(ids), [], []
            for _ in range(N_NEW):             # greedy again, every step recomputed from scratch
                t = torch.tensor([seq_ids])
                row = model(input_ids=t, pixel_values=pv, token_type_ids=(t == IMAGE).long()).logits[0, -1].numpy()
                top = np.sort(row)[-2:]
                margins.append(float(top[1] - top[0]))
                recompute.append(int(row.argmax()))
                seq_ids.append(recompute[-1])
        image_pos = [i for i, t in enumerate(ids) if t == IMAGE]
        # rows checked in full: the first and last soft token of each image, its end-of-image, the last 3
        rows = sorted(set([p for i, p in enumerate(image_pos) if i % TOKENS_PER_IMAGE in (0, TOKENS_PER_IMAGE - 1)]
                          + [p + 1 for p in image_pos if ids[p + 1] == EOI] + list(range(len(ids) - 3, len(ids)))))
        inputs.append({
            "images": seq["images"], "input_ids": ids, "length": len(ids),
            "rows": rows, "logits_rows": [[tiny.shortest(v) for v in logits[p]] for p in rows],
            "argmax_per_position": logits.argmax(-1).tolist(),
            "causal_only_max_abs_logit_diff": float(np.abs(causal - logits).max()),
            "greedy_new_tokens": gen, "greedy_matches_recompute": gen == recompute,
            "greedy_top1_minus_top2_per_step": margins,
        })

    ref = {
        "folder": FOLDER, "model_class": "Gemma3ForConditionalGeneration",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "weights_dtype": "float32", "compute_dtype": "float32", "attn_implementation": "eager",
        "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED, "input_seed": tiny.INPUT_SEED,
                 "scheme": "tools/make_tiny_gemma3_vision.py: redraw()"},
        "notes": NOTES + tiny.COMMON_NOTES,
        "config": cfg_json,
        "images": images,
        "inputs": inputs,
    }
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, "greedy matches recompute:", [i["greedy_matches_recompute"] for i in inputs],
          "min margin", min(min(i["greedy_top1_minus_top2_per_step"]) for i in inputs),
          "causal-only diff", [round(i["causal_only_max_abs_logit_diff"], 4) for i in inputs])


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

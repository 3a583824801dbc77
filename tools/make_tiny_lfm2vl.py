"""A tiny random LFM2-VL (Lfm2VlForConditionalGeneration: a SigLIP2 NaFlex tower, the pixel-unshuffle projector,
an LFM2 text decoder of conv and attention layers), its tokenizer, and transformers' reference outputs, in the
format of the other tiny folders (tools/make_tiny_idefics3.py).

    python tools/make_tiny_lfm2vl.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

transformers' Lfm2VlImageProcessor is a torchvision-backend processor only (no PIL backend), and torchvision is
not importable beside this torch build, so the image processing here is this tool's own torch code following
that processor's rules (smart_resize, the tile grid, split_to_tiles' order, the thumbnail, the fused
rescale-normalize, the (y, x, channel) patch order), its resizes torch's bilinear antialiased interpolate on
uint8 (what torchvision's resize runs for a uint8 image on the CPU). The model (tower, projector, text decoder)
is transformers' own, run on those pixel values.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
from make_tiny_idefics3 import bpe_tokenizer, npy

FOLDER = "lfm2vl_vision"
SEED = 53
PATCH, FACTOR, TABLE = 8, 2, 6            # patches of 8, unshuffle 2 x 2, a 6 x 6 position table
TILE, MIN_TILES, MAX_TILES = 64, 2, 4     # tiles of 64 x 64 (8 x 8 patches, 16 tokens)
MIN_TOKENS, MAX_TOKENS = 4, 16            # min/max_image_tokens: 32 x 32 .. 64 x 64 pixels
TOLERANCE = 2.0                           # max_pixels_tolerance
IMAGES = {"image_small.png": (20, 13),    # -> 48 x 32 (up, min tokens): 6 x 4 patches, 3 x 2 tokens
          "image_mid.png": (70, 45),      # -> 64 x 48: 8 x 6 patches, 12 tokens
          "image_large.png": (150, 97)}   # too large: 1 x 2 tiles of 64 + a 64 x 48 thumbnail
MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
N_NEW = 8
ROWS_COLS = [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)]
SPECIAL = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
           "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"] + ROWS_COLS
# LFM2-VL's chat template, shortened (LiquidAI/LFM2-VL-*: an image part writes <image>)
CHAT_TEMPLATE = ("{{- bos_token -}}{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\n' -}}"
                 "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
                 "{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{- '<image>' -}}"
                 "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
                 "{{- '<|im_end|>\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}"
                 "{{- '<|im_start|>assistant\n' -}}{%- endif -%}")
CORPUS = [
    "user: What is in this image? assistant: A cat sitting on a red chair near the window.",
    "user: Describe the picture in one sentence. assistant: The photo shows a small boat on a calm lake.",
    "Can you read the text on the sign? There are two dogs, three birds and a tree in the garden.",
    "The quick brown fox jumps over the lazy dog. Colours, shapes, lines and letters of an image.",
]

NOTES = [
    "Lfm2VlForConditionalGeneration (model_type lfm2_vl). Text: Lfm2 (hidden 64, 3 layers conv / full_attention / "
    "conv, 4 heads of 16, 2 kv heads, conv_L_cache 3, MLP 2/3 * 192 rounded to 32: 128), tied embeddings, vocab 512.",
    "Vision: Siglip2VisionModel (vision_use_head false): patch_embedding is nn.Linear over C * 8 * 8 values of a patch "
    "in (y, x, channel) order; position_embedding [36, 32] seen as a 6 x 6 grid resized to the image's own gh x gw "
    "patch grid by F.interpolate(bilinear, align_corners=False, antialias=True) in float32 (per axis: scale = 6 / n, "
    "support = max(scale, 1), centre (i + 0.5) scale - 0.5, weight of source j = max(0, 1 - |j - centre| / support), "
    "normalized to sum 1; output (r, c) = sum wr[j] wc[k] table[j * 6 + k]); 2 pre-LN layers (LayerNorm with bias, "
    "eps 1e-6, attention with biases over the image's real patches only, gelu_pytorch_tanh MLP), post_layernorm.",
    "Projector: the gh x gw last hidden state pixel-unshuffled by 2: token (i, j) (row-major over gh/2 x gw/2) is "
    "the concatenation over a in 0..1 (outer), b in 0..1 (inner) of patch (2i + a, 2j + b); LayerNorm(128) "
    "(eps 1e-5), linear_1 (128 -> 48, bias), exact GELU, linear_2 (48 -> 64, bias).",
    "Image processing (Lfm2VlImageProcessor's rules, see the docstring): encoder_patch_size 8, downsample 2 (f = 16), "
    "min/max_image_tokens 4 / 16, tile 64, min/max tiles 2 / 4, thumbnail on, max_pixels_tolerance 2, bilinear. "
    "smart_resize: h' = max(f, round(h / f) f) (Python round), w' likewise; past 16 * 256 pixels beta = sqrt(h w / "
    "4096), each side max(f, floor(side / beta / f) f); under 4 * 256: beta = sqrt(1024 / (h w)), ceil(side beta / "
    "f) f. Too large: max(8, round(h / f) f) * max(8, round(w / f) f) > 16 * 256 * 2; then the grid (cols, rows) is "
    "the target ratio (w, h) with 2 <= w h <= 4 closest to the aspect w / h (ties: the later ratio when the image's "
    "area > half the ratio's tiles' area), ratios ordered by w h; the image resized to cols * 64 x rows * 64, cut "
    "row-major, then the thumbnail (the whole image at its smart_resize size). Pixels x / 255 fused: (x - 127.5) / "
    "127.5 in float32.",
    "Prompt: the template's <image> becomes <|image_start|> + (per tile, row-major: <|img_row_R_col_C|> + <image> * "
    "16) + <|img_thumbnail|> + <image> * thumbnail tokens + <|image_end|>; unsplit: <|image_start|> + <image> * "
    "tokens + <|image_end|>. Tokens of a crop = (gh / 2) (gw / 2). The <image> embeddings are replaced in order by "
    "the projector's rows of every crop (masked_scatter, no scaling). Attention causal everywhere.",
    "Logits: model(input_ids, pixel_values, spatial_shapes, pixel_attention_mask) in float32, eager attention.",
]


def config(vocab: int):
    from transformers import Lfm2Config, Lfm2VlConfig, Siglip2VisionConfig
    text = Lfm2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, conv_bias=False, conv_L_cache=3,
        block_multiple_of=32, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        layer_types=["conv", "full_attention", "conv"], bos_token_id=1, eos_token_id=4, pad_token_id=0)
    vision = Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 num_channels=3, num_patches=TABLE * TABLE, patch_size=PATCH,
                                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=False)
    return Lfm2VlConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                        image_token_id=SPECIAL.index("<image>"), projector_hidden_act="gelu",
                        projector_hidden_size=48, projector_bias=True, projector_use_layernorm=True,
                        downsample_factor=FACTOR, tie_word_embeddings=True)


PROCESSOR = {"image_processor_type": "Lfm2VlImageProcessor", "processor_class": "Lfm2VlProcessor",
             "downsample_factor": FACTOR, "do_image_splitting": True, "min_tiles": MIN_TILES, "max_tiles": MAX_TILES,
             "use_thumbnail": True, "min_image_tokens": MIN_TOKENS, "max_image_tokens": MAX_TOKENS,
             "encoder_patch_size": PATCH, "tile_size": TILE, "max_pixels_tolerance": TOLERANCE, "do_resize": True,
             "size": {"height": TILE, "width": TILE}, "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255,
             "do_normalize": True, "image_mean": MEAN, "image_std": STD, "do_pad": True, "do_convert_rgb": True}


# ---- the image processor's rules (see the module's note)
def smart_resize(h, w):
    """(h', w'): each side rounded to the token size f, then scaled down or up as a whole into the token bounds."""
    f = PATCH * FACTOR
    lo, hi = MIN_TOKENS * PATCH ** 2 * FACTOR ** 2, MAX_TOKENS * PATCH ** 2 * FACTOR ** 2
    sides = [max(f, round(s / f) * f) for s in (h, w)]
    if sides[0] * sides[1] > hi:
        sides = [max(f, math.floor(s / math.sqrt(h * w / hi) / f) * f) for s in (h, w)]
    elif sides[0] * sides[1] < lo:
        sides = [math.ceil(s * math.sqrt(lo / (h * w)) / f) * f for s in (h, w)]
    return tuple(sides)


def too_large(h, w):
    f = PATCH * FACTOR
    return (max(PATCH, round(h / f) * f) * max(PATCH, round(w / f) * f)
            > MAX_TOKENS * PATCH ** 2 * FACTOR ** 2 * TOLERANCE)


def tile_grid(h, w):
    ratios = sorted({(a, b) for n in range(MIN_TILES, MAX_TILES + 1) for a in range(1, n + 1)
                     for b in range(1, n + 1) if MIN_TILES <= a * b <= MAX_TILES}, key=lambda x: x[0] * x[1])
    best, diff = (1, 1), float("inf")
    for a, b in ratios:
        d = abs(w / h - a / b)
        if d < diff:
            best, diff = (a, b), d
        elif d == diff and w * h > 0.5 * TILE * TILE * a * b:
            best = (a, b)
    return best       # (cols, rows)


def resize(x, h, w):
    return torch.nn.functional.interpolate(x[None], size=(h, w), mode="bilinear", align_corners=False,
                                           antialias=True)[0]


def process(pil):
    """(crops [uint8 3 x H x W], rows, cols, thumbnail/single (h, w))."""
    x = torch.from_numpy(np.array(pil.convert("RGB"))).permute(2, 0, 1).contiguous()
    h, w = x.shape[1:]
    nh, nw = smart_resize(h, w)
    if too_large(h, w):
        cols, rows = tile_grid(h, w)
        big = resize(x, rows * TILE, cols * TILE)
        crops = [big[:, r * TILE:(r + 1) * TILE, c * TILE:(c + 1) * TILE] for r in range(rows) for c in range(cols)]
        if rows * cols != 1:
            crops.append(resize(x, nh, nw))
        return crops, rows, cols, (nh, nw)
    return [resize(x, nh, nw)], 1, 1, (nh, nw)


def patches(crop):
    """float32 [gh * gw, 8 * 8 * 3] (y, x, channel order) and (gh, gw)."""
    mean = torch.tensor(MEAN) * (1.0 / (1 / 255))
    std = torch.tensor(STD) * (1.0 / (1 / 255))
    v = (crop.to(torch.float32) - mean[:, None, None]) / std[:, None, None]
    C, H, W = v.shape
    gh, gw = H // PATCH, W // PATCH
    p = v.reshape(C, gh, PATCH, gw, PATCH).permute(1, 3, 2, 4, 0).reshape(gh * gw, -1)
    return p, (gh, gw)


def image_text(rows, cols, shape):
    n = (shape[0] // PATCH // FACTOR) * (shape[1] // PATCH // FACTOR)
    out = ["<|image_start|>"]
    if rows > 1 or cols > 1:
        per = (TILE // PATCH // FACTOR) ** 2
        for r in range(rows):
            for c in range(cols):
                out.append(f"<|img_row_{r + 1}_col_{c + 1}|>" + "<image>" * per)
        out.append("<|img_thumbnail|>" + "<image>" * n)
    else:
        out.append("<image>" * n)
    out.append("<|image_end|>")
    return "".join(out)


def batch(crops):
    """pixel_values [n, max, 192], spatial_shapes [n, 2], pixel_attention_mask [n, max] of crops."""
    cells = [patches(c) for c in crops]
    most = max(MAX_TOKENS * FACTOR ** 2, (TILE // PATCH) ** 2)
    pv = torch.zeros(len(cells), most, 3 * PATCH * PATCH)
    mask = torch.zeros(len(cells), most, dtype=torch.int32)
    for i, (p, _) in enumerate(cells):
        pv[i, :len(p)] = p
        mask[i, :len(p)] = 1
    return pv, torch.tensor([g for _, g in cells]), mask


def greedy_recompute(last_logits, ids) -> tuple[list, list]:
    """N_NEW greedy tokens, each from a whole recompute of the sequence so far (no cache), and each step's margin
    between the top two logits."""
    tokens, margins = [], []
    for _ in range(N_NEW):
        row = last_logits(list(ids) + tokens)
        second, first = np.sort(row)[-2:]
        margins.append(float(first - second))
        tokens.append(int(np.argmax(row)))
    return tokens, margins


def redraw(model, seed: int) -> None:
    """Every parameter from a seeded generator, in named_parameters() order: LayerNorms near (1, 0), LFM2's RMSNorms
    1 + 0.1 N(0, 1), the embedding 0.2 N(0, 1), position table 0.5 N(0, 1), matrices and the depthwise conv
    N(0, 1) / sqrt(fan-in), biases 0.1 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            if "layernorm" in name or "layer_norm" in name:
                w = (1.0 + 0.1 * r) if name.endswith("weight") else 0.1 * r
            elif "norm" in name:
                w = 1.0 + 0.1 * r
            elif name.endswith("embed_tokens.weight"):
                w = 0.2 * r
            elif name.endswith("position_embedding.weight"):
                w = 0.5 * r
            elif p.dim() == 3:                  # the short conv [d, 1, L]
                w = r / math.sqrt(p.shape[-1])
            elif p.dim() == 2:
                w = r / math.sqrt(p.shape[1])
            else:
                w = 0.1 * r
            p.copy_(w)


def make(out: Path) -> None:
    import transformers
    from PIL import Image
    tokenizer = bpe_tokenizer(CORPUS, SPECIAL, 512, bos_token="<|startoftext|>", eos_token="<|im_end|>",
                              pad_token="<|pad|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    model = transformers.Lfm2VlForConditionalGeneration(config(len(tokenizer))).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    redraw(model, SEED)
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    (dest / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=2) + "\n")
    files = gemma3_vision.make_images(dest, IMAGES)
    cfg_json = json.loads((dest / "config.json").read_text())

    images = {}
    for name, path in files.items():
        crops, rows, cols, shape = process(Image.open(path))
        pv, shapes, mask = batch(crops)
        with torch.no_grad():
            vt = model.model.vision_tower(pixel_values=pv, spatial_shapes=shapes, pixel_attention_mask=mask)
            feats = model.model.get_image_features(pixel_values=pv, spatial_shapes=shapes,
                                                   pixel_attention_mask=mask).pooler_output
        key = name.rsplit(".", 1)[0]
        crop_refs = []
        for i, (gh, gw) in enumerate(shapes.tolist()):
            n = gh * gw
            crop_refs.append({
                "grid": [gh, gw],
                "pixels": npy(dest, f"{key}_{i}_pixels.npy", pv[i, :n].numpy()),
                "hidden": npy(dest, f"{key}_{i}_hidden.npy", vt.last_hidden_state[i, :n].numpy()),
                "rows": npy(dest, f"{key}_{i}_rows.npy", feats[i].numpy())})
        images[name] = {"size": list(IMAGES[name]), "tiles": [rows, cols], "thumbnail_hw": list(shape),
                        "crops": crop_refs, "prompt_text": image_text(rows, cols, shape)}

    def run_prompt(key, messages, names):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        parts = text.split("<image>")
        assert len(parts) == len(names) + 1
        expanded = parts[0] + "".join(images[n]["prompt_text"] + p for n, p in zip(names, parts[1:]))
        ids = tokenizer(expanded, add_special_tokens=False)["input_ids"]
        crops = [c for n in names for c in process(Image.open(files[n]))[0]]
        pv, shapes, mask = batch(crops)
        enc = dict(input_ids=torch.tensor([ids]), pixel_values=pv, spatial_shapes=shapes, pixel_attention_mask=mask)
        with torch.no_grad():
            logits = model(**enc).logits[0].float().numpy()
            gen = model.generate(**enc, max_new_tokens=N_NEW, do_sample=False, use_cache=True, eos_token_id=None,
                                 pad_token_id=0)[0, len(ids):].tolist()
            recompute, margins = greedy_recompute(
                lambda seq: model(input_ids=torch.tensor([seq]), pixel_values=pv, spatial_shapes=shapes,
                                  pixel_attention_mask=mask).logits[0, -1].numpy(), ids)
        image_id = model.config.image_token_id
        pos = [i for i, t in enumerate(ids) if t == image_id]
        rows = sorted(set(pos[:1] + pos[-1:] + list(range(len(ids) - 3, len(ids)))))
        return {"messages": messages, "images": names, "chat_text": text, "prompt_text": expanded,
                "input_ids": ids, "length": len(ids), "n_image_tokens": len(pos), "rows": rows,
                "logits_rows": npy(dest, f"{key}_logits_rows.npy", logits[rows]),
                "argmax_per_position": logits.argmax(-1).tolist(), "greedy_new_tokens": gen,
                "greedy_matches_recompute": gen == recompute, "greedy_top1_minus_top2_per_step": margins}

    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]}]
    two = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image"},
                                        {"type": "text", "text": "and"}, {"type": "image"}]}]
    prompts = [run_prompt("one_image", one, ["image_mid.png"]),
               run_prompt("two_images", two, ["image_large.png", "image_small.png"])]
    ref = dict(folder=FOLDER, model_class="Lfm2VlForConditionalGeneration", notes=NOTES,
               versions={"transformers": transformers.__version__, "torch": torch.__version__},
               dtypes={"weights": "float32", "compute": "float32", "attention": "eager"},
               init={"torch_manual_seed": 0, "weight_generator_seed": SEED, "input_seed": tiny.INPUT_SEED,
                     "scheme": "redraw() of this tool"},
               config=cfg_json, processor=PROCESSOR, image_token_id=model.config.image_token_id,
               special_token_ids={t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL},
               images=images, prompts=prompts)
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, {n: (i["tiles"], [c["grid"] for c in i["crops"]]) for n, i in images.items()},
          "greedy matches recompute:", [p["greedy_matches_recompute"] for p in prompts],
          "min margin", min(min(p["greedy_top1_minus_top2_per_step"]) for p in prompts))


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

"""A tiny random InternVL 3 / 3.5 (transformers' InternVLForConditionalGeneration: the InternViT tower, the pixel
shuffle and MLP projector, a Qwen2 text decoder), its tokenizer and processor, and transformers' reference outputs,
in the format of the other tiny folders (tools/make_tiny_idefics3.py).

    python tools/make_tiny_internvl.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

Two folders: internvl_vision (LayerNorm blocks with q/k/v biases, as InternVL3-1B/2B's InternViT-300M: the whole
model, three PNG images of odd sizes, per image the tiles' pixel values, the tower's last hidden state and the
projector's rows; per prompt a few rows of the logits) and internvl_rms_vision (the same maker with RMSNorm blocks,
q/k norms and no attention bias, as InternViT-6B: the tower's outputs only), internvl_qwen3_vision (the first with a
Qwen3 text model, as InternVL 3.5's: the same tower weights and prompts).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3

SEED = 53
TILE, PATCH = 56, 14                  # 4 x 4 patches a tile, shuffled 2 x 2 -> 4 soft tokens a tile
SEQ_LEN = (TILE // PATCH) ** 2 // 4
MIN_PATCHES, MAX_PATCHES = 1, 6
IMAGES = {"image_wide.png": (150, 60),    # ratio 2.5: (2, 1) and (3, 1) tie; 9000 > 0.5 * 56 * 56 * 3: 3 x 1 tiles
          "image_square.png": (50, 47),   # 1 x 1: one tile, no thumbnail
          "image_tall.png": (40, 90)}     # 1 col x 2 rows + thumbnail
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
N_NEW = 8

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
# the InternVL -hf checkpoints' template: an image part is '<IMG_CONTEXT>\n'
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}{% if message['content'] is "
                 "string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if "
                 "content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}{% elif content['type'] == 'text' %}"
                 "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}")
CORPUS = idefics3.CORPUS + ["Please describe the image shortly. The image shows a red panda on a tree branch."]

NOTES = [
    "InternVLForConditionalGeneration (model_type internvl; vision_config internvl_vision). Text decoder: a Qwen2 "
    "(hidden 64, 2 layers, 4 heads of 16, 2 kv heads, q/k/v biases, MLP 128, rope theta 10000, rms eps 1e-6), "
    "TIED head (tie_word_embeddings true at both levels: no lm_head.weight stored).",
    "Vision tower (InternVLVisionModel, InternViT): tile 56 x 56, patch 14 (4 x 4 = 16 patches), hidden 32, 2 layers, "
    "2 heads of 16, MLP 64, exact GELU (hidden_act gelu), eps 1e-6. Embeddings: Conv2d with bias, patches row-major; "
    "the class token first (17 rows); + position_embeddings [1, 17, 32] (no interpolation: the tile is the table's "
    "size). Layer: h = x + lambda_1 * proj(attn(norm_before(x))); out = h + lambda_2 * fc2(gelu(fc1(norm_after(h)))) "
    "(lambda_1, lambda_2 random here, not 1). Attention: q, k, v each nn.Linear (bias per attention_bias); with "
    "use_qk_norm, q and k each RMSNorm over the WHOLE width (not per head, eps 1e-6 fixed) before the head split; "
    "softmax(q k^T / sqrt(16)) v both ways. use_mean_pooling true: no final norm (layernorm is Identity).",
    "Features: vision_feature_layer -1 (the last layer's output), the class token dropped ([:, 1:]), 16 rows as "
    "4 x 4; pixel_shuffle with scale 0.5: view(4, 2, 64) -> permute(1, 0, 2) -> view(2, 2, 128) -> permute(1, 0, 2): "
    "output row (i, j) at i * 2 + j is [p(2i, 2j), p(2i, 2j+1), p(2i+1, 2j), p(2i+1, 2j+1)] (row offset outer, "
    "column inner). Projector: LayerNorm(128, eps 1e-5) -> linear_1 (128 -> 64) -> exact GELU -> linear_2 (64 -> 64).",
    "Preprocessing (GotOcr2ImageProcessorPil with crop_to_patches: InternVLProcessor passes it true whatever "
    "preprocessor_config.json says): grid (cols, rows) from get_optimal_tiled_canvas: the (w, h) with min_patches <= "
    "w * h <= max_patches, enumerated w outer, h inner, stably sorted by w * h; the first with the smallest "
    "|W/H - w/h| wins, a later equal one replaces it when W * H > 0.5 * 56 * 56 * w * h. The image resized (Pillow "
    "BICUBIC, resample 3) to (56 w) x (56 h), cut into tiles row-major; if more than one tile, the whole image "
    "resized to 56 x 56 (aspect not kept) last (the thumbnail). Each uint8 tile x 1/255 (float64 -> float32), "
    "(x - mean) / std in float32 (ImageNet's mean/std), channels first.",
    "Prompt expansion (InternVLProcessor.replace_image_token): each '<IMG_CONTEXT>' the template wrote becomes "
    "'<img>' + '<IMG_CONTEXT>' * (4 * n_tiles) + '</img>' (n_tiles including the thumbnail); the '\\n' the template "
    "writes after it stays. The soft tokens' embeddings are replaced, in order, by the projector's rows (all tiles "
    "of an image concatenated, the thumbnail last), unscaled; attention is the text model's causal attention.",
    "Tokenizer: a ByteLevel BPE trained by tokenizers' BpeTrainer on a few fixed sentences; ids 0..6 are the special "
    "tokens " + ", ".join(SPECIAL) + "; eos <|im_end|>, pad <|endoftext|>; no BOS. Its extra_special_tokens name "
    "<img>, </img>, <IMG_CONTEXT>, <video> as the processor needs them.",
    "Logits: model(input_ids, pixel_values) in float32, eager attention; rows listed in 'rows' (each image's first "
    "and last soft token, the last 3 positions).",
]


def config(vocab: int, rms: bool, qwen3: bool = False):
    from transformers import InternVLConfig, Qwen2Config, Qwen3Config
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
                  bos_token_id=None, eos_token_id=2, pad_token_id=0)
    text = Qwen3Config(head_dim=16, **common) if qwen3 else Qwen2Config(**common)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, hidden_act="gelu",
                  image_size=[TILE, TILE], patch_size=[PATCH, PATCH], layer_norm_eps=1e-6,
                  norm_type="rms_norm" if rms else "layer_norm", use_qk_norm=rms, attention_bias=not rms,
                  layer_scale_init_value=0.1, use_mean_pooling=True)
    return InternVLConfig(text_config=text.to_dict(), vision_config=vision, image_token_id=SPECIAL.index("<IMG_CONTEXT>"),
                          image_seq_length=SEQ_LEN, downsample_ratio=0.5, projector_hidden_act="gelu",
                          vision_feature_layer=-1, vision_feature_select_strategy="default", tie_word_embeddings=True)


def redraw(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            if "lambda_" in name:                                     # layer scales: around 0.5, never 1
                w = 0.5 + 0.2 * r
            elif "norm" in name and name.endswith("bias"):
                w = 0.1 * r
            elif "norm" in name:                                      # LayerNorm and RMSNorm weights near 1
                w = 1.0 + 0.1 * r
            elif name.endswith("embed_tokens.weight"):
                w = 0.2 * r
            elif name.endswith("position_embeddings") or name.endswith("cls_token"):
                w = 0.5 * r
            elif name.endswith("projection.weight") and p.dim() == 4:  # the patch conv [32, 3, 14, 14]
                w = r / math.sqrt(p[0].numel())
            elif p.dim() == 2:
                w = r / math.sqrt(p.shape[1])
            elif p.dim() == 1:
                w = 0.1 * r
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")
            p.copy_(w)


def make_tokenizer():
    return idefics3.bpe_tokenizer(
        CORPUS, SPECIAL, 480, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                              "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})


def make_folder(out: Path, folder: str, rms: bool, qwen3: bool = False) -> None:
    import transformers
    from PIL import Image
    from transformers import InternVLProcessor
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = transformers.InternVLForConditionalGeneration(config(len(tokenizer), rms, qwen3)).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    redraw(model, SEED + int(rms))
    model.tie_weights()
    dest = out / folder
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    ip = GotOcr2ImageProcessorPil(
        do_convert_rgb=True, do_resize=True, size={"height": TILE, "width": TILE}, resample=3, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, image_mean=MEAN, image_std=STD, crop_to_patches=False,
        min_patches=MIN_PATCHES, max_patches=MAX_PATCHES)
    check = InternVLProcessor.check_argument_for_proper_class       # no video processor: None is not checked
    InternVLProcessor.check_argument_for_proper_class = lambda self, name, arg: (
        None if arg is None else check(self, name, arg))
    processor = InternVLProcessor(image_processor=ip, tokenizer=tokenizer, image_seq_length=SEQ_LEN,
                                  chat_template=CHAT_TEMPLATE)
    # saved as the -hf repositories hold it (no video processor: it needs torchvision, absent here)
    ip.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    (dest / "processor_config.json").write_text(json.dumps(
        {"image_seq_length": SEQ_LEN, "processor_class": "InternVLProcessor"}, indent=2) + "\n")
    cfg_json = json.loads((dest / "config.json").read_text())
    files = gemma3_vision.make_images(dest, IMAGES)
    stem = {n: n.rsplit(".", 1)[0] for n in files}
    npy = idefics3.npy

    def per_image(name):
        enc = processor.image_processor(images=[Image.open(files[name])], return_tensors="pt", crop_to_patches=True)
        pv = enc["pixel_values"].float()
        from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas
        w, h = IMAGES[name]
        cols, rows = get_optimal_tiled_canvas((h, w), (TILE, TILE), MIN_PATCHES, MAX_PATCHES)
        with torch.no_grad():
            vis = model.model.vision_tower(pixel_values=pv, output_hidden_states=True)
            feats = model.model.get_image_features(pixel_values=pv).pooler_output
        key = stem[name]
        return {
            "size": [w, h], "tiles_cols_rows": [int(cols), int(rows)], "n_tiles": int(pv.shape[0]),
            "num_patches": int(enc["num_patches"][0]),
            "pixel_values": npy(dest, f"{key}_pixels.npy", pv.numpy()),
            "vision_last_hidden_state": npy(dest, f"{key}_hidden.npy", vis.last_hidden_state.numpy()),
            "n_hidden_states": len(vis.hidden_states),
            "projector_rows": npy(dest, f"{key}_rows.npy", feats.numpy()),
        }

    images = {n: per_image(n) for n in files}
    ref = {
        "folder": folder, "model_class": "InternVLForConditionalGeneration",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "weights_dtype": "float32", "compute_dtype": "float32", "attn_implementation": "eager",
        "image_processor_class": "GotOcr2ImageProcessorPil",
        "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED + int(rms), "input_seed": tiny.INPUT_SEED,
                 "scheme": "tools/make_tiny_internvl.py: redraw()"},
        "notes": NOTES, "config": cfg_json,
        "image_token_id": model.config.image_token_id, "image_seq_length": SEQ_LEN,
        "special_token_ids": {t: processor.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL},
        "images": images, "prompts": [],
    }
    if not rms:
        two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                            {"type": "image"}, {"type": "text", "text": "And in this one?"}]}]
        one = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image"}]}]
        ref["prompts"] = [run_prompt(model, processor, dest, files, "two_images", two,
                                     ["image_wide.png", "image_tall.png"]),
                          run_prompt(model, processor, dest, files, "one_image", one, ["image_square.png"])]
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(folder, {n: (i["tiles_cols_rows"], i["n_tiles"]) for n, i in images.items()},
          [(p["greedy_matches_recompute"], min(p["greedy_top1_minus_top2_per_step"])) for p in ref["prompts"]])


def greedy_without_cache(model, ids: list, pixel_values) -> tuple[list, list]:
    """N_NEW greedy tokens, each from a whole forward of the sequence so far, and each step's top-2 margin."""
    seq, tokens, margins = list(ids), [], []
    for _ in range(N_NEW):
        with torch.no_grad():
            last = model(input_ids=torch.tensor([seq]), pixel_values=pixel_values).logits[0, -1].numpy()
        first, second = np.sort(last)[::-1][:2]
        margins.append(float(first - second))
        tokens.append(int(last.argmax()))
        seq = seq + tokens[-1:]
    return tokens, margins


def run_prompt(model, processor, dest, files, key, messages, images):
    from PIL import Image
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    enc = processor(text=text, images=[Image.open(files[n]) for n in images], return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    with torch.no_grad():
        logits = model(**enc).logits[0].float().numpy()
        gen = model.generate(**enc, max_new_tokens=N_NEW, do_sample=False, use_cache=True, eos_token_id=None,
                             pad_token_id=0)[0, len(ids):].tolist()
    recompute, margins = greedy_without_cache(model, ids, enc["pixel_values"])
    soft = model.config.image_token_id
    pos = [i for i, t in enumerate(ids) if t == soft]
    starts = [p for p in pos if p == 0 or ids[p - 1] != soft]
    ends = [p for p in pos if p + 1 == len(ids) or ids[p + 1] != soft]
    rows = sorted(set(starts + ends + list(range(len(ids) - 3, len(ids)))))
    return {
        "messages": messages, "images": images, "chat_text": text,
        "prompt_text": processor.tokenizer.decode(ids, skip_special_tokens=False),
        "input_ids": ids, "length": len(ids), "n_image_tokens": len(pos),
        "pixel_values_shape": list(enc["pixel_values"].shape),
        "rows": rows, "logits_rows": idefics3.npy(dest, f"{key}_logits_rows.npy", logits[rows]),
        "argmax_per_position": logits.argmax(-1).tolist(),
        "greedy_new_tokens": gen, "greedy_matches_recompute": gen == recompute,
        "greedy_top1_minus_top2_per_step": margins,
    }


def make(out: Path) -> None:
    make_folder(out, "internvl_vision", rms=False)
    make_folder(out, "internvl_rms_vision", rms=True)
    make_folder(out, "internvl_qwen3_vision", rms=False, qwen3=True)      # InternVL 3.5's text model


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

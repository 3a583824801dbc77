"""A tiny random LLaVA-NeXT (LlavaNextForConditionalGeneration: llava's CLIP tower and MLP projector on a base image
and the tiles of an "anyres" grid, the tiles' rows unpadded to the image's aspect with an image_newline row end,
a Llama text decoder), its tokenizer and processor, and transformers reference outputs
(tools/make_tiny_llava.py's format).

    python tools/make_tiny_llava_next.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.
The folder `llava_next_vision`: config.json, model.safetensors, tokenizer, the processor's files, the chat
template, PNG images of odd sizes, reference.json and .npy files (per image its pixel values [1 + tiles, 3, 56,
56], its image_sizes, the packed rows; per prompt a few rows of the whole model's logits).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3
import make_tiny_llava as llava

FOLDER = "llava_next_vision"
PINPOINTS = [[56, 112], [112, 56], [112, 112], [168, 56], [56, 168]]      # (height, width), multiples of 56
IMAGES = {"image_wide.png": (75, 40),     # file: (width, height) -> 112 x 56 (1 x 2 tiles), unpadded rows
          "image_tall.png": (30, 61),     # -> 56 x 112 (2 x 1), unpadded columns
          "image_big.png": (130, 90),     # -> 112 x 112 (2 x 2)
          "image_small.png": (9, 7)}      # -> 112 x 112, scaled up

NOTES = llava.NOTES[:3] + [
    "LLaVA-NeXT (LlavaNextForConditionalGeneration, model_type llava_next): the same CLIP tower and projector as "
    "the llava_vision folder's, image_grid_pinpoints " + json.dumps(PINPOINTS) + " ((height, width)), an "
    "image_newline [64] parameter.",
    "Preprocessing (LlavaNextImageProcessorPil): best = select_best_resolution((h, w), pinpoints): for each "
    "(H, W), scale = min(W / w, H / h), effective = min(int(w * scale) * int(h * scale), w * h), wasted = H * W - "
    "effective; the largest effective, ties the smallest wasted, first wins. The image resized (Pillow BICUBIC) to "
    "get_patch_output_size: if W / w < H / h: (W, min(ceil(h * W / w), H)) else (min(ceil(w * H / h), W), H); "
    "padded with zeros to (H, W), the image at ((W - w') // 2, (H - h') // 2); cut into 56 x 56 tiles row-major. "
    "The base image: the original resized to 56 x 56 (aspect not kept). Each of [base] + tiles then as CLIP's "
    "processor (shortest edge 56 and centre crop 56: the identity here), rescale, normalize.",
    "Rows: every tile and the base through the tower and projector (16 rows each, class dropped). The tiles' "
    "rows as a (H / 56 * 4) x (W / 56 * 4) grid (tile (i, j)'s patch (r, c) at row 4 i + r, column 4 j + c), "
    "unpadded to the image's aspect: if w / h > W' / H' (W', H' the grid's sides): new = int(round(h * W' / w, 7)), "
    "pad = (H' - new) // 2 rows cut from the top and bottom; else the same for the columns; then image_newline "
    "after each row, row-major; the base's 16 rows first. The prompt's '<image>' becomes that many '<image>' "
    "tokens (LlavaNextProcessor._get_number_of_features).",
]


def config(vocab: int):
    from transformers import LlavaNextConfig
    base = llava.config(vocab)
    return LlavaNextConfig(text_config=base.text_config.to_dict(), vision_config=base.vision_config.to_dict(),
                           image_token_index=3, image_grid_pinpoints=PINPOINTS, vision_feature_layer=-2,
                           vision_feature_select_strategy="default", projector_hidden_act="gelu",
                           tie_word_embeddings=False, pad_token_id=4)


def image_processor():
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    S = llava.IMAGE_SIZE
    return LlavaNextImageProcessorPil(
        do_convert_rgb=True, do_resize=True, size={"shortest_edge": S}, resample=3, do_center_crop=True,
        crop_size={"height": S, "width": S}, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=llava.MEAN, image_std=llava.STD, do_pad=True, image_grid_pinpoints=PINPOINTS)


def make(out: Path) -> None:
    import transformers
    from PIL import Image
    from transformers import LlavaNextProcessor
    tokenizer = idefics3.bpe_tokenizer(idefics3.CORPUS, llava.SPECIAL, 512, unk_token="<unk>", bos_token="<s>",
                                       eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    model = transformers.LlavaNextForConditionalGeneration(config(len(tokenizer))).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    llava.redraw(model, llava.SEED)
    with torch.no_grad():
        model.model.image_newline.copy_(torch.randn(64, generator=torch.Generator().manual_seed(7)))
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    LlavaNextProcessor(image_processor=image_processor(), tokenizer=tokenizer, patch_size=llava.PATCH,
                       vision_feature_select_strategy="default", num_additional_image_tokens=1,
                       chat_template=llava.CHAT_TEMPLATE).save_pretrained(dest)
    llava.hub_layout(dest)
    pre = json.loads((dest / "preprocessor_config.json").read_text())
    pre["image_processor_type"] = "LlavaNextImageProcessor"
    (dest / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    processor = transformers.AutoProcessor.from_pretrained(dest)
    processor.image_processor = image_processor()          # the PIL backend
    files = gemma3_vision.make_images(dest, IMAGES)
    images = {}
    for name in files:
        enc = processor.image_processor(images=[Image.open(files[name])], return_tensors="pt")
        key = name.rsplit(".", 1)[0]
        with torch.no_grad():
            rows = model.model.get_image_features(pixel_values=enc["pixel_values"],
                                                  image_sizes=enc["image_sizes"]).pooler_output[0]
        images[name] = {"size": list(IMAGES[name]), "image_sizes": enc["image_sizes"][0].tolist(),
                        "pixel_values": idefics3.npy(dest, f"{key}_pixels.npy", enc["pixel_values"][0].numpy()),
                        "rows": idefics3.npy(dest, f"{key}_rows.npy", rows.numpy()), "n_rows": int(rows.shape[0])}
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                        {"type": "image"}]}]
    prompts = [idefics3.run_prompt(model, processor, dest, files, "two_images", two,
                                   ["image_wide.png", "image_tall.png"], per=1)]
    # LlavaNextProcessor's token counts on llava-v1.6's own settings (336, patch 14, the default pinpoints)
    big = LlavaNextProcessor(image_processor=transformers.models.llava_next.image_processing_pil_llava_next
                             .LlavaNextImageProcessorPil(size={"shortest_edge": 336},
                                                         crop_size={"height": 336, "width": 336}),
                             tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
                             num_additional_image_tokens=1)
    sizes = [(w, h) for w in (1, 17, 200, 336, 500, 672, 1000, 1333, 2048) for h in (1, 30, 336, 480, 700, 1500)]
    counts = [[w, h, big._get_number_of_features(h, w, 336, 336) - 1] for w, h in sizes
              if max(w, h) / min(w, h) <= 8]
    versions = {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
    ref = dict(folder=FOLDER, model_class="LlavaNextForConditionalGeneration", **versions,
               image_processor_class="LlavaNextImageProcessorPil", notes=NOTES,
               config=json.loads((dest / "config.json").read_text()),
               image_token_id=model.config.image_token_id, images=images, prompts=prompts,
               llava_v1_6_counts={"pinpoints": "LlavaNextConfig's default", "image_size": 336, "patch_size": 14,
                                  "width_height_tokens": counts},
               llava_v1_6_pixels={"settings": "LlavaNextImageProcessorPil, 336, the default pinpoints",
                                  "width_height_sha256": llava.real_settings_hashes(big.image_processor)})
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, {n: (i["image_sizes"], i["n_rows"]) for n, i in images.items()},
          "greedy matches recompute:", [p["greedy_matches_recompute"] for p in prompts],
          "min margin", min(min(p["greedy_top1_minus_top2_per_step"]) for p in prompts))


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

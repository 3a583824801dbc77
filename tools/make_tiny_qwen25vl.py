"""A tiny random Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration: the windowed vision transformer with its
patch merger, a Qwen2 text decoder with M-RoPE), its tokenizer and processor, and transformers reference
outputs, in the format of the other tiny folders (tools/make_tiny_idefics3.py).

    python tools/make_tiny_qwen25vl.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

It also writes qwen2_vl_vision/, a vision-only Qwen2-VL (Qwen2VLForConditionalGeneration: LayerNorm, quick-GELU
MLP, no windows) and its tower's rows for one image of the first folder.

The folder is a Hugging Face directory (config.json, model.safetensors, tokenizer files, the processor's
config, the chat template), three PNG test images of odd sizes, reference.json (what each stage gives, the
token ids, the position ids, the notes on the math) and .npy files (float32 arrays named in reference.json):
per image the flattened patches, the tower's rows before the merger (in the image's own patch order) and the
merger's rows (prompt order); for the prompt a few rows of the whole model's logits.
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

FOLDER = "qwen2_5_vl_vision"
SEED = 54                                # of 53..64: varied greedy tokens (62: wider margins, one token repeated)
PATCH, MERGE, TEMPORAL = 14, 2, 2
WINDOW = 56                              # pixels: 56 // 2 // 14 = 2 x 2 merged units a window
MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 16
IMAGES = {"image_wide.png": (150, 90),   # -> 140 x 84 (round to 28s): patches 6 x 10, merged 3 x 5, 6 windows
          "image_big.png": (180, 130),   # 168 x 140 is past max_pixels: scaled down to 112 x 84, merged 3 x 4
          "image_tiny.png": (20, 30)}    # 28 x 28 is under min_pixels: scaled up to 56 x 84, merged 3 x 2
N_NEW = 8
MEAN = [0.48145466, 0.4578275, 0.40821073]     # OPENAI_CLIP_MEAN / STD, the processor's defaults
STD = [0.26862954, 0.26130258, 0.27577711]
PROCESSOR = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH, "merge_size": MERGE,
             "temporal_patch_size": TEMPORAL, "image_mean": MEAN, "image_std": STD, "resample": 3}

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]
# Qwen2-VL's chat template (Qwen/Qwen2.5-VL-*-Instruct), images only: a default system turn, an image part as
# <|vision_start|><|image_pad|><|vision_end|>
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}{% if loop.first and message['role'] "
    "!= 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>"
    "{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or "
    "'image_url' in content %}{% set image_count.value = image_count.value + 1 %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "system You are a helpful assistant. user What is in this image? assistant A cat sitting on a red chair.",
    "Describe the picture in one sentence. The photo shows a small boat on a calm lake near the hills.",
    "Can you read the text on the sign? There are two dogs, three birds and a tree in the garden.",
    "The quick brown fox jumps over the lazy dog. Colours, shapes, lines and letters of an image.",
]

NOTES = [
    "Qwen2_5_VLForConditionalGeneration (model_type qwen2_5_vl). Text decoder: Qwen2 (hidden 64, 2 layers, 4 heads "
    "of 16, 2 kv heads, q/k/v biases, MLP 128 SwiGLU, rms eps 1e-6, rope theta 10000), M-RoPE with mrope_section "
    "[2, 3, 3] (pairs of the 8 rotary pairs: temporal, height, width), untied head (lm_head.weight stored).",
    "Vision tower (Qwen2_5_VisionTransformerPretrainedModel): hidden 32, depth 2, 2 heads of 16, MLP 64 (SwiGLU "
    "with biases: down(silu(gate(x)) * up(x))), patch 14, temporal patch 2, merge 2, window_size 56, "
    "fullatt_block_indexes [1] (block 0 attends within windows, block 1 over the whole image), out_hidden 64.",
    "Preprocessing (Qwen2VLImageProcessorPil, the PIL backend): RGB; smart_resize(h, w, factor 28, min_pixels "
    f"{MIN_PIXELS}, max_pixels {MAX_PIXELS}): h' = round(h / 28) * 28, w' likewise (Python's round: half to "
    "even); if h' w' > max_pixels: beta = sqrt(h w / max_pixels), h' = max(28, floor(h / beta / 28) * 28), w' "
    "likewise; elif h' w' < min_pixels: beta = sqrt(min_pixels / (h w)), h' = ceil(h beta / 28) * 28, w' likewise; "
    "an aspect ratio past 200 is an error. Pillow BICUBIC resize to w' x h' (uint8), x * (1/255) in float64 -> "
    "float32, (x - mean) / std in float32 (CLIP mean and std), channels first [3, h', w'].",
    "Flattened patches: grid_h = h' / 14, grid_w = w' / 14; the image as [C, gh/2, 2, 14, gw/2, 2, 14], transposed "
    "to (gh/2, gw/2, 2, 2, C, 14, 14), the channel's 14 x 14 repeated to (C, T=2, 14, 14): rows "
    "[gh * gw, C*T*14*14 = 1176], each 2 x 2 merge group's 4 patches contiguous (block-major: merged cell (i, j) "
    "row-major, inside it (a, b) row-major; patch row 4 (i * gw/2 + j) + 2 a + b is patch (2i + a, 2j + b)). "
    "grid_thw = [1, gh, gw].",
    "Patch embed: Conv3d(3, 32, kernel = stride = (2, 14, 14), no bias) = each row [1176] (order C, T, y, x) "
    "times weight.reshape(32, 1176)^T.",
    "Vision rotary: inv_freq = 1 / 10000^(arange(0, hd/2, 2) / (hd/2)) (hd = head dim 16: 4 frequencies); each "
    "patch row's (h, w) = its patch's (row, col) in the patch grid; angles [h * inv_freq, w * inv_freq] (8), "
    "duplicated to 16: cos/sin over the whole head with rotate_half pairing (i, i + 8): pairs 0..3 rotate by the "
    "row, pairs 4..7 by the column. Applied to q and k after the qkv projection (with bias), float32.",
    "Windows: vit_merger_window_size = window_size // merge // patch = 2 merged units; the merged grid "
    "(gh/2 x gw/2) padded to multiples of 2, cut into 2 x 2 windows, windows row-major, inside each the merged "
    "cells row-major (padding skipped): window_index (a permutation of the merged cells); the patch rows are "
    "reordered by merged cell (4 rows each) in that order right after the patch embed (the rotary angles too), "
    "windowed blocks attend within each window's rows only (cu_window_seqlens), full blocks over all rows.",
    "Block (pre-norm): x += proj(attn(RMSNorm1(x))) with qkv = Linear(32, 96, bias) laid out [q | k | v] each "
    "[heads, hd]; softmax(q k^T / sqrt(hd)) v, bidirectional; x += mlp(RMSNorm2(x)); RMSNorm: x / sqrt(mean(x^2) "
    "+ 1e-6) * w (eps fixed at 1e-6 in the code).",
    "Merger: ln_q RMSNorm(32, eps 1e-6) per patch row, then each 4 consecutive rows (one merged cell, window "
    "order) concatenated to 128, Linear(128, 128) + bias, GELU (exact, erf), Linear(128, 64) + bias; then the "
    "rows put back in the merged grid's row-major order (argsort of window_index). 'hidden' below is the last "
    "block's output (before ln_q) in the image's own patch order (window order undone, 4 rows per merged cell); "
    "'rows' the merger's output in prompt order.",
    "Prompt: the chat template writes <|vision_start|><|image_pad|><|vision_end|> for an image part; the processor "
    "expands <|image_pad|> to grid_t * grid_h * grid_w / 4 copies; the image's merger rows replace those tokens' "
    "embeddings in order (masked_scatter, no scaling). Attention is causal over everything.",
    "M-RoPE positions (get_rope_index, 3 x seq): a text token's three positions are equal and continue from the "
    "previous token; an image's tokens (the <|image_pad|> run) get (t0, t0 + r, t0 + c) over the merged grid "
    "(r, c row-major), t0 = the position after the preceding token (<|vision_start|>); the next token continues "
    "at max over the image + 1. rope_deltas = max position + 1 - seq length: decode step k (0-based, after the "
    "prompt) has all three positions = seq length + k + rope_deltas.",
    "Text M-RoPE: inv_freq over the 8 pairs as usual (10000^(-2i/16)); pair i takes the temporal position if "
    "i < 2, the height one if i < 5, else the width one (mrope_section [2, 3, 3]); rotate_half pairing.",
    "Tokenizer: a ByteLevel BPE trained by tokenizers' BpeTrainer on a few fixed sentences, vocab 400 (the "
    "model's vocab_size too); ids 0..6 are the special tokens " + ", ".join(SPECIAL) + ". eos <|im_end|>, "
    "pad <|endoftext|>; no BOS.",
    "Logits: model(input_ids, pixel_values, image_grid_thw, mm_token_type_ids) in float32, eager attention; rows "
    "listed in 'rows' (first and last token of each image, the two tokens after each image, the last 3 positions). "
    "greedy_step_logits: the last row's logits of the recompute without cache after each greedy token was appended "
    "(row k: the prompt plus k + 1 new tokens, i.e. the logits that chose new token k + 1; the prompt's last row "
    "chose token 0).",
]


TOKEN_IDS = {"image_token_id": SPECIAL.index("<|image_pad|>"), "video_token_id": SPECIAL.index("<|video_pad|>"),
             "vision_start_token_id": SPECIAL.index("<|vision_start|>"),
             "vision_end_token_id": SPECIAL.index("<|vision_end|>")}


def config(vocab: int):
    from transformers import Qwen2_5_VLConfig
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                tie_word_embeddings=False, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    vision = dict(depth=2, hidden_size=32, hidden_act="silu", intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, tokens_per_second=2,
                  window_size=WINDOW, out_hidden_size=64, fullatt_block_indexes=[1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **TOKEN_IDS, tie_word_embeddings=False)


def make_tokenizer():
    return idefics3.bpe_tokenizer(CORPUS, SPECIAL, 400, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def redraw(model, seed: int, scaled: dict | None = None) -> None:
    """Every parameter from a seeded generator, in named_parameters() order (float32); `scaled`: {name suffix:
    scale} for parameters drawn as scale * N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            scale = next((v for k, v in (scaled or {}).items() if name.endswith(k)), None)
            if ("norm" in name or "ln_q" in name) and name.endswith("weight"):   # norms: x * w, w near 1
                w = 1.0 + 0.1 * r
            elif name.endswith("embed_tokens.weight"):
                w = 0.2 * r
            elif scale is not None:
                w = scale * r
            elif name.endswith("patch_embed.proj.weight"):         # [32, 3, 2, P, P]: fan-in 6 P^2
                w = 2.0 * r / math.sqrt(p[0].numel())
            elif p.dim() == 2:
                w = r / math.sqrt(p.shape[1])
            elif p.dim() == 1:                                     # biases (a LayerNorm's too)
                w = 0.1 * r
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")
            p.copy_(w)


def tiny_model(model_class, cfg, seed: int, scaled: dict | None = None):
    """model_class(cfg) in float32, eval mode, eager attention, its parameters drawn by redraw()."""
    torch.manual_seed(0)
    model = model_class(cfg).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    redraw(model, seed, scaled)
    return model


def tower_outputs(processor, visual, files: dict):
    """(name, flattened patches, grid_thw, the tower's output) of each image in `files` {name: path}."""
    from PIL import Image
    for name in files:
        enc = processor.image_processor(images=[Image.open(files[name])], return_tensors="pt")
        pv, thw = enc["pixel_values"].float(), enc["image_grid_thw"]
        with torch.no_grad():
            yield name, pv, thw, visual(pv, grid_thw=thw)


def image_record(dest: Path, key: str, size: tuple, thw, pv, hidden, rows, proc: dict, extra: dict) -> dict:
    """What reference.json says of one image (its arrays saved as {key}_*.npy): its size (w, h), resized size,
    grid, merged grid, token count, `extra`, the patches, the tower's rows before the merger and the merger's."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    w, h = size
    merge = proc["merge_size"]
    rh, rw = smart_resize(h, w, factor=proc["patch_size"] * merge, min_pixels=proc["min_pixels"],
                          max_pixels=proc["max_pixels"])
    return {"size": [w, h], "resized_wh": [rw, rh], "grid_thw": thw[0].tolist(),
            "merged_grid": [int(thw[0, 1]) // merge, int(thw[0, 2]) // merge],
            "n_tokens": int(thw[0].prod()) // merge ** 2, **extra,
            "pixel_values": npy(dest, f"{key}_patches.npy", pv.numpy()),
            "hidden_before_merger": npy(dest, f"{key}_hidden.npy", hidden.numpy()),
            "merger_rows": npy(dest, f"{key}_rows.npy", rows.numpy())}


def write_reference(dest: Path, folder: str, model_class: str, seed: int, scheme: str, notes: list, cfg_json: dict,
                    proc: dict, ids: dict, processor, images: dict, prompt: dict, text_prompt: dict) -> None:
    """reference.json (`ids`: the image token's id and what else the family adds there), and a summary line."""
    import transformers
    ref = {
        "folder": folder, "model_class": model_class,
        "image_processor_class": "Qwen2VLImageProcessorPil", "attn_implementation": "eager",
        "weights_dtype": "float32", "compute_dtype": "float32",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "init": {"torch_manual_seed": 0, "weight_generator_seed": seed, "input_seed": tiny.INPUT_SEED,
                 "scheme": scheme},
        "notes": notes, "config": cfg_json, "processor": proc, **ids,
        "special_token_ids": {t: processor.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL},
        "images": images, "prompts": [prompt], "text_only": text_prompt,
    }
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(folder, "grids", {n: i["grid_thw"] for n, i in images.items()}, "rope_deltas", prompt["rope_deltas"],
          "greedy matches recompute:", prompt["greedy_matches_recompute"], "min margin",
          min(prompt["greedy_top1_minus_top2_per_step"]), prompt["greedy_new_tokens"])


def processor_files(processor_class, ip, tokenizer, dest: Path, chat_template: str):
    """A processor of `processor_class` (no video processor: it needs torchvision, absent here, so its class
    check is skipped) saved as the Hub's Qwen-VL repositories hold it: preprocessor_config.json, the tokenizer,
    chat_template.json. Returns it and the saved config.json."""
    check = processor_class.check_argument_for_proper_class
    processor_class.check_argument_for_proper_class = lambda self, name, arg: (
        None if arg is None else check(self, name, arg))
    processor = processor_class(image_processor=ip, tokenizer=tokenizer, chat_template=chat_template)
    ip.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": chat_template}, indent=2) + "\n")
    return processor, json.loads((dest / "config.json").read_text())


def save(model, dest: Path):
    """The model saved to `dest` (its old .npy files removed) and the image processor of both folders."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    return dest, Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH,
                                          temporal_patch_size=TEMPORAL, merge_size=MERGE, image_mean=MEAN,
                                          image_std=STD)


def npy(dest: Path, name: str, arr) -> str:
    np.save(dest / name, np.ascontiguousarray(np.asarray(arr, dtype=np.float32)))
    return name


def prompts(model, processor, files: dict, order: list, dest: Path, n_new: int = N_NEW) -> tuple:
    """The reference of a Qwen-VL model on a prompt with two images (`order`, names in `files`) and text after
    each (ids, positions, logits rows, greedy tokens and their margins) and on a text-only prompt."""
    from PIL import Image
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                        {"type": "image"}, {"type": "text", "text": "And in this one?"}]}]
    text = processor.apply_chat_template(two, add_generation_prompt=True)
    enc = processor(text=text, images=[Image.open(files[n]) for n in order], return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    model_inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
                                        "mm_token_type_ids") if k in enc}
    with torch.no_grad():
        pos, deltas = model.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"],
                                                 image_grid_thw=enc["image_grid_thw"],
                                                 attention_mask=enc["attention_mask"])
        logits = model(**model_inputs).logits[0].float().numpy()
        gen = model.generate(**model_inputs, max_new_tokens=n_new, do_sample=False, use_cache=True,
                             eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        seq, recompute, margins, step_logits = list(ids), [], [], []
        for _ in range(n_new):
            t = torch.tensor([seq])
            row = model(input_ids=t, attention_mask=torch.ones_like(t), pixel_values=enc["pixel_values"],
                        image_grid_thw=enc["image_grid_thw"],
                        mm_token_type_ids=torch.tensor([[1 if x == model.config.image_token_id else 0 for x in seq]])
                        ).logits[0, -1].numpy()
            top = np.sort(row)[-2:]
            margins.append(float(top[1] - top[0]))
            step_logits.append(row)
            recompute.append(int(row.argmax()))
            seq.append(recompute[-1])
    image_id = model.config.image_token_id
    at = [i for i, t in enumerate(ids) if t == image_id]
    runs, start = [], at[0]
    for a, b in zip(at, at[1:] + [None]):
        if b != a + 1:
            runs.append((start, a))
            start = b
    rows = sorted(set([r for s, e in runs for r in (s, e, e + 1, e + 2)] + list(range(len(ids) - 3, len(ids)))))
    prompt = {
        "messages": two, "images": order, "chat_text": text,
        "prompt_text": processor.tokenizer.decode(ids, skip_special_tokens=False),
        "input_ids": ids, "length": len(ids), "n_image_tokens": len(at), "image_runs": [list(r) for r in runs],
        "image_grid_thw": enc["image_grid_thw"].tolist(),
        "position_ids": pos[:, 0].tolist(), "rope_deltas": int(deltas.reshape(-1)[0]),
        "rows": rows, "logits_rows": npy(dest, "two_images_logits_rows.npy", logits[rows]),
        "argmax_per_position": logits.argmax(-1).tolist(),
        "greedy_new_tokens": gen, "greedy_matches_recompute": gen == recompute,
        "greedy_top1_minus_top2_per_step": margins,
        "greedy_step_logits": npy(dest, "two_images_greedy_step_logits.npy", np.stack(step_logits)),
    }
    text_only = [{"role": "user", "content": [{"type": "text", "text": "Describe the picture in one sentence."}]}]
    ttext = processor.apply_chat_template(text_only, add_generation_prompt=True)
    tids = processor.tokenizer(ttext, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        tlogits = model(input_ids=tids).logits[0, -3:].float().numpy()
        tgen = model.generate(input_ids=tids, attention_mask=torch.ones_like(tids), max_new_tokens=n_new,
                              do_sample=False, eos_token_id=None, pad_token_id=0)[0, tids.shape[1]:].tolist()
    text_prompt = {"messages": text_only, "chat_text": ttext, "input_ids": tids[0].tolist(),
                   "logits_last3": npy(dest, "text_only_logits_last3.npy", tlogits), "greedy_new_tokens": tgen}
    return prompt, text_prompt


def make(out: Path) -> None:
    import transformers
    from transformers import Qwen2_5_VLProcessor
    from transformers.vision_utils import get_vision_window_index
    tokenizer = make_tokenizer()
    model = tiny_model(transformers.Qwen2_5_VLForConditionalGeneration, config(len(tokenizer)), SEED)
    dest, ip = save(model, out / FOLDER)
    processor, cfg_json = processor_files(Qwen2_5_VLProcessor, ip, tokenizer, dest, CHAT_TEMPLATE)
    files = gemma3_vision.make_images(dest, IMAGES)
    stem = {n: n.rsplit(".", 1)[0] for n in files}
    visual = model.model.visual

    images = {}
    for name, pv, thw, o in tower_outputs(processor, visual, files):
        window_index, cu = get_vision_window_index(thw, MERGE, WINDOW, PATCH)
        inv = torch.argsort(window_index)
        hidden = o.last_hidden_state.reshape(-1, MERGE * MERGE, 32)[inv].reshape(-1, 32)   # image's patch order
        images[name] = image_record(dest, stem[name], IMAGES[name], thw, pv, hidden, o.pooler_output, PROCESSOR,
                                    {"window_index": window_index.tolist(), "cu_window_seqlens": cu.tolist()})

    prompt, text_prompt = prompts(model, processor, files, ["image_wide.png", "image_big.png"], dest)
    image_id = model.config.image_token_id
    write_reference(dest, FOLDER, "Qwen2_5_VLForConditionalGeneration", SEED,
                    "tools/make_tiny_qwen25vl.py: redraw(): norms 1 + 0.1 N(0, 1), matrices N(0, 1) / "
                    "sqrt(fan-in), the patch embedding 2 N(0, 1) / sqrt(1176), biases 0.1 N(0, 1), "
                    "embeddings 0.2 N(0, 1)", NOTES, cfg_json, PROCESSOR, {"image_token_id": image_id}, processor,
                    images, prompt, text_prompt)


QWEN2VL_FOLDER = "qwen2_vl_vision"
QWEN2VL_NOTES = [
    "Qwen2VLForConditionalGeneration (model_type qwen2_vl), vision only: the text model (1 layer, vocab 16) is "
    "there to make a loadable directory; no tokenizer, no prompt.",
    "Vision tower (Qwen2VisionTransformerPretrainedModel): embed_dim 32, depth 2, 2 heads of 16, mlp_ratio 2 (MLP "
    "64), fc2(quick_gelu(fc1(x))) with quick_gelu(u) = u * sigmoid(1.702 u), LayerNorm norm1/norm2 with bias (eps "
    "1e-6), no windows (every block attends over the whole image); the same 2D rotary, patch embed and patches as "
    "Qwen2.5-VL's; merger: ln_q LayerNorm (eps 1e-6, with bias), Linear(128, 128), GELU (erf), Linear(128, 64); "
    "vision_config.hidden_size (64) is the merger's output width.",
    "Image: image_tiny.png of the qwen2_5_vl_vision folder (20 x 30 -> 56 x 84: patches 6 x 4, merged 3 x 2), the "
    "same processor settings.",
]


def make_qwen2vl(out: Path) -> None:
    """A vision-only Qwen2-VL folder: the tower's rows for one image."""
    import transformers
    from PIL import Image
    from transformers import Qwen2VLConfig
    text = dict(vocab_size=16, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                tie_word_embeddings=True, pad_token_id=0, bos_token_id=None, eos_token_id=1)
    vision = dict(depth=2, embed_dim=32, hidden_size=64, hidden_act="quick_gelu", mlp_ratio=2, num_heads=2,
                  in_channels=3, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL)
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=5, video_token_id=6, vision_start_token_id=3,
        vision_end_token_id=4, tie_word_embeddings=True)).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    g = torch.Generator().manual_seed(SEED + 100)
    for name, p in model.named_parameters():      # LayerNorms: w near 1, b near 0 (their "norm" names)
        with torch.no_grad():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * r if "norm" in name and name.endswith("weight") or "ln_q.weight" in name
                    else 0.1 * r if p.dim() == 1 else
                    2.0 * r / math.sqrt(p[0].numel()) if p.dim() == 5 else r / math.sqrt(p.shape[1]))
    dest, ip = save(model, out / QWEN2VL_FOLDER)
    ip.save_pretrained(dest)
    image = out / FOLDER / "image_tiny.png"
    enc = ip(images=[Image.open(image)], return_tensors="pt")
    with torch.no_grad():
        o = model.model.visual(enc["pixel_values"].float(), grid_thw=enc["image_grid_thw"])
    ref = {"folder": QWEN2VL_FOLDER, "model_class": "Qwen2VLForConditionalGeneration",
           "image_processor_class": "Qwen2VLImageProcessorPil", "attn_implementation": "eager",
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED + 100}, "notes": QWEN2VL_NOTES,
           "image": f"../{FOLDER}/image_tiny.png", "patches": f"../{FOLDER}/image_tiny_patches.npy",
           "grid_thw": enc["image_grid_thw"][0].tolist(),
           "hidden_before_merger": npy(dest, "image_tiny_hidden.npy", o.last_hidden_state.numpy()),
           "merger_rows": npy(dest, "image_tiny_rows.npy", o.pooler_output.numpy())}
    assert np.array_equal(enc["pixel_values"].numpy(), np.load(out / FOLDER / "image_tiny_patches.npy"))
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(QWEN2VL_FOLDER, "grid", ref["grid_thw"])


def make_both(out: Path) -> None:
    make(out)
    make_qwen2vl(out)


if __name__ == "__main__":
    tiny.main_one(make_both, __doc__)

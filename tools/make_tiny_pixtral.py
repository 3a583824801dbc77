"""A tiny random Mistral 3 with its Pixtral tower (Mistral3ForConditionalGeneration: the Pixtral vision encoder,
the projector's patch merger, a Mistral text decoder), its tokenizer and processor, and transformers reference
outputs, in the format of the other tiny vision folders (tools/make_tiny_qwen25vl.py).

    python tools/make_tiny_pixtral.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

The folder is a Hugging Face directory (config.json, model.safetensors, tokenizer files, preprocessor_config.json,
processor_config.json, chat_template.json), three PNG images of odd sizes, reference.json (what each stage gives,
the token ids, notes on the math) and .npy files named in it: per image the processed pixels [3, h', w'], the
tower's last hidden state [patches, 32] (row-major over the patch grid) and the projector's rows [cells, 64]
(row-major over the merged grid); for a prompt with two images a few rows of the whole model's logits.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3
import make_tiny_ministral3 as ministral3
import make_tiny_qwen25vl as qwen

FOLDER = "pixtral_vision"
PIXTRAL12B_FOLDER, PIXTRAL12B_PATCH = "pixtral12b_vision", 16     # Pixtral-12B's layout (model_type llava)
MINISTRAL3_FOLDER = "pixtral_ministral3_vision"    # a Ministral 3 text model: the prompt's reference only
SEED = 71
PATCH, MERGE, LONGEST = 14, 2, 112
IMAGES = {"image_wide.png": (150, 90),   # past 112: floor(90 / (150/112)) = 67 -> 84 x 112 (multiples of 28): 6 x 8
          "image_tall.png": (45, 70),    # under 112: each side up to a multiple of 28: 56 x 84: patches 6 x 4
          "image_flat.png": (100, 31)}   # 112 x 56: patches 4 x 8
N_NEW = 8
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Mistral Small 3.1's chat template, reduced: an image part is [IMG], text parts as written
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]{% if message['content'] "
    "is string %}{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' "
    "or 'image' in c or 'image_url' in c %}[IMG]{% elif 'text' in c %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}[/INST]{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}")
CORPUS = [
    "What is in this image? A cat sitting on a red chair near the window.",
    "Describe the picture in one sentence. The photo shows a small boat on a calm lake near the hills.",
    "Can you read the text on the sign? There are two dogs, three birds and a tree in the garden.",
    "The quick brown fox jumps over the lazy dog. Colours, shapes, lines and letters of an image.",
]
PROCESSOR = {"size": {"longest_edge": LONGEST}, "patch_size": {"height": PATCH, "width": PATCH},
             "image_mean": MEAN, "image_std": STD, "resample": 3}

NOTES = [
    "Mistral3ForConditionalGeneration (model_type mistral3). Text decoder: Mistral (hidden 64, 2 layers, 4 heads of "
    "16, 2 kv heads, MLP 128, rms eps 1e-5, rope theta 10000, no sliding window), untied head.",
    "Vision tower (PixtralVisionModel): hidden 32, 2 layers, 2 heads of 16, MLP 64 (down(silu(gate(x)) * up(x)), no "
    "biases anywhere), patch 14, rope_theta 10000 (axial).",
    "Preprocessing (PixtralImageProcessorPil, patch size patch x spatial_merge = 28 as the processor passes it): "
    f"RGB; ratio = max(h / {LONGEST}, w / {LONGEST}); if ratio > 1: h = floor(h / ratio), w = floor(w / ratio); "
    "then each side up to a multiple of 28 ((side - 1) // 28 + 1) * 28 (an image is never enlarged otherwise); "
    "Pillow BICUBIC to w' x h' (uint8), x * (1/255) in float64 -> float32, (x - mean) / std (CLIP's), [3, h', w'].",
    "Patch conv (no bias): patch (r, c) of the grid h'/14 x w'/14, its [3, 14, 14] values times "
    "patch_conv.weight.reshape(32, 588)^T; rows row-major; ln_pre RMSNorm (eps 1e-5).",
    "2D RoPE: d = 16; f = 1 / 10000^(arange(0, d, 2) / d) (8); row frequencies f[0::2], column frequencies f[1::2]; "
    "angles [r * f[0::2], c * f[1::2]] (8) for patch (r, c), duplicated; rotate_half pairs (i, i + 8).",
    "Blocks: x += o(attn(attention_norm(x))) with q, k, v, o no bias, bidirectional within the image; x += "
    "feed_forward(ffn_norm(x)); RMSNorm eps 1e-5. 'hidden' = the last layer's output (vision_feature_layer -1).",
    "Projector (Mistral3MultiModalProjector): RMSNorm (eps = text rms_norm_eps 1e-5) per patch row; patch merger: "
    "the grid as [32, gh, gw], unfold(kernel 2, stride 2): merged cell (i, j) row-major, its row the 2 x 2 block's "
    "values channel-major: index ch * 4 + 2 a + b for patch (2i + a, 2j + b); merging_layer Linear(128, 32), no bias; "
    "linear_1 (32 -> 64), GELU (erf), linear_2 (64 -> 64), no biases (multimodal_projector_bias false).",
    "Prompt: the template writes [IMG]; the processor expands it to rows of [IMG] x (w' / 28), each row followed by "
    "[IMG_BREAK] but the last, which ends with [IMG_END]; the [IMG] tokens' embeddings are the projector's rows in "
    "order (masked_scatter), causal attention, plain 1D positions.",
    "Tokenizer: ByteLevel BPE trained on a few sentences, vocab 512 (the model's too); ids 0..7: " + ", ".join(SPECIAL)
    + "; bos <s>, eos </s>.",
]

MINISTRAL3_NOTE = (
    "pixtral_ministral3_vision: the same tower, processor and tokenizer with a Ministral 3 text model (model_type "
    "ministral3: make_tiny_ministral3.py's rope_parameters, YaRN with theta 100 and factor 16 over an original 16 "
    "positions, llama_4_scaling_beta 0.1: each query row at position p scaled by 1 + 0.1 ln(1 + floor(p / 16)), so "
    "the 41-token prompt crosses two steps); weights drawn anew by the same scheme and seed; only the prompt's "
    "reference (the tower's arrays are pixtral_vision's folder's kind, not repeated here).")

PIXTRAL12B_NOTE = (
    "pixtral12b_vision: Pixtral-12B's layout, LlavaForConditionalGeneration (model_type llava) with the Pixtral tower: "
    "patches of 16, hidden_act gelu (exact) in the blocks, vision_feature_layer -1 with vision_feature_select_strategy "
    "full (no CLS to drop), LlavaMultiModalProjector: linear_1 (32 -> 64, bias), GELU, linear_2 (64 -> 64, bias), no "
    "norm and no patch merger; the processor's patch 16, spatial_merge_size 1: [IMG] rows of w' / 16 tokens.")


def config(vocab: int, text_type: str = "mistral", llava: bool = False):
    from transformers import LlavaConfig, Mistral3Config
    text = dict(model_type=text_type, vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if text_type == "ministral3":      # make_tiny_ministral3's YaRN and query temperature (stepping every 16)
        text.pop("rope_theta")
        text.update(rope_parameters=dict(ministral3.ROPE), max_position_embeddings=256)
    vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, head_dim=16, patch_size=PATCH, image_size=LONGEST, hidden_act="silu",
                  rope_theta=10000.0)
    if llava:                          # Pixtral-12B's: patches of 16, exact GELU blocks, LLaVA's projector
        vision.update(patch_size=PIXTRAL12B_PATCH, hidden_act="gelu")
        return LlavaConfig(text_config=text, vision_config=vision, image_token_index=SPECIAL.index("[IMG]"),
                           projector_hidden_act="gelu", vision_feature_layer=-1, vision_feature_select_strategy="full",
                           multimodal_projector_bias=True, tie_word_embeddings=False)
    return Mistral3Config(text_config=text, vision_config=vision, image_token_index=SPECIAL.index("[IMG]"),
                          spatial_merge_size=MERGE, projector_hidden_act="gelu", vision_feature_layer=-1,
                          multimodal_projector_bias=False, tie_word_embeddings=False)


def image_text(height: int, width: int, f: int = PATCH * MERGE) -> str:
    """PixtralProcessor.replace_image_token: rows of [IMG] x (w / f), each ended by [IMG_BREAK], the last by
    [IMG_END] (f = patch x spatial_merge_size)."""
    return ("[IMG]" * (width // f) + "[IMG_BREAK]") * (height // f - 1) + "[IMG]" * (width // f) + "[IMG_END]"


def jinja_render(template: str, messages: list, tokenizer) -> str:
    import jinja2
    return jinja2.Environment().from_string(template).render(messages=messages, bos_token=tokenizer.bos_token,
                                                             eos_token=tokenizer.eos_token)


def make_all(out: Path) -> None:
    make(out)
    make(out, MINISTRAL3_FOLDER, "ministral3")
    make(out, PIXTRAL12B_FOLDER)


def make(out: Path, folder: str = FOLDER, text_type: str = "mistral") -> None:
    """One folder: Mistral 3 (FOLDER, MINISTRAL3_FOLDER: text_type ministral3) or Pixtral-12B's LLaVA layout."""
    import transformers
    from PIL import Image
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil
    tokenizer = idefics3.bpe_tokenizer(CORPUS, SPECIAL, 512, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                       pad_token="<unk>")
    llava = folder == PIXTRAL12B_FOLDER
    patch, merge = (PIXTRAL12B_PATCH, 1) if llava else (PATCH, MERGE)
    model_class = transformers.LlavaForConditionalGeneration if llava else transformers.Mistral3ForConditionalGeneration
    model = qwen.tiny_model(model_class, config(len(tokenizer), text_type, llava), SEED,
                            {"patch_conv.weight": 2.0 / (3 * patch * patch) ** 0.5})
    dest = out / folder
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    ip = PixtralImageProcessorPil(size={"longest_edge": LONGEST}, patch_size={"height": patch, "width": patch},
                                  image_mean=MEAN, image_std=STD)
    ip.save_pretrained(dest)          # preprocessor_config.json (its patch_size the tower's, as on the Hub)
    tokenizer.save_pretrained(dest)
    # PixtralProcessor needs torchvision (absent here): its config as the Hub's repositories hold it, its
    # expansion of [IMG] written out below as its replace_image_token does it
    (dest / "processor_config.json").write_text(json.dumps(
        {"image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]", "image_token": "[IMG]",
         "patch_size": patch, "processor_class": "PixtralProcessor", "spatial_merge_size": merge}, indent=2) + "\n")
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    cfg_json = json.loads((dest / "config.json").read_text())
    files = gemma3_vision.make_images(dest, IMAGES)

    images = {}
    for name, path in files.items() if folder != MINISTRAL3_FOLDER else ():
        key = name.rsplit(".", 1)[0]
        enc = ip(images=[Image.open(path)], patch_size={"height": patch * merge, "width": patch * merge},
                 return_tensors="pt")
        pv, sizes = enc["pixel_values"].float(), enc["image_sizes"]
        with torch.no_grad():
            o = model.model.vision_tower(pv, image_sizes=sizes, output_hidden_states=True)
            feats = model.model.get_image_features(pixel_values=pv, image_sizes=sizes, return_dict=True)
        h, w = (int(v) for v in sizes[0])
        images[name] = {"size": list(IMAGES[name]), "resized_hw": [h, w], "patch_grid": [h // patch, w // patch],
                        "merged_grid": [h // patch // merge, w // patch // merge],
                        "n_hidden_states": len(o.hidden_states),
                        "pixel_values": qwen.npy(dest, f"{key}_pixels.npy", pv[0, :, :h, :w].numpy()),
                        "hidden": qwen.npy(dest, f"{key}_hidden.npy", o.last_hidden_state[0].numpy()),
                        "projector_rows": qwen.npy(dest, f"{key}_rows.npy", feats.pooler_output[0].numpy())}

    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                        {"type": "image"}, {"type": "text", "text": "And in this one?"}]}]
    order = ["image_wide.png", "image_flat.png"]
    text = jinja_render(CHAT_TEMPLATE, two, tokenizer)
    pil = [Image.open(files[n]) for n in order]
    enc = ip(images=pil, patch_size={"height": patch * merge, "width": patch * merge}, return_tensors="pt")
    parts = text.split("[IMG]")
    sizes = enc["image_sizes"].tolist()
    expanded = parts[0] + "".join(image_text(*size, patch * merge) + after for size, after in zip(sizes, parts[1:]))
    enc.update(tokenizer(expanded, add_special_tokens=False, return_tensors="pt"))
    ids = enc["input_ids"][0].tolist()
    inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_sizes")}
    with torch.no_grad():
        logits = model(**inputs).logits[0].float().numpy()
        gen = model.generate(**inputs, max_new_tokens=N_NEW, do_sample=False, use_cache=True, eos_token_id=None,
                             pad_token_id=0)[0, len(ids):].tolist()
        seq, last_rows = list(ids), []        # a recompute without cache after each greedy token
        for _ in range(N_NEW):
            t = torch.tensor([seq])
            last_rows.append(model(input_ids=t, attention_mask=torch.ones_like(t), pixel_values=enc["pixel_values"],
                                   image_sizes=enc["image_sizes"]).logits[0, -1].numpy())
            seq.append(int(last_rows[-1].argmax()))
    top2 = np.sort(np.stack(last_rows), axis=-1)[:, -2:]
    margins, recompute = (top2[:, 1] - top2[:, 0]).tolist(), seq[len(ids):]
    img = model.config.image_token_id
    at = [i for i, t in enumerate(ids) if t == img]
    rows = sorted(set(at[:2] + at[-2:] + list(range(len(ids) - 3, len(ids)))))
    prompt = {"messages": two, "images": order, "chat_text": text,
              "prompt_text": tokenizer.decode(ids, skip_special_tokens=False), "input_ids": ids, "length": len(ids),
              "n_image_tokens": len(at), "image_sizes": enc["image_sizes"].tolist(),
              "rows": rows, "logits_rows": qwen.npy(dest, "two_images_logits_rows.npy", logits[rows]),
              "argmax_per_position": logits.argmax(-1).tolist(), "greedy_new_tokens": gen,
              "greedy_matches_recompute": gen == recompute, "greedy_top1_minus_top2_per_step": margins}
    ref = {"folder": folder, "model_class": model_class.__name__,
           "image_processor_class": "PixtralImageProcessorPil", "attn_implementation": "eager",
           "weights_dtype": "float32", "compute_dtype": "float32",
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED,
                    "scheme": "tools/make_tiny_qwen25vl.py's redraw(): norms 1 + 0.1 N(0, 1), matrices N(0, 1) / "
                              "sqrt(fan-in), the patch conv 2 N(0, 1) / sqrt(3 patch^2), biases 0.1 N(0, 1), "
                              "embeddings 0.2 N(0, 1)"},
           "notes": NOTES + {FOLDER: [], MINISTRAL3_FOLDER: [MINISTRAL3_NOTE], PIXTRAL12B_FOLDER: [PIXTRAL12B_NOTE]}[folder],
           "config": cfg_json, "processor": PROCESSOR,
           "special_token_ids": {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL},
           "images": images, "prompt": prompt}
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(folder, {n: i["patch_grid"] for n, i in images.items()}, "tokens", len(ids), "greedy matches recompute:",
          gen == recompute, "min margin", min(margins), gen)


if __name__ == "__main__":
    tiny.main_one(make_all, __doc__)

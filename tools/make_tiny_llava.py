"""A tiny random LLaVA 1.5 (LlavaForConditionalGeneration: a CLIP ViT tower, the two-layer MLP projector, a Llama
text decoder), its tokenizer and processor, and transformers reference outputs, in the format of the other tiny
folders (tools/make_tiny_idefics3.py).

    python tools/make_tiny_llava.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

Two folders: `llava_vision` (the whole model: config.json, model.safetensors, tokenizer, the processor's files as the
llava-hf repositories have them, the chat template, PNG test images of odd sizes, reference.json and .npy
files: per image the pixel values, every hidden state of the tower and the projector's rows; per prompt a few
rows of the whole model's logits) and `llava_layers_vision` (the same tower shape with a list of feature layers, the
"full" strategy and a projector without bias: one image's rows).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3

FOLDER, LAYERS_FOLDER = "llava_vision", "llava_layers_vision"
SEED = 53
IMAGE_SIZE, PATCH = 56, 14              # 4 x 4 = 16 patches (+ the class token)
TOKENS = (IMAGE_SIZE // PATCH) ** 2     # "default" strategy: the class token dropped
IMAGES = {"image_wide.png": (75, 40),   # file: (width, height): shortest edge to 56 (105 x 56), centre crop
          "image_tall.png": (30, 61),   # -> 56 x 113 -> crop
          "image_small.png": (9, 7)}    # -> 72 x 56 (up) -> crop
MEAN = [0.48145466, 0.4578275, 0.40821073]       # OpenAI CLIP's (llava-hf's preprocessor_config.json)
STD = [0.26862954, 0.26130258, 0.27577711]
SPECIAL = ["<unk>", "<s>", "</s>", "<image>", "<pad>"]
# llava-hf/llava-1.5-7b-hf's chat template (its generation markers left out)
CHAT_TEMPLATE = ("{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
                 "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
                 "{{ '<image>\n' }}{% endfor %}{% for content in message['content'] | selectattr('type', 'equalto', "
                 "'text') %}{{ content['text'] + ' '}}{% endfor %}{% endfor %}{% if add_generation_prompt %}"
                 "{{ 'ASSISTANT:' }}{% endif %}")

NOTES = [
    "LlavaForConditionalGeneration (model_type llava, LLaVA 1.5 as llava-hf converts it). Text decoder: a Llama "
    "(hidden 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 128, rope theta 10000, rms eps 1e-5), untied head, "
    "vocab 512 (the tokenizer's).",
    "Vision tower: CLIPVisionModel (model_type clip_vision_model): image 56, patch 14 (4 x 4 patches), hidden 32, "
    "3 layers, 2 heads, MLP 64, quick_gelu (x * sigmoid(1.702 x)), LayerNorm eps 1e-5. Embeddings: patch conv "
    "WITHOUT bias, the class embedding [32] first, then the patches row-major; learned positions [17, 32] added "
    "(position 0 the class token); pre_layrnorm; pre-LN blocks (layer_norm1, q/k/v/out with bias, layer_norm2, "
    "fc1 -> quick_gelu -> fc2). hidden_states[0] is the pre_layrnorm output, hidden_states[i] block i-1's output; "
    "post_layernorm is not used by LLaVA.",
    "Features: vision_feature_layer -2 (hidden_states[2] of 4: after 2 of the 3 blocks), strategy 'default' drops "
    "the class token: 16 rows of 32. Projector: linear_1 (32 -> 64, bias), GELU (exact, erf), linear_2 (64 -> 64, "
    "bias). llava_layers_vision: vision_feature_layer [-3, -1] (hidden_states[1] and [3], concatenated along the "
    "features in that order), strategy 'full' (17 rows: the class token kept, first), no projector bias.",
    "Preprocessing (CLIPImageProcessorPil, this folder's preprocessor_config.json): RGB; resize the shortest edge "
    "to 56 (the other int(56 * long / short)) with Pillow BICUBIC (resample 3), uint8; centre crop 56 x 56 (top = "
    "(h - 56) // 2, left = (w - 56) // 2); x * (1/255) (float64 -> float32), (x - mean) / std in float32 with "
    "OpenAI CLIP's mean and std; channels first. 'pad' in reference.json: LlavaImageProcessorPil with do_pad true "
    "(the image first padded to a square of its longer side, centred at (long - short) // 2, filled with "
    "int(mean * 255) per channel), then the same.",
    "Prompt: each '<image>' of the text becomes 16 '<image>' tokens (LlavaProcessor: patches + "
    "num_additional_image_tokens 1 - 1 for 'default'); their input embeddings are replaced, in order, by the "
    "projector's rows (no scaling). Causal attention over everything.",
    "Tokenizer: a ByteLevel BPE trained by tokenizers' BpeTrainer on a few fixed sentences, vocab 512; ids 0..4 "
    "are " + ", ".join(SPECIAL) + ". bos <s>, eos </s>, pad <pad>; no BOS added (the ids are the processor's).",
    "Logits: model(input_ids, pixel_values) in float32, eager attention; rows listed in 'rows' of each prompt "
    "(the first and last image token of each image, the last 3 positions).",
]


def config(vocab: int, layer=-2, strategy="default", bias=True):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
    text = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        pad_token_id=4, bos_token_id=1, eos_token_id=2)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                              num_channels=3, image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="quick_gelu",
                              layer_norm_eps=1e-5, projection_dim=16)
    return LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=3,
                       vision_feature_layer=layer, vision_feature_select_strategy=strategy,
                       multimodal_projector_bias=bias, projector_hidden_act="gelu", tie_word_embeddings=False,
                       image_seq_length=TOKENS, pad_token_id=4)


def redraw(model, seed: int) -> None:
    """gemma3_vision.redraw's draws, then CLIP's own: pre_layrnorm as a LayerNorm, the class embedding larger."""
    gemma3_vision.redraw(model, seed, rms_norm=lambda r: 1.0 + 0.1 * r)
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if "pre_layrnorm" in name:
                r = torch.randn(p.shape, generator=g)
                p.copy_((1.0 + 0.1 * r) if name.endswith("weight") else 0.1 * r)
            elif name.endswith("class_embedding"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))


def make_model(cfg):
    import transformers
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(cfg).float().eval()
    for c in (model.config, model.config.text_config, model.config.vision_config):
        c._attn_implementation = "eager"
    redraw(model, SEED)
    return model


def image_processor(pad: bool = False):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil
    kw = dict(do_convert_rgb=True, do_resize=True, size={"shortest_edge": IMAGE_SIZE}, resample=3,
              do_center_crop=True, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_rescale=True,
              rescale_factor=1 / 255, do_normalize=True, image_mean=MEAN, image_std=STD)
    return LlavaImageProcessorPil(do_pad=True, **kw) if pad else CLIPImageProcessorPil(**kw)


def image_processor_336():
    """llava-hf/llava-1.5-7b-hf's image processor settings (its preprocessor_config.json)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    return CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}, resample=3,
                                 image_mean=MEAN, image_std=STD)


def hub_layout(dest: Path) -> None:
    """The processor's files as llava-hf's repositories have them: preprocessor_config.json (a CLIPImageProcessor),
    processor_config.json (patch_size, vision_feature_select_strategy, num_additional_image_tokens),
    chat_template.json."""
    both = json.loads((dest / "processor_config.json").read_text())
    pre = dict(both.pop("image_processor"), processor_class=both["processor_class"])
    pre["image_processor_type"] = "CLIPImageProcessor"
    (dest / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    (dest / "processor_config.json").write_text(json.dumps(both, indent=2) + "\n")
    template = (dest / "chat_template.jinja").read_text()
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
    (dest / "chat_template.jinja").unlink()


def tower_outputs(model, dest, files, name, key, processor):
    from PIL import Image
    pv = processor(images=[Image.open(files[name])], return_tensors="pt")["pixel_values"].float()
    with torch.no_grad():
        hs = model.model.vision_tower(pixel_values=pv, output_hidden_states=True).hidden_states
        rows = model.model.get_image_features(pixel_values=pv).pooler_output[0]
    return {"size": list(IMAGES[name]),
            "pixel_values": idefics3.npy(dest, f"{key}_pixels.npy", pv[0].numpy()),
            "hidden_states": idefics3.npy(dest, f"{key}_hidden_states.npy", torch.stack(hs)[:, 0].numpy()),
            "rows": idefics3.npy(dest, f"{key}_rows.npy", rows.numpy())}


REAL_SIZES = [(500, 375), (640, 480), (200, 800), (337, 335), (1000, 40), (7, 9)]     # (width, height)


def pattern(w: int, h: int) -> np.ndarray:
    """A deterministic RGB test image (uint8 [h, w, 3]) that llambda's tests make the same way."""
    return (np.arange(h * w * 3, dtype=np.int64) * 37 % 251).astype(np.uint8).reshape(h, w, 3)


def real_settings_hashes(processor) -> list:
    """[width, height, sha256 of the float32 pixel values] of pattern() images through `processor` (a real
    checkpoint's 336 settings): llambda's preprocessing is checked bit for bit without storing the arrays."""
    import hashlib
    from PIL import Image
    out = []
    for w, h in REAL_SIZES:
        pv = processor(images=[Image.fromarray(pattern(w, h))], return_tensors="np")["pixel_values"][0]
        out.append([w, h, hashlib.sha256(np.ascontiguousarray(pv, np.float32).tobytes()).hexdigest()])
    return out


def make(out: Path) -> None:
    import transformers
    from transformers import LlavaProcessor
    tokenizer = idefics3.bpe_tokenizer(idefics3.CORPUS, SPECIAL, 512, unk_token="<unk>", bos_token="<s>",
                                       eos_token="</s>", pad_token="<pad>")
    model = make_model(config(len(tokenizer)))
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    LlavaProcessor(image_processor=image_processor(), tokenizer=tokenizer, patch_size=PATCH,
                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                   chat_template=CHAT_TEMPLATE).save_pretrained(dest)
    hub_layout(dest)
    processor = transformers.AutoProcessor.from_pretrained(dest)
    assert type(processor.image_processor).__name__.startswith("CLIPImageProcessor"), type(processor.image_processor)
    processor.image_processor = image_processor()          # the PIL backend (transformers 5's default is torchvision)
    files = gemma3_vision.make_images(dest, IMAGES)
    stem = {n: n.rsplit(".", 1)[0] for n in files}
    images = {n: tower_outputs(model, dest, files, n, stem[n], processor.image_processor) for n in files}
    pad = {n: tower_outputs(model, dest, files, n, stem[n] + "_pad", image_processor(pad=True))
           for n in ("image_wide.png", "image_tall.png")}

    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                        {"type": "image"}]}]
    one = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image"}]}]
    prompts = [idefics3.run_prompt(model, processor, dest, files, key, msgs, names, per=TOKENS)
               for key, msgs, names in (("two_images", two, ["image_wide.png", "image_tall.png"]),
                                        ("one_image", one, ["image_small.png"]))]
    versions = {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
    ref = dict(folder=FOLDER, model_class="LlavaForConditionalGeneration", image_processor_class="CLIPImageProcessorPil",
               weights_dtype="float32", compute_dtype="float32", attn_implementation="eager", **versions,
               init={"torch_manual_seed": 0, "weight_generator_seed": SEED, "input_seed": tiny.INPUT_SEED,
                     "scheme": "tools/make_tiny_gemma3_vision.py: redraw(), pre_layrnorm as a LayerNorm, "
                               "class_embedding 0.5 N(0, 1)"},
               notes=NOTES, config=json.loads((dest / "config.json").read_text()),
               image_token_id=model.config.image_token_id, tokens_per_image=TOKENS, images=images,
               pad={"processor_change": {"class": "LlavaImageProcessorPil", "do_pad": True}, "images": pad},
               prompts=prompts,
               llava_1_5_pixels={"settings": "CLIPImageProcessorPil, shortest edge 336, crop 336, bicubic",
                                 "width_height_sha256": real_settings_hashes(image_processor_336())})
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")

    # the feature-layer list, the full strategy, no projector bias: the tower's rows of one image
    layers = make_model(config(len(tokenizer), layer=[-3, -1], strategy="full", bias=False))
    ldest = out / LAYERS_FOLDER
    ldest.mkdir(parents=True, exist_ok=True)
    for old in ldest.glob("*.npy"):
        old.unlink()
    layers.save_pretrained(ldest, safe_serialization=True)
    image_processor().save_pretrained(ldest)
    lfiles = gemma3_vision.make_images(ldest, {"image_wide.png": IMAGES["image_wide.png"]})
    lref = {"folder": LAYERS_FOLDER, "model_class": "LlavaForConditionalGeneration",
            "transformers_version": transformers.__version__, "notes": NOTES,
            "images": {"image_wide.png": tower_outputs(layers, ldest, lfiles, "image_wide.png", "image_wide",
                                                       image_processor())}}
    (ldest / "reference.json").write_text(json.dumps(lref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, "greedy matches recompute:", [p["greedy_matches_recompute"] for p in prompts],
          "min margin", min(min(p["greedy_top1_minus_top2_per_step"]) for p in prompts))


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

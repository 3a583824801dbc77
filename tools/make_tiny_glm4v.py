"""A tiny random GLM-4.1V (Glm4vForConditionalGeneration: the vision transformer with its post-conv RMSNorm,
learned positions resampled by bicubic grid_sample, downsample convolution and SwiGLU merger; a GLM-4 text decoder
with M-RoPE over adjacent pairs of a partial rotary), its tokenizer and processor, and transformers reference
outputs, in the format of the other tiny folders (tools/make_tiny_qwen25vl.py, whose helpers it uses).

    python tools/make_tiny_glm4v.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.
The folder (glm4v_vision) holds the Hugging Face directory, three PNG images of odd sizes, reference.json and
.npy files: per image the flattened patches, the downsampled rows (before the merger) and the merger's rows; for
a two-image prompt a few rows of the whole model's logits and the greedy tokens; for a text-only prompt its last
logits.
"""
from __future__ import annotations

from pathlib import Path

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3
import make_tiny_qwen25vl as qwen25vl
from make_tiny_qwen25vl import npy

FOLDER = "glm4v_vision"
SEED = 41
PATCH, MERGE, TEMPORAL = 14, 2, 2
IMAGE_SIZE = 56                          # vision_config.image_size: a 4 x 4 learned position grid
# the processor compares 2 (temporal) x h x w with its bounds
MIN_PIXELS, MAX_PIXELS = 2 * 28 * 28 * 4, 2 * 28 * 28 * 16
IMAGES = {"image_wide.png": (150, 90),   # -> 140 x 84: patches 6 x 10, merged 3 x 5
          "image_big.png": (180, 130),   # 2 x 168 x 140 past max_pixels: scaled down to 112 x 84, merged 3 x 4
          "image_thin.png": (20, 30)}    # a side under 28: scaled to 28 x 42 first, then up past min_pixels to
                                         # 56 x 84: merged 3 x 2
N_NEW = 8
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
PROCESSOR = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH, "merge_size": MERGE,
             "temporal_patch_size": TEMPORAL, "image_mean": MEAN, "image_std": STD, "resample": 3}
TEXT_HIDDEN = 64
SPECIAL = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>",
           "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
TOKEN_IDS = {"image_token_id": SPECIAL.index("<|image|>"), "video_token_id": SPECIAL.index("<|video|>"),
             "image_start_token_id": SPECIAL.index("<|begin_of_image|>"),
             "image_end_token_id": SPECIAL.index("<|end_of_image|>"),
             "video_start_token_id": SPECIAL.index("<|begin_of_video|>"),
             "video_end_token_id": SPECIAL.index("<|end_of_video|>")}
# GLM-4.1V's chat template cut to images and plain turns
CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- for message in messages %}<|{{ message['role'] }}|>\n{%- if message['content'] is string %}"
    "{{ message['content'] }}{%- else %}{%- for content in message['content'] %}{%- if content['type'] == 'image' "
    "or 'image' in content or 'image_url' in content %}<|begin_of_image|><|image|><|end_of_image|>{%- elif 'text' "
    "in content %}{{ content['text'] }}{%- endif %}{%- endfor %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n{%- endif %}")
CORPUS = qwen25vl.CORPUS

NOTES = [
    "Glm4vForConditionalGeneration (model_type glm4v). Text decoder (Glm4vTextModel): GLM-4 layers (hidden 64, 3 "
    "layers, 2 heads of 32, 1 kv head, q/k/v biases, o_proj without, gate_up_proj SwiGLU 96, sandwich norms "
    "post_self_attn_layernorm / post_mlp_layernorm, rms eps 1e-5), partial_rotary_factor 0.5 (16 of 32 dims, 8 "
    "pairs), M-RoPE mrope_section [2, 3, 3] CONTIGUOUS (pairs 0-1 temporal, 2-4 height, 5-7 width), each pair "
    "ADJACENT (2i, 2i + 1: repeat_interleave(2) and rotate_half_llm), untied head.",
    "Vision tower (Glm4vVisionModel): hidden 32, depth 2, 2 heads of 16, no qkv bias (attention_bias false), "
    "proj without bias; blocks pre-norm with RMSNorm (eps rms_norm_eps 1e-5); the block MLP is SwiGLU WITHOUT "
    "biases of width out_hidden_size (64), not intermediate_size; patch 14, temporal 2, merge 2, image_size 56 "
    "(a 4 x 4 learned position grid), out_hidden 64, intermediate_size 48 (the merger's SwiGLU width).",
    "Preprocessing (Glm4vImageProcessorPil): smart_resize(num_frames = 2, h, w, factor 28): if a side is under 28, "
    "scale = max(28 / h, 28 / w), h = int(h scale), w = int(w scale); then h' = round(h / 28) 28, w' likewise; "
    "if 2 h' w' > max_pixels: beta = sqrt(2 h w / max_pixels), sides floor(side / beta / 28) 28 (at least 28); "
    "elif 2 h' w' < min_pixels: beta = sqrt(min_pixels / (2 h w)), sides ceil(side beta / 28) 28. Pillow "
    "BICUBIC, rescale, CLIP normalize, patches as Qwen2-VL's (merge groups together, temporal copies).",
    "Tower: Conv3d patch embed WITH bias; post_conv_layernorm RMSNorm; then the learned positions: the 4 x 4 grid "
    "sampled with F.grid_sample(bicubic, align_corners false, padding border) at x = ((c + 0.5) / gw) 2 - 1, "
    "y = ((r + 0.5) / gh) 2 - 1 (patch (r, c) of a gh x gw grid), float32, added; 2D rotary as Qwen2-VL's "
    "(theta 10000); blocks; post_layernorm RMSNorm; downsample: each merge cell's 4 rows as a [32, 2, 2] image, "
    "Conv2d(32, 64, 2, stride 2) with bias -> 64 ('hidden_before_merger'); merger: proj Linear(64, 64) no bias, "
    "LayerNorm(64, eps 1e-5) with bias, exact GELU, down(silu(gate(x)) * up(x)) 64 -> 48 -> 64 no biases "
    "('merger_rows'), cells row-major (no windows).",
    "Prompt: the template writes <|begin_of_image|><|image|><|end_of_image|>; the processor repeats <|image|> "
    "merged h x merged w times; the rows replace those embeddings. M-RoPE positions (get_rope_index): as "
    "Qwen2-VL's: the image's tokens (t0, t0 + r, t0 + c), the next text at t0 + max(merged h, merged w).",
] + qwen25vl.NOTES[-1:]


def config(vocab: int):
    from transformers import Glm4vConfig
    text = dict(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                 "partial_rotary_factor": 0.5},
                tie_word_embeddings=False, eos_token_id=0, pad_token_id=0)
    vision = dict(depth=2, hidden_size=32, hidden_act="silu", intermediate_size=48, num_heads=2, in_channels=3,
                  image_size=IMAGE_SIZE, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  out_hidden_size=TEXT_HIDDEN, rms_norm_eps=1e-5, attention_bias=False)
    return Glm4vConfig(text_config=text, vision_config=vision, **TOKEN_IDS, tie_word_embeddings=False)


def make_tokenizer():
    return idefics3.bpe_tokenizer(CORPUS, SPECIAL, 512, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


POSITION_GRIDS = [(6, 10), (6, 4), (2, 2), (4, 4), (8, 8), (12, 6), (2, 14)]


def position_samples(dest: Path) -> dict:
    """Glm4vVisionEmbeddings' resampling alone: a seeded 4 x 4 grid of 8 values (positions.npy) sampled by
    F.grid_sample (bicubic, align_corners False, border) at each patch of the POSITION_GRIDS, in the patches'
    block-major order (merge 2), as the model computes it (float32)."""
    import torch
    import torch.nn.functional as F
    from transformers.vision_utils import get_vision_position_ids
    g = torch.Generator().manual_seed(SEED + 7)
    grid = torch.randn(16, 8, generator=g)
    out = {"grid": npy(dest, "positions.npy", grid.numpy()), "samples": {}}
    for gh, gw in POSITION_GRIDS:
        pos = get_vision_position_ids(torch.tensor([[1, gh, gw]]), MERGE)
        h, w = pos[:, 0].float(), pos[:, 1].float()
        th, tw = torch.full_like(h, gh), torch.full_like(w, gw)
        sample = torch.stack((((w + 0.5) / tw) * 2 - 1, ((h + 0.5) / th) * 2 - 1), -1)[None, :, None]
        img = grid.view(4, 4, 8).permute(2, 0, 1)[None]
        rows = F.grid_sample(img, sample, mode="bicubic", align_corners=False, padding_mode="border")
        out["samples"][f"{gh}x{gw}"] = npy(dest, f"positions_{gh}x{gw}.npy", rows[0, :, :, 0].T.numpy())
    return out


def make(out: Path) -> None:
    import transformers
    from transformers import Glm4vProcessor
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil, smart_resize
    tokenizer = make_tokenizer()
    model = qwen25vl.tiny_model(transformers.Glm4vForConditionalGeneration, config(len(tokenizer)), SEED,
                                {"position_embedding.weight": 0.5, "downsample.weight": 0.5 / 32 ** 0.5})
    dest, _ = qwen25vl.save(model, out / FOLDER)         # (its Qwen2-VL processor is not this one)
    ip = Glm4vImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, patch_size=PATCH,
                                temporal_patch_size=TEMPORAL, merge_size=MERGE, image_mean=MEAN, image_std=STD)
    processor, cfg_json = qwen25vl.processor_files(Glm4vProcessor, ip, tokenizer, dest, CHAT_TEMPLATE)
    files = gemma3_vision.make_images(dest, IMAGES)
    visual = model.model.visual
    images = {}
    for name, pv, thw, o in qwen25vl.tower_outputs(processor, visual, files):
        key, (w, h) = name.rsplit(".", 1)[0], IMAGES[name]
        rh, rw = smart_resize(2, h, w, 2, PATCH * MERGE, MIN_PIXELS, MAX_PIXELS)
        images[name] = {"size": [w, h], "resized_wh": [rw, rh], "grid_thw": thw[0].tolist(),
                        "merged_grid": [int(thw[0, 1]) // MERGE, int(thw[0, 2]) // MERGE],
                        "n_tokens": int(thw[0].prod()) // MERGE ** 2,
                        "pixel_values": npy(dest, f"{key}_patches.npy", pv.numpy()),
                        "hidden_before_merger": npy(dest, f"{key}_hidden.npy", o.last_hidden_state.numpy()),
                        "merger_rows": npy(dest, f"{key}_rows.npy", o.pooler_output.numpy())}
    positions = position_samples(dest)
    prompt, text_prompt = qwen25vl.prompts(model, processor, files, ["image_wide.png", "image_big.png"], dest, N_NEW)
    qwen25vl.SPECIAL[:] = SPECIAL          # write_reference lists the special tokens' ids
    qwen25vl.write_reference(
        dest, FOLDER, "Glm4vForConditionalGeneration", SEED,
        "tools/make_tiny_qwen25vl.py: redraw(): norm scales 1 + 0.1 N(0, 1), matrices N(0, 1) / sqrt(fan-in), the "
        "patch embedding 2 N(0, 1) / sqrt(1176), the position grid 0.5 N(0, 1), the downsample 0.5 N(0, 1) / "
        "sqrt(32), biases 0.1 N(0, 1), embeddings 0.2 N(0, 1)", NOTES, cfg_json, PROCESSOR,
        {"image_token_id": model.config.image_token_id, "position_samples": positions}, processor, images, prompt, text_prompt)


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

"""A tiny random Qwen3-VL (Qwen3VLForConditionalGeneration: the vision transformer with its learned position
grid, its merger and DeepStack mergers; a Qwen3 text decoder with interleaved M-RoPE and DeepStack), its
tokenizer and processor, and transformers reference outputs, in the format of the other tiny folders
(tools/make_tiny_qwen25vl.py).

    python tools/make_tiny_qwen3vl.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

The folder is a Hugging Face directory (config.json, model.safetensors, tokenizer files, the processor's
config, the chat template), two PNG test images of odd sizes, reference.json (what each stage gives, the
token ids, the position ids, the notes on the math) and .npy files (float32 arrays named in reference.json):
per image the flattened patches, the tower's last block output (before the merger), the merger's rows and each
DeepStack level's rows (all in the image's patch order = prompt order); for the prompt a few rows of the whole
model's logits.
"""
from __future__ import annotations

from pathlib import Path


import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny
import make_tiny_idefics3 as idefics3
import make_tiny_qwen25vl as qwen25vl
from make_tiny_qwen25vl import npy

FOLDER = "qwen3_vl_vision"
SEED = int(__import__('os').environ.get('QWEN3VL_SEED', 76))
PATCH, MERGE, TEMPORAL = 8, 2, 2         # patch 8 (the real models' is 16): more patches for the size
POS_SIDE = 4                             # num_position_embeddings 16: a 4 x 4 learned grid
DEEPSTACK = [0, 1]
MIN_PIXELS, MAX_PIXELS = 16 * 16 * 8, 16 * 16 * 16
IMAGES = {"image_wide.png": (25, 15),    # 32 x 16 (round to 16s) is under min_pixels: scaled up to 64 x 48:
                                         # patches 6 x 8 (h x w), merged 3 x 4
          "image_tall.png": (80, 130)}   # 80 x 128 is past max_pixels: scaled down to 48 x 80: patches 10 x 6,
                                         # merged 5 x 3 (no side of 4 patches: both axes of the 4 x 4 position
                                         # grid are resampled)
N_NEW = 8
MEAN = [0.5, 0.5, 0.5]                   # Qwen3-VL's preprocessor_config.json
STD = [0.5, 0.5, 0.5]
PROCESSOR = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": PATCH, "merge_size": MERGE,
             "temporal_patch_size": TEMPORAL, "image_mean": MEAN, "image_std": STD, "resample": 3}
TEXT_HIDDEN = 64

SPECIAL = qwen25vl.SPECIAL                # <|endoftext|>, <|im_start|>, <|im_end|>, the vision tokens
# Qwen3-VL's chat template (Qwen/Qwen3-VL-*-Instruct) cut to images and plain turns: no default system turn, an
# image part as <|vision_start|><|image_pad|><|vision_end|>
CHAT_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{%- if message['content'] is string %}"
    "{{ message['content'] }}{%- else %}{%- for content in message['content'] %}{%- if content['type'] == 'image' "
    "or 'image' in content or 'image_url' in content %}<|vision_start|><|image_pad|><|vision_end|>{%- elif 'text' "
    "in content %}{{ content['text'] }}{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
CORPUS = [
    "user What is in this image? assistant A cat sitting on a red chair near the window.",
    "Describe the picture in one sentence. The photo shows a small boat on a calm lake near the hills.",
    "Can you read the text on the sign? There are two dogs, three birds and a tree in the garden.",
    "The quick brown fox jumps over the lazy dog. Colours, shapes, lines and letters of an image.",
]

NOTES = [
    "Qwen3VLForConditionalGeneration (model_type qwen3_vl). Text decoder: Qwen3 (hidden 64, 3 layers, 4 heads of "
    "16, 2 kv heads, no q/k/v biases, q_norm and k_norm RMSNorms over each head's 16 values before the rotary, "
    "MLP 64 SwiGLU, rms eps 1e-6, rope theta 10000), interleaved M-RoPE with mrope_section [2, 3, 3], untied head "
    "(lm_head.weight stored).",
    "Vision tower (Qwen3VLVisionModel): hidden 32, depth 3, 2 heads of 16, MLP 64, patch 8, temporal patch 2, "
    "merge 2, num_position_embeddings 16 (a 4 x 4 grid), deepstack_visual_indexes [0, 1], out_hidden 64, "
    "hidden_act gelu_pytorch_tanh; no windows (every block attends over the whole image, bidirectional).",
    "Preprocessing (Qwen2VLImageProcessorPil, the PIL backend; preprocessor_config.json size {{shortest_edge: "
    f"{MIN_PIXELS}, longest_edge: {MAX_PIXELS}}} = min/max pixels): RGB; smart_resize(h, w, factor 16): h' = "
    "round(h / 16) * 16, w' likewise (Python's round: half to even); if h' w' > max_pixels: beta = sqrt(h w / "
    "max_pixels), h' = max(16, floor(h / beta / 16) * 16), w' likewise; elif h' w' < min_pixels: beta = "
    "sqrt(min_pixels / (h w)), h' = ceil(h beta / 16) * 16, w' likewise; an aspect ratio past 200 is an error. "
    "Pillow BICUBIC resize to w' x h' (uint8), x * (1/255) -> float32, (x - 0.5) / 0.5, channels first.",
    "Flattened patches: grid_h = h' / 8, grid_w = w' / 8; the image as [C, gh/2, 2, 8, gw/2, 2, 8], "
    "transposed to (gh/2, gw/2, 2, 2, C, 8, 8), the channel's 8 x 8 repeated to (C, T=2, 8, 8): rows "
    "[gh * gw, C*T*8*8 = 384], block-major (patch row 4 (i * gw/2 + j) + 2 a + b is patch (2i + a, 2j + b)). "
    "grid_thw = [1, gh, gw]. Every later row (vision blocks, mergers) stays in this order; the merged rows are in "
    "prompt order (merged cell (i, j) row-major).",
    "Patch embed: Conv3d(3, 32, kernel = stride = (2, 8, 8), WITH bias) = each row [384] (order C, T, y, x) "
    "times weight.reshape(32, 384)^T + bias.",
    "Position embedding: pos_embed = Embedding(16, 32), a 4 x 4 grid (side = 4, row-major). For patch (r, c) of a "
    "gh x gw grid: bilinear with align_corners: y = r * (side - 1) / max(gh - 1, 1), x = c * (side - 1) / "
    "max(gw - 1, 1) (float32), y0 = floor(y), taps y0 and min(y0 + 1, side - 1) with weights 1 - (y - y0) and "
    "y - y0 (the same along x); the row added is sum over the 4 taps of wy * wx * pos_embed[ty * side + tx] "
    "(transformers' get_vision_interpolation_indices_and_weights: weights wy * wx computed first in float32, "
    "then (pos_embed[idx] * w).sum over the 4 taps in order (y0,x0), (y0,x1), (y1,x0), (y1,x1)). Added to the "
    "patch embedding right after it, before the blocks.",
    "Vision rotary (axial, theta 10000): inv_freq = 1 / 10000^(arange(0, 8, 2) / 8) (head dim 16, 4 "
    "frequencies); each patch row's (h, w) = its patch's (row, col) in the patch grid; angles [h * inv_freq, "
    "w * inv_freq] (8), duplicated to 16 (cos/sin over the whole head, rotate_half pairing (i, i + 8)): pairs "
    "0..3 rotate by the row, pairs 4..7 by the column. Applied to q and k after the qkv projection (with bias), "
    "float32 (the same as Qwen2-VL's tower).",
    "Block (pre-norm): x += proj(attn(LayerNorm1(x))) with qkv = Linear(32, 96, bias) laid out [q | k | v] each "
    "[heads, hd]; softmax(q k^T / sqrt(hd)) v over the image's rows; proj Linear(32, 32, bias); x += "
    "fc2(gelu_tanh(fc1(LayerNorm2(x)))) (linear_fc1 32 -> 64, linear_fc2 64 -> 32, both with biases; "
    "gelu_tanh(u) = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))); LayerNorm eps 1e-6 with weight and bias.",
    "Merger (merger.*, use_postshuffle_norm false): LayerNorm(32, eps 1e-6) over each patch row of the last "
    "block's output, then each 4 consecutive rows (one merged cell) concatenated to 128, linear_fc1 128 -> 128 + "
    "bias, GELU (exact, erf), linear_fc2 128 -> 64 + bias: 'rows'.",
    "DeepStack (deepstack_merger_list.{j}.*, use_postshuffle_norm true): after vision block "
    "deepstack_visual_indexes[j] (blocks 0 and 1 here), that block's output rows, each 4 consecutive rows "
    "concatenated to 128 FIRST, then LayerNorm(128, eps 1e-6), linear_fc1 128 -> 128, GELU (erf), linear_fc2 "
    "128 -> 64: 'deepstack_rows'[j]. The contract's wide rows are [rows | deepstack 0 | deepstack 1] "
    "(64 * 3 = 192 columns).",
    "Prompt: the chat template writes <|vision_start|><|image_pad|><|vision_end|> for an image part; the processor "
    "expands <|image_pad|> to grid_t * grid_h * grid_w / 4 copies; the image's merger rows replace those tokens' "
    "embeddings in order (masked_scatter, no scaling). Attention is causal over everything.",
    "DeepStack in the decoder: after decoder layer j (j = 0 .. 1, the number of DeepStack levels), the hidden "
    "states at every image token's position (all images in prompt order) get DeepStack level j's rows ADDED "
    "(_deepstack_process). Layer 2 gets nothing. Decode steps (no image tokens) are plain Qwen3.",
    "M-RoPE positions (get_rope_index, 3 x seq): a text token's three positions are equal and continue from the "
    "previous token; an image's tokens (the <|image_pad|> run) get (t0, t0 + r, t0 + c) over the merged grid "
    "(r, c row-major), t0 = the position after the preceding token (<|vision_start|>); the next token continues "
    "at t0 + max(merged h, merged w). rope_deltas = max position + 1 - seq length: decode step k (0-based, after "
    "the prompt) has all three positions = seq length + k + rope_deltas.",
    "Text M-RoPE, interleaved (Qwen3VLTextRotaryEmbedding.recomposition_frequencies): inv_freq over the 8 pairs "
    "as usual (10000^(-2i/16)); rotary pair i takes the height position if i % 3 == 1 and i < 3 * 3 (pairs 1, "
    "4, 7), the width position if i % 3 == 2 and i < 3 * 3 (pairs 2, 5), else the temporal one (pairs 0, 3, 6); "
    "rotate_half pairing (i, i + 8).",
] + qwen25vl.NOTES[-2:]                   # the tokenizer, the logits


def config(vocab: int):
    from transformers import Qwen3VLConfig
    text = dict(vocab_size=vocab, hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                tie_word_embeddings=False, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    vision = dict(depth=3, hidden_size=32, hidden_act="gelu_pytorch_tanh", intermediate_size=64, num_heads=2,
                  in_channels=3, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  out_hidden_size=TEXT_HIDDEN, num_position_embeddings=POS_SIDE * POS_SIDE,
                  deepstack_visual_indexes=DEEPSTACK)
    return Qwen3VLConfig(text_config=text, vision_config=vision, **qwen25vl.TOKEN_IDS, tie_word_embeddings=False)


def make_tokenizer():
    return idefics3.bpe_tokenizer(CORPUS, SPECIAL, 400, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def make(out: Path) -> None:
    import transformers
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    tokenizer = make_tokenizer()
    # the position grid drawn as large as the patch embedding
    model = qwen25vl.tiny_model(transformers.Qwen3VLForConditionalGeneration, config(len(tokenizer)), SEED,
                                {"pos_embed.weight": 0.5})
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)
    ip = Qwen2VLImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}, patch_size=PATCH,
                                  temporal_patch_size=TEMPORAL, merge_size=MERGE, image_mean=MEAN, image_std=STD)
    processor, cfg_json = qwen25vl.processor_files(Qwen3VLProcessor, ip, tokenizer, dest, CHAT_TEMPLATE)
    files = gemma3_vision.make_images(dest, IMAGES)
    stem = {n: n.rsplit(".", 1)[0] for n in files}
    visual = model.model.visual

    images = {}
    for name, pv, thw, o in qwen25vl.tower_outputs(processor, visual, files):
        rows = qwen25vl.image_record(dest, stem[name], IMAGES[name], thw, pv, o.last_hidden_state, o.pooler_output,
                                     PROCESSOR, {})
        rows["deepstack_rows"] = [npy(dest, f"{stem[name]}_deepstack{j}.npy", f.numpy())
                                  for j, f in enumerate(o.deepstack_features)]
        images[name] = rows

    prompt, text_prompt = qwen25vl.prompts(model, processor, files, ["image_wide.png", "image_tall.png"], dest,
                                           N_NEW)
    image_id = model.config.image_token_id
    qwen25vl.write_reference(
        dest, FOLDER, "Qwen3VLForConditionalGeneration", SEED,
        "tools/make_tiny_qwen25vl.py: redraw(): norm scales 1 + 0.1 N(0, 1), matrices N(0, 1) / sqrt(fan-in), the "
        "patch embedding 2 N(0, 1) / sqrt(384), the position grid 0.5 N(0, 1), biases 0.1 N(0, 1), embeddings "
        "0.2 N(0, 1)", NOTES, cfg_json, PROCESSOR, {"image_token_id": image_id, "deepstack_visual_indexes": DEEPSTACK},
        processor, images, prompt, text_prompt)


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

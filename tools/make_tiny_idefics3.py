"""A tiny random Idefics3 / SmolVLM (Idefics3ForConditionalGeneration: SigLIP encoder without pooling head,
the pixel-shuffle connector, a Llama text decoder), its tokenizer and processor, and transformers reference
outputs, in the format of the other tiny folders (tools/make_tiny_hybrid.py).

    python tools/make_tiny_idefics3.py [--out tests/fixtures/reference/tiny]

Needs torch, transformers, tokenizers and Pillow (never runtime dependencies of llambda). Everything is seeded.

The folder is a Hugging Face directory (config.json, model.safetensors, tokenizer files, the processor's
configs, the chat template), three PNG test images of odd sizes, reference.json (what each stage gives, the
token ids, the notes on the math) and .npy files (float32 arrays named in reference.json): per image the
pixel values of every crop, the tower's last hidden state per crop and the connector's rows; per prompt a few
rows of the whole model's logits.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import make_tiny_gemma3_vision as gemma3_vision
import make_tiny_hybrid as tiny

FOLDER = "idefics3_vision"
SEED = 47                                # of 41..52, the one whose greedy steps have the widest margins
IMAGE_SIZE, PATCH, SCALE = 32, 8, 2      # 4 x 4 patches per crop, shuffled 2 x 2 -> 4 rows per crop
SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2
LONGEST_EDGE, CROP = 64, 32              # size["longest_edge"], max_image_size["longest_edge"]
IMAGES = {"image_wide.png": (45, 20),    # file: (width, height); -> 64 x 28 -> 64 x 32: 1 row x 2 cols
          "image_square.png": (50, 47),  # -> 64 x 60 -> 64 x 64: 2 x 2
          "image_small.png": (9, 7)}     # -> 64 x 50 -> 64 x 64: 2 x 2 (and 32 x 32, one crop, unsplit)
N_NEW = 8
MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]

SPECIAL = (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<global-img>",
            "<end_of_utterance>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)])
# SmolVLM's chat template (HuggingFaceTB/SmolVLM-*-Instruct, chat_template.json)
CHAT_TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]"
                 "['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if "
                 "line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
                 "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}"
                 "{% endif %}")
CORPUS = [
    "User: What is in this image? Assistant: A cat sitting on a red chair near the window.",
    "User: Describe the picture in one sentence. Assistant: The photo shows a small boat on a calm lake.",
    "Can you read the text on the sign? There are two dogs, three birds and a tree in the garden.",
    "The quick brown fox jumps over the lazy dog. Colours, shapes, lines and letters of an image.",
]

NOTES = [
    "Idefics3ForConditionalGeneration (model_type idefics3, the SmolVLM family). Text decoder: a Llama (hidden 64, "
    "2 layers, 4 heads of 16, 2 kv heads, MLP 128, rope theta 10000, rms eps 1e-5), UNTIED head (lm_head.weight is "
    "stored), vocab 450 (the tokenizer's).",
    "Vision tower: Idefics3VisionTransformer = SigLIP without a pooling head: image 32 x 32, patch 8 (4 x 4 = 16 "
    "patches per crop), hidden 32, 2 layers, 2 heads, MLP 64, gelu_pytorch_tanh, LayerNorm eps 1e-6, "
    "post_layernorm; its output is the last hidden state [16, 32] per crop. Position ids: for full 32 x 32 crops "
    "(every crop here) the bucketize in Idefics3VisionEmbeddings gives 0..15 in order (patch (r, c) -> r * 4 + c).",
    "Connector: pixel_shuffle with scale_factor 2, then modality_projection.proj (Linear 128 -> 64, no bias). "
    "pixel_shuffle of x [16, 32] (seq = side * side, side 4): x.view(4, 4, 32) -> view(4, 2, 64) -> permute(1, 0, 2) "
    "-> reshape(2, 2, 128) -> permute(1, 0, 2) -> reshape(4, 128). Equivalently output row (i, j) (i, j < side/2, "
    "row index i * side/2 + j) is the concatenation over a in 0..1 (outer), b in 0..1 (inner) of patch (2i + a, "
    "2j + b): [p(2i,2j), p(2i,2j+1), p(2i+1,2j), p(2i+1,2j+1)], 4 * 32 = 128 values.",
    "Soft tokens per crop (image_seq_len, processor_config.json) = (32/8)^2 / 2^2 = 4; the '<image>' token's input "
    "embedding is replaced, in order, by the connector's rows (masked_scatter: no scaling); every other token "
    "(<fake_token_around_image>, <global-img>, <row_r_col_c>, newlines) is an ordinary text token. Attention is "
    "causal over everything (no bidirectional image blocks).",
    "Preprocessing (Idefics3ImageProcessorPil, the PIL backend, with this folder's preprocessor_config.json): "
    "RGB; resize with Pillow LANCZOS (resample 1) so that the longest edge is size.longest_edge = 64: if w >= h: "
    "w' = 64, h' = int(64 / (w / h)), +1 if odd; else h' = 64, w' = int(64 * (w / h)), +1 if odd (both >= 1; then "
    "scaled below 4096 the same way without the even rule); the pixels are uint8 again after every resize.",
    "Splitting (do_image_splitting true): resize again (LANCZOS) to multiples of the crop 32: if w' >= h': "
    "W = ceil(w' / 32) * 32, H = ceil(int(W / (w' / h')) / 32) * 32; else H = ceil(h' / 32) * 32, W = "
    "ceil(int(H * (w' / h')) / 32) * 32 (float64 Python arithmetic; a same-size resize is a copy). If H > 32 or "
    "W > 32: rows = (H - 32) // 32 + 1, cols = (W - 32) // 32 + 1, crops [r*32:(r+1)*32, c*32:(c+1)*32] row-major, "
    "then the whole H x W image resized (LANCZOS, aspect NOT kept) to 32 x 32, the 'global image', last. Else "
    "rows = cols = 0 and the one 32 x 32 image. Since the first resize always brings the longest edge UP or down "
    "to 64 > 32, every image splits under this folder's config; 'no_split' in reference.json is the same model "
    "with do_image_splitting false: longest edge to 64 as above, then resized to 32 x 32 (aspect not kept), "
    "rows = cols = 0.",
    "Then x * (1/255) (numpy float64 -> float32), (x - 0.5) / 0.5 in float32, channels first: pixel values "
    "[n_crops, 3, 32, 32] in prompt order.",
    "Prompt expansion (Idefics3Processor.replace_image_token): each '<image>' in the text becomes, for a split "
    "image: for r in 1..rows: (for c in 1..cols: '<fake_token_around_image><row_r_col_c>' + '<image>' * 4) + "
    "'\\n'; then '\\n<fake_token_around_image><global-img>' + '<image>' * 4 + '<fake_token_around_image>'. "
    "Unsplit: '<fake_token_around_image><global-img>' + '<image>' * 4 + '<fake_token_around_image>'. The "
    "expanded strings are in reference.json (prompt_text).",
    "Tokenizer: a ByteLevel BPE (GPT-2 style, like SmolLM2's) trained by tokenizers' BpeTrainer on a few fixed "
    "sentences, vocab 450 (the model's vocab_size too); ids 0..42 are the added special tokens in this order: "
    + ", ".join(SPECIAL[:7]) + ", then <row_r_col_c> for r, c in 1..6 (row-major). bos <|im_start|>, eos <end_of_utterance>, pad <|im_end|>. "
    "No BOS is added by the tokenizer: the chat template writes <|im_start|> itself.",
    "Logits: model(input_ids, pixel_values, pixel_attention_mask) in float32, eager attention; rows listed in "
    "'rows' of each prompt (the first and last soft token of each image, the last 3 positions).",
]


def config(vocab: int):
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig
    text = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        pad_token_id=2, bos_token_id=1, eos_token_id=6)
    vision = Idefics3VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_channels=3,
        image_size=IMAGE_SIZE, patch_size=PATCH, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    return Idefics3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=SCALE,
                          image_token_id=SPECIAL.index("<image>"), tie_word_embeddings=False, pad_token_id=2)


def bpe_tokenizer(corpus: list, special: list, vocab: int, **tokens):
    """A ByteLevel BPE (GPT-2 style) trained on `corpus` (4 times), `special` first; `tokens`: bos_token, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, model_max_length=512, **tokens)


def make_tokenizer():
    return bpe_tokenizer(CORPUS, SPECIAL, 450, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                         pad_token="<|im_end|>")


def hub_layout(dest: Path) -> None:
    """The processor's files as the SmolVLM repositories on the Hub have them: preprocessor_config.json (the
    image processor's settings), processor_config.json (image_seq_len), chat_template.json (transformers 5
    saves the first two as one processor_config.json and the template as chat_template.jinja)."""
    both = json.loads((dest / "processor_config.json").read_text())
    pre = dict(both.pop("image_processor"), processor_class=both["processor_class"])
    (dest / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    (dest / "processor_config.json").write_text(json.dumps(both, indent=2) + "\n")
    template = (dest / "chat_template.jinja").read_text()
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
    (dest / "chat_template.jinja").unlink()


def npy(dest: Path, name: str, arr) -> str:
    np.save(dest / name, np.ascontiguousarray(np.asarray(arr, dtype=np.float32)))
    return name


def run_prompt(model, processor, dest, files, key, messages, images, rows_every_image=True, per=SEQ_LEN):
    """The processor's ids for the chat template's rendering of `messages` with `images`, the model's logits
    at a few rows (the first and last of each run of `per` image tokens, the last 3), greedy tokens (checked
    against a recompute without cache, with the processor's other inputs: pixel values, masks)."""
    from PIL import Image
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    pil = [Image.open(files[n]) for n in images]
    enc = processor(text=text, images=pil, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    expanded = processor.tokenizer.decode(ids, skip_special_tokens=False)
    with torch.no_grad():
        out = model(**enc)
        logits = out.logits[0].float().numpy()
        gen = model.generate(**enc, max_new_tokens=N_NEW, do_sample=False, use_cache=True, eos_token_id=None,
                             pad_token_id=2)[0, len(ids):].tolist()
        seq, recompute, margins = list(ids), [], []
        for _ in range(N_NEW):
            row = model(input_ids=torch.tensor([seq]), **{k: v for k, v in enc.items()
                                                          if k not in ("input_ids", "attention_mask")}).logits[0, -1].numpy()
            top = np.sort(row)[-2:]
            margins.append(float(top[1] - top[0]))
            recompute.append(int(row.argmax()))
            seq.append(recompute[-1])
    image_id = model.config.image_token_id
    pos = [i for i, t in enumerate(ids) if t == image_id]
    rows = sorted(set([p for i, p in enumerate(pos) if i % per in (0, per - 1)]
                      + list(range(len(ids) - 3, len(ids)))))
    return {
        "messages": messages, "images": images, "chat_text": text, "prompt_text": expanded,
        "input_ids": ids, "length": len(ids), "n_image_tokens": len(pos),
        "pixel_values_shape": list(enc["pixel_values"].shape),
        "rows": rows, "logits_rows": npy(dest, f"{key}_logits_rows.npy", logits[rows]),
        "argmax_per_position": logits.argmax(-1).tolist(),
        "greedy_new_tokens": gen, "greedy_matches_recompute": gen == recompute,
        "greedy_top1_minus_top2_per_step": margins,
    }


def make(out: Path) -> None:
    import transformers
    from PIL import Image
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config(len(tokenizer))).float().eval()
    model.config._attn_implementation = "eager"
    model.config.text_config._attn_implementation = "eager"
    model.config.vision_config._attn_implementation = "eager"
    gemma3_vision.redraw(model, SEED, rms_norm=lambda r: 1.0 + 0.1 * r)     # Llama RMSNorms: x * w
    dest = out / FOLDER
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.npy"):
        old.unlink()
    model.save_pretrained(dest, safe_serialization=True)

    def image_processor(split: bool):
        return Idefics3ImageProcessorPil(
            do_convert_rgb=True, do_resize=True, size={"longest_edge": LONGEST_EDGE}, resample=1,
            do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=MEAN, image_std=STD,
            do_pad=True, do_image_splitting=split, max_image_size={"longest_edge": CROP})

    Idefics3Processor(image_processor=image_processor(True), tokenizer=tokenizer, image_seq_len=SEQ_LEN,
                      chat_template=CHAT_TEMPLATE).save_pretrained(dest)
    hub_layout(dest)
    processor = transformers.AutoProcessor.from_pretrained(dest)     # read back: the files are what it uses
    assert type(processor.image_processor).__name__ == "Idefics3ImageProcessorPil", type(processor.image_processor)
    nosplit = Idefics3Processor(image_processor=image_processor(False), tokenizer=make_tokenizer(),
                                image_seq_len=SEQ_LEN, chat_template=CHAT_TEMPLATE)
    cfg_json = json.loads((dest / "config.json").read_text())
    files = gemma3_vision.make_images(dest, IMAGES)
    stem = {n: n.rsplit(".", 1)[0] for n in files}

    def per_image(proc, name, tag):
        ip = proc.image_processor
        enc = ip(images=[Image.open(files[name])], return_tensors="pt", return_row_col_info=True)
        pv = enc["pixel_values"][0].float()                       # [n_crops, 3, 32, 32]
        with torch.no_grad():
            hidden = model.model.vision_model(pixel_values=pv).last_hidden_state
            rows = model.model.connector(hidden)
        key = f"{stem[name]}{tag}"
        from transformers.image_utils import SizeDict
        arr = np.moveaxis(np.array(Image.open(files[name]).convert("RGB")), -1, 0)
        first = ip.resize(arr, SizeDict(longest_edge=LONGEST_EDGE), resample=1)
        second = ip.resize_for_vision_encoder(first, CROP, resample=1) if ip.do_image_splitting else None
        return {
            "size": list(IMAGES[name]), "grid": [int(enc["rows"][0][0]), int(enc["cols"][0][0])],
            "n_crops": int(pv.shape[0]),
            "resized_wh": [first.shape[2], first.shape[1]],
            "split_resized_wh": None if second is None else [second.shape[2], second.shape[1]],
            "pixel_values": npy(dest, f"{key}_pixels.npy", pv.numpy()),
            "vision_last_hidden_state": npy(dest, f"{key}_hidden.npy", hidden.numpy()),
            "connector_rows": npy(dest, f"{key}_rows.npy", rows.numpy()),
        }

    images = {n: per_image(processor, n, "") for n in files}
    no_split_images = {"image_small.png": per_image(nosplit, "image_small.png", "_nosplit")}

    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"},
                                        {"type": "image"}, {"type": "text", "text": "And in this one?"}]}]
    one = [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "image"}]}]
    prompts = [run_prompt(model, processor, dest, files, "two_images", two, ["image_wide.png", "image_square.png"])]
    no_split_prompts = [run_prompt(model, nosplit, dest, files, "nosplit", one, ["image_small.png"])]

    ref = {
        "folder": FOLDER, "model_class": "Idefics3ForConditionalGeneration",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "weights_dtype": "float32", "compute_dtype": "float32", "attn_implementation": "eager",
        "image_processor_class": "Idefics3ImageProcessorPil",
        "init": {"torch_manual_seed": 0, "weight_generator_seed": SEED, "input_seed": tiny.INPUT_SEED,
                 "scheme": "tools/make_tiny_gemma3_vision.py: redraw(), RMSNorm weights 1 + 0.1 N(0, 1)"},
        "notes": NOTES,
        "config": cfg_json,
        "image_token_id": model.config.image_token_id, "image_seq_len": SEQ_LEN,
        "special_token_ids": {t: processor.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL},
        "images": images,
        "prompts": prompts,
        "no_split": {"processor_change": {"do_image_splitting": False}, "images": no_split_images,
                     "prompts": no_split_prompts},
    }
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(FOLDER, "grids", {n: i["grid"] for n, i in images.items()},
          "greedy matches recompute:", [p["greedy_matches_recompute"] for p in prompts + no_split_prompts],
          "min margin", min(min(p["greedy_top1_minus_top2_per_step"]) for p in prompts + no_split_prompts))


if __name__ == "__main__":
    tiny.main_one(make, __doc__)

"""One image through the same vision tower in llambda and in llama.cpp, side by side (not a test).

    python bench/bench_vision_vs_llama_cpp.py [--family gemma3|idefics3|qwen2_5_vl|qwen3_vl] [--dir DIR] [--threads 1 2]
                                              [-r 3]
                                              [--layers N] [--size W H] [--exact]

The tower is bench_vision.py's random real-sized one, written once under DIR as a Hugging Face folder (F16
safetensors) and from it as llama.cpp's mmproj (llambda.vision.mmproj.write_mmproj, F16 as llama.cpp's
converter writes one), beside a one-layer llama of the projector's text width with a byte-level tokenizer
(llama.cpp's mtmd wants a text model whose width is the projector's; for Idefics3 it also looks up the crop
marker tokens, which the vocabulary holds). Both engines load that mmproj.

- gemma3: 27 SigLIP layers of 1152, 16 heads of 72, MLP 4304, 896 x 896 images: 4096 patches, pooled to 256
  tokens of 2560; one 896 x 896 image (no resize on either side).
- idefics3 (SmolVLM-256M-Instruct's sizes): 12 layers of 768, 12 heads of 64, MLP 3072, 512 x 512 crops of
  16-pixel patches (1024), pixel-shuffled by 4 to 64 rows of 576; the processor's longest edge 2048. One image
  of --size (default 1024 x 768: resized to 2048 x 1536, 4 x 3 tiles and the global image, 13 crops). Both
  engines cut the image themselves; the run stops if their crop counts differ.
- qwen2_5_vl (Qwen2.5-VL-3B-Instruct's tower): 32 blocks of 1280, 16 heads of 80, SwiGLU MLP 3420, RMSNorm,
  patches of 14 merged 2 x 2, windows of 112 pixels (4 x 4 merged cells), full attention in blocks 7, 15, 23, 31
  (every 8th: llama.cpp's n_wa_pattern; fewer --layers keep every 8th, or the last), merger rows of 2048; the
  processor's min/max pixels 3136 / 12845056, CLIP's mean and std. One image of --size (default 448 x 448: a
  multiple of 28 a side, so neither engine resizes it; 32 x 32 patches, 16 x 16 = 256 rows); the run stops if the
  engines' token counts differ. llambda: `tower.encode_one(tower.pixels(image), tower.grid(w, h))`; llama.cpp
  its one image chunk.
- qwen3_vl (Qwen3-VL-2B-Instruct's tower): 24 blocks of 1024, 16 heads of 64, tanh-GELU MLP 4096, LayerNorm,
  patches of 16 merged 2 x 2, a learned 48 x 48 position grid, DeepStack after blocks 5, 11, 17 (those below
  --layers), merger rows of 2048, each joined with its levels' (8192 wide for 3: llama.cpp's text stand-in is that
  wide); the processor's min/max pixels 65536 / 16777216, mean = std = 0.5. One image of --size (default 512 x
  512: 32 x 32 patches, the grid resampled, 256 rows; neither engine resizes it).

Each run is a child process that loads its engine, preprocesses the image and encodes it, and reports the
encode alone (and the preprocessing beside it): wall and process CPU time (every thread's). llambda: the
native backend, its default bfloat16 panels, `tower.encode` of every crop (`tower.pixels` before the clock);
llama.cpp: llama-cpp-python's libmtmd, `mtmd_encode_chunk` of every image chunk (its preprocessing runs in
`mtmd_tokenize`, before the clock), flash attention as its default picks. Runs alternate engines (the order
swapped every repetition) and thread counts; the summary gives medians and the ratios llama.cpp / llambda
(above 1: we are faster). The load average and a read probe are printed before and after. The rows of both
are compared (max difference, relative RMS, worst row's cosine; per crop where there are several);
`--exact` adds one run of llambda's float32 mode as the reference both are measured against (or
`--engines llambda llambda-f32 llama.cpp` times that mode too).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
sys.path.insert(0, str(Path(__file__).resolve().parent))         # bench_vision's tower

import numpy as np  # noqa: E402

# family -> (default layers, default image size, text width)
FAMILIES = {"gemma3": (27, (896, 896), 2560), "idefics3": (12, (1024, 768), 576),
            "qwen2_5_vl": (32, (448, 448), 2048), "qwen3_vl": (24, (512, 512), 2048)}
IDEFICS3_MARKS = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in range(1, 7)
                                                                  for c in range(1, 7)]   # mtmd looks these up
QWEN_MARKS = ["<|vision_start|>", "<|vision_end|>"]                                    # the image's brackets
MARKS = {"idefics3": IDEFICS3_MARKS, "qwen2_5_vl": QWEN_MARKS, "qwen3_vl": QWEN_MARKS}


# ---------------------------------------------------------------- the files (made once per DIR)

def hf_name(canon: str, family: str) -> str:
    if family == "idefics3":
        return "model." + canon if canon.startswith("connector.") else "model.vision_model." + canon
    if canon.startswith("mm_"):
        return "multi_modal_projector." + canon
    return "vision_tower.vision_model." + canon


def tower_config(family: str, layers: int):
    from bench_vision import CONFIGS
    return CONFIGS[family][0](layers)


def qwen25_vision_config(layers: int) -> dict:
    """Qwen2.5-VL-3B-Instruct's vision_config (the 7B's differs only in out_hidden_size, 3584), `layers` deep: full
    attention every 8th block (7, 15, 23, 31), or in the last where there are fewer than 8."""
    n = min(8, layers)
    return {"model_type": "qwen2_5_vl", "depth": layers, "hidden_size": 1280, "intermediate_size": 3420,
            "num_heads": 16, "in_channels": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": list(range(n - 1, layers, n)),
            "hidden_act": "silu", "tokens_per_second": 2}


def qwen3_vision_config(layers: int) -> dict:
    """Qwen3-VL-2B-Instruct's vision_config, `layers` deep (the DeepStack levels after blocks 5, 11, 17 below it)."""
    return {"model_type": "qwen3_vl", "depth": layers, "hidden_size": 1024, "intermediate_size": 4096,
            "num_heads": 16, "in_channels": 3, "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
            "deepstack_visual_indexes": [i for i in (5, 11, 17) if i < layers]}


def write_qwen_folder(folder: Path, layers: int, family: str) -> None:
    """A Qwen2.5-VL (or Qwen3-VL) directory holding the random tower alone (F16 safetensors under `visual.`), each
    tensor drawn from a generator seeded by its name as bench_vision.py's (norm weights near 1, small biases,
    matrices scaled by their fan-in)."""
    import zlib
    from llambda.formats.safetensors import write_safetensors
    from llambda.vision.qwen2vl_config import QwenVisionConfig
    from llambda.vision.qwen2vl_mmproj import canonical_names
    qwen3 = family == "qwen3_vl"
    vis = qwen3_vision_config(layers) if qwen3 else qwen25_vision_config(layers)
    fields = {"projector": family, "hidden_size": vis["hidden_size"], "intermediate_size": vis["intermediate_size"],
              "num_hidden_layers": layers, "num_attention_heads": vis["num_heads"], "patch_size": vis["patch_size"],
              "text_hidden_size": vis["out_hidden_size"]}
    fields.update({k: vis[k] for k in (("num_position_embeddings", "deepstack_visual_indexes") if qwen3
                                       else ("window_size", "fullatt_block_indexes"))})
    cfg = QwenVisionConfig.from_fields(fields)
    H, F, T, M = cfg.hidden_size, cfg.intermediate_size, cfg.text_hidden_size, cfg.spatial_merge_size ** 2
    merger = {"norm": (M * H,), "linear_fc1": (M * H, M * H), "linear_fc2": (T, M * H)}
    leaves = {"norm1": (H,), "norm2": (H,), "attn.qkv": (3 * H, H), "attn.proj": (H, H), "mlp.gate_proj": (F, H),
              "mlp.up_proj": (F, H), "mlp.down_proj": (H, F), "merger.ln_q": (H,), "merger.mlp.0": (M * H, M * H),
              "merger.mlp.2": (T, M * H), "mlp.linear_fc1": (F, H), "mlp.linear_fc2": (H, F), "merger.norm": (H,),
              "merger.linear_fc1": (M * H, M * H), "merger.linear_fc2": (T, M * H), "patch_embed.proj": (H,),
              "pos_embed": (cfg.num_position_embeddings, H)} | {"deepstack." + k: v for k, v in merger.items()}
    tensors = {}
    for canon in canonical_names(cfg):
        if canon == "patch_embed.proj.weight":
            shape = (H, cfg.num_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        else:
            stem, kind = canon.rsplit(".", 1)
            leaf = ("deepstack." if stem.startswith("deepstack_") else "") + stem.split(".", 2)[2] \
                if stem.startswith(("blocks.", "deepstack_")) else stem
            full = leaves[leaf]
            shape = full if kind == "weight" else full[:1]
        rng = np.random.default_rng(zlib.crc32(canon.encode()))
        if ("norm" in canon or "ln_q" in canon) and canon.endswith("weight"):
            v = 1.0 + 0.05 * rng.standard_normal(shape)
        elif len(shape) == 1:
            v = 0.02 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        tensors["visual." + canon] = v.astype(np.float16)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", tensors)
    kind = "Qwen3VL" if qwen3 else "Qwen2_5_VL"
    config = {"architectures": [f"{kind}ForConditionalGeneration"], "model_type": family,
              "text_config": {"model_type": family + "_text", "hidden_size": vis["out_hidden_size"]},
              "vision_config": vis}
    pre = {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
           "do_normalize": True, "do_convert_rgb": True, "resample": 3, "rescale_factor": 1 / 255,
           "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
           "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    if qwen3:                   # Qwen3-VL's preprocessor_config.json
        pre.update(image_mean=[0.5] * 3, image_std=[0.5] * 3, patch_size=16,
                   size={"shortest_edge": 65536, "longest_edge": 16777216})
        del pre["min_pixels"], pre["max_pixels"]
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=1))


def write_hf_folder(folder: Path, layers: int, family: str) -> None:
    if family in ("qwen2_5_vl", "qwen3_vl"):
        return write_qwen_folder(folder, layers, family)
    from bench_vision import random_lookup
    from llambda.formats.safetensors import write_safetensors
    from llambda.vision.mmproj import canonical_names
    cfg = tower_config(family, layers)
    lookup = random_lookup(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for canon in canonical_names(cfg):
        t = lookup(canon)
        tensors[hf_name(canon, family)] = np.asarray(t.data).view(np.float16).reshape(t.shape)
    write_safetensors(folder / "model.safetensors", tensors)
    vision = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": layers,
              "num_attention_heads": cfg.num_attention_heads, "image_size": cfg.image_size,
              "patch_size": cfg.patch_size, "layer_norm_eps": cfg.layer_norm_eps, "num_channels": 3,
              "hidden_act": "gelu_pytorch_tanh"}
    if family == "idefics3":
        config = {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
                  "scale_factor": cfg.scale_factor,
                  "text_config": {"model_type": "llama", "hidden_size": cfg.text_hidden_size},
                  "vision_config": {"model_type": "idefics3_vision", **vision}}
        pre = {"image_processor_type": "Idefics3ImageProcessor", "do_resize": True, "do_rescale": True,
               "do_normalize": True, "do_convert_rgb": True, "do_image_splitting": True, "do_pad": True,
               "resample": 1, "rescale_factor": 1 / 255, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
               "size": {"longest_edge": cfg.longest_edge}, "max_image_size": {"longest_edge": cfg.image_size}}
    else:
        config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                  "mm_tokens_per_image": cfg.mm_tokens_per_image,
                  "text_config": {"model_type": "gemma3_text", "hidden_size": cfg.text_hidden_size},
                  "vision_config": {"model_type": "siglip_vision_model", **vision}}
        pre = {"image_processor_type": "Gemma3ImageProcessor", "do_resize": True, "do_rescale": True,
               "do_normalize": True, "do_convert_rgb": True, "resample": 2, "rescale_factor": 1 / 255,
               "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
               "size": {"height": cfg.image_size, "width": cfg.image_size}}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=1))


def write_text_model(path: Path, width: int, control_tokens=()) -> None:
    """A one-layer llama `width` wide, F16, with a byte-level BPE vocabulary (256 bytes, one merge, an end token,
    then `control_tokens`)."""
    from llambda.formats.gguf_writer import write_gguf
    from llambda.formats.quants import QType
    from llambda.tokenizer.pieces import BYTE_CHARS
    vocab = list(BYTE_CHARS) + ["\u0120t", "<|endoftext|>"]
    end = len(vocab) - 1
    vocab += list(control_tokens)
    heads, hd, ff = width // 64, 64, 256
    rng = np.random.default_rng(1)

    def w(rows, cols):
        return QType.F16, (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
    ones = (QType.F32, np.ones(width, np.float32))
    tensors = {"token_embd.weight": w(len(vocab), width), "output_norm.weight": ones, "output.weight": w(len(vocab), width),
               "blk.0.attn_norm.weight": ones, "blk.0.ffn_norm.weight": ones,
               "blk.0.attn_q.weight": w(width, width), "blk.0.attn_k.weight": w(width, width),
               "blk.0.attn_v.weight": w(width, width), "blk.0.attn_output.weight": w(width, width),
               "blk.0.ffn_gate.weight": w(ff, width), "blk.0.ffn_up.weight": w(ff, width),
               "blk.0.ffn_down.weight": w(width, ff)}
    meta = {"general.architecture": "llama", "general.name": f"text stand-in {width}",
            "llama.context_length": 4096, "llama.embedding_length": width, "llama.block_count": 1,
            "llama.feed_forward_length": ff, "llama.attention.head_count": heads,
            "llama.attention.head_count_kv": heads, "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 10000.0, "llama.rope.dimension_count": hd, "llama.vocab_size": len(vocab),
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": vocab,
            "tokenizer.ggml.token_type": [1] * end + [3] * (len(vocab) - end), "tokenizer.ggml.merges": ["\u0120 t"],
            "tokenizer.ggml.bos_token_id": end, "tokenizer.ggml.eos_token_id": end,
            "tokenizer.ggml.add_bos_token": False}
    write_gguf(path, meta, tensors)


def write_image(path: Path, width: int, height: int) -> None:
    """RGB width x height: smooth gradients under some noise, so every patch differs."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    base = np.stack([x, y, 0.5 + 0.5 * np.sin(6 * x + 4 * y)], axis=-1) * 200
    rgb = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    path.write_bytes(rgb.tobytes())


def prepare(d: Path, layers: int, family: str, size: tuple) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    width = FAMILIES[family][2]
    if family == "qwen3_vl":            # the mmproj's rows: the merger's and each DeepStack level's, joined
        width *= 1 + len(qwen3_vision_config(layers)["deepstack_visual_indexes"])
    tag = "" if family == "gemma3" else family + "-"     # the Gemma 3 files keep their names
    files = {"mmproj": d / f"mmproj-{tag}{layers}-f16.gguf", "text": d / f"text-{tag}{width}.gguf",
             "image": d / f"image-{size[0]}x{size[1]}.rgb"}
    if not files["mmproj"].exists():
        from llambda.vision.mmproj import write_mmproj
        t0 = time.perf_counter()
        write_hf_folder(d / f"hf-{tag}{layers}", layers, family)
        write_mmproj(d / f"hf-{tag}{layers}", files["mmproj"], "f16", name=f"random {family} tower")
        print(f"wrote {files['mmproj'].name} ({files['mmproj'].stat().st_size / 1e9:.2f} GB) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    if not files["text"].exists():
        write_text_model(files["text"], width, MARKS.get(family, ()))
    if not files["image"].exists():
        write_image(files["image"], *size)
    return files


# ---------------------------------------------------------------- one run (a child process)

def child_llambda(files: dict, size: tuple, threads: int, activations: str | None) -> tuple:
    from PIL import Image
    from llambda.vision import load_vision
    rgb = np.fromfile(files["image"], np.uint8).reshape(size[1], size[0], 3)
    t0 = time.perf_counter()
    tower = load_vision(files["mmproj"], backend="native", threads=threads, activations=activations)
    load = time.perf_counter() - t0
    p0 = time.process_time()
    px = tower.pixels(Image.fromarray(rgb, "RGB"))
    prep = time.process_time() - p0
    w0, c0 = time.perf_counter(), time.process_time()
    out = tower.encode_one(px, tower.grid(*size))[None] if tower.qwen else tower.encode(px)   # Qwen: [1, rows, width]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    tower.close()
    return load, prep, wall, cpu, out


def child_llama_cpp(files: dict, size: tuple, threads: int, flash: int | None) -> tuple:
    import ctypes
    import llama_cpp
    from llama_cpp import mtmd_cpp as M
    t0 = time.perf_counter()
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(files["text"]).encode(), llama_cpp.llama_model_default_params())
    assert model, "llama.cpp refused the text model"
    params = M.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.warmup, params.print_timings = False, threads, False, False
    if flash is not None:
        params.flash_attn_type = flash
    ctx = M.mtmd_init_from_file(str(files["mmproj"]).encode(), model, params)
    assert ctx, "llama.cpp refused the mmproj"
    load = time.perf_counter() - t0
    # a prompt of the image marker alone: mtmd_tokenize preprocesses the bitmap into the image's chunks
    pixels = np.fromfile(files["image"], np.uint8)
    bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(
        M.mtmd_bitmap_init(size[0], size[1], pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))))
    marker = M.mtmd_default_marker()
    prompt = M.mtmd_input_text(text=marker, text_len=len(marker), add_special=False, parse_special=True)
    chunks = M.mtmd_input_chunks_init()
    p0 = time.process_time()
    rc = M.mtmd_tokenize(ctx, chunks, ctypes.byref(prompt), bitmaps, 1)
    prep = time.process_time() - p0
    assert rc == 0, f"mtmd_tokenize: {rc}"
    every = [M.mtmd_input_chunks_get(chunks, i) for i in range(M.mtmd_input_chunks_size(chunks))]
    image = [ch for ch in every if M.mtmd_input_chunk_get_type(ch) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE]
    width = llama_cpp.llama_model_n_embd(model)
    outs, wall, cpu = [], 0.0, 0.0
    for ch in image:            # one chunk per crop (Idefics3 cuts several): each encode timed, summed
        rows = M.mtmd_input_chunk_get_n_tokens(ch)
        w0, c0 = time.perf_counter(), time.process_time()
        rc = M.mtmd_encode_chunk(ctx, ch)
        wall, cpu = wall + time.perf_counter() - w0, cpu + time.process_time() - c0
        assert rc == 0, f"mtmd_encode_chunk: {rc}"
        got = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(rows * width,))
        outs.append(got.reshape(rows, width).copy())    # the buffer is the next encode's
    assert len({o.shape for o in outs}) == 1, [o.shape for o in outs]
    return load, prep, wall, cpu, np.stack(outs)


def child(args) -> None:
    files = {k: Path(v) for k, v in json.loads(args.child_files).items()}
    size = tuple(args.size)
    if args.child.startswith("llama.cpp"):
        flash = {"llama.cpp": None, "llama.cpp-fa": 1, "llama.cpp-nofa": 0}[args.child]
        load, prep, wall, cpu, out = child_llama_cpp(files, size, args.child_threads, flash)
    else:
        act = "f32" if args.child == "llambda-f32" else None
        load, prep, wall, cpu, out = child_llambda(files, size, args.child_threads, act)
    np.save(args.child_out, out)
    print(json.dumps({"load": load, "prep": prep, "wall": wall, "cpu": cpu, "crops": out.shape[0],
                      "finite": bool(np.isfinite(out).all())}), flush=True)


# ---------------------------------------------------------------- the parent

def run(engine: str, threads: int, files: dict, out: Path, size: tuple) -> dict:
    la0 = os.getloadavg()[0]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")   # NumPy's BLAS threads idle, not spinning beside the run
    r = subprocess.run([sys.executable, __file__, "--child", engine, "--child-threads", str(threads),
                        "--child-files", json.dumps({k: str(v) for k, v in files.items()}), "--child-out", str(out),
                        "--size", str(size[0]), str(size[1])],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{engine} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["loadavg"] = (la0, os.getloadavg()[0])
    print(f"{time.strftime('%H:%M:%S')} {engine:11s} t{threads}: {res['crops']} crop{'s' if res['crops'] > 1 else ''},"
          f" encode {res['wall']:6.1f} s wall {res['cpu']:6.1f} s CPU, preprocessing {res['prep']:5.2f} s CPU"
          f" (load {res['load']:4.1f} s; load average {la0:.2f}-{res['loadavg'][1]:.2f})", flush=True)
    return res


def host(label: str) -> None:
    """The load average and the C core's read probe (1 GB, best of 3) on 1 and 2 threads."""
    from llambda import _native
    _native.set_threads(2)
    probe = ", ".join(f"{t} thread{'s' if t > 1 else ''} {max(_native.read_bandwidth(1 << 30, t, 3)):.1f}" for t in (1, 2))
    _native.set_threads(1)
    print(f"{label}: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, read probe GB/s {probe}", flush=True)


def compare(a: np.ndarray, b: np.ndarray) -> str:
    """a against b, both [crops, rows, width]: over everything, then each crop's relative RMS."""
    if a.shape != b.shape:
        return f"shapes differ: {list(a.shape)} against {list(b.shape)}"
    d = a - b
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    cos = (a2 * b2).sum(1) / np.linalg.norm(a2, axis=1) / np.linalg.norm(b2, axis=1)
    text = (f"max |diff| {np.abs(d).max():.4f} (values up to {np.abs(b).max():.2f}), relative RMS "
            f"{np.sqrt((d ** 2).mean() / (b ** 2).mean()) * 100:.2f}%, worst row cosine {cos.min():.6f}")
    if a.shape[0] > 1:
        per = np.sqrt((d ** 2).mean(axis=(1, 2)) / (b ** 2).mean(axis=(1, 2))) * 100
        text += "; per crop relative RMS % " + " ".join(f"{v:.2f}" for v in per)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="gemma3")
    ap.add_argument("--dir", default=None, help="where the files are made and kept for the next run (default: a temporary folder, removed)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None, help="default: the family's (27, 12, 32, 24)")
    ap.add_argument("--size", type=int, nargs=2, default=None, metavar=("W", "H"),
                    help="the image's size (default: gemma3 896 x 896, idefics3 1024 x 768, qwen2_5_vl 448 x 448, "
                    "qwen3_vl 512 x 512)")
    ap.add_argument("--engines", nargs="+", default=["llambda", "llama.cpp"],
                    help="of llambda (bfloat16 panels), llambda-f32 (its float32 mode), llama.cpp (flash attention as "
                    "its default picks), llama.cpp-fa and llama.cpp-nofa (flash attention on, off)")
    ap.add_argument("--exact", action="store_true", help="one run of llambda's float32 mode as the reference")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-files", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    layers, size, _ = FAMILIES[args.family]
    args.layers, args.size = args.layers or layers, tuple(args.size or size)
    if args.dir:
        return measure(args, Path(args.dir))
    import tempfile
    with tempfile.TemporaryDirectory(prefix="vision-vs-") as d:     # 1.7 GB for Gemma 3's 27 layers: removed after
        measure(args, Path(d))


def measure(args, d: Path) -> None:
    files = prepare(d, args.layers, args.family, args.size)
    print(f"{args.family}: one {args.size[0]} x {args.size[1]} image, {args.layers} layers, engines {args.engines}, "
          f"threads {args.threads}, {args.repetitions} repetitions", flush=True)
    host("before")
    results, outs = {}, {}
    for rep in range(args.repetitions):
        engines = args.engines if rep % 2 == 0 else args.engines[::-1]
        for t in args.threads:
            for e in engines:
                out = d / f"out-{e}-t{t}.npy"
                results.setdefault((e, t), []).append(run(e, t, files, out, args.size))
                outs[e] = np.load(out)
                crops = {k: o.shape[:2] for k, o in outs.items()}
                if len(set(crops.values())) > 1:
                    raise SystemExit(f"the engines cut the image into different crops or token counts: {crops}")
    if args.exact and "llambda-f32" not in outs:
        run("llambda-f32", max(args.threads), files, d / "out-exact.npy", args.size)
        outs["llambda-f32"] = np.load(d / "out-exact.npy")
    host("after")
    print("\nmedians (encode only):")
    med = {k: {m: float(np.median([r[m] for r in v])) for m in ("wall", "cpu", "prep")} for k, v in results.items()}
    for t in args.threads:
        row = {e: med[(e, t)] for e in args.engines}
        text = ", ".join(f"{e} {m['wall']:.1f} s wall {m['cpu']:.1f} s CPU" for e, m in row.items())
        for e in [e for e in row if e.startswith("llambda") and "llama.cpp" in row]:
            text += (f"; llama.cpp / {e}: wall {row['llama.cpp']['wall'] / row[e]['wall']:.2f}x, "
                     f"CPU {row['llama.cpp']['cpu'] / row[e]['cpu']:.2f}x")
        print(f"  {t} thread{'s' if t > 1 else ''}: {text}")
        cpus = {e: [r["cpu"] for r in results[(e, t)]] for e in args.engines}
        spread = ", ".join(f"{e} {min(c):.1f}-{max(c):.1f}" for e, c in cpus.items())
        print(f"    CPU spread: {spread}; preprocessing CPU: "
              + ", ".join(f"{e} {row[e]['prep']:.2f} s" for e in args.engines))
    print("rows:", {e: list(o.shape) for e, o in outs.items()})
    if "llambda" in outs and "llama.cpp" in outs:
        print("  llambda against llama.cpp:", compare(outs["llambda"], outs["llama.cpp"]))
    if "llambda-f32" in outs:
        for e in [e for e in args.engines if e != "llambda-f32"]:
            print(f"  {e} against llambda's float32:", compare(outs[e], outs["llambda-f32"]))


if __name__ == "__main__":
    main()

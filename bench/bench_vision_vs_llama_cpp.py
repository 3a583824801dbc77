"""One image through the same Gemma 3 vision tower in llambda and in llama.cpp, side by side (not a test).

    python bench/bench_vision_vs_llama_cpp.py [--dir DIR] [--threads 1 2] [-r 3] [--layers 27] [--exact]

The tower is bench_vision.py's random real-sized one (27 SigLIP layers of 1152, 16 heads of 72, MLP 4304,
896 x 896 images: 4096 patches, pooled to 256 tokens of 2560), written once under DIR as a Hugging Face
folder (F16 safetensors) and from it as llama.cpp's mmproj (llambda.vision.mmproj.write_mmproj, F16 as
llama.cpp's converter writes one), beside a one-layer llama GGUF 2560 wide with a byte-level tokenizer
(llama.cpp's mtmd wants a text model whose width is the projector's). Both engines load that mmproj.

Each run is a child process that loads its engine, encodes one 896 x 896 image (the same bytes: no resize
on either side) and reports the encode alone: wall and process CPU time (every thread's). llambda: the
native backend, its default bfloat16 panels, `tower.encode` (the pixels made before the clock starts);
llama.cpp: llama-cpp-python's libmtmd, `mtmd_encode_chunk` (its preprocessing runs in `mtmd_tokenize`,
before the clock), flash attention as its default picks. Runs alternate engines (the order swapped every
repetition) and thread counts; the summary gives medians and the ratios llama.cpp / llambda (above 1: we
are faster). The load average and a read probe are printed before and after. The soft tokens of both are compared (max difference, relative RMS, worst token's cosine);
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

SIDE = 896


# ---------------------------------------------------------------- the files (made once per DIR)

def hf_name(canon: str) -> str:
    if canon.startswith("mm_"):
        return "multi_modal_projector." + canon
    return "vision_tower.vision_model." + canon


def write_hf_folder(folder: Path, layers: int) -> None:
    from bench_vision import gemma3_config, random_lookup
    from llambda.formats.safetensors import write_safetensors
    from llambda.vision.mmproj import canonical_names
    cfg = gemma3_config(layers)
    lookup = random_lookup(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for canon in canonical_names(cfg):
        t = lookup(canon)
        tensors[hf_name(canon)] = np.asarray(t.data).view(np.float16).reshape(t.shape)
    write_safetensors(folder / "model.safetensors", tensors)
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "mm_tokens_per_image": cfg.mm_tokens_per_image,
              "text_config": {"model_type": "gemma3_text", "hidden_size": cfg.text_hidden_size},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": cfg.hidden_size,
                                "intermediate_size": cfg.intermediate_size, "num_hidden_layers": layers,
                                "num_attention_heads": cfg.num_attention_heads, "image_size": cfg.image_size,
                                "patch_size": cfg.patch_size, "layer_norm_eps": cfg.layer_norm_eps,
                                "num_channels": 3, "hidden_act": "gelu_pytorch_tanh"}}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    pre = {"image_processor_type": "Gemma3ImageProcessor", "do_resize": True, "do_rescale": True,
           "do_normalize": True, "do_convert_rgb": True, "resample": 2, "rescale_factor": 1 / 255,
           "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "size": {"height": SIDE, "width": SIDE}}
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=1))


def write_text_model(path: Path, width: int) -> None:
    """A one-layer llama `width` wide, F16, with a byte-level BPE vocabulary (256 bytes, one merge, an end token)."""
    from llambda.formats.gguf_writer import write_gguf
    from llambda.formats.quants import QType
    from llambda.tokenizer.pieces import BYTE_CHARS
    vocab = list(BYTE_CHARS) + ["\u0120t", "<|endoftext|>"]
    heads, hd, ff = width // 128, 128, 256
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
    end = len(vocab) - 1
    meta = {"general.architecture": "llama", "general.name": f"text stand-in {width}",
            "llama.context_length": 1024, "llama.embedding_length": width, "llama.block_count": 1,
            "llama.feed_forward_length": ff, "llama.attention.head_count": heads,
            "llama.attention.head_count_kv": heads, "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 10000.0, "llama.rope.dimension_count": hd, "llama.vocab_size": len(vocab),
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": vocab,
            "tokenizer.ggml.token_type": [1] * end + [3], "tokenizer.ggml.merges": ["\u0120 t"],
            "tokenizer.ggml.bos_token_id": end, "tokenizer.ggml.eos_token_id": end,
            "tokenizer.ggml.add_bos_token": False}
    write_gguf(path, meta, tensors)


def write_image(path: Path) -> None:
    """896 x 896 RGB: smooth gradients under some noise, so every patch differs."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:SIDE, 0:SIDE] / SIDE
    base = np.stack([x, y, 0.5 + 0.5 * np.sin(6 * x + 4 * y)], axis=-1) * 200
    rgb = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    path.write_bytes(rgb.tobytes())


def prepare(d: Path, layers: int) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    files = {"mmproj": d / f"mmproj-{layers}-f16.gguf", "text": d / "text-2560.gguf", "image": d / "image.rgb"}
    if not files["mmproj"].exists():
        from llambda.vision.mmproj import write_mmproj
        t0 = time.perf_counter()
        write_hf_folder(d / f"hf-{layers}", layers)
        write_mmproj(d / f"hf-{layers}", files["mmproj"], "f16", name="random Gemma 3 tower")
        print(f"wrote {files['mmproj'].name} ({files['mmproj'].stat().st_size / 1e9:.2f} GB) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    if not files["text"].exists():
        write_text_model(files["text"], 2560)
    if not files["image"].exists():
        write_image(files["image"])
    return files


# ---------------------------------------------------------------- one run (a child process)

def child_llambda(files: dict, threads: int, activations: str | None) -> tuple:
    from PIL import Image
    from llambda.vision import load_vision
    rgb = np.fromfile(files["image"], np.uint8).reshape(SIDE, SIDE, 3)
    t0 = time.perf_counter()
    tower = load_vision(files["mmproj"], backend="native", threads=threads, activations=activations)
    load = time.perf_counter() - t0
    px = tower.pixels(Image.fromarray(rgb, "RGB"))[None]
    w0, c0 = time.perf_counter(), time.process_time()
    out = tower.encode(px)[0]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    tower.close()
    return load, wall, cpu, out


def child_llama_cpp(files: dict, threads: int, flash: int | None) -> tuple:
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
    # a prompt of the image marker alone: mtmd_tokenize preprocesses the bitmap into the image's chunk
    pixels = np.fromfile(files["image"], np.uint8)
    bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(
        M.mtmd_bitmap_init(SIDE, SIDE, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))))
    marker = M.mtmd_default_marker()
    prompt = M.mtmd_input_text(text=marker, text_len=len(marker), add_special=False, parse_special=True)
    chunks = M.mtmd_input_chunks_init()
    rc = M.mtmd_tokenize(ctx, chunks, ctypes.byref(prompt), bitmaps, 1)
    assert rc == 0, f"mtmd_tokenize: {rc}"
    every = [M.mtmd_input_chunks_get(chunks, i) for i in range(M.mtmd_input_chunks_size(chunks))]
    image = [ch for ch in every if M.mtmd_input_chunk_get_type(ch) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE]
    assert len(image) == 1, f"{len(image)} image chunks"
    rows, width = M.mtmd_input_chunk_get_n_tokens(image[0]), llama_cpp.llama_model_n_embd(model)
    w0, c0 = time.perf_counter(), time.process_time()
    rc = M.mtmd_encode_chunk(ctx, image[0])
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    assert rc == 0, f"mtmd_encode_chunk: {rc}"
    got = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(rows * width,))
    return load, wall, cpu, got.reshape(rows, width).copy()


def child(args) -> None:
    files = {k: Path(v) for k, v in json.loads(args.child_files).items()}
    if args.child.startswith("llama.cpp"):
        flash = {"llama.cpp": None, "llama.cpp-fa": 1, "llama.cpp-nofa": 0}[args.child]
        load, wall, cpu, out = child_llama_cpp(files, args.child_threads, flash)
    else:
        load, wall, cpu, out = child_llambda(files, args.child_threads, "f32" if args.child == "llambda-f32" else None)
    np.save(args.child_out, out)
    print(json.dumps({"load": load, "wall": wall, "cpu": cpu, "finite": bool(np.isfinite(out).all())}), flush=True)


# ---------------------------------------------------------------- the parent

def run(engine: str, threads: int, files: dict, out: Path) -> dict:
    la0 = os.getloadavg()[0]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")   # NumPy's BLAS threads idle, not spinning beside the run
    r = subprocess.run([sys.executable, __file__, "--child", engine, "--child-threads", str(threads),
                        "--child-files", json.dumps({k: str(v) for k, v in files.items()}), "--child-out", str(out)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{engine} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["loadavg"] = (la0, os.getloadavg()[0])
    print(f"{time.strftime('%H:%M:%S')} {engine:11s} t{threads}: encode {res['wall']:6.1f} s wall {res['cpu']:6.1f} s CPU"
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
    d = a - b
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return (f"max |diff| {np.abs(d).max():.4f} (values up to {np.abs(b).max():.2f}), relative RMS "
            f"{np.sqrt((d ** 2).mean() / (b ** 2).mean()) * 100:.2f}%, worst token cosine {cos.min():.6f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where the files are made and kept for the next run (default: a temporary folder, removed)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--layers", type=int, default=27)
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
    if args.dir:
        return measure(args, Path(args.dir))
    import tempfile
    with tempfile.TemporaryDirectory(prefix="vision-vs-") as d:     # 1.7 GB for 27 layers: removed after
        measure(args, Path(d))


def measure(args, d: Path) -> None:
    files = prepare(d, args.layers)
    print(f"one {SIDE} x {SIDE} image, {args.layers} layers, engines {args.engines}, threads {args.threads}, "
          f"{args.repetitions} repetitions", flush=True)
    host("before")
    results, outs = {}, {}
    for rep in range(args.repetitions):
        engines = args.engines if rep % 2 == 0 else args.engines[::-1]
        for t in args.threads:
            for e in engines:
                out = d / f"out-{e}-t{t}.npy"
                results.setdefault((e, t), []).append(run(e, t, files, out))
                outs[e] = np.load(out)
    if args.exact and "llambda-f32" not in outs:
        run("llambda-f32", max(args.threads), files, d / "out-exact.npy")
        outs["llambda-f32"] = np.load(d / "out-exact.npy")
    host("after")
    print("\nmedians (encode only):")
    for t in args.threads:
        row = {e: (np.median([r["wall"] for r in results[(e, t)]]), np.median([r["cpu"] for r in results[(e, t)]]))
               for e in args.engines}
        text = ", ".join(f"{e} {w:.1f} s wall {c:.1f} s CPU" for e, (w, c) in row.items())
        for e in [e for e in row if e.startswith("llambda") and "llama.cpp" in row]:
            text += (f"; llama.cpp / {e}: wall {row['llama.cpp'][0] / row[e][0]:.2f}x, "
                     f"CPU {row['llama.cpp'][1] / row[e][1]:.2f}x")
        print(f"  {t} thread{'s' if t > 1 else ''}: {text}")
    print("soft tokens:", {e: list(o.shape) for e, o in outs.items()})
    if "llambda" in outs and "llama.cpp" in outs:
        print("  llambda against llama.cpp:", compare(outs["llambda"], outs["llama.cpp"]))
    if "llambda-f32" in outs:
        for e in [e for e in args.engines if e != "llambda-f32"]:
            print(f"  {e} against llambda's float32:", compare(outs[e], outs["llambda-f32"]))


if __name__ == "__main__":
    main()

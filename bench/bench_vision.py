"""Time to encode one image with a real-sized random Gemma 3 vision tower, or one crop with SmolVLM-256M's
(not a test).

    python bench/bench_vision.py [--family gemma3|idefics3] [--backends native numpy] [--threads 2] [--layers N]
                                 [--activations q8 f32]

Gemma 3's tower: SigLIP so400m-sized, 27 layers of 1152, 16 heads of 72, MLP 4304, 896 x 896 images in
14-pixel patches: 4096 patches, pooled to 256 tokens of 2560. SmolVLM-256M's (idefics3): 12 layers of 768, 12
heads of 64, MLP 3072, 512 x 512 crops in 16-pixel patches: 1024 patches, pixel-shuffled by 4 to 64 tokens
of 576 (an image is up to 17 such crops). Random F16 weights made as the loader asks for them (nothing is
downloaded). Prints, per backend, the load time, then one encode's wall and
CPU time (process CPU: on a shared machine the CPU column is the steadier) and the load average.
"""
import argparse
import os
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda

import numpy as np  # noqa: E402

from llambda.backends import create_backend  # noqa: E402
from llambda.formats.quants import QType  # noqa: E402
from llambda.formats.weights import WeightTensor  # noqa: E402
from llambda.vision.config import VisionConfig  # noqa: E402
from llambda.vision.idefics3 import PROJ as CONNECTOR  # noqa: E402
from llambda.vision.tower import VisionTower  # noqa: E402


def gemma3_config(layers: int) -> VisionConfig:
    return VisionConfig.from_fields({
        "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": layers, "num_attention_heads": 16,
        "image_size": 896, "patch_size": 14, "layer_norm_eps": 1e-6, "mm_tokens_per_image": 256,
        "text_hidden_size": 2560}, source="random Gemma 3 tower")


def idefics3_config(layers: int) -> VisionConfig:
    return VisionConfig.from_fields({
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": layers, "num_attention_heads": 12,
        "image_size": 512, "patch_size": 16, "layer_norm_eps": 1e-6, "projector": "idefics3", "scale_factor": 4,
        "longest_edge": 2048, "text_hidden_size": 576}, source="random SmolVLM-256M tower")


CONFIGS = {"gemma3": (gemma3_config, 27), "idefics3": (idefics3_config, 12)}


def random_lookup(cfg: VisionConfig):
    """Each tensor drawn from a generator seeded by its name, F16 (norms near 1, small biases)."""
    H, F, C, p = cfg.hidden_size, cfg.intermediate_size, cfg.num_channels, cfg.patch_size
    shapes = {"embeddings.patch_embedding.weight": (H, C, p, p), "embeddings.patch_embedding.bias": (H,),
              "embeddings.position_embedding.weight": (cfg.n_patches, H),
              "post_layernorm.weight": (H,), "post_layernorm.bias": (H,),
              "mm_soft_emb_norm.weight": (H,), "mm_input_projection_weight": (H, cfg.text_hidden_size),
              CONNECTOR: (cfg.text_hidden_size, cfg.scale_factor ** 2 * H)}
    leaves = {"layer_norm1": (H,), "layer_norm2": (H,), "self_attn.q_proj": (H, H), "self_attn.k_proj": (H, H),
              "self_attn.v_proj": (H, H), "self_attn.out_proj": (H, H), "mlp.fc1": (F, H), "mlp.fc2": (H, F)}

    def shape_of(name: str):
        if name in shapes:
            return shapes[name]
        leaf, kind = name.split(".", 3)[3].rsplit(".", 1)
        full = leaves[leaf]
        return full if kind == "weight" else full[:1]

    def lookup(name: str):
        shape = shape_of(name)
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if "norm" in name and name.endswith("weight") and len(shape) == 1:
            v = 1.0 + 0.05 * rng.standard_normal(shape)
        elif len(shape) == 1:
            v = 0.02 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]) if len(shape) > 2 else shape[-1])
        a = np.ascontiguousarray(v.astype(np.float16))
        return WeightTensor(name, QType.F16, tuple(shape), a.reshape(-1).view(np.uint8))
    return lookup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["native", "numpy"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--family", choices=sorted(CONFIGS), default="gemma3")
    ap.add_argument("--layers", type=int, default=None, help="default: the family's (27, 12)")
    ap.add_argument("--activations", default=None, help="native: q8 (bfloat16 products, default) or f32")
    args = ap.parse_args()
    make, layers = CONFIGS[args.family]
    args.layers = args.layers or layers
    cfg = make(args.layers)
    rng = np.random.default_rng(0)
    pixels = rng.uniform(-1, 1, (1, 3, cfg.image_size, cfg.image_size)).astype(np.float32)
    for name in args.backends:
        act = args.activations if name == "native" else None
        t0 = time.perf_counter()
        be = create_backend(name, threads=args.threads, activations=act)
        tower = VisionTower(cfg, random_lookup(cfg), be, 0.0)
        load = time.perf_counter() - t0
        w0, c0 = time.perf_counter(), time.process_time()
        out = tower.encode(pixels)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(f"{name:7s} {be.precision if hasattr(be, 'precision') else 'float32':28s} layers {args.layers} "
              f"threads {args.threads}: load {load:6.1f} s, encode {wall:6.1f} s wall, {cpu:6.1f} s CPU, "
              f"out {list(out.shape)} finite {bool(np.isfinite(out).all())}, load average {os.getloadavg()[0]:.2f}",
              flush=True)
        tower.close()


if __name__ == "__main__":
    main()

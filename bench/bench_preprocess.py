"""CPU time of the image preprocessing alone (not a test): Idefics3 / SmolVLM's crops of one 1024 x 768 image
(Lanczos to 2048 x 1536, 4 x 3 tiles of 512 and the global image: 13 crops) and Qwen2.5-VL's patches of a
448 x 448 and a 644 x 476 image (no resize) and of the 1024 x 768 one (bicubic to 1036 x 756), each split into
its resizes and its rescale + normalize.

    python bench/bench_preprocess.py [--checkout DIR] [-n 7]

--checkout: whose llambda to time (default: this one), so two checkouts can be compared from one script;
run them alternately. Prints the median process CPU time of n calls (ms) and the load average.
"""
import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("-n", type=int, default=7)
    args = ap.parse_args()
    sys.path.insert(0, args.checkout)
    import numpy as np
    from PIL import Image
    from llambda.vision import preprocess
    from llambda.vision.config import VisionConfig
    from llambda.vision.qwen2vl_config import QwenVisionConfig
    from llambda.vision.qwen2vl_pixels import patches
    assert Path(preprocess.__file__).resolve().is_relative_to(Path(args.checkout).resolve()), preprocess.__file__

    def image(w, h):
        rng = np.random.default_rng(3)
        y, x = np.mgrid[0:h, 0:w] / max(w, h)
        base = np.stack([x, y, 0.5 + 0.5 * np.sin(6 * x + 4 * y)], axis=-1) * 200
        return Image.fromarray(np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8), "RGB")

    def median_ms(f):
        ts = []
        for _ in range(args.n):
            c0 = time.process_time()
            f()
            ts.append(time.process_time() - c0)
        return 1000 * float(np.median(ts))

    smol = VisionConfig.from_fields({
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 1, "num_attention_heads": 12,
        "image_size": 512, "patch_size": 16, "layer_norm_eps": 1e-6, "projector": "idefics3", "scale_factor": 4,
        "longest_edge": 2048, "text_hidden_size": 576}, source="SmolVLM-256M's processor")
    qwen = QwenVisionConfig.from_fields({
        "projector": "qwen2_5_vl", "hidden_size": 1280, "intermediate_size": 3420, "num_hidden_layers": 32,
        "num_attention_heads": 16, "patch_size": 14, "text_hidden_size": 2048, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "min_pixels": 3136, "max_pixels": 12845056})
    im = image(1024, 768)
    crops = preprocess._idefics3_crops(preprocess.rgb_image(im), smol)
    out = np.empty((len(crops), 3, 512, 512), np.float32)

    def normalize_crops():       # the checkout's own loop body: pixel_values minus the resizes
        if hasattr(preprocess, "normalize_pixels"):
            for i, c in enumerate(crops):
                preprocess.normalize_pixels(c, smol.rescale_factor, smol.image_mean, smol.image_std, out[i])
        else:
            mean, std = np.asarray(smol.image_mean, np.float32), np.asarray(smol.image_std, np.float32)
            for i, c in enumerate(crops):
                x = (c.astype(np.float64) * smol.rescale_factor).astype(np.float32)
                out[i] = ((x - mean) / std).transpose(2, 0, 1)
    rows = [("idefics3 1024x768, 13 crops: pixel_values", lambda: preprocess.pixel_values(im, smol)),
            ("  of which the resizes", lambda: preprocess._idefics3_crops(preprocess.rgb_image(im), smol)),
            ("  of which rescale + normalize", normalize_crops)]
    for w, h in ((448, 448), (644, 476), (1024, 768)):
        q = image(w, h)
        rows.append((f"qwen2_5_vl {w}x{h}: patches", lambda q=q: patches(q, qwen)))
    for name, f in rows:
        f()
        print(f"{name:44s} {median_ms(f):7.1f} ms CPU (median of {args.n}), load average {os.getloadavg()[0]:.2f}",
              flush=True)


if __name__ == "__main__":
    main()

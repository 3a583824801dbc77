"""LLaVA 1.5's projector and image preprocessing.

Projector (LlavaMultiModalProjector): linear_1 (H * n_features -> text width, bias), exact GELU, linear_2 (text
width -> text width, bias); `multimodal_projector_bias` false: no biases.

Pixels, one S x S crop an image:
- "crop" (a HF directory: CLIPImageProcessor, the PIL backend): with LlavaImageProcessor's do_pad, first padded to
  a square of the longer side, the image at ((long - w) // 2, (long - h) // 2), filled with int(mean * 255) per
  channel; then the shortest edge resized to `shortest_edge` (the other side int(edge * long / short)) by Pillow's
  filter (`resample`, BICUBIC by default), or to S x S where the processor gives no shortest edge; then the
  centre S x S (top (h - S) // 2, left (w - S) // 2).
- "letterbox" (llama.cpp's mmproj, its fixed-size preprocessor): scale = min(S / w, S / h) in float32, the image
  resized (Pillow's BICUBIC; llama.cpp's own bicubic differs by a level or so) to min(ceil(w * scale), S) x
  min(ceil(h * scale), S) and pasted at ((S - w') // 2, (S - h') // 2) on an S x S canvas of (122, 116, 104), the
  colour llama.cpp fixes for every LLaVA mmproj; an S x S image is taken as it is.
Then rescale and normalize as every tower here (preprocess.normalize_pixels), channels first.
"""
from __future__ import annotations

import math

import numpy as np

from .image import pillow
from .llava_config import LlavaVisionConfig
from .preprocess import normalize_pixels, rgb_image
from .siglip import fetch

LLAMA_CPP_PAD = (122, 116, 104)


class LlavaProjector:
    def __init__(self, cfg: LlavaVisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        D, W = cfg.text_hidden_size, cfg.feature_width

        def dense(name, rows, cols):
            bias = fetch(lookup, name + ".bias", (rows,)) if cfg.projector_bias else None
            return backend.prepare_dense(fetch(lookup, name + ".weight", (rows, cols)), bias)

        self.fc1 = dense("linear_1", D, W)
        self.fc2 = dense("linear_2", D, D)
        self.newline = fetch(lookup, "image_newline", (D,)) if cfg.grid_pinpoints else None    # LLaVA-NeXT's
        self.mid = np.empty((cfg.mm_tokens_per_image, D), np.float32)

    def forward(self, features: np.ndarray, out: np.ndarray) -> None:
        """features [tokens, H * n_features] -> out [tokens, text width]."""
        self.be.dense(features, self.fc1, self.mid)
        self.be.gelu_erf(self.mid)
        self.be.dense(self.mid, self.fc2, out)


def _crop_image(rgb, cfg: LlavaVisionConfig):
    Image, _ = pillow()
    S = cfg.image_size
    if cfg.do_pad and rgb.size[0] != rgb.size[1]:
        w, h = rgb.size
        side = max(w, h)
        canvas = Image.new("RGB", (side, side), tuple(int(m * 255) for m in cfg.image_mean))
        canvas.paste(rgb, ((side - w) // 2, (side - h) // 2))
        rgb = canvas
    w, h = rgb.size
    if cfg.shortest_edge:
        e = cfg.shortest_edge
        size = (e, int(e * h / w)) if w <= h else (int(e * w / h), e)
    else:
        size = (S, S)
    if size != (w, h):
        rgb = rgb.resize(size, resample=cfg.resample)
    a = np.asarray(rgb, np.uint8)
    top, left = (a.shape[0] - S) // 2, (a.shape[1] - S) // 2
    return a[top:top + S, left:left + S]


def _letterbox_image(rgb, cfg: LlavaVisionConfig):
    Image, _ = pillow()
    S = cfg.image_size
    w, h = rgb.size
    if (w, h) == (S, S):
        return np.asarray(rgb, np.uint8)
    scale = min(np.float32(S) / np.float32(w), np.float32(S) / np.float32(h))
    nw = min(math.ceil(np.float32(w) * scale), S)
    nh = min(math.ceil(np.float32(h) * scale), S)
    canvas = Image.new("RGB", (S, S), LLAMA_CPP_PAD)
    resized = rgb if (nw, nh) == (w, h) else rgb.resize((nw, nh), resample=Image.Resampling.BICUBIC)
    canvas.paste(resized, ((S - nw) // 2, (S - nh) // 2))
    return np.asarray(canvas, np.uint8)


def llava_pixels(image, cfg: LlavaVisionConfig) -> np.ndarray:
    """float32 [1, 3, S, S] of a PIL image (or the bytes of an image file)."""
    rgb = rgb_image(image)
    a = _crop_image(rgb, cfg) if cfg.preprocess == "crop" else _letterbox_image(rgb, cfg)
    S = cfg.image_size
    out = np.empty((1, 3, S, S), np.float32)
    normalize_pixels(np.ascontiguousarray(a), cfg.rescale_factor, cfg.image_mean, cfg.image_std, out[0])
    return out

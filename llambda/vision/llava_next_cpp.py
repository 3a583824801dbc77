"""LLaVA-NeXT's anyres images as llama.cpp preprocesses them for an mmproj with image_grid_pinpoints (libmtmd's
llava-uhd preprocessor with pinpoints, as llama-cpp-python 0.3.36 bundles it), where transformers'
LlavaNextImageProcessor (llava_next.py) differs:

- an image no larger than S x S (both sides <= the tower's image_size) is not tiled: the base crop alone (its
  tokens_per_image rows; transformers always tiles);
- the pinpoint: for each (H, W) in the file's order, scale = min(W / w, H / h) in float32, effective =
  min(int(w scale) int(h scale), w h) (float32 products truncated), wasted = H W - effective; the largest
  effective wins, ties the least wasted, the first of equals (transformers' rule, in float64);
- the tiles: the image resized (BICUBIC: Pillow here, llama.cpp's own Pillow-like filter there) to
  min(ceil(w scale), W) x min(ceil(h scale), H), scale as above in float32, pasted on black at
  ((W - w') // 2, (H - h') // 2), cut into S x S tiles row-major; the base crop the whole image resized to S x S.

The rows are then laid out as LLaVA-NeXT's spatial_unpad says (llava_next.pack: the base first, the tiles' grid
unpadded to the image's aspect as transformers computes it, image_newline after each row), which is not what
llama.cpp does with them (docs/VISION.md).
"""
from __future__ import annotations

import math

import numpy as np

from .llava_config import LlavaVisionConfig
from .preprocess import normalize_pixels, rgb_image

F32 = np.float32


def best_resolution(width: int, height: int, pinpoints) -> tuple[int, int]:
    """(H, W) of the pinpoint llama.cpp picks for a width x height image (select_best_resolution, float32)."""
    best, best_eff, best_waste = None, 0, float("inf")
    for H, W in pinpoints:
        scale = min(F32(W) / F32(width), F32(H) / F32(height))
        eff = min(int(F32(width) * scale) * int(F32(height) * scale), width * height)
        waste = W * H - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (H, W), eff, waste
    return best


def resized_size(width: int, height: int, H: int, W: int) -> tuple[int, int]:
    """(w', h') of the image resized to fit W x H with its aspect (llama.cpp's PAD_CEIL resize, float32)."""
    scale = min(F32(W) / F32(width), F32(H) / F32(height))
    return min(math.ceil(F32(width) * scale), W), min(math.ceil(F32(height) * scale), H)


def tiled(width: int, height: int, cfg: LlavaVisionConfig) -> bool:
    return width > cfg.image_size or height > cfg.image_size


def feature_grid(width: int, height: int, cfg: LlavaVisionConfig) -> tuple[int, int, int, int]:
    """(tile rows, tile cols, feature rows, feature cols); (0, 0, 0, 0) for an image llama.cpp does not tile."""
    if not tiled(width, height, cfg):
        return 0, 0, 0, 0
    from .llava_next import unpadded
    H, W = best_resolution(width, height, cfg.grid_pinpoints)
    th, tw = H // cfg.image_size, W // cfg.image_size
    return (th, tw) + unpadded(width, height, th * cfg.patches_per_side, tw * cfg.patches_per_side)


def next_pixels(image, cfg: LlavaVisionConfig) -> np.ndarray:
    """float32 [1 + tiles, 3, S, S]: the base crop, then the tiles row-major (none for an image within S x S)."""
    rgb = rgb_image(image)
    S, (w, h) = cfg.image_size, rgb.size
    crops = [np.asarray(rgb if (w, h) == (S, S) else rgb.resize((S, S), cfg.resample), np.uint8)]
    if tiled(w, h, cfg):
        H, W = best_resolution(w, h, cfg.grid_pinpoints)
        nw, nh = resized_size(w, h, H, W)
        canvas = np.zeros((H, W, 3), np.uint8)
        x0, y0 = (W - nw) // 2, (H - nh) // 2
        canvas[y0:y0 + nh, x0:x0 + nw] = np.asarray(rgb if (nw, nh) == (w, h) else rgb.resize((nw, nh),
                                                                                               cfg.resample))
        crops += [canvas[y:y + S, x:x + S] for y in range(0, H, S) for x in range(0, W, S)]
    out = np.empty((len(crops), 3, S, S), np.float32)
    for i, crop in enumerate(crops):
        normalize_pixels(np.ascontiguousarray(crop), cfg.rescale_factor, cfg.image_mean, cfg.image_std, out[i])
    return out

"""LFM2-VL's image processor (transformers' Lfm2VlImageProcessor): an RGB image -> its crops' flattened patches.

1. smart_resize, f = encoder_patch_size x downsample_factor: h' = max(f, round(h / f) f) (Python's round), w'
   likewise; past max_image_tokens f^2 pixels: beta = sqrt(h w / that), each side max(f, floor(side / beta / f) f);
   under min_image_tokens f^2: beta = sqrt(that / (h w)), each side ceil(side beta / f) f.
2. Split (do_image_splitting, and not min_tiles = max_tiles = 1) when the image is too large:
   max(p, round(h / f) f) max(p, round(w / f) f) > max_image_tokens f^2 max_pixels_tolerance. The grid (cols, rows)
   is the ratio (c, r) with min_tiles <= c r <= max_tiles closest to w / h, the ratios in the order of c r (ties
   between equal distances: the later one when the image's area passes half of c r tile^2 pixels); the image
   resized to cols tile x rows tile, cut row-major into tiles, then (use_thumbnail) the whole image at its
   smart_resize size, the thumbnail, last. Otherwise one crop: the image at its smart_resize size.
3. Every resize Pillow's BILINEAR (antialiased) from the decoded image, back to 8 bits (transformers runs
   torchvision's resize on the uint8 image: the same filter, within one level on a few values of a downscale).
4. Values (x - mean / rescale) / (std / rescale) in float32 (transformers' fused rescale and normalize), the crop
   cut into patches row-major, each patch's values in (y, x, channel) order: [gh * gw, p * p * C].
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import InvalidInputError
from .image import pillow
from .lfm2vl_config import Lfm2VlVisionConfig
from .preprocess import rgb_image


def smart_resize(height: int, width: int, c: Lfm2VlVisionConfig) -> tuple[int, int]:
    """(h', w') of step 1."""
    f = c.factor
    lo, hi = c.min_image_tokens * f * f, c.max_image_tokens * f * f
    hb, wb = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if hb * wb > hi:
        beta = math.sqrt(height * width / hi)
        hb, wb = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif hb * wb < lo:
        beta = math.sqrt(lo / (height * width))
        hb, wb = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return hb, wb


def splits(height: int, width: int, c: Lfm2VlVisionConfig) -> bool:
    if not c.do_image_splitting or c.min_tiles == c.max_tiles == 1:
        return False
    f, p = c.factor, c.patch_size
    area = max(p, round(height / f) * f) * max(p, round(width / f) * f)
    return area > c.max_image_tokens * f * f * c.max_pixels_tolerance


@functools.lru_cache(maxsize=16)
def _ratios(lo: int, hi: int) -> list:
    return sorted({(w, h) for n in range(lo, hi + 1) for w in range(1, n + 1) for h in range(1, n + 1)
                   if lo <= w * h <= hi}, key=lambda x: x[0] * x[1])


def tile_grid(height: int, width: int, c: Lfm2VlVisionConfig) -> tuple[int, int]:
    """(rows, cols) of the tiles of a split image."""
    aspect, best, diff = width / height, (1, 1), float("inf")
    for w, h in _ratios(c.min_tiles, c.max_tiles):
        d = abs(aspect - w / h)
        if d < diff:
            best, diff = (w, h), d
        elif d == diff and width * height > 0.5 * c.tile_size * c.tile_size * w * h:
            best = (w, h)
    return best[1], best[0]


def layout(width: int, height: int, c: Lfm2VlVisionConfig) -> tuple[int, int, int, int]:
    """(rows, cols, th, tw) of an image of width x height as decoded: its tiles (1, 1: not split) and the soft-token
    grid of the single image or the thumbnail (th x tw tokens, row-major)."""
    nh, nw = smart_resize(height, width, c)
    if (nh // c.patch_size) * (nw // c.patch_size) > c.max_crop_patches:
        # (a thin image: smart_resize keeps a side at least f, so the other passes the token bound; transformers'
        # padding to the most patches a crop has fails on it too)
        raise InvalidInputError(f"an image of {width} x {height} pixels is too thin: its {nw} x {nh} resize passes "
                                f"the {c.max_crop_patches} patches a crop may have")
    rows, cols = tile_grid(height, width, c) if splits(height, width, c) else (1, 1)
    return rows, cols, nh // c.factor, nw // c.factor


def crop_count(rows: int, cols: int, c: Lfm2VlVisionConfig) -> int:
    return rows * cols + (1 if rows * cols > 1 and c.use_thumbnail else 0)


@functools.lru_cache(maxsize=8)
def _table(rescale: float, mean: tuple, std: tuple) -> np.ndarray:
    """float32 [C, 256]: each byte's value, transformers' fused arithmetic: (x - m) / s with m = mean * (1 / rescale),
    s = std * (1 / rescale), in float32."""
    k = np.float32(1.0 / rescale)
    m = np.asarray(mean, np.float32) * k
    s = np.asarray(std, np.float32) * k
    t = (np.arange(256, dtype=np.float32)[:, None] - m) / s
    t = np.ascontiguousarray(t.T.astype(np.float32))
    t.flags.writeable = False
    return t


def crop_patches(a: np.ndarray, c: Lfm2VlVisionConfig) -> tuple[np.ndarray, tuple[int, int]]:
    """uint8 [H, W, C] (H, W multiples of the patch) -> (float32 [gh * gw, p * p * C], (gh, gw))."""
    table = _table(float(c.rescale_factor), tuple(c.image_mean), tuple(c.image_std))
    H, W, C = a.shape
    p = c.patch_size
    gh, gw = H // p, W // p
    v = np.empty((H, W, C), np.float32)
    for ch in range(C):
        np.take(table[ch], a[..., ch], out=v[..., ch], mode="wrap")
    return np.ascontiguousarray(v.reshape(gh, p, gw, p, C).transpose(0, 2, 1, 3, 4).reshape(gh * gw, p * p * C)), (gh, gw)


def crops(image, c: Lfm2VlVisionConfig) -> list[tuple[np.ndarray, tuple[int, int]]]:
    """The crops of a PIL image (or image bytes) in prompt order: each (patches, (gh, gw))."""
    Image, _ = pillow()
    rgb = rgb_image(image)
    width, height = rgb.size
    if width < 1 or height < 1:
        raise InvalidInputError("an empty image")
    bilinear = Image.Resampling.BILINEAR
    rows, cols, th, tw = layout(width, height, c)
    small = (tw * c.factor, th * c.factor)
    if rows * cols == 1:
        return [crop_patches(np.asarray(rgb.resize(small, resample=bilinear), np.uint8), c)]
    T = c.tile_size
    big = np.asarray(rgb.resize((cols * T, rows * T), resample=bilinear), np.uint8)
    out = [crop_patches(np.ascontiguousarray(big[r * T:(r + 1) * T, k * T:(k + 1) * T]), c)
           for r in range(rows) for k in range(cols)]
    del big
    if c.use_thumbnail:
        out.append(crop_patches(np.asarray(rgb.resize(small, resample=bilinear), np.uint8), c))
    return out

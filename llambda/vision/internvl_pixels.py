"""InternVL's image processor (transformers' GotOcr2ImageProcessor with crop_to_patches, which InternVLProcessor
always passes, its PIL backend): the image resized to a grid of square tiles whose aspect ratio is closest to the
image's, cut row-major, plus the whole image as a thumbnail when there is more than one tile.

The grid (cols, rows): every (w, h) with min_patches <= w * h <= max_patches, enumerated w outer and h inner, then
stably sorted by w * h; the first with the smallest |width / height - w / h| is taken, and a later one at the same
distance replaces it when the image's area is more than half the tiles' (width * height > 0.5 * S * S * w * h).
The resizes are Pillow's with the processor's filter (BICUBIC by default) on the 8-bit RGB image; each tile then
x rescale_factor (float64, then float32) and (x - mean) / std in float32, channels first.
"""
from __future__ import annotations

import functools

import numpy as np

from .internvl_config import InternVLConfig
from .preprocess import normalize_pixels, rgb_image


@functools.lru_cache(maxsize=16)
def _arrangements(lo: int, hi: int) -> tuple:
    pairs = [(w, h) for w in range(1, hi + 1) for h in range(1, hi + 1) if lo <= w * h <= hi]
    return tuple(sorted(pairs, key=lambda g: g[0] * g[1]))


def tile_grid(width: int, height: int, cfg: InternVLConfig) -> tuple[int, int]:
    """(cols, rows) of the tiles of an image of width x height pixels (see the module's note)."""
    aspect, area, S = width / height, width * height, cfg.image_size
    best, best_diff = (1, 1), float("inf")
    for w, h in _arrangements(cfg.min_patches, cfg.max_patches):
        diff = abs(aspect - w / h)
        if diff < best_diff:
            best, best_diff = (w, h), diff
        elif diff == best_diff and area > 0.5 * S * S * w * h:
            best = (w, h)
    return best


def grid(width: int, height: int, cfg: InternVLConfig) -> tuple[int, int]:
    """VisionTower.grid's (rows, cols): the tiles' grid, (0, 0) for a single tile (no thumbnail then)."""
    cols, rows = tile_grid(width, height, cfg)
    return (0, 0) if cols * rows == 1 else (rows, cols)


def pixel_values(image, cfg: InternVLConfig) -> np.ndarray:
    """float32 [n_tiles, 3, S, S] of a PIL image (or an image file's bytes): the tiles row-major, then the thumbnail
    (when more than one tile)."""
    rgb = rgb_image(image)
    S = cfg.image_size
    cols, rows = tile_grid(rgb.size[0], rgb.size[1], cfg)
    a = np.asarray(rgb.resize((S * cols, S * rows), resample=cfg.resample), np.uint8)
    crops = [a[r * S:(r + 1) * S, c * S:(c + 1) * S] for r in range(rows) for c in range(cols)]
    if len(crops) > 1:
        crops.append(np.asarray(rgb.resize((S, S), resample=cfg.resample), np.uint8))
    out = np.empty((len(crops), cfg.num_channels, S, S), np.float32)
    for i, crop in enumerate(crops):
        normalize_pixels(crop, cfg.rescale_factor, cfg.image_mean, cfg.image_std, out[i])
    return out

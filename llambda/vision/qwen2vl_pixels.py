"""Qwen2-VL's image processor (Qwen2VLImageProcessor, its PIL backend): an RGB image -> its flattened patches.

- smart_resize: h' = round(h / f) * f, w' likewise (f = patch * merge = 28; Python's round, half to even); if
  h' w' > max_pixels: beta = sqrt(h w / max_pixels), h' = max(f, floor(h / beta / f) * f), w' likewise; elif
  h' w' < min_pixels: beta = sqrt(min_pixels / (h w)), h' = ceil(h beta / f) * f, w' likewise. An aspect ratio
  past 200 is refused (transformers raises too).
- Pillow's BICUBIC resize to w' x h' (8 bits), x * rescale in float64 then float32, (x - mean) / std in float32.
- Patches: the image [C, h', w'] cut into patches of P x P, grouped by merged cell (merge x merge patches):
  row 4 (i * mw + j) + merge a + b (merge 2) is patch (merge i + a, merge j + b), the cells (i, j) row-major;
  each row the channel's P x P values repeated temporal_patch_size times: [C, T, P, P] flattened.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from .image import pillow
from .preprocess import normalize_pixels, rgb_image
from .qwen2vl_config import MAX_ASPECT, QwenVisionConfig


def smart_resize(height: int, width: int, cfg: QwenVisionConfig) -> tuple[int, int]:
    """(h', w') the processor resizes an image of height x width to (see the module's note)."""
    f = cfg.factor
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise InvalidInputError(f"the image is {width} x {height} pixels: its aspect ratio is past {MAX_ASPECT}, which "
                                "Qwen2-VL's image processor refuses")
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > cfg.max_pixels:
        beta = math.sqrt(height * width / cfg.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def patch_grid(width: int, height: int, cfg: QwenVisionConfig) -> tuple[int, int]:
    """(rows, cols) of patches of an image of width x height (as decoded: EXIF orientation applied)."""
    h, w = smart_resize(height, width, cfg)
    if h * w > cfg.max_pixels + cfg.factor * (h + w):      # min_pixels' ceil may pass it by a cell a side
        raise InvalidInputError(f"the image of {width} x {height} pixels would be resized to {w} x {h}: past "
                                f"max_pixels {cfg.max_pixels}")
    return h // cfg.patch_size, w // cfg.patch_size


def patches(image, cfg: QwenVisionConfig, grid_of=patch_grid) -> tuple[np.ndarray, tuple[int, int]]:
    """(float32 [rows * cols, C*T*P*P], (rows, cols)): the flattened patches of a PIL image (or image file bytes)
    and its patch grid (`grid_of(width, height, cfg)`: a family's own resize rule, GLM-4.1V's)."""
    Image, _ = pillow()
    rgb = rgb_image(image)
    gh, gw = grid_of(*rgb.size, cfg)
    P, m, T = cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    a = np.asarray(rgb.resize((gw * P, gh * P), resample=Image.Resampling.BICUBIC), np.uint8)
    x = normalize_pixels(a, cfg.rescale_factor, cfg.image_mean, cfg.image_std)      # [C, h', w']
    C = x.shape[0]
    # [C, h', w'] -> (C, cell row, a, y, cell col, b, x) -> (cell row, cell col, a, b, C, y, x)
    v = x.reshape(C, gh // m, m, P, gw // m, m, P).transpose(1, 4, 2, 5, 0, 3, 6)
    out = np.empty((gh // m, gw // m, m, m, C, T, P, P), np.float32)
    out[...] = v[:, :, :, :, :, None]
    return out.reshape(gh * gw, C * T * P * P), (gh, gw)

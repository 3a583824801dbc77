"""GLM-4.1V's image processor (Glm4vImageProcessor, its PIL backend): Qwen2-VL's (qwen2vl_pixels.py: bicubic
resize, rescale, normalize, the same patch order) with its own smart_resize, which counts the image as its two
temporal copies (num_frames = temporal_patch_size = 2):

- a side under f = patch x merge (28): scale = max(f / h, f / w), h = int(h scale), w = int(w scale);
- an aspect ratio past 200 refused (InvalidInputError, as transformers raises);
- h' = round(h / f) f, w' likewise (Python's round); if 2 h' w' > max_pixels: beta = sqrt(2 h w / max_pixels),
  each side max(f, floor(side / beta / f) f); elif 2 h' w' < min_pixels: beta = sqrt(min_pixels / (2 h w)), each
  side ceil(side beta / f) f.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from . import qwen2vl_pixels
from .glm4v_config import Glm4vVisionConfig
from .qwen2vl_config import MAX_ASPECT


def smart_resize(height: int, width: int, cfg: Glm4vVisionConfig) -> tuple[int, int]:
    """(h', w') the processor resizes an image of height x width to (see the module's note)."""
    f, frames = cfg.factor, cfg.temporal_patch_size
    if height < f or width < f:
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    if min(height, width) < 1 or max(height, width) / min(height, width) > MAX_ASPECT:
        raise InvalidInputError(f"the image is {width} x {height} pixels (as resized to reach {f} a side): its aspect "
                                f"ratio is past {MAX_ASPECT}, which GLM-4.1V's image processor refuses")
    h, w = round(height / f) * f, round(width / f) * f
    if frames * h * w > cfg.max_pixels:
        beta = math.sqrt(frames * height * width / cfg.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif frames * h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (frames * height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def patch_grid(width: int, height: int, cfg: Glm4vVisionConfig) -> tuple[int, int]:
    """(rows, cols) of patches of an image of width x height (as decoded: EXIF orientation applied)."""
    h, w = smart_resize(height, width, cfg)
    if h * w > cfg.max_patches() * cfg.patch_size ** 2:
        raise InvalidInputError(f"the image of {width} x {height} pixels would be resized to {w} x {h}: past "
                                f"max_pixels {cfg.max_pixels}")
    return h // cfg.patch_size, w // cfg.patch_size


def patches(image, cfg: Glm4vVisionConfig) -> tuple[np.ndarray, tuple[int, int]]:
    """(float32 [rows * cols, C*T*P*P], (rows, cols)): the flattened patches of a PIL image (or image bytes)."""
    return qwen2vl_pixels.patches(image, cfg, patch_grid)

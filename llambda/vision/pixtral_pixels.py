"""Pixtral's image processor (PixtralImageProcessor, its PIL backend, with the patch size Mistral 3's processor
passes it: patch x spatial_merge_size, 28 for Mistral Small 3.1): an RGB image -> [C, h', w'].

- ratio = max(h / L, w / L), L the processor's size.longest_edge; if ratio > 1: h = floor(h / ratio), w = floor(w /
  ratio) (the image is never enlarged to L); then each side up to a multiple of f = patch x merge:
  ((side - 1) // f + 1) f. A side that comes to 0 (an aspect ratio past L) is refused: transformers' would be
  an empty image.
- Pillow's BICUBIC resize to w' x h' (8 bits), x * rescale in float64 then float32, (x - mean) / std in float32,
  channels first.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from .image import pillow
from .pixtral_config import PixtralConfig
from .preprocess import normalize_pixels, rgb_image


def resized(width: int, height: int, cfg: PixtralConfig) -> tuple[int, int]:
    """(h', w') the processor resizes an image of width x height to."""
    h, w, L, f = height, width, cfg.longest_edge, cfg.factor
    ratio = max(h / L, w / L)
    if ratio > 1:
        h, w = math.floor(h / ratio), math.floor(w / ratio)
    if h < 1 or w < 1:
        raise InvalidInputError(f"the image is {width} x {height} pixels: scaled to a longest edge of {L} it has "
                                "no pixel left a side")
    return (h - 1) // f * f + f, (w - 1) // f * f + f


def pixels(image, cfg: PixtralConfig) -> np.ndarray:
    """float32 [C, h', w'] of a PIL image (or image file bytes)."""
    Image, _ = pillow()
    rgb = rgb_image(image)
    h, w = resized(*rgb.size, cfg)
    a = np.asarray(rgb.resize((w, h), resample=Image.Resampling.BICUBIC), np.uint8)
    return normalize_pixels(a, cfg.rescale_factor, cfg.image_mean, cfg.image_std)

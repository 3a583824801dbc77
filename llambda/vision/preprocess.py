"""An RGB image -> the tower's pixel values, as Gemma3ImageProcessor makes them (pan-and-scan off, its
default): Pillow's BILINEAR resize (its antialiased filter) to image_size x image_size, x * rescale_factor
in float64 then float32, (x - mean) / std in float32, channels first."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from .config import VisionConfig
from .image import load_image, pillow, to_rgb


def pixel_values(image, cfg: VisionConfig) -> np.ndarray:
    """float32 [3, image_size, image_size] of a PIL image (or the bytes of an image file)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = load_image(image)
    Image, _ = pillow()
    if not isinstance(image, Image.Image):
        raise InvalidInputError(f"an image must be a PIL image or the bytes of an image file, got "
                                f"{type(image).__name__}")
    side = cfg.image_size
    rgb = to_rgb(image).resize((side, side), resample=Image.Resampling.BILINEAR)
    x = np.asarray(rgb, dtype=np.uint8)                                   # (H, W, 3)
    x = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)

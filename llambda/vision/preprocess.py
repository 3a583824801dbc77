"""An RGB image -> the tower's pixel values [n_crops, 3, S, S], as each family's image processor makes them.

- Gemma 3 (Gemma3ImageProcessor, pan-and-scan off, its default): one crop, Pillow's BILINEAR resize (its
  antialiased filter) to S x S.
- Idefics3 / SmolVLM (Idefics3ImageProcessor): the longest edge resized to `longest_edge` (aspect kept, the
  other side rounded up to even), then, with do_image_splitting, resized again to multiples of the crop S
  and cut into rows x cols crops (row-major) followed by the whole image resized to S x S (the "global
  image"); no split where it is one crop already; without splitting, the image resized to S x S. Every
  resize is Pillow's, with the processor's filter, back to 8 bits each time, as transformers' PIL backend.

Then, for every crop, x * rescale_factor in float64 then float32, (x - mean) / std in float32, channels first
(normalize_pixels: that arithmetic done once on the 256 byte values of each channel, then looked up).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import InvalidInputError
from .config import MAX_LONGEST_EDGE, VisionConfig
from .image import load_image, pillow, to_rgb


def rgb_image(image):
    """The RGB copy (image.to_rgb) of a PIL image or of the bytes of an image file; InvalidInputError otherwise."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = load_image(image)
    Image, _ = pillow()
    if not isinstance(image, Image.Image):
        raise InvalidInputError(f"an image must be a PIL image or the bytes of an image file, got "
                                f"{type(image).__name__}")
    return to_rgb(image)


@functools.lru_cache(maxsize=8)
def _byte_table(rescale: float, mean: tuple, std: tuple) -> np.ndarray:
    """float32 [C, 256]: channel c's value for each byte, by the processor's own arithmetic and order."""
    x = (np.arange(256, dtype=np.float64)[:, None] * rescale).astype(np.float32)          # [256, 1]
    t = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)                  # [256, C], float32
    t = np.ascontiguousarray(t.T)
    t.flags.writeable = False
    return t


def normalize_pixels(a: np.ndarray, rescale: float, mean, std, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [C, H, W] of uint8 [H, W, C] (into `out` if given): the bits of transformers' order, x * rescale in
    float64 then float32, then (x - mean) / std in float32, channels first. Each value depends on its byte and
    channel alone, so the arithmetic is done once on the 256 bytes of each channel (the same float64 and
    float32 operations, IEEE-rounded the same) and the image looked up in those tables: 2-3x less CPU than
    the whole image through float64."""
    table = _byte_table(float(rescale), tuple(float(v) for v in mean), tuple(float(v) for v in std))
    C = a.shape[-1]
    if out is None:
        out = np.empty((C,) + a.shape[:-1], np.float32)
    for c in range(C):      # the indices are bytes: never out of range ("wrap": no bounds check, no buffer)
        np.take(table[c], a[..., c], out=out[c], mode="wrap")
    return out


def pixel_values(image, cfg: VisionConfig) -> np.ndarray:
    """float32 [n_crops, 3, image_size, image_size] of a PIL image (or the bytes of an image file)."""
    Image, _ = pillow()
    rgb = rgb_image(image)
    crops = _idefics3_crops(rgb, cfg) if cfg.projector == "idefics3" else [
        np.asarray(rgb.resize((cfg.image_size, cfg.image_size), resample=Image.Resampling.BILINEAR), np.uint8)]
    S = cfg.image_size
    out = np.empty((len(crops), 3, S, S), np.float32)
    for i, crop in enumerate(crops):
        normalize_pixels(crop, cfg.rescale_factor, cfg.image_mean, cfg.image_std, out[i])
    return out


def longest_edge_size(width: int, height: int, longest: int) -> tuple[int, int]:
    """(w, h) after Idefics3's first resize: the longest edge to `longest`, the other by the aspect ratio,
    truncated, then up to even; both at least 1; then below MAX_LONGEST_EDGE the same way (no even rule)."""
    aspect = width / height
    if width >= height:
        w, h = longest, int(longest / aspect)
        h += h % 2
    else:
        w, h = int(longest * aspect), longest
        w += w % 2
    w, h = max(w, 1), max(h, 1)
    aspect = w / h
    if w >= h and w > MAX_LONGEST_EDGE:
        w, h = MAX_LONGEST_EDGE, int(MAX_LONGEST_EDGE / aspect)
    elif h > w and h > MAX_LONGEST_EDGE:
        w, h = int(MAX_LONGEST_EDGE * aspect), MAX_LONGEST_EDGE
    return max(w, 1), max(h, 1)


def split_size(width: int, height: int, crop: int) -> tuple[int, int]:
    """(w, h) after Idefics3's second resize (with splitting): the longest side up to a multiple of `crop`,
    the other its aspect-scaled length, truncated, then up to a multiple of `crop`; at least one crop (a side
    of 1 against a long one can truncate to 0: 49 * (1 / 49) < 1, where transformers' resize fails)."""
    aspect = width / height
    if width >= height:
        w = math.ceil(width / crop) * crop
        h = math.ceil(int(w / aspect) / crop) * crop
    else:
        h = math.ceil(height / crop) * crop
        w = math.ceil(int(h * aspect) / crop) * crop
    return max(w, crop), max(h, crop)


def idefics3_grid(width: int, height: int, cfg: VisionConfig) -> tuple[int, int]:
    """(rows, cols) of the crops of an image of width x height (as decoded: EXIF orientation applied); (0, 0)
    where it is not split (one crop: the whole image)."""
    if not cfg.do_image_splitting:
        return 0, 0
    crop = cfg.image_size
    w, h = split_size(*longest_edge_size(width, height, cfg.longest_edge), crop)
    if w > crop or h > crop:
        return (h - crop) // crop + 1, (w - crop) // crop + 1
    return 0, 0


def _idefics3_crops(rgb, cfg: VisionConfig) -> list:
    """uint8 [S, S, 3] crops of an RGB image, in prompt order (rows x cols row-major, then the global image)."""
    crop, resample = cfg.image_size, cfg.resample
    im = rgb.resize(longest_edge_size(*rgb.size, cfg.longest_edge), resample=resample)   # a same-size resize: a copy
    if not cfg.do_image_splitting:
        return [np.asarray(im.resize((crop, crop), resample=resample), np.uint8)]
    im = im.resize(split_size(*im.size, crop), resample=resample)
    w, h = im.size
    if w <= crop and h <= crop:
        return [np.asarray(im, np.uint8)]
    a = np.asarray(im, np.uint8)
    out = [a[r:r + crop, c:c + crop] for r in range(0, h - crop + 1, crop) for c in range(0, w - crop + 1, crop)]
    out.append(np.asarray(im.resize((crop, crop), resample=resample), np.uint8))
    return out

"""LLaVA-NeXT's "anyres" images (transformers' LlavaNextImageProcessor and LlavaNextModel.pack_image_features): an
image is a base crop (the whole image resized to S x S, aspect not kept) and the S x S tiles of the grid
resolution `image_grid_pinpoints` fits it best; every crop goes through LLaVA's tower and projector (llava.py,
clip.py: tokens_per_image rows each, the class row dropped), then the tiles' rows are laid out as one grid, cut
back to the image's aspect (the padding's rows or columns removed) and given the image_newline row at the end of
each row; the base's rows come first.

- select_best_resolution: for each pinpoint (H, W): scale = min(W / w, H / h), effective = min(int(w scale) *
  int(h scale), w h), wasted = H W - effective; the largest effective wins, ties the smaller wasted, the first
  of equals.
- the tiles: the image resized (the processor's filter, BICUBIC) to (W, min(ceil(h W / w), H)) where W / w < H / h,
  else (min(ceil(w H / h), W), H); pasted on zeros at ((W - w') // 2, (H - h') // 2); cut row-major.
- the grid of the tiles' rows: (H / S) p rows x (W / S) p columns (p patches a side: tile (i, j)'s patch (r, c) at
  row p i + r, column p j + c); unpadded: where w / h > cols / rows, new = int(round(h cols / w, 7)) and
  (rows - new) // 2 rows cut from the top and from the bottom; else the same for the columns. An image so thin
  that no row or column is left (1 x 30 pixels) is refused (InvalidInputError; transformers keeps the newlines).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from .image import pillow
from .llava_config import LlavaVisionConfig
from .preprocess import normalize_pixels, rgb_image


def best_resolution(width: int, height: int, pinpoints) -> tuple[int, int]:
    """(H, W) of the pinpoint that fits a width x height image best (select_best_resolution)."""
    best, best_eff, best_waste = None, 0, float("inf")
    for H, W in pinpoints:
        scale = min(W / width, H / height)
        eff = min(int(width * scale) * int(height * scale), width * height)
        waste = W * H - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (H, W), eff, waste
    return best


def resized_size(width: int, height: int, H: int, W: int) -> tuple[int, int]:
    """(w', h') of the image resized to fit H x W with its aspect (get_patch_output_size)."""
    if W / width < H / height:
        return W, min(math.ceil(height * (W / width)), H)
    return min(math.ceil(width * (H / height)), W), H


def feature_grid(width: int, height: int, cfg: LlavaVisionConfig) -> tuple[int, int, int, int]:
    """(tile rows, tile cols, feature rows, feature cols) of an image: the tiles of its best pinpoint, the grid of
    their rows unpadded to its aspect."""
    H, W = best_resolution(width, height, cfg.grid_pinpoints)
    p = cfg.patches_per_side
    th, tw = H // cfg.image_size, W // cfg.image_size
    return (th, tw) + unpadded(width, height, th * p, tw * p)


def unpadded(width: int, height: int, rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) of a rows x cols feature grid cut back to a width x height image's aspect (unpad_image)."""
    if width / height > cols / rows:
        new = int(round(height * (cols / width), 7))
        rows -= (rows - new) // 2 * 2
    else:
        new = int(round(width * (rows / height), 7))
        cols -= (cols - new) // 2 * 2
    if not rows or not cols:        # transformers keeps newline rows alone: no image left to read
        raise InvalidInputError(f"an image of {width} x {height} pixels is too thin for LLaVA-NeXT's tiles: none of "
                                "its rows or columns of features is left after the unpadding")
    return rows, cols


def next_pixels(image, cfg: LlavaVisionConfig) -> np.ndarray:
    """float32 [1 + tiles, 3, S, S]: the base crop, then the tiles row-major."""
    Image, _ = pillow()
    rgb = rgb_image(image)
    S, (w, h) = cfg.image_size, rgb.size
    H, W = best_resolution(w, h, cfg.grid_pinpoints)
    nw, nh = resized_size(w, h, H, W)
    canvas = np.zeros((H, W, 3), np.uint8)
    x0, y0 = (W - nw) // 2, (H - nh) // 2
    canvas[y0:y0 + nh, x0:x0 + nw] = np.asarray(rgb if (nw, nh) == (w, h) else rgb.resize((nw, nh), cfg.resample))
    crops = [np.asarray(rgb if (w, h) == (S, S) else rgb.resize((S, S), cfg.resample), np.uint8)]
    crops += [canvas[y:y + S, x:x + S] for y in range(0, H, S) for x in range(0, W, S)]
    out = np.empty((len(crops), 3, S, S), np.float32)
    for i, crop in enumerate(crops):
        normalize_pixels(np.ascontiguousarray(crop), cfg.rescale_factor, cfg.image_mean, cfg.image_std, out[i])
    return out


def pack(rows: np.ndarray, tiles: tuple, grid: tuple, newline: np.ndarray, p: int) -> np.ndarray:
    """The image's rows [base + r (c + 1), D] of its crops' rows [1 + th tw, p p, D] (base first), its tiles
    (th, tw) and its unpadded feature grid (r, c)."""
    (th, tw), (r, c) = tiles, grid
    D = rows.shape[-1]
    full = rows[1:].reshape(th, tw, p, p, D).transpose(0, 2, 1, 3, 4).reshape(th * p, tw * p, D)
    top, left = (th * p - r) // 2, (tw * p - c) // 2
    out = np.empty((p * p + r * (c + 1), D), np.float32)
    out[:p * p] = rows[0]
    body = out[p * p:].reshape(r, c + 1, D)
    body[:, :c] = full[top:top + r, left:left + c]
    body[:, c] = newline
    return out

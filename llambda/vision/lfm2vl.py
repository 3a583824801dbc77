"""LFM2-VL's vision tower (transformers' Siglip2VisionModel in NaFlex use, and Lfm2VlMultiModalProjector) on a
Backend: one crop's flattened patches [gh * gw, p * p * C] -> its soft-token rows [(gh / d) (gw / d), text width].

1. Patch embedding: one dense product of each patch's (y, x, channel) values with the linear weight [H, p*p*C],
   plus its bias.
2. Positions: the learned pos_side x pos_side table resized to the crop's gh x gw patch grid as transformers'
   F.interpolate(bilinear, align_corners=False, antialias=True) weights it, in float32 (`axis_weights`): per axis
   of n outputs, scale = side / n, support = max(scale, 1), centre (i + 0.5) scale - 0.5, source j weighted
   max(0, 1 - |j - centre| / support), the weights normalized to sum 1; row (r, c) = sum_j,k wr[j] wc[k]
   table[j side + k]; added to the patch embedding.
3. SigLIP's pre-LN layers (siglip.run_layers: attention over the crop's patches only, both ways), post_layernorm.
4. Projector: pixel unshuffle by d (token (i, j), row-major over gh/d x gw/d, is the concatenation over a (outer),
   b (inner) in 0..d-1 of patch (d i + a, d j + b)), LayerNorm (eps 1e-5) if projector_use_layernorm, linear_1,
   exact GELU, linear_2 (biases if projector_bias).

Activations are sized per crop (their grid varies) and freed after it.
"""
from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidInputError, ModelClosedError
from . import lfm2vl_pixels as pixels_mod
from .lfm2vl_config import FAMILY, PROJECTOR_LN_EPS, Lfm2VlVisionConfig
from .siglip import GELU_CHUNK, encoder_layers, fetch, run_layers

PROJECTOR = "multi_modal_projector."


def axis_weights(n: int, side: int) -> np.ndarray:
    """float32 [n, side]: antialiased bilinear weights (align_corners False) of n outputs over `side` sources."""
    scale = np.float32(side) / np.float32(n)
    support = max(scale, np.float32(1))
    centre = (np.arange(n, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    w = np.float32(1) - np.abs(np.arange(side, dtype=np.float32)[None, :] - centre[:, None]) / support
    w = np.maximum(w, np.float32(0))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


def position_rows(table: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """float32 [gh * gw, H]: the position table [side^2, H] resized to a gh x gw patch grid, row-major."""
    side = int(round(len(table) ** 0.5))
    wr, wc = axis_weights(gh, side), axis_weights(gw, side)
    w = (wr[:, None, :, None] * wc[None, :, None, :]).reshape(gh * gw, side * side)
    return (w @ table).astype(np.float32)


def unshuffle(hidden: np.ndarray, gh: int, gw: int, d: int) -> np.ndarray:
    """[gh * gw, H] -> [(gh/d) (gw/d), d d H] (see the module's note)."""
    H = hidden.shape[-1]
    return np.ascontiguousarray(hidden.reshape(gh // d, d, gw // d, d, H).transpose(0, 2, 1, 3, 4)
                                .reshape(-1, d * d * H))


class Lfm2VlEncoder:
    def __init__(self, cfg: Lfm2VlVisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, T, M = cfg.hidden_size, cfg.intermediate_size, cfg.text_hidden_size, cfg.projector_hidden_size
        n_in = H * cfg.downsample_factor ** 2
        be = backend

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        def linear(name, rows, cols):
            bias = vec(name + ".bias", rows) if cfg.projector_bias else None
            return be.prepare_dense(fetch(lookup, name + ".weight", (rows, cols)), bias)

        self.patch = be.prepare_dense(fetch(lookup, "embeddings.patch_embedding.weight", (H, cfg.patch_values)),
                                      vec("embeddings.patch_embedding.bias"))
        self.table = fetch(lookup, "embeddings.position_embedding.weight", (cfg.num_patches, H))
        self.layers = encoder_layers(lookup, be, H, F, cfg.num_hidden_layers)
        self.post_ln = (vec("post_layernorm.weight"), vec("post_layernorm.bias"))
        self.norm = ((vec(PROJECTOR + "layer_norm.weight", n_in), vec(PROJECTOR + "layer_norm.bias", n_in))
                     if cfg.projector_use_layernorm else None)
        self.linear_1 = linear(PROJECTOR + "linear_1", M, n_in)
        self.linear_2 = linear(PROJECTOR + "linear_2", T, M)

    def hidden(self, patches: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
        """The last hidden state (post_layernorm) [gh * gw, H] of one crop's patches."""
        cfg, be = self.cfg, self.be
        gh, gw = grid
        n, H = gh * gw, cfg.hidden_size
        x = np.empty((n, H), np.float32)
        h = np.empty((n, H), np.float32)
        be.dense(patches, self.patch, x)
        be.add(x, position_rows(self.table, gh, gw), x)
        qkv = np.empty((n, 3 * H), np.float32)
        ctx = np.empty((n, H), np.float32)
        up = np.empty((n, cfg.intermediate_size), np.float32)
        ones = np.ones(min(GELU_CHUNK, up.size), np.float32)
        run_layers(be, self.layers, cfg.layer_norm_eps, cfg.num_attention_heads, np.array([0, n], np.int32),
                   x, h, qkv, ctx, up, ones)
        del qkv, ctx, up
        be.add_layernorm(x, None, *self.post_ln, cfg.layer_norm_eps, h)
        return h

    def project(self, hidden: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
        """The projector's rows [(gh/d) (gw/d), text width] of a crop's last hidden state."""
        cfg, be = self.cfg, self.be
        src = unshuffle(hidden, *grid, cfg.downsample_factor)
        if self.norm is not None:
            normed = np.empty_like(src)
            be.add_layernorm(src, None, *self.norm, PROJECTOR_LN_EPS, normed)
            src = normed
        mid = np.empty((len(src), cfg.projector_hidden_size), np.float32)
        be.dense(src, self.linear_1, mid)
        be.gelu_erf(mid)
        out = np.empty((len(src), cfg.text_hidden_size), np.float32)
        be.dense(mid, self.linear_2, out)
        return out


class Lfm2VlTower:
    """An LFM2-VL tower: `family` "lfm2_vl", `tokens_per_image` None (an image's tokens follow its size),
    `tile_tokens` (soft tokens a tile), `hidden` (the text width), `deepstack` 0, `attends` "causal",
    `grid(width, height)` -> (rows, cols, th, tw): the tiles (1, 1: not split) and the single image's or
    thumbnail's token grid; `pixels(image)` -> the crops in prompt order, each (patches, (gh, gw));
    `encode_one(patches, (gh, gw))` -> [(gh/d) (gw/d), hidden]; `close()`. Calls from several threads take turns."""

    family = FAMILY
    tokens_per_image = None
    deepstack = 0
    attends = "causal"
    qwen = False

    def __init__(self, cfg: Lfm2VlVisionConfig, lookup, backend, name: str = ""):
        self.cfg, self.backend, self.name = cfg, backend, name
        self.encoder = Lfm2VlEncoder(cfg, lookup, backend)
        backend.end_load()
        self.closed = False
        self._lock = threading.Lock()

    @property
    def hidden(self) -> int:
        return self.cfg.text_hidden_size

    @property
    def tile_tokens(self) -> int:
        return self.cfg.tile_tokens

    def grid(self, width: int, height: int) -> tuple[int, int, int, int]:
        for v in (width, height):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 1 << 20:
                raise InvalidInputError(f"an image's width and height must be integers in 1..{1 << 20}, got "
                                        f"{str(v)[:40]}")
        return pixels_mod.layout(int(width), int(height), self.cfg)

    def pixels(self, image) -> list:
        return pixels_mod.crops(image, self.cfg)

    def _check(self, patches, grid) -> tuple[np.ndarray, tuple[int, int]]:
        if self.closed:
            raise ModelClosedError("the vision tower was closed: its weights were freed")
        c, d = self.cfg, self.cfg.downsample_factor
        if not isinstance(patches, np.ndarray) or patches.ndim != 2 or patches.shape[1] != c.patch_values:
            got = list(patches.shape) if isinstance(patches, np.ndarray) else type(patches).__name__
            raise InvalidInputError(f"encode_one takes flattened patches [n, {c.patch_values}], got {got}")
        if (not isinstance(grid, (tuple, list)) or len(grid) != 2
                or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 < v <= 1 << 20
                           for v in grid) or grid[0] * grid[1] != len(patches) or grid[0] % d or grid[1] % d
                or len(patches) > c.max_crop_patches):
            raise InvalidInputError(f"the grid {str(grid)[:40]} (patch rows, cols, multiples of {d}) does not fit "
                                    f"{len(patches)} patches, or passes a crop's {c.max_crop_patches}")
        px = np.ascontiguousarray(patches, dtype=np.float32)
        if not np.isfinite(px).all():
            raise InvalidInputError("pixels hold non-finite values")
        return px, (int(grid[0]), int(grid[1]))

    def _run(self, patches, grid, project: bool) -> np.ndarray:
        px, grid = self._check(patches, grid)
        with self._lock:
            self._check(px, grid)       # (closed meanwhile?)
            self.backend.enter_forward()
            try:
                hidden = self.encoder.hidden(px, grid)
                return self.encoder.project(hidden, grid) if project else hidden.copy()
            finally:
                self.backend.exit_forward()

    def last_hidden_state(self, patches: np.ndarray, grid: tuple) -> np.ndarray:
        """The tower's last hidden state (post_layernorm) [gh * gw, vision width] of one crop's patches."""
        return self._run(patches, grid, project=False)

    def encode_one(self, patches: np.ndarray, grid: tuple) -> np.ndarray:
        """float32 [(gh/d) (gw/d), hidden]: one crop's soft-token rows, row-major."""
        return self._run(patches, grid, project=True)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.encoder = None
            self.closed = True
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

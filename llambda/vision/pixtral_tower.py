"""PixtralTower: the Pixtral vision tower with Mistral 3's projector, as the language side uses a tower whose
token count follows the image (`tokens_per_image` None, `grid()` the merged grid, `encode_one()`): an image ->
its rows, row-major over the merged grid, which the prompt lays out as rows of [IMG] tokens (models/images)."""
from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidInputError, ModelClosedError
from .pixtral import PixtralEncoder
from .pixtral_config import FAMILY, PixtralConfig
from .pixtral_pixels import pixels, resized

MAX_SIDE = 1 << 20          # an image's width or height as grid() takes it (load_image's bound is far below)


class PixtralTower:
    """`family` "pixtral", `tokens_per_image` None, `hidden` (the text width), `deepstack` 0, `attends` "causal",
    `grid(width, height)` (merged rows, cols), `pixels(image)` -> float32 [C, h', w'], `encode_one(pixels, grid)`
    -> [rows * cols, hidden], `last_hidden_state(pixels, grid)`, `close()`. Calls from several threads take
    turns."""

    family, tokens_per_image, image_size, deepstack, attends = FAMILY, None, None, 0, "causal"

    def __init__(self, cfg: PixtralConfig, lookup, backend, name: str = ""):
        self.cfg, self.backend, self.name = cfg, backend, name
        self.closed, self._lock = False, threading.Lock()
        self.encoder = PixtralEncoder(cfg, lookup, backend)
        backend.end_load()

    hidden = property(lambda self: self.cfg.text_hidden_size)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of soft tokens (merged cells) of an image of width x height pixels as decoded."""
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 < v <= MAX_SIDE
                   for v in (width, height)):
            raise InvalidInputError(f"an image's width and height must be integers in 1..{MAX_SIDE}, got "
                                    f"{str(width)[:20]} x {str(height)[:20]}")
        h, w = resized(int(width), int(height), self.cfg)
        return h // self.cfg.factor, w // self.cfg.factor

    def pixels(self, image) -> np.ndarray:
        """float32 [C, h', w']: the processor's resize, rescale and normalize of a PIL image (or image bytes)."""
        return pixels(image, self.cfg)

    def _check_open(self) -> None:
        if self.closed:
            raise ModelClosedError("the vision tower was closed: its weights were freed")

    def _input(self, px, grid) -> np.ndarray:
        self._check_open()
        c, f = self.cfg, self.cfg.factor
        ok_grid = (isinstance(grid, (tuple, list)) and len(grid) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 < v <= c.longest_edge // f + 1
            for v in grid))
        want = (c.num_channels, int(grid[0]) * f, int(grid[1]) * f) if ok_grid else None
        if not isinstance(px, np.ndarray) or want is None or px.shape != want:
            got = list(px.shape) if isinstance(px, np.ndarray) else type(px).__name__
            raise InvalidInputError(f"encode_one takes pixels [{c.num_channels}, rows * {f}, cols * {f}] and their "
                                    f"merged grid (rows, cols) within the longest edge {c.longest_edge}: got {got} "
                                    f"and {str(grid)[:40]}")
        px = np.ascontiguousarray(px, dtype=np.float32)
        if not np.isfinite(px).all():
            raise InvalidInputError("pixels hold non-finite values")
        return px

    def _run(self, px, hidden_out=None) -> np.ndarray:
        with self._lock:
            self._check_open()
            be, encoder = self.backend, self.encoder
            be.enter_forward()
            try:
                return encoder.forward(px, hidden_out)
            finally:
                be.exit_forward()

    def encode_one(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        """float32 [rows * cols, hidden]: one image's rows, row-major over its merged grid (grid()'s)."""
        return self._run(self._input(pixels, grid))

    def last_hidden_state(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        """The feature layer's hidden state [patches, vision_hidden] (before the projector), patches row-major."""
        px = self._input(pixels, grid)
        out = np.empty((px.shape[1] * px.shape[2] // self.cfg.patch_size ** 2, self.cfg.hidden_size), np.float32)
        self._run(px, out)
        return out

    def close(self) -> None:
        """Free the tower's weights now; later calls raise ModelClosedError."""
        with self._lock:        # not under a running encoding
            was_closed, self.closed, self.encoder = self.closed, True, None
        free = None if was_closed else getattr(self.backend, "close", None)
        if free is not None:
            free()

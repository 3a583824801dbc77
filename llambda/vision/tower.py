"""VisionTower: an image -> the soft-token rows a language model reads in its place (preprocessing into
crops, the SigLIP encoder, the family's projector), on a backend of its own."""
from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidInputError, ModelClosedError
from .config import VisionConfig
from .gemma3 import Gemma3Projector
from .idefics3 import Idefics3Connector
from .preprocess import idefics3_grid, pixel_values
from .siglip import SiglipEncoder

MAX_IMAGES_PER_CALL = 64


class VisionTower:
    """`family` ("gemma3", "idefics3"), `tokens_per_image` (soft tokens per crop), `hidden` (the text model's
    width of each row), `attends` ("block": an image's soft tokens see their whole block; "causal"),
    `grid(width, height)`, `pixels(image)` -> [n_crops, 3, S, S], `encode(pixels)`, `close()`. Calls from
    several threads take turns (one crop's activations are reused)."""

    def __init__(self, cfg: VisionConfig, lookup, backend, soft_norm_offset: float, name: str = ""):
        self.cfg, self.backend, self.name = cfg, backend, name
        self.encoder = SiglipEncoder(cfg, lookup, backend)
        self.projector = (Idefics3Connector(cfg, lookup, backend) if cfg.projector == "idefics3"
                          else Gemma3Projector(cfg, lookup, backend, soft_norm_offset))
        backend.end_load()
        self.closed = False
        self._lock = threading.Lock()

    @property
    def tokens_per_image(self) -> int:
        return self.cfg.mm_tokens_per_image

    @property
    def hidden(self) -> int:
        return self.cfg.text_hidden_size

    @property
    def image_size(self) -> int:
        return self.cfg.image_size

    @property
    def family(self) -> str:
        return self.cfg.projector

    @property
    def attends(self) -> str:
        """"block": an image's soft tokens attend to their whole block both ways (Gemma 3); "causal" (Idefics3)."""
        return "causal" if self.cfg.projector == "idefics3" else "block"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the crops of an image of width x height pixels as decoded (its EXIF orientation
        applied: check_image's size); (0, 0): not split, one crop. pixels() of that image gives
        rows * cols + 1 crops: the tiles row-major, then the whole image."""
        for v in (width, height):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 1 << 20:
                raise InvalidInputError(f"an image's width and height must be integers in 1..{1 << 20}, got "
                                        f"{str(v)[:40]}")
        return idefics3_grid(int(width), int(height), self.cfg) if self.cfg.projector == "idefics3" else (0, 0)

    def _check_open(self) -> None:
        if self.closed:
            raise ModelClosedError("the vision tower was closed: its weights were freed")

    def pixels(self, image) -> np.ndarray:
        """float32 [n_crops, 3, image_size, image_size]: the model's own preprocessing of a PIL image (or image
        bytes); n_crops = rows * cols + 1 of grid() (Gemma 3: 1)."""
        return pixel_values(image, self.cfg)

    def last_hidden_state(self, pixels: np.ndarray) -> np.ndarray:
        """The encoder's output [n_patches, vision_hidden] for one crop's pixels [3, S, S] (a copy)."""
        one = self._one(pixels)
        with self._lock:
            self._check_open()
            self.backend.enter_forward()
            try:
                return self.encoder.forward(one).copy()
            finally:
                self.backend.exit_forward()

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, tokens_per_image, hidden]: the soft-token rows of n crops' pixels [n, 3, S, S]."""
        self._check_open()
        c = self.cfg
        shape = (c.num_channels, c.image_size, c.image_size)
        if not isinstance(pixels, np.ndarray) or pixels.ndim != 4 or tuple(pixels.shape[1:]) != shape:
            got = list(pixels.shape) if isinstance(pixels, np.ndarray) else type(pixels).__name__
            raise InvalidInputError(f"encode takes pixels of shape [n, {', '.join(map(str, shape))}], got {got}")
        n = pixels.shape[0]
        if not 1 <= n <= MAX_IMAGES_PER_CALL:
            raise InvalidInputError(f"encode takes 1 to {MAX_IMAGES_PER_CALL} crops at a time, got {n}")
        images = [self._one(pixels[i]) for i in range(n)]
        out = np.empty((n, c.mm_tokens_per_image, c.text_hidden_size), np.float32)
        with self._lock:
            self._check_open()
            be = self.backend
            be.enter_forward()
            try:
                for i, one in enumerate(images):
                    self.projector.forward(self.encoder.forward(one), out[i])
            finally:
                be.exit_forward()
        return out

    def _one(self, pixels) -> np.ndarray:
        c = self.cfg
        p = np.ascontiguousarray(pixels, dtype=np.float32)
        if p.shape != (c.num_channels, c.image_size, c.image_size):
            raise InvalidInputError(f"pixels must be [{c.num_channels}, {c.image_size}, {c.image_size}], got "
                                    f"{list(p.shape)}")
        if not np.isfinite(p).all():
            raise InvalidInputError("pixels hold non-finite values")
        return p

    def close(self) -> None:
        """Free the tower's weights and buffers now; later calls raise ModelClosedError."""
        with self._lock:        # not under a running encode
            if self.closed:
                return
            self.encoder = self.projector = None
            self.closed = True
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

"""VisionTower: an image -> the soft-token rows a language model reads in its place (preprocessing into
crops, the SigLIP encoder, the family's projector), on a backend of its own."""
from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidInputError, ModelClosedError
from .config import VisionConfig
from .clip import ClipEncoder
from .gemma3 import Gemma3Projector
from .idefics3 import Idefics3Connector
from . import internvl, internvl_pixels
from .llava import LlavaProjector, llava_pixels
from . import llava_next, llava_next_cpp
from .llava_next import pack
from .preprocess import idefics3_grid, pixel_values, rgb_image
from .qwen2vl import QwenVisionEncoder
from .qwen2vl_config import QWEN_FAMILIES
from .qwen2vl_pixels import patch_grid, patches
from .siglip import SiglipEncoder

MAX_IMAGES_PER_CALL = 64
LLAVA_FAMILIES = ("llava", "llava_next")


def _anyres(cfg):
    """LLaVA-NeXT's tiles: transformers' (a HF directory) or llama.cpp's (an mmproj: llava_next_cpp.py)."""
    return llava_next_cpp if cfg.preprocess == "anyres_cpp" else llava_next


class VisionTower:
    """`family` ("gemma3", "idefics3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "internvl", "llava", "llava_next"),
    `tokens_per_image` (soft tokens per crop, InternVL's a tile; None: Qwen2-VL, grid() says), `hidden` (the text
    model's width of each row), `deepstack` (Qwen3-VL's
    DeepStack levels: each row of encode_one is hidden * (1 + deepstack) wide; 0 for the others), `attends`
    ("block": an image's soft tokens see their whole block; "causal"), `grid(width, height)`, `pixels(image)` ->
    [n_crops, 3, S, S] (Qwen2-VL: [patches, C*T*P*P]), `encode(pixels)` (Qwen2-VL: `encode_one(pixels, grid)`),
    `close()`. Calls from several threads take turns (one crop's activations are reused)."""

    def __init__(self, cfg: VisionConfig, lookup, backend, soft_norm_offset: float, name: str = ""):
        self.cfg, self.backend, self.name = cfg, backend, name
        if cfg.projector in QWEN_FAMILIES:
            self.encoder, self.projector = QwenVisionEncoder(cfg, lookup, backend), None
        elif cfg.projector == "internvl":
            self.encoder = internvl.InternViT(cfg, lookup, backend)
            self.projector = internvl.InternVLProjector(cfg, lookup, backend)
        elif cfg.projector in LLAVA_FAMILIES:
            self.encoder, self.projector = ClipEncoder(cfg, lookup, backend), LlavaProjector(cfg, lookup, backend)
        else:
            self.encoder = SiglipEncoder(cfg, lookup, backend)
            self.projector = (Idefics3Connector(cfg, lookup, backend) if cfg.projector == "idefics3"
                              else Gemma3Projector(cfg, lookup, backend, soft_norm_offset))
        backend.end_load()
        self.closed = False
        self._lock = threading.Lock()

    @property
    def tokens_per_image(self) -> int | None:
        """Soft tokens per crop; None for Qwen2-VL's, whose count varies with the image (grid())."""
        return None if self.qwen else self.cfg.mm_tokens_per_image

    @property
    def qwen(self) -> bool:
        return self.cfg.projector in QWEN_FAMILIES

    @property
    def hidden(self) -> int:
        return self.cfg.text_hidden_size

    @property
    def deepstack(self) -> int:
        """Qwen3-VL's DeepStack levels (0 for every other family): encode_one's rows carry, after the text width's
        embeddings, one more text width of rows for each, level j's added to the hidden states after decoder
        layer j."""
        return self.cfg.deepstack if self.qwen else 0

    @property
    def image_size(self) -> int | None:
        return None if self.qwen else self.cfg.image_size

    @property
    def family(self) -> str:
        return self.cfg.projector

    @property
    def attends(self) -> str:
        """"block": an image's soft tokens attend to their whole block both ways (Gemma 3); "causal" (Idefics3,
        Qwen2-VL)."""
        return "block" if self.cfg.projector == "gemma3" else "causal"

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of the crops of an image of width x height pixels as decoded (its EXIF orientation
        applied: check_image's size); (0, 0): not split, one crop. pixels() of that image gives
        rows * cols + 1 crops: the tiles row-major, then the whole image. Qwen2-VL: the MERGED token grid
        (rows x cols soft tokens, row-major), from smart_resize."""
        for v in (width, height):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 1 << 20:
                raise InvalidInputError(f"an image's width and height must be integers in 1..{1 << 20}, got "
                                        f"{str(v)[:40]}")
        if self.qwen:
            gh, gw = patch_grid(int(width), int(height), self.cfg)
            return gh // self.cfg.spatial_merge_size, gw // self.cfg.spatial_merge_size
        if self.cfg.projector == "internvl":
            return internvl_pixels.grid(int(width), int(height), self.cfg)
        if self.cfg.projector == "llava_next":
            return _anyres(self.cfg).feature_grid(int(width), int(height), self.cfg)[2:]
        return idefics3_grid(int(width), int(height), self.cfg) if self.cfg.projector == "idefics3" else (0, 0)

    def _check_open(self) -> None:
        if self.closed:
            raise ModelClosedError("the vision tower was closed: its weights were freed")

    def pixels(self, image) -> np.ndarray:
        """float32 [n_crops, 3, image_size, image_size]: the model's own preprocessing of a PIL image (or image
        bytes); n_crops = rows * cols + 1 of grid() (Gemma 3: 1). Qwen2-VL: the flattened patches
        [patches, C*T*P*P] (each merge group's rows together; grid() of the image's size gives their layout)."""
        if self.cfg.projector == "internvl":
            return internvl_pixels.pixel_values(image, self.cfg)
        if self.cfg.projector in LLAVA_FAMILIES:
            return (_anyres(self.cfg).next_pixels if self.cfg.projector == "llava_next" else llava_pixels)(image,
                                                                                                            self.cfg)
        if not self.qwen:
            return pixel_values(image, self.cfg)
        return patches(image, self.cfg)[0]

    def encode_one(self, pixels: np.ndarray, grid: tuple) -> np.ndarray:
        """Qwen2-VL: float32 [rows * cols, hidden], one image's rows in prompt order (the merged grid row-major),
        from its flattened patches (pixels()'s) and its grid (rows, cols) as grid(width, height) gives it: the
        patches alone do not say it (images of other shapes can have the same patches). Qwen3-VL: [rows * cols,
        hidden * (1 + deepstack)]: columns [0, hidden) the merger's rows (the embeddings), [hidden * (j + 1),
        hidden * (j + 2)) DeepStack level j's."""
        px, grid = self._qwen_input(pixels, grid)
        with self._lock:
            self._check_open()
            self.backend.enter_forward()
            try:
                return self.encoder.forward(px, grid)
            finally:
                self.backend.exit_forward()

    def encode_image(self, image) -> np.ndarray:
        """LLaVA-NeXT: float32 [tokens_per_image + r (c + 1), hidden], one image's rows in prompt order (the base
        crop's, then the tiles' unpadded to its aspect, image_newline after each row; r, c = grid(width, height) of
        its size) of a PIL image (or the bytes of an image file) (llava_next.py)."""
        c = self.cfg
        if c.projector != "llava_next":
            raise InvalidInputError(f"encode_image is LLaVA-NeXT's; a {self.family} tower encodes pixels()")
        rgb = rgb_image(image)
        th, tw, r, cols = _anyres(c).feature_grid(*rgb.size, c)
        rows = np.concatenate([self.encode(part) for part in np.array_split(_anyres(c).next_pixels(rgb, c),
                                                                             -(-(1 + th * tw) // MAX_IMAGES_PER_CALL))])
        return pack(rows, (th, tw), (r, cols), self.projector.newline, c.patches_per_side)

    def _qwen_input(self, pixels, grid) -> tuple[np.ndarray, tuple]:
        if not self.qwen:
            raise InvalidInputError(f"encode_one is Qwen2-VL's; a {self.family} tower encodes crops (encode)")
        self._check_open()
        c = self.cfg
        if not isinstance(pixels, np.ndarray) or pixels.ndim != 2 or pixels.shape[1] != c.patch_values:
            got = list(pixels.shape) if isinstance(pixels, np.ndarray) else type(pixels).__name__
            raise InvalidInputError(f"encode_one takes flattened patches [n, {c.patch_values}], got {got}")
        px = np.ascontiguousarray(pixels, dtype=np.float32)
        m = c.spatial_merge_size
        if (not isinstance(grid, (tuple, list)) or len(grid) != 2
                or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 < v <= 1 << 20
                           for v in grid) or grid[0] * grid[1] * m * m != len(px)
                or grid[0] * grid[1] * c.factor ** 2 > c.max_pixels + c.factor * c.factor * (grid[0] + grid[1])):
            raise InvalidInputError(f"the grid {str(grid)[:40]} (merged rows, cols: grid()'s) does not fit {len(px)} "
                                    f"patches ({m * m} a cell), or passes max_pixels")
        if not np.isfinite(px).all():
            raise InvalidInputError("pixels hold non-finite values")
        return px, (int(grid[0]) * m, int(grid[1]) * m)

    def last_hidden_state(self, pixels: np.ndarray, grid: tuple | None = None) -> np.ndarray:
        """The encoder's output [n_patches, vision_hidden] for one crop's pixels [3, S, S] (a copy; LLaVA: the
        feature layers' rows joined, [tokens, vision_hidden * layers], the projector's input). Qwen2-VL:
        the last block's output [patches, vision_hidden] in the patches' own order (before the merger); `grid`
        as encode_one's."""
        if self.qwen:
            px, grid = self._qwen_input(pixels, grid)
            out = np.empty(self._hidden_shape(len(px)), np.float32)
            with self._lock:
                self._check_open()
                self.backend.enter_forward()
                try:
                    self.encoder.forward(px, grid, out)
                finally:
                    self.backend.exit_forward()
            return out
        one = self._one(pixels)
        with self._lock:
            self._check_open()
            self.backend.enter_forward()
            try:
                return self.encoder.forward(one).copy()
            finally:
                self.backend.exit_forward()

    def _hidden_shape(self, patches: int) -> tuple:
        """last_hidden_state's shape for an image of `patches` patches (a grid tower's)."""
        return patches, self.cfg.hidden_size

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [n, tokens_per_image, hidden]: the soft-token rows of n crops' pixels [n, 3, S, S]."""
        self._check_open()
        c = self.cfg
        if self.qwen:
            raise InvalidInputError("a Qwen2-VL tower encodes one image at a time: encode_one(pixels)")
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

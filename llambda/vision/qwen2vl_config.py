"""The hyper-parameters of a Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower and its image processor, under Hugging
Face's names (Qwen2_5_VLVisionConfig's, Qwen3VLVisionConfig's, Qwen2VLImageProcessor's), each range-checked as
read, whatever file they came from: a layout fills a dict of these names and `QwenVisionConfig.from_fields`
checks it.

Nothing is sized from a value before it is checked: an image's activations are sized from its own grid, which
max_pixels bounds (at most MAX_CELLS merged cells: 16384 tokens an image, the released processors' default for
Qwen2.5-VL (12845056 pixels of 28 x 28 cells) and Qwen3-VL (16777216 of 32 x 32)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_LAYERS, MAX_TEXT_HIDDEN, field_readers, number_triple

QWEN_FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
ACTIVATIONS = {"qwen2_5_vl": "silu", "qwen2_vl": "quick_gelu", "qwen3_vl": "gelu_pytorch_tanh"}   # the blocks' MLP
MAX_PATCH = 64
MAX_MERGE = 8
MAX_TEMPORAL = 4
MAX_CELLS = 16384                    # max_pixels / (patch x merge)^2: Qwen2.5-VL's 12845056, Qwen3-VL's 16777216
MAX_ASPECT = 200                     # smart_resize refuses a longer side past 200 times the shorter
NORM_EPS = 1e-6                      # fixed in transformers' vision blocks and merger
MAX_POSITIONS = 1 << 16             # Qwen3-VL's learned position grid (2304 = 48 x 48 in the released models)
MLP_ROWS = 4096                      # the tower's MLP runs this many rows at a time (its [rows, F] buffers: 56 MB
                                     # each for Qwen2.5-VL's 3420)


def layer_list(v, depth: int, what: str, ordered: bool = False) -> tuple:
    """Distinct block numbers below `depth` (sorted; `ordered`: in the order given, which must be increasing)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth
                                                   for i in v) or len(set(v)) != len(v) \
            or (ordered and list(v) != sorted(v)):
        raise ModelFormatError(f"{what} must be a list of distinct{' increasing' if ordered else ''} layer numbers "
                               f"below the depth {depth}, got {str(v)[:80]}")
    return tuple(v) if ordered else tuple(sorted(v))


class PatchGeometry:
    """The sizes a Qwen-VL style tower's patches and merged cells have (its config's hidden_size,
    num_attention_heads, patch_size, spatial_merge_size, num_channels, temporal_patch_size): GLM-4.1V's too."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def factor(self) -> int:
        """The side, in pixels, of one merged cell: both sides of a resized image are multiples of it."""
        return self.patch_size * self.spatial_merge_size

    @property
    def patch_values(self) -> int:
        """The values of one flattened patch: C * T * P * P."""
        return self.num_channels * self.temporal_patch_size * self.patch_size ** 2



@dataclass
class QwenVisionConfig(PatchGeometry):
    """projector: "qwen2_5_vl" (RMSNorm, SwiGLU MLP, window attention except in fullatt_block_indexes),
    "qwen2_vl" (LayerNorm, quick-GELU MLP, full attention everywhere) or "qwen3_vl" (Qwen2-VL's blocks with a
    tanh-GELU MLP, a patch embedding with a bias, a learned num_position_embeddings grid (a square) resampled to
    each image, a DeepStack merger after each block of deepstack_visual_indexes). text_hidden_size is the
    merger's output width (out_hidden_size). window_size is in pixels (a multiple of patch_size *
    spatial_merge_size)."""
    projector: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    text_hidden_size: int
    window_size: int = 0
    fullatt_block_indexes: tuple = ()
    num_position_embeddings: int = 0
    deepstack_visual_indexes: tuple = ()
    rope_theta: float = 10000.0
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    num_channels: int = 3
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    source: str = ""

    @property
    def window_cells(self) -> int:
        """A window's side in merged cells (0: no windows)."""
        return self.window_size // self.factor if self.projector == "qwen2_5_vl" else 0

    @property
    def deepstack(self) -> int:
        """DeepStack levels: each image row comes with this many more rows of the text width (0 but Qwen3-VL's)."""
        return len(self.deepstack_visual_indexes)

    @property
    def position_side(self) -> int:
        """The side of Qwen3-VL's learned position grid (0: none)."""
        return math.isqrt(self.num_position_embeddings)

    def full_attention(self, layer: int) -> bool:
        return self.projector != "qwen2_5_vl" or layer in self.fullatt_block_indexes

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "QwenVisionConfig":
        what, integer = field_readers(fields, names, source)

        def triple(key: str, default, positive: bool) -> tuple:
            return number_triple(fields.get(key, default), positive, what(key))

        projector = fields.get("projector")
        if projector not in QWEN_FAMILIES:
            raise ModelFormatError(f"{what('projector')} {str(projector)[:40]!r} is not one of {QWEN_FAMILIES}")
        act = fields.get("hidden_act", ACTIVATIONS[projector])
        if act != ACTIVATIONS[projector]:
            raise ModelFormatError(f"{what('hidden_act')} {str(act)[:40]!r} is not supported for {projector}")
        c = cls(projector=projector,
                hidden_size=integer("hidden_size", 1, MAX_HIDDEN),
                intermediate_size=integer("intermediate_size", 1, MAX_FFN),
                num_hidden_layers=integer("num_hidden_layers", 1, MAX_LAYERS),
                num_attention_heads=integer("num_attention_heads", 1, MAX_HIDDEN),
                patch_size=integer("patch_size", 1, MAX_PATCH),
                spatial_merge_size=integer("spatial_merge_size", 1, MAX_MERGE, 2),
                temporal_patch_size=integer("temporal_patch_size", 1, MAX_TEMPORAL, 2),
                text_hidden_size=integer("text_hidden_size", 1, MAX_TEXT_HIDDEN),
                num_channels=integer("num_channels", 3, 3, 3),
                image_mean=triple("image_mean", cls.image_mean, False),
                image_std=triple("image_std", cls.image_std, True),
                source=source)
        rescale = fields.get("rescale_factor", 1 / 255)
        if isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or not finite_as_float(rescale) \
                or not 0 < rescale < 2:
            raise ModelFormatError(f"{what('rescale_factor')} must be a number in (0, 2)")
        c.rescale_factor = float(rescale)
        theta = fields.get("rope_theta", 10000.0)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not finite_as_float(theta) \
                or not 1 < theta < 1e9:
            raise ModelFormatError(f"{what('rope_theta')} must be a number in (1, 1e9)")
        c.rope_theta = float(theta)
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM or c.head_dim % 4:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of a "
                                   f"multiple of 4 (the 2D rotary halves) at most {MAX_HEAD_DIM}")
        depth = c.num_hidden_layers
        if projector == "qwen2_5_vl":
            c.window_size = integer("window_size", c.factor, 1 << 16)
            if c.window_size % c.factor:
                raise ModelFormatError(f"{what('window_size')} {c.window_size} is not a multiple of patch_size x "
                                       f"spatial_merge_size = {c.factor} (transformers would floor it: no released "
                                       "model does that, and llama.cpp's mmproj could not say it)")
            c.fullatt_block_indexes = layer_list(fields.get("fullatt_block_indexes"), depth,
                                                 what("fullatt_block_indexes"))
        if projector == "qwen3_vl":
            c.num_position_embeddings = integer("num_position_embeddings", 1, MAX_POSITIONS)
            if c.position_side ** 2 != c.num_position_embeddings:
                raise ModelFormatError(f"{what('num_position_embeddings')} {c.num_position_embeddings} is not a square "
                                       "(the learned position grid is side x side)")
            c.deepstack_visual_indexes = layer_list(fields.get("deepstack_visual_indexes"), depth,
                                                    what("deepstack_visual_indexes"), ordered=True)
        c.min_pixels = integer("min_pixels", 1, MAX_CELLS * c.factor ** 2, cls.min_pixels)
        c.max_pixels = integer("max_pixels", c.factor ** 2, MAX_CELLS * c.factor ** 2, cls.max_pixels)
        if c.min_pixels > c.max_pixels:
            raise ModelFormatError(f"{what('min_pixels')} {c.min_pixels} is above max_pixels {c.max_pixels}")
        return c

    def max_patches(self) -> int:
        """The most patches one image can make (smart_resize keeps h * w <= max_pixels, or one merged cell a
        side; min_pixels' upscale can pass max_pixels by less than a cell a side: checked per image)."""
        return self.max_pixels // self.patch_size ** 2

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """The activations of the largest image max_pixels allows (allocated per image, while it encodes), or of
        max_tokens merged cells where fewer (a model refuses an image of as many tokens as its context before
        decoding it): its patches twice (as made and in window order), x, h, the attention's output, [q|k|v],
        half of q's rotation, the MLP's two row blocks, the merger's input and rows (Qwen3-VL: each DeepStack
        level's rows and the wide rows they are joined into; the position rows of a block of MLP_ROWS rows and
        their gather's temporaries)."""
        n, H, m2 = self.max_patches(), self.hidden_size, self.spatial_merge_size ** 2
        if max_tokens is not None:
            n = min(n, m2 * max(int(max_tokens), 1))
        rows = 2 * self.text_hidden_size * (1 + 2 * self.deepstack)
        per_patch = 2 * self.patch_values + 6 * H + H // 2 + H + rows // m2
        positions = 3 * min(n, MLP_ROWS) * H if self.projector == "qwen3_vl" else 0
        return 4 * (n * per_patch + 2 * min(n, MLP_ROWS) * self.intermediate_size + positions)

    def params(self) -> int:
        H, F, L, m2 = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.spatial_merge_size ** 2
        mlp = 3 * H * F + 2 * F + H if self.projector == "qwen2_5_vl" else 2 * H * F + F + H
        norms = 2 * H if self.projector == "qwen2_5_vl" else 4 * H
        per_layer = 4 * H * H + 4 * H + mlp + norms
        merger = H * m2 * (H * m2 + 1) + H * m2 * self.text_hidden_size + self.text_hidden_size + norms // 2
        if self.projector != "qwen3_vl":
            return H * self.patch_values + L * per_layer + merger
        deepstack = merger + 2 * H * m2 - norms // 2       # a merger whose norm is over the joined rows
        return H * (self.patch_values + 1 + self.num_position_embeddings) + L * per_layer + merger \
            + self.deepstack * deepstack

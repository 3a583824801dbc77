"""The hyper-parameters of a GLM-4.1V / GLM-4.6V vision tower (Glm4vVisionConfig's names) and its image processor
(Glm4vImageProcessor's), each range-checked as read: a layout fills a dict of these names and
`Glm4vVisionConfig.from_fields` checks it (the error names the field where it came from).

The members the tower's shared code reads are Qwen2-VL's (patch_values, factor, spatial_merge_size, max_pixels):
the patches, their order and the merged grid are the same. An image's activations are sized from its own grid,
which max_pixels bounds (2 x h x w <= max_pixels: the processor counts the two temporal copies)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_LAYERS, MAX_TEXT_HIDDEN, field_readers, number_triple
from .qwen2vl_config import MAX_CELLS, MAX_MERGE, MAX_PATCH, MLP_ROWS, PatchGeometry

FAMILY = "glm4v"
MERGER_NORM_EPS = 1e-5             # the merger's nn.LayerNorm: torch's default, not the config's
MAX_POSITIONS = 1 << 16            # the learned position grid (576 = 24 x 24 in the released models)
PROCESSOR = {"min_pixels": 112 * 112, "max_pixels": 28 * 28 * 15000}     # Glm4vImageProcessor's size defaults


@dataclass
class Glm4vVisionConfig(PatchGeometry):
    """hidden_size, num_hidden_layers, num_attention_heads: the blocks; out_hidden_size: the block MLP's width, the
    downsample's and the merger's (= the text width, text_hidden_size); intermediate_size: the merger's SwiGLU
    width; image_size / patch_size: the side of the learned position grid."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    image_size: int
    text_hidden_size: int
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    num_channels: int = 3
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    rope_theta: float = 10000.0
    min_pixels: int = PROCESSOR["min_pixels"]
    max_pixels: int = PROCESSOR["max_pixels"]
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    source: str = ""
    projector = FAMILY
    deepstack = 0

    @property
    def position_side(self) -> int:
        return self.image_size // self.patch_size

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "Glm4vVisionConfig":
        what, integer = field_readers(fields, names, source)

        def number(key: str, lo: float, hi: float, default: float) -> float:
            v = fields.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not lo < v < hi:
                raise ModelFormatError(f"{what(key)} must be a number in ({lo}, {hi}), got {str(v)[:40]}")
            return float(v)

        c = cls(patch_size=integer("patch_size", 1, MAX_PATCH),
                num_hidden_layers=integer("num_hidden_layers", 1, MAX_LAYERS),
                hidden_size=integer("hidden_size", 1, MAX_HIDDEN),
                num_attention_heads=integer("num_attention_heads", 1, MAX_HIDDEN),
                intermediate_size=integer("intermediate_size", 1, MAX_FFN),
                image_size=integer("image_size", 1, MAX_PATCH * 256),
                text_hidden_size=integer("text_hidden_size", 1, min(MAX_TEXT_HIDDEN, MAX_FFN)),
                spatial_merge_size=integer("spatial_merge_size", 1, MAX_MERGE, 2),
                temporal_patch_size=integer("temporal_patch_size", 1, 4, 2),
                num_channels=integer("num_channels", 3, 3, 3),
                rms_norm_eps=number("rms_norm_eps", 0, 1, 1e-5),
                attention_bias=fields.get("attention_bias", False),
                rope_theta=number("rope_theta", 1, 1e9, 10000.0),
                image_mean=number_triple(fields.get("image_mean", cls.image_mean), False, what("image_mean")),
                image_std=number_triple(fields.get("image_std", cls.image_std), True, what("image_std")),
                rescale_factor=number("rescale_factor", 0, 2, 1 / 255), source=source)
        for key, allowed in (("hidden_act", ("silu",)), ("attention_bias", (False, True))):
            v = fields.get(key, allowed[0])
            if not any(v is a or (isinstance(a, str) and v == a) for a in allowed):
                raise ModelFormatError(f"{what(key)} {str(v)[:40]!r} is not supported ({' or '.join(map(str, allowed))})")
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM or c.head_dim % 4:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of a "
                                   f"multiple of 4 (the 2D rotary halves) at most {MAX_HEAD_DIM}")
        side = c.position_side
        if side < 1 or side * side > MAX_POSITIONS or c.image_size % c.patch_size:
            raise ModelFormatError(f"{what('image_size')} {c.image_size} is not a multiple of patch_size "
                                   f"{c.patch_size} with at most {MAX_POSITIONS} learned positions")
        c.min_pixels = integer("min_pixels", 1, 2 * MAX_CELLS * c.factor ** 2, PROCESSOR["min_pixels"])
        c.max_pixels = integer("max_pixels", 2 * c.factor ** 2, 2 * MAX_CELLS * c.factor ** 2, PROCESSOR["max_pixels"])
        if c.min_pixels > c.max_pixels:
            raise ModelFormatError(f"{what('min_pixels')} {c.min_pixels} is above max_pixels {c.max_pixels}")
        return c

    def max_patches(self) -> int:
        """The most patches one image can make (2 h w <= max_pixels, or a cell a side past it: min_pixels' ceil)."""
        side = math.isqrt(self.max_pixels // 2) + 2 * self.factor
        return side * side // self.patch_size ** 2

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """One image's activations at most (max_tokens merged cells where fewer): its patches, x, h, [q|k|v], the
        attention's output, the rotary tables, the position rows, the MLP's row blocks, the downsampled and
        merger's rows."""
        n, H, m2, T = self.max_patches(), self.hidden_size, self.spatial_merge_size ** 2, self.text_hidden_size
        if max_tokens is not None:
            n = min(n, m2 * max(int(max_tokens), 1))
        per_patch = self.patch_values + 8 * H + H + (4 * T + 2 * self.intermediate_size) // m2
        return 4 * (n * per_patch + 2 * min(n, MLP_ROWS) * T)

    def params(self) -> int:
        H, T, F, L, m2 = (self.hidden_size, self.text_hidden_size, self.intermediate_size, self.num_hidden_layers,
                          self.spatial_merge_size ** 2)
        per_layer = 4 * H * H + 3 * H * (1 if self.attention_bias else 0) + 3 * H * T + 2 * H
        return (H * (self.patch_values + 1 + self.position_side ** 2 + 2) + L * per_layer + T * (m2 * H + 1)
                + T * T + 2 * T + 3 * T * F)

"""LFM2-VL's vision hyper-parameters (transformers' Lfm2VlConfig, its Siglip2VisionConfig and Lfm2VlImageProcessor's
settings), under their Hugging Face names, each range-checked as read whatever file they came from: nothing is
sized from a value before it is checked, and a bad one is a ModelFormatError naming the file's own key."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import (MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_LAYERS, MAX_PATCHES_PER_SIDE, MAX_TEXT_HIDDEN,
                     MAX_WORKSPACE_BYTES, number_triple)

FAMILY = "lfm2_vl"
MAX_TILE = 4096                 # pixels a tile's side
MAX_TILES = 100                 # tiles an image (the released processors: 10)
MAX_IMAGE_TOKENS = 16384        # soft tokens of the single image / thumbnail
PROJECTOR_LN_EPS = 1e-5         # nn.LayerNorm's default: Lfm2VlMultiModalProjector sets none


@dataclass
class Lfm2VlVisionConfig:
    """The SigLIP2 NaFlex tower (a linear patch embedding over (y, x, channel) values, a pos_side x pos_side learned
    position table resized to each crop's patch grid), the projector (pixel unshuffle by downsample_factor, an
    optional LayerNorm, linear_1, exact GELU, linear_2) and the image processor's settings."""
    # the tower (Siglip2VisionConfig)
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    # its patches and positions
    patch_size: int
    num_patches: int              # the position table's rows: pos_side^2
    layer_norm_eps: float
    # the projector (Lfm2VlConfig) and the text width
    text_hidden_size: int
    downsample_factor: int
    projector_hidden_size: int
    projector_bias: bool
    projector_use_layernorm: bool
    # the image processor (Lfm2VlImageProcessor)
    min_image_tokens: int
    max_image_tokens: int
    tile_size: int
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    do_image_splitting: bool
    max_pixels_tolerance: float
    image_mean: tuple
    image_std: tuple
    rescale_factor: float
    num_channels: int = 3
    projector: str = FAMILY
    source: str = ""

    @property
    def pos_side(self) -> int:
        return math.isqrt(self.num_patches)

    @property
    def factor(self) -> int:
        """Pixels a side of one soft token: patch x downsample."""
        return self.patch_size * self.downsample_factor

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_values(self) -> int:
        return self.num_channels * self.patch_size ** 2

    @property
    def tile_tokens(self) -> int:
        return (self.tile_size // self.factor) ** 2

    @property
    def max_crop_patches(self) -> int:
        """The most patches one crop has (a tile, or the single image / thumbnail at max_image_tokens)."""
        return max(self.max_image_tokens * self.downsample_factor ** 2, (self.tile_size // self.patch_size) ** 2)

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """One crop's activations at most (allocated per crop): patches, x, h, qkv, ctx, the MLP, the projector's."""
        P, H, F = self.max_crop_patches, self.hidden_size, self.intermediate_size
        return 4 * P * (self.patch_values + 6 * H + F) + 4 * (P // self.downsample_factor ** 2) * (
            2 * H * self.downsample_factor ** 2 + self.projector_hidden_size + self.text_hidden_size)

    def params(self) -> int:
        H, F, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        per_layer = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H
        n_in, mid, T = H * self.downsample_factor ** 2, self.projector_hidden_size, self.text_hidden_size
        projector = 2 * n_in + n_in * mid + mid + mid * T + T
        return H * self.patch_values + H + self.num_patches * H + L * per_layer + 2 * H + projector

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "Lfm2VlVisionConfig":
        names = names or {}

        def what(key: str) -> str:
            return f"{source}: {names.get(key, key)}" if source else names.get(key, key)

        def shown(v) -> str:
            return (repr(v) if isinstance(v, (int, float, str)) else type(v).__name__)[:40]

        def integer(key: str, lo: int, hi: int) -> int:
            v = fields.get(key)
            if v is None:
                raise ModelFormatError(f"{what(key)} is missing")
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ModelFormatError(f"{what(key)} must be an integer in {lo}..{hi}, got {shown(v)}")
            return v

        def number(key: str, lo: float, hi: float) -> float:
            v = fields.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not lo < v < hi:
                raise ModelFormatError(f"{what(key)} must be a number in ({lo}, {hi}), got {shown(v)}")
            return float(v)

        def flag(key: str) -> bool:
            v = fields.get(key)
            if not isinstance(v, bool):
                raise ModelFormatError(f"{what(key)} must be true or false, got {shown(v)}")
            return v

        for key, want in (("hidden_act", ("gelu_pytorch_tanh", "gelu_tanh")), ("projector_hidden_act", ("gelu",))):
            if fields.get(key) not in want:
                raise ModelFormatError(f"{what(key)} {shown(fields.get(key))} is not supported ({', '.join(want)})")
        if fields.get("vision_feature_layer", -1) != -1:
            raise ModelFormatError(f"{what('vision_feature_layer')} {shown(fields.get('vision_feature_layer'))} is "
                                   "not supported (-1: the last layer's output, as transformers reads it)")
        c = cls(hidden_size=integer("hidden_size", 1, MAX_HIDDEN),
                intermediate_size=integer("intermediate_size", 1, MAX_FFN),
                num_hidden_layers=integer("num_hidden_layers", 1, MAX_LAYERS),
                num_attention_heads=integer("num_attention_heads", 1, MAX_HIDDEN),
                patch_size=integer("patch_size", 1, 256),
                num_patches=integer("num_patches", 1, MAX_PATCHES_PER_SIDE ** 2),
                layer_norm_eps=number("layer_norm_eps", 0.0, 1.0),
                text_hidden_size=integer("text_hidden_size", 1, MAX_TEXT_HIDDEN),
                downsample_factor=integer("downsample_factor", 1, 16),
                projector_hidden_size=integer("projector_hidden_size", 1, MAX_FFN),
                projector_bias=flag("projector_bias"),
                projector_use_layernorm=flag("projector_use_layernorm"),
                min_image_tokens=integer("min_image_tokens", 1, MAX_IMAGE_TOKENS),
                max_image_tokens=integer("max_image_tokens", 1, MAX_IMAGE_TOKENS),
                tile_size=integer("tile_size", 1, MAX_TILE),
                min_tiles=integer("min_tiles", 1, MAX_TILES),
                max_tiles=integer("max_tiles", 1, MAX_TILES),
                use_thumbnail=flag("use_thumbnail"),
                do_image_splitting=flag("do_image_splitting"),
                max_pixels_tolerance=number("max_pixels_tolerance", 0.0, 1e6),
                image_mean=number_triple(fields.get("image_mean"), False, what("image_mean")),
                image_std=number_triple(fields.get("image_std"), True, what("image_std")),
                rescale_factor=number("rescale_factor", 0.0, 2.0),
                num_channels=integer("num_channels", 3, 3), source=source)
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of "
                                   f"at most {MAX_HEAD_DIM}")
        if c.pos_side ** 2 != c.num_patches:
            raise ModelFormatError(f"{what('num_patches')} {c.num_patches} is not a square (the position table's grid)")
        if fields.get("encoder_patch_size", c.patch_size) != c.patch_size:
            raise ModelFormatError(f"{what('encoder_patch_size')} {shown(fields.get('encoder_patch_size'))} is not "
                                   f"the tower's patch_size {c.patch_size}")
        if fields.get("processor_downsample_factor", c.downsample_factor) != c.downsample_factor:
            raise ModelFormatError(f"{what('processor_downsample_factor')} "
                                   f"{shown(fields.get('processor_downsample_factor'))} is not the model's "
                                   f"downsample_factor {c.downsample_factor}")
        if c.min_image_tokens > c.max_image_tokens:
            raise ModelFormatError(f"{what('min_image_tokens')} {c.min_image_tokens} is more than max_image_tokens "
                                   f"{c.max_image_tokens}")
        if c.do_image_splitting and c.min_tiles > c.max_tiles:
            raise ModelFormatError(f"{what('min_tiles')} {c.min_tiles} is more than max_tiles {c.max_tiles}")
        if c.do_image_splitting and c.min_tiles == 1 < c.max_tiles:
            # (a 1 x 1 grid of one tile_size tile, which transformers' prompt counts at the thumbnail's size)
            raise ModelFormatError(f"{what('min_tiles')} 1 with max_tiles {c.max_tiles} is not supported")
        if c.tile_size % c.factor:
            raise ModelFormatError(f"{what('tile_size')} {c.tile_size} is not a multiple of patch x downsample "
                                   f"{c.factor}")
        side = max(c.tile_size // c.patch_size, math.isqrt(c.max_image_tokens) * c.downsample_factor)
        if c.max_crop_patches > MAX_PATCHES_PER_SIDE ** 2 or side > 4 * MAX_PATCHES_PER_SIDE:
            raise ModelFormatError(f"{what('max_image_tokens')} / tile_size: a crop of {c.max_crop_patches} patches "
                                   f"is more than {MAX_PATCHES_PER_SIDE ** 2}")
        if c.workspace_bytes() > MAX_WORKSPACE_BYTES:
            raise ModelFormatError(f"{source or 'the vision tower'}: one crop's activations would take "
                                   f"{c.workspace_bytes() >> 20} MB")
        return c

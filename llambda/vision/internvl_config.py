"""InternVL 3 / 3.5's vision hyper-parameters (transformers' InternVLVisionConfig and InternVLConfig names, the
GotOcr2 image processor's tiling settings), each range-checked as read, whatever file they came from.

A layout (internvl_layouts.py: a HF directory, llama.cpp's internvl mmproj) fills a dict of these names and
`InternVLConfig.from_fields` checks it, so an absurd size is a ModelFormatError naming the file's own key, never
a huge allocation. The members VisionTower reads (projector, image_size, num_channels, mm_tokens_per_image,
text_hidden_size) are those of VisionConfig.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import (MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_IMAGE_SIDE, MAX_LAYERS, MAX_PATCHES_PER_SIDE,
                     MAX_TEXT_HIDDEN, MAX_WORKSPACE_BYTES, RESAMPLE_FILTERS, VisionConfig, number_triple)

NORM_TYPES = ("layer_norm", "rms_norm")
MAX_TILES = 64          # the processor's max_patches (InternVL's default 12; 40 in some of OpenGVLab's configs)
QK_NORM_EPS = 1e-6      # InternVLVisionRMSNorm's default: the q/k norms do not take the config's eps
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)   # GotOcr2's defaults


INTEGERS = {"hidden_size": (1, MAX_HIDDEN), "intermediate_size": (1, MAX_FFN), "num_hidden_layers": (1, MAX_LAYERS),
            "num_attention_heads": (1, MAX_HIDDEN), "image_size": (1, MAX_IMAGE_SIDE),
            "patch_size": (1, MAX_IMAGE_SIDE), "text_hidden_size": (1, MAX_TEXT_HIDDEN), "num_channels": (3, 3)}
DEFAULTS = {"num_channels": 3, "layer_norm_eps": 1e-6, "rescale_factor": 1 / 255, "use_qk_norm": False,
            "attention_bias": True, "use_mean_pooling": True, "norm_type": "layer_norm"}


def _shown(v) -> str:
    return (repr(v) if isinstance(v, (int, float, str)) else type(v).__name__)[:40]


def _integer(v, lo: int, hi: int, what: str) -> int:
    if v is None:
        raise ModelFormatError(f"{what} is missing")
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ModelFormatError(f"{what} must be an integer in {lo}..{hi}, got {_shown(v)}")
    return v


def _number(v, lo: float, hi: float, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not lo < v < hi:
        raise ModelFormatError(f"{what} must be a number in ({lo}, {hi}), got {_shown(v)}")
    return float(v)


@dataclass
class InternVLConfig(VisionConfig):
    """VisionConfig's sizes for the InternViT tower (pre-norm blocks with layer scale, class token, learned
    positions), the pixel shuffle (`scale_factor` = 1 / downsample_ratio) and MLP projector, and the processor's
    tiling (tiles of image_size, min_patches..max_patches of them, a thumbnail when more than one)."""
    norm_type: str = "layer_norm"
    use_qk_norm: bool = False
    attention_bias: bool = True
    use_mean_pooling: bool = True       # False: a final LayerNorm (`layernorm`) after the blocks
    min_patches: int = 1
    max_patches: int = 12

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        P, H, F, s = self.n_patches + 1, self.hidden_size, self.intermediate_size, self.scale_factor
        return 4 * (P * (self.num_channels * self.patch_size ** 2 + 7 * H + F)
                    + self.mm_tokens_per_image * (s * s * H + self.text_hidden_size))

    def params(self) -> int:
        H, F, L, P = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.n_patches
        T = self.text_hidden_size
        D = self.scale_factor ** 2 * H
        per_layer = 4 * H * H + 2 * H * F + F + 9 * H
        tower = H * self.num_channels * self.patch_size ** 2 + H + (P + 2) * H + L * per_layer
        return tower + 2 * D + D * T + T * T + 2 * T

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "InternVLConfig":
        def what(key: str) -> str:
            name = (names or {}).get(key, key)
            return f"{source}: {name}" if source else name

        def integer(key: str, lo: int, hi: int, default=None) -> int:
            return _integer(fields.get(key, default), lo, hi, what(key))

        def number(key: str, lo: float, hi: float, default) -> float:
            return _number(fields.get(key, default), lo, hi, what(key))

        def flag(key: str) -> bool:
            v = fields.get(key, DEFAULTS[key])
            if not isinstance(v, bool):
                raise ModelFormatError(f"{what(key)} must be true or false, got {_shown(v)}")
            return v

        def choice(key: str, allowed: tuple, default):
            v = fields.get(key, default)
            if v not in allowed or isinstance(v, bool):
                raise ModelFormatError(f"{what(key)} {_shown(v)} is not supported ({', '.join(map(str, allowed))})")
            return v

        choice("hidden_act", ("gelu",), "gelu")
        choice("projector_hidden_act", ("gelu",), "gelu")
        choice("vision_feature_layer", (-1,), -1)
        choice("vision_feature_select_strategy", ("default",), "default")
        if fields.get("use_absolute_position_embeddings", True) is not True:
            raise ModelFormatError(f"{what('use_absolute_position_embeddings')} must be true (a tower without "
                                   "position embeddings is not supported)")
        ints = {k: integer(k, lo, hi, DEFAULTS.get(k)) for k, (lo, hi) in INTEGERS.items()}
        c = cls(**ints, layer_norm_eps=number("layer_norm_eps", 0.0, 1.0, 1e-6), mm_tokens_per_image=0,
                norm_type=choice("norm_type", NORM_TYPES, "layer_norm"), use_qk_norm=flag("use_qk_norm"),
                attention_bias=flag("attention_bias"), use_mean_pooling=flag("use_mean_pooling"),
                image_mean=number_triple(fields.get("image_mean", CLIP_MEAN), False, what("image_mean")),
                image_std=number_triple(fields.get("image_std", CLIP_STD), True, what("image_std")),
                rescale_factor=number("rescale_factor", 0.0, 2.0, 1 / 255), projector="internvl",
                hidden_act="gelu", source=source)
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of "
                                   f"at most {MAX_HEAD_DIM}")
        if c.image_size < c.patch_size or c.image_size % c.patch_size:
            raise ModelFormatError(f"{what('image_size')} {c.image_size} is smaller than or not a multiple of the "
                                   f"patch size {c.patch_size}")
        if c.patches_per_side > MAX_PATCHES_PER_SIDE:
            raise ModelFormatError(f"{what('image_size')} {c.image_size} / patch {c.patch_size} is "
                                   f"{c.patches_per_side} patches a side, more than {MAX_PATCHES_PER_SIDE}")
        tile = fields.get("tile_size")
        if tile is not None and tile != c.image_size:   # transformers would interpolate the positions: not done here
            raise ModelFormatError(f"{what('tile_size')} {_shown(tile)} is not the tower's image_size {c.image_size}")
        ratio = fields.get("downsample_ratio")
        if "scale_factor" in fields:            # llama.cpp's clip.vision.projector.scale_factor: 1 / ratio
            c.scale_factor = integer("scale_factor", 1, c.patches_per_side)
        else:
            r = number("downsample_ratio", 0.0, 1.0 + 1e-9, 0.5) if ratio is not None else 0.5
            s = round(1 / r)
            if abs(s * r - 1) > 1e-9 or not 1 <= s <= c.patches_per_side:
                raise ModelFormatError(f"{what('downsample_ratio')} {_shown(ratio)} is not 1 / n for an integer n "
                                       f"up to the {c.patches_per_side} patches a side")
            c.scale_factor = s
        if c.patches_per_side % c.scale_factor:
            key = "scale_factor" if "scale_factor" in fields else "downsample_ratio"
            raise ModelFormatError(f"{what(key)}: the factor {c.scale_factor} does not divide the "
                                   f"{c.patches_per_side} patches a side")
        c.mm_tokens_per_image = (c.patches_per_side // c.scale_factor) ** 2
        seq = fields.get("image_seq_length")
        if seq is not None and seq != c.mm_tokens_per_image:
            raise ModelFormatError(f"{what('image_seq_length')} {_shown(seq)} is not the {c.mm_tokens_per_image} rows "
                                   f"a tile gives ({c.patches_per_side}^2 patches / {c.scale_factor}^2)")
        c.min_patches = integer("min_patches", 1, MAX_TILES, 1)
        c.max_patches = integer("max_patches", c.min_patches, MAX_TILES, 12)
        resample = fields.get("resample", 3)
        if isinstance(resample, bool) or resample not in RESAMPLE_FILTERS:
            raise ModelFormatError(f"{what('resample')} {_shown(resample)} is not a Pillow filter {RESAMPLE_FILTERS}")
        c.resample = int(resample)
        if c.workspace_bytes() > MAX_WORKSPACE_BYTES:
            raise ModelFormatError(f"{source or 'the vision tower'}: one tile's activations would take "
                                   f"{c.workspace_bytes() >> 20} MB")
        return c

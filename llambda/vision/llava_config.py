"""LLaVA 1.5's vision tower hyper-parameters under Hugging Face's names (CLIPVisionConfig's, LlavaConfig's, the
CLIP / LLaVA image processor's), each range-checked as read, whatever file they came from (llava_layouts.py fills
the dict from a HF directory or llama.cpp's mmproj).

Feature layers are indices into the tower's hidden states as transformers counts them, made non-negative:
0 is the embeddings after pre_layrnorm, i the output of block i - 1; only the blocks up to the deepest one run.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import (MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_IMAGE_SIDE, MAX_LAYERS, MAX_PATCHES_PER_SIDE,
                     MAX_TEXT_HIDDEN, MAX_WORKSPACE_BYTES, RESAMPLE_FILTERS, PatchGrid, number_triple)

TOWER_ACTS = ("quick_gelu", "gelu")          # CLIP's MLP activation (gelu: the exact, erf one)
PROJECTOR_ACTS = ("gelu",)                   # LlavaMultiModalProjector's (exact GELU)
STRATEGIES = ("default", "full")             # the class token dropped, or kept (first)
PREPROCESS = ("crop", "letterbox", "anyres_cpp")    # transformers' resize + centre crop; llama.cpp's resize +
#                                                   pad; llama.cpp's LLaVA-NeXT tiles (llava_next_cpp.py)


@dataclass
class LlavaVisionConfig(PatchGrid):
    """PatchGrid's sizes, then LLaVA's (see the module's note on feature layers)."""
    text_hidden_size: int
    feature_layers: tuple           # non-negative hidden-state indices, in the order their rows are joined
    keep_class: bool                # strategy "full"
    hidden_act: str = "quick_gelu"
    projector_act: str = "gelu"
    projector_bias: bool = True
    has_class: bool = True          # a class embedding (CLIP's; an mmproj may have none)
    patch_bias: bool = False        # a bias on the patch convolution (CLIP has none; an mmproj may)
    post_ln: bool = False           # llama.cpp applies v.post_ln to the deepest block's output where a file has it
    num_channels: int = 3
    preprocess: str = "crop"
    shortest_edge: int = 0          # crop: the resize's shortest edge (0: resized to image_size square)
    do_pad: bool = False            # crop: LlavaImageProcessor's pad to a square first
    resample: int = 3
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    grid_pinpoints: tuple = ()     # LLaVA-NeXT's (height, width) resolutions, multiples of image_size
    projector: str = "llava"       # "llava_next" with grid_pinpoints
    source: str = ""

    @property
    def n_positions(self) -> int:
        return self.n_patches + (1 if self.has_class else 0)

    @property
    def layers_run(self) -> int:
        return max(self.feature_layers)

    @property
    def mm_tokens_per_image(self) -> int:
        return self.n_patches + (1 if self.keep_class and self.has_class else 0)

    @property
    def feature_width(self) -> int:
        return self.hidden_size * len(self.feature_layers)

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "LlavaVisionConfig":
        """Check `fields` (HF names -> values); `names` maps an HF name to the file's own key for messages."""
        r = _Reader(fields, names or {}, source)
        what, shown, integer, flag, choice = r.what, _shown, r.integer, r.flag, r.choice
        eps, rescale = r.number("layer_norm_eps", 1e-5, 1.0), r.number("rescale_factor", 1 / 255, 2.0)
        n_layers = integer("num_hidden_layers", 1, MAX_LAYERS)
        c = cls(hidden_size=integer("hidden_size", 1, MAX_HIDDEN),
                intermediate_size=integer("intermediate_size", 1, MAX_FFN),
                num_hidden_layers=n_layers,
                num_attention_heads=integer("num_attention_heads", 1, MAX_HIDDEN),
                image_size=integer("image_size", 1, MAX_IMAGE_SIDE),
                patch_size=integer("patch_size", 1, MAX_IMAGE_SIDE),
                layer_norm_eps=eps,
                text_hidden_size=integer("text_hidden_size", 1, MAX_TEXT_HIDDEN),
                feature_layers=feature_layers(fields.get("vision_feature_layer", -2), n_layers,
                                              what("vision_feature_layer")),
                keep_class=choice("vision_feature_select_strategy", "default", STRATEGIES) == "full",
                hidden_act=choice("hidden_act", "quick_gelu", TOWER_ACTS),
                projector_act=choice("projector_hidden_act", "gelu", PROJECTOR_ACTS),
                projector_bias=flag("multimodal_projector_bias", True),
                has_class=flag("has_class", True), patch_bias=flag("patch_bias", False),
                post_ln=flag("post_ln", False),
                num_channels=integer("num_channels", 3, 3) if "num_channels" in fields else 3,
                preprocess=choice("preprocess", "crop", PREPROCESS),
                do_pad=flag("do_pad", False),
                resample=choice("resample", 3, RESAMPLE_FILTERS),
                image_mean=number_triple(fields.get("image_mean", cls.image_mean), False, what("image_mean")),
                image_std=number_triple(fields.get("image_std", cls.image_std), True, what("image_std")),
                rescale_factor=rescale, source=source)
        for bad, key, why in (
                (c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM, "hidden_size",
                 f"{c.hidden_size} is not {c.num_attention_heads} heads of at most {MAX_HEAD_DIM}"),
                (c.image_size < c.patch_size or c.image_size % c.patch_size, "image_size",
                 f"{c.image_size} is smaller than or not a multiple of the patch size {c.patch_size}"),
                (c.patches_per_side > MAX_PATCHES_PER_SIDE, "image_size",
                 f"{c.image_size} / patch {c.patch_size} is more than {MAX_PATCHES_PER_SIDE} patches a side")):
            if bad:
                raise ModelFormatError(f"{what(key)} {why}")
        if fields.get("grid_pinpoints") is not None:
            c.grid_pinpoints = pinpoints(fields["grid_pinpoints"], c.image_size, what("grid_pinpoints"))
            c.projector = "llava_next"
            if c.keep_class:
                raise ModelFormatError(f"{what('vision_feature_select_strategy')} 'full' with image_grid_pinpoints: "
                                       "LLaVA-NeXT lays its tiles' rows out as patches (the 'default' strategy)")
        if c.workspace_bytes() > MAX_WORKSPACE_BYTES:
            raise ModelFormatError(f"{source or 'the vision tower'}: one image's activations would take "
                                   f"{c.workspace_bytes() >> 20} MB")
        if c.preprocess == "crop" and fields.get("shortest_edge") is not None:
            c.shortest_edge = integer("shortest_edge", c.image_size, MAX_IMAGE_SIDE)
        if c.preprocess == "crop" and fields.get("crop_size", c.image_size) != c.image_size:
            raise ModelFormatError(f"{what('crop_size')} {shown(fields.get('crop_size'))} is not the tower's "
                                   f"image_size {c.image_size}")
        return c

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """One image's activations (allocated at load): patches, x, h, qkv, ctx, MLP, the features and the
        projector's middle."""
        T, H, F = self.n_positions, self.hidden_size, self.intermediate_size
        crops = 1 + self.max_tiles        # LLaVA-NeXT: every crop's rows kept, then the image's packed rows
        packed = self.max_tiles * self.patches_per_side       # at most a newline row a feature row
        return 4 * (T * (self.num_channels * self.patch_size ** 2 + 6 * H + F + self.feature_width)
                    + ((1 + crops + (crops if self.grid_pinpoints else 0)) * self.mm_tokens_per_image + packed)
                    * self.text_hidden_size)

    @property
    def max_tiles(self) -> int:
        return max((h // self.image_size) * (w // self.image_size) for h, w in self.grid_pinpoints) \
            if self.grid_pinpoints else 0

    def params(self) -> int:
        H, F, D = self.hidden_size, self.intermediate_size, self.text_hidden_size
        per_layer = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H
        return (H * self.num_channels * self.patch_size ** 2 + H + self.n_positions * H + 2 * H
                + self.layers_run * per_layer + self.feature_width * D + D * D + 2 * D
                + (D if self.grid_pinpoints else 0))


def _shown(v) -> str:
    return (repr(v) if isinstance(v, (int, float, str)) else type(v).__name__)[:40]


class _Reader:
    """`fields` (HF names -> values) read and range-checked, each error naming the file's own key (`names`)."""

    def __init__(self, fields: dict, names: dict, source: str):
        self.fields, self.names, self.source = fields, names, source

    def what(self, key: str) -> str:
        name = self.names.get(key, key)
        return f"{self.source}: {name}" if self.source else name

    def integer(self, key: str, lo: int, hi: int) -> int:
        v = self.fields.get(key)
        if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
            why = "is missing" if v is None else f"must be an integer in {lo}..{hi}, got {_shown(v)}"
            raise ModelFormatError(f"{self.what(key)} {why}")
        return v

    def number(self, key: str, default: float, hi: float) -> float:
        v = self.fields.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not 0 < v < hi:
            raise ModelFormatError(f"{self.what(key)} must be a number in (0, {hi}), got {_shown(v)}")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.fields.get(key, default)
        if not isinstance(v, bool):
            raise ModelFormatError(f"{self.what(key)} must be true or false, got {_shown(v)}")
        return v

    def choice(self, key: str, default, allowed: tuple):
        v = self.fields.get(key, default)
        if v not in allowed or isinstance(v, bool):
            raise ModelFormatError(f"{self.what(key)} {_shown(v)} is not supported ({', '.join(map(str, allowed))})")
        return v


def feature_layers(v, n_layers: int, what: str) -> tuple:
    """LlavaConfig's vision_feature_layer (an int, or a list joined in its order) as non-negative hidden-state
    indices (-1: the last block's output, n_layers), each in 0..n_layers."""
    items = v if isinstance(v, (list, tuple)) else [v]
    if not 1 <= len(items) <= n_layers + 1 or not all(isinstance(i, int) and not isinstance(i, bool)
                                                        and -(n_layers + 1) <= i <= n_layers for i in items):
        raise ModelFormatError(f"{what} must be a layer index (or a list of 1..{n_layers + 1}) in "
                               f"{-(n_layers + 1)}..{n_layers}, got {str(v)[:60]}")
    out = tuple(i if i >= 0 else n_layers + 1 + i for i in items)
    if len(set(out)) != len(out):
        raise ModelFormatError(f"{what} names a layer twice: {str(v)[:60]}")
    return out


MAX_TILES_A_SIDE = 8        # LLaVA-NeXT's pinpoints: up to 8 tiles a side (2688 pixels at 336)
MAX_PINPOINTS = 64


def pinpoints(v, size: int, what: str) -> tuple:
    """image_grid_pinpoints as ((height, width), ...): 1..64 pairs of positive multiples of the tower's image_size,
    at most 8 tiles a side."""
    ok = isinstance(v, (list, tuple)) and 1 <= len(v) <= MAX_PINPOINTS and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_TILES_A_SIDE * size and x % size == 0
            for x in p) for p in v)
    if not ok:
        raise ModelFormatError(f"{what} must be 1..{MAX_PINPOINTS} (height, width) pairs of multiples of the image "
                               f"size {size}, at most {MAX_TILES_A_SIDE} of it, got {str(v)[:80]}")
    return tuple((int(h), int(w)) for h, w in v)

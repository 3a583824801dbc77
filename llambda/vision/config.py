"""A vision tower's hyper-parameters under Hugging Face's names (SiglipVisionConfig's, Gemma3Config's and
Idefics3Config's projector fields, the image processor's), each range-checked as read, whatever file they
came from.

Every layout (a HF directory, llama.cpp's mmproj GGUF, Ollama's model GGUF) fills a dict of these
names and `VisionConfig.from_fields` checks it: nothing is sized from a value before it is checked, so
an absurd image_size or patch_size is a ModelFormatError naming the file's own key, never a huge
allocation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float

# Bounds: a real Gemma 3 tower is 27 layers of 1152 (16 heads of 72, MLP 4304) over 64 x 64 patches of 14
# pixels (896 x 896) pooled to 16 x 16 tokens; these leave room for other SigLIP sizes, not for absurdity.
MAX_HIDDEN = 16384
MAX_FFN = 65536
MAX_LAYERS = 256
MAX_HEAD_DIM = 1024            # the C core's encoder attention keeps a head's row on the stack (LLB_ENC_MAX_HEAD_DIM)
MAX_IMAGE_SIDE = 4096          # pixels of the square the image is resized to
MAX_PATCHES_PER_SIDE = 128     # 16384 patches: attention is quadratic in them
MAX_TEXT_HIDDEN = 65536
MAX_WORKSPACE_BYTES = 4 << 30  # one image's activations (allocated once, at load)
MAX_LONGEST_EDGE = 4096        # Idefics3's processor: the size an image's longest edge is resized to (its own cap)
MAX_GRID_SIDE = 6              # Idefics3's crops a side: its tokenizers hold <row_r_col_c> for r, c <= 6
PROJECTORS = ("gemma3", "idefics3")
RESAMPLE_FILTERS = (0, 1, 2, 3, 4, 5)      # Pillow's (and transformers' PILImageResampling's) filter numbers


def field_readers(fields: dict, names: dict | None, source: str):
    """(what, integer) over a layout's `fields`: what(key), the field as its file names it (for messages);
    integer(key, lo, hi, default=None), its value: an integer in lo..hi, else a ModelFormatError naming it."""
    names = names or {}

    def what(key: str) -> str:
        return f"{source}: {names.get(key, key)}" if source else names.get(key, key)

    def integer(key: str, lo: int, hi: int, default=None) -> int:
        v = fields.get(key, default)
        if v is None:
            raise ModelFormatError(f"{what(key)} is missing")
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            shown = repr(v) if isinstance(v, (int, float, str)) else type(v).__name__
            raise ModelFormatError(f"{what(key)} must be an integer in {lo}..{hi}, got {shown[:40]}")
        return v
    return what, integer


def number_triple(v, positive: bool, what: str) -> tuple:
    """3 finite floats (a mean or std per channel; one number: the same for all 3), or ModelFormatError."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * 3
    ok = (isinstance(v, (list, tuple)) and len(v) == 3
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) and finite_as_float(x)
                  and abs(x) < 1e6 and (x > 0 if positive else True) for x in v))
    if not ok:
        raise ModelFormatError(f"{what} must be 3 finite numbers{' > 0' if positive else ''}")
    return tuple(float(x) for x in v)


@dataclass
class PatchGrid:
    """A square ViT's sizes (HF names) and what they derive."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.patches_per_side ** 2


@dataclass
class VisionConfig(PatchGrid):
    """SigLIP's encoder, the projector (Gemma 3's pooling one, Idefics3's pixel-shuffle connector) and the image
    processor's settings (HF names).

    Idefics3 (projector "idefics3"): scale_factor is the pixel shuffle's (s x s patches -> one row of s*s*H);
    longest_edge the processor's size["longest_edge"]; the crops are image_size square (its max_image_size,
    which must be the tower's); do_image_splitting and resample (a Pillow filter number) as its processor says."""
    mm_tokens_per_image: int
    text_hidden_size: int
    num_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    projector: str = "gemma3"
    scale_factor: int = 0
    longest_edge: int = 0
    do_image_splitting: bool = False
    resample: int = 2
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    source: str = ""               # what the fields were read from, for messages

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens_per_image)

    @property
    def pool(self) -> int:
        """The side of the average pool that turns the patch grid into the token grid."""
        return self.patches_per_side // self.tokens_per_side

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "VisionConfig":
        """Check `fields` (HF names -> values); `names` maps an HF name to the file's own key for messages."""
        names = names or {}

        def what(key: str) -> str:
            return f"{source}: {names.get(key, key)}" if source else names.get(key, key)

        def integer(key: str, lo: int, hi: int) -> int:
            if key not in fields or fields[key] is None:
                raise ModelFormatError(f"{what(key)} is missing")
            v = fields[key]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                shown = repr(v) if isinstance(v, (int, float, str)) else type(v).__name__
                raise ModelFormatError(f"{what(key)} must be an integer in {lo}..{hi}, got {shown[:40]}")
            return v

        def number(key: str, lo: float, hi: float, default=None) -> float:
            v = fields.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not lo < v < hi:
                shown = repr(v) if isinstance(v, (int, float, str)) else type(v).__name__
                raise ModelFormatError(f"{what(key)} must be a number in ({lo}, {hi}), got {shown[:40]}")
            return float(v)

        def triple(key: str, default, positive: bool) -> tuple:
            return number_triple(fields.get(key, default), positive, what(key))

        projector = fields.get("projector", "gemma3")
        if projector not in PROJECTORS:
            raise ModelFormatError(f"{what('projector')} {str(projector)[:40]!r} is not supported "
                                   f"({', '.join(PROJECTORS)})")
        act = fields.get("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelFormatError(f"{what('hidden_act')} {str(act)[:40]!r} is not supported (gelu_pytorch_tanh only)")
        c = cls(hidden_size=integer("hidden_size", 1, MAX_HIDDEN),
                intermediate_size=integer("intermediate_size", 1, MAX_FFN),
                num_hidden_layers=integer("num_hidden_layers", 1, MAX_LAYERS),
                num_attention_heads=integer("num_attention_heads", 1, MAX_HIDDEN),
                image_size=integer("image_size", 1, MAX_IMAGE_SIDE),
                patch_size=integer("patch_size", 1, MAX_IMAGE_SIDE),
                layer_norm_eps=number("layer_norm_eps", 0.0, 1.0, 1e-6),
                mm_tokens_per_image=0,      # below, once the patch grid is known good
                text_hidden_size=integer("text_hidden_size", 1, MAX_TEXT_HIDDEN),
                num_channels=integer("num_channels", 3, 3) if "num_channels" in fields else 3,
                image_mean=triple("image_mean", (0.5, 0.5, 0.5), False),
                image_std=triple("image_std", (0.5, 0.5, 0.5), True),
                rescale_factor=number("rescale_factor", 0.0, 2.0, 1 / 255),
                projector=projector, source=source)
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of "
                                   f"at most {MAX_HEAD_DIM}")
        if c.image_size < c.patch_size or (c.image_size % c.patch_size and projector != "idefics3"):
            # (Idefics3's convolution is "valid": SmolVLM-Instruct's 384 / 14 takes 27 patches, the last 6 pixels
            # of each side unread)
            raise ModelFormatError(f"{what('image_size')} {c.image_size} is smaller than or not a multiple of "
                                   f"the patch size {c.patch_size}")
        if c.patches_per_side > MAX_PATCHES_PER_SIDE:
            raise ModelFormatError(f"{what('image_size')} {c.image_size} / patch {c.patch_size} is "
                                   f"{c.patches_per_side} patches a side, more than {MAX_PATCHES_PER_SIDE}")
        if projector == "idefics3":
            c.scale_factor = integer("scale_factor", 1, c.patches_per_side)
            if c.patches_per_side % c.scale_factor:
                raise ModelFormatError(f"{what('scale_factor')} {c.scale_factor} does not divide the "
                                       f"{c.patches_per_side} patches a side")
            c.mm_tokens_per_image = (c.patches_per_side // c.scale_factor) ** 2
            c.longest_edge = integer("longest_edge", 1, MAX_LONGEST_EDGE)
            if -(-c.longest_edge // c.image_size) > MAX_GRID_SIDE:
                raise ModelFormatError(f"{what('longest_edge')} {c.longest_edge} makes more than {MAX_GRID_SIDE} "
                                       f"crops of {c.image_size} a side (the tokenizer's <row_r_col_c> end at "
                                       f"{MAX_GRID_SIDE})")
            split = fields.get("do_image_splitting", True)
            if not isinstance(split, bool):
                raise ModelFormatError(f"{what('do_image_splitting')} must be true or false")
            c.do_image_splitting = split
            resample = fields.get("resample", 1)
            if isinstance(resample, bool) or resample not in RESAMPLE_FILTERS:
                raise ModelFormatError(f"{what('resample')} {str(resample)[:40]!r} is not a Pillow filter "
                                       f"{RESAMPLE_FILTERS}")
            c.resample = int(resample)
        elif fields.get("mm_tokens_per_image") is None and "pool" in fields:
            # llama.cpp's mmproj says the pool's side (clip.vision.projector.scale_factor), not the token count
            pool = integer("pool", 1, c.patches_per_side)
            if c.patches_per_side % pool:
                raise ModelFormatError(f"{what('pool')} {pool} does not divide the {c.patches_per_side} patches a side")
            c.mm_tokens_per_image = (c.patches_per_side // pool) ** 2
        else:
            c.mm_tokens_per_image = integer("mm_tokens_per_image", 1, MAX_PATCHES_PER_SIDE ** 2)
        side = c.tokens_per_side
        if c.projector == "gemma3" and (side * side != c.mm_tokens_per_image or c.patches_per_side % side):
            raise ModelFormatError(f"{what('mm_tokens_per_image')} {c.mm_tokens_per_image} is not a square whose "
                                   f"side divides the {c.patches_per_side} patches a side")
        if c.workspace_bytes() > MAX_WORKSPACE_BYTES:
            raise ModelFormatError(f"{source or 'the vision tower'}: one image's activations would take "
                                   f"{c.workspace_bytes() >> 20} MB ({c.n_patches} patches x "
                                   f"{max(3 * c.hidden_size, c.intermediate_size)} wide)")
        return c

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """The activations one image needs (the tower's buffers, allocated once: a crop's, whatever max_tokens)."""
        P, H, F = self.n_patches, self.hidden_size, self.intermediate_size
        return 4 * P * (self.num_channels * self.patch_size ** 2 + 6 * H + F)   # patches, x, h, qkv, ctx, MLP

    def params(self) -> int:
        H, F, L, P = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.n_patches
        per_layer = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H
        projector = (H * self.scale_factor ** 2 * self.text_hidden_size if self.projector == "idefics3"
                     else H + H * self.text_hidden_size)
        return H * self.num_channels * self.patch_size ** 2 + H + P * H + L * per_layer + 2 * H + projector


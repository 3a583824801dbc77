"""The hyper-parameters of a Pixtral vision tower, its Mistral 3 projector and its image processor, under Hugging
Face's names (PixtralVisionConfig's, Mistral3Config's, PixtralImageProcessor's), each range-checked as read,
whatever file they came from: a layout fills a dict of these names and `PixtralConfig.from_fields` checks it.

Nothing is sized from a value before it is checked: an image's activations are sized from its own grid, which
`longest_edge` bounds (at most MAX_LONGEST_EDGE pixels a side: (4096 / 14)^2 = 85k patches).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelFormatError
from ..finite import finite_as_float
from .config import MAX_FFN, MAX_HEAD_DIM, MAX_HIDDEN, MAX_LAYERS, MAX_TEXT_HIDDEN, number_triple

FAMILY = "pixtral"
ACTIVATIONS = ("silu", "gelu")           # the blocks' gated MLP: Mistral Small 3.1 silu, Pixtral-12B gelu (erf)
PROJECTOR_ACTIVATIONS = ("gelu",)        # Mistral3MultiModalProjector's projector_hidden_act (exact GELU)
MAX_PATCH = 64
MAX_MERGE = 4
MAX_LONGEST_EDGE = 4096                  # the processor's longest edge (Mistral Small 3.1: 1540, Pixtral-12B: 1024)
MAX_PATCHES = 16384                      # one image's patches (attention is quadratic in them): 1540 / 14 = 110 a side
NORM_EPS = 1e-5                          # the tower's RMSNorms (fixed in transformers' code)
MLP_ROWS = 4096                          # the MLP runs this many rows at a time
# the integer fields: (lowest, highest, default; None: required)
INTEGERS = {"hidden_size": (1, MAX_HIDDEN, None), "intermediate_size": (1, MAX_FFN, None),
            "num_hidden_layers": (1, MAX_LAYERS, None), "num_attention_heads": (1, MAX_HIDDEN, None),
            "patch_size": (1, MAX_PATCH, None), "spatial_merge_size": (1, MAX_MERGE, 2),
            "text_hidden_size": (1, MAX_TEXT_HIDDEN, None), "longest_edge": (1, MAX_LONGEST_EDGE, None),
            "num_channels": (3, 3, 3)}


@dataclass
class PixtralConfig:
    """text_hidden_size is the projector's output width (the text model's hidden_size); feature_layer the
    hidden state the projector reads, an index into transformers' (ln_pre's output, layer 0's, ...): -1 the last
    layer's (vision_feature_layer). merger: Mistral 3's projector (RMSNorm, the 2 x 2 patch merger, then the two
    linears); False: Pixtral-12B's LLaVA projector (the two linears alone, spatial_merge_size 1)."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    patch_size: int
    longest_edge: int
    spatial_merge_size: int
    text_hidden_size: int
    feature_layer: int = -1
    merger: bool = True
    hidden_act: str = "silu"
    projector_bias: bool = False
    projector_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_channels: int = 3
    image_mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    source: str = ""
    projector: str = FAMILY

    @property
    def factor(self) -> int:
        """The side, in pixels, of one merged cell (one soft token): both sides of a resized image are multiples."""
        return self.patch_size * self.spatial_merge_size

    @property
    def layers_run(self) -> int:
        """The blocks the projector's inputs need (the later ones are not run)."""
        return self.feature_layer % (self.num_hidden_layers + 1)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_fields(cls, fields: dict, names: dict | None = None, source: str = "") -> "PixtralConfig":
        def what(key: str) -> str:      # the file's own name of a field, for messages
            name = (names or {}).get(key, key)
            return f"{source}: {name}" if source else name

        def number(key: str, default: float, lo: float, hi: float) -> float:
            v = fields.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not finite_as_float(v) or not lo < v < hi:
                raise ModelFormatError(f"{what(key)} must be a number in ({lo}, {hi}), got {str(v)[:40]}")
            return float(v)

        ints = {}
        for key, (lo, hi, default) in INTEGERS.items():     # each checked before anything is sized from it
            v = fields.get(key, default)
            if v is None:
                raise ModelFormatError(f"{what(key)} is missing")
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ModelFormatError(f"{what(key)} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}")
            ints[key] = v
        c = cls(**ints, source=source,
                image_mean=number_triple(fields.get("image_mean", cls.image_mean), False, what("image_mean")),
                image_std=number_triple(fields.get("image_std", cls.image_std), True, what("image_std")))
        c.rescale_factor = number("rescale_factor", 1 / 255, 0, 2)
        c.rope_theta = number("rope_theta", 10000.0, 1, 1e9)
        c.projector_eps = number("projector_eps", 1e-5, 0, 1)
        for key, allowed in (("hidden_act", ACTIVATIONS), ("projector_hidden_act", PROJECTOR_ACTIVATIONS)):
            act = fields.get(key, allowed[0])
            if act not in allowed:
                raise ModelFormatError(f"{what(key)} {str(act)[:40]!r} is not supported ({', '.join(allowed)})")
        c.hidden_act = fields.get("hidden_act", "silu")
        bias = fields.get("projector_bias", False)
        if not isinstance(bias, bool):
            raise ModelFormatError(f"{what('projector_bias')} must be true or false, got {str(bias)[:40]}")
        c.projector_bias = bias
        if c.hidden_size % c.num_attention_heads or c.head_dim > MAX_HEAD_DIM or c.head_dim % 4:
            raise ModelFormatError(f"{what('hidden_size')} {c.hidden_size} is not {c.num_attention_heads} heads of a "
                                   f"multiple of 4 (the 2D rotary's row and column halves) at most {MAX_HEAD_DIM}")
        head_dim = fields.get("head_dim", c.head_dim)
        if head_dim != c.head_dim:
            raise ModelFormatError(f"{what('head_dim')} {str(head_dim)[:20]} is not hidden_size / num_attention_heads "
                                   f"= {c.head_dim} (transformers' Pixtral attention uses the latter)")
        layer, n = fields.get("feature_layer", -1), c.num_hidden_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -(n + 1) <= layer <= n:
            raise ModelFormatError(f"{what('feature_layer')} must be one layer index in {-(n + 1)}..{n} (Mistral 3's "
                                   "projector norm and patch merger are one hidden state wide: a list cannot run), got "
                                   f"{str(layer)[:40]}")
        c.feature_layer = layer
        merger = fields.get("merger", True)
        if not isinstance(merger, bool) or c.spatial_merge_size != (2 if merger else 1):
            raise ModelFormatError(f"{what('spatial_merge_size')} {c.spatial_merge_size}: Mistral 3's patch merger "
                                   "takes 2 x 2 patches, Pixtral-12B's LLaVA projector none (1)")
        c.merger = merger
        if (c.longest_edge // c.patch_size + 2) ** 2 > MAX_PATCHES:
            raise ModelFormatError(f"{what('longest_edge')} {c.longest_edge} allows images of more than "
                                   f"{MAX_PATCHES} patches of {c.patch_size}")
        return c

    def max_patches(self) -> int:
        """The most patches one image can make: each side at most the longest edge, rounded up to the factor."""
        side = -(-self.longest_edge // self.factor) * self.spatial_merge_size
        return side * side

    def workspace_bytes(self, max_tokens: int | None = None) -> int:
        """The activations of the largest image (or of max_tokens soft tokens where fewer): its pixels, x, h,
        [q|k|v], the attention's output, the kept feature layers, the MLP's two row blocks, the projector's rows."""
        n, H = self.max_patches(), self.hidden_size
        m2 = self.spatial_merge_size ** 2
        if max_tokens is not None:
            n = min(n, m2 * max(int(max_tokens), 1))
        per_patch = self.num_channels * self.patch_size ** 2 * 2 + 7 * H + (H + 2 * self.text_hidden_size) // m2
        return 4 * (n * per_patch + 2 * min(n, MLP_ROWS) * self.intermediate_size)

    def params(self) -> int:
        H, F, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        T, m2 = self.text_hidden_size, self.spatial_merge_size ** 2
        per_layer = 4 * H * H + 3 * H * F + 2 * H
        bias = 2 * T if self.projector_bias else 0
        projector = (H + H * m2 * H if self.merger else 0) + H * T + T * T + bias
        return H * self.num_channels * self.patch_size ** 2 + H + L * per_layer + projector

"""An LFM2-VL tower as llama.cpp's mmproj GGUF (projector type `lfm2`), what llama.cpp's converter makes of one: the
`clip.vision.*` keys, `clip.vision.projector.scale_factor` (downsample_factor), `clip.use_gelu`, image_size 256 (a
placeholder: NaFlex crops have their own sizes); the tower's names as Gemma 3's (`v.blk.N.*`, `v.post_ln`) with the
linear patch embedding stored as a convolution `v.patch_embd.weight` [H, C, p, p] (its (y, x, channel) values moved
to (channel, y, x)), the position table `v.position_embd.weight`; the projector's `mm.input_norm`, `mm.1`, `mm.2`.

llama.cpp's LFM2 projector always applies the LayerNorm (a tower without one is refused) and runs GELU as its tanh
form (transformers: exact; the rows move by ~1e-3); its image processor takes 64..256 tokens an image, tiles of 512,
2..10 tiles and a thumbnail whatever the file says. We also write the directory's processor settings under keys of
our own (`clip.vision.lfm2.*`, which llama.cpp does not read) and read them back; a file without them (the
converter's) gets llama.cpp's values."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from ..formats.quants import QType
from ..formats.weights import WeightTensor
from .layouts import LLAMA_CPP, MMPROJ_SCALE_KEY, _MMPROJ_KEYS, _scalar, gguf_lookup, gguf_name
from .lfm2vl import PROJECTOR

MMPROJ_TYPE = "lfm2"
CONVERTER_IMAGE_SIZE = 256
PROJECTOR_NAMES = {PROJECTOR + "layer_norm": "mm.input_norm", PROJECTOR + "linear_1": "mm.1",
                   PROJECTOR + "linear_2": "mm.2"}
OWN = "clip.vision.lfm2."
# the processor settings llama.cpp's lfm2 preprocessor assumes (its constants), ours written under OWN
LLAMA_CPP_PROCESSOR = {"min_image_tokens": 64, "max_image_tokens": 256, "tile_size": 512, "min_tiles": 2,
                       "max_tiles": 10, "use_thumbnail": True, "do_image_splitting": True,
                       "max_pixels_tolerance": 2.0}
PATCH = "embeddings.patch_embedding.weight"
MMPROJ_KEYS = {**_MMPROJ_KEYS, "downsample_factor": MMPROJ_SCALE_KEY, **{k: OWN + k for k in LLAMA_CPP_PROCESSOR}}


def canonical_names(cfg) -> list[str]:
    out = [PATCH, "embeddings.patch_embedding.bias", "embeddings.position_embedding.weight"]
    for i in range(cfg.num_hidden_layers):
        for leaf in ("layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                     "layer_norm2", "mlp.fc1", "mlp.fc2"):
            out += [f"encoder.layers.{i}.{leaf}.weight", f"encoder.layers.{i}.{leaf}.bias"]
    out += ["post_layernorm.weight", "post_layernorm.bias"]
    return out + [f"{p}.{k}" for p in PROJECTOR_NAMES for k in ("weight", "bias")]


def file_name(canon: str) -> str:
    base, _, kind = canon.rpartition(".")
    return f"{PROJECTOR_NAMES[base]}.{kind}" if base in PROJECTOR_NAMES else gguf_name(canon, LLAMA_CPP)


def lfm2vl_mmproj(layout, name: str, want, type_of) -> tuple[dict, list]:
    """(metadata, tensors) of the mmproj; type_of(canon, values, want) picks each tensor's type."""
    c = layout.cfg
    if not (c.projector_use_layernorm and c.projector_bias):
        raise InvalidInputError("llama.cpp's lfm2 projector always has its LayerNorm and biases: this one's "
                                "cannot be written")
    u32 = lambda v: GGUFValue(VT.UINT32, v)     # noqa: E731
    f32 = lambda v: GGUFValue(VT.FLOAT32, v)    # noqa: E731
    meta = {"general.architecture": "clip", "general.type": "mmproj", "general.name": name,
            "clip.projector_type": MMPROJ_TYPE, "clip.has_vision_encoder": True, "clip.use_gelu": True,
            "clip.vision.image_size": u32(CONVERTER_IMAGE_SIZE),
            MMPROJ_KEYS["layer_norm_eps"]: f32(c.layer_norm_eps),
            MMPROJ_KEYS["image_mean"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
            MMPROJ_KEYS["image_std"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std))}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
              "text_hidden_size", "downsample_factor", "min_image_tokens", "max_image_tokens", "tile_size",
              "min_tiles", "max_tiles"):
        meta[MMPROJ_KEYS[k]] = u32(getattr(c, k))
    meta[MMPROJ_KEYS["use_thumbnail"]] = c.use_thumbnail
    meta[MMPROJ_KEYS["do_image_splitting"]] = c.do_image_splitting
    meta[MMPROJ_KEYS["max_pixels_tolerance"]] = f32(c.max_pixels_tolerance)
    def stored(canon: str) -> tuple:
        t = layout.lookup(canon)
        if t is None:
            raise InvalidInputError(f"the tower's tensor {canon!r} is missing")
        v = np.asarray(t.to_float32(), dtype=np.float32).reshape(t.shape)
        if canon == PATCH:      # (y, x, channel) values -> a convolution's (channel, y, x)
            v = np.ascontiguousarray(v.reshape(-1, c.patch_size, c.patch_size, c.num_channels).transpose(0, 3, 1, 2))
        kind = QType.F32 if canon == "embeddings.position_embedding.weight" else type_of(canon, v, want)
        return file_name(canon), kind, v
    return meta, [stored(canon) for canon in canonical_names(c)]


REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
            "text_hidden_size", "downsample_factor")


def mmproj_fields(meta: dict, source: str) -> dict:
    """Lfm2VlVisionConfig fields of an lfm2 mmproj's metadata (llama.cpp's processor settings where our own keys
    are absent)."""
    for key, what in (("clip.has_vision_encoder", "no vision encoder"), ("clip.use_gelu", "no GELU MLP")):
        if meta.get(key) is not True:
            raise ModelFormatError(f"{source}: the mmproj's {key} is not true ({what}: not an LFM2-VL tower)")
    missing = [MMPROJ_KEYS[k] for k in REQUIRED if MMPROJ_KEYS[k] not in meta]
    if missing:
        raise ModelFormatError(f"{source}: GGUF metadata lacks {', '.join(map(repr, missing))}")
    fields = {k: _scalar(meta[key]) for k, key in MMPROJ_KEYS.items() if key in meta}
    for k, v in LLAMA_CPP_PROCESSOR.items():
        fields.setdefault(k, v)
    fields.setdefault("layer_norm_eps", 1e-6)
    fields.setdefault("image_mean", (0.5, 0.5, 0.5))
    fields.setdefault("image_std", (0.5, 0.5, 0.5))
    fields.update(hidden_act="gelu_pytorch_tanh", projector_hidden_act="gelu", projector_bias=True, num_channels=3,
                  projector_use_layernorm=True, rescale_factor=1 / 255)
    return fields


def mmproj_lookup(f, fields: dict, source: str):
    """A canonical-name lookup over an lfm2 mmproj: the convolution's patch weight read back as the linear one,
    the projector's hidden size (no key says it) from mm.1's rows into `fields`."""
    find = gguf_lookup(f, LLAMA_CPP)
    infos = f.tensors
    mm1 = infos.get("mm.1.weight")
    if mm1 is None or len(mm1.shape) != 2:
        raise ModelFormatError(f"{source}: the mmproj holds no 2-D mm.1.weight (the projector's linear_1)")
    fields["projector_hidden_size"] = int(mm1.shape[0])
    pos = infos.get("v.position_embd.weight")
    if pos is None or len(pos.shape) != 2:
        raise ModelFormatError(f"{source}: the mmproj holds no 2-D v.position_embd.weight")
    fields["num_patches"] = int(pos.shape[0])

    def lookup(canon: str):
        base, _, kind = canon.rpartition(".")
        if base in PROJECTOR_NAMES:
            t = infos.get(f"{PROJECTOR_NAMES[base]}.{kind}")
            return None if t is None else WeightTensor(canon, t.qtype, tuple(int(s) for s in t.shape), t.data)
        t = find(canon)
        if canon != PATCH or t is None:
            return t
        if len(t.shape) != 4:
            raise ModelFormatError(f"{source}: v.patch_embd.weight has shape {list(t.shape)}, not [H, C, p, p]")
        return _Linear(t)
    return lookup


class _Linear:
    """A convolution's patch weight [H, C, p, p] seen as the linear one [H, p * p * C] ((y, x, channel) values)."""

    def __init__(self, conv: WeightTensor):
        self.conv = conv
        H, C, p, q = conv.shape
        self.shape = (H, p * q * C)

    def to_float32(self) -> np.ndarray:
        v = np.asarray(self.conv.to_float32(), np.float32).reshape(self.conv.shape)
        return np.ascontiguousarray(v.transpose(0, 2, 3, 1)).reshape(self.shape)

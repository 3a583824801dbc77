"""Mistral 3's Pixtral tower as llama.cpp's mmproj GGUF (`clip.projector_type` pixtral), read and written as
llama.cpp's converter (convert_hf_to_gguf.py --mmproj) makes it of a Mistral3ForConditionalGeneration:

- keys: `clip.vision.{embedding_length, feed_forward_length, block_count, attention.head_count, patch_size,
  projection_dim, image_size (the processor's longest edge), spatial_merge_size, attention.layer_norm_epsilon,
  image_mean, image_std}`, `clip.use_silu` (the blocks' SiLU gate; `clip.use_gelu` for GELU). llama.cpp fixes the
  rope theta at 10000 and runs the projector's norm at the tower's eps: a tower that differs is not written.
- tensors (q and k rows permuted for llama.cpp's adjacent-pair rotation, as its converter does):
  `v.patch_embd.weight`, `v.pre_ln.weight`, `v.blk.N.{ln1, attn_q, attn_k, attn_v, attn_out, ln2,
  ffn_gate, ffn_up, ffn_down}.weight`, `mm.input_norm.weight`, `mm.patch_merger.weight`, `mm.1.*` / `mm.2.*`
  (linear_1, linear_2), and `v.token_embd.img_break`: the text model's embedding of [IMG_BREAK], which llama.cpp
  writes between the image's rows itself (here the prompt holds the token: the reader leaves it).

llama.cpp's projector GELU is ggml's (tanh) where transformers' is exact: their rows differ by that.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from ..formats.quants import QType
from ..formats.rope_rows import rope_permutation
from .pixtral import PROJECTOR, TOWER
from .pixtral_config import NORM_EPS, PixtralConfig
from .qwen2vl_layouts import float_tensor, gguf_tensor

MMPROJ_TYPE = "pixtral"
IMG_BREAK_ROW = "v.token_embd.img_break"
LLAMA_CPP_THETA = 10000.0
KEYS = {field: "clip.vision." + key for field, key in (
    ("hidden_size", "embedding_length"), ("intermediate_size", "feed_forward_length"), ("num_hidden_layers",
    "block_count"), ("num_attention_heads", "attention.head_count"), ("patch_size", "patch_size"), ("text_hidden_size",
    "projection_dim"), ("longest_edge", "image_size"), ("spatial_merge_size", "spatial_merge_size"), ("projector_eps",
    "attention.layer_norm_epsilon"), ("image_mean", "image_mean"), ("image_std", "image_std"))}
KEYS["hidden_act"] = "clip.use_silu / clip.use_gelu"
_LEAF = {"attention_norm": "ln1", "attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
         "attention.v_proj": "attn_v", "attention.o_proj": "attn_out", "ffn_norm": "ln2",
         "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}
_GLOBAL = {TOWER + "patch_conv": "v.patch_embd", TOWER + "ln_pre": "v.pre_ln", PROJECTOR + "norm": "mm.input_norm",
           PROJECTOR + "patch_merger.merging_layer": "mm.patch_merger", PROJECTOR + "linear_1": "mm.1",
           PROJECTOR + "linear_2": "mm.2"}
_LAYER = re.compile(re.escape(TOWER) + r"transformer\.layers\.(\d{1,4})\.(.+)\.(weight|bias)")
# the text embeddings under the HF lookup's prefix ("" or "model."): transformers 4's and 5's saves
EMBEDDINGS = ("language_model.model.embed_tokens.weight", "language_model.embed_tokens.weight")


def renamed(canon: str, leaves: dict, parts: dict) -> str | None:
    """A canonical name in a GGUF layout: a block's tensor v.blk.N.{leaves[leaf]}, the others parts[base]."""
    m = _LAYER.fullmatch(canon)
    if m:
        leaf = leaves.get(m.group(2))
        return f"v.blk.{int(m.group(1))}.{leaf}.{m.group(3)}" if leaf else None
    base, _, kind = canon.rpartition(".")
    return f"{parts[base]}.{kind}" if base in parts else None


def gguf_name(canon: str) -> str | None:
    return renamed(canon, _LEAF, _GLOBAL)


def lookup(gguf_file, cfg: PixtralConfig):
    """Canonical names over the mmproj's tensors (IMG_BREAK_ROW: itself), q and k rows back in transformers'
    half-split order (the converter permutes them for llama.cpp's adjacent-pair rotation)."""
    infos = gguf_file.tensors
    back = rope_permutation(cfg.num_attention_heads, cfg.head_dim, to_interleaved=False)

    def get(canon: str):
        t = gguf_tensor(infos, canon if canon == IMG_BREAK_ROW else gguf_name(canon) or "")
        if t is None or not canon.endswith(("attention.q_proj.weight", "attention.k_proj.weight")):
            return t
        v = np.asarray(t.to_float32(), np.float32).reshape(t.shape)
        return float_tensor(canon, v[back]) if v.ndim == 2 and len(v) == len(back) else t
    return get


def fields(meta: dict, source: str, tensors: dict) -> dict:
    """PixtralConfig fields of an mmproj's keys (its tensors say whether the projector has biases)."""
    f = {k: (meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key])
         for k, key in KEYS.items() if key in meta}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
              "text_hidden_size", "longest_edge", "projector_eps"):
        if k not in f:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {KEYS[k]!r}")
    silu, gelu = (v.tolist() if hasattr(v, "tolist") else v
                  for v in (meta.get("clip.use_silu", False), meta.get("clip.use_gelu", False)))
    if (silu is True) == (gelu is True):
        raise ModelFormatError(f"{source}: exactly one of clip.use_silu and clip.use_gelu must be true (the blocks' "
                               f"gated MLP), got {str(silu)[:10]} and {str(gelu)[:10]}")
    f["hidden_act"] = "silu" if silu is True else "gelu"
    f.setdefault("spatial_merge_size", 1)        # llama.cpp's default: Pixtral-12B's, which has no patch merger
    f["merger"] = "mm.patch_merger.weight" in tensors
    if f["projector_eps"] != np.float32(NORM_EPS):
        raise ModelFormatError(f"{source}: clip.vision.attention.layer_norm_epsilon {str(f['projector_eps'])[:20]}: "
                               f"llama.cpp runs the tower's norms at it, transformers' at {NORM_EPS}")
    f["projector_eps"] = NORM_EPS
    f["projector_bias"] = "mm.1.bias" in tensors
    return f


def mmproj_config(meta: dict, source: str, tensors: dict) -> PixtralConfig:
    return PixtralConfig.from_fields(fields(meta, source, tensors), KEYS, source)


def canonical_names(cfg: PixtralConfig) -> list[str]:
    out = [TOWER + "patch_conv.weight", TOWER + "ln_pre.weight"]
    for i in range(cfg.layers_run):
        out += [f"{TOWER}transformer.layers.{i}.{leaf}.weight" for leaf in _LEAF]
    if cfg.merger:
        out += [PROJECTOR + "norm.weight", PROJECTOR + "patch_merger.merging_layer.weight"]
    for lin in ("linear_1", "linear_2"):
        out += [f"{PROJECTOR}{lin}.weight"] + ([f"{PROJECTOR}{lin}.bias"] if cfg.projector_bias else [])
    return out


def break_row(layout, source) -> np.ndarray:
    """The text model's embedding of [IMG_BREAK]: an mmproj's own row, or a HF directory's embedding table's row of
    the id tokenizer.json's added tokens give it."""
    if layout.kind == "mmproj":
        t = layout.lookup(IMG_BREAK_ROW)
    else:
        from pathlib import Path
        from ..formats.files import read_json
        path = Path(source) / "tokenizer.json"
        added = read_json(path, "tokenizer.json").get("added_tokens", []) if path.exists() else []
        ids = [t.get("id") for t in added if isinstance(t, dict) and t.get("content") == "[IMG_BREAK]"]
        table = next((t for n in EMBEDDINGS if (t := layout.lookup(n)) is not None), None)
        t = None
        if len(ids) == 1 and isinstance(ids[0], int) and table is not None and 0 <= ids[0] < table.shape[0]:
            t = np.asarray(table.to_float32(), np.float32).reshape(table.shape)[ids[0]]
    if t is None:
        raise InvalidInputError(f"{source}: llama.cpp's pixtral mmproj holds the text embedding of [IMG_BREAK]: "
                                "its files name no such token, or hold no text embeddings")
    return np.asarray(t if isinstance(t, np.ndarray) else t.to_float32(), np.float32).reshape(-1)


def pixtral_mmproj(layout, name: str, want: QType, source) -> tuple[dict, list]:
    """(metadata, tensors) of the mmproj of a tower (a HF directory's or an mmproj's)."""
    c = layout.cfg
    if c.rope_theta != LLAMA_CPP_THETA or (c.merger and c.projector_eps != NORM_EPS) or \
            c.layers_run != c.num_hidden_layers:
        raise InvalidInputError(f"{source}: llama.cpp's pixtral mmproj fixes the rope theta at 10000, runs the "
                                f"projector's norm at the tower's eps {NORM_EPS} and reads the last block's output: "
                                f"this tower has {c.rope_theta}, {c.projector_eps}, vision_feature_layer "
                                f"{c.feature_layer}")
    u32 = lambda v: GGUFValue(VT.UINT32, v)     # noqa: E731
    meta = {"general.architecture": "clip", "general.type": "mmproj", "general.name": name,
            "clip.projector_type": MMPROJ_TYPE, "clip.has_vision_encoder": True,
            "clip.use_silu" if c.hidden_act == "silu" else "clip.use_gelu": True,
            KEYS["projector_eps"]: GGUFValue(VT.FLOAT32, NORM_EPS),
            KEYS["image_mean"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
            KEYS["image_std"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std))}
    meta.update({KEYS[k]: u32(getattr(c, k)) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                        "num_attention_heads", "patch_size", "text_hidden_size",
                                                        "longest_edge")})
    if c.merger:        # the converter writes it for Mistral 3 only (Pixtral-12B's config has none: 1)
        meta[KEYS["spatial_merge_size"]] = u32(c.spatial_merge_size)
    out, adjacent = [], rope_permutation(c.num_attention_heads, c.head_dim, to_interleaved=True)
    for canon in canonical_names(c):
        t = layout.lookup(canon)
        if t is None:
            raise InvalidInputError(f"{source}: the tower's tensor {canon!r} is missing")
        v = np.asarray(t.to_float32(), dtype=np.float32).reshape(t.shape)
        if canon.endswith(("attention.q_proj.weight", "attention.k_proj.weight")):
            v = v[adjacent]         # llama.cpp rotates adjacent pairs (its rope's normal mode), as the converter
        kind = QType.F32 if v.ndim < 2 else want
        if kind == QType.Q8_0 and (v.ndim != 2 or v.shape[-1] % 32):
            kind = QType.F16        # the patch conv and rows not of whole blocks
        out.append((gguf_name(canon), kind, v))
    out.append((IMG_BREAK_ROW, QType.F32, break_row(layout, source)))
    return meta, out

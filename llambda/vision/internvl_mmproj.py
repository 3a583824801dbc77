"""InternVL's tower as llama.cpp's mmproj GGUF (clip.projector_type `internvl`), read and written as llama.cpp's
converter (convert_hf_to_gguf.py --mmproj, InternVisionModel) makes it and its clip reads it.

Keys: the usual `clip.vision.*` sizes, `clip.use_gelu` true, `clip.vision.projector.scale_factor` (1 /
downsample_ratio), `clip.vision.preproc_min_tiles` / `preproc_max_tiles` (absent: llama.cpp's 1 and 12).
Tensors: `v.patch_embd.{weight,bias}`, `v.class_embd` [1, 1, H], `v.position_embd.weight` [1, P + 1, H] (always
F32), per block `v.blk.N.{ln1, attn_q, attn_k, attn_v, attn_q_norm, attn_k_norm, attn_out, ls1, ln2, ffn_up,
ffn_down, ls2}`, the projector's `mm.model.mlp.0` (LayerNorm), `mm.model.mlp.1`, `mm.model.mlp.3`.
llama.cpp's graph takes its block norms from the tower's size, not from a key: RMSNorm for 3200 wide and 45 blocks
(InternViT-6B), LayerNorm otherwise. So a file is read that way (its q/k norms and attention biases where the
tensors are there), and a tower whose norm_type disagrees with that rule, or with a final LayerNorm
(use_mean_pooling false), is refused by the writer: llama.cpp would run another model.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from ..formats.quants import QType
from .layouts import MMPROJ_NAMES, MMPROJ_SCALE_KEY
from .qwen2vl_layouts import gguf_tensor

PROJECTOR_TYPE = "internvl"
MIN_TILES_KEY, MAX_TILES_KEY = "clip.vision.preproc_min_tiles", "clip.vision.preproc_max_tiles"
RMS_SIZE = (3200, 45)           # llama.cpp's test for InternViT-6B's RMSNorm blocks: (width, blocks)
POSITIONS = "embeddings.position_embeddings"
KEYS = {**MMPROJ_NAMES, "min_patches": MIN_TILES_KEY, "max_patches": MAX_TILES_KEY}     # for messages
_GLOBAL = {"embeddings.patch_embeddings.projection.weight": "v.patch_embd.weight",
           "embeddings.patch_embeddings.projection.bias": "v.patch_embd.bias",
           "embeddings.cls_token": "v.class_embd", POSITIONS: "v.position_embd.weight",
           "multi_modal_projector.layer_norm.weight": "mm.model.mlp.0.weight", "multi_modal_projector.layer_norm.bias": "mm.model.mlp.0.bias",
           "multi_modal_projector.linear_1.weight": "mm.model.mlp.1.weight", "multi_modal_projector.linear_1.bias": "mm.model.mlp.1.bias",
           "multi_modal_projector.linear_2.weight": "mm.model.mlp.3.weight", "multi_modal_projector.linear_2.bias": "mm.model.mlp.3.bias"}
_LEAF = {"layernorm_before": "ln1", "layernorm_after": "ln2", "attention.q_proj": "attn_q",
         "attention.k_proj": "attn_k", "attention.v_proj": "attn_v", "attention.q_norm": "attn_q_norm",
         "attention.k_norm": "attn_k_norm", "attention.projection_layer": "attn_out", "mlp.fc1": "ffn_up",
         "mlp.fc2": "ffn_down"}
_SCALE = {"lambda_1": "ls1", "lambda_2": "ls2"}
_BLOCK_RE = re.compile(r"encoder\.layer\.(\d{1,4})\.(.+)")


def gguf_name(canon: str) -> str | None:
    """llama.cpp's name of a canonical (transformers') tensor name, None for a name it has none for."""
    if canon in _GLOBAL:
        return _GLOBAL[canon]
    m = _BLOCK_RE.fullmatch(canon)
    if not m:
        return None
    i, rest = int(m.group(1)), m.group(2)
    if rest in _SCALE:
        return f"v.blk.{i}.{_SCALE[rest]}.weight"
    leaf, _, kind = rest.rpartition(".")
    return f"v.blk.{i}.{_LEAF[leaf]}.{kind}" if leaf in _LEAF and kind in ("weight", "bias") else None


def lookup(gguf_file):
    infos = gguf_file.tensors

    def find(canon: str):
        name = gguf_name(canon)
        return gguf_tensor(infos, name) if name else None
    return find


def mmproj_fields(meta: dict, tensors: dict, source: str) -> dict:
    """InternVLConfig fields of an internvl mmproj's metadata (and what its tensors say: q/k norms, biases)."""
    if meta.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{source}: mmproj file says it has no vision encoder (clip.has_vision_encoder)")
    if meta.get("clip.use_silu") is True:
        raise ModelFormatError(f"{source}: clip.use_silu: InternViT's MLP is GELU")
    fields = {}
    for k, key in KEYS.items():
        if key in meta and k not in ("pool", "longest_edge"):
            v = meta[key]
            fields[k] = v.tolist() if hasattr(v, "tolist") else v
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size", "text_hidden_size", "scale_factor"):
        if k not in fields:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {MMPROJ_NAMES[k]!r}")
    fields.setdefault("min_patches", 1)
    fields.setdefault("max_patches", 12)
    rms = (fields["hidden_size"], fields["num_hidden_layers"]) == RMS_SIZE
    fields.update(norm_type="rms_norm" if rms else "layer_norm", use_qk_norm="v.blk.0.attn_q_norm.weight" in tensors,
                  attention_bias="v.blk.0.attn_q.bias" in tensors, use_mean_pooling=True, resample=3)
    return fields


def names(cfg) -> list[str]:
    """Every canonical tensor of the tower and projector, in the file's order."""
    out = ["embeddings.patch_embeddings.projection.weight", "embeddings.patch_embeddings.projection.bias",
           "embeddings.cls_token", POSITIONS]
    norm = ("weight", "bias") if cfg.norm_type == "layer_norm" else ("weight",)
    proj = ("weight", "bias") if cfg.attention_bias else ("weight",)
    for i in range(cfg.num_hidden_layers):
        b = f"encoder.layer.{i}."
        out += [f"{b}layernorm_before.{k}" for k in norm]
        for x in "qkv":
            out += [f"{b}attention.{x}_proj.{k}" for k in proj]
        if cfg.use_qk_norm:
            out += [f"{b}attention.q_norm.weight", f"{b}attention.k_norm.weight"]
        out += [f"{b}attention.projection_layer.weight", f"{b}attention.projection_layer.bias", f"{b}lambda_1"]
        out += [f"{b}layernorm_after.{k}" for k in norm]
        out += [f"{b}mlp.{fc}.{k}" for fc in ("fc1", "fc2") for k in ("weight", "bias")] + [f"{b}lambda_2"]
    return out + [n for n in _GLOBAL if n.startswith("multi_modal_projector.")]


def internvl_mmproj(layout, name: str, want, type_of) -> tuple[dict, list]:
    """(metadata, tensors) of the mmproj; type_of(canon, values, want) picks each tensor's type."""
    c = layout.cfg
    if (c.norm_type == "rms_norm") != ((c.hidden_size, c.num_hidden_layers) == RMS_SIZE):
        raise InvalidInputError(f"a tower of {c.norm_type} blocks {c.hidden_size} wide and {c.num_hidden_layers} deep: "
                                f"llama.cpp runs RMSNorm blocks exactly for {RMS_SIZE[0]} wide and {RMS_SIZE[1]} deep, "
                                "so its mmproj cannot say this tower")
    if not c.use_mean_pooling:
        raise InvalidInputError("a tower with a final LayerNorm (use_mean_pooling false): llama.cpp's internvl graph "
                                "has none")
    u32 = lambda v: GGUFValue(VT.UINT32, v)     # noqa: E731
    meta = {"general.architecture": "clip", "general.type": "mmproj", "general.name": name,
            "clip.projector_type": PROJECTOR_TYPE, "clip.has_vision_encoder": True, "clip.use_gelu": True,
            MMPROJ_SCALE_KEY: u32(c.scale_factor), MIN_TILES_KEY: u32(c.min_patches),
            MAX_TILES_KEY: u32(c.max_patches),
            MMPROJ_NAMES["layer_norm_eps"]: GGUFValue(VT.FLOAT32, c.layer_norm_eps),
            MMPROJ_NAMES["image_mean"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
            MMPROJ_NAMES["image_std"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std))}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size", "text_hidden_size"):
        meta[MMPROJ_NAMES[k]] = u32(getattr(c, k))
    tensors = [(gguf_name(canon), qtype, v) for canon, qtype, v in _typed(layout, names(c), want, type_of)]
    return meta, tensors


def _typed(layout, canons: list, want, type_of):
    """(canon, its type in the file, its float32 values) of each tensor; the position table and the class token
    always float32, as the converter keeps them."""
    for canon in canons:
        t = layout.lookup(canon)
        if t is None:
            raise InvalidInputError(f"the tower's tensor {canon!r} is missing")
        values = np.asarray(t.to_float32(), dtype=np.float32).reshape(t.shape)
        yield canon, QType.F32 if canon in (POSITIONS, "embeddings.cls_token") else type_of(canon, values, want), values

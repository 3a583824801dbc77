"""GLM-4.1V / GLM-4.6V's vision tower as llama.cpp's mmproj GGUF (projector type `glm4v`), read and written.

Names (canonical: transformers' under `visual.`; llama.cpp's clip loader and its glm4v graph):
  patch_embed.proj.weight [H, C, 2, P, P]   v.patch_embd.weight, v.patch_embd.weight.1 (the temporal slices)
  patch_embed.proj.bias                     v.patch_embd.bias
  embeddings.position_embedding.weight      v.position_embd.weight (float32)
  post_conv_layernorm                       v.norm_embd (RMSNorm: the name llama-cpp-python 0.3.36's libmtmd reads)
  blocks.N.{norm1, norm2, attn.proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj}
                                            v.blk.N.{ln1, ln2, attn_out, ffn_gate, ffn_up, ffn_down}
  blocks.N.attn.qkv                         v.blk.N.attn_q / attn_k / attn_v (split)
  post_layernorm                            v.post_ln
  downsample [T, H, m, m]                   mm.patch_merger (a Conv2d weight, and its bias)
  merger.proj, merger.post_projection_norm  mm.model.fc, mm.post_norm
  merger.{gate_proj, up_proj, down_proj}    mm.gate, mm.up, mm.down
Keys: clip.vision.{embedding_length, feed_forward_length (the blocks' MLP: out_hidden_size), block_count,
attention.head_count, attention.layer_norm_epsilon (rms_norm_eps), patch_size, image_size (the position grid's side
x patch), projection_dim (the text width), spatial_merge_size, image_mean, image_std}; the merger's SwiGLU width is
mm.gate's rows; the processor's bounds our own clip.vision.min_pixels / max_pixels (Glm4vImageProcessor's
defaults where absent).
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from .qwen2vl_layouts import MMPROJ_KEYS as QWEN_KEYS, float_tensor, gguf_tensor
from .qwen2vl_mmproj import tower_tensors

MMPROJ_TYPE = "glm4v"
PATCH = "patch_embed.proj.weight"
POSITIONS = "embeddings.position_embedding.weight"
KEYS = {k: QWEN_KEYS[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size",
                                  "text_hidden_size", "image_mean", "image_std", "spatial_merge_size",
                                  "min_pixels", "max_pixels")} | {
    "image_size": "clip.vision.image_size", "rms_norm_eps": "clip.vision.attention.layer_norm_epsilon",
    "intermediate_size": "mm.gate.weight (its rows)"}
GLOBAL = {"patch_embed.proj.bias": "v.patch_embd.bias", POSITIONS: "v.position_embd.weight",
          "post_conv_layernorm.weight": "v.norm_embd.weight", "post_layernorm.weight": "v.post_ln.weight",
          "downsample.weight": "mm.patch_merger.weight", "downsample.bias": "mm.patch_merger.bias",
          "merger.proj.weight": "mm.model.fc.weight", "merger.post_projection_norm.weight": "mm.post_norm.weight",
          "merger.post_projection_norm.bias": "mm.post_norm.bias", "merger.gate_proj.weight": "mm.gate.weight",
          "merger.up_proj.weight": "mm.up.weight", "merger.down_proj.weight": "mm.down.weight"}
LEAVES = {"norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
PATCH_SLICES = ("v.patch_embd.weight", "v.patch_embd.weight.1")
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size", "text_hidden_size", "image_size")


def gguf_name(canon: str) -> str | None:
    """llama.cpp's name of a canonical tensor (not the two split ones: the patch embedding, qkv)."""
    if canon in GLOBAL:
        return GLOBAL[canon]
    parts = canon.split(".")
    if parts[0] == "blocks" and len(parts) >= 4 and parts[1].isdigit():
        leaf = LEAVES.get(".".join(parts[2:-1]))
        return f"v.blk.{int(parts[1])}.{leaf}.{parts[-1]}" if leaf else None
    return None


def canonical_names(cfg) -> list[str]:
    leaves = ["norm1.weight", "attn.qkv.weight"] + (["attn.qkv.bias"] if cfg.attention_bias else []) + [
        "attn.proj.weight", "norm2.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    return [PATCH] + [c for c in GLOBAL if c.startswith(("patch", "embeddings", "post_conv"))] + [
        f"blocks.{i}.{leaf}" for i in range(cfg.num_hidden_layers) for leaf in leaves] + [
        c for c in GLOBAL if c.startswith(("post_layernorm", "downsample", "merger"))]


def glm4v_mmproj(layout, name: str, want, type_of) -> tuple[dict, list]:
    """(metadata, tensors) of the mmproj; type_of(canon, values, want) picks each tensor's type."""
    c = layout.cfg
    if c.temporal_patch_size != 2 or c.rope_theta != 10000.0:
        raise InvalidInputError("llama.cpp's glm4v mmproj says neither a temporal patch other than 2 nor a vision "
                                "rope theta other than 10000")
    u32 = lambda v: GGUFValue(VT.UINT32, v)     # noqa: E731
    meta = {"general.architecture": "clip", "general.type": "mmproj", "general.name": name,
            "clip.projector_type": MMPROJ_TYPE, "clip.has_vision_encoder": True, "clip.use_silu": True,
            "clip.vision.feed_forward_length": u32(c.text_hidden_size),
            KEYS["rms_norm_eps"]: GGUFValue(VT.FLOAT32, c.rms_norm_eps),
            KEYS["image_mean"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
            KEYS["image_std"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std))}
    meta.update({KEYS[k]: u32(getattr(c, k)) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                       "patch_size", "text_hidden_size", "spatial_merge_size",
                                                       "min_pixels", "max_pixels", "image_size")})
    tensors = tower_tensors(layout, canonical_names(c), want, type_of, gguf_name, float32=(POSITIONS,))
    return meta, tensors


def mmproj_fields(meta: dict, tensors: dict, source: str) -> dict:
    """Glm4vVisionConfig fields of a glm4v mmproj's metadata (and its tensors: the merger's width, qkv biases)."""
    if meta.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{source}: mmproj file says it has no vision encoder (clip.has_vision_encoder)")
    missing = [KEYS[k] for k in REQUIRED if KEYS[k] not in meta]
    if missing:
        raise ModelFormatError(f"{source}: GGUF metadata lacks {', '.join(map(repr, missing))}")
    f = {k: meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key] for k, key in KEYS.items() if key in meta}
    gate = tensors.get(GLOBAL["merger.gate_proj.weight"])
    if gate is None or len(gate.shape) != 2:
        raise ModelFormatError(f"{source}: a glm4v mmproj needs {GLOBAL['merger.gate_proj.weight']!r} [F, T]")
    f["intermediate_size"] = int(gate.shape[0])     # GGUF shapes as our reader gives them: [rows, cols]
    f["attention_bias"] = "v.blk.0.attn_q.bias" in tensors
    return f


def lookup(gguf_file):
    """Canonical names over a glm4v mmproj's tensors: the patch embedding's slices and each block's q, k, v put
    together (float32) as transformers holds them."""
    infos = gguf_file.tensors

    def get(name):
        return gguf_tensor(infos, name)

    def find(canon: str):
        if canon == PATCH:
            a, b = (get(n) for n in PATCH_SLICES)
            if a is None or b is None or a.shape != b.shape or len(a.shape) != 4:
                return None
            return float_tensor(canon, np.stack([a.to_float32().reshape(a.shape),
                                                 b.to_float32().reshape(b.shape)], axis=2))
        parts = canon.split(".")
        if len(parts) == 5 and parts[0] == "blocks" and parts[2:4] == ["attn", "qkv"]:
            qkv = [get(f"v.blk.{parts[1]}.attn_{x}.{parts[4]}") for x in "qkv"]
            if any(p is None for p in qkv) or len({p.shape for p in qkv}) != 1:
                return None
            return float_tensor(canon, np.concatenate([p.to_float32().reshape(p.shape) for p in qkv]))
        name = gguf_name(canon)
        return get(name) if name else None
    return find

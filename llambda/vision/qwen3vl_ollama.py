"""Ollama's qwen3vl model file (general.architecture `qwen3vl`, or `qwen3vlmoe` beside a MoE text model): the
Qwen3-VL tower inside the model GGUF, as Ollama's converter (convert/convert_qwen3vl.go) writes it and its
runtime (model/models/qwen3vl) reads it, learned from their public source: no Ollama file was at hand.

- keys `<arch>.vision.{embedding_length, block_count, attention.head_count, num_channels, patch_size,
  spatial_merge_size, temporal_patch_size, rope.freq_base, deepstack_visual_indexes, shortest_edge,
  longest_edge, image_mean, image_std}` (the last four the processor's preprocessor_config.json), the text width
  `<arch>.embedding_length`; no MLP width (linear_fc1's rows say it) and no position count (pos_embed's rows);
- tensors HF's with `model.visual` -> `v`, `blocks` -> `blk`, `patch_embed.proj` -> `patch_embed` (its weight
  [H * C, T, P, P]), `attn.proj` -> `attn_out`, qkv split into `attn_q` / `attn_k` / `attn_v`,
  `deepstack_merger_list` -> `deepstack_merger` (numbered by level); the rest (`norm1`, `mlp.linear_fc1`,
  `merger.norm`, `pos_embed`, ...) as HF's.

Ollama's own runtime resizes bilinearly and caps an image at 2 << 20 pixels; ours follows transformers'
processor (bicubic, the file's shortest / longest edge).
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError
from .qwen2vl_layouts import float_tensor, gguf_tensor
from .qwen3vl_layouts import PROCESSOR

ARCHS = ("qwen3vl", "qwen3vlmoe")
_FIELDS = {"hidden_size": "vision.embedding_length", "num_hidden_layers": "vision.block_count",
           "num_attention_heads": "vision.attention.head_count", "num_channels": "vision.num_channels",
           "patch_size": "vision.patch_size", "spatial_merge_size": "vision.spatial_merge_size",
           "temporal_patch_size": "vision.temporal_patch_size", "rope_theta": "vision.rope.freq_base",
           "deepstack_visual_indexes": "vision.deepstack_visual_indexes", "min_pixels": "vision.shortest_edge",
           "max_pixels": "vision.longest_edge", "image_mean": "vision.image_mean", "image_std": "vision.image_std",
           "text_hidden_size": "embedding_length"}
_RENAMES = (("blocks.", "blk."), ("patch_embed.proj", "patch_embed"), ("attn.proj", "attn_out"),
            ("deepstack_merger_list.", "deepstack_merger."))
_QKV_RE = re.compile(r"blocks\.(\d{1,4})\.attn\.qkv\.(weight|bias)")


def keys(arch: str) -> dict:
    """Our field names -> the file's keys (for the config's error messages)."""
    return {k: f"{arch}.{v}" for k, v in _FIELDS.items()}


def lookup(gguf_file):
    """Canonical (transformers') names over the file's `v.*` tensors: each block's q, k, v joined, the patch
    embedding's weight reshaped [H, C, T, P, P]."""
    infos = gguf_file.tensors

    def get(name):
        return gguf_tensor(infos, name)

    def find(canon: str):
        m = _QKV_RE.fullmatch(canon)
        if m:
            parts = [get(f"v.blk.{int(m.group(1))}.attn_{x}.{m.group(2)}") for x in "qkv"]
            if any(p is None for p in parts) or len({tuple(p.shape) for p in parts}) != 1:
                return None
            return float_tensor(canon, np.concatenate([p.to_float32().reshape(tuple(p.shape)) for p in parts]))
        name = "v." + canon
        for a, b in _RENAMES:
            name = name.replace(a, b)
        t = get(name)
        if t is None or canon != "patch_embed.proj.weight":
            return t
        shape = tuple(int(s) for s in t.shape)
        if len(shape) != 4 or shape[0] % 3:
            return None
        return float_tensor(canon, t.to_float32().reshape((shape[0] // 3, 3) + shape[1:]))
    return find


def fields(meta: dict, find, arch: str, source: str) -> dict:
    """QwenVisionConfig fields of the file's keys; the MLP width and the position count from the tensors' rows;
    the processor's pixel bounds and mean / std (0.5) where the keys are absent."""
    f = {k: (meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key])
         for k, key in keys(arch).items() if key in meta}
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "text_hidden_size"):
        if k not in f:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {keys(arch)[k]!r}")
    rows = {}
    for k, canon in (("intermediate_size", "blocks.0.mlp.linear_fc1.weight"),
                     ("num_position_embeddings", "pos_embed.weight")):
        t = find(canon)
        if t is None or len(t.shape) != 2:
            raise ModelFormatError(f"{source}: the vision tower's tensor {canon!r} is missing or not a matrix")
        rows[k] = int(t.shape[0])
    f.update(rows, projector="qwen3_vl")
    f.setdefault("deepstack_visual_indexes", [])
    for k, v in PROCESSOR.items():
        f.setdefault(k, v)
    for k in ("image_mean", "image_std"):
        f.setdefault(k, [0.5, 0.5, 0.5])
    return f

"""A Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower as llama.cpp's mmproj GGUF (projector type `qwen2.5vl_merger`,
`qwen2vl_merger` or `qwen3vl_merger`), what llama.cpp's converter (convert_hf_to_gguf.py --mmproj) makes of one: the `clip.vision.*`
keys, `clip.vision.n_wa_pattern` (Qwen2.5-VL: its full-attention blocks must be every n-th, n-1, 2n-1, ...: the
key cannot say another pattern), `clip.use_silu` (Qwen2.5-VL's SwiGLU; Qwen2-VL's quick GELU is llama.cpp's MLP
where neither use_silu nor use_gelu is set: with use_gelu it would run GELU, measured 1.4e-2 off); the Conv3d patch embedding as its two temporal slices
`v.patch_embd.weight` and `v.patch_embd.weight.1` [H, C, P, P], each block's qkv split into attn_q, attn_k, attn_v.
We also write `clip.vision.window_size` and the processor's `clip.vision.min_pixels` / `max_pixels`, which llama.cpp
does not read (its window is 112 pixels whatever the key says: another window is refused; its own pixel bounds are
8..4096 tokens an image); image_size 560 as the converter.

Qwen3-VL (qwen3vl_layouts.py names its parts): `clip.use_gelu`, `clip.vision.is_deepstack_layers`, image_size the
position grid's side x patch_size (as the converter), each block's qkv as one `attn_qkv` (llama.cpp's graph reads
no split one), the patch bias, the position grid (float32), the DeepStack mergers under their blocks' numbers.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from ..formats.quants import QType
from .qwen2vl_layouts import (LLAMA_CPP_WINDOW, MERGER_NAMES, MLP_NAMES, MMPROJ_KEYS, MMPROJ_TYPE_OF, WA_PATTERN_KEY,
                              gguf_name)
from .qwen3vl_layouts import DEEPSTACK_KEY, PATCH_BIAS, POSITIONS, deepstack_names

CONVERTER_IMAGE_SIZE = 560


def wa_pattern(cfg) -> int:
    """n of n_wa_pattern: fullatt_block_indexes must be n-1, 2n-1, ... (0: no full blocks is not sayable)."""
    full = list(cfg.fullatt_block_indexes)
    if not full:
        raise InvalidInputError("a Qwen2.5-VL tower without full-attention blocks cannot be written as llama.cpp's "
                                "mmproj (n_wa_pattern)")
    n = full[0] + 1
    if full != list(range(n - 1, cfg.num_hidden_layers, n)):
        raise InvalidInputError(f"fullatt_block_indexes {full} are not every {n}-th block: llama.cpp's mmproj "
                                "(n_wa_pattern) cannot say them")
    return n


def canonical_names(cfg) -> list[str]:
    rms, qwen3 = cfg.projector == "qwen2_5_vl", cfg.projector == "qwen3_vl"
    up, down, gate = MLP_NAMES[cfg.projector]
    leaves = ["norm1", "attn.qkv", "attn.proj", "norm2"] + ([gate] if gate else []) + [up, down]
    out = ["patch_embed.proj.weight"] + ([PATCH_BIAS, POSITIONS] if qwen3 else [])
    for i in range(cfg.num_hidden_layers):
        for leaf in leaves:
            out.append(f"blocks.{i}.{leaf}.weight")
            if not (rms and leaf.startswith("norm")):
                out.append(f"blocks.{i}.{leaf}.bias")
    mergers = [MERGER_NAMES[cfg.projector]] + [deepstack_names(j) for j in range(cfg.deepstack)]
    for norm, fc1, fc2 in mergers:
        out += [norm + ".weight"] + ([] if rms else [norm + ".bias"])
        out += [fc1 + ".weight", fc1 + ".bias", fc2 + ".weight", fc2 + ".bias"]
    return out


def qwen_mmproj(layout, name: str, want, type_of) -> tuple[dict, list]:
    """(metadata, tensors) of the mmproj; type_of(canon, values, want) picks each tensor's type."""
    c = layout.cfg
    u32 = lambda v: GGUFValue(VT.UINT32, v)     # noqa: E731
    meta = {
        "general.architecture": "clip", "general.type": "mmproj", "general.name": name,
        "clip.projector_type": MMPROJ_TYPE_OF[c.projector], "clip.has_vision_encoder": True,
        "clip.vision.image_size": u32(CONVERTER_IMAGE_SIZE),
        "clip.vision.attention.layer_norm_epsilon": GGUFValue(VT.FLOAT32, 1e-6),
        MMPROJ_KEYS["hidden_size"]: u32(c.hidden_size), MMPROJ_KEYS["intermediate_size"]: u32(c.intermediate_size),
        MMPROJ_KEYS["num_hidden_layers"]: u32(c.num_hidden_layers),
        MMPROJ_KEYS["num_attention_heads"]: u32(c.num_attention_heads), MMPROJ_KEYS["patch_size"]: u32(c.patch_size),
        MMPROJ_KEYS["text_hidden_size"]: u32(c.text_hidden_size),
        MMPROJ_KEYS["spatial_merge_size"]: u32(c.spatial_merge_size),
        MMPROJ_KEYS["min_pixels"]: u32(c.min_pixels), MMPROJ_KEYS["max_pixels"]: u32(c.max_pixels),
        MMPROJ_KEYS["image_mean"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
        MMPROJ_KEYS["image_std"]: GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std)),
    }
    if c.temporal_patch_size != 2 or c.rope_theta != 10000.0:
        raise InvalidInputError("llama.cpp's mmproj says neither a temporal patch other than 2 nor a vision rope "
                                "theta other than 10000")
    if c.projector == "qwen2_5_vl":
        if c.window_size != LLAMA_CPP_WINDOW:
            raise InvalidInputError(f"window_size {c.window_size}: llama.cpp's mmproj reader assumes {LLAMA_CPP_WINDOW} "
                                    "pixels whatever clip.vision.window_size says")
        meta.update({"clip.use_silu": True, WA_PATTERN_KEY: u32(wa_pattern(c)),
                     MMPROJ_KEYS["window_size"]: u32(c.window_size)})
    if c.projector == "qwen3_vl":
        meta.update({"clip.use_gelu": True, "clip.vision.image_size": u32(c.position_side * c.patch_size),
                     DEEPSTACK_KEY: GGUFValue((VT.ARRAY, VT.BOOL), [i in c.deepstack_visual_indexes
                                                                     for i in range(c.num_hidden_layers)])})
    # Qwen2-VL: neither clip.use_gelu nor clip.use_silu: llama.cpp's MLP is then its quick GELU
    tensors = tower_tensors(layout, canonical_names(c), want, type_of,
                            lambda canon: gguf_name(canon, deepstack=c.deepstack_visual_indexes),
                            fused_qkv=c.projector == "qwen3_vl", float32=(POSITIONS,))
    return meta, tensors


def tower_tensors(layout, names: list, want, type_of, name_of, fused_qkv: bool = False, float32=()) -> list:
    """(llama.cpp's name, type, float32 values) of each canonical tensor `names` of a Qwen-VL style tower (GLM-4.1V's
    too): the Conv3d patch embedding as its two temporal slices v.patch_embd.weight(.1), each block's qkv split into
    attn_q, attn_k, attn_v (`fused_qkv`: one attn_qkv), the others as name_of(canon) names them; type_of(canon,
    values, want) picks a type, `float32` names the tensors kept float32."""
    tensors = []
    for canon in names:
        t = layout.lookup(canon)
        if t is None:
            raise InvalidInputError(f"the tower's tensor {canon!r} is missing")
        v = np.asarray(t.to_float32(), dtype=np.float32).reshape(t.shape)
        if canon == "patch_embed.proj.weight":
            for k, suffix in enumerate(("", ".1")):
                part = np.ascontiguousarray(v[:, :, k])
                tensors.append(("v.patch_embd.weight" + suffix, type_of(canon, part, want), part))
        elif ".attn.qkv." in canon:
            i, kind = int(canon.split(".")[1]), canon.rpartition(".")[2]
            for x, part in ([("qkv", v)] if fused_qkv else zip("qkv", np.split(v, 3))):
                tensors.append((f"v.blk.{i}.attn_{x}.{kind}", type_of(canon, part, want), part))
        else:
            tensors.append((name_of(canon), QType.F32 if canon in float32 else type_of(canon, v, want), v))
    return tensors

"""Writing a vision tower as llama.cpp's mmproj GGUF (general.architecture `clip`, projector type `gemma3` or
`idefics3`; Qwen2-VL's `qwen2.5vl_merger` and `qwen2vl_merger` in qwen2vl_mmproj.py, Mistral 3's `pixtral` in
pixtral_mmproj.py, InternVL's `internvl` in internvl_mmproj.py, LLaVA's `mlp` in llava_mmproj.py, GLM-4.1V's
`glm4v` in glm4v_mmproj.py), the file llama.cpp's converter (convert_hf_to_gguf.py --mmproj) makes of a
Gemma3ForConditionalGeneration or an Idefics3ForConditionalGeneration: its `clip.*` keys, tensor names
(layouts.gguf_name); Gemma 3's projector norm stored as 1 + w, its projection stored [vision_hidden,
text_hidden] as HF holds it; Idefics3's connector `mm.model.fc.weight` [text_hidden, s*s*vision_hidden], its
pixel shuffle's factor in clip.vision.projector.scale_factor, the processor's longest edge in
clip.vision.preproc_image_size.

Types: "f32" writes every tensor in float32; "f16" the matrices and the patch embedding in F16; "q8_0" the
matrices whose rows are whole 32-value blocks in Q8_0, the patch embedding and the input projection in F16
(llama.cpp's converter keeps both in F16 too); norms, biases and the position embedding always float32.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue, write_gguf
from ..formats.quants import QType
from .layouts import (CONNECTOR, LLAMA_CPP, MMPROJ_DEFAULT_SCALE, MMPROJ_LONGEST_EDGE_KEY, MMPROJ_SCALE_KEY, gguf_name,
                      vit_keys)
from .llava_mmproj import is_llava, llava_mmproj
from .load import open_layout
from .pixtral_mmproj import pixtral_mmproj
from .qwen2vl_config import QWEN_FAMILIES
from .glm4v_mmproj import glm4v_mmproj
from .internvl_mmproj import internvl_mmproj
from .lfm2vl_mmproj import lfm2vl_mmproj
from .qwen2vl_mmproj import qwen_mmproj

TYPES = {"f32": QType.F32, "f16": QType.F16, "q8_0": QType.Q8_0}


def canonical_names(cfg) -> list[str]:
    """Every tensor of the tower and projector, canonical names, in the file's order."""
    out = ["embeddings.patch_embedding.weight", "embeddings.patch_embedding.bias",
           "embeddings.position_embedding.weight"]
    for i in range(cfg.num_hidden_layers):
        for leaf in ("layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                     "layer_norm2", "mlp.fc1", "mlp.fc2"):
            out += [f"encoder.layers.{i}.{leaf}.weight", f"encoder.layers.{i}.{leaf}.bias"]
    out += ["post_layernorm.weight", "post_layernorm.bias"]
    if cfg.projector == "idefics3":
        return out + [CONNECTOR]
    return out + ["mm_soft_emb_norm.weight", "mm_input_projection_weight"]


def _type(canon: str, values: np.ndarray, want: QType) -> QType:
    if values.ndim < 2 or canon == "embeddings.position_embedding.weight":
        return QType.F32
    if want == QType.Q8_0 and (canon in ("embeddings.patch_embedding.weight", "mm_input_projection_weight", CONNECTOR)
                               or values.shape[-1] % 32):
        return QType.F16
    return want


def write_mmproj(source, out, qtype: str = "f32", name: str | None = None) -> Path:
    """Write the vision tower of `source` (any layout load_vision reads) to `out` as llama.cpp's mmproj GGUF."""
    if qtype not in TYPES:
        raise InvalidInputError(f"qtype must be one of {sorted(TYPES)}, got {qtype!r}")
    layout = open_layout(Path(source))
    if layout is None:
        raise InvalidInputError(f"{source}: holds no vision tower")
    try:
        c = layout.cfg
        if c.projector == "pixtral":
            meta, tensors = pixtral_mmproj(layout, name or Path(source).name, TYPES[qtype], source)
            out = Path(os.fspath(out))
            write_gguf(out, meta, tensors)
            return out
        if c.projector in QWEN_FAMILIES or c.projector in ("lfm2_vl", "internvl", "glm4v") or is_llava(layout):
            write = {"lfm2_vl": lfm2vl_mmproj, "internvl": internvl_mmproj, "glm4v": glm4v_mmproj}.get(
                c.projector, llava_mmproj if is_llava(layout) else qwen_mmproj)
            meta, tensors = write(layout, name or Path(source).name, TYPES[qtype], _type)
            out = Path(os.fspath(out))
            write_gguf(out, meta, tensors)
            return out
        if c.projector == "gemma3" and c.pool * c.tokens_per_side != c.patches_per_side:
            raise InvalidInputError("the token grid does not pool the patch grid evenly")
        if c.projector == "idefics3" and not c.do_image_splitting:
            raise InvalidInputError(f"{source}: its image processor does not split images, which llama.cpp's mmproj "
                                    "cannot say")
        meta = {
            "general.architecture": "clip", "general.type": "mmproj",
            "general.name": name or Path(source).name,
            "clip.projector_type": c.projector, "clip.has_vision_encoder": True, "clip.use_gelu": True,
            **vit_keys(c, c.num_hidden_layers),
        }
        if c.projector == "idefics3":
            meta[MMPROJ_SCALE_KEY] = GGUFValue(VT.UINT32, c.scale_factor)
            meta[MMPROJ_LONGEST_EDGE_KEY] = GGUFValue(VT.UINT32, c.longest_edge)
        elif c.pool != MMPROJ_DEFAULT_SCALE:
            meta[MMPROJ_SCALE_KEY] = GGUFValue(VT.UINT32, c.pool)
        tensors = []
        for canon in canonical_names(c):
            t = layout.lookup(canon)
            if t is None:
                raise InvalidInputError(f"{source}: the tower's tensor {canon!r} is missing")
            v = np.asarray(t.to_float32(), dtype=np.float32)
            if canon == "mm_soft_emb_norm.weight":
                v = v + np.float32(layout.soft_norm_offset)     # stored as the multiplier 1 + w
            tensors.append((gguf_name(canon, LLAMA_CPP), _type(canon, v, TYPES[qtype]), v))
        out = Path(os.fspath(out))
        write_gguf(out, meta, tensors)
        return out
    finally:
        for close in layout.closers:
            close()

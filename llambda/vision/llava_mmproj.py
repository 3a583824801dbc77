"""A LLaVA 1.5 tower as llama.cpp's mmproj GGUF (clip.projector_type `mlp`), the file llama.cpp's
convert_image_encoder_to_gguf.py makes of a llava-hf checkpoint: clip.has_llava_projector, the `clip.vision.*`
keys, clip.use_gelu (the tower's exact GELU; quick GELU without it), clip.vision.feature_layer (the non-negative
hidden-state indices), block_count = the deepest of them (only those blocks written), no v.post_ln (LLaVA's
features are taken before it), mm.0 / mm.2 the projector. fc1 is written `ffn_up` and fc2 `ffn_down`; llama.cpp
swaps the two back where `ffn_down` takes the tower's width (old files' names), so a tower whose MLP is as wide as
itself is written with the old names, which both readers then take the same way. A LLaVA-NeXT tower adds its
pinpoints, spatial_unpad and v.image_newline (llava_next_mmproj.py).

Refused (llama.cpp's graph cannot say them): the "full" strategy (llama.cpp always drops the class row), feature
layers not in increasing order (llama.cpp joins them in layer order), a projector without biases.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from .layouts import vit_keys
from .llava_layouts import gguf_name
from .llava_next_mmproj import NEWLINE_NAME, next_metadata


def canonical_names(c) -> list[str]:
    out = ["embeddings.class_embedding", "embeddings.patch_embedding.weight", "embeddings.position_embedding.weight",
           "pre_layrnorm.weight", "pre_layrnorm.bias"]
    for i in range(c.layers_run):
        for leaf in ("layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                     "layer_norm2", "mlp.fc1", "mlp.fc2"):
            out += [f"encoder.layers.{i}.{leaf}.weight", f"encoder.layers.{i}.{leaf}.bias"]
    return out + ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]


def llava_mmproj(layout, name: str, qtype, type_of) -> tuple[dict, list]:
    """(metadata, tensors) of an mlp mmproj of `layout` (a LLaVA tower's); `type_of(canon, values, qtype)` picks
    each tensor's type (mmproj._type)."""
    c = layout.cfg
    if c.keep_class:
        raise InvalidInputError("llama.cpp's mlp mmproj always drops the class token: a tower whose "
                                "vision_feature_select_strategy is 'full' cannot be written")
    if list(c.feature_layers) != sorted(c.feature_layers):
        raise InvalidInputError(f"llama.cpp joins feature layers in layer order: {list(c.feature_layers)} cannot be "
                                "written")
    if not c.projector_bias or c.patch_bias or c.post_ln or not c.has_class or c.preprocess != "crop":
        raise InvalidInputError("only a LlavaForConditionalGeneration directory's tower (CLIP with its class token, "
                                "a projector with biases) is written as an mlp mmproj")
    swapped = c.intermediate_size == c.hidden_size
    meta = {
        "general.architecture": "clip", "general.type": "mmproj", "general.name": name,
        "clip.projector_type": "mlp", "clip.has_vision_encoder": True, "clip.has_text_encoder": False,
        "clip.has_llava_projector": True, "clip.use_gelu": c.hidden_act == "gelu",
        **vit_keys(c, c.layers_run),
        "clip.vision.feature_layer": GGUFValue((VT.ARRAY, VT.INT32), [int(i) for i in c.feature_layers]),
        **(next_metadata(c) if c.grid_pinpoints else {}),
    }

    def values(canon: str) -> np.ndarray:
        t = layout.lookup(canon)
        if t is None:
            raise InvalidInputError(f"{name}: the tower's tensor {canon!r} is missing")
        return np.asarray(t.to_float32(), dtype=np.float32)
    names = canonical_names(c) + (["image_newline"] if c.grid_pinpoints else [])
    return meta, [(gguf_name(canon, swapped) or NEWLINE_NAME, type_of(canon, v, qtype), v)
                  for canon in names for v in (values(canon),)]


def is_llava(layout) -> bool:
    return getattr(layout.cfg, "projector", None) in ("llava", "llava_next")

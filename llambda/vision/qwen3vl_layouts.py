"""Where a Qwen3-VL vision tower's own parts live in each file shape (the parts it shares with Qwen2-VL's are
qwen2vl_layouts.py's): the canonical names are transformers' under `visual.` (`patch_embed.proj.{weight, bias}`,
`pos_embed.weight` [side * side, H], `blocks.N.{norm1, norm2, attn.qkv, attn.proj, mlp.linear_fc1,
mlp.linear_fc2}`, `merger.{norm, linear_fc1, linear_fc2}`, `deepstack_merger_list.J.{norm, linear_fc1,
linear_fc2}`).

- a Hugging Face directory: config.json model_type qwen3_vl (or qwen3_vl_moe: the same tower beside a MoE text
  model), vision_config's num_position_embeddings and deepstack_visual_indexes too;
- llama.cpp's mmproj GGUF (clip.projector_type `qwen3vl_merger`, what convert_hf_to_gguf.py --mmproj writes):
  `clip.vision.is_deepstack_layers` (a bool a block: level j's merger follows the j-th flagged block), the
  patch embedding's two temporal slices and `v.patch_embd.bias`, `v.position_embd.weight` (the grid's side
  from its rows), each block's qkv as one `attn_qkv`, the MLP as `ffn_up` / `ffn_down`, the merger as
  `v.post_ln`, `mm.0`, `mm.2`, DeepStack level j's as `v.deepstack.B.{norm, fc1, fc2}` with B its block's
  number (not j). The converter writes no pixel bounds: Qwen3-VL's processor's (min 65536, max 16777216
  pixels) where clip.vision.image_min_pixels / image_max_pixels are absent.
"""
from __future__ import annotations

import re

from ..errors import ModelFormatError
from .config import MAX_LAYERS

HF_TYPES = ("qwen3_vl", "qwen3_vl_moe")
POSITIONS = "pos_embed.weight"
PATCH_BIAS = "patch_embed.proj.bias"
MMPROJ_TYPE = "qwen3vl_merger"
DEEPSTACK_KEY = "clip.vision.is_deepstack_layers"
PIXEL_KEYS = {"min_pixels": "clip.vision.image_min_pixels", "max_pixels": "clip.vision.image_max_pixels"}
PROCESSOR = {"min_pixels": 65536, "max_pixels": 16777216}   # Qwen3-VL's preprocessor_config.json size
GLOBAL = {PATCH_BIAS: "v.patch_embd.bias", POSITIONS: "v.position_embd.weight",
          "merger.norm": "v.post_ln", "merger.linear_fc1": "mm.0", "merger.linear_fc2": "mm.2"}
_DEEPSTACK_RE = re.compile(r"deepstack_merger_list\.(\d{1,4})\.(norm|linear_fc1|linear_fc2)\.(weight|bias)")
_DEEPSTACK_LEAF = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}
HF_NAMES = {"num_position_embeddings": "config.json vision_config.num_position_embeddings",
            "deepstack_visual_indexes": "config.json vision_config.deepstack_visual_indexes (absent: transformers' "
                                        "default)"}
# transformers' Qwen3VLVisionConfig default where config.json names none (Qwen3-VL-8B's; models/qwen3vl.py's too)
DEFAULT_DEEPSTACK = (8, 16, 24)


def deepstack_names(level: int) -> tuple:
    """The norm, fc1 and fc2 of DeepStack level `level`'s merger."""
    return tuple(f"deepstack_merger_list.{level}.{leaf}" for leaf in ("norm", "linear_fc1", "linear_fc2"))


def hf_fields(vis: dict) -> dict:
    """The QwenVisionConfig fields of a Qwen3-VL vision_config (the shared ones are the caller's)."""
    return {"hidden_size": vis.get("hidden_size"), "intermediate_size": vis.get("intermediate_size"),
            "text_hidden_size": vis.get("out_hidden_size"), "hidden_act": vis.get("hidden_act", "gelu_pytorch_tanh"),
            "num_position_embeddings": vis.get("num_position_embeddings"),
            "deepstack_visual_indexes": vis.get("deepstack_visual_indexes", DEFAULT_DEEPSTACK)}


def gguf_name(canon: str, deepstack: tuple) -> str | None:
    """llama.cpp's mmproj name of a Qwen3-VL-only tensor (None: not one of them). `deepstack`: the blocks the
    levels follow."""
    base, _, kind = canon.rpartition(".")
    if canon in GLOBAL:
        return GLOBAL[canon]
    if base in GLOBAL:
        return f"{GLOBAL[base]}.{kind}"
    m = _DEEPSTACK_RE.fullmatch(canon)
    if m and int(m.group(1)) < len(deepstack):
        return f"v.deepstack.{deepstack[int(m.group(1))]}.{_DEEPSTACK_LEAF[m.group(2)]}.{m.group(3)}"
    return None


def mmproj_fields(meta: dict, tensors: dict, f: dict, source: str) -> dict:
    """`f` (the fields qwen2vl_layouts.mmproj_fields read) with a qwen3vl_merger mmproj's own: the DeepStack
    blocks, the position grid's size (its tensor's rows), the pixel bounds, llama.cpp's tanh GELU."""
    if meta.get("clip.use_gelu") is not True:
        raise ModelFormatError(f"{source}: a qwen3vl_merger mmproj's clip.use_gelu is not true (llama.cpp would not "
                               "run Qwen3-VL's GELU)")
    flags = meta.get(DEEPSTACK_KEY, [])
    flags = flags.tolist() if hasattr(flags, "tolist") else flags
    depth = f.get("num_hidden_layers")
    depth = depth if isinstance(depth, int) and not isinstance(depth, bool) and 0 < depth <= MAX_LAYERS else None
    if not isinstance(flags, list) or not all(isinstance(v, bool) for v in flags) \
            or (depth is not None and flags and len(flags) != depth):
        raise ModelFormatError(f"{source}: {DEEPSTACK_KEY} must be a bool for each of the {depth} blocks, got "
                               f"{str(flags)[:80]}")
    pos = tensors.get(GLOBAL[POSITIONS])
    if pos is None or len(pos.shape) != 2:
        raise ModelFormatError(f"{source}: a qwen3vl_merger mmproj needs {GLOBAL[POSITIONS]!r} [n, H]")
    for k, key in PIXEL_KEYS.items():        # ours (qwen2vl_layouts.MMPROJ_KEYS) first, then llama.cpp's
        v = f.get(k, meta.get(key, PROCESSOR[k]))
        f[k] = v.tolist() if hasattr(v, "tolist") else v
    f.update(projector="qwen3_vl", hidden_act="gelu_pytorch_tanh",
             deepstack_visual_indexes=[i for i, v in enumerate(flags) if v],
             num_position_embeddings=int(pos.shape[0]))
    return f

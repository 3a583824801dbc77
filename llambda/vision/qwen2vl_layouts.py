"""Where a Qwen2-VL / Qwen2.5-VL vision tower lives in each file shape, and what its hyper-parameters are called
there. The tower's canonical names are transformers' under `visual.` (`patch_embed.proj.weight` [H, C, T, P, P],
`blocks.N.{norm1, norm2, attn.qkv, attn.proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj}` (Qwen2-VL:
`mlp.fc1`, `mlp.fc2`, norms with biases), `merger.{ln_q, mlp.0, mlp.2}`).

- a Hugging Face directory (config.json model_type qwen2_5_vl or qwen2_vl, vision_config; the tensors under
  `visual.` or transformers 5's `model.visual.`; preprocessor_config.json's min/max pixels, mean, std);
- Ollama's qwen25vl model file (general.architecture `qwen25vl`, the tower inside): `qwen25vl.vision.*` keys
  (fullatt_block_indexes, window_size as HF's), tensors as llama.cpp's but `v.patch_embd_0.weight` /
  `v.patch_embd_1.weight` and the merger's `v.merger.{ln_q, mlp.0, mlp.2}`;
- llama.cpp's mmproj GGUF (clip.projector_type `qwen2.5vl_merger` or `qwen2vl_merger`): `clip.vision.*` keys,
  `clip.vision.n_wa_pattern` (every n-th block attends fully: fullatt_block_indexes n-1, 2n-1, ...),
  `clip.vision.window_size` (absent: 112, what llama.cpp assumes); tensors `v.patch_embd.weight` and
  `v.patch_embd.weight.1` (the Conv3d's two temporal slices), `v.blk.N.{ln1, ln2, attn_q, attn_k, attn_v,
  attn_out, ffn_gate, ffn_up, ffn_down}` (q, k, v split), `v.post_ln` (the merger's ln_q), `mm.0`, `mm.2`.

Qwen3-VL's own names and keys (its learned positions, DeepStack mergers, qwen3vl_merger mmproj) are
qwen3vl_layouts.py's; this module asks it where a Qwen3-VL tower differs.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError
from ..formats.quants import QType
from ..formats.weights import WeightTensor
from .config import MAX_LAYERS
from .layouts import rescale_normalize
from . import qwen3vl_layouts as qwen3

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # the processor's

HF_PREFIXES = ("visual.", "model.visual.")
# the tensors under `visual.` each family names differently: the MLP's (up, down, gate), the merger's (norm, fc1, fc2)
MLP_NAMES = {"qwen2_5_vl": ("mlp.up_proj", "mlp.down_proj", "mlp.gate_proj"), "qwen2_vl": ("mlp.fc1", "mlp.fc2", None),
             "qwen3_vl": ("mlp.linear_fc1", "mlp.linear_fc2", None)}
MERGER_NAMES = {"qwen2_5_vl": ("merger.ln_q", "merger.mlp.0", "merger.mlp.2"),
                "qwen2_vl": ("merger.ln_q", "merger.mlp.0", "merger.mlp.2"),
                "qwen3_vl": ("merger.norm", "merger.linear_fc1", "merger.linear_fc2")}
MMPROJ_TYPES = {"qwen2.5vl_merger": "qwen2_5_vl", "qwen2vl_merger": "qwen2_vl", qwen3.MMPROJ_TYPE: "qwen3_vl"}
HF_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen2_vl": "qwen2_vl"} | {k: "qwen3_vl" for k in qwen3.HF_TYPES}
MMPROJ_TYPE_OF = {v: k for k, v in MMPROJ_TYPES.items()}
LLAMA_CPP_WINDOW = 112                # llama.cpp's window (pixels) where the file does not say
QWEN25_PROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056}   # Qwen2.5-VL's preprocessor_config.json
_LEAF = {"norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down",
         "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}
_GLOBAL = {"merger.ln_q": "v.post_ln", "merger.mlp.0": "mm.0", "merger.mlp.2": "mm.2"}
OLLAMA_GLOBAL = {k: "v." + k for k in _GLOBAL}           # Ollama's converter: visual. -> v., merger kept
PATCH_SLICES = {"llama.cpp": ("v.patch_embd.weight", "v.patch_embd.weight.1"),
                "ollama": ("v.patch_embd_0.weight", "v.patch_embd_1.weight")}
OLLAMA_ARCH = "qwen25vl"
OLLAMA_KEYS = {"hidden_size": "qwen25vl.vision.embedding_length", "num_hidden_layers": "qwen25vl.vision.block_count",
               "num_attention_heads": "qwen25vl.vision.attention.head_count",
               "num_channels": "qwen25vl.vision.num_channels", "patch_size": "qwen25vl.vision.patch_size",
               "spatial_merge_size": "qwen25vl.vision.spatial_merge_size",
               "temporal_patch_size": "qwen25vl.vision.temporal_patch_size",
               "window_size": "qwen25vl.vision.window_size", "rope_theta": "qwen25vl.vision.rope.freq_base",
               "fullatt_block_indexes": "qwen25vl.vision.fullatt_block_indexes",
               "max_pixels": "qwen25vl.vision.max_pixels", "text_hidden_size": "qwen25vl.embedding_length"}
OLLAMA_MAX_PIXELS = 2 << 20          # Ollama's qwen25vl image processor, where vision.max_pixels is absent
_BLOCK_RE = re.compile(r"blocks\.(\d{1,4})\.(.+)\.(weight|bias)")
MMPROJ_KEYS = {"hidden_size": "clip.vision.embedding_length", "intermediate_size": "clip.vision.feed_forward_length",
               "num_hidden_layers": "clip.vision.block_count", "num_attention_heads": "clip.vision.attention.head_count",
               "patch_size": "clip.vision.patch_size", "text_hidden_size": "clip.vision.projection_dim",
               "image_mean": "clip.vision.image_mean", "image_std": "clip.vision.image_std",
               "spatial_merge_size": "clip.vision.spatial_merge_size", "window_size": "clip.vision.window_size",
               "min_pixels": "clip.vision.min_pixels", "max_pixels": "clip.vision.max_pixels"}
WA_PATTERN_KEY = "clip.vision.n_wa_pattern"
HF_NAMES = {"hidden_size": "config.json vision_config.hidden_size (Qwen2-VL: embed_dim)",
            "intermediate_size": "config.json vision_config.intermediate_size (Qwen2-VL: embed_dim x mlp_ratio)",
            "num_hidden_layers": "config.json vision_config.depth",
            "num_attention_heads": "config.json vision_config.num_heads",
            "text_hidden_size": "config.json vision_config.out_hidden_size (Qwen2-VL: hidden_size)",
            "min_pixels": "preprocessor_config.json min_pixels (size.shortest_edge)",
            "max_pixels": "preprocessor_config.json max_pixels (size.longest_edge)"} | {
    k: f"config.json vision_config.{k}" for k in ("patch_size", "spatial_merge_size", "temporal_patch_size",
                                                   "window_size", "fullatt_block_indexes", "hidden_act")} | qwen3.HF_NAMES


def hf_fields(cfg: dict, pre: dict | None, source: str) -> dict:
    """QwenVisionConfig fields of a Qwen2(.5)-VL / Qwen3-VL config.json and its preprocessor_config.json."""
    kind = HF_TYPES.get(cfg.get("model_type"))
    vis = cfg.get("vision_config")
    if not isinstance(vis, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config must be an object")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    f = {"projector": kind, "num_hidden_layers": vis.get("depth"), "num_attention_heads": vis.get("num_heads"),
         "patch_size": vis.get("patch_size", vis.get("spatial_patch_size", 14)),
         "spatial_merge_size": vis.get("spatial_merge_size", 2), "temporal_patch_size": vis.get("temporal_patch_size", 2),
         "num_channels": vis.get("in_channels", vis.get("in_chans", 3))}
    rope = vis.get("rope_parameters") if isinstance(vis.get("rope_parameters"), dict) else {}
    f["rope_theta"] = rope.get("rope_theta", 10000.0)
    if kind == "qwen2_5_vl":
        f.update(hidden_size=vis.get("hidden_size"), intermediate_size=vis.get("intermediate_size"),
                 text_hidden_size=vis.get("out_hidden_size"), window_size=vis.get("window_size", 112),
                 fullatt_block_indexes=vis.get("fullatt_block_indexes"), hidden_act=vis.get("hidden_act", "silu"))
    elif kind == "qwen3_vl":
        f.update(qwen3.hf_fields(vis))
    else:
        embed, ratio = vis.get("embed_dim", 1280), vis.get("mlp_ratio", 4)
        f.update(hidden_size=embed, text_hidden_size=vis.get("hidden_size"),
                 hidden_act=vis.get("hidden_act", "quick_gelu"),
                 intermediate_size=int(embed * ratio) if isinstance(embed, int) and not isinstance(embed, bool)
                 and isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio < 64 else None)
    width = text.get("hidden_size")
    if width != f["text_hidden_size"]:
        raise ModelFormatError(f"{source}: the vision merger's width {str(f['text_hidden_size'])[:20]} is not the text "
                               f"model's hidden_size {str(width)[:20]}")
    pre = checked_processor(pre, f, source)
    size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
    f["min_pixels"] = pre.get("min_pixels", size.get("shortest_edge", 56 * 56))
    f["max_pixels"] = pre.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))
    return rescale_normalize(pre, f, CLIP_MEAN, CLIP_STD)


def checked_processor(pre, f: dict, source: str) -> dict:
    """A Qwen-VL style preprocessor_config.json (None: {}): a bicubic resize, its patch, merge and temporal sizes
    the tower's (`f`'s fields), else a ModelFormatError."""
    pre = {} if pre is None else pre
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: preprocessor_config.json must hold a JSON object")
    if pre.get("do_resize", True) is not True or pre.get("resample", 3) != 3:
        raise ModelFormatError(f"{source}: preprocessor_config.json's resize (do_resize {pre.get('do_resize')!r}, "
                               f"resample {str(pre.get('resample'))[:20]}) is not supported (bicubic, 3, only)")
    for key, ours in (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                      ("temporal_patch_size", "temporal_patch_size")):
        if key in pre and pre[key] != f[ours]:
            raise ModelFormatError(f"{source}: preprocessor_config.json's {key} {str(pre[key])[:20]} is not the "
                                   f"tower's {str(f[ours])[:20]}")
    return pre


def hf_lookup(tensors: dict, source: str):
    pre = next((p for p in HF_PREFIXES if p + "patch_embed.proj.weight" in tensors), None)
    if pre is None:
        raise ModelFormatError(f"{source}: config.json describes a vision tower but the checkpoint holds no "
                               "visual.patch_embed.proj.weight")
    return lambda canon: tensors.get(pre + canon)


def gguf_name(canon: str, flavor: str = "llama.cpp", deepstack: tuple = ()) -> str | None:
    """llama.cpp's mmproj name (or Ollama's model file's) of a canonical tensor (not the two split ones: patch
    embed, qkv). `deepstack`: Qwen3-VL's blocks its DeepStack levels follow."""
    own = qwen3.gguf_name(canon, deepstack) if flavor == "llama.cpp" else None
    if own is not None:
        return own
    m = _BLOCK_RE.fullmatch(canon)
    if m:
        leaf = _LEAF.get(m.group(2))
        return f"v.blk.{int(m.group(1))}.{leaf}.{m.group(3)}" if leaf else None
    base, _, kind = canon.rpartition(".")
    names = _GLOBAL if flavor == "llama.cpp" else OLLAMA_GLOBAL
    return f"{names[base]}.{kind}" if base in names else None


def float_tensor(name: str, values: np.ndarray) -> WeightTensor:
    a = np.ascontiguousarray(values, dtype="<f4")
    return WeightTensor(name, QType.F32, tuple(a.shape), a.view(np.uint8).reshape(-1))


def gguf_tensor(infos: dict, name: str) -> WeightTensor | None:
    """A GGUF file's tensor `name` as a WeightTensor (None where absent)."""
    t = infos.get(name)
    return None if t is None else WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), t.data)


def mmproj_lookup(gguf_file, flavor: str = "llama.cpp", deepstack: tuple = ()):
    """Canonical names over llama.cpp's mmproj tensors (or Ollama's qwen25vl model file's: flavor "ollama"); the
    patch embedding's two slices and each block's q, k, v put together (float32) as transformers holds them
    (Qwen3-VL's one attn_qkv as it is). `deepstack`: as gguf_name's."""
    infos = gguf_file.tensors

    def get(name):
        return gguf_tensor(infos, name)

    def lookup(canon: str):
        if canon == "patch_embed.proj.weight":
            a, b = (get(n) for n in PATCH_SLICES[flavor])
            if a is None or b is None or a.shape != b.shape or len(a.shape) != 4:
                return None
            return float_tensor(canon, np.stack([a.to_float32().reshape(a.shape),
                                                 b.to_float32().reshape(b.shape)], axis=2))
        m = _BLOCK_RE.fullmatch(canon)
        if m and m.group(2) == "attn.qkv" and f"v.blk.{int(m.group(1))}.attn_qkv.{m.group(3)}" in infos:
            return get(f"v.blk.{int(m.group(1))}.attn_qkv.{m.group(3)}")
        if m and m.group(2) == "attn.qkv":
            parts = [get(f"v.blk.{int(m.group(1))}.attn_{x}.{m.group(3)}") for x in "qkv"]
            if any(p is None for p in parts) or len({p.shape for p in parts}) != 1:
                return None
            return float_tensor(canon, np.concatenate([p.to_float32().reshape(p.shape) for p in parts]))
        name = gguf_name(canon, flavor, deepstack)
        return get(name) if name else None
    return lookup


def ollama_fields(meta: dict, lookup, source: str) -> dict:
    """QwenVisionConfig fields of Ollama's qwen25vl model file (the tower inside): its `qwen25vl.vision.*` keys;
    the MLP's width from ffn_gate's shape (not written); Ollama's own pixel bound (2 << 20) where the file has
    none; CLIP's mean and std (Ollama's)."""
    f = {k: (meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key])
         for k, key in OLLAMA_KEYS.items() if key in meta}
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "text_hidden_size"):
        if k not in f:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {OLLAMA_KEYS[k]!r}")
    gate = lookup("blocks.0.mlp.gate_proj.weight")
    f.update(projector="qwen2_5_vl", min_pixels=56 * 56,
             intermediate_size=int(gate.shape[0]) if gate is not None and len(gate.shape) == 2 else None)
    f.setdefault("max_pixels", OLLAMA_MAX_PIXELS)
    f.setdefault("window_size", LLAMA_CPP_WINDOW)
    f.setdefault("fullatt_block_indexes", [7, 15, 23, 31])
    return f


def mmproj_fields(meta: dict, source: str, tensors: dict | None = None) -> dict:
    """QwenVisionConfig fields of llama.cpp's mmproj (`tensors`: its tensors, Qwen3-VL's position grid read
    there)."""
    proj = MMPROJ_TYPES[meta.get("clip.projector_type")]
    if meta.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{source}: mmproj file says it has no vision encoder (clip.has_vision_encoder)")
    f = {k: (meta[key].tolist() if hasattr(meta[key], "tolist") else meta[key])
         for k, key in MMPROJ_KEYS.items() if key in meta}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size",
              "text_hidden_size"):
        if k not in f:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {MMPROJ_KEYS[k]!r}")
    f["projector"] = proj
    if proj == "qwen3_vl":
        return qwen3.mmproj_fields(meta, tensors or {}, f, source)
    f.setdefault("min_pixels", QWEN25_PROCESSOR["min_pixels"])
    f.setdefault("max_pixels", QWEN25_PROCESSOR["max_pixels"])
    if proj == "qwen2_5_vl":
        if meta.get("clip.use_silu") is not True:
            raise ModelFormatError(f"{source}: a qwen2.5vl_merger mmproj's clip.use_silu is not true")
        n = meta.get(WA_PATTERN_KEY)
        n = n.tolist() if hasattr(n, "tolist") else n
        depth = f["num_hidden_layers"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1 << 16:
            raise ModelFormatError(f"{source}: {WA_PATTERN_KEY} must be a positive integer, got {str(n)[:40]}")
        # a depth past MAX_LAYERS is from_fields' error (range(1 << 40) here had run for hours)
        depth = depth if isinstance(depth, int) and not isinstance(depth, bool) and 0 < depth <= MAX_LAYERS else 0
        f["fullatt_block_indexes"] = [i for i in range(depth) if (i + 1) % n == 0]
        f.setdefault("window_size", LLAMA_CPP_WINDOW)
    elif meta.get("clip.use_gelu") is True or meta.get("clip.use_silu") is True:
        raise ModelFormatError(f"{source}: a qwen2vl_merger mmproj with clip.use_gelu or clip.use_silu: llama.cpp "
                               "would not run Qwen2-VL's quick GELU")
    return f

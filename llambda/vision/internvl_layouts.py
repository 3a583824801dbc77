"""Where an InternVL 3 / 3.5 vision tower lives in each file shape, and what its hyper-parameters are called there.
The canonical names are transformers' (InternVLForConditionalGeneration): under the tower `embeddings.{cls_token,
position_embeddings, patch_embeddings.projection}`, `encoder.layer.N.{layernorm_before, layernorm_after,
attention.{q_proj, k_proj, v_proj, q_norm, k_norm, projection_layer}, mlp.fc1, mlp.fc2, lambda_1, lambda_2}`,
`layernorm`; the projector's `multi_modal_projector.{layer_norm, linear_1, linear_2}`.

- a Hugging Face directory (config.json model_type internvl, vision_config internvl_vision, text_config qwen2 /
  qwen3): the tower under `vision_tower.` (transformers 5's saves) or `model.vision_tower.`, the projector under
  `multi_modal_projector.` or `model.multi_modal_projector.`; the image processor's settings in
  preprocessor_config.json (size, min_patches, max_patches, resample, mean, std), image_seq_length in config.json
  or processor_config.json.
- llama.cpp's mmproj GGUF (clip.projector_type `internvl`): internvl_mmproj.py.
- OpenGVLab's remote-code directory (model_type `internvl_chat`, InternVLChatModel): vision_config in
  InternVisionModel's names (qkv_bias, qk_normalization), llm_config, the tiling settings in config.json
  (min/max_dynamic_patch, force_image_size, use_thumbnail, ps_version v2), tensors `vision_model.embeddings.
  {class_embedding, position_embedding, patch_embedding}`, `vision_model.encoder.layers.N.{norm1, attn.qkv,
  attn.q_norm, attn.k_norm, attn.proj, ls1, norm2, mlp.fc1, mlp.fc2, ls2}`, `mlp1.{0, 1, 3}`; the same math.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError
from .internvl_config import CLIP_MEAN, CLIP_STD
from .layouts import rescale_normalize

HF_TYPES = ("internvl",)
VISION_DEFAULTS = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
                   "attention_bias": False, "use_qk_norm": False, "hidden_act": "gelu", "norm_type": "layer_norm",
                   "layer_norm_eps": 1e-6, "image_size": 448, "patch_size": 14, "num_channels": 3,
                   "use_mean_pooling": True, "use_absolute_position_embeddings": True}   # InternVLVisionConfig's
TOP_KEYS = ("downsample_ratio", "projector_hidden_act", "vision_feature_layer", "vision_feature_select_strategy",
            "image_seq_length")
TOWER_PREFIXES = ("vision_tower.", "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")
HF_NAMES = ({k: f"config.json vision_config.{k}" for k in VISION_DEFAULTS}
            | {k: f"config.json {k}" for k in TOP_KEYS}
            | {"text_hidden_size": "config.json text_config.hidden_size",
               "tile_size": "preprocessor_config.json size", "min_patches": "preprocessor_config.json min_patches",
               "max_patches": "preprocessor_config.json max_patches", "resample": "preprocessor_config.json resample",
               "image_mean": "preprocessor_config.json image_mean", "image_std": "preprocessor_config.json image_std",
               "rescale_factor": "preprocessor_config.json rescale_factor"})


def _side(v, what: str, source: str):
    """image_size / patch_size: one number or [h, w] with h == w."""
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise ModelFormatError(f"{source}: {what} {str(v)[:40]} is not square (one side for both)")
        return v[0]
    return v


def hf_fields(cfg: dict, pre: dict | None, seq_len, source: str) -> dict:
    """InternVLConfig fields of an InternVLForConditionalGeneration config.json and its image processor's settings."""
    vis, text = cfg.get("vision_config"), cfg.get("text_config")
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    fields = {**VISION_DEFAULTS, **{k: vis[k] for k in VISION_DEFAULTS if k in vis}}
    fields["image_size"] = _side(fields["image_size"], "vision_config.image_size", source)
    fields["patch_size"] = _side(fields["patch_size"], "vision_config.patch_size", source)
    fields.update({k: cfg[k] for k in TOP_KEYS if k in cfg})
    if seq_len is not None:
        fields.setdefault("image_seq_length", seq_len)
    fields["text_hidden_size"] = text.get("hidden_size")
    pre = {} if pre is None else pre
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: the image processor's settings must be a JSON object")
    if pre.get("do_resize", True) is not True:
        raise ModelFormatError(f"{source}: preprocessor_config.json's do_resize is not true, which is not supported")
    size = pre.get("size")
    if size is not None:
        if not isinstance(size, dict) or size.get("height") != size.get("width") or "height" not in size:
            raise ModelFormatError(f"{source}: preprocessor_config.json's size {str(size)[:80]} is not a square "
                                   "{height, width}")
        fields["tile_size"] = size["height"]
    for k in ("min_patches", "max_patches", "resample"):
        if k in pre:
            fields[k] = pre[k]
    return rescale_normalize(pre, fields, CLIP_MEAN, CLIP_STD)


def processor_seq_len(path, read_json):
    """processor_config.json's image_seq_length (InternVLProcessor's), None where absent."""
    p = path / "processor_config.json"
    if not p.exists():
        return None
    d = read_json(p, "processor_config.json")
    return d.get("image_seq_length") if isinstance(d, dict) else None


def hf_lookup(tensors: dict, source: str):
    tower = next((p for p in TOWER_PREFIXES if p + "embeddings.cls_token" in tensors), None)
    proj = next((p for p in PROJECTOR_PREFIXES if p + "linear_1.weight" in tensors), None)
    if tower is None or proj is None:
        missing = "vision_tower.embeddings.cls_token" if tower is None else "multi_modal_projector.linear_1.weight"
        raise ModelFormatError(f"{source}: config.json describes an InternVL vision tower but the checkpoint holds "
                               f"no {missing}")

    def lookup(canon: str):
        if canon.startswith("multi_modal_projector."):
            return tensors.get(proj + canon[len("multi_modal_projector."):])
        return tensors.get(tower + canon)
    return lookup


# ---------------------------------------------------------------- OpenGVLab's remote-code directories

CHAT_TYPES = ("internvl_chat",)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)   # hard-coded in OpenGVLab's load_image
CHAT_VISION_KEYS = {"hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
                    "num_hidden_layers": "num_hidden_layers", "num_attention_heads": "num_attention_heads",
                    "image_size": "image_size", "patch_size": "patch_size", "layer_norm_eps": "layer_norm_eps",
                    "norm_type": "norm_type", "hidden_act": "hidden_act", "num_channels": "num_channels",
                    "use_qk_norm": "qk_normalization", "attention_bias": "qkv_bias"}
CHAT_NAMES = ({k: f"config.json vision_config.{v}" for k, v in CHAT_VISION_KEYS.items()}
              | {"downsample_ratio": "config.json downsample_ratio", "vision_feature_layer": "config.json select_layer",
                 "tile_size": "config.json force_image_size", "min_patches": "config.json min_dynamic_patch",
                 "max_patches": "config.json max_dynamic_patch", "text_hidden_size": "config.json llm_config.hidden_size"})
# canonical (transformers') leaves -> OpenGVLab's, under vision_model.encoder.layers.N. (q/k/v: slices of attn.qkv)
_CHAT_LEAF = {"layernorm_before": "norm1", "layernorm_after": "norm2", "attention.q_norm": "attn.q_norm",
              "attention.k_norm": "attn.k_norm", "attention.projection_layer": "attn.proj", "mlp.fc1": "mlp.fc1",
              "mlp.fc2": "mlp.fc2", "lambda_1": "ls1", "lambda_2": "ls2"}
_CHAT_GLOBAL = {"embeddings.cls_token": "vision_model.embeddings.class_embedding",
                "embeddings.position_embeddings": "vision_model.embeddings.position_embedding",
                "embeddings.patch_embeddings.projection.weight": "vision_model.embeddings.patch_embedding.weight",
                "embeddings.patch_embeddings.projection.bias": "vision_model.embeddings.patch_embedding.bias",
                "multi_modal_projector.layer_norm.weight": "mlp1.0.weight",
                "multi_modal_projector.layer_norm.bias": "mlp1.0.bias",
                "multi_modal_projector.linear_1.weight": "mlp1.1.weight", "multi_modal_projector.linear_1.bias": "mlp1.1.bias",
                "multi_modal_projector.linear_2.weight": "mlp1.3.weight", "multi_modal_projector.linear_2.bias": "mlp1.3.bias"}
_CHAT_BLOCK_RE = re.compile(r"encoder\.layer\.(\d{1,4})\.(.+)")


def chat_fields(cfg: dict, source: str) -> dict:
    """InternVLConfig fields of an OpenGVLab InternVLChatModel config.json (model_type internvl_chat): its
    vision_config (InternVisionModel's names), llm_config, and the tiling its own load_image does (ImageNet's mean
    and std, BICUBIC, min/max_dynamic_patch, a thumbnail)."""
    vis, llm = cfg.get("vision_config"), cfg.get("llm_config")
    if not isinstance(vis, dict) or not isinstance(llm, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and llm_config must be objects")
    fields = {k: vis[v] for k, v in CHAT_VISION_KEYS.items() if v in vis}
    fields.setdefault("attention_bias", True)           # InternVisionConfig's qkv_bias default
    for k in ("image_size", "patch_size"):
        fields[k] = _side(fields.get(k), f"vision_config.{k}", source)
    fields.update(downsample_ratio=cfg.get("downsample_ratio", 0.5), vision_feature_layer=cfg.get("select_layer", -1),
                  text_hidden_size=llm.get("hidden_size"), image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD,
                  resample=3, min_patches=cfg.get("min_dynamic_patch", 1), max_patches=cfg.get("max_dynamic_patch", 12))
    if cfg.get("force_image_size") is not None:
        fields["tile_size"] = cfg["force_image_size"]
    if cfg.get("ps_version", "v2") != "v2":
        raise ModelFormatError(f"{source}: config.json ps_version {str(cfg.get('ps_version'))[:20]!r} is not supported "
                               "(v2 only: v1's pixel shuffle leaves the grid transposed)")
    if cfg.get("use_thumbnail", True) is not True:
        raise ModelFormatError(f"{source}: config.json use_thumbnail is not true, which is not supported")
    if cfg.get("dynamic_image_size", True) is False:
        fields.update(min_patches=1, max_patches=1)     # one tile, the image resized to it
    if fields.get("use_qk_norm") and fields.get("layer_norm_eps", 1e-6) != 1e-6:
        raise ModelFormatError(f"{source}: q/k norms with vision_config.layer_norm_eps "
                               f"{str(fields.get('layer_norm_eps'))[:20]} (OpenGVLab's q/k norms take it, "
                               "transformers' and ours 1e-6)")
    return fields


def chat_lookup(tensors: dict, source: str):
    """Canonical names over OpenGVLab's tensor names; q, k, v are row slices of attn.qkv (float32)."""
    from .qwen2vl_layouts import float_tensor
    if "vision_model.embeddings.class_embedding" not in tensors or "mlp1.1.weight" not in tensors:
        raise ModelFormatError(f"{source}: config.json describes an InternVL chat model but the checkpoint holds no "
                               "vision_model.embeddings.class_embedding or mlp1.1.weight")

    def lookup(canon: str):
        if canon in _CHAT_GLOBAL:
            return tensors.get(_CHAT_GLOBAL[canon])
        m = _CHAT_BLOCK_RE.fullmatch(canon)
        if not m:
            return None
        pre, rest = f"vision_model.encoder.layers.{int(m.group(1))}.", m.group(2)
        if rest.startswith("attention.") and rest[len("attention."):][:2] in ("q_", "k_", "v_") and "proj" in rest:
            which, kind = rest[len("attention.")], rest.rpartition(".")[2]
            t = tensors.get(pre + "attn.qkv." + kind)
            if t is None or not t.shape or t.shape[0] % 3:
                return t
            part = np.split(np.asarray(t.to_float32(), np.float32).reshape(t.shape), 3)["qkv".index(which)]
            return float_tensor(canon, part)
        leaf, dot, kind = rest.rpartition(".")
        if rest in _CHAT_LEAF:                      # the layer scales: no .weight
            return tensors.get(pre + _CHAT_LEAF[rest])
        return tensors.get(pre + _CHAT_LEAF[leaf] + dot + kind) if leaf in _CHAT_LEAF else None
    return lookup

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
"""
from __future__ import annotations

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

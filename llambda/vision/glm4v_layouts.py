"""Where a GLM-4.1V / GLM-4.6V vision tower lives in a Hugging Face directory and what its settings are called
there: config.json (model_type glm4v) vision_config (Glm4vVisionConfig: depth, num_heads, hidden_size,
out_hidden_size, intermediate_size, image_size, patch_size, rms_norm_eps, attention_bias, rope_parameters'
rope_theta), preprocessor_config.json (Glm4vImageProcessor: size.shortest_edge / longest_edge = min / max pixels,
patch_size, merge_size, temporal_patch_size, mean, std); the tensors under `model.visual.` (transformers 5) or
`visual.` (the released checkpoints)."""
from __future__ import annotations

from ..errors import ModelFormatError
from .glm4v_config import PROCESSOR
from .layouts import rescale_normalize
from .qwen2vl_layouts import CLIP_MEAN, CLIP_STD, checked_processor, hf_lookup  # noqa: F401  (load.py's)

HF_TYPES = ("glm4v",)
HF_NAMES = {"num_hidden_layers": "config.json vision_config.depth",
            "num_attention_heads": "config.json vision_config.num_heads",
            "text_hidden_size": "config.json vision_config.out_hidden_size",
            "rope_theta": "config.json vision_config.rope_parameters.rope_theta",
            "min_pixels": "preprocessor_config.json size.shortest_edge (min_pixels)",
            "max_pixels": "preprocessor_config.json size.longest_edge (max_pixels)"} | {
    k: f"config.json vision_config.{k}" for k in ("hidden_size", "intermediate_size", "patch_size", "image_size",
                                                   "spatial_merge_size", "temporal_patch_size", "rms_norm_eps",
                                                   "attention_bias", "hidden_act")} | {
    k: f"preprocessor_config.json {k}" for k in ("image_mean", "image_std", "rescale_factor")}


def hf_fields(cfg: dict, pre: dict | None, source: str) -> dict:
    """Glm4vVisionConfig fields of a glm4v config.json and its preprocessor_config.json."""
    vis = cfg.get("vision_config")
    if not isinstance(vis, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config must be an object")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = vis.get("rope_parameters") if isinstance(vis.get("rope_parameters"), dict) else {}
    f = {"hidden_size": vis.get("hidden_size", 1536), "intermediate_size": vis.get("intermediate_size", 13696),
         "num_hidden_layers": vis.get("depth", 24), "num_attention_heads": vis.get("num_heads", 12),
         "patch_size": vis.get("patch_size", 14), "image_size": vis.get("image_size", 336),
         "text_hidden_size": vis.get("out_hidden_size", 4096), "spatial_merge_size": vis.get("spatial_merge_size", 2),
         "temporal_patch_size": vis.get("temporal_patch_size", 2), "num_channels": vis.get("in_channels", 3),
         "rms_norm_eps": vis.get("rms_norm_eps", 1e-5), "attention_bias": vis.get("attention_bias", False),
         "hidden_act": vis.get("hidden_act", "silu"), "rope_theta": rope.get("rope_theta", 10000.0)}
    width = text.get("hidden_size")
    if width != f["text_hidden_size"]:
        raise ModelFormatError(f"{source}: the vision merger's width (vision_config.out_hidden_size "
                               f"{str(f['text_hidden_size'])[:20]}) is not the text model's hidden_size "
                               f"{str(width)[:20]}")
    pre = checked_processor(pre, f, source)
    size = pre.get("size") if isinstance(pre.get("size"), dict) else {}
    f["min_pixels"] = size.get("shortest_edge", pre.get("min_pixels", PROCESSOR["min_pixels"]))
    f["max_pixels"] = size.get("longest_edge", pre.get("max_pixels", PROCESSOR["max_pixels"]))
    return rescale_normalize(pre, f, CLIP_MEAN, CLIP_STD)


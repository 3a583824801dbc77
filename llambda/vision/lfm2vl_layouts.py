"""Where an LFM2-VL tower lives in a Hugging Face directory of Lfm2VlForConditionalGeneration, and what its
hyper-parameters are called there: config.json (model_type lfm2_vl: vision_config, a Siglip2VisionConfig;
downsample_factor, projector_*, vision_feature_layer; text_config.hidden_size), the image processor's settings
(preprocessor_config.json, or processor_config.json's image_processor), the tower under `model.vision_tower.`
(transformers 4's `model.vision_tower.vision_model.`, or either without `model.`), the projector under
`model.multi_modal_projector.` (layer_norm, linear_1, linear_2). llama.cpp's mmproj of it: lfm2vl_mmproj.py."""
from __future__ import annotations

from ..errors import ModelFormatError
from .layouts import image_processor_settings, rescale_normalize
from .lfm2vl_config import Lfm2VlVisionConfig

HF_TYPES = ("lfm2_vl", "lfm2-vl")      # transformers' name; LiquidAI's first release (remote code)
SIGLIP2_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "num_channels": 3, "patch_size": 16, "num_patches": 256, "layer_norm_eps": 1e-6,
                    "hidden_act": "gelu_pytorch_tanh"}          # transformers' Siglip2VisionConfig defaults
MODEL_DEFAULTS = {"downsample_factor": 2, "projector_hidden_size": 2560, "projector_hidden_act": "gelu",
                  "projector_bias": True, "projector_use_layernorm": True, "vision_feature_layer": -1}   # Lfm2VlConfig
PROCESSOR_DEFAULTS = {"min_image_tokens": 64, "max_image_tokens": 256, "tile_size": 512, "min_tiles": 2,
                      "max_tiles": 10, "use_thumbnail": True, "do_image_splitting": True, "max_pixels_tolerance": 2.0,
                      "encoder_patch_size": 16}                  # Lfm2VlImageProcessor's class defaults
TOWER_PREFIXES = ("model.vision_tower.vision_model.", "model.vision_tower.", "vision_tower.vision_model.",
                  "vision_tower.")
PROJECTOR_PREFIXES = ("model.", "")
HF_NAMES = ({k: f"config.json vision_config.{k}" for k in SIGLIP2_DEFAULTS}
            | {k: f"config.json {k}" for k in MODEL_DEFAULTS}
            | {k: f"the image processor's {k}" for k in PROCESSOR_DEFAULTS}
            | {"text_hidden_size": "config.json text_config.hidden_size",
               "processor_downsample_factor": "the image processor's downsample_factor",
               "image_mean": "the image processor's image_mean", "image_std": "the image processor's image_std",
               "rescale_factor": "the image processor's rescale_factor"})


def hf_fields(cfg: dict, pre, source: str) -> dict:
    vis, text = cfg.get("vision_config"), cfg.get("text_config")
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    fields = {**SIGLIP2_DEFAULTS, **{k: vis[k] for k in SIGLIP2_DEFAULTS if k in vis}}
    fields.update({k: cfg.get(k, v) for k, v in MODEL_DEFAULTS.items()})
    fields["text_hidden_size"] = text.get("hidden_size")
    pre = {} if pre is None else pre
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: the image processor's settings must be a JSON object")
    fields.update({k: pre.get(k, v) for k, v in PROCESSOR_DEFAULTS.items()})
    fields["processor_downsample_factor"] = pre.get("downsample_factor", fields["downsample_factor"])
    if pre.get("resample", 2) != 2:
        raise ModelFormatError(f"{source}: the image processor's resample {str(pre.get('resample'))[:40]} is not "
                               "supported (2, bilinear, only)")
    if pre.get("do_resize", True) is not True:
        raise ModelFormatError(f"{source}: the image processor's do_resize is not true, which is not supported")
    return rescale_normalize(pre, fields)


def hf_lookup(tensors: dict, source: str):
    tower = next((p for p in TOWER_PREFIXES if p + "embeddings.patch_embedding.weight" in tensors), None)
    proj = next((p for p in PROJECTOR_PREFIXES if p + "multi_modal_projector.linear_1.weight" in tensors), None)
    if tower is None or proj is None:
        missing = ("vision tower (...vision_tower.embeddings.patch_embedding.weight)" if tower is None
                   else "model.multi_modal_projector.linear_1.weight")
        raise ModelFormatError(f"{source}: config.json describes a vision tower but the checkpoint holds no {missing}")

    def lookup(canon: str):
        return tensors.get((proj if canon.startswith("multi_modal_projector.") else tower) + canon)
    return lookup


def first_release_settings(path, pre, read_json):
    """LiquidAI's first LFM2-VL release (remote code, model_type 'lfm2-vl') keeps the LFM2-VL settings flat in
    processor_config.json and SigLIP2's processor in preprocessor_config.json (do_resize false: the remote
    processor resized and tiled before calling it); the two merged read as transformers' Lfm2VlImageProcessor.
    Anything else: `pre` unchanged."""
    both = path / "processor_config.json"
    flat = read_json(both, "processor_config.json") if both.exists() else None
    if not isinstance(flat, dict) or "image_processor" in flat or "min_image_tokens" not in flat:
        return pre
    merged = dict(pre) if isinstance(pre, dict) else {}
    merged.update({k: flat[k] for k in (*PROCESSOR_DEFAULTS, "downsample_factor") if k in flat})
    merged["do_resize"] = True
    return merged


def hf_config(path, cfg: dict, src: str, read_json) -> Lfm2VlVisionConfig:
    """The tower's config from a HF directory's config.json and processor settings (its tensors: hf_lookup)."""
    pre, _ = image_processor_settings(path, read_json)
    pre = first_release_settings(path, pre, read_json)
    return Lfm2VlVisionConfig.from_fields(hf_fields(cfg, pre, src), HF_NAMES, src)

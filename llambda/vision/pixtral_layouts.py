"""Where a Pixtral tower and Mistral 3's projector live in a Hugging Face directory, and what their
hyper-parameters are called there (PixtralConfig's fields from config.json, preprocessor_config.json and
processor_config.json). The tensors' canonical names are transformers': `vision_tower.{patch_conv, ln_pre,
transformer.layers.N.{attention_norm, attention.{q,k,v,o}_proj, ffn_norm, feed_forward.{gate,up,down}_proj}}`,
`multi_modal_projector.{norm, patch_merger.merging_layer, linear_1, linear_2}`, saved under those names or
transformers 5's `model.` before them.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError
from .layouts import image_processor_settings, rescale_normalize

HF_TYPES = ("mistral3",)
LLAVA = "llava"         # Pixtral-12B's: LlavaForConditionalGeneration with a pixtral vision_config
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
HF_PREFIXES = ("", "model.")
PATCH_CONV = "vision_tower.patch_conv.weight"
# PixtralVisionConfig's defaults where vision_config leaves a key out
VISION_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
                   "patch_size": 16, "num_channels": 3, "hidden_act": "gelu"}
HF_NAMES = {k: f"config.json vision_config.{k}" for k in VISION_DEFAULTS} | {"merger": "config.json model_type",
    "head_dim": "config.json vision_config.head_dim", "rope_theta": "config.json vision_config.rope_theta",
    "spatial_merge_size": "config.json spatial_merge_size", "feature_layer": "config.json vision_feature_layer",
    "projector_hidden_act": "config.json projector_hidden_act",
    "projector_bias": "config.json multimodal_projector_bias",
    "text_hidden_size": "config.json text_config.hidden_size", "projector_eps": "config.json text_config.rms_norm_eps",
    "longest_edge": "preprocessor_config.json size.longest_edge", "image_mean": "preprocessor_config.json image_mean",
    "image_std": "preprocessor_config.json image_std", "rescale_factor": "preprocessor_config.json rescale_factor"}


def reads(cfg: dict) -> bool:
    """Whether config.json is a Pixtral tower's: Mistral 3's, or a LLaVA one whose vision_config is pixtral
    (Pixtral-12B)."""
    vis = cfg.get("vision_config")
    return cfg.get("model_type") in HF_TYPES or (cfg.get("model_type") == LLAVA and isinstance(vis, dict)
                                                 and vis.get("model_type") == "pixtral")


def hf_fields(cfg: dict, pre: dict | None, proc: dict | None, source: str) -> dict:
    """PixtralConfig fields of a Mistral 3 (or Pixtral-12B's LLaVA) config.json, its preprocessor_config.json
    (`pre`) and its processor_config.json (`proc`: the processor's patch_size and spatial_merge_size, checked against
    the tower's). LLaVA's: no merger, LlavaConfig's defaults (vision_feature_layer -2, projector biases), and
    vision_feature_select_strategy must be full (default drops the first patch, a CLS token Pixtral has not)."""
    vis, text = cfg.get("vision_config"), cfg.get("text_config")
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    if vis.get("model_type", "pixtral") != "pixtral":
        raise ModelFormatError(f"{source}: config.json vision_config.model_type {str(vis.get('model_type'))[:40]!r} is "
                               "not pixtral")
    f = {k: vis.get(k, v) for k, v in VISION_DEFAULTS.items()}
    if "head_dim" in vis:
        f["head_dim"] = vis["head_dim"]
    rope = vis.get("rope_parameters") if isinstance(vis.get("rope_parameters"), dict) else {}
    f["rope_theta"] = rope.get("rope_theta", vis.get("rope_theta", 10000.0))
    llava = cfg.get("model_type") == LLAVA
    f.update(spatial_merge_size=1 if llava else cfg.get("spatial_merge_size", 2), merger=not llava,
             feature_layer=cfg.get("vision_feature_layer", -2 if llava else -1),
             projector_hidden_act=cfg.get("projector_hidden_act", "gelu"),
             projector_bias=cfg.get("multimodal_projector_bias", llava), text_hidden_size=text.get("hidden_size"),
             projector_eps=text.get("rms_norm_eps", 1e-6))
    if llava and cfg.get("vision_feature_select_strategy", "default") != "full":
        raise ModelFormatError(f"{source}: config.json vision_feature_select_strategy "
                               f"{str(cfg.get('vision_feature_select_strategy', 'default'))[:20]!r}: a Pixtral tower "
                               "has no CLS token to drop (Pixtral-12B's is full)")
    if pre is None:
        pre = {}
    elif not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: preprocessor_config.json must hold a JSON object")
    if pre.get("resample", 3) != 3 or pre.get("do_resize", True) is not True:
        raise ModelFormatError(f"{source}: preprocessor_config.json's resize (do_resize "
                               f"{str(pre.get('do_resize'))[:20]}, "
                               f"resample {str(pre.get('resample'))[:20]}) is not supported (bicubic, 3, only)")
    size = pre.get("size", {"longest_edge": 1024})
    if not isinstance(size, dict) or "longest_edge" not in size:
        raise ModelFormatError(f"{source}: preprocessor_config.json's size {str(size)[:60]} has no longest_edge")
    f["longest_edge"] = size["longest_edge"]
    if proc is not None:
        if not isinstance(proc, dict):
            raise ModelFormatError(f"{source}: processor_config.json must hold a JSON object")
        for key in ("patch_size", "spatial_merge_size"):
            if key in proc and proc[key] != f[key]:
                raise ModelFormatError(f"{source}: processor_config.json's {key} {str(proc[key])[:20]} is not the "
                                       f"model's {str(f[key])[:20]}")
    return rescale_normalize(pre, f, CLIP_MEAN, CLIP_STD)


def hf_lookup(tensors: dict, source: str):
    """Canonical names over the checkpoint's tensors (either prefix)."""
    for pre in HF_PREFIXES:
        if pre + PATCH_CONV in tensors:
            return lambda canon: tensors.get(pre + canon)
    raise ModelFormatError(f"{source}: config.json describes a Pixtral tower but the checkpoint holds no {PATCH_CONV}")


def hf_config(path: Path, cfg: dict, source: str):
    """The tower's PixtralConfig of a Mistral 3 directory (config.json already read as `cfg`; its tensors:
    hf_lookup)."""
    from ..formats.files import read_json
    from .pixtral_config import PixtralConfig
    pre, _ = image_processor_settings(path, read_json)
    proc_path = path / "processor_config.json"
    proc = read_json(proc_path, "processor_config.json") if proc_path.exists() else None
    return PixtralConfig.from_fields(hf_fields(cfg, pre, proc, source), HF_NAMES, source)

"""Where a LLaVA 1.5 tower lives in each file shape, and what its hyper-parameters are called there.

- a Hugging Face directory of LlavaForConditionalGeneration (model_type llava, vision_config of model_type
  clip_vision_model; CLIPVisionConfig's defaults where a key is absent, LlavaConfig's default tower where
  vision_config is): config.json (vision_feature_layer, vision_feature_select_strategy, projector_hidden_act,
  multimodal_projector_bias, text_config.hidden_size), the image processor's preprocessor_config.json (or
  processor_config.json's image_processor), the tower under `vision_tower.vision_model.`, `vision_tower.` or
  either under `model.`, the projector `multi_modal_projector.linear_{1,2}` (or under `model.`);
- llama.cpp's mmproj GGUF (clip.projector_type `mlp`, clip.has_llava_projector): the `clip.vision.*` keys,
  `clip.vision.feature_layer` (non-negative hidden-state indices; absent: every stored block's output, the
  legacy converter having dropped the last block), `clip.use_gelu` (the
  tower's exact GELU; else quick GELU); tensors `v.class_embd`, `v.patch_embd.weight` (a `v.patch_embd.bias` if
  any), `v.position_embd.weight`, `v.pre_ln`, `v.blk.N.{ln1, attn_q, attn_k, attn_v, attn_out, ln2, ffn_up,
  ffn_down}`, `v.post_ln` if any, `mm.0`, `mm.2`. Old converters named fc1 `ffn_down` and fc2 `ffn_up`: as
  llama.cpp, the two are swapped back where `ffn_down` takes the tower's width. llama.cpp always drops the class
  row ("default") and preprocesses by its own letterbox (llava.py). The text width is mm.2's rows (the
  converter's clip.vision.projection_dim is CLIP's own projection, not the text model's width). With
  clip.vision.image_grid_pinpoints it is LLaVA-NeXT's (llava_next_mmproj.py: the pinpoints, the merge type, the
  newline; llava_next_cpp.py: llama.cpp's tiles).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .layouts import PROJECTOR_PREFIXES, TOWER_PREFIXES, _scalar, gguf_lookup, rescale_normalize
from .llava_next_mmproj import newline_lookup, next_fields
from .qwen2vl_layouts import CLIP_MEAN, CLIP_STD

HF_TYPES = ("llava", "llava_next")
MMPROJ_TYPE = "mlp"
# CLIPVisionConfig's defaults, and LlavaConfig's tower where vision_config is absent
CLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "num_channels": 3, "image_size": 224, "patch_size": 32, "layer_norm_eps": 1e-5,
                 "hidden_act": "quick_gelu"}
LLAVA_TOWER = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
               "image_size": 336, "patch_size": 14}
NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]     # LlavaNextConfig's default
HF_NAMES = ({k: f"config.json vision_config.{k}" for k in CLIP_DEFAULTS}
            | {k: f"config.json {k}" for k in ("vision_feature_layer", "vision_feature_select_strategy",
                                               "projector_hidden_act", "multimodal_projector_bias")}
            | {k: f"the image processor's {k}" for k in ("crop_size", "do_pad", "resample", "image_mean", "image_std",
                                                         "rescale_factor")}
            | {"text_hidden_size": "config.json text_config.hidden_size", "grid_pinpoints":
               "config.json image_grid_pinpoints", "shortest_edge": "the image processor's size.shortest_edge"})
MMPROJ_KEYS = {"hidden_size": "clip.vision.embedding_length", "intermediate_size": "clip.vision.feed_forward_length",
               "num_hidden_layers": "clip.vision.block_count",
               "num_attention_heads": "clip.vision.attention.head_count",
               "image_size": "clip.vision.image_size", "patch_size": "clip.vision.patch_size",
               "layer_norm_eps": "clip.vision.attention.layer_norm_epsilon",
               "image_mean": "clip.vision.image_mean", "image_std": "clip.vision.image_std",
               "vision_feature_layer": "clip.vision.feature_layer", "text_hidden_size": "mm.2.weight",
               "hidden_act": "clip.use_gelu", "grid_pinpoints": "clip.vision.image_grid_pinpoints"}
FEATURE_KEY = "clip.vision.feature_layer"


def hf_fields(cfg: dict, pre: dict | None, source: str) -> dict:
    """LlavaVisionConfig fields of a LlavaForConditionalGeneration config.json and its image processor's settings."""
    vis, text = cfg.get("vision_config", None), cfg.get("text_config")
    if vis is None:
        vis = {"model_type": "clip_vision_model", **LLAVA_TOWER}
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    if vis.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise ModelFormatError(f"{source}: config.json vision_config.model_type {str(vis.get('model_type'))[:40]!r} "
                               "is not supported (clip_vision_model only)")
    fields = {**CLIP_DEFAULTS, **{k: vis[k] for k in CLIP_DEFAULTS if k in vis}}
    from ..models.llava import text_hidden_size
    fields["text_hidden_size"] = text_hidden_size(text)
    for k in ("vision_feature_layer", "vision_feature_select_strategy", "projector_hidden_act",
              "multimodal_projector_bias"):
        if k in cfg:
            fields[k] = cfg[k]
    pre = {} if pre is None else pre
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: the image processor's settings must be a JSON object")
    if pre.get("do_resize", True) is not True:
        raise ModelFormatError(f"{source}: the image processor's do_resize is not true, which is not supported")
    size = pre.get("size", {"shortest_edge": fields["image_size"]})
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"shortest_edge": size}          # older CLIP processors' int: the shortest edge (not a square)
    if isinstance(size, dict) and "shortest_edge" in size:
        fields["shortest_edge"] = size["shortest_edge"]
    elif not (isinstance(size, dict) and size.get("height") == size.get("width") == fields["image_size"]):
        raise ModelFormatError(f"{source}: the image processor's size {str(size)[:80]} is neither a shortest_edge nor "
                               f"the tower's {fields['image_size']} square")
    if pre.get("do_center_crop", True):
        crop = pre.get("crop_size", {"height": fields["image_size"], "width": fields["image_size"]})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        if not isinstance(crop, dict) or crop.get("height") != crop.get("width"):
            raise ModelFormatError(f"{source}: the image processor's crop_size {str(crop)[:80]} is not a square")
        fields["crop_size"] = crop.get("height")
    elif "shortest_edge" in fields:
        raise ModelFormatError(f"{source}: the image processor resizes the shortest edge to "
                               f"{str(fields['shortest_edge'])[:20]} and crops nothing: not the tower's square")
    if cfg.get("model_type") == "llava_next":
        fields["grid_pinpoints"] = cfg.get("image_grid_pinpoints", NEXT_PINPOINTS)
        if "image_grid_pinpoints" in pre and pre["image_grid_pinpoints"] != fields["grid_pinpoints"]:
            raise ModelFormatError(f"{source}: the image processor's image_grid_pinpoints are not config.json's")
    else:           # (LlavaNextImageProcessor's do_pad pads a batch's tile counts: not this one)
        fields["do_pad"] = pre.get("do_pad", False)
    fields["resample"] = pre.get("resample", 3)
    return rescale_normalize(pre, fields, CLIP_MEAN, CLIP_STD)


def hf_lookup(tensors: dict, source: str):
    """A canonical-name lookup over a LLaVA checkpoint: the tower's names under its prefix, the projector's (and
    LLaVA-NeXT's image_newline, beside it) under theirs."""
    def prefix(options, leaf: str, what: str) -> str:
        for p in options:
            if p + leaf in tensors:
                return p
        raise ModelFormatError(f"{source}: config.json describes a LLaVA tower but the checkpoint holds no {what}")
    tower = prefix(TOWER_PREFIXES, "embeddings.patch_embedding.weight",
                   "vision tower (...embeddings.patch_embedding.weight)")
    proj = prefix(PROJECTOR_PREFIXES, "linear_1.weight", "multi_modal_projector.linear_1.weight")

    def lookup(canon: str):
        if canon == "image_newline":          # LLaVA-NeXT's, beside the projector
            return tensors.get(proj[:-len("multi_modal_projector.")] + canon)
        return tensors.get((proj if canon.startswith("linear_") else tower) + canon)
    return lookup


# canonical (HF) names -> llama.cpp's
_LAYER = {"layer_norm1": "ln1", "layer_norm2": "ln2", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
_GLOBAL = {"embeddings.class_embedding": "v.class_embd", "embeddings.patch_embedding.weight": "v.patch_embd.weight",
           "embeddings.patch_embedding.bias": "v.patch_embd.bias",
           "embeddings.position_embedding.weight": "v.position_embd.weight",
           "pre_layrnorm.weight": "v.pre_ln.weight", "pre_layrnorm.bias": "v.pre_ln.bias",
           "post_layernorm.weight": "v.post_ln.weight", "post_layernorm.bias": "v.post_ln.bias",
           "linear_1.weight": "mm.0.weight", "linear_1.bias": "mm.0.bias",
           "linear_2.weight": "mm.2.weight", "linear_2.bias": "mm.2.bias"}


def gguf_name(canon: str, swapped: bool = False) -> str | None:
    """llama.cpp's name of a canonical tensor; `swapped`: the old converters' ffn names (fc1 as ffn_down)."""
    if canon in _GLOBAL:
        return _GLOBAL[canon]
    parts = canon.split(".")
    if len(parts) >= 5 and parts[0] == "encoder" and parts[1] == "layers" and parts[2].isdigit():
        leaf = _LAYER.get(".".join(parts[3:-1]))
        if leaf and swapped and leaf in ("ffn_up", "ffn_down"):
            leaf = "ffn_down" if leaf == "ffn_up" else "ffn_up"
        return f"v.blk.{int(parts[2])}.{leaf}.{parts[-1]}" if leaf else None
    return None


def mmproj_fields(meta: dict, tensors: dict, source: str) -> dict:
    """LlavaVisionConfig fields of an mmproj GGUF of projector type mlp (`tensors`: its name -> info)."""
    if meta.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{source}: mmproj file says it has no vision encoder (clip.has_vision_encoder)")
    if meta.get("clip.has_llava_projector", True) is not True:
        raise ModelFormatError(f"{source}: mmproj projector type mlp without clip.has_llava_projector")
    if meta.get("clip.use_silu"):
        raise ModelFormatError(f"{source}: mmproj file's clip.use_silu is set: CLIP's MLP is quick GELU or GELU")
    fields = {k: _scalar(meta[key]) for k, key in MMPROJ_KEYS.items()
              if key in meta and k not in ("vision_feature_layer", "hidden_act")}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size"):
        if k not in fields:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {MMPROJ_KEYS[k]!r}")
    for k in ("image_mean", "image_std"):
        if k not in fields:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {MMPROJ_KEYS[k]!r}")
    use_gelu = meta.get("clip.use_gelu", False)
    if not isinstance(use_gelu, bool):
        raise ModelFormatError(f"{source}: clip.use_gelu must be a bool")
    fields["hidden_act"] = "gelu" if use_gelu else "quick_gelu"
    n = fields["num_hidden_layers"]
    counted = isinstance(n, int) and not isinstance(n, bool) and n >= 1     # else from_fields refuses it by name
    if FEATURE_KEY in meta and counted:
        layers = _scalar(meta[FEATURE_KEY])
        if not isinstance(layers, list) or not layers or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                 and 0 <= i <= n for i in layers):
            raise ModelFormatError(f"{source}: {FEATURE_KEY} must be a list of layer indices in 0..{n}, got "
                                   f"{str(layers)[:60]}")
        fields["vision_feature_layer"] = sorted(set(layers))     # llama.cpp joins them in layer order
    elif counted:
        # the legacy converter dropped the last block already (LLaVA's -2): every stored block runs, as the
        # model was trained (llama.cpp's graph drops one more: ggml-org/llama.cpp#25817); the oldest files say
        # block_count = all blocks but store one fewer
        stored = next((i for i in range(n) if f"v.blk.{i}.attn_out.weight" not in tensors), n)
        fields["vision_feature_layer"] = [max(stored, 1)]
    mm2 = tensors.get("mm.2.weight")
    if mm2 is None or tensors.get("mm.0.weight") is None:
        raise ModelFormatError(f"{source}: an mlp mmproj needs mm.0.weight and mm.2.weight")
    fields["text_hidden_size"] = int(mm2.shape[0]) if len(mm2.shape) == 2 else None
    fields.update(next_fields(      # LLaVA-NeXT's pinpoints, merge type and newline
        meta, tensors, fields["image_size"], source) or {"preprocess": "letterbox"})
    fields.update(vision_feature_select_strategy="default",
                  has_class="v.class_embd" in tensors, patch_bias="v.patch_embd.bias" in tensors,
                  post_ln="v.post_ln.weight" in tensors, multimodal_projector_bias="mm.0.bias" in tensors)
    return fields


def mmproj_lookup(gguf_file, hidden: int):
    """A canonical-name lookup over an mlp mmproj's tensors, fc1/fc2 swapped back where the file's ffn_down is
    fc1-shaped (takes `hidden` values), as llama.cpp reads old files."""
    down = gguf_file.tensors.get("v.blk.0.ffn_down.weight")
    swapped = down is not None and len(down.shape) == 2 and int(down.shape[-1]) == hidden
    return newline_lookup(gguf_file, gguf_lookup(gguf_file, swapped, gguf_name))


def hf_config(path, cfg: dict, src: str):
    """The LlavaVisionConfig of a LlavaForConditionalGeneration directory (its tensors: hf_lookup)."""
    from ..formats.files import read_json
    from .layouts import image_processor_settings
    from .llava_config import LlavaVisionConfig
    pre, _ = image_processor_settings(path, read_json)
    return LlavaVisionConfig.from_fields(hf_fields(cfg, pre, src), HF_NAMES, src)


def mmproj_layout(f, src: str):
    """The Layout of an open mmproj GGUF of projector type mlp (its closer is the caller's to add)."""
    from .layouts import Layout
    from .llava_config import LlavaVisionConfig
    vcfg = LlavaVisionConfig.from_fields(mmproj_fields(f.metadata, f.tensors, src), MMPROJ_KEYS, src)
    return Layout(vcfg, mmproj_lookup(f, vcfg.hidden_size), 0.0, "mmproj", [f.close])

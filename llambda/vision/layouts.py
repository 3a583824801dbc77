"""Where a Gemma 3 or Idefics3 (SmolVLM) vision tower lives in each file shape users have, and what its
hyper-parameters are called there. Each layout yields a `Layout`: the VisionConfig, a lookup from the tower's
canonical names (SigLIP's Hugging Face names under the vision model, and the projector's) to WeightTensors,
and the offset of the projector norm's stored weight (its multiplier is stored + offset).

- a Hugging Face directory of Gemma3ForConditionalGeneration: config.json (model_type gemma3, vision_config,
  text_config.hidden_size, mm_tokens_per_image), preprocessor_config.json, safetensors whose tower is under
  `vision_tower.vision_model.` (Google's checkpoints), `vision_tower.` (transformers 5's saves) or either
  under `model.`; the projector under `multi_modal_projector.` (or `model.multi_modal_projector.`);
- llama.cpp's mmproj GGUF (general.architecture `clip`, clip.projector_type `gemma3`): keys `clip.vision.*`,
  tensors `v.patch_embd`, `v.position_embd`, `v.blk.N.{ln1,attn_q,attn_k,attn_v,attn_out,ln2,ffn_up,ffn_down}`,
  `v.post_ln`, `mm.input_projection.weight`, `mm.soft_emb_norm.weight` (stored as 1 + w);
- Ollama's gemma3 GGUF, the tower inside the model file: keys `gemma3.vision.*`, `gemma3.mm.tokens_per_image`,
  tensors `v.patch_embedding`, `v.position_embedding`, `v.blk.N.{layer_norm1,attn_q,attn_k,attn_v,attn_output,
  layer_norm2,mlp.fc1,mlp.fc2}`, `v.post_layernorm`, `mm.mm_input_projection.weight`, `mm.mm_soft_emb_norm.weight`
  (stored as 1 + w).
- a Hugging Face directory of Idefics3ForConditionalGeneration (model_type idefics3, or smolvlm: SmolVLM2, the
  same tower and processor): config.json (vision_config, scale_factor, text_config.hidden_size), the image
  processor's settings in preprocessor_config.json (or under processor_config.json's image_processor, as
  transformers 5 saves them), the tower under `model.vision_model.`, the connector's
  `model.connector.modality_projection.proj.weight`;
- llama.cpp's mmproj GGUF of one (clip.projector_type `idefics3`): the same `clip.vision.*` keys and `v.*`
  tensors, `clip.vision.projector.scale_factor` (the pixel shuffle's), `clip.vision.preproc_image_size` (the
  processor's longest edge), `mm.model.fc.weight`.
Every layout stores matrices in HF's orientation (GGUF's ne reversed is HF's shape).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import ModelFormatError
from ..formats.gguf import GGUFValueType as VT
from ..formats.gguf_writer import GGUFValue
from ..formats.weights import WeightTensor
from .config import VisionConfig

# canonical (HF SigLIP) per-layer leaves -> llama.cpp's and Ollama's names
_LAYER = {
    "layer_norm1": ("ln1", "layer_norm1"), "layer_norm2": ("ln2", "layer_norm2"),
    "self_attn.q_proj": ("attn_q", "attn_q"), "self_attn.k_proj": ("attn_k", "attn_k"),
    "self_attn.v_proj": ("attn_v", "attn_v"), "self_attn.out_proj": ("attn_out", "attn_output"),
    "mlp.fc1": ("ffn_up", "mlp.fc1"), "mlp.fc2": ("ffn_down", "mlp.fc2"),
}
_GLOBAL = {
    "embeddings.patch_embedding": ("v.patch_embd", "v.patch_embedding"),
    "embeddings.position_embedding": ("v.position_embd", "v.position_embedding"),
    "post_layernorm": ("v.post_ln", "v.post_layernorm"),
    "mm_soft_emb_norm": ("mm.soft_emb_norm", "mm.mm_soft_emb_norm"),
}
_PROJ = ("mm.input_projection.weight", "mm.mm_input_projection.weight")
CONNECTOR = "connector.modality_projection.proj.weight"         # Idefics3's (llama.cpp: mm.model.fc.weight)
_LAYER_RE = re.compile(r"encoder\.layers\.(\d{1,4})\.(.+)\.(weight|bias)")
LLAMA_CPP, OLLAMA = 0, 1


def gguf_name(canon: str, which: int) -> str | None:
    """The GGUF name (llama.cpp's mmproj: which=0, Ollama's: 1) of a canonical tower tensor."""
    if canon == "mm_input_projection_weight":
        return _PROJ[which]
    if canon == CONNECTOR:
        return "mm.model.fc.weight" if which == LLAMA_CPP else None
    m = _LAYER_RE.fullmatch(canon)
    if m:
        leaf = _LAYER.get(m.group(2))
        return f"v.blk.{int(m.group(1))}.{leaf[which]}.{m.group(3)}" if leaf else None
    base, _, kind = canon.rpartition(".")
    names = _GLOBAL.get(base)
    return f"{names[which]}.{kind}" if names and kind in ("weight", "bias") else None


@dataclass
class Layout:
    cfg: VisionConfig             # or a QwenVisionConfig (qwen2vl_layouts.py)
    lookup: Callable[[str], Optional[WeightTensor]]
    soft_norm_offset: float       # the projector norm's multiplier is the stored weight + this
    kind: str                     # "hf", "mmproj", "ollama"
    closers: list


# ---------------------------------------------------------------- Hugging Face directory

SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "num_channels": 3, "image_size": 224, "patch_size": 16, "layer_norm_eps": 1e-6,
                   "hidden_act": "gelu_pytorch_tanh"}           # transformers' SiglipVisionConfig defaults
TOWER_PREFIXES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                  "model.vision_tower.", "model.vision_model.", "vision_model.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")


def hf_fields(cfg: dict, pre: dict | None, source: str) -> dict:
    """VisionConfig fields of a Gemma3ForConditionalGeneration config.json and its preprocessor_config.json."""
    vis = cfg.get("vision_config")
    text = cfg.get("text_config")
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    fields = {**SIGLIP_DEFAULTS, **{k: vis[k] for k in SIGLIP_DEFAULTS if k in vis}}
    fields["mm_tokens_per_image"] = cfg.get("mm_tokens_per_image", 256)
    fields["text_hidden_size"] = text.get("hidden_size")
    pre = pre or {}
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: preprocessor_config.json must hold a JSON object")
    if pre.get("do_pan_and_scan"):
        raise ModelFormatError(f"{source}: preprocessor_config.json turns pan-and-scan on, which is not supported")
    fields["processor_size"] = pre.get("size")     # checked against image_size once that is checked
    if pre.get("resample", 2) != 2:
        raise ModelFormatError(f"{source}: preprocessor_config.json's resample {pre.get('resample')!r} is not "
                               "supported (2, bilinear, only)")
    return rescale_normalize(pre, fields)


IDEFICS3_TYPES = ("idefics3", "smolvlm")
IDEFICS3_VISION_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_attention_heads": 16, "num_channels": 3, "image_size": 224, "patch_size": 32,
                            "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}   # Idefics3VisionConfig's
IDEFICS3_LONGEST_EDGE, IDEFICS3_CROP = 4 * 364, 364       # Idefics3ImageProcessor's size and max_image_size


def idefics3_hf_fields(cfg: dict, pre: dict | None, source: str, seq_len=None) -> dict:
    """VisionConfig fields of an Idefics3ForConditionalGeneration config.json and its image processor's settings."""
    vis, text = cfg.get("vision_config"), cfg.get("text_config")
    if not isinstance(vis, dict) or not isinstance(text, dict):
        raise ModelFormatError(f"{source}: config.json's vision_config and text_config must be objects")
    fields = {**IDEFICS3_VISION_DEFAULTS, **{k: vis[k] for k in IDEFICS3_VISION_DEFAULTS if k in vis}}
    fields.update(projector="idefics3", scale_factor=cfg.get("scale_factor", 2),
                  text_hidden_size=text.get("hidden_size"))
    pre = {} if pre is None else pre
    if not isinstance(pre, dict):
        raise ModelFormatError(f"{source}: the image processor's settings must be a JSON object")
    if pre.get("do_resize", True) is not True:
        raise ModelFormatError(f"{source}: the image processor's do_resize is not true, which is not supported")

    def edge(key, default):
        v = pre.get(key, {"longest_edge": default})
        if not isinstance(v, dict) or "longest_edge" not in v:
            raise ModelFormatError(f"{source}: the image processor's {key} must be an object with longest_edge, got "
                                   f"{str(v)[:80]}")
        return v["longest_edge"]
    fields["longest_edge"] = edge("size", IDEFICS3_LONGEST_EDGE)
    fields["processor_crop"] = edge("max_image_size", IDEFICS3_CROP)    # checked against image_size once checked
    fields["do_image_splitting"] = pre.get("do_image_splitting", True)
    fields["processor_seq_len"] = seq_len      # checked against the tokens a crop gives once those are known
    fields["resample"] = pre.get("resample", 1)
    return rescale_normalize(pre, fields)


def image_processor_settings(path, read_json) -> tuple:
    """The image processor's settings beside a HF config (preprocessor_config.json, else the image_processor
    object of processor_config.json, transformers 5's save; None: the defaults) and the processor's
    image_seq_len (processor_config.json's; None where absent)."""
    pre, seq_len = None, None
    both = path / "processor_config.json"
    if both.exists():
        d = read_json(both, "processor_config.json")
        if isinstance(d, dict):
            pre, seq_len = d.get("image_processor"), d.get("image_seq_len")
    if (path / "preprocessor_config.json").exists():
        pre = read_json(path / "preprocessor_config.json", "preprocessor_config.json")
    return pre, seq_len


def rescale_normalize(pre: dict, fields: dict, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)) -> dict:
    """The image processor's rescale and normalize settings into `fields` (transformers' defaults where absent:
    1/255, the processor class's mean and std)."""
    if pre.get("do_rescale", True):
        fields["rescale_factor"] = pre.get("rescale_factor", 1 / 255)
    else:
        fields["rescale_factor"] = 1.0
    if pre.get("do_normalize", True):
        fields["image_mean"] = pre.get("image_mean", mean)
        fields["image_std"] = pre.get("image_std", std)
    else:
        fields["image_mean"], fields["image_std"] = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return fields


def check_processor_size(fields: dict, cfg: VisionConfig, source: str) -> None:
    """Gemma 3: preprocessor_config.json's `size` must be the tower's image_size (no other resize is supported).
    Idefics3: its crops (max_image_size) must be the tower's image_size."""
    if cfg.projector == "idefics3":
        if fields.get("processor_crop") != cfg.image_size:
            raise ModelFormatError(f"{source}: the image processor's crops (max_image_size "
                                   f"{str(fields.get('processor_crop'))[:40]}) are not the tower's image_size "
                                   f"{cfg.image_size}")
        seq = fields.get("processor_seq_len")
        if seq is not None and seq != cfg.mm_tokens_per_image:
            raise ModelFormatError(f"{source}: processor_config.json's image_seq_len {str(seq)[:40]} is not the "
                                   f"{cfg.mm_tokens_per_image} rows a crop gives ({cfg.patches_per_side}^2 patches / "
                                   f"scale_factor {cfg.scale_factor}^2)")
        return
    size = fields.get("processor_size")
    if isinstance(size, dict) and ("height" in size or "width" in size):
        if size.get("height") != cfg.image_size or size.get("width") != cfg.image_size:
            raise ModelFormatError(f"{source}: preprocessor_config.json resizes to {str(size)[:80]}, the tower takes "
                                   f"{cfg.image_size} x {cfg.image_size}")


def hf_lookup(tensors: dict, source: str, projector: str = "gemma3"):
    """A canonical-name lookup over a checkpoint's tensors (name -> WeightTensor)."""
    tower = next((p for p in TOWER_PREFIXES if p + "embeddings.patch_embedding.weight" in tensors), None)
    if projector == "idefics3":
        proj = next((p for p in ("model.", "") if p + CONNECTOR in tensors), None)
        what = "model.connector.modality_projection.proj.weight"
    else:
        proj = next((p for p in PROJECTOR_PREFIXES if p + "mm_input_projection_weight" in tensors), None)
        what = "multi_modal_projector.mm_input_projection_weight"
    if tower is None or proj is None:
        missing = "vision tower (...embeddings.patch_embedding.weight)" if tower is None else what
        raise ModelFormatError(f"{source}: config.json describes a vision tower but the checkpoint holds no {missing}")

    def lookup(canon: str):
        pre = proj if canon.startswith(("mm_", "connector.")) else tower
        return tensors.get(pre + canon)
    return lookup


# ---------------------------------------------------------------- GGUF files

_MMPROJ_KEYS = {"hidden_size": "clip.vision.embedding_length", "intermediate_size": "clip.vision.feed_forward_length",
                "num_hidden_layers": "clip.vision.block_count", "num_attention_heads": "clip.vision.attention.head_count",
                "image_size": "clip.vision.image_size", "patch_size": "clip.vision.patch_size",
                "layer_norm_eps": "clip.vision.attention.layer_norm_epsilon",
                "text_hidden_size": "clip.vision.projection_dim",
                "image_mean": "clip.vision.image_mean", "image_std": "clip.vision.image_std"}
MMPROJ_SCALE_KEY = "clip.vision.projector.scale_factor"
MMPROJ_DEFAULT_SCALE = 4        # llama.cpp's gemma3 pool side when the key is absent (896 / 14 / 4 = 16)
MMPROJ_LONGEST_EDGE_KEY = "clip.vision.preproc_image_size"      # idefics3: the processor's size["longest_edge"]

_OLLAMA_KEYS = {"hidden_size": "gemma3.vision.embedding_length",
                "intermediate_size": "gemma3.vision.feed_forward_length",
                "num_hidden_layers": "gemma3.vision.block_count",
                "num_attention_heads": "gemma3.vision.attention.head_count",
                "image_size": "gemma3.vision.image_size", "patch_size": "gemma3.vision.patch_size",
                "num_channels": "gemma3.vision.num_channels",
                "layer_norm_eps": "gemma3.vision.attention.layer_norm_epsilon",
                "mm_tokens_per_image": "gemma3.mm.tokens_per_image", "text_hidden_size": "gemma3.embedding_length"}


def _scalar(v):
    return v.tolist() if hasattr(v, "tolist") else v


def mmproj_fields(meta: dict, source: str) -> dict:
    proj = meta.get("clip.projector_type", meta.get("clip.vision.projector_type"))
    if proj not in ("gemma3", "idefics3"):
        shown = repr(proj)[:40] if isinstance(proj, str) else type(proj).__name__
        raise ModelFormatError(f"{source}: mmproj projector type {shown} is not supported (gemma3, idefics3)")
    if meta.get("clip.has_vision_encoder") is not True:
        raise ModelFormatError(f"{source}: mmproj file says it has no vision encoder (clip.has_vision_encoder)")
    if meta.get("clip.use_gelu") is not True:
        raise ModelFormatError(f"{source}: mmproj file's clip.use_gelu is not true: only SigLIP's gelu_tanh MLP is "
                               "supported")
    fields = {k: _scalar(meta[key]) for k, key in _MMPROJ_KEYS.items() if key in meta}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size", "text_hidden_size"):
        if k not in fields:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {_MMPROJ_KEYS[k]!r}")
    if proj == "idefics3":
        if MMPROJ_SCALE_KEY not in meta:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {MMPROJ_SCALE_KEY!r} (the pixel shuffle's factor)")
        fields.update(projector="idefics3", scale_factor=_scalar(meta[MMPROJ_SCALE_KEY]), resample=1)
        if MMPROJ_LONGEST_EDGE_KEY in meta:
            fields.update(longest_edge=_scalar(meta[MMPROJ_LONGEST_EDGE_KEY]), do_image_splitting=True)
        else:       # older files: no splitting (one crop of the whole image)
            fields.update(longest_edge=fields["image_size"], do_image_splitting=False)
        return fields
    fields["pool"] = _scalar(meta.get(MMPROJ_SCALE_KEY, MMPROJ_DEFAULT_SCALE))
    return fields


def ollama_fields(meta: dict, lookup, source: str) -> dict:
    fields = {k: _scalar(meta[key]) for k, key in _OLLAMA_KEYS.items() if key in meta}
    fields.setdefault("mm_tokens_per_image", 256)     # Ollama's model reads 256 when the key is absent
    if "intermediate_size" not in fields:             # older Ollama files do not write it: the MLP's shape says
        fc1 = lookup("encoder.layers.0.mlp.fc1.weight")
        if fc1 is not None and len(fc1.shape) == 2:
            fields["intermediate_size"] = int(fc1.shape[0])
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size",
              "patch_size", "text_hidden_size"):
        if k not in fields:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {_OLLAMA_KEYS[k]!r}")
    return fields    # mean and std: Ollama's gemma3 uses 0.5 (its ImageNetStandard), VisionConfig's default


def vit_keys(c, block_count: int) -> dict:
    """The `clip.vision.*` keys of a square ViT's sizes, eps, mean and std (`c`: its config)."""
    return {
        "clip.vision.projection_dim": GGUFValue(VT.UINT32, c.text_hidden_size),
        "clip.vision.image_size": GGUFValue(VT.UINT32, c.image_size),
        "clip.vision.patch_size": GGUFValue(VT.UINT32, c.patch_size),
        "clip.vision.embedding_length": GGUFValue(VT.UINT32, c.hidden_size),
        "clip.vision.feed_forward_length": GGUFValue(VT.UINT32, c.intermediate_size),
        "clip.vision.block_count": GGUFValue(VT.UINT32, block_count),
        "clip.vision.attention.head_count": GGUFValue(VT.UINT32, c.num_attention_heads),
        "clip.vision.attention.layer_norm_epsilon": GGUFValue(VT.FLOAT32, c.layer_norm_eps),
        "clip.vision.image_mean": GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_mean)),
        "clip.vision.image_std": GGUFValue((VT.ARRAY, VT.FLOAT32), list(c.image_std)),
    }


def gguf_lookup(gguf_file, which, name_of=None):
    """A canonical-name lookup over a GGUF's tensors, each named by name_of(canon, which) (gguf_name by default)."""
    infos, name_of = gguf_file.tensors, name_of or gguf_name

    def lookup(canon: str):
        name = name_of(canon, which)
        t = infos.get(name) if name else None
        if t is None:
            return None
        return WeightTensor(name, t.qtype, tuple(int(s) for s in t.shape), t.data)
    return lookup


def has_ollama_tower(gguf_file) -> bool:
    return any(n in gguf_file.tensors for n in ("v.patch_embedding.weight", "v.patch_embd_0.weight",
                                                "v.patch_embed.weight")) or any(
        k.endswith(".vision.block_count") for k in gguf_file.metadata)


MMPROJ_NAMES = {**_MMPROJ_KEYS, "pool": MMPROJ_SCALE_KEY, "scale_factor": MMPROJ_SCALE_KEY,
                "longest_edge": MMPROJ_LONGEST_EDGE_KEY}
OLLAMA_NAMES = dict(_OLLAMA_KEYS)
HF_NAMES = {k: f"config.json vision_config.{k}" for k in SIGLIP_DEFAULTS} | {
    "mm_tokens_per_image": "config.json mm_tokens_per_image", "text_hidden_size": "config.json text_config.hidden_size",
    "image_mean": "preprocessor_config.json image_mean", "image_std": "preprocessor_config.json image_std",
    "rescale_factor": "preprocessor_config.json rescale_factor", "scale_factor": "config.json scale_factor",
    "longest_edge": "the image processor's size.longest_edge",
    "do_image_splitting": "the image processor's do_image_splitting", "resample": "the image processor's resample"}

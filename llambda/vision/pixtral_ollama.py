"""Ollama's mistral3 model file (general.architecture `mistral3`, the Pixtral tower and projector beside the text
model), as its converter (convert/convert_mistral.go) writes it and its runtime (model/models/mistral3) reads it:

- keys `mistral3.vision.{block_count, embedding_length, feed_forward_length, attention.head_count,
  attention.key_length, image_size, patch_size, num_channels, rope.freq_base}` (and `vision.longest_edge`, which
  its runtime reads before image_size), `mistral3.spatial_merge_size`, `mistral3.mm.projector_bias`,
  `mistral3.mm.projector_hidden_act`; the text width `mistral3.embedding_length`; the projector norm's eps
  `mistral3.text_config.rms_norm_eps` where present (1e-5, the runtime's default, else); the blocks' MLP SiLU (the
  runtime's, whatever the config said), CLIP's mean and std.
- tensors: HF's names with `vision_tower` -> `v`, `transformer.layers` -> `blk`, `ln_pre` -> `encoder_norm`,
  `attention_norm` -> `attn_norm`, `attention.{q,k,v}_proj` -> `attn_{q,k,v}`, `attention.o_proj` -> `attn_output`,
  `feed_forward.*_proj` -> `ffn_*`, `multi_modal_projector` -> `mm`; the tower's q and k rows as HF holds them (the
  converter permutes only the text model's).

Ollama's own runtime resizes bilinearly to multiples of the patch (14), where transformers' processor goes to
multiples of patch x merge (28) by bicubic: we follow transformers with the file's longest edge.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .pixtral import PROJECTOR, TOWER
from .pixtral_mmproj import renamed
from .qwen2vl_layouts import gguf_tensor

ARCH = "mistral3"
KEYS = {"hidden_size": "vision.embedding_length", "intermediate_size": "vision.feed_forward_length",
        "num_hidden_layers": "vision.block_count", "num_attention_heads": "vision.attention.head_count",
        "head_dim": "vision.attention.key_length", "patch_size": "vision.patch_size",
        "num_channels": "vision.num_channels", "rope_theta": "vision.rope.freq_base",
        "spatial_merge_size": "spatial_merge_size", "projector_bias": "mm.projector_bias",
        "projector_hidden_act": "mm.projector_hidden_act", "text_hidden_size": "embedding_length",
        "projector_eps": "text_config.rms_norm_eps", "longest_edge": "vision.longest_edge"}
NAMES = {k: f"{ARCH}.{v}" for k, v in KEYS.items()}
_LEAF = {"attention_norm": "attn_norm", "attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
         "attention.v_proj": "attn_v", "attention.o_proj": "attn_output", "ffn_norm": "ffn_norm",
         "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}
_GLOBAL = {TOWER + "patch_conv": "v.patch_conv", TOWER + "ln_pre": "v.encoder_norm", PROJECTOR + "norm": "mm.norm",
           PROJECTOR + "patch_merger.merging_layer": "mm.patch_merger.merging_layer",
           PROJECTOR + "linear_1": "mm.linear_1", PROJECTOR + "linear_2": "mm.linear_2"}


def ollama_name(canon: str) -> str | None:
    return renamed(canon, _LEAF, _GLOBAL)


def lookup(gguf_file):
    infos = gguf_file.tensors
    return lambda canon: gguf_tensor(infos, ollama_name(canon) or "")


def fields(meta: dict, source: str) -> tuple[dict, dict]:
    """(PixtralConfig fields of the file's keys (the runtime's defaults where it has them), the keys' names)."""
    f = {k: (meta[NAMES[k]].tolist() if hasattr(meta[NAMES[k]], "tolist") else meta[NAMES[k]])
         for k in KEYS if NAMES[k] in meta}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "text_hidden_size"):
        if k not in f:
            raise ModelFormatError(f"{source}: GGUF metadata lacks {NAMES[k]!r}")
    eps = meta.get(f"{ARCH}.vision.attention.layer_norm_epsilon", 1e-5)
    if abs(float(eps) - 1e-5) > 1e-9:
        raise ModelFormatError(f"{source}: {ARCH}.vision.attention.layer_norm_epsilon {str(eps)[:20]}: transformers' "
                               "Pixtral norms are fixed at 1e-5")
    names = dict(NAMES)
    if "longest_edge" not in f:         # the runtime's next choice: vision.image_size (1540 without it)
        image_size = meta.get(f"{ARCH}.vision.image_size", 1540)
        f["longest_edge"] = image_size.tolist() if hasattr(image_size, "tolist") else image_size
        names["longest_edge"] = f"{ARCH}.vision.image_size"
    f.setdefault("patch_size", 14)
    f.setdefault("spatial_merge_size", 2)
    f.setdefault("projector_eps", 1e-5)
    f["hidden_act"] = "silu"
    return f, names

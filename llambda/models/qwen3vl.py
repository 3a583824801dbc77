"""Qwen3-VL's text model: Qwen3 (q/k RMSNorm, no biases) with interleaved M-RoPE and DeepStack.

Interleaved M-RoPE: three sections (temporal, height, width; mrope_section, e.g. [24, 20, 20]) whose rotary
pairs alternate: pair i turns by the height position when i % 3 == 1 and i < 3 * sections[1], by the width
position when i % 3 == 2 and i < 3 * sections[2], else by the temporal one (transformers'
Qwen3VLTextRotaryEmbedding; llama.cpp's IMROPE, implied by its qwen3vl architecture). An image's tokens take
Qwen2-VL's positions (models/images.rope_rows); a text token's three are equal, and then it is plain RoPE.

DeepStack: the vision tower's rows of an image are [tokens, d * (1 + levels)]: the first d columns are the
embeddings written over its tokens, the columns of level j are added to those tokens' hidden states right after
decoder layer j (models/base.py). The levels: config.json's len(vision_config.deepstack_visual_indexes) (absent:
transformers' default, 3), llama.cpp's `qwen3vl.n_deepstack_layers` (0 when absent: the attached tower's count is
taken).

Files: a HF directory (model_type qwen3_vl, the text config nested under text_config, rope_scaling or
rope_parameters with mrope_section; transformers interleaves whatever `mrope_interleaved` says, and so do we);
llama.cpp's text GGUF (architecture qwen3vl: `rope.dimension_sections`, four counts, the last 0;
`n_deepstack_layers`); Ollama's qwen3-vl model file (architecture qwen3vl too: `mrope_sections`, the levels
from its tower's `vision.deepstack_visual_indexes`). Qwen3-VL-MoE's text model is qwen3vlmoe.py, with these fields."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .config import MAX_ROPE_SECTIONS, TransformerConfig
from .hparams import GGUFHParams
from .qwen2vl import gguf_sections, take_sections
from .qwen3 import config_from_hf as qwen3_from_hf

ARCH = "qwen3vl"
DEEPSTACK_KEY = "n_deepstack_layers"
# transformers' Qwen3VLVisionConfig default where config.json names none (vision/qwen3vl_layouts.py's too)
DEFAULT_DEEPSTACK = (8, 16, 24)
SECTION_KEYS = ("rope.dimension_sections", "mrope_sections")      # llama.cpp's, Ollama's


def _levels(v, what: str) -> int:
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 4096:
        raise ModelFormatError(f"{what} should be a count of DeepStack levels, got {str(v)[:60]}")
    return int(v)


def gguf_vl(meta: dict, arch: str) -> dict:
    """The Qwen3-VL fields of a qwen3vl / qwen3vlmoe GGUF's metadata: llama.cpp's (rope.dimension_sections,
    n_deepstack_layers) or Ollama's (mrope_sections, the tower's vision.deepstack_visual_indexes)."""
    sections = gguf_sections(meta, arch, SECTION_KEYS)
    levels = _levels(meta.get(f"{arch}.{DEEPSTACK_KEY}", 0), f"GGUF metadata '{arch}.{DEEPSTACK_KEY}'")
    idx = meta.get(f"{arch}.vision.deepstack_visual_indexes")      # Ollama's
    if idx is not None and not levels:
        levels = _levels(len(idx) if isinstance(idx, (list, tuple, np.ndarray)) else idx,
                         f"the length of GGUF metadata '{arch}.vision.deepstack_visual_indexes'")
    return dict(rope_neox=True, qk_norm=True, rope_sections=sections, rope_interleaved=True, deepstack_levels=levels)


def config_from_gguf(meta: dict) -> TransformerConfig:
    """llama.cpp's qwen3vl or Ollama's qwen3vl model file (its v.* tensors are llambda.vision's)."""
    arch = meta.get("general.architecture")
    c = GGUFHParams(meta, arch).common()
    c["arch"] = ARCH
    return TransformerConfig(**c, **gguf_vl(meta, arch))


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """What llama.cpp's qwen3vl (and qwen3vlmoe) reads: the sections as four int32 counts (the fourth 0), the
    DeepStack levels."""
    sec = list(cfg.rope_sections) + [0] * (MAX_ROPE_SECTIONS - len(cfg.rope_sections))
    return {f"{cfg.arch}.rope.dimension_sections": np.array(sec, np.int32),
            f"{cfg.arch}.{DEEPSTACK_KEY}": np.uint32(cfg.deepstack_levels)}


def hf_vl(cfg: dict) -> dict:
    """The Qwen3-VL fields of a text config (hf_dir.text_config's: nested under text_config, with the checkpoint's
    vision_config beside it, or flat); its M-RoPE sections are taken out of `cfg` (changed in place)."""
    sections, found = take_sections(cfg, ("mrope_interleaved",))
    if not isinstance(found.get("mrope_interleaved", True), bool):
        raise ModelFormatError(f"config.json 'mrope_interleaved' should be true or false, got "
                               f"{str(found['mrope_interleaved'])[:40]}")
    levels = 0
    vision = cfg.get("vision_config")
    if vision is not None:
        if not isinstance(vision, dict):
            raise ModelFormatError("config.json's vision_config must be an object")
        idx = vision.get("deepstack_visual_indexes", DEFAULT_DEEPSTACK)
        if not isinstance(idx, (list, tuple)) or len(idx) > 4096:
            raise ModelFormatError(f"config.json vision_config.deepstack_visual_indexes should list block indexes, "
                                   f"got {str(idx)[:60]}")
        levels = len(idx)
    return dict(rope_sections=sections, rope_interleaved=True, deepstack_levels=levels)


def config_from_hf(cfg: dict) -> TransformerConfig:
    """The text config of a qwen3_vl checkpoint."""
    cfg = dict(cfg)
    vl = hf_vl(cfg)
    c = qwen3_from_hf(cfg)
    c.arch = ARCH
    for k, v in vl.items():
        setattr(c, k, v)
    c.validate()
    return c

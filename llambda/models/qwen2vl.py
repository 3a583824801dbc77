"""Qwen2-VL / Qwen2.5-VL's text model: Qwen2 with M-RoPE (the rotated pairs in sections, each turned by one of
a token's three positions: temporal, height, width; models/images.py gives an image's tokens theirs). A text
token's three positions are equal, and then M-RoPE is Qwen2's RoPE.

Files: a HF directory (model_type qwen2_5_vl / qwen2_vl; the text config nested under text_config, transformers 5,
or flat, the released checkpoints; the sections in rope_parameters or rope_scaling's `mrope_section`), llama.cpp's
text GGUF (architecture qwen2vl, `rope.dimension_sections`: four counts, the last 0) and Ollama's qwen2.5vl
(architecture qwen25vl, `rope.mrope_section`; its tower's v.* tensors are llambda.vision's)."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .config import MAX_ROPE_SECTIONS, TransformerConfig
from .hparams import GGUFHParams
from .qwen2 import config_from_hf as qwen2_from_hf

_SECTION_KEYS = ("rope.dimension_sections", "rope.mrope_section")


def _sections(v, what: str) -> list[int]:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or not v or len(v) > MAX_ROPE_SECTIONS or not all(
            type(x) is int and 0 <= x <= 1 << 14 for x in v):
        raise ModelFormatError(f"{what} should list up to {MAX_ROPE_SECTIONS} pair counts, got {v!r}"[:200])
    out = list(v)
    while out and out[-1] == 0:         # llama.cpp's fourth section, unused by these models
        out.pop()
    if len(out) != 3:
        raise ModelFormatError(f"{what} = {list(v)!r}: M-RoPE here takes three sections (temporal, height, width)")
    return out


def gguf_sections(meta: dict, arch: str, keys) -> list[int]:
    """The three M-RoPE sections under the first of `keys` (after `arch.`) the metadata holds."""
    for key in keys:
        if f"{arch}.{key}" in meta:
            return _sections(meta[f"{arch}.{key}"], f"GGUF metadata '{arch}.{key}'")
    raise ModelFormatError(f"GGUF metadata lacks '{arch}.{keys[0]}': a {arch} model's M-RoPE sections")


def config_from_gguf(meta: dict) -> TransformerConfig:
    arch = meta.get("general.architecture")
    hp = GGUFHParams(meta, arch)
    sections = gguf_sections(meta, arch, _SECTION_KEYS)
    c = hp.common()
    c["arch"] = "qwen2vl"
    return TransformerConfig(**c, rope_neox=True, attn_bias=True, rope_sections=sections)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """The sections as llama.cpp's qwen2vl reads them: four int32 counts (the fourth 0 here)."""
    sec = list(cfg.rope_sections) + [0] * (MAX_ROPE_SECTIONS - len(cfg.rope_sections))
    return {"qwen2vl.rope.dimension_sections": np.array(sec, np.int32)}


def take_sections(cfg: dict, also: tuple = ()) -> tuple[list[int], dict]:
    """The M-RoPE sections of a text config (rope_parameters' or rope_scaling's `mrope_section`), taken out of
    `cfg` (changed in place: what is left is a plain RoPE config, transformers 4's "mrope" type spelled
    "default"), and the values of the `also` keys found beside them (taken out too)."""
    sections, found = None, {}
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key)
        if isinstance(rope, dict) and "mrope_section" in rope:
            sections = _sections(rope["mrope_section"], f"config.json '{key}.mrope_section'")
            found.update({k: rope[k] for k in also if k in rope})
            rope = {k: v for k, v in rope.items() if k != "mrope_section" and k not in also}
            kind = rope.get("rope_type") or rope.get("type")
            if kind == "mrope":          # transformers 4's spelling of the default rope with sections
                rope.pop("type", None)
                rope["rope_type"] = "default"
            cfg[key] = rope
    if sections is None:
        raise ModelFormatError("config.json names no M-RoPE sections (rope_scaling or rope_parameters "
                               "'mrope_section')")
    return sections, found


def config_from_hf(cfg: dict) -> TransformerConfig:
    """The text config (hf_dir.text_config's: nested or flat) of a qwen2_5_vl / qwen2_vl checkpoint."""
    cfg = dict(cfg)
    sections, _ = take_sections(cfg)
    c = qwen2_from_hf(cfg)
    c.arch, c.rope_sections = "qwen2vl", sections
    c.validate()
    return c

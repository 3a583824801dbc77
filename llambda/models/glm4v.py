"""GLM-4.1V / GLM-4.6V's text model (transformers' Glm4vTextModel): GLM-4's layers (glm4.py: q/k/v biases, o_proj
without, sandwich norms, a fused gate_up MLP) with M-RoPE: the rotary's pairs in three CONTIGUOUS sections
(mrope_section: temporal, height, width), each pair ADJACENT (2i, 2i + 1) as GLM-4's, over the first
partial_rotary_factor of a head (transformers' default here is 1.0, not GLM-4's 0.5; the released configs say
0.5). An image's tokens take Qwen2-VL's positions (models/images.rope_rows); a text token's three are equal, and
then it is GLM-4's RoPE. The attention's head_dim is hidden_size / num_attention_heads (a head_dim key otherwise
is refused).

Files: a HF directory (model_type glm4v; the text config under text_config, model_type glm4v_text); llama.cpp's
text GGUF (architecture glm4 with `rope.dimension_sections`, four int32 counts, the last 0: its converter
permutes each head's rotated q/k rows (and biases) to the half-split order, [0::2] then [1::2], since llama.cpp's
M-RoPE turns half-split pairs: read as rope_neox true, the same rotation; glm4.py reads and writes its keys);
export writes that file (tools/export.py permutes the rows)."""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .glm4 import HF_LAYER_NAMES, HF_ROPE_NEOX  # noqa: F401  (formats/hf_dir.py reads them off this module)
from .glm4 import config_from_hf as glm4_from_hf
from .qwen2vl import take_sections
from .qwen3next import partial_rope_dim

ARCH = "glm4v"


def config_from_hf(cfg: dict) -> TransformerConfig:
    """The text config of a glm4v checkpoint (nested under text_config, or flat)."""
    cfg = dict(cfg)
    sections, _ = take_sections(cfg)
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and cfg.get("head_dim") not in (
            None, hidden // heads):
        raise ModelFormatError(f"config.json head_dim {str(cfg.get('head_dim'))[:20]} is not hidden_size / "
                               f"num_attention_heads = {hidden // heads}, which Glm4vTextAttention uses")
    c = glm4_from_hf(cfg)
    c.arch, c.rope_sections = ARCH, sections
    c.rope_dim = partial_rope_dim(cfg, c.head_dim, 1.0)
    c.attn_bias = True                  # q/k/v biases always (Glm4vTextAttention)
    c.validate()
    return c

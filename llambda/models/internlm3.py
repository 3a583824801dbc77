"""InternLM3 (HF model_type `internlm3`, InternLM3-8B-Instruct; transformers runs it as LlamaForCausalLM): Llama
with its own head_dim and bias switches (`qkv_bias` / `bias`, transformers' attention_bias / mlp_bias; none in the
released model, refused here), and Dynamic NTK RoPE (`rope_type` dynamic, factor 6): plain RoPE up to
max_position_embeddings, other frequencies past it. That is run exactly: plain RoPE, and a context past
max_position_embeddings refused (config.ctx_limit), not run with frequencies transformers would not use.

GGUF: llama.cpp's converter writes InternLM3 as `llama` (llama.py reads it; its plain RoPE runs past the trained
context with a warning, as any llama file); an export writes the same.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig, check_number
from .hparams import HFConfig, refuse_quantized
from .llama import check_hf_mlp


def _without_dynamic(cfg: dict) -> tuple[dict, bool]:
    """config.json with a Dynamic NTK scaling taken out (checked: a factor >= 1, no other original context), and
    whether it had one."""
    for key in ("rope_parameters", "rope_scaling"):
        sc = cfg.get(key)
        if not isinstance(sc, dict) or (sc.get("rope_type") or sc.get("type")) != "dynamic":
            continue
        factor = check_number(f"config.json {key} 'factor'", sc.get("factor"), "rope_factor")
        if factor < 1:
            raise ModelFormatError(f"config.json {key} 'factor' {factor!r}: Dynamic NTK RoPE stretches (>= 1)")
        orig = sc.get("original_max_position_embeddings")
        if orig is not None and orig != cfg.get("max_position_embeddings"):
            raise ModelFormatError(f"config.json {key} original_max_position_embeddings {orig!r} is not "
                                   "max_position_embeddings: not supported"[:200])
        plain = {k: v for k, v in sc.items() if k not in ("rope_type", "type", "factor",
                                                          "original_max_position_embeddings")}
        return dict(cfg, **{key: dict(plain, rope_type="default") if key == "rope_parameters" else None}), True
    return cfg, False


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    refuse_quantized(cfg, "InternLM3")
    hf = HFConfig(cfg)
    for key in ("qkv_bias", "attention_bias", "bias"):
        if hf.flag(key, False):
            raise ModelFormatError(f"config.json {key}=true is not supported (InternLM3-8B has no biases)")
    plain, dynamic = _without_dynamic(cfg)
    c = HFConfig(plain).common("internlm3")
    return TransformerConfig(**c, ctx_limit=c["n_ctx_train"] if dynamic else 0)

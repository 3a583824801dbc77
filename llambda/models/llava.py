"""LLaVA 1.5 (HF model_type llava, LlavaForConditionalGeneration): its text decoder is the text_config's own
family (llama, mistral), read by that family's module. llava-hf's configs save only the keys that differ from
that family's transformers defaults (llava-1.5-7b-hf's text_config has no hidden_size: LlamaConfig's 4096), so a
text_config without hidden_size is filled with its model_type's defaults first. The vision tower is
llambda/vision's (clip.py, llava.py); llama.cpp's text GGUF of a LLaVA is a plain `llama` file.
"""
from __future__ import annotations

from ..errors import ModelFormatError

# transformers' LlamaConfig / MistralConfig defaults of the keys a llava-hf text_config may leave out
TEXT_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "hidden_act": "silu"},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "sliding_window": 4096, "hidden_act": "silu"},
}


def text_config(cfg: dict) -> dict:
    """The decoder's config of a llava config.json: text_config over its model_type's defaults (llama where none)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ModelFormatError("config.json: a llava model needs a text_config object")
    kind = text.get("model_type", "llama")
    if not isinstance(kind, str):
        raise ModelFormatError(f"config.json: text_config's model_type must be a string, got {type(kind).__name__}")
    if "hidden_size" in text:
        out = dict(text)
    elif kind in TEXT_DEFAULTS:
        out = {**TEXT_DEFAULTS[kind], **text, "model_type": kind}
    else:
        raise ModelFormatError(f"config.json: text_config of model_type {str(kind)[:40]!r} has no hidden_size (its "
                               f"defaults are known for {', '.join(TEXT_DEFAULTS)} only)")
    for key in ("tie_word_embeddings", "torch_dtype", "dtype"):
        if key not in out and key in cfg:
            out[key] = cfg[key]
    return out


def text_hidden_size(text: dict):
    """text_config's hidden_size, its model_type's default where absent (the vision side's projector width)."""
    if "hidden_size" in text:
        return text["hidden_size"]
    return TEXT_DEFAULTS.get(text.get("model_type", "llama"), {}).get("hidden_size")


def config_from_hf(cfg: dict):
    """The text decoder's TransformerConfig, by the text_config's family."""
    from . import ARCHITECTURES, arch_module
    text = text_config(cfg) if "text_config" in cfg else cfg
    kind = text.get("model_type", "llama")
    if isinstance(kind, str) and ARCHITECTURES.get(kind) == "llava":    # this module again: no end to the calls
        where = "a llava text_config" if text is not cfg else f"a {kind} config without a text_config"
        raise ModelFormatError(f"config.json: {where} names no text family (its model_type is {kind!r})")
    return arch_module(kind, "config_from_hf").config_from_hf(text)

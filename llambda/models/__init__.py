"""Architectures: each module turns GGUF metadata / config.json into a TransformerConfig."""
from __future__ import annotations

from importlib import import_module

from ..errors import ModelFormatError

# GGUF `general.architecture` / HF `model_type` -> module name
ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}


def arch_module(name: str):
    try:
        return import_module(f".{ARCHITECTURES[name]}", __name__)
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelFormatError(f"unsupported architecture {name!r} (supported: {known})") from None

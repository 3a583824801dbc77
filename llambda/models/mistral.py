"""Mistral: Llama with a sliding attention window (v0.1: 4096 on every layer; later versions: none).

GGUF files of Mistral use the `llama` architecture (llama.py reads the optional window key).
"""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import HFConfig, hf_sliding_flags
from .llama import check_hf_mlp


def hf_layer_sliding(cfg: dict, n_layers: int, default_sliding: bool) -> tuple[int, list[bool]]:
    """(window, per-layer sliding flags) from config.json.

    `layer_types` (transformers 5) wins; otherwise every layer slides when a window is set
    and `default_sliding`, and Qwen's `use_sliding_window` / `max_window_layers` apply.
    """
    hf = HFConfig(cfg)
    window = hf.window()
    flags = hf_sliding_flags(cfg.get("layer_types"), n_layers)
    if flags is None:
        if "use_sliding_window" in cfg:
            start = hf.get("max_window_layers", 0, int)
            use = hf.flag("use_sliding_window", False)
            flags = [use and i >= start for i in range(n_layers)]
        else:
            flags = [default_sliding] * n_layers
    if not window:
        flags = [False] * n_layers
    return window, flags


def hf_common_sliding(cfg: dict, arch: str, default_sliding: bool) -> dict:
    """The common config.json fields of a family with Llama's MLP (checked first), and its sliding window
    with the layers it applies to (hf_layer_sliding)."""
    check_hf_mlp(cfg)
    c = HFConfig(cfg).common(arch)
    window, flags = hf_layer_sliding(cfg, c["n_layers"], default_sliding)
    return dict(c, sliding_window=window, layer_sliding=flags)


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "mistral", default_sliding=True)
    return TransformerConfig(**c, attn_bias=HFConfig(cfg).flag("attention_bias", False))

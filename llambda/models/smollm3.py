"""SmolLM3: Llama with NoPE layers: some layers apply no rotary embedding at all.

config.json lists them in `no_rope_layers` (1 = the layer uses RoPE, 0 = NoPE), else every
`no_rope_layer_interval`-th layer is NoPE. llama.cpp's GGUF files store no key for it: its
`smollm3` architecture always makes every 4th layer NoPE, and so does our reader.
GGUF `smollm3` files hold q/k rows permuted for adjacent-pair RoPE, as `llama` files do.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .mistral import hf_common_sliding

GGUF_NOPE_INTERVAL = 4     # llama.cpp's n_no_rope_layer_step for smollm3


def every_nth_nope(n_layers: int, interval: int) -> list[bool]:
    """Per-layer "uses RoPE" flags with layers interval-1, 2*interval-1, ... NoPE."""
    return [(i + 1) % interval != 0 for i in range(n_layers)]


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "smollm3")
    c = hp.common()
    return TransformerConfig(**c, rope_neox=False, layer_rope=every_nth_nope(c["n_layers"], GGUF_NOPE_INTERVAL),
                             sliding_window=hp.int("attention.sliding_window", 0, "sliding_window"))


def hf_layer_rope(cfg: dict, n_layers: int) -> list[bool]:
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = HFConfig(cfg).get("no_rope_layer_interval", GGUF_NOPE_INTERVAL, int, "window_pattern")
        return every_nth_nope(n_layers, interval)
    if not isinstance(flags, list) or len(flags) < n_layers or any(f not in (0, 1) or isinstance(f, float)
                                                                   for f in flags):
        raise ModelFormatError(f"config.json 'no_rope_layers' must list 0 or 1 for each of the {n_layers} layers")
    return [bool(f) for f in flags[:n_layers]]


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common_sliding(cfg, "smollm3", default_sliding=False)
    return TransformerConfig(**c, attn_bias=HFConfig(cfg).flag("attention_bias", False),
                             layer_rope=hf_layer_rope(cfg, c["n_layers"]))

"""Cohere Command R7B / Command A (HF Cohere2ForCausalLM; llama.cpp `cohere2`): Cohere's parallel block
(models/cohere.py) with sliding-window layers that use RoPE and global layers that use none.

config.json: `layer_types` ("sliding_attention" / "full_attention"), else every `sliding_window_pattern`-th
layer (default 4) global; head_dim is always hidden_size / heads (transformers sets it so); no q/k norms.
GGUF: llama.cpp hard-codes the pattern (layers 3, 7, ... global) and reads `{arch}.attention.sliding_window`;
a file whose own `sliding_window_pattern` says otherwise is refused (llama.cpp would run it as every 4th).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .cohere import HF_ROPE_NEOX, gguf_common, gguf_flags, hf_common  # noqa: F401 (the loaders read them here)
from .cohere import gguf_metadata as _cohere_keys
from .config import TransformerConfig
from .hparams import HFConfig
from .smollm3 import every_nth_nope

GGUF_PATTERN = 4        # llama.cpp's set_swa_pattern(4) for cohere2


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return _cohere_keys(cfg, "cohere2")


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp, c = gguf_common(meta, "cohere2")
    sliding = every_nth_nope(c["n_layers"], GGUF_PATTERN)     # True: a sliding (RoPE) layer
    said = meta.get("cohere2.attention.sliding_window_pattern")
    if said is not None and (not isinstance(said, list) or [bool(v) for v in said] != sliding):
        raise ModelFormatError(f"GGUF metadata 'cohere2.attention.sliding_window_pattern' = {said!r}"[:160] +
                               f": llama.cpp runs cohere2 with every {GGUF_PATTERN}th layer global")
    window = hp.int("attention.sliding_window", limit="sliding_window")
    if window < 1:
        raise ModelFormatError("GGUF metadata 'cohere2.attention.sliding_window' = 0: the sliding layers need a window")
    return TransformerConfig(**c, sliding_window=window, layer_sliding=sliding, layer_rope=list(sliding))


def hf_layer_sliding(cfg: dict, n_layers: int) -> list[bool]:
    types = cfg.get("layer_types")
    if types is None:
        period = HFConfig(cfg).get("sliding_window_pattern", GGUF_PATTERN, int, "window_pattern")
        return every_nth_nope(n_layers, period)
    kinds = ("sliding_attention", "full_attention")
    if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) and t in kinds
                                                                         for t in types):
        raise ModelFormatError(f"config.json 'layer_types' should list sliding_attention or full_attention for each "
                               f"of the {n_layers} layers, got {types!r}"[:300])
    return [t == "sliding_attention" for t in types]


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common(cfg, "cohere2")
    if c["d_model"] % c["n_heads"]:
        raise ModelFormatError(f"config.json hidden_size {c['d_model']} is not a multiple of num_attention_heads "
                               f"{c['n_heads']} (Cohere2's head_dim is their quotient)")
    c["head_dim"] = c["d_model"] // c["n_heads"]
    window = HFConfig(cfg).window()
    if window < 1:
        raise ModelFormatError("config.json 'sliding_window' must be a positive window for Cohere2's sliding layers")
    sliding = hf_layer_sliding(cfg, c["n_layers"])
    return TransformerConfig(**c, sliding_window=window, layer_sliding=sliding, layer_rope=list(sliding))

"""EXAONE 4.0 (HF Exaone4ForCausalLM, 1.2B and 32B; llama.cpp's `exaone4`): no pre-norms, RMSNorms on each
sublayer's output before the residual add (OLMo 2's placement, HF's `post_attention_layernorm` and
`post_feedforward_layernorm`), per-head q/k RMSNorms before RoPE, and hybrid attention: sliding-window layers
with RoPE and global layers WITHOUT RoPE (transformers ropes a layer when it slides or when the config has no
`sliding_window` at all, as the 1.2B's, whose every layer is global and rotated).

config.json names the sliding layers in `layer_types`; without it `sliding_window_pattern` does: an int p (every
p-th layer global) or a string of L (local) and G (global) repeated over the layers, the last layer global.

GGUF (llama.cpp's keys): `exaone4.attention.sliding_window` and `exaone4.attention.sliding_window_pattern` (one
bool per layer, as llama.cpp's converter writes it from layer_types, or a period). llama.cpp itself slides only
in a 64-layer file (the 32B: window 4096, every 4th layer global, unless the keys say otherwise) and runs any
other file with every layer global and rotated; this reader does the same for a file without a pattern key, and
follows the key wherever a file has one (the model as transformers runs it). The q/k rows stay in HF's
half-split order (llama.cpp's NEOX rope).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .gemma2 import _gguf_layer_sliding
from .hparams import GGUFHParams, HFConfig, hf_sliding_flags
from .llama import check_hf_mlp

_SHAPE = dict(pre_norms=False, post_norms=True, qk_norm=True, rope_neox=True)
# llama.cpp's settings of the 64-layer (32B) model, which its files need not repeat
GGUF_HYBRID_LAYERS, GGUF_WINDOW, GGUF_PERIOD = 64, 4096, 4
HF_DEFAULT_PERIOD = 4       # Exaone4Config's sliding_window_pattern


def _rope_flags(sliding: list[bool]) -> list[bool]:
    """RoPE on the sliding layers of a hybrid model, on every layer of one without a window."""
    return list(sliding) if any(sliding) else [True] * len(sliding)


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "exaone4")
    c = hp.common()
    n = c["n_layers"]
    if f"exaone4.attention.sliding_window_pattern" in meta:
        flags = _gguf_layer_sliding(hp, n)
    elif n == GGUF_HYBRID_LAYERS:
        flags = [(i + 1) % GGUF_PERIOD != 0 for i in range(n)]
    else:
        flags = [False] * n
    window = hp.int("attention.sliding_window", GGUF_WINDOW, "sliding_window") if any(flags) else 0
    if any(flags) and window < 1:
        raise ModelFormatError("GGUF metadata 'exaone4.attention.sliding_window' = 0 with sliding layers")
    return TransformerConfig(**c, sliding_window=window, layer_sliding=flags, layer_rope=_rope_flags(flags),
                             **_SHAPE)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """The pattern as one bool per layer whenever a layer slides (also when all do: without the key a reader
    takes a file of another size than 64 layers for one without windows)."""
    if not any(cfg.layer_sliding):
        return {}
    return {"exaone4.attention.sliding_window_pattern": list(cfg.layer_sliding)}


def _hf_pattern(hf: HFConfig, n: int) -> list[bool]:
    pat = hf.cfg.get("sliding_window_pattern")
    if isinstance(pat, str):
        if not pat or set(pat) - {"L", "G"}:
            raise ModelFormatError(f"config.json 'sliding_window_pattern' {pat!r} should be L and G characters"[:200])
        return [pat[i % len(pat)] == "L" and i < n - 1 for i in range(n)]
    period = hf.get("sliding_window_pattern", HF_DEFAULT_PERIOD, int, "window_pattern")
    return [(i + 1) % period != 0 for i in range(n)]


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common("exaone4")
    n = c["n_layers"]
    c["norm_eps"] = hf.get("rms_norm_eps", 1e-5, float, "norm_eps")
    if cfg.get("sliding_window") is None:      # no window: every layer global, with RoPE
        flags, window, rope = [False] * n, 0, [True] * n
    else:
        window = hf.get("sliding_window", kind=int, limit="sliding_window")
        if window < 1:
            raise ModelFormatError(f"config.json 'sliding_window' = {window}: a window holds at least the token itself")
        flags = hf_sliding_flags(cfg.get("layer_types"), n)
        if flags is None:
            flags = _hf_pattern(hf, n)
        rope = list(flags)          # transformers: global layers of a model with a window take no RoPE
    return TransformerConfig(**c, sliding_window=window if any(flags) else 0, layer_sliding=flags, layer_rope=rope,
                             **{k: v for k, v in _SHAPE.items() if k != "rope_neox"})

"""The configuration every decoder-only transformer here is described by.

Each architecture file builds one of these (its own dataclass subclass when it
needs more fields) from GGUF metadata or from a Hugging Face config.json.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TransformerConfig:
    arch: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float = 1e-5
    n_ctx_train: int = 4096
    # RoPE
    rope_theta: float = 10000.0
    rope_dim: int = 0                       # rotated dims per head (0: all of head_dim)
    rope_neox: bool = True                  # pairs (i, i+d/2); False: adjacent pairs (GGUF llama)
    rope_scaling: dict | None = None        # {"rope_type": "linear"|"llama3"|..., ...} HF-style
    rope_theta_local: float | None = None   # sliding layers' base (Gemma 3)
    # block shape
    activation: str = "silu"                # "silu" or "gelu_tanh" (gated FFN either way)
    attn_bias: bool = False                 # q/k/v biases (Qwen2)
    qk_norm: bool = False                   # RMSNorm on q and k per head (Qwen3, Gemma 3)
    post_norms: bool = False                # norms after attention and FFN outputs (Gemma 2/3)
    norm_offset: float = 0.0                # added to stored norm weights at load (HF Gemma stores w-1)
    embed_scale: float | None = None        # embeddings multiplied by this (Gemma: sqrt(d_model))
    attn_scale: float | None = None         # default 1/sqrt(head_dim)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    sliding_window: int = 0                 # 0: none
    layer_sliding: list[bool] = field(default_factory=list)   # per layer; empty: all layers alike
    tie_embeddings: bool = True

    def __post_init__(self):
        if not self.rope_dim:
            self.rope_dim = self.head_dim
        if not self.layer_sliding:
            self.layer_sliding = [self.sliding_window > 0] * self.n_layers

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def layer_window(self, i: int) -> int:
        return self.sliding_window if self.layer_sliding[i] else 0

    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    def inv_freq(self, sliding: bool = False) -> np.ndarray:
        """RoPE inverse frequencies for a layer, with the configured scaling applied."""
        theta = self.rope_theta_local if (sliding and self.rope_theta_local) else self.rope_theta
        d = self.rope_dim
        inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        sc = self.rope_scaling or {}
        kind = sc.get("rope_type") or sc.get("type") or "default"
        if sliding and self.rope_theta_local:
            kind = "default"   # Gemma 3 scales only its global layers
        if kind == "linear":
            inv = inv / float(sc["factor"])
        elif kind == "llama3":
            inv = _llama3_scale(inv, sc)
        elif kind not in ("default", "none"):
            from ..errors import ModelFormatError
            raise ModelFormatError(f"unsupported rope scaling type {kind!r}")
        return inv.astype(np.float32)

    def validate(self) -> None:
        from ..errors import ModelFormatError
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0 or v > 1 << 24:
                raise ModelFormatError(f"config {name} = {v!r} is not a sane positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ModelFormatError(f"rope dimension {self.rope_dim} invalid for head_dim {self.head_dim}")
        if len(self.layer_sliding) != self.n_layers:
            raise ModelFormatError("layer_sliding must list every layer")
        if self.activation not in ("silu", "gelu_tanh"):
            raise ModelFormatError(f"unsupported activation {self.activation!r}")
        if not (0 < self.norm_eps < 1):
            raise ModelFormatError(f"norm epsilon {self.norm_eps} out of range")


def _llama3_scale(inv: np.ndarray, sc: dict) -> np.ndarray:
    factor = float(sc["factor"])
    low = float(sc.get("low_freq_factor", 1.0))
    high = float(sc.get("high_freq_factor", 4.0))
    old_ctx = float(sc.get("original_max_position_embeddings", 8192))
    wavelen = 2 * np.pi / inv
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return np.where(is_mid, mid, scaled)

"""The two row orders of q/k projections: GGUF files of llama.cpp's "norm" RoPE architectures hold
them permuted for adjacent-pair rotation; HF files and every other GGUF architecture the half-split
layout. Rows are independent in every block format, so a permutation moves whole rows."""
from __future__ import annotations

import numpy as np

PERMUTED_GGUF_ARCHS = {"llama", "smollm3", "granite", "granitemoe", "granitehybrid", "arcee",
                       "mistral3", "olmo"}      # llama.cpp's LLAMA_ROPE_TYPE_NORM architectures among ours


def rope_permutation(n_heads: int, head_dim: int, to_interleaved: bool, rope_dim: int | None = None) -> np.ndarray:
    """Row order turning half-split q/k rows into GGUF-llama's interleaved order, or back; `rope_dim`: only a
    head's first rope_dim rows rotate (partial rotary), the others stay in place."""
    rope_dim = head_dim if rope_dim is None else rope_dim
    half = rope_dim // 2
    idx = np.arange(n_heads * head_dim).reshape(n_heads, head_dim)
    rot = idx[:, :rope_dim].reshape(n_heads, 2, half)                  # [h, j, i]: half j, pair i
    inter = np.concatenate([rot.transpose(0, 2, 1).reshape(n_heads, rope_dim), idx[:, rope_dim:]],
                           axis=1).reshape(-1)                         # row 2i+j of a head <- row j*half+i
    if to_interleaved:
        return inter
    inv = np.empty_like(inter)
    inv[inter] = np.arange(len(inter))
    return inv

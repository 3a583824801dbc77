"""The two row orders of q/k projections: GGUF files of llama.cpp's "norm" RoPE architectures hold
them permuted for adjacent-pair rotation; HF files and every other GGUF architecture the half-split
layout. Rows are independent in every block format, so a permutation moves whole rows."""
from __future__ import annotations

import numpy as np

PERMUTED_GGUF_ARCHS = {"llama", "smollm3", "granite", "granitemoe", "granitehybrid", "arcee",
                       "mistral3", "olmo"}      # llama.cpp's LLAMA_ROPE_TYPE_NORM architectures among ours


def rope_permutation(n_heads: int, head_dim: int, to_interleaved: bool) -> np.ndarray:
    """Row order turning half-split q/k rows into GGUF-llama's interleaved order, or back."""
    half = head_dim // 2
    idx = np.arange(n_heads * head_dim).reshape(n_heads, 2, half)   # [h, j, i]: half j, pair i
    inter = idx.transpose(0, 2, 1).reshape(-1)                       # row 2i+j of a head <- row j*half+i
    if to_interleaved:
        return inter
    inv = np.empty_like(inter)
    inv[inter] = np.arange(len(inter))
    return inv


def partial_rope_permutation(n_heads: int, head_dim: int, rope_dim: int, to_interleaved: bool) -> np.ndarray:
    """rope_permutation for heads whose first rope_dim rows alone rotate (Bamba's half): those rows' half-split
    pairs (i, i + rope_dim / 2) to adjacent ones (2i, 2i + 1), or back; the unrotated rows stay in place."""
    inner = rope_permutation(1, rope_dim, to_interleaved)
    head = np.concatenate([inner, np.arange(rope_dim, head_dim)])
    return (np.arange(n_heads)[:, None] * head_dim + head[None, :]).reshape(-1)

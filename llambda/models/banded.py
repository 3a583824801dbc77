"""Bidirectional attention within a band: each token of one packed text sees the tokens at most `half` positions
away on either side (the local layers of EmbeddingGemma and ModernBERT). NumPy over one text, for the texts
longer than the band, where the packed op (Backend.encoder_attention) would let a token see the whole text."""
from __future__ import annotations

import math

import numpy as np


def banded_attention(qkv: np.ndarray, a: int, b: int, n_heads: int, half: int, out: np.ndarray,
                     block: int = 256) -> None:
    """Rows [a, b) of out (n, n_heads * d): attention of the text in rows [a, b) of qkv ([q | k | v], n_heads
    heads of d each) over itself, a token seeing those at most `half` away; scores scaled by 1/sqrt(d). The
    queries go `block` rows at a time against the keys their band reaches: memory grows with block x (block +
    2 half), not with the square of the text (a text of 40,000 tokens took 6 GB a head)."""
    d = qkv.shape[1] // 3 // n_heads
    t = b - a
    heads = qkv[a:b].reshape(t, 3, n_heads, d)
    scale = np.float32(1 / math.sqrt(d))
    for r0 in range(0, t, block):
        r1 = min(t, r0 + block)
        k0, k1 = max(0, r0 - half), min(t, r1 + half)
        far = np.abs(np.arange(r0, r1)[:, None] - np.arange(k0, k1)[None, :]) > half
        for h in range(n_heads):
            q, k, v = heads[r0:r1, 0, h], heads[k0:k1, 1, h], heads[k0:k1, 2, h]
            sc = (q @ k.T) * scale
            sc[far] = -np.inf
            sc -= sc.max(axis=-1, keepdims=True)
            np.exp(sc, out=sc)
            sc /= sc.sum(axis=-1, keepdims=True)
            out[a + r0:a + r1, h * d:(h + 1) * d] = sc @ v


def long_texts(starts: np.ndarray, half: int) -> list[int]:
    """The packed texts (rows [starts[s], starts[s + 1])) a band of +-half does not cover whole."""
    return [s for s, n in enumerate(np.diff(starts)) if n - 1 > half]

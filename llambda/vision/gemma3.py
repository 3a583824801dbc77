"""Gemma 3's multimodal projector: the encoder's patch rows as a (side x side) grid, average-pooled in
(k x k) windows to tokens_per_side^2 rows (row-major), Gemma's RMSNorm x * (1 + w) with the vision
layer_norm_eps, then x @ W with W stored [vision_hidden, text_hidden] (input-major).

The norm's multiplier is kept as (1 + w): a HF checkpoint stores w, llama.cpp's and Ollama's converters
store 1 + w already; the layout says which (`soft_norm_offset`)."""
from __future__ import annotations

import numpy as np

from .config import VisionConfig
from .siglip import fetch


class Gemma3Projector:
    def __init__(self, cfg: VisionConfig, lookup, backend, soft_norm_offset: float):
        self.cfg, self.be = cfg, backend
        H, T = cfg.hidden_size, cfg.text_hidden_size
        w = fetch(lookup, "mm_input_projection_weight", (H, T))
        self.proj = backend.prepare_dense(np.ascontiguousarray(w.T), None)
        self.norm = (fetch(lookup, "mm_soft_emb_norm.weight", (H,)) + np.float32(soft_norm_offset)).astype(np.float32)
        n = cfg.mm_tokens_per_image
        self.pooled = np.empty((n, H), np.float32)
        self.normed = np.empty((n, H), np.float32)

    def forward(self, hidden: np.ndarray, out: np.ndarray) -> None:
        """hidden [P, H] (one image's last hidden state) -> out [tokens_per_image, text_hidden]."""
        c = self.cfg
        t, k, H = c.tokens_per_side, c.pool, c.hidden_size
        grid = hidden.reshape(t, k, t, k, H)
        np.mean(grid, axis=(1, 3), dtype=np.float32, out=self.pooled.reshape(t, t, H))
        self.be.rmsnorm(self.pooled, self.norm, c.layer_norm_eps, self.normed)
        self.be.dense(self.normed, self.proj, out)

"""Idefics3's connector (SmolVLM's too): the encoder's patch rows as a (side x side) grid, pixel-shuffled by
the scale factor s into (side/s)^2 rows of s*s*H values, then one linear layer without bias to the text
width (modality_projection.proj, stored [text_hidden, s*s*H] as nn.Linear holds it).

The shuffle (transformers' Idefics3Connector.pixel_shuffle): output row (i, j), at i * side/s + j, is the
concatenation of patches (s*i + a, s*j + b) for a in 0..s-1 (outer), b in 0..s-1 (inner), each H wide."""
from __future__ import annotations

import numpy as np

from .config import VisionConfig
from .siglip import fetch

PROJ = "connector.modality_projection.proj.weight"


def pixel_shuffle(hidden: np.ndarray, side: int, s: int, out: np.ndarray) -> None:
    """hidden [side*side, H] -> out [(side/s)^2, s*s*H] (see the module's note)."""
    H, t = hidden.shape[-1], side // s
    out.reshape(t, t, s, s, H)[...] = hidden.reshape(t, s, t, s, H).transpose(0, 2, 1, 3, 4)


class Idefics3Connector:
    def __init__(self, cfg: VisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        s, H, T = cfg.scale_factor, cfg.hidden_size, cfg.text_hidden_size
        self.proj = backend.prepare_dense(fetch(lookup, PROJ, (T, s * s * H)), None)
        self.shuffled = np.empty((cfg.mm_tokens_per_image, s * s * H), np.float32)

    def forward(self, hidden: np.ndarray, out: np.ndarray) -> None:
        """hidden [P, H] (one crop's last hidden state) -> out [tokens_per_image, text_hidden]."""
        pixel_shuffle(hidden, self.cfg.patches_per_side, self.cfg.scale_factor, self.shuffled)
        self.be.dense(self.shuffled, self.proj, out)

"""Row indices of matrices that checkpoints store grouped: one group after another, each holding its parts."""
from __future__ import annotations

import numpy as np


def grouped_rows(groups: int, parts: list[int]) -> list[np.ndarray]:
    """Row indices of each part of a matrix stored as `groups` consecutive groups, each holding the
    parts in order: part j's rows of every group, group by group. Qwen3-Next stores in_proj_qkvz per
    key head (q, k, then v and z of its value heads), in_proj_ba per key head (b, a), and q_proj per
    head (query, gate); DeepSeek's kv_b per head (k_nope, v)."""
    size, starts = sum(parts), np.cumsum([0] + parts[:-1])
    return [np.concatenate([g * size + st + np.arange(n) for g in range(groups)]) for st, n in zip(starts, parts)]

"""What Qwen3-VL's vision tower adds to Qwen2-VL's (qwen2vl.py runs both; the facts from transformers'
Qwen3VLVisionModel):

1. The patch embedding has a bias.
2. A learned position embedding: a side x side grid (num_position_embeddings rows of the tower's width,
   row-major) resampled to each image's patch grid gh x gw by bilinear interpolation with aligned corners, the
   result added to the patch embedding before the blocks. For patch (r, c): y = r (side - 1) / max(gh - 1, 1),
   x = c (side - 1) / max(gw - 1, 1) (float32); taps floor(y) and floor(y) + 1 (clamped to side - 1) weighted
   1 - (y - floor y) and y - floor y, the same along x; the row is the sum over the 4 taps (y0 x0, y0 x1, y1 x0,
   y1 x1) of wy * wx * grid[ty * side + tx].
3. The blocks: LayerNorms, qkv with bias, MLP linear_fc1 -> GELU (tanh) -> linear_fc2 with biases, no windows.
4. The merger (merger.norm, linear_fc1, linear_fc2): LayerNorm per patch row, each merge^2 rows joined, fc1,
   exact GELU, fc2 to the text width, as Qwen2-VL's.
5. DeepStack: after each block of deepstack_visual_indexes (in order: level j after block indexes[j]), a merger
   of its own (deepstack_merger_list.j) whose LayerNorm runs over the JOINED merge^2 rows (use_postshuffle_norm)
   gives level j's rows. An image's output is [cells, text_hidden * (1 + levels)]: the merger's rows, then each
   level's (llama.cpp's mmproj output is the same concatenation).

The tensors' names are qwen3vl_layouts.py's (each family's MLP and merger names qwen2vl_layouts.py's).
"""
from __future__ import annotations

import numpy as np


def axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """([k, 2] taps into a side-long axis, [k, 2] float32 weights) of positions `index` on an axis of `size`:
    aligned corners (position 0 -> 0, size - 1 -> side - 1), as transformers computes them in float32."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    taps = np.minimum(floor.astype(np.int64)[:, None] + np.arange(2), side - 1)
    distance = np.abs((src - floor)[:, None] - np.arange(2, dtype=np.float32))
    return taps, np.maximum(np.float32(1) - distance, np.float32(0))


def position_rows(grid: np.ndarray, rows: np.ndarray, cols: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """float32 [k, H]: the learned position grid [side * side, H] resampled (bilinear, aligned corners) at the
    patches (rows[i], cols[i]) of a gh x gw patch grid."""
    side = int(round(len(grid) ** 0.5))
    ty, wy = axis_taps(rows, gh, side)
    tx, wx = axis_taps(cols, gw, side)
    idx = (ty[:, :, None] * side + tx[:, None, :]).reshape(-1, 4)
    w = (wy[:, :, None] * wx[:, None, :]).reshape(-1, 4)
    out = grid[idx[:, 0]] * w[:, 0:1]
    for t in range(1, 4):
        out += grid[idx[:, t]] * w[:, t:t + 1]
    return out

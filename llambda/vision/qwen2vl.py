"""Qwen2.5-VL's vision transformer (and Qwen2-VL's, and Qwen3-VL's: what it adds is in qwen3vl.py) on a Backend:
one image's flattened patches -> the merger's rows, in prompt order (Qwen3-VL: each row joined with its DeepStack
levels' rows).

1. Patch embed: the Conv3d with stride = kernel is one dense product of each flattened patch [C*T*P*P] with the
   weight reshaped [H, C*T*P*P], no bias (Qwen3-VL: a bias, then the learned positions added).
2. Windows (Qwen2.5-VL): the merged grid (mh x mw cells of merge x merge patches) cut into windows of
   window_size / (patch * merge) cells a side, row-major, the last ones partial; the patch rows reordered cell
   by cell (a cell's merge^2 rows stay together) into window order before the blocks. A windowed block attends
   within each window's rows (the encoder attention's sequences); a full block (fullatt_block_indexes, every
   Qwen2-VL block) over the whole image.
3. 2D rotary positions: head dim d; inv_freq = 1 / theta^(arange(0, d/2, 2) / (d/2)) (d/4 of them); a patch's
   angles are [row * inv_freq, col * inv_freq] (d/2), rotating pairs (i, i + d/2) of q and k (rotate_half):
   the backend's encoder_rotate over the qkv rows.
4. Blocks (pre-norm): x += proj(attention(norm1(x))), qkv one product with bias laid out [q | k | v];
   x += mlp(norm2(x)). Qwen2.5-VL: RMSNorm (eps 1e-6), mlp = down(silu(gate(x)) * up(x)) with biases;
   Qwen2-VL: LayerNorm (eps 1e-6), mlp = fc2(quick_gelu(fc1(x))), quick_gelu(u) = u sigmoid(1.702 u); Qwen3-VL:
   LayerNorm, mlp = linear_fc2(gelu_tanh(linear_fc1(x))).
5. Merger: ln_q (RMSNorm; Qwen2-VL, Qwen3-VL LayerNorm) per row, each cell's merge^2 rows concatenated, Linear +
   bias, exact GELU, Linear + bias to the text width; then the cells back in row-major order. Qwen3-VL's
   DeepStack mergers run the same way after their blocks, their norm over the joined rows.

Every step is a Backend op (the rotation: encoder_rotate, with the angle tables made once an image).
Activations are sized per image (their grid varies) and freed after it: about
4 (6H + C*T*P*P) bytes a patch and the MLP's two [MLP_ROWS, F] blocks: 0.9 GB for 16384 patches of a
1280-wide tower.
"""
from __future__ import annotations

import numpy as np

from . import qwen2vl_config, qwen3vl
from .qwen2vl_layouts import MERGER_NAMES, MLP_NAMES
from .qwen3vl_layouts import PATCH_BIAS, POSITIONS, deepstack_names
from .qwen2vl_config import NORM_EPS, QwenVisionConfig
from .siglip import GELU_CHUNK, fetch

QUICK_GELU = 1.702


def window_order(mh: int, mw: int, cells: int) -> tuple[np.ndarray, list]:
    """(the cells (i * mw + j) in window order, each window's cell count): windows of cells x cells, row-major,
    the cells of each row-major inside it (0 cells: one window of everything)."""
    if cells <= 0:
        return np.arange(mh * mw), [mh * mw]
    order, sizes = [], []
    for y in range(0, mh, cells):
        for x in range(0, mw, cells):
            win = [i * mw + j for i in range(y, min(y + cells, mh)) for j in range(x, min(x + cells, mw))]
            order += win
            sizes.append(len(win))
    return np.asarray(order, np.int64), sizes


def patch_positions(gh: int, gw: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) in the patch grid of each flattened patch row (cells row-major, merge x merge inside)."""
    r = np.arange(gh).reshape(gh // m, m, 1, 1)
    c = np.arange(gw).reshape(1, 1, gw // m, m)
    rows = np.broadcast_to(r, (gh // m, m, gw // m, m)).transpose(0, 2, 1, 3).reshape(-1)
    cols = np.broadcast_to(c, (gh // m, m, gw // m, m)).transpose(0, 2, 1, 3).reshape(-1)
    return rows, cols


class QwenVisionEncoder:
    """The weights of one Qwen2(.5)-VL / Qwen3-VL vision tower on a backend, and its forward over one image at a
    time. `lookup` gives the tower's tensors by their Hugging Face names under `visual.`."""

    def __init__(self, cfg: QwenVisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, T = cfg.hidden_size, cfg.intermediate_size, cfg.text_hidden_size
        C, t, P, M = cfg.num_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.spatial_merge_size ** 2
        be, rms, qwen3 = backend, cfg.projector == "qwen2_5_vl", cfg.projector == "qwen3_vl"

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        def dense(name, rows, cols):
            return be.prepare_dense(fetch(lookup, name + ".weight", (rows, cols)), vec(name + ".bias", rows))

        def norm(name, n=H):
            return (vec(name + ".weight", n),) if rms else (vec(name + ".weight", n), vec(name + ".bias", n))

        def merger(names, norm_width):
            return norm(names[0], norm_width), dense(names[1], M * H, M * H), dense(names[2], T, M * H)

        self.patch = be.prepare_dense(fetch(lookup, "patch_embed.proj.weight", (H, C, t, P, P)).reshape(H, -1),
                                      vec(PATCH_BIAS) if qwen3 else None)
        self.positions = fetch(lookup, POSITIONS, (cfg.num_position_embeddings, H)) if qwen3 else None
        up, down, gate = MLP_NAMES[cfg.projector]
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            b = f"blocks.{i}."
            L = {"norm1": norm(b + "norm1"), "norm2": norm(b + "norm2"),
                 "qkv": dense(b + "attn.qkv", 3 * H, H), "proj": dense(b + "attn.proj", H, H),
                 "up": dense(b + up, F, H), "down": dense(b + down, H, F)}
            if gate is not None:
                L["gate"] = dense(b + gate, F, H)
            self.layers.append(L)
        self.merger = merger(MERGER_NAMES[cfg.projector], H)
        # DeepStack: the block after which each level's merger (its norm over the joined rows) runs
        self.deepstack_mergers = {layer: merger(deepstack_names(j), M * H)
                                  for j, layer in enumerate(cfg.deepstack_visual_indexes)}
        sd = cfg.head_dim // 2
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** (
            np.arange(0, sd, 2, dtype=np.float32) / np.float32(sd)))).astype(np.float32)

    def _norm(self, x, w, out) -> None:
        if len(w) == 1:
            self.be.rmsnorm(x, w[0], NORM_EPS, out)
        else:
            self.be.add_layernorm(x, None, w[0], w[1], NORM_EPS, out)

    def forward(self, pixels: np.ndarray, grid: tuple[int, int], hidden_out: np.ndarray | None = None) -> np.ndarray:
        """The merger's rows [cells, text_hidden] (row-major over the merged grid) of one image's flattened patches
        [gh * gw, C*T*P*P] with patch grid `grid` = (gh, gw) (Qwen3-VL: [cells, text_hidden * (1 + levels)], each
        row followed by its DeepStack levels' rows); hidden_out [gh * gw, H], if given, gets the last block's
        output in the patches' own order."""
        cfg, be = self.cfg, self.be
        gh, gw = grid
        m = cfg.spatial_merge_size
        M, H, F = m * m, cfg.hidden_size, cfg.intermediate_size
        n, mh, mw = gh * gw, gh // m, gw // m
        order, sizes = window_order(mh, mw, cfg.window_cells)
        rows_order = (order[:, None] * M + np.arange(M)).reshape(-1)       # patch rows in window order
        win_starts = np.concatenate([[0], np.cumsum(sizes) * M]).astype(np.int32)
        all_starts = np.array([0, n], np.int32)
        pr, pc = patch_positions(gh, gw, m)
        ang = np.concatenate([pr[rows_order].astype(np.float32)[:, None] * self.inv_freq,
                              pc[rows_order].astype(np.float32)[:, None] * self.inv_freq], axis=1)
        cos, sin = np.ascontiguousarray(np.cos(ang)), np.ascontiguousarray(np.sin(ang))

        x = np.empty((n, H), np.float32)
        h = np.empty((n, H), np.float32)
        be.dense(np.ascontiguousarray(pixels[rows_order]), self.patch, x)
        if self.positions is not None:          # a block of rows at a time: the gather's temporaries stay small
            for r in range(0, n, qwen2vl_config.MLP_ROWS):
                part, k = x[r:r + qwen2vl_config.MLP_ROWS], rows_order[r:r + qwen2vl_config.MLP_ROWS]
                be.add(part, qwen3vl.position_rows(self.positions, pr[k], pc[k], gh, gw), part)
        qkv = np.empty((n, 3 * H), np.float32)
        ctx = np.empty((n, H), np.float32)
        block = min(n, qwen2vl_config.MLP_ROWS)    # the MLP over blocks of rows: its [block, F] buffers stay small
        up = np.empty((block, F), np.float32)
        gate = np.empty((block, F), np.float32) if cfg.projector == "qwen2_5_vl" else None
        levels = []
        for i, L in enumerate(self.layers):
            self._norm(x, L["norm1"], h)
            be.dense(h, L["qkv"], qkv)
            be.encoder_rotate(qkv, cos, sin, cfg.num_attention_heads)
            be.encoder_attention(qkv, all_starts if cfg.full_attention(i) else win_starts,
                                 cfg.num_attention_heads, ctx)
            be.dense(ctx, L["proj"], h)
            be.add(x, h, x)
            self._norm(x, L["norm2"], h)
            for r in range(0, n, block):
                part, u = h[r:r + block], up[:min(block, n - r)]
                be.dense(part, L["up"], u)
                if gate is not None:
                    g = gate[:len(u)]
                    be.dense(part, L["gate"], g)
                    be.silu_mul(g, u, u)
                else:
                    self._activate(u)
                be.dense(u, L["down"], part)        # the block's input rows are spent: its output in their place
            be.add(x, h, x)
            if i in self.deepstack_mergers:
                levels.append(self._merge(x, h, self.deepstack_mergers[i], joined_norm=True))
        del qkv, ctx, up, gate
        if hidden_out is not None:
            hidden_out[rows_order] = x
        out = self._merge(x, h, self.merger, joined_norm=False)
        if levels:
            out = np.concatenate([out] + levels, axis=1)
        merged = np.empty_like(out)
        merged[order] = out             # the cells back in row-major order
        return merged

    def _merge(self, x: np.ndarray, h: np.ndarray, merger: tuple, joined_norm: bool) -> np.ndarray:
        """A merger's rows [n / merge^2, text_hidden] of the blocks' rows x [n, H] (h: scratch of x's shape):
        its norm over each row, then each merge^2 rows joined (joined_norm: joined first, the norm over the
        joined rows: Qwen3-VL's DeepStack), fc1, exact GELU, fc2."""
        be, (norm, fc1, fc2) = self.be, merger
        n, H = x.shape
        M = self.cfg.spatial_merge_size ** 2
        if joined_norm:
            src = np.empty((n // M, M * H), np.float32)
            self._norm(x.reshape(n // M, M * H), norm, src)
        else:
            self._norm(x, norm, h)
            src = h.reshape(n // M, M * H)
        mid = np.empty((n // M, M * H), np.float32)
        be.dense(src, fc1, mid)
        be.gelu_erf(mid)
        out = np.empty((n // M, self.cfg.text_hidden_size), np.float32)
        be.dense(mid, fc2, out)
        return out

    def _activate(self, u: np.ndarray) -> None:
        """The MLP's activation in place: Qwen2-VL's quick GELU u sigmoid(1.702 u), as silu(1.702 u) / 1.702;
        Qwen3-VL's tanh GELU. Each as its backend op against ones, a chunk at a time."""
        be, flat, quick = self.be, u.reshape(-1), self.cfg.projector == "qwen2_vl"
        if quick:
            be.scale(u, QUICK_GELU)
        ones = np.ones(min(GELU_CHUNK, flat.size), np.float32)
        for i in range(0, flat.size, ones.size):
            part = flat[i:i + ones.size]
            (be.silu_mul if quick else be.gelu_mul)(part, ones[:part.size], part)
        if quick:
            be.scale(u, 1 / QUICK_GELU)

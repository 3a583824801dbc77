"""GLM-4.1V / GLM-4.6V's vision tower (transformers' Glm4vVisionModel) on a Backend: one image's flattened patches
(Qwen2-VL's: glm4v_pixels.py) -> the merger's rows, row-major over the merged grid (prompt order).

1. Patch embed: the Conv3d (kernel = stride = (T, P, P), with bias) as one dense product [H, C*T*P*P]; then
   post_conv_layernorm (RMSNorm, eps rms_norm_eps).
2. Learned positions: a side x side grid (side = image_size / patch_size) resampled to the image's patch grid
   gh x gw as F.grid_sample(bicubic, align_corners False, padding border) in float32: patch (r, c) samples
   x = ((c + 0.5) / gw) 2 - 1, y = ((r + 0.5) / gh) 2 - 1, unnormalized to ((x + 1) side - 1) / 2; the 4 x 4 taps
   floor - 1 .. floor + 2 clamped to the grid (border), weighted by the cubic convolution of A = -0.75; added.
3. 2D rotary as Qwen2-VL's (qwen2vl.py: inv_freq over head_dim / 2, [row, col] angles, rotate_half pairs), no
   windows: every block attends over the whole image.
4. Blocks (pre-norm, RMSNorm eps rms_norm_eps): x += proj(attention(norm1(x))) (qkv with bias only where
   attention_bias, proj without); x += down(silu(gate(h)) * up(h)), h = norm2(x), no biases, width
   out_hidden_size.
5. post_layernorm (RMSNorm); downsample: each merged cell's merge^2 rows (contiguous: Qwen2-VL's patch order) as
   an [H, m, m] image through Conv2d(H, out_hidden, m, stride m) with bias = one dense product of the joined rows
   with the weight as [out, m, m, H]; merger: proj (no bias), LayerNorm (eps 1e-5, torch's default) with bias,
   exact GELU, then down(silu(gate(x)) * up(x)) (width intermediate_size, no biases).
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from . import glm4v_pixels
from .glm4v_config import MERGER_NORM_EPS, Glm4vVisionConfig
from .qwen2vl import patch_positions
from .qwen2vl_config import MLP_ROWS
from .siglip import fetch
from .tower import VisionTower

CUBIC_A = -0.75                  # torch's bicubic (grid_sample, interpolate)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """[k, 4] float32: the cubic convolution weights of taps floor - 1 .. floor + 2 at fraction t."""
    a = np.float32(CUBIC_A)

    def near(x):        # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):         # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    one = np.float32(1)
    return np.stack([far(t + one), near(t), near(one - t), far(2 - t)], axis=1).astype(np.float32)


def _axis(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """([k, 4] taps clamped to 0..side-1, [k, 4] weights) of patches `index` of an axis of `size` patches."""
    f = np.float32
    norm = ((index.astype(f) + f(0.5)) / f(size)) * f(2) - f(1)
    src = ((norm + f(1)) * f(side) - f(1)) / f(2)
    floor = np.floor(src)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(-1, 3), 0, side - 1)
    return taps, _cubic_weights((src - floor).astype(f))


def position_rows(grid: np.ndarray, rows: np.ndarray, cols: np.ndarray, gh: int, gw: int) -> np.ndarray:
    """float32 [k, H]: the learned grid [side * side, H] sampled at patches (rows[i], cols[i]) of a gh x gw patch
    grid (see the module's step 2): each tap row interpolated along x first, then the four along y."""
    side = int(round(len(grid) ** 0.5))
    ty, wy = _axis(rows, gh, side)
    tx, wx = _axis(cols, gw, side)
    out = np.zeros((len(rows), grid.shape[1]), np.float32)
    for i in range(4):
        line = np.zeros_like(out)
        for j in range(4):
            line += grid[ty[:, i] * side + tx[:, j]] * wx[:, j:j + 1]
        out += line * wy[:, i:i + 1]
    return out


class Glm4vEncoder:
    """The weights of one GLM-4.1V vision tower on a backend (`lookup`: its tensors by their HF names under
    `visual.`), and its forward over one image at a time."""

    def __init__(self, cfg: Glm4vVisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, T, F = cfg.hidden_size, cfg.text_hidden_size, cfg.intermediate_size
        C, t, P, m = cfg.num_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.spatial_merge_size
        be = backend

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        def dense(name, rows, cols, bias=False):
            return be.prepare_dense(fetch(lookup, name + ".weight", (rows, cols)),
                                    vec(name + ".bias", rows) if bias else None)

        self.patch = be.prepare_dense(fetch(lookup, "patch_embed.proj.weight", (H, C, t, P, P)).reshape(H, -1),
                                      vec("patch_embed.proj.bias"))
        self.post_conv = vec("post_conv_layernorm.weight")
        self.positions = fetch(lookup, "embeddings.position_embedding.weight", (cfg.position_side ** 2, H))
        self.layers = [{"norm1": vec(f"blocks.{i}.norm1.weight"), "norm2": vec(f"blocks.{i}.norm2.weight"),
                        "qkv": dense(f"blocks.{i}.attn.qkv", 3 * H, H, cfg.attention_bias),
                        "proj": dense(f"blocks.{i}.attn.proj", H, H),
                        "gate": dense(f"blocks.{i}.mlp.gate_proj", T, H), "up": dense(f"blocks.{i}.mlp.up_proj", T, H),
                        "down": dense(f"blocks.{i}.mlp.down_proj", H, T)} for i in range(cfg.num_hidden_layers)]
        self.post = vec("post_layernorm.weight")
        w = fetch(lookup, "downsample.weight", (T, H, m, m))
        self.downsample = be.prepare_dense(np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(T, m * m * H)),
                                           vec("downsample.bias", T))
        self.proj = dense("merger.proj", T, T)
        self.merger_norm = (vec("merger.post_projection_norm.weight", T), vec("merger.post_projection_norm.bias", T))
        self.gate, self.up = dense("merger.gate_proj", F, T), dense("merger.up_proj", F, T)
        self.down = dense("merger.down_proj", T, F)
        sd = cfg.head_dim // 2
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** (
            np.arange(0, sd, 2, dtype=np.float32) / np.float32(sd)))).astype(np.float32)

    def _blocks(self, x: np.ndarray, h: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
        """The blocks over x [n, H] in place (h: scratch of its shape), every one over the whole image."""
        cfg, be = self.cfg, self.be
        n, heads, eps = len(x), cfg.num_attention_heads, cfg.rms_norm_eps
        whole = np.array([0, n], np.int32)
        step = min(n, MLP_ROWS)      # the MLP a block of rows at a time: its [rows, out_hidden] buffers stay small
        bufs = {"qkv": np.empty((n, 3 * cfg.hidden_size), np.float32),
                "ctx": np.empty((n, cfg.hidden_size), np.float32),
                "gate": np.empty((step, cfg.text_hidden_size), np.float32),
                "up": np.empty((step, cfg.text_hidden_size), np.float32)}
        for L in self.layers:
            be.rmsnorm(x, L["norm1"], eps, h)
            be.dense(h, L["qkv"], bufs["qkv"])
            be.encoder_rotate(bufs["qkv"], cos, sin, heads)
            be.encoder_attention(bufs["qkv"], whole, heads, bufs["ctx"])
            be.dense(bufs["ctx"], L["proj"], h)
            be.add(x, h, x)
            be.rmsnorm(x, L["norm2"], eps, h)
            for r in range(0, n, step):
                rows = h[r:r + step]
                g, u = bufs["gate"][:len(rows)], bufs["up"][:len(rows)]
                be.dense(rows, L["gate"], g)
                be.dense(rows, L["up"], u)
                be.silu_mul(g, u, u)
                be.dense(u, L["down"], rows)       # the rows are spent: the MLP's output in their place
            be.add(x, h, x)

    def forward(self, pixels: np.ndarray, grid: tuple[int, int], hidden_out: np.ndarray | None = None) -> np.ndarray:
        """The merger's rows [cells, text_hidden] of one image's flattened patches [gh * gw, C*T*P*P] (patch grid
        `grid` = (gh, gw)); hidden_out [cells, text_hidden], if given, gets the downsample's rows (the merger's
        input)."""
        cfg, be = self.cfg, self.be
        gh, gw = grid
        m = cfg.spatial_merge_size
        H, T, eps = cfg.hidden_size, cfg.text_hidden_size, cfg.rms_norm_eps
        n, cells = gh * gw, gh * gw // (m * m)
        pr, pc = patch_positions(gh, gw, m)
        ang = np.concatenate([pr.astype(np.float32)[:, None] * self.inv_freq,
                              pc.astype(np.float32)[:, None] * self.inv_freq], axis=1)
        cos, sin = np.ascontiguousarray(np.cos(ang)), np.ascontiguousarray(np.sin(ang))

        x = np.empty((n, H), np.float32)
        h = np.empty((n, H), np.float32)
        be.dense(pixels, self.patch, h)
        be.rmsnorm(h, self.post_conv, eps, x)
        for r in range(0, n, MLP_ROWS):     # a block of rows at a time: the gather's temporaries stay small
            part = x[r:r + MLP_ROWS]
            be.add(part, position_rows(self.positions, pr[r:r + MLP_ROWS], pc[r:r + MLP_ROWS], gh, gw), part)
        self._blocks(x, h, cos, sin)
        be.rmsnorm(x, self.post, eps, h)
        down = np.empty((cells, T), np.float32) if hidden_out is None else hidden_out
        be.dense(h.reshape(cells, m * m * H), self.downsample, down)
        mid = np.empty((cells, T), np.float32)
        be.dense(down, self.proj, mid)
        normed = np.empty_like(mid)
        be.add_layernorm(mid, None, self.merger_norm[0], self.merger_norm[1], MERGER_NORM_EPS, normed)
        be.gelu_erf(normed)
        F = cfg.intermediate_size
        g, u = np.empty((cells, F), np.float32), np.empty((cells, F), np.float32)
        be.dense(normed, self.gate, g)
        be.dense(normed, self.up, u)
        be.silu_mul(g, u, u)
        out = np.empty((cells, T), np.float32)
        be.dense(u, self.down, out)
        return out


class Glm4vTower(VisionTower):
    """VisionTower's grid members (tokens_per_image None, grid() the merged grid, pixels() the flattened patches,
    encode_one()) over GLM-4.1V's encoder and processor; last_hidden_state gives the downsample's rows."""

    def __init__(self, cfg: Glm4vVisionConfig, lookup, backend, name: str = ""):
        import threading
        self.cfg, self.backend, self.name = cfg, backend, name
        self.encoder, self.projector = Glm4vEncoder(cfg, lookup, backend), None
        backend.end_load()
        self.closed = False
        self._lock = threading.Lock()

    qwen = property(lambda self: True)          # VisionTower's grid-tower paths (encode_one, its input checks)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """The MERGED token grid (rows, cols) of an image of width x height pixels as decoded."""
        for v in (width, height):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 1 << 20:
                raise InvalidInputError(f"an image's width and height must be integers in 1..{1 << 20}, got "
                                        f"{str(v)[:40]}")
        gh, gw = glm4v_pixels.patch_grid(int(width), int(height), self.cfg)
        return gh // self.cfg.spatial_merge_size, gw // self.cfg.spatial_merge_size

    def pixels(self, image) -> np.ndarray:
        return glm4v_pixels.patches(image, self.cfg)[0]

    def _hidden_shape(self, patches: int) -> tuple:
        """last_hidden_state: the downsample's rows [cells, text_hidden] (transformers' last_hidden_state, the
        merger's input)."""
        return patches // self.cfg.spatial_merge_size ** 2, self.cfg.text_hidden_size

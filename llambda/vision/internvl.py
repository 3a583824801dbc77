"""InternVL's InternViT tower and projector on a Backend (transformers' InternVLVisionModel and
InternVLMultiModalProjector), one tile at a time.

1. Patch embedding: the conv (kernel = stride = patch, with bias) as one dense product over the unfolded patches
   (row-major); the class token first, then the P patches; + the learned position table [P + 1, H] (the tile is
   always the table's size: no interpolation).
2. Blocks (pre-norm): x += lambda_1 * proj(attention(norm_before(x))); x += lambda_2 * fc2(gelu(fc1(norm_after(x))))
   with LayerNorm (weight, bias) or RMSNorm (weight) per norm_type, eps layer_norm_eps; q, k, v one product (biases
   per attention_bias); with use_qk_norm q and k each RMSNorm over the whole width (eps 1e-6) before the heads are
   split; attention both ways over the P + 1 rows; exact GELU. The layer scales are folded into proj's and fc2's
   rows and biases at load (lambda * (W a + b) = (lambda W) a + lambda b).
3. use_mean_pooling false: a final LayerNorm (`layernorm`); true (the released models): none.
4. Features: the class token dropped, the P rows as a side x side grid pixel-shuffled by s = 1 / downsample_ratio
   (output row (i, j) the concatenation of patches (s i + a, s j + b), a outer, b inner: Idefics3's order), then
   LayerNorm (eps 1e-5: nn.LayerNorm's default), linear_1, exact GELU, linear_2 to the text width.

Weights by transformers' names under the tower (`embeddings.cls_token`, `encoder.layer.N.attention.q_proj.weight`,
...) and the projector (`multi_modal_projector.linear_1.weight`, ...), through the layout's lookup.
"""
from __future__ import annotations

import functools

import numpy as np

from .idefics3 import pixel_shuffle
from .internvl_config import QK_NORM_EPS, InternVLConfig
from .siglip import fetch

PROJECTOR_EPS = 1e-5


def _vector(lookup, name: str, n: int) -> np.ndarray:
    return fetch(lookup, name, (n,))


def _scaled(lookup, name: str, shape: tuple, bias: bool, scale) -> tuple:
    """(weight, bias or None) of a linear layer, each output row times `scale` (a layer scale folded in) if given."""
    w = fetch(lookup, name + ".weight", shape)
    b = fetch(lookup, name + ".bias", shape[:1]) if bias else None
    if scale is not None:
        w *= scale[:, None]
        b = None if b is None else scale * b
    return w, b


class InternViT:
    """The tower's weights on a backend, and its forward over one tile [C, S, S] -> [P, H] (class token dropped)."""

    def __init__(self, cfg: InternVLConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, P, C, p = cfg.hidden_size, cfg.intermediate_size, cfg.n_patches, cfg.num_channels, cfg.patch_size
        be = backend

        vec = functools.partial(_vector, lookup, n=H)

        def norm(name):
            w = vec(name + ".weight")
            return (w, vec(name + ".bias")) if cfg.norm_type == "layer_norm" else (w,)

        def dense(name, rows, cols, bias=True, scale=None):
            return _scaled(lookup, name, (rows, cols), bias, scale)

        patch = fetch(lookup, "embeddings.patch_embeddings.projection.weight", (H, C, p, p)).reshape(H, C * p * p)
        self.patch = be.prepare_dense(patch, vec("embeddings.patch_embeddings.projection.bias"))
        self.cls = fetch(lookup, "embeddings.cls_token", (1, 1, H)).reshape(H)
        self.pos = fetch(lookup, "embeddings.position_embeddings", (1, P + 1, H)).reshape(P + 1, H)
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            pre = f"encoder.layer.{i}."
            a = pre + "attention."
            parts = [dense(a + n, H, H, cfg.attention_bias) for n in ("q_proj", "k_proj", "v_proj")]
            w = np.concatenate([w for w, _ in parts])
            b = np.concatenate([b for _, b in parts]) if cfg.attention_bias else None
            lam1, lam2 = vec(pre + "lambda_1"), vec(pre + "lambda_2")
            self.layers.append({
                "n1": norm(pre + "layernorm_before"),
                "qkv": be.prepare_dense(w, b),
                "qn": (vec(a + "q_norm.weight"), vec(a + "k_norm.weight")) if cfg.use_qk_norm else None,
                "o": be.prepare_dense(*dense(a + "projection_layer", H, H, scale=lam1)),
                "n2": norm(pre + "layernorm_after"),
                "fc1": be.prepare_dense(*dense(pre + "mlp.fc1", F, H)),
                "fc2": be.prepare_dense(*dense(pre + "mlp.fc2", H, F, scale=lam2)),
            })
        self.final = None if cfg.use_mean_pooling else (vec("layernorm.weight"), vec("layernorm.bias"))
        n = P + 1
        self.patches = np.empty((P, C * p * p), np.float32)
        self.x = np.empty((n, H), np.float32)
        self.h = np.empty((n, H), np.float32)
        self.qkv = np.empty((n, 3 * H), np.float32)
        self.qk = np.empty((n, H), np.float32) if cfg.use_qk_norm else None
        self.ctx = np.empty((n, H), np.float32)
        self.up = np.empty((n, F), np.float32)
        self.starts = np.array([0, n], np.int32)

    def _norm(self, x, params, out) -> None:
        if len(params) == 2:
            self.be.add_layernorm(x, None, params[0], params[1], self.cfg.layer_norm_eps, out)
        else:
            self.be.rmsnorm(x, params[0], self.cfg.layer_norm_eps, out)

    def forward(self, pixels: np.ndarray) -> np.ndarray:
        """The last layer's output [P, H] without the class token (a view of a reused buffer) of one tile."""
        cfg, be = self.cfg, self.be
        x, h, qkv, ctx, up, H = self.x, self.h, self.qkv, self.ctx, self.up, cfg.hidden_size
        g, p = cfg.patches_per_side, cfg.patch_size
        self.patches[...] = pixels.reshape(cfg.num_channels, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, -1)
        be.dense(self.patches, self.patch, x[1:])
        x[0] = self.cls
        be.add(x, self.pos, x)
        for L in self.layers:
            self._norm(x, L["n1"], h)
            be.dense(h, L["qkv"], qkv)
            if L["qn"] is not None:
                for j, w in enumerate(L["qn"]):
                    self.qk[...] = qkv[:, j * H:(j + 1) * H]
                    be.rmsnorm(self.qk, w, QK_NORM_EPS, self.qk)
                    qkv[:, j * H:(j + 1) * H] = self.qk
            be.encoder_attention(qkv, self.starts, cfg.num_attention_heads, ctx)
            be.dense(ctx, L["o"], h)
            be.add(x, h, x)
            self._norm(x, L["n2"], h)
            be.dense(h, L["fc1"], up)
            be.gelu_erf(up)
            be.dense(up, L["fc2"], h)
            be.add(x, h, x)
        if self.final is not None:
            be.add_layernorm(x, None, *self.final, cfg.layer_norm_eps, h)
            return h[1:]
        return x[1:]


class InternVLProjector:
    """Pixel shuffle, LayerNorm, linear_1, GELU, linear_2: [P, H] -> [tokens_per_image, text_hidden]."""

    def __init__(self, cfg: InternVLConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        s, H, T = cfg.scale_factor, cfg.hidden_size, cfg.text_hidden_size
        D = s * s * H
        pre = "multi_modal_projector."
        self.norm = (fetch(lookup, pre + "layer_norm.weight", (D,)), fetch(lookup, pre + "layer_norm.bias", (D,)))
        self.fc1 = backend.prepare_dense(fetch(lookup, pre + "linear_1.weight", (T, D)),
                                         fetch(lookup, pre + "linear_1.bias", (T,)))
        self.fc2 = backend.prepare_dense(fetch(lookup, pre + "linear_2.weight", (T, T)),
                                         fetch(lookup, pre + "linear_2.bias", (T,)))
        self.shuffled = np.empty((cfg.mm_tokens_per_image, D), np.float32)
        self.normed = np.empty_like(self.shuffled)
        self.mid = np.empty((cfg.mm_tokens_per_image, T), np.float32)

    def forward(self, hidden: np.ndarray, out: np.ndarray) -> None:
        be = self.be
        pixel_shuffle(hidden, self.cfg.patches_per_side, self.cfg.scale_factor, self.shuffled)
        be.add_layernorm(self.shuffled, None, *self.norm, PROJECTOR_EPS, self.normed)
        be.dense(self.normed, self.fc1, self.mid)
        be.gelu_erf(self.mid)
        be.dense(self.mid, self.fc2, out)

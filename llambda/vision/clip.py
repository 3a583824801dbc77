"""CLIP's vision transformer as LLaVA reads it (transformers' CLIPVisionTransformer): the patch embedding (a
convolution without bias, as one dense product over the unfolded patches), the class embedding first, learned
position embeddings over [class, patches], pre_layrnorm, pre-LN blocks (LayerNorm with bias; attention with
q/k/v/out biases over every row both ways; MLP fc1 -> quick_gelu (or exact GELU) -> fc2); the hidden states of the
feature layers joined along the features, the class row dropped or kept. post_layernorm is not LLaVA's (an
mmproj that holds v.post_ln has it applied to the deepest block's output, as llama.cpp does).

Weights by their Hugging Face names under the vision model (`embeddings.class_embedding`, `pre_layrnorm.weight`,
`encoder.layers.N.self_attn.q_proj.weight`, ...) through the layout's lookup; only the blocks up to the deepest
feature layer are read and run.
"""
from __future__ import annotations

import numpy as np

from .llava_config import LlavaVisionConfig
from .siglip import GELU_CHUNK, encoder_layers, fetch, run_layers

QUICK_GELU = 1.702


class ClipEncoder:
    def __init__(self, cfg: LlavaVisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, C, p = cfg.hidden_size, cfg.intermediate_size, cfg.num_channels, cfg.patch_size
        T, be = cfg.n_positions, backend

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        patch = fetch(lookup, "embeddings.patch_embedding.weight", (H, C, p, p)).reshape(H, C * p * p)
        self.patch = be.prepare_dense(patch, vec("embeddings.patch_embedding.bias") if cfg.patch_bias else None)
        self.cls = vec("embeddings.class_embedding") if cfg.has_class else None
        self.pos = fetch(lookup, "embeddings.position_embedding.weight", (T, H))
        self.pre = (vec("pre_layrnorm.weight"), vec("pre_layrnorm.bias"))
        self.post = (vec("post_layernorm.weight"), vec("post_layernorm.bias")) if cfg.post_ln else None
        self.layers = encoder_layers(lookup, be, H, F, cfg.layers_run)
        first = 1 if cfg.has_class else 0
        self.rows = slice(0 if cfg.keep_class else first, T)        # the rows a feature layer gives
        self.patches = np.empty((cfg.n_patches, C * p * p), np.float32)
        self.x = np.empty((T, H), np.float32)
        self.h = np.empty((T, H), np.float32)
        self.qkv = np.empty((T, 3 * H), np.float32)
        self.ctx = np.empty((T, H), np.float32)
        self.up = np.empty((T, F), np.float32)
        self.features = np.empty((T - self.rows.start, cfg.feature_width), np.float32)
        self.ones = np.ones(min(GELU_CHUNK, T * F), np.float32)
        self.starts = np.array([0, T], np.int32)

    def unfold(self, pixels: np.ndarray) -> None:
        """pixels [C, S, S] -> self.patches [P, C*p*p], patch (row, col) at row * side + col, (channel, y, x)."""
        c = self.cfg
        g, p = c.patches_per_side, c.patch_size
        v = pixels.reshape(c.num_channels, g, p, g, p).transpose(1, 3, 0, 2, 4)
        self.patches[...] = v.reshape(g * g, -1)

    def activate(self, u: np.ndarray) -> None:
        """The MLP's activation in place: quick GELU u sigmoid(1.702 u) as silu(1.702 u) / 1.702, or exact GELU."""
        be = self.be
        if self.cfg.hidden_act == "gelu":
            be.gelu_erf(u)
            return
        be.scale(u, QUICK_GELU)
        flat, n = u.reshape(-1), self.ones.size
        for i in range(0, flat.size, n):
            part = flat[i:i + n]
            be.silu_mul(part, self.ones[:part.size], part)
        be.scale(u, 1 / QUICK_GELU)

    def _keep(self, k: int, x: np.ndarray) -> None:
        """Hidden state k (x) into the features where it is a feature layer."""
        cfg, H = self.cfg, self.cfg.hidden_size
        for j, f in enumerate(cfg.feature_layers):
            if f == k:
                self.features[:, j * H:(j + 1) * H] = x[self.rows]

    def forward(self, pixels: np.ndarray) -> np.ndarray:
        """The feature rows [tokens, H * n_features] of one image's pixels [C, S, S] (a reused buffer)."""
        cfg, be = self.cfg, self.be
        x = self.x
        self.unfold(pixels)
        first = 1 if cfg.has_class else 0
        be.dense(self.patches, self.patch, x[first:])
        if first:
            x[0] = self.cls
        be.add(x, self.pos, x)
        be.add_layernorm(x, None, *self.pre, cfg.layer_norm_eps, x)
        self._keep(0, x)
        for k, L in enumerate(self.layers, start=1):
            run_layers(be, [L], cfg.layer_norm_eps, cfg.num_attention_heads, self.starts, x, self.h, self.qkv, self.ctx,
                       self.up, self.ones, self.activate)
            if self.post is not None and k == cfg.layers_run:
                be.add_layernorm(x, None, *self.post, cfg.layer_norm_eps, x)
            self._keep(k, x)
        return self.features

"""SigLIP's vision encoder on a Backend: the patch embedding as one dense product over the unfolded
patches, learned position embeddings, pre-LN encoder layers (LayerNorm with bias; multi-head attention
with q/k/v/out biases over all patches both ways; MLP fc1 -> gelu_tanh -> fc2), then post_layernorm.

Weights are read by their Hugging Face names under the vision model (`embeddings.patch_embedding.weight`,
`encoder.layers.N.self_attn.q_proj.weight`, ...) through a lookup the file's layout provides (layouts.py),
converted to float32 and packed once by the backend's encoder ops (prepare_dense: float32 panels in the
native backend's exact mode, bfloat16 ones in its fast mode). One image's activations are allocated at
load and reused; images of a batch run one after another.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .config import VisionConfig

GELU_CHUNK = 1 << 16      # gelu_tanh runs as gelu_mul(x, ones, x) over this many values at a time


def fetch(lookup, name: str, shape: tuple):
    """The named tensor as float32 of `shape`: ModelFormatError if it is missing, of another shape or not finite."""
    t = lookup(name)
    if t is None:
        raise ModelFormatError(f"the vision tower's tensor {name!r} is missing")
    if tuple(t.shape) != tuple(shape):
        raise ModelFormatError(f"the vision tower's tensor {name!r} has shape {list(t.shape)}, the config says "
                               f"{list(shape)}")
    a = np.array(t.to_float32(), dtype=np.float32, copy=True).reshape(shape)    # never a view of the file
    if not np.isfinite(a).all():
        raise ModelFormatError(f"the vision tower's tensor {name!r} holds non-finite values")
    return a


def encoder_layers(lookup, be, H: int, F: int, n_layers: int) -> list:
    """The pre-LN encoder layers `encoder.layers.N.*` (SigLIP's names) on backend `be`: LayerNorms with biases,
    [q | k | v] as one product, out_proj, fc1 and fc2 with biases."""
    def vec(name, n=H):
        return fetch(lookup, name, (n,))

    def dense(names, rows, cols):
        w = np.concatenate([fetch(lookup, n + ".weight", (rows, cols)) for n in names])
        b = np.concatenate([vec(n + ".bias", rows) for n in names])
        return be.prepare_dense(w, b)

    layers = []
    for i in range(n_layers):
        pre = f"encoder.layers.{i}."
        a = pre + "self_attn."
        layers.append({
            "ln1": (vec(pre + "layer_norm1.weight"), vec(pre + "layer_norm1.bias")),
            "qkv": dense([a + "q_proj", a + "k_proj", a + "v_proj"], H, H),
            "o": dense([a + "out_proj"], H, H),
            "ln2": (vec(pre + "layer_norm2.weight"), vec(pre + "layer_norm2.bias")),
            "fc1": dense([pre + "mlp.fc1"], F, H),
            "fc2": dense([pre + "mlp.fc2"], H, F),
        })
    return layers


def gelu_tanh(be, x: np.ndarray, ones: np.ndarray) -> None:
    """x = gelu_tanh(x) in place, as gelu_mul(x, ones, x) over ones.size values at a time."""
    flat, n = x.reshape(-1), ones.size
    for i in range(0, flat.size, n):
        part = flat[i:i + n]
        be.gelu_mul(part, ones[:part.size], part)


def run_layers(be, layers: list, eps: float, heads: int, starts: np.ndarray, x, h, qkv, ctx, up, ones,
               activate=None) -> None:
    """x [P, H] through encoder_layers' layers in place (h, qkv, ctx, up: scratch of P rows); attention over each
    sequence of `starts` both ways; the MLP's activation gelu_tanh, or activate(up) in place (CLIP's)."""
    for L in layers:
        be.add_layernorm(x, None, *L["ln1"], eps, h)
        be.dense(h, L["qkv"], qkv)
        be.encoder_attention(qkv, starts, heads, ctx)
        be.dense(ctx, L["o"], h)
        be.add(x, h, x)
        be.add_layernorm(x, None, *L["ln2"], eps, h)
        be.dense(h, L["fc1"], up)
        if activate is None:
            gelu_tanh(be, up, ones)
        else:
            activate(up)
        be.dense(up, L["fc2"], h)
        be.add(x, h, x)


class SiglipEncoder:
    """The weights of one SigLIP vision model on a backend, and its forward over one image at a time."""

    def __init__(self, cfg: VisionConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, P, C, p = cfg.hidden_size, cfg.intermediate_size, cfg.n_patches, cfg.num_channels, cfg.patch_size
        be = backend

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        patch = fetch(lookup, "embeddings.patch_embedding.weight", (H, C, p, p)).reshape(H, C * p * p)
        self.patch = be.prepare_dense(patch, vec("embeddings.patch_embedding.bias"))
        self.pos = fetch(lookup, "embeddings.position_embedding.weight", (P, H))
        self.layers = encoder_layers(lookup, be, H, F, cfg.num_hidden_layers)
        self.post_ln = (vec("post_layernorm.weight"), vec("post_layernorm.bias"))
        # one image's activations, reused by every forward
        self.patches = np.empty((P, C * p * p), np.float32)
        self.x = np.empty((P, H), np.float32)
        self.h = np.empty((P, H), np.float32)
        self.qkv = np.empty((P, 3 * H), np.float32)
        self.ctx = np.empty((P, H), np.float32)
        self.up = np.empty((P, F), np.float32)
        self.ones = np.ones(min(GELU_CHUNK, P * F), np.float32)
        self.starts = np.array([0, P], np.int32)

    def unfold(self, pixels: np.ndarray) -> None:
        """pixels [C, S, S] -> self.patches [P, C*p*p], patch (row, col) at row * side + col, each patch's
        values in the conv weight's order (channel, y, x); where p does not divide S, the last S mod p pixels
        of each side are not read (a "valid" convolution)."""
        c = self.cfg
        g, p = c.patches_per_side, c.patch_size
        v = pixels[:, :g * p, :g * p].reshape(c.num_channels, g, p, g, p).transpose(1, 3, 0, 2, 4)
        self.patches[...] = v.reshape(g * g, -1)

    def forward(self, pixels: np.ndarray) -> np.ndarray:
        """The last hidden state [P, H] of one image's pixel values [C, S, S] (a view of a reused buffer)."""
        cfg, be = self.cfg, self.be
        x, h, qkv, ctx, up = self.x, self.h, self.qkv, self.ctx, self.up
        self.unfold(pixels)
        be.dense(self.patches, self.patch, x)
        be.add(x, self.pos, x)
        run_layers(be, self.layers, cfg.layer_norm_eps, cfg.num_attention_heads, self.starts, x, h, qkv, ctx, up,
                   self.ones)
        be.add_layernorm(x, None, *self.post_ln, cfg.layer_norm_eps, h)
        return h

"""Pixtral's vision transformer and Mistral 3's projector on a Backend: one image's pixels [C, h', w'] -> the
projector's rows, row-major over the merged grid (the prompt's order of [IMG] tokens).

1. Patch conv (no bias): patch (r, c) of the gh x gw grid (h' / P, w' / P), its [C, P, P] values as one row,
   times the conv weight reshaped [H, C*P*P]; rows row-major. ln_pre: RMSNorm (eps 1e-5).
2. 2D rotary: head dim d; f = 1 / theta^(arange(0, d, 2) / d) (d/2 values, float32); patch (r, c) turns pair
   (j, j + d/2) of every head of q and k (rotate_half) by r f[2j] for j < d/4, by c f[2(j - d/4) + 1] after:
   the rows take the even frequencies, the columns the odd ones (transformers' axial rope).
3. Blocks (pre-norm, no biases): x += o(attention(attention_norm(x))), q, k, v one product laid out
   [q | k | v], softmax(q k^T / sqrt(d)) v over the image's own patches both ways;
   x += down(act(gate(h)) * up(h)), h = ffn_norm(x), act SiLU (GELU, erf, for hidden_act gelu); RMSNorm eps 1e-5.
   Only the blocks the projector's feature layer needs run (vision_feature_layer -1: all).
4. Projector (Mistral3MultiModalProjector): RMSNorm (eps: the text model's rms_norm_eps) per patch row; patch
   merger: merged cell (i, j) row-major, its row the 2 x 2 block's values channel-major (torch's unfold: value
   ch * 4 + 2 a + b is channel ch of patch (2i + a, 2j + b)), merging_layer [H, 4H] (no bias); linear_1 (+ bias
   if multimodal_projector_bias), exact GELU, linear_2 to the text width. Pixtral-12B's (LlavaMultiModalProjector):
   linear_1, GELU, linear_2 on each patch's row, no norm, no merger.

Activations are sized per image (the grid varies) and freed after it.
"""
from __future__ import annotations

import numpy as np

from .pixtral_config import MLP_ROWS, NORM_EPS, PixtralConfig
from .siglip import fetch

TOWER = "vision_tower."
PROJECTOR = "multi_modal_projector."


def rotary_tables(gh: int, gw: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [gh * gw, head_dim / 2] of the patches row-major (see the module's step 2)."""
    f = (np.float32(1.0) / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32)
                                                  / np.float32(head_dim)))).astype(np.float32)
    r = np.repeat(np.arange(gh, dtype=np.float32), gw)[:, None]
    c = np.tile(np.arange(gw, dtype=np.float32), gh)[:, None]
    ang = np.concatenate([r * f[0::2], c * f[1::2]], axis=1)
    return np.ascontiguousarray(np.cos(ang)), np.ascontiguousarray(np.sin(ang))


class PixtralEncoder:
    """The weights of one Pixtral tower and its projector on a backend, and the forward over one image. `lookup`
    gives tensors by their Hugging Face names (vision_tower.*, multi_modal_projector.*)."""

    def __init__(self, cfg: PixtralConfig, lookup, backend):
        self.cfg, self.be = cfg, backend
        H, F, T, C, P = (cfg.hidden_size, cfg.intermediate_size, cfg.text_hidden_size, cfg.num_channels,
                         cfg.patch_size)
        be, m2 = backend, cfg.spatial_merge_size ** 2

        def vec(name, n=H):
            return fetch(lookup, name, (n,))

        def dense(name, rows, cols, bias=False):
            return be.prepare_dense(fetch(lookup, name + ".weight", (rows, cols)),
                                    vec(name + ".bias", rows) if bias else None)

        self.patch = be.prepare_dense(fetch(lookup, TOWER + "patch_conv.weight", (H, C, P, P)).reshape(H, -1), None)
        self.ln_pre = vec(TOWER + "ln_pre.weight")
        self.layers = []
        for i in range(cfg.layers_run):
            b = f"{TOWER}transformer.layers.{i}."
            qkv = np.concatenate([fetch(lookup, f"{b}attention.{x}_proj.weight", (H, H)) for x in "qkv"])
            self.layers.append({
                "attention_norm": vec(b + "attention_norm.weight"), "ffn_norm": vec(b + "ffn_norm.weight"),
                "qkv": be.prepare_dense(qkv, None), "o": dense(b + "attention.o_proj", H, H),
                "gate": dense(b + "feed_forward.gate_proj", F, H), "up": dense(b + "feed_forward.up_proj", F, H),
                "down": dense(b + "feed_forward.down_proj", H, F)})
        self.norm = vec(PROJECTOR + "norm.weight") if cfg.merger else None
        self.merge = dense(PROJECTOR + "patch_merger.merging_layer", H, m2 * H) if cfg.merger else None
        self.linear_1 = dense(PROJECTOR + "linear_1", T, H, cfg.projector_bias)
        self.linear_2 = dense(PROJECTOR + "linear_2", T, T, cfg.projector_bias)

    def forward(self, pixels: np.ndarray, hidden_out: np.ndarray | None = None) -> np.ndarray:
        """The projector's rows [cells, text_hidden] of one image's pixels [C, h', w'] (h', w' multiples of patch x
        merge); hidden_out [patches, H], if given, gets the feature layer's hidden state (before the projector)."""
        cfg, be = self.cfg, self.be
        H, P, m = cfg.hidden_size, cfg.patch_size, cfg.spatial_merge_size
        C, hp, wp = pixels.shape
        gh, gw = hp // P, wp // P
        n = gh * gw
        patches = np.ascontiguousarray(pixels.reshape(C, gh, P, gw, P).transpose(1, 3, 0, 2, 4).reshape(n, C * P * P))
        x = np.empty((n, H), np.float32)
        h = np.empty((n, H), np.float32)
        be.dense(patches, self.patch, h)
        del patches
        be.rmsnorm(h, self.ln_pre, NORM_EPS, x)
        if self.layers:
            self._blocks(x, h, gh, gw)
        if hidden_out is not None:
            hidden_out[...] = x
        mh, mw = gh // m, gw // m
        if self.merge is not None:
            be.rmsnorm(x, self.norm, cfg.projector_eps, h)
            joined = np.ascontiguousarray(h.reshape(mh, m, mw, m, H).transpose(0, 2, 4, 1, 3)
                                          .reshape(mh * mw, H * m * m))
            del x, h
            merged = np.empty((mh * mw, H), np.float32)
            be.dense(joined, self.merge, merged)
        else:               # Pixtral-12B's LLaVA projector: the patches' rows straight into linear_1
            merged = x
        mid = np.empty((mh * mw, cfg.text_hidden_size), np.float32)
        be.dense(merged, self.linear_1, mid)
        be.gelu_erf(mid)
        out = np.empty_like(mid)
        be.dense(mid, self.linear_2, out)
        return out

    def _blocks(self, x: np.ndarray, h: np.ndarray, gh: int, gw: int) -> None:
        cfg, be = self.cfg, self.be
        n, H, F, heads = gh * gw, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
        cos, sin = rotary_tables(gh, gw, cfg.head_dim, cfg.rope_theta)
        starts = np.array([0, n], np.int32)
        qkv = np.empty((n, 3 * H), np.float32)
        ctx = np.empty((n, H), np.float32)
        block = min(n, MLP_ROWS)
        up = np.empty((block, F), np.float32)
        gate = np.empty((block, F), np.float32)
        for L in self.layers:
            be.rmsnorm(x, L["attention_norm"], NORM_EPS, h)
            be.dense(h, L["qkv"], qkv)
            be.encoder_rotate(qkv, cos, sin, heads)
            be.encoder_attention(qkv, starts, heads, ctx)
            be.dense(ctx, L["o"], h)
            be.add(x, h, x)
            be.rmsnorm(x, L["ffn_norm"], NORM_EPS, h)
            for r in range(0, n, block):
                part, u, g = h[r:r + block], up[:min(block, n - r)], gate[:min(block, n - r)]
                be.dense(part, L["up"], u)
                be.dense(part, L["gate"], g)
                if cfg.hidden_act == "silu":
                    be.silu_mul(g, u, u)
                else:               # Pixtral-12B's exact GELU: the backend's op, then the product in NumPy
                    be.gelu_erf(g)
                    np.multiply(g, u, out=u)
                be.dense(u, L["down"], part)
            be.add(x, h, x)

"""DeepSeek's multi-head latent attention (MLA) in the transformer: its weights regrouped at load, its
workspace buffers, and its two forwards (the architecture's facts are models/deepseek2.py's).

Compressed (the default): one cache row a token, [R k_pe, c] (c the normed compressed kv, R RoPE), read
by every head as its key and, its c part, as its value (multi-query attention). A head's query is
[R q_pe, q_nope W_uk] (W_uk its key rows of kv_b: q_nope . (W_uk c) taken as (q_nope W_uk) . c), its
output W_uv (its c part of attention's output): the same scores and values as the expanded heads', in
kv_lora_rank + qk_rope values a token. Expanded (LLAMBDA_MLA_EXPANDED=1, or a compressed row wider than
the backend's attention takes): ordinary heads, every head's full key and its value padded to the key's
width, cached.

`LatentAttention` is mixed into models/base.py's Transformer, which calls `_mla_weights` for a layer's
weights and `_mla_attention` for its token mixer; its methods use the transformer's cfg, backend, ws,
cache, kv_layer, inv_freq, mla_compressed, _pre_norm and _residual_add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import switches
from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .deepseek2 import absorbed_key_heads
from .row_groups import grouped_rows


@dataclass
class MLAWeights:
    """DeepSeek's multi-head latent attention, its projections regrouped at load: q rows per head
    [rope dims, nope dims] (the rope op rotates a head's first dims); kv_a_proj_with_mqa split into the
    compressed kv (w_ckv) and the shared rope key (w_kpe); kv_b_proj into k_nope and v rows (w_knope, w_v:
    expanded), or per head into the transposed key part and the value part (uk, uv: compressed)."""
    wq: object                        # (heads (rope + nope), d_model), or from q_lora_rank with wq_a
    wq_a: object                      # (q_lora_rank, d_model) or None
    q_a_norm: np.ndarray | None       # (q_lora_rank,)
    w_ckv: object                     # (kv_lora_rank, d_model)
    w_kpe: object                     # (rope_dim, d_model)
    kv_a_norm: np.ndarray             # (kv_lora_rank,)
    w_knope: object                   # (heads qk_nope_dim, kv_lora_rank), or None
    w_v: object                       # (heads v_head_dim, kv_lora_rank), or None
    uk: list | None = None            # per head (kv_lora_rank, qk_nope_dim): q_nope -> the latent's query
    uv: list | None = None            # per head (v_head_dim, kv_lora_rank): attention's latent -> the value


def mla_compressed(cfg: TransformerConfig, backend=None) -> bool:
    """Whether latent attention caches its compressed rows (the default), or runs expanded into ordinary
    heads (LLAMBDA_MLA_EXPANDED on: a cache n_heads (qk_nope + qk_rope) / (kv_lora_rank + qk_rope) times
    larger times 2, kept to compare against). Also expanded where the compressed row is wider than
    `backend`'s attention takes (the native core's 576) and the expanded heads are not: the model still runs."""
    if not cfg.mla or switches.flag("LLAMBDA_MLA_EXPANDED", False):
        return False
    limit = getattr(backend, "max_head_dim", None)
    return limit is None or cfg.rope_dim + cfg.kv_lora_rank <= limit or cfg.head_dim > limit


def add_workspace_specs(specs: dict, cfg: TransformerConfig, t: int, compressed: bool) -> None:
    """Latent attention's buffers in a workspace of `t` tokens (models/base.py's Workspace `specs`, whose q,
    and expanded also k, v and attn, hold the expanded heads): compressed, the cache row, the query and
    attention's output rows and two head-major scratches instead of k, v and attn."""
    f32 = np.float32
    H, r, hv, hn = cfg.n_heads, cfg.kv_lora_rank, cfg.n_heads * cfg.v_head_dim, cfg.n_heads * cfg.qk_nope_dim
    specs.update({"mla_c": ((t, r), f32), "mla_kpe": ((t, cfg.rope_dim), f32), "mla_out": ((t, hv), f32)})
    if compressed:
        for name in ("k", "v", "attn"):       # the expanded heads' only
            del specs[name]
        w = cfg.rope_dim + r
        specs.update({"mla_kc": ((t, 1, w), f32), "mla_qc": ((t, H, w), f32), "mla_att": ((t, H, w), f32),
                      "mla_hin": ((H * t * max(cfg.qk_nope_dim, r),), f32),
                      "mla_hout": ((H * t * max(r, cfg.v_head_dim),), f32)})
    else:
        specs.update({"mla_knope": ((t, hn), f32), "mla_v": ((t, hv), f32)})
    if cfg.q_lora_rank:
        specs["mla_qa"] = ((t, cfg.q_lora_rank), f32)


def per_head_matmuls(B, src, weights: list, dst, n: int, k: int, m: int) -> None:
    """One matmul a head over head-major scratch: head g's n rows of k values (src[g n k:(g + 1) n k]) times
    weights[g] into its n rows of m values (dst[g n m:(g + 1) n m])."""
    for g, w in enumerate(weights):
        B.matmul(src[g * n * k:(g + 1) * n * k].reshape(n, k), w, dst[g * n * m:(g + 1) * n * m].reshape(n, m))


class LatentAttention:
    """Latent attention's loading and forward, as methods of the Transformer they are mixed into."""

    def _mla_weights(self, p: str, get: Callable, need: Callable, matrix: Callable, vector: Callable) -> MLAWeights:
        """Layer prefix p's latent attention weights, read through the loader's own `get`, `need`, `matrix` and
        `vector` (models/base.py's Transformer._load)."""
        cfg, B, d = self.cfg, self.backend, self.cfg.d_model
        H, nope, rope, vd, kvr, qr = (cfg.n_heads, cfg.qk_nope_dim, cfg.rope_dim, cfg.v_head_dim, cfg.kv_lora_rank,
                                      cfg.q_lora_rank)
        q_rows = [np.concatenate([h * (nope + rope) + nope + np.arange(rope), h * (nope + rope) + np.arange(nope)])
                  for h in range(H)]
        q_order = [np.concatenate(q_rows)]
        if qr:
            wq_a, q_a_norm = matrix(p + "attn_q_a.weight", qr, d), vector(p + "attn_q_a_norm.weight", qr)
            wq = matrix(p + "attn_q_b.weight", H * (nope + rope), qr, q_order)[0]
        else:
            wq_a, q_a_norm, wq = None, None, matrix(p + "attn_q.weight", H * (nope + rope), d, q_order)[0]
        w_ckv, w_kpe = matrix(p + "attn_kv_a_mqa.weight", kvr + rope, d, [np.arange(kvr), kvr + np.arange(rope)])
        norm = vector(p + "attn_kv_a_norm.weight", kvr)
        if not self.mla_compressed:
            w_knope, w_v = matrix(p + "attn_kv_b.weight", H * (nope + vd), kvr, grouped_rows(H, [nope, vd]))
            return MLAWeights(wq=wq, wq_a=wq_a, q_a_norm=q_a_norm, w_ckv=w_ckv, w_kpe=w_kpe, kv_a_norm=norm,
                              w_knope=w_knope, w_v=w_v)
        kb, vb = get(p + "attn_k_b.weight"), get(p + "attn_v_b.weight")
        if kb is not None and vb is not None:   # a newer GGUF's halves are the per-head matrices, in their type
            uk = self._mla_per_head(kb, (H, kvr, nope))
            uv = self._mla_per_head(vb, (H, vd, kvr))
        else:
            v_rows = grouped_rows(H, [nope, vd])[1].reshape(H, vd)
            uv = matrix(p + "attn_kv_b.weight", H * (nope + vd), kvr, list(v_rows))
            uk = [B.prepare_matrix(t) for t in absorbed_key_heads(need(p + "attn_kv_b.weight"), cfg)]
        return MLAWeights(wq=wq, wq_a=wq_a, q_a_norm=q_a_norm, w_ckv=w_ckv, w_kpe=w_kpe, kv_a_norm=norm,
                          w_knope=None, w_v=None, uk=uk, uv=uv)

    def _mla_per_head(self, t: WeightTensor, shape: tuple) -> list:
        """A 3-D (heads, rows, cols) tensor as one matrix per head."""
        if tuple(t.shape) != shape:
            raise ModelFormatError(f"tensor {t.name!r} has shape {tuple(t.shape)}, expected {shape}")
        H, rows, cols = shape
        flat = WeightTensor(t.name, t.qtype, (H * rows, cols), t.data)
        out = [self.backend.prepare_matrix(flat.take_rows(h * rows + np.arange(rows))) for h in range(H)]
        self._release(t.data)
        return out

    def _mla_attention(self, i: int, L, x, slot, p) -> None:
        """Layer i's latent attention, x += its output: over the compressed cache, or the expanded heads'."""
        if self.mla_compressed:
            self._mla_compressed_block(i, L, x, slot, p)
        else:
            self._mla_block(i, L, x, slot, p)

    def _mla_block(self, i: int, L, x, slot, p) -> None:
        """DeepSeek's latent attention expanded into ordinary attention: per head the key [R k_pe, k_nope] (k_pe
        shared by the heads), the query [R q_pe, q_nope] (R: RoPE) and the value v zero-padded to head_dim,
        all cached; the heads' values (their first v_head_dim dims) through the output projection."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        M, n = L.mla, len(x)
        H, D, rope, nope, vd = cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.qk_nope_dim, cfg.v_head_dim
        q, k, v, attn, proj = ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n], ws.proj[:n]
        knope, vv, out = ws.mla_knope[:n], ws.mla_v[:n], ws.mla_out[:n]
        c, kpe = self._mla_project(i, L, x, p)
        B.matmul_many(c, (M.w_knope, M.w_v), (knope, vv))
        B.copy_blocks(kpe, k, n, H, rope, (rope, 0, 0), (H * D, D, 0))             # every head's k_pe
        B.copy_blocks(knope, k, n, H, nope, (H * nope, nope, 0), (H * D, D, rope))
        B.copy_blocks(vv, v, n, H, vd, (H * vd, vd, 0), (H * D, D, 0))            # v's pad stays 0 (never written)
        kv = self.kv_layer[i]
        B.kv_store(self.cache, kv, k, v, slot, p)
        B.attention(q, self.cache, kv, slot, p, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap)
        B.copy_blocks(attn, out, n, H, vd, (H * D, D, 0), (H * vd, vd, 0))
        B.matmul(out, L.wo, proj)
        self._residual_add(x, proj)

    def _mla_project(self, i: int, L, x, p):
        """Latent attention's projections of the normed x: the query heads [R q_pe, q_nope] into ws.q, the
        normed compressed kv and the rotated shared k_pe (R: RoPE), returned."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        M, n = L.mla, len(x)
        h, q, c, kpe = ws.h[:n], ws.q[:n], ws.mla_c[:n], ws.mla_kpe[:n]
        h = self._pre_norm(x, L.attn_norm, h)
        q2 = q.reshape(n, -1)
        if M.wq_a is not None:
            qa = ws.mla_qa[:n]
            B.matmul_many(h, (M.wq_a, M.w_ckv, M.w_kpe), (qa, c, kpe))
            B.rmsnorm(qa, M.q_a_norm, cfg.norm_eps, qa)
            B.matmul(qa, M.wq, q2)
        else:
            B.matmul_many(h, (M.wq, M.w_ckv, M.w_kpe), (q2, c, kpe))
        B.rmsnorm(c, M.kv_a_norm, cfg.norm_eps, c)
        inv_freq = self.inv_freq[cfg.layer_sliding[i]]
        B.rope(q, p, inv_freq, cfg.rope_neox)
        B.rope(kpe.reshape(n, 1, cfg.rope_dim), p, inv_freq, cfg.rope_neox)
        return c, kpe

    def _mla_compressed_block(self, i: int, L, x, slot, p) -> None:
        """Latent attention over the compressed cache (the module's docstring). The per-head products go
        through head-major scratch rows (head g's n rows together), one matmul a head (per_head_matmuls)."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        M, n = L.mla, len(x)
        H, D, rope, nope, vd, r = (cfg.n_heads, cfg.head_dim, cfg.rope_dim, cfg.qk_nope_dim, cfg.v_head_dim,
                                   cfg.kv_lora_rank)
        W = rope + r
        q, kc, qc, att, out, proj = ws.q[:n], ws.mla_kc[:n], ws.mla_qc[:n], ws.mla_att[:n], ws.mla_out[:n], ws.proj[:n]
        hin, hout = ws.mla_hin, ws.mla_hout
        c, kpe = self._mla_project(i, L, x, p)
        B.copy_blocks(kpe, kc, n, 1, rope, (rope, 0, 0), (W, 0, 0))
        B.copy_blocks(c, kc, n, 1, r, (r, 0, 0), (W, 0, rope))
        B.copy_blocks(q, qc, n, H, rope, (H * D, D, 0), (H * W, W, 0))                 # every head's R q_pe
        B.copy_blocks(q, hin, n, H, nope, (H * D, D, rope), (nope, n * nope, 0))       # q_nope, head-major
        per_head_matmuls(B, hin, M.uk, hout, n, nope, r)                               # q_nope W_uk
        B.copy_blocks(hout, qc, n, H, r, (r, n * r, 0), (H * W, W, rope))
        kv = self.kv_layer[i]
        B.kv_store(self.cache, kv, kc, kc, slot, p)
        B.attention(qc, self.cache, kv, slot, p, att, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap)
        B.copy_blocks(att, hin, n, H, r, (H * W, W, rope), (r, n * r, 0))              # the c part, head-major
        per_head_matmuls(B, hin, M.uv, hout, n, r, vd)                                 # W_uv of it
        B.copy_blocks(hout, out, n, H, vd, (vd, n * vd, 0), (H * vd, vd, 0))
        B.matmul(out, L.wo, proj)
        self._residual_add(x, proj)

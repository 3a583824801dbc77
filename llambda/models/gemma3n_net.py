"""Gemma 3n's decoder layers and what surrounds them (models/gemma3n.py reads the hyper-parameters):
weights loaded once, then each forward written against the Backend interface, into Workspace buffers
(workspace_specs) allocated at load. models/base.Transformer embeds the tokens, dispatches its layers
here, and applies the final norm, the tied head and the soft cap.

Per forward of n tokens (A streams of d values, L layers, p per-layer values):
- per-layer inputs: (table[tok] sqrt(p) + norm(W_pl x0 / sqrt(d))) / sqrt(2), kept layer-major (L, n, p);
- streams: X0 = x0 (the scaled embedding), Xk = rms_match(W_k x0, x0);
- each layer: P = predict(X); a = P[active]; h = norm(a); attention and LAuReL on h; FFN; X = correct(P, the
  layer's output); the per-layer input gates a projection added to streams 1..A-1;
- then x = mean(X0, rms_match(U_k Xk, X0)), which base.py's head norms and projects.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


_SQRT_HALF = float(1 / np.sqrt(2.0))


@dataclass
class Gemma3nLayer:
    attn_norm: np.ndarray
    wq: object
    wk: object                       # None in a layer that shares another's keys and values
    wv: object
    wo: object
    q_norm: np.ndarray
    k_norm: np.ndarray | None
    post_attn_norm: np.ndarray
    ffn_norm: np.ndarray
    w_gate: object
    w_up: object
    w_down: object
    post_ffn_norm: np.ndarray
    router_norm: np.ndarray          # the router's norm weight over d (its input's 1/d folded in)
    router: object                   # (A, d)
    predict_coef: object             # (A * A, A)
    correct_coef: object             # (A, A)
    correct_scale: np.ndarray | None  # (d,) or None (altup_correct_scale false)
    laurel_l: object                 # (rank, d)
    laurel_r: object                 # (d, rank)
    laurel_norm: np.ndarray
    inp_gate: object                 # (p, d)
    proj: object                     # (d, p)
    post_norm: np.ndarray
    sparsity: float | None           # the gate's std multiplier, or None
    moe: object = None               # (base.Transformer asks every layer)


def workspace_specs(cfg, t: int) -> dict:
    """The buffers Gemma 3n's forward adds to the Workspace, for t tokens."""
    A, d, p, L = cfg.altup_inputs, cfg.d_model, cfg.per_layer_dim, cfg.n_layers
    f32 = np.float32
    # the streams and the per-layer inputs flat: a batch of n tokens uses their first A n d (L n p) values
    return {"g3_x": ((A * t * d,), f32), "g3_pred": ((A * t * d,), f32), "g3_act": ((t, d), f32),
            "g3_laurel": ((t, d), f32), "g3_rank": ((t, cfg.laurel_rank), f32), "g3_mod": ((t, A), f32),
            "g3_coef": ((t, A * A), f32), "g3_cc": ((t, A), f32), "g3_ple": ((L * t * p,), f32), "g3_pl_a": ((t, L * p), f32),
            "g3_pl_b": ((t, L * p), f32), "g3_gate": ((t, p), f32), "g3_ids": ((t,), np.int32)}


class Gemma3nNet:
    """The weights outside the plain transformer's, and the forward over them."""

    def __init__(self, cfg, get, matrix, vector):
        """`matrix(name, rows, cols)`, `vector(name, n, ...)`: the Transformer loader's (shape-checked,
        prepared by the backend, the file's pages let go); `get` its lookup."""
        self.cfg = cfg
        A, d, p, L = cfg.altup_inputs, cfg.d_model, cfg.per_layer_dim, cfg.n_layers
        self.ple_table = self._per_layer_table(get, matrix)
        self.ple_proj = matrix("per_layer_model_proj.weight", L * p, d)
        self.ple_norm = vector("per_layer_proj_norm.weight", p)
        self.altup_proj = [matrix(f"altup_proj.{k}.weight", d, d) for k in range(A - 1)]
        self.altup_unembd = [matrix(f"altup_unembd_proj.{k}.weight", d, d) for k in range(A - 1)]
        self.ones_d = np.ones(cfg.head_dim, np.float32)      # the value norm has no weight
        self.ones_a = np.ones(A, np.float32)                  # the correction's coefficients + 1
        self.layers = [self._layer(i, get, matrix, vector) for i in range(L)]

    def _per_layer_table(self, get, matrix):
        """The per-layer embedding table: a checkpoint's holds vocab_size_per_layer_input rows (ids past them
        take row 0, transformers' rule: ids_below at each forward), a GGUF file's vocab_size (llama.cpp's
        converter pads zero rows)."""
        cfg = self.cfg
        width = cfg.n_layers * cfg.per_layer_dim
        t = get("per_layer_token_embd.weight")
        self.ple_rows = cfg.per_layer_vocab if t is not None and t.rows == cfg.per_layer_vocab else cfg.vocab_size
        return matrix("per_layer_token_embd.weight", self.ple_rows, width)

    def _layer(self, i: int, get, matrix, vector) -> Gemma3nLayer:
        cfg = self.cfg
        A, d, p, f, hd = cfg.altup_inputs, cfg.d_model, cfg.per_layer_dim, cfg.ffn_dim, cfg.head_dim
        b = f"blk.{i}."
        own = cfg.kv_source(i) == i
        if not own:     # a checkpoint may still hold them (transformers ignores them): read, not used
            for leaf in ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight"):
                get(b + leaf)
        router_norm = vector(b + "altup_router_norm.weight", d) / np.float32(d)
        return Gemma3nLayer(
            attn_norm=vector(b + "attn_norm.weight", d),
            wq=matrix(b + "attn_q.weight", cfg.q_dim, d),
            wk=matrix(b + "attn_k.weight", cfg.kv_dim, d) if own else None,
            wv=matrix(b + "attn_v.weight", cfg.kv_dim, d) if own else None,
            wo=matrix(b + "attn_output.weight", d, cfg.q_dim),
            q_norm=vector(b + "attn_q_norm.weight", hd),
            k_norm=vector(b + "attn_k_norm.weight", hd) if own else None,
            post_attn_norm=vector(b + "post_attention_norm.weight", d),
            ffn_norm=vector(b + "ffn_norm.weight", d),
            w_gate=matrix(b + "ffn_gate.weight", f, d), w_up=matrix(b + "ffn_up.weight", f, d),
            w_down=matrix(b + "ffn_down.weight", d, f),
            post_ffn_norm=vector(b + "post_ffw_norm.weight", d),
            router_norm=router_norm.astype(np.float32),
            router=matrix(b + "altup_router.weight", A, d),
            predict_coef=matrix(b + "altup_predict_coef.weight", A * A, A),
            correct_coef=matrix(b + "altup_correct_coef.weight", A, A),
            correct_scale=vector(b + "altup_correct_scale.weight", d) if cfg.altup_correct_scale else
            self._unused(get, b + "altup_correct_scale.weight"),
            laurel_l=matrix(b + "laurel_l.weight", cfg.laurel_rank, d),
            laurel_r=matrix(b + "laurel_r.weight", d, cfg.laurel_rank),
            laurel_norm=vector(b + "laurel_post_norm.weight", d),
            inp_gate=matrix(b + "inp_gate.weight", p, d), proj=matrix(b + "proj.weight", d, p),
            post_norm=vector(b + "post_norm.weight", d),
            sparsity=cfg.sparsity[i])

    @staticmethod
    def _unused(get, name: str):
        get(name)       # a checkpoint holds it whatever altup_correct_scale says
        return None

    # -- the forward ----------------------------------------------------------
    def forward(self, model, x, slot, pos) -> np.ndarray:
        """Run every layer on x (n, d), the scaled embeddings of model.ws.tokens[:n]; returns the merged
        hidden states (in x) for the head."""
        cfg, B, ws = self.cfg, model.backend, model.ws
        n, A, d, p, L = len(x), cfg.altup_inputs, cfg.d_model, cfg.per_layer_dim, cfg.n_layers
        X, P = ws.g3_x[:A * n * d].reshape(A, n, d), ws.g3_pred[:A * n * d].reshape(A, n, d)
        ple = ws.g3_ple[:L * n * p].reshape(L, n, p)
        self._per_layer_inputs(model, x, ple)
        B.copy_blocks(x, X[0], n, 1, d, (d, 0, 0), (d, 0, 0))
        for k in range(1, A):
            B.matmul(x, self.altup_proj[k - 1], X[k])
            B.rms_match(X[k], x, X[k])
        for i, layer in enumerate(self.layers):
            self._layer_forward(model, i, layer, X, P, ple[i], slot, pos)
        for k in range(1, A):            # the streams back to one: stream 0's magnitude, their mean
            B.matmul(X[k], self.altup_unembd[k - 1], P[k])
            B.rms_match(P[k], X[0], P[k])
        B.copy_blocks(X[0], x, n, 1, d, (d, 0, 0), (d, 0, 0))
        for k in range(1, A):
            B.add(x, P[k], x)
        B.scale(x, 1.0 / A)
        return x

    def _per_layer_inputs(self, model, x, ple) -> None:
        cfg, B, ws = self.cfg, model.backend, model.ws
        n, p, L = len(x), cfg.per_layer_dim, cfg.n_layers
        emb, proj = ws.g3_pl_a[:n], ws.g3_pl_b[:n]
        ids = ws.tokens[:n]
        if self.ple_rows < cfg.vocab_size:
            B.ids_below(ids, self.ple_rows, ws.g3_ids[:n])
            ids = ws.g3_ids[:n]
        B.embed(self.ple_table, ids, emb)
        B.scale(emb, float(np.sqrt(np.float32(p))))
        B.matmul(x, self.ple_proj, proj)
        B.scale(proj, float(cfg.d_model ** -0.5))
        flat = proj.reshape(n * L, p)
        B.rmsnorm(flat, self.ple_norm, cfg.norm_eps, flat)
        B.add(proj, emb, proj)
        B.scale(proj, _SQRT_HALF)
        B.copy_blocks(proj, ple, n, L, p, (L * p, p, 0), (p, n * p, 0))   # layer-major

    def _modalities(self, model, layer: Gemma3nLayer, a, out) -> None:
        """tanh(router(norm(a) / d)): the streams' per-token coefficients' input."""
        B, ws = model.backend, model.ws
        h = ws.h[:len(a)]
        B.rmsnorm(a, layer.router_norm, self.cfg.norm_eps, h)
        B.matmul(h, layer.router, out)
        B.softcap(out, 1.0)

    def _layer_forward(self, model, i: int, L: Gemma3nLayer, X, P, ple, slot, pos) -> None:
        cfg, B, ws = self.cfg, model.backend, model.ws
        n, A, act = X.shape[1], cfg.altup_inputs, cfg.altup_active
        mod, coef = ws.g3_mod[:n], ws.g3_coef[:n]
        h, a, lo, proj = ws.h[:n], ws.g3_act[:n], ws.g3_laurel[:n], ws.proj[:n]
        # predict
        self._modalities(model, L, X[act], mod)
        B.matmul(mod, L.predict_coef, coef)
        B.altup_predict(X, coef, P)
        # attention and LAuReL on the normed active prediction
        B.rmsnorm(P[act], L.attn_norm, cfg.norm_eps, h)
        B.matmul(h, L.laurel_l, ws.g3_rank[:n])
        B.matmul(ws.g3_rank[:n], L.laurel_r, lo)
        B.rmsnorm(lo, L.laurel_norm, cfg.norm_eps, lo)
        B.add(lo, h, lo)
        self._attention(model, i, L, h, proj, slot, pos)
        B.rmsnorm(proj, L.post_attn_norm, cfg.norm_eps, proj)
        B.add(P[act], proj, a)
        B.add(a, lo, a)
        B.scale(a, _SQRT_HALF)
        # the MLP (its gate sparse on the first layers)
        gate, up = ws.gate[:n], ws.up[:n]
        B.rmsnorm(a, L.ffn_norm, cfg.norm_eps, h)
        B.matmul_many(h, (L.w_gate, L.w_up), (gate, up))
        if L.sparsity is not None:
            B.gaussian_topk(gate, L.sparsity)
        B.gelu_mul(gate, up, gate)
        B.matmul(gate, L.w_down, proj)
        B.rmsnorm(proj, L.post_ffn_norm, cfg.norm_eps, proj)
        B.add(a, proj, a)
        # correct every stream by the active one's innovation
        self._modalities(model, L, a, mod)
        cc = ws.g3_cc[:n]
        B.matmul(mod, L.correct_coef, cc)
        B.add_rows(cc, self.ones_a, cc)
        B.altup_correct(P, cc, a, act, X)
        # the per-layer input, gated by the corrected active stream, into streams 1..A-1
        first = X[act]
        if L.correct_scale is not None:
            B.mul_rows(first, L.correct_scale, h)
            first = h
        g = ws.g3_gate[:n]
        B.matmul(first, L.inp_gate, g)
        B.gelu_mul(g, ple, g)
        B.matmul(g, L.proj, proj)
        B.rmsnorm(proj, L.post_norm, cfg.norm_eps, proj)
        for k in range(1, A):
            B.add(X[k], proj, X[k])

    def _attention(self, model, i: int, L: Gemma3nLayer, h, out, slot, pos) -> None:
        """out = o_proj(attention(q, K, V)) of the normed h: q, k RMS-normed per head with weights, v without;
        a layer that shares keys and values projects only q and attends over its source layer's cache."""
        cfg, B, ws = self.cfg, model.backend, model.ws
        n = len(h)
        q, k, v, attn = ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n]
        inv_freq = model.inv_freq[cfg.layer_sliding[i]]
        kv = model.kv_layer[i]
        if L.wk is None:
            B.matmul(h, L.wq, q.reshape(n, -1))
        else:
            B.matmul_many(h, (L.wq, L.wk, L.wv), (q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)))
            B.rmsnorm(k, L.k_norm, cfg.norm_eps, k)
            B.rmsnorm(v, self.ones_d, cfg.norm_eps, v)
            B.rope(k, pos, inv_freq, cfg.rope_neox)
            B.kv_store(model.cache, kv, k, v, slot, pos)
        B.rmsnorm(q, L.q_norm, cfg.norm_eps, q)
        B.rope(q, pos, inv_freq, cfg.rope_neox)
        B.attention(q, model.cache, kv, slot, pos, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap)
        B.matmul(attn.reshape(n, -1), L.wo, out)

"""The decoder-only transformer, written once against the Backend interface.

Architectures differ by configuration (norm placement, biases, q/k norms,
activation, windows, soft-capping) and by how their files name tensors; the
per-architecture files in this package only translate those. Tensor names
here are GGUF's (`blk.{i}.attn_q.weight`), the canonical names of this engine.

One forward call evaluates a batch of tokens, each tagged with the KV-cache
slot (sequence) it belongs to and its position, and returns logits for the
rows asked for. Every buffer it writes was allocated in `Workspace` at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import ContextOverflowError, ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig

TensorLookup = Callable[[str], Optional[WeightTensor]]


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None          # None without pre-norms (OLMo 2)
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: np.ndarray | None
    w_gate: object
    w_up: object
    w_down: object
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None


class Workspace:
    """Every activation buffer of a forward pass, sized for `max_tokens` per call.

    All buffers come from one backend allocation made at load (`backend.allocate`),
    together with the KV cache, so a forward pass allocates nothing.
    """

    def __init__(self, cfg: TransformerConfig, max_tokens: int, max_logit_rows: int):
        t = max_tokens
        self.max_tokens, self.max_logit_rows = t, max_logit_rows
        f32, i32 = np.float32, np.int32
        self.specs = {
            "x": ((t, cfg.d_model), f32),
            "h": ((t, cfg.d_model), f32),
            "proj": ((t, cfg.d_model), f32),
            "q": ((t, cfg.n_heads, cfg.head_dim), f32),
            "k": ((t, cfg.n_kv_heads, cfg.head_dim), f32),
            "v": ((t, cfg.n_kv_heads, cfg.head_dim), f32),
            "attn": ((t, cfg.n_heads, cfg.head_dim), f32),
            "gate": ((t, cfg.ffn_dim), f32),
            "up": ((t, cfg.ffn_dim), f32),
            "last": ((max_logit_rows, cfg.d_model), f32),
            "logits": ((max_logit_rows, cfg.vocab_size), f32),
            "tokens": ((t,), i32),
            "slots": ((t,), i32),
            "pos": ((t,), i32),
        }

    def bind(self, arrays: dict) -> None:
        for name in self.specs:
            setattr(self, name, arrays[name])

    def nbytes(self) -> int:
        return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in self.specs.values())


def unfused_lookup(get: TensorLookup, cfg: TransformerConfig) -> TensorLookup:
    """Serve separate q/k/v and gate/up from fused tensors when a file has only those
    (Phi-3: `attn_qkv` holds q, k, v rows; `ffn_up`, 2*ffn_dim tall, holds gate rows then up rows)."""
    def lookup(name: str) -> WeightTensor | None:
        t = get(name)
        if not name.endswith(".weight"):
            return t
        layer, _, leaf = name[:-len(".weight")].rpartition(".")
        if t is None and leaf in ("attn_q", "attn_k", "attn_v"):
            qkv = get(f"{layer}.attn_qkv.weight")
            if qkv is not None:
                parts = qkv.split_rows([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
                return parts[("attn_q", "attn_k", "attn_v").index(leaf)]
        if leaf in ("ffn_gate", "ffn_up"):
            up = get(f"{layer}.ffn_up.weight")
            if up is not None and up.rows == 2 * cfg.ffn_dim and get(f"{layer}.ffn_gate.weight") is None:
                return up.split_rows([cfg.ffn_dim, cfg.ffn_dim])[leaf == "ffn_up"]
        return t

    return lookup


class Transformer:
    def __init__(self, cfg: TransformerConfig, tensors: TensorLookup, backend, n_ctx: int, n_slots: int = 1,
                 max_tokens: int = 512, max_logit_rows: int | None = None):
        cfg.validate()
        self.cfg, self.backend = cfg, backend
        self.n_ctx, self.n_slots = n_ctx, n_slots
        try:
            self._load(tensors)
        except ModelFormatError as e:
            if not cfg.source or cfg.source in str(e):
                raise
            raise ModelFormatError(f"{cfg.source}: {e}") from None     # name the file, as opening does
        self.inv_freq = {s: cfg.inv_freq(sliding=s) for s in set(cfg.layer_sliding)}
        if self.rope_factors is not None:
            self.inv_freq = {s: (f / self.rope_factors).astype(np.float32) for s, f in self.inv_freq.items()}
        self.ws = Workspace(cfg, max_tokens, max_logit_rows or max(n_slots, 16))
        self.cache = backend.create_kv_cache(cfg.n_layers, n_slots, n_ctx, cfg.n_kv_heads, cfg.head_dim,
                                             extra=self.ws.specs)
        self.ws.bind(self.cache.extra)
        self._plans: dict[int, object] = {}

    # -- loading -----------------------------------------------------------
    def _load(self, get: TensorLookup) -> None:
        cfg, B = self.cfg, self.backend
        get = unfused_lookup(get, cfg)

        def need(name: str) -> WeightTensor:
            t = get(name)
            if t is None:
                raise ModelFormatError(f"missing tensor {name!r}")
            return t

        def matrix(name: str, rows: int, cols: int):
            t = need(name)
            if t.shape != (rows, cols):
                raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected {(rows, cols)}")
            return B.prepare_matrix(t)

        def vector(name: str, n: int, offset: float = 0.0, required: bool = True):
            t = get(name) if not required else need(name)
            if t is None:
                return None
            if t.rows * t.cols != n:
                raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected ({n},)")
            v = B.prepare_vector(t, offset)
            finite(name, t, v)
            return v

        def finite(name: str, t: WeightTensor, v: np.ndarray) -> None:
            # A NaN in a norm weight or bias silently poisons every logit; vectors are small, so
            # they are all checked (matrices are not: that would cost a pass over the whole model).
            bad = np.flatnonzero(~np.isfinite(v))
            if len(bad):
                where = name if t.name == name else f"{t.name!r} ({name})"
                raise ModelFormatError(f"tensor {where} holds {v[bad[0]]} at index {int(bad[0])} "
                                       f"({len(bad)} non-finite values): the model file is corrupt")

        d, off = cfg.d_model, cfg.norm_offset
        self.tok_embd = matrix("token_embd.weight", cfg.vocab_size, d)
        out = get("output.weight")
        self.output = self.tok_embd if (out is None and cfg.tie_embeddings) else matrix("output.weight", cfg.vocab_size, d)
        self.output_norm = vector("output_norm.weight", d, off)
        rf = get("rope_freqs.weight")
        self.rope_factors = None if rf is None else rf.to_float32().reshape(-1)
        if rf is not None:
            finite("rope_freqs.weight", rf, self.rope_factors)
        if self.rope_factors is not None and len(self.rope_factors) != cfg.rope_dim // 2:
            raise ModelFormatError("rope_freqs.weight does not match the rope dimension")
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            post, pre = cfg.post_norms, cfg.pre_norms
            qn, kn = (cfg.q_dim, cfg.kv_dim) if cfg.qk_norm_whole else (cfg.head_dim, cfg.head_dim)
            self.layers.append(LayerWeights(
                attn_norm=vector(p + "attn_norm.weight", d, off) if pre else None,
                wq=matrix(p + "attn_q.weight", cfg.q_dim, d),
                wk=matrix(p + "attn_k.weight", cfg.kv_dim, d),
                wv=matrix(p + "attn_v.weight", cfg.kv_dim, d),
                wo=matrix(p + "attn_output.weight", d, cfg.q_dim),
                ffn_norm=vector(p + "ffn_norm.weight", d, off) if pre else None,
                w_gate=matrix(p + "ffn_gate.weight", cfg.ffn_dim, d),
                w_up=matrix(p + "ffn_up.weight", cfg.ffn_dim, d),
                w_down=matrix(p + "ffn_down.weight", d, cfg.ffn_dim),
                bq=vector(p + "attn_q.bias", cfg.q_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                bk=vector(p + "attn_k.bias", cfg.kv_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                bv=vector(p + "attn_v.bias", cfg.kv_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                q_norm=vector(p + "attn_q_norm.weight", qn, off) if cfg.qk_norm else None,
                k_norm=vector(p + "attn_k_norm.weight", kn, off) if cfg.qk_norm else None,
                post_attn_norm=vector(p + "post_attention_norm.weight", d, off) if post else None,
                post_ffn_norm=vector(p + "post_ffw_norm.weight", d, off) if post else None,
            ))
        B.end_load()

    # -- the forward pass ----------------------------------------------------
    #: decode batches up to this many tokens replay a recorded op list (see forward)
    PLAN_MAX_TOKENS = 64

    def forward(self, tokens, slots, pos, logit_rows, out: np.ndarray | None = None) -> np.ndarray:
        """Evaluate tokens (each with its slot and position), return logits of `logit_rows`.

        Returns a view into the workspace when the rows fit in it (valid until the
        next call), else fills and returns `out` (shape (len(logit_rows), vocab)).

        A decode step (logits for every row, few tokens) depends only on the batch
        size: every buffer is fixed in the arena and tokens/slots/positions are read
        from it. Backends that can (native) record that step's op list once per batch
        size and replay it, skipping this Python code on every later token.
        """
        n = len(tokens)
        ws = self.ws
        if n == 0 or n > ws.max_tokens:
            raise ValueError(f"batch of {n} tokens; this model takes 1..{ws.max_tokens} per call")
        ws.tokens[:n] = tokens
        ws.slots[:n] = slots
        ws.pos[:n] = pos
        self._check_batch(ws.tokens[:n], ws.slots[:n], ws.pos[:n])
        self.backend.begin_forward()
        rows = np.asarray(logit_rows, dtype=np.intp).reshape(-1)
        m = len(rows)
        if m and (rows.min() < 0 or rows.max() >= n):
            raise ValueError(f"logit_rows must index the batch of {n} tokens, got {rows.min()}..{rows.max()}")
        whole = out is None and m == n and n <= min(ws.max_logit_rows, self.PLAN_MAX_TOKENS) \
            and bool(np.all(rows == np.arange(n)))
        if whole and getattr(self.backend, "supports_plans", False):
            plan = self._plans.get(n)
            if plan is not None:
                self.backend.replay(plan)
            else:
                self.backend.begin_recording()
                try:
                    self._layers(n)
                    self._head(ws.x[:n], ws.logits[:n])
                except BaseException:
                    self.backend.end_recording()
                    raise
                self._plans[n] = self.backend.end_recording()
            return ws.logits[:n]
        x = self._layers(n)
        return self._logits(x, rows, out)

    def final_hidden(self, tokens, slots, pos, rows) -> np.ndarray:
        """The final-normed hidden states of `rows` (a copy), for decoder models used as embedders.
        The same blocks as forward(), without the head."""
        n, ws = len(tokens), self.ws
        if n == 0 or n > ws.max_tokens:
            raise ValueError(f"batch of {n} tokens; this model takes 1..{ws.max_tokens} per call")
        ws.tokens[:n], ws.slots[:n], ws.pos[:n] = tokens, slots, pos
        self._check_batch(ws.tokens[:n], ws.slots[:n], ws.pos[:n])
        self.backend.begin_forward()
        x = self._layers(n)
        h = np.ascontiguousarray(x[np.asarray(rows, dtype=np.intp)])
        out = np.empty_like(h)
        self.backend.rmsnorm(h, self.output_norm, self.cfg.norm_eps, out)
        return out

    def _layers(self, n: int) -> np.ndarray:
        """Embed the batch in ws.tokens[:n] and run every block; returns the hidden states."""
        ws = self.ws
        tok, slot, p = ws.tokens[:n], ws.slots[:n], ws.pos[:n]
        x = ws.x[:n]
        self.backend.embed(self.tok_embd, tok, x)
        if self.cfg.embed_scale:
            self.backend.scale(x, self.cfg.embed_scale)
        for i, layer in enumerate(self.layers):
            self._attention_block(i, layer, x, slot, p)
            self._ffn_block(layer, x)
        return x

    def _check_batch(self, tok, slot, p) -> None:
        if tok.min() < 0 or tok.max() >= self.cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        if slot.min() < 0 or slot.max() >= self.n_slots:
            raise ValueError(f"slot out of range [0, {self.n_slots})")
        if p.min() < 0 or p.max() >= self.n_ctx:
            raise ContextOverflowError(f"position {int(p.max())} does not fit the context of {self.n_ctx} tokens")

    def _attention_block(self, i: int, L: LayerWeights, x, slot, p) -> None:
        cfg, B, ws = self.cfg, self.backend, self.ws
        n = len(x)
        h, q, k, v, attn, proj = ws.h[:n], ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n], ws.proj[:n]
        h = self._pre_norm(x, L.attn_norm, h)
        q2, k2, v2 = q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)
        B.matmul_many(h, (L.wq, L.wk, L.wv), (q2, k2, v2))
        if L.bq is not None:
            B.add_rows(q2, L.bq, q2)
            B.add_rows(k2, L.bk, k2)
            B.add_rows(v2, L.bv, v2)
        if L.q_norm is not None:
            qn, kn = (q2, k2) if cfg.qk_norm_whole else (q, k)     # OLMo 2: one norm over all heads
            B.rmsnorm(qn, L.q_norm, cfg.norm_eps, qn)
            B.rmsnorm(kn, L.k_norm, cfg.norm_eps, kn)
        sliding = cfg.layer_sliding[i]
        inv_freq = self.inv_freq[sliding]
        if cfg.layer_rope[i]:           # SmolLM3's NoPE layers take positions from the causal mask only
            B.rope(q, p, inv_freq, cfg.rope_neox)
            B.rope(k, p, inv_freq, cfg.rope_neox)
        B.kv_store(self.cache, i, k, v, slot, p)
        B.attention(q, self.cache, i, slot, p, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap)
        B.matmul(attn.reshape(n, -1), L.wo, proj)
        if L.post_attn_norm is not None:
            B.rmsnorm(proj, L.post_attn_norm, cfg.norm_eps, proj)
        self._residual_add(x, proj)

    def _ffn_block(self, L: LayerWeights, x) -> None:
        cfg, B, ws = self.cfg, self.backend, self.ws
        n = len(x)
        h, gate, up, proj = ws.h[:n], ws.gate[:n], ws.up[:n], ws.proj[:n]
        h = self._pre_norm(x, L.ffn_norm, h)
        B.matmul_many(h, (L.w_gate, L.w_up), (gate, up))
        if cfg.activation == "silu":
            B.silu_mul(gate, up, gate)
        else:
            B.gelu_mul(gate, up, gate)
        B.matmul(gate, L.w_down, proj)
        if L.post_ffn_norm is not None:
            B.rmsnorm(proj, L.post_ffn_norm, cfg.norm_eps, proj)
        self._residual_add(x, proj)

    def _pre_norm(self, x, w, h):
        """The sublayer's input: x normed into h, or x itself in a model without pre-norms."""
        if w is None:
            return x
        self.backend.rmsnorm(x, w, self.cfg.norm_eps, h)
        return h

    def _residual_add(self, x, proj) -> None:
        if self.cfg.residual_scale != 1.0:       # Granite
            self.backend.scale(proj, self.cfg.residual_scale)
        self.backend.add(x, proj, x)

    def _logits(self, x, rows: np.ndarray, out) -> np.ndarray:
        cfg, ws = self.cfg, self.ws
        m, cap = len(rows), ws.max_logit_rows
        if m == 0:              # e.g. a prefill chunk that only fills the cache
            return ws.logits[:0] if out is None else out
        if out is None and m <= cap:
            self._head(self._gather(x, rows), ws.logits[:m])
            return ws.logits[:m]
        if out is None:
            out = np.empty((m, cfg.vocab_size), np.float32)
        for s in range(0, m, cap):
            part = rows[s:s + cap]
            self._head(self._gather(x, part), ws.logits[:len(part)])
            out[s:s + len(part)] = ws.logits[:len(part)]
        return out

    def _gather(self, x, rows: np.ndarray) -> np.ndarray:
        """The hidden states of `rows`: a view when they are consecutive, else copied into ws.last."""
        m = len(rows)
        if m and rows[-1] - rows[0] == m - 1 and bool(np.all(np.diff(rows) == 1)):
            return x[rows[0]:rows[0] + m]
        last = self.ws.last[:m]
        np.take(x, rows, axis=0, out=last)
        return last

    def _head(self, h, logits) -> None:
        cfg, B = self.cfg, self.backend
        last = self.ws.last[:len(h)]
        B.rmsnorm(h, self.output_norm, cfg.norm_eps, last)
        B.matmul(last, self.output, logits)
        if cfg.logit_scale != 1.0:               # Granite divides its logits
            B.scale(logits, 1.0 / cfg.logit_scale)
        if cfg.final_softcap:
            B.softcap(logits, cfg.final_softcap)

    def memory_report(self) -> dict[str, int]:
        r = {"kv_cache": self.cache.nbytes, "activations": self.ws.nbytes()}
        r.update(self.backend.memory_report())
        return r

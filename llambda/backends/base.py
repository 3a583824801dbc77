"""The small interface every backend implements; the model code calls only this.

Ops write into caller-provided float32 arrays (`out=`), so a backend can keep
every activation in one arena allocated at load and a decode step allocates
nothing. Token batches carry, per token, the KV-cache slot (sequence) it
belongs to and its position: one op signature serves prompt prefill (one slot,
consecutive positions), batched decode (one token per slot) and any mix.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager

import numpy as np

from ..formats.weights import WeightTensor


class KVCache:
    """Keys and values of every layer for `n_slots` sequences of up to `n_ctx` tokens.

    Made by `Backend.create_kv_cache`, which carves it and any `extra` buffers
    (the activations) out of one allocation; `extra` maps names to those arrays.
    """

    def __init__(self, n_layers: int, n_slots: int, n_ctx: int, n_kv: int, head_dim: int, dtype,
                 k: list, v: list, extra: dict, pos_axis: int = 1):
        """`v is k`: a cache of keys only, attention reading each value from its key's row (latent attention's
        compressed rows, models/base.py). pos_axis: the arrays' axis of positions (Backend.kv_pos_axis)."""
        self.n_layers, self.n_slots, self.n_ctx = n_layers, n_slots, n_ctx
        self.n_kv, self.head_dim, self.dtype = n_kv, head_dim, np.dtype(dtype)
        self.k, self.v, self.extra = k, v, extra
        self.kbase = [None] * n_layers      # per layer: a q8_0 cache's key bases (native backend), else None
        self.state: list = []               # a hybrid model's recurrent state per slot (models/base.py)
        self.pos_axis = pos_axis

    @property
    def values_are_keys(self) -> bool:
        return self.v is self.k

    @property
    def arrays(self) -> list:
        """Every K and V array once."""
        return self.k if self.values_are_keys else self.k + self.v

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays + self.kbase + self.state if a is not None)

    def commit(self) -> None:
        """Write every page of the cache now (the arena is zeroed lazily: each page is faulted
        in, as a transparent huge page zeroed 2 MB at a time, by the first op that writes it).
        A server calls this at start: in a step that faults pages in every running stream
        waits; copying a 7-token prefix into a fresh slot measured 124 ms instead of 0.3 ms."""
        for a in self.arrays + self.state:     # a hybrid model's state: every slot back at 0 tokens
            a.fill(0)

    def positions(self, a: np.ndarray) -> np.ndarray:
        """A view of K or V array `a` as (n_slots, n_ctx, ...), whatever the backend's layout."""
        return np.moveaxis(a, self.pos_axis, 1)

    def copy_prefix(self, src_slot: int, dst_slot: int, n_tokens: int) -> None:
        """Copy the first n_tokens of one slot's KV into another (prefix caching)."""
        for a in self.arrays:
            rows = self.positions(a)
            rows[dst_slot, :n_tokens] = rows[src_slot, :n_tokens]
        if n_tokens > 0:    # keys stored against the source's key base read back only with it
            for base in self.kbase:
                if base is not None:
                    base[dst_slot] = base[src_slot]


def carve(specs: dict, align: int = 64) -> tuple[np.ndarray, dict]:
    """One zeroed, `align`-byte aligned buffer holding every (shape, dtype) in specs; returns it and the views."""
    sizes = {k: int(np.prod(shape)) * np.dtype(dt).itemsize for k, (shape, dt) in specs.items()}
    total = sum(-(-n // align) * align for n in sizes.values())
    raw = np.zeros(total + align, np.uint8)
    start = (-raw.ctypes.data) % align
    views, off = {}, start
    for k, (shape, dt) in specs.items():
        n = sizes[k]
        views[k] = raw[off:off + n].view(dt).reshape(shape)
        off += -(-n // align) * align
    return raw, views


def pair_sections(sections, half: int, interleaved: bool = False) -> np.ndarray:
    """Each of `half` rotary pairs' M-RoPE section (int64 [half]). Contiguous: the first sections[0] pairs
    section 0, the next sections[1] section 1, ... (Qwen2-VL; the counts must sum to half). Interleaved
    (Qwen3-VL, three sections): pair i is section 1 (height) when i % 3 == 1 and i < 3 * sections[1], section 2
    (width) when i % 3 == 2 and i < 3 * sections[2], else section 0 (temporal)."""
    sections = [int(v) for v in sections]
    if not interleaved:
        which = np.repeat(np.arange(len(sections)), sections)
        if len(which) != half:
            raise ValueError(f"sections {sections} do not cover {half} pairs")
        return which
    if len(sections) != 3:
        raise ValueError(f"interleaved M-RoPE takes three sections, got {sections}")
    i = np.arange(half)
    which = np.zeros(half, np.int64)
    which[(i % 3 == 1) & (i < 3 * sections[1])] = 1
    which[(i % 3 == 2) & (i < 3 * sections[2])] = 2
    return which


class Backend(ABC):
    name = "abstract"
    max_head_dim: int | None = None     # the widest cache row attention takes (None: no limit)
    #: a short description of the precision, e.g. "f32" or "q8 activations"
    precision = "f32"

    # -- load time -------------------------------------------------------
    @abstractmethod
    def prepare_matrix(self, w: WeightTensor):
        """A handle for a (rows=out, cols=in) weight used by matmul/embed."""

    def packed_type(self, qtype, cols: int):
        """The type prepare_matrix keeps a matrix of `qtype` with rows of `cols` in (the memory plan's
        question): the file's own, unless the backend converts it."""
        return qtype

    def prepare_vector(self, w: WeightTensor, offset: float = 0.0) -> np.ndarray:
        """A float32 vector (norm weight, bias); `offset` is added (Gemma's 1 + w norms). A copy, never a view
        of the file: the loader lets go of the file's pages once a tensor is prepared."""
        v = np.array(w.to_float32().reshape(-1), dtype=np.float32)
        return v + np.float32(offset) if offset else v

    def prepare_experts(self, gate: WeightTensor, up: WeightTensor, down: WeightTensor, biases=None):
        """A handle for an MoE layer's experts: 3-D (n_experts, rows, cols) gate, up and down tensors,
        and optionally their biases, (n_experts, rows) each."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts layers")

    def workspace_specs(self, cfg, max_tokens: int) -> dict:
        """Extra activation buffers this backend's ops need ({name: (shape, dtype)}), carved with the rest."""
        return {}

    @contextmanager
    def loading(self, nbytes: int):
        """While a model's weights (about `nbytes` once prepared: the memory plan's) are prepared: the native
        backend maps them at once and faults the memory in ahead of the packing (weight_arena.py)."""
        yield self

    def end_load(self) -> None:
        """Called once every weight of a model is prepared (the native backend reports conversions)."""

    def enter_forward(self) -> None:
        """Called at the start of every forward pass, exit_forward() after it, also when it fails (the
        native backend applies its own settings to the C core, whose switches are process-wide, and keeps
        forwards that need them set otherwise from overlapping)."""

    def exit_forward(self) -> None:
        pass

    #: the KV cache's element type
    kv_dtype = np.float32
    kv_type = "f32"          # the cache's type by name (native: f32, f16 or q8_0)

    def create_kv_cache(self, n_layers, n_slots, n_ctx, n_kv, head_dim, extra: dict | None = None,
                        values_are_keys: bool = False) -> KVCache:
        """The KV cache and the `extra` activation buffers, carved from one arena allocated now;
        values_are_keys: keys only (KVCache)."""
        specs = dict(extra or {})
        shape = self.kv_shape(n_slots, n_ctx, n_kv, head_dim)
        for i in range(n_layers):
            specs[f"k{i}"] = (shape, self.kv_dtype)
            if not values_are_keys:
                specs[f"v{i}"] = (shape, self.kv_dtype)
        self.arena, views = carve(specs)
        k = [views.pop(f"k{i}") for i in range(n_layers)]
        v = k if values_are_keys else [views.pop(f"v{i}") for i in range(n_layers)]
        return KVCache(n_layers, n_slots, n_ctx, n_kv, head_dim, self.kv_dtype, k, v, views, self.kv_pos_axis)

    kv_pos_axis = 1     # kv_shape's axis of positions

    def kv_shape(self, n_slots, n_ctx, n_kv, head_dim) -> tuple:
        """The shape of one layer's K (or V) cache of kv_dtype elements: (n_slots, n_ctx, n_kv, head_dim)."""
        return (n_slots, n_ctx, n_kv, head_dim)

    def memory_report(self) -> dict[str, int]:
        return {}

    # -- ops ---------------------------------------------------------------
    @abstractmethod
    def embed(self, table, ids: np.ndarray, out: np.ndarray) -> None: ...

    @abstractmethod
    def matmul(self, x: np.ndarray, w, out: np.ndarray) -> None:
        """out[n, rows] = x[n, cols] @ W.T"""

    def matmul_many(self, x: np.ndarray, ws, outs) -> None:
        """outs[i] = x @ ws[i].T for weights that share their input (a layer's Q, K, V; gate and up).
        Backends may run them as one call."""
        for w, out in zip(ws, outs, strict=True):
            self.matmul(x, w, out)

    @abstractmethod
    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
        """Over the last axis of x (any leading shape); out may be x."""

    @abstractmethod
    def add_rows(self, x: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None: ...

    @abstractmethod
    def rope(self, x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, neox: bool) -> None:
        """In place on x (n, heads, head_dim); rotates the first 2*len(inv_freq) dims."""

    def rope_sections(self, x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, neox: bool,
                      sections, interleaved: bool = False) -> None:
        """M-RoPE, in place on x (n, heads, head_dim): the first 2*len(inv_freq) dims rotated, pair i by angle
        pos[s, t] * inv_freq[i], s its section (`pair_sections`: pair counts `sections` in order, or Qwen3-VL's
        interleaved assignment); pos is int32 (len(sections), n), each row contiguous. Here: one rope call a
        section with the frequencies of the other sections' pairs 0 (angle 0 turns a pair by cos 1, sin 0:
        unchanged, bit for bit), the masked frequencies kept for the backend's life (a recorded plan reads them)."""
        for row, freqs in zip(pos, self._section_freqs(inv_freq, sections, interleaved)):
            self.rope(x, row, freqs, neox)

    def _section_freqs(self, inv_freq: np.ndarray, sections, interleaved: bool = False) -> list:
        cache = self.__dict__.setdefault("_masked_freqs", {})
        key = (inv_freq.ctypes.data, len(inv_freq), tuple(sections), bool(interleaved))
        hit = cache.get(key)
        if hit is None or hit[0] is not inv_freq:
            which = pair_sections(sections, len(inv_freq), interleaved)
            masks = [np.where(which == s, inv_freq, 0).astype(inv_freq.dtype) for s in range(len(sections))]
            hit = cache[key] = (inv_freq, masks)
        return hit[1]

    @abstractmethod
    def kv_store(self, cache: KVCache, layer: int, k: np.ndarray, v: np.ndarray,
                 slots: np.ndarray, pos: np.ndarray) -> None: ...

    @abstractmethod
    def attention(self, q: np.ndarray, cache: KVCache, layer: int, slots: np.ndarray, pos: np.ndarray,
                  out: np.ndarray, scale: float, window: int, softcap: float, kend: np.ndarray | None = None) -> None:
        """Causal attention of q (n, heads, head_dim) over each token's slot, keys at
        positions max(0, p-window+1)..p (window 0: all up to p); with kend (n int32, each > p),
        up to kend[i] - 1 instead of p: an image's soft tokens see their whole block."""

    def short_conv(self, bcx: np.ndarray, state: np.ndarray, state_pos: np.ndarray, kernel: np.ndarray,
                   slots: np.ndarray, pos: np.ndarray, out: np.ndarray) -> None:
        """LFM2's gated short convolution, token by token in batch order: bcx (n, 3d) holds B, C, x;
        u = B * x; out = C * (sum_j kernel[:, j] * window[j]), window the slot's last L - 1 u (its
        state, (n_slots, L - 1, d), oldest first) then this u; the state then drops its oldest row
        and keeps u. A token at position 0 starts from a zero state; state_pos (n_slots,) counts
        the tokens each slot's state has taken in (the caller checks each position continues it)."""
        raise NotImplementedError(f"the {self.name} backend has no short convolutions")

    def conv_silu(self, x: np.ndarray, state: np.ndarray, state_pos: np.ndarray, kernel: np.ndarray,
                  slots: np.ndarray, pos: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None) -> None:
        """out = silu(the causal depthwise convolution of x (n, c) + bias (c,), if any) over each slot's
        window, the state kept as short_conv keeps it (Qwen3-Next's convolution before its delta rule,
        Mamba2's with its bias)."""
        raise NotImplementedError(f"the {self.name} backend has no convolutions")

    def gated_delta(self, qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, eps: float, slots, pos, out,
                    k_heads: int) -> None:
        """Qwen3-Next's gated delta rule, token by token in batch order. qkv (n, 2 k_heads dk + hv dv):
        q, k (each k_heads heads of dk) and v (hv heads of dv); ba (n, 2 hv): b then a per value head;
        z (n, hv dv); state (n_slots, hv, dk, dv), zeroed at position 0; value head h reads key head
        h // (hv / k_heads). q, k L2-normalised (eps 1e-6), q times dk^-0.5; beta = sigmoid(b),
        g = a_neg * softplus(a + dt_bias); S = exp(g) S; S += k ((v - S^T k) beta)^T; o = S^T q;
        out = rmsnorm(o, eps) * norm_w * silu(z) per value head."""
        raise NotImplementedError(f"the {self.name} backend has no delta-rule layers")

    def ssm_scan(self, xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, eps: float, slots, pos, out,
                 groups: int) -> None:
        """Mamba2's selective scan, token by token in batch order. xbc (n, H P + 2 G N): x (H heads of P),
        B and C (G groups of N; head h reads group h // (H / G)); dt (n, H); z (n, H P); state
        (n_slots, H, N, P), zeroed at position 0. d = softplus(dt + dt_bias); S = exp(d a_neg) S + d B x^T;
        y = S^T C + d_skip x per head; out = y * silu(z), RMS-normed (eps) in G groups of H P / G, times
        norm_w (H P,); norm_w None: out = y * silu(z), no norm."""
        raise NotImplementedError(f"the {self.name} backend has no Mamba2 layers")

    def ssm_scan1(self, x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out) -> None:
        """Mamba 1's selective scan, token by token in batch order. x, dt, z (n, D); b, c (n, N); state
        (n_slots, D, N), zeroed at position 0; a_neg (D, N), never positive (a positive value is taken as 0).
        Per channel: d = softplus(dt + dt_bias); S = exp(d a_neg) S + d b x; out = (S . c + d_skip x) * silu(z)."""
        raise NotImplementedError(f"the {self.name} backend has no Mamba layers")

    def sigmoid_mul(self, x: np.ndarray, gate: np.ndarray, out: np.ndarray) -> None:
        """out = x * sigmoid(gate) (Qwen3-Next's gated attention output)."""
        raise NotImplementedError(f"the {self.name} backend has no sigmoid_mul")

    @abstractmethod
    def silu_mul(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None: ...

    @abstractmethod
    def gelu_mul(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray) -> None: ...

    def moe(self, x: np.ndarray, logits: np.ndarray, experts, k: int, routing: str, norm: bool, out: np.ndarray,
            shared: np.ndarray | None = None, shared_logit: np.ndarray | None = None, scratch=None,
            act: tuple = ("silu",), groups: tuple = (1, 1, 1), scale: float = 1.0,
            choice_bias: np.ndarray | None = None) -> None:
        """out[t] = sum over token t's k experts e of w_e * down_e(silu(gate_e(x[t])) * up_e(x[t])),
        the experts and weights chosen from logits[t] by `routing` (models/config.MOE_ROUTINGS; norm:
        the k weights rescaled to sum to 1); plus sigmoid(shared_logit[t]) * shared[t] (or shared[t]
        when there is no logit). `scratch` is the workspace, holding workspace_specs' buffers. act:
        ("silu",) or ("swiglu_oai", alpha, limit): (clamp(up, +-limit) + 1) * g * sigmoid(alpha g),
        g = min(gate, limit). Expert biases, if prepared, are added to each projection's output.
        groups (G, used, top): the experts in G equal groups, chosen only within the `used` groups whose
        `top` best choice values sum highest; choice_bias (n_experts,) is added to the scores for the
        choice only; the weights (the chosen scores, renormalised if norm) are multiplied by scale."""
        raise NotImplementedError(f"the {self.name} backend has no mixture-of-experts layers")

    def attention_sinks(self, q, cache: KVCache, layer: int, slots, pos, out, scale: float, window: int,
                        softcap: float, sinks: np.ndarray) -> None:
        """Rescale attention's output `out` as if each head's softmax had one more column, of logit
        sinks[h] and no value: out *= Z / (Z + e^sink), Z the sum of e^score over the visible keys."""
        raise NotImplementedError(f"the {self.name} backend has no attention sinks")

    def copy_blocks(self, src: np.ndarray, dst: np.ndarray, n: int, groups: int, width: int, src_at: tuple,
                    dst_at: tuple) -> None:
        """A strided copy between float32 arrays (flat element offsets): for t < n, g < groups,
        dst[t r + g s + o:][:width] = src[t r' + g s' + o':][:width], (r, s, o) = dst_at, (r', s', o') = src_at
        (s' = 0 repeats one block in every group). Latent attention assembles its heads with it."""
        raise NotImplementedError(f"the {self.name} backend has no copy_blocks")

    # -- Gemma 3n (models/gemma3n_net.py) --
    def gaussian_topk(self, x: np.ndarray, mult: float) -> None:
        """In place over each row of x: relu(x - (mean + std * mult)), std over the row's n values (1/n)."""
        raise NotImplementedError(f"the {self.name} backend has no gaussian_topk")

    def ids_below(self, ids: np.ndarray, limit: int, out: np.ndarray) -> None:
        """out = ids where 0 <= ids < limit, else 0 (int32): Gemma 3n's per-layer table covers fewer ids."""
        raise NotImplementedError(f"the {self.name} backend has no ids_below")

    def mul_rows(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        """out = x * w, w (d,) along each row of x (n, d)."""
        raise NotImplementedError(f"the {self.name} backend has no mul_rows")

    def rms_match(self, y: np.ndarray, target: np.ndarray, out: np.ndarray) -> None:
        """out = y * rms(target) / sqrt(max(mean(y^2), 1e-5)) per row (n, d); rms(t) = sqrt(mean(t^2))."""
        raise NotImplementedError(f"the {self.name} backend has no rms_match")

    def altup_predict(self, x: np.ndarray, coef: np.ndarray, out: np.ndarray) -> None:
        """AltUp's prediction of A streams x (A, n, d) with per-token coefficients coef (n, A A):
        out[j, t] = x[j, t] + sum_i coef[t, j A + i] x[i, t]. out is not x."""
        raise NotImplementedError(f"the {self.name} backend has no altup_predict")

    def altup_correct(self, pred: np.ndarray, coef: np.ndarray, active: np.ndarray, idx: int,
                      out: np.ndarray) -> None:
        """AltUp's correction: out[j, t] = pred[j, t] + coef[t, j] (active[t] - pred[idx, t]), pred and out
        (A, n, d) (out may be pred), coef (n, A), active (n, d)."""
        raise NotImplementedError(f"the {self.name} backend has no altup_correct")

    def xielu(self, x: np.ndarray, alpha_p: float, alpha_n: float, beta: float, eps: float) -> None:
        """In place: alpha_p x^2 + beta x where x > 0, else (expm1(min(x, eps)) - x) alpha_n + beta x, that first
        term 0 when alpha_n is 0 (Apertus' xIELU with its effective scalars; ReLU^2, Arcee's, is 1, 0, 0, 0). An
        infinite x gives the formula's limit (ReLU^2: +inf and 0, not 0 * inf), a NaN stays NaN."""
        raise NotImplementedError(f"the {self.name} backend has no xielu")

    def gelu_erf(self, x: np.ndarray) -> None:
        """In place: 0.5 x (1 + erf(x / sqrt 2)), the exact GELU of BERT-family encoders."""
        raise NotImplementedError(f"the {self.name} backend has no gelu_erf")

    # -- encoders (models/bert.py): a batch's sequences packed back to back, no padding --
    def prepare_dense(self, w: np.ndarray, bias: np.ndarray | None):
        """A handle for dense(): a float32 (rows=out, cols=in) matrix and its bias (or None)."""
        raise NotImplementedError(f"the {self.name} backend has no encoder ops")

    def dense(self, x: np.ndarray, d, out: np.ndarray) -> None:
        """out = x @ W^T + bias."""
        raise NotImplementedError(f"the {self.name} backend has no encoder ops")

    def add_layernorm(self, x: np.ndarray, r: np.ndarray | None, w: np.ndarray, b: np.ndarray, eps: float,
                      out: np.ndarray) -> None:
        """out = layernorm(x + r) * w + b over each row (r may be None; out may be x or r)."""
        raise NotImplementedError(f"the {self.name} backend has no encoder ops")

    def encoder_attention(self, qkv: np.ndarray, starts: np.ndarray, n_heads: int, out: np.ndarray) -> None:
        """Bidirectional attention of each sequence, rows [starts[s], starts[s + 1]), over itself: qkv
        rows are [q | k | v] (n_heads heads each), out (n, hidden); scores scaled by 1/sqrt(head_dim)."""
        raise NotImplementedError(f"the {self.name} backend has no encoder ops")

    def encoder_rotate(self, qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_heads: int) -> None:
        """In place on the q and k parts of qkv rows [q | k | v] (n_heads heads of d each): pairs (j, j + d/2) of
        every head of row i rotated by cos[i, j], sin[i, j] (n x d/2): a vision tower's 2D rotary positions."""
        raise NotImplementedError(f"the {self.name} backend has no encoder ops")

    @abstractmethod
    def add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None: ...

    @abstractmethod
    def scale(self, x: np.ndarray, s: float) -> None: ...

    @abstractmethod
    def pos_scale(self, x: np.ndarray, pos: np.ndarray, beta: float, length: int) -> None:
        """In place: row i of x (n rows, each contiguous) times the float32 factor 1 + beta * ln(1 + floor(pos[i] /
        length)), computed in float64 and rounded once (rows of band 0 keep their bits); pos int32 >= 0, length >= 1.
        Llama 4 style attention temperature; the positions are read from `pos` when the op runs (plans replay it)."""

    @abstractmethod
    def softcap(self, x: np.ndarray, cap: float) -> None: ...

    def close(self) -> None:
        """The model closed: drop the arena of its KV cache and activations (their views went with the model)."""
        self.arena = None

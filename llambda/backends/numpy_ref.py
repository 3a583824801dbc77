"""The reference backend: plain NumPy in float32, written to be read.

Weights are dequantized to float32 once, at load. Everything else is the
textbook formula. This is the oracle the native backend is tested against.
"""
from __future__ import annotations

import numpy as np

from ..formats.weights import WeightTensor

try:
    from scipy.special import erf as _erf
except ImportError:      # scipy is optional: libm's erf element by element (slow, exact)
    import math
    _erf = np.vectorize(math.erf, otypes=[np.float64])
from .base import Backend, KVCache, pair_sections


def route(logits: np.ndarray, k: int, routing: str, norm: bool, groups: tuple = (1, 1, 1), scale: float = 1.0,
          bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k experts (by descending choice, ties to the lower index) and their weights (Backend.moe)."""
    logits = logits.astype(np.float32)
    if routing == "sigmoid_topk" or groups[0] > 1 or bias is not None:
        return _route_general(logits, k, routing, norm, groups, np.float32(scale), bias)
    ids, w = _route_plain(logits, k, routing, norm)
    return ids, (w * np.float32(scale)).astype(np.float32)


def _route_general(logits, k, routing, norm, groups, scale, bias):
    """Scores (a softmax over all, or a sigmoid each), the choice (scores + bias) within the best groups
    (a group's rank: the sum of its `top` best choices), the weights from the scores."""
    n, E = logits.shape
    if routing == "sigmoid_topk":
        score = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        score = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    choice = score + (np.float32(0) if bias is None else bias.astype(np.float32))
    g, used, top = groups
    if g > 1:
        per = choice.reshape(n, g, E // g)
        gscore = -np.sort(-per, axis=-1, kind="stable")[..., :top].sum(-1)           # (n, g)
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :used]
        mask = np.zeros((n, g), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, E // g, axis=-1), choice, -np.inf)
    order = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(score, order, axis=-1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return order.astype(np.int32), (w * scale).astype(np.float32)


def _route_plain(logits: np.ndarray, k: int, routing: str, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, order, axis=-1)
    if routing == "topk_softmax":
        e = np.exp(top - top[:, :1])
        return order.astype(np.int32), (e / e.sum(-1, keepdims=True)).astype(np.float32)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    w = np.take_along_axis(p, order, axis=-1)
    if norm:
        w = w / w.sum(-1, keepdims=True)
    return order.astype(np.int32), w.astype(np.float32)


# encoder_attention's scores held at once: a sequence's heads go in groups of at most this many floats
# (a vision tower's 4096 patches x 16 heads would be 1 GB at once; one head is 64 MB)
ENCODER_SCORES_MAX = 1 << 24


def _signed_inf(c, zero) -> np.float32:
    """The sign of c as +-inf, or `zero` when c is 0."""
    return np.float32(np.inf if c > 0 else -np.inf if c < 0 else zero)


def _softplus(u):
    """log(1 + e^u), u past 20 as itself (the recurrent ops' dt)."""
    return np.where(u > 20, u, np.log1p(np.exp(np.minimum(u, 20))))


def _silu(z):
    """z sigmoid(z), as the recurrent ops' gates compute it."""
    return z / (1.0 + np.exp(-z))


class NumpyBackend(Backend):
    name = "numpy"
    precision = "f32"

    def prepare_matrix(self, w: WeightTensor) -> np.ndarray:
        return np.ascontiguousarray(w.to_float32().reshape(w.rows, w.cols), dtype=np.float32)

    def prepare_experts(self, gate: WeightTensor, up: WeightTensor, down: WeightTensor, biases=None):
        mats = tuple(np.ascontiguousarray(w.to_float32().reshape(w.shape), dtype=np.float32) for w in (gate, up, down))
        zero = tuple(np.zeros(m.shape[:2], np.float32) for m in mats)
        return mats + (zero if biases is None else tuple(b.to_float32().reshape(b.shape) for b in biases))

    def moe(self, x, logits, experts, k, routing, norm, out, shared=None, shared_logit=None, scratch=None,
            act=("silu",), groups=(1, 1, 1), scale=1.0, choice_bias=None) -> None:
        gate, up, down, gate_b, up_b, down_b = experts
        ids, wts = route(logits, k, routing, norm, groups, scale, choice_bias)
        acc = np.zeros_like(out)
        for e in np.unique(ids):
            tok, slot = np.nonzero(ids == e)
            h = x[tok]
            g, u = h @ gate[e].T + gate_b[e], h @ up[e].T + up_b[e]
            if act[0] == "swiglu_oai":
                alpha, limit = np.float32(act[1]), np.float32(act[2])
                g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
                y = ((u + 1) * g / (1.0 + np.exp(-alpha * g))) @ down[e].T + down_b[e]
            else:
                y = (g / (1.0 + np.exp(-g)) * u) @ down[e].T + down_b[e]
            np.add.at(acc, tok, wts[tok, slot][:, None] * y)
        if shared is not None:
            s = np.float32(1) if shared_logit is None else 1.0 / (1.0 + np.exp(-shared_logit.reshape(-1, 1)))
            acc += s * shared
        out[...] = acc

    def short_conv(self, bcx, state, state_pos, kernel, slots, pos, out) -> None:
        d = out.shape[1]
        for t, c, u in self._conv(bcx[:, :d] * bcx[:, 2 * d:], state, state_pos, kernel, slots, pos):
            out[t] = bcx[t, d:2 * d] * u

    def conv_silu(self, x, state, state_pos, kernel, slots, pos, out, bias=None) -> None:
        for t, _, y in self._conv(x, state, state_pos, kernel, slots, pos):
            y = y if bias is None else y + bias
            out[t] = _silu(y)

    @staticmethod
    def _conv(u, state, state_pos, kernel, slots, pos):
        """Yield (t, _, y): each token's causal depthwise convolution over its slot's window, in
        batch order, the state shifted as it goes (zeroed at position 0)."""
        width = kernel.shape[1]
        for t in range(len(slots)):        # a slot's tokens continue its state
            s = int(slots[t])
            if pos[t] == 0:
                state[s] = 0
            y = np.zeros(u.shape[1], np.float32)
            for j in range(width - 1):
                y += kernel[:, j] * state[s, j]
            y += kernel[:, width - 1] * u[t]
            state[s, :-1] = state[s, 1:].copy()
            state[s, -1] = u[t]
            state_pos[s] = pos[t] + 1
            yield t, None, y

    def gated_delta(self, qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, eps, slots, pos, out,
                    k_heads) -> None:
        n_slots, hv, dk, dv = state.shape
        r = hv // k_heads
        kd = k_heads * dk
        f32 = np.float32
        for t in range(len(slots)):
            s = int(slots[t])
            if pos[t] == 0:
                state[s] = 0
            q = qkv[t, :kd].reshape(k_heads, dk)
            k = qkv[t, kd:2 * kd].reshape(k_heads, dk)
            v = qkv[t, 2 * kd:].reshape(hv, dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + f32(1e-6)) * f32(dk ** -0.5)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + f32(1e-6))
            q, k = np.repeat(q, r, axis=0), np.repeat(k, r, axis=0)              # (hv, dk)
            beta = 1.0 / (1.0 + np.exp(-ba[t, :hv]))
            x = ba[t, hv:] + dt_bias
            g = a_neg * _softplus(x)
            S = state[s] * np.exp(g)[:, None, None]                             # (hv, dk, dv)
            delta = (v - np.einsum("hij,hi->hj", S, k)) * beta[:, None]
            S = S + k[:, :, None] * delta[:, None, :]
            state[s] = S
            state_pos[s] = pos[t] + 1
            o = np.einsum("hij,hi->hj", S, q)                                   # (hv, dv)
            o = o / np.sqrt((o * o).mean(-1, keepdims=True) + f32(eps)) * norm_w
            zt = z[t].reshape(hv, dv)
            out[t] = (o * _silu(zt)).reshape(-1)

    def ssm_scan(self, xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, eps, slots, pos, out,
                 groups) -> None:
        n_slots, H, N, P = state.shape
        xd, f32 = H * P, np.float32
        for t in range(len(slots)):
            s = int(slots[t])
            if pos[t] == 0:
                state[s] = 0
            x = xbc[t, :xd].reshape(H, P)
            b = np.repeat(xbc[t, xd:xd + groups * N].reshape(groups, N), H // groups, axis=0)      # (H, N)
            c = np.repeat(xbc[t, xd + groups * N:].reshape(groups, N), H // groups, axis=0)
            u = dt[t] + dt_bias
            d = _softplus(u).astype(f32)
            S = state[s] * np.exp(d * a_neg)[:, None, None] + (d[:, None] * b)[:, :, None] * x[:, None, :]
            state[s] = S
            state_pos[s] = pos[t] + 1
            y = (np.einsum("hnp,hn->hp", S, c) + d_skip[:, None] * x).reshape(-1)
            y = y * _silu(z[t])
            if norm_w is None:           # no gated norm (Falcon-H1's mamba_rms_norm false)
                out[t] = y
                continue
            y = y.reshape(groups, -1)
            out[t] = (y / np.sqrt((y * y).mean(-1, keepdims=True) + f32(eps))).reshape(-1) * norm_w

    def ssm_scan1(self, x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out) -> None:
        for t in range(len(slots)):
            s = int(slots[t])
            if pos[t] == 0:
                state[s] = 0
            u = dt[t] + dt_bias
            d = _softplus(u).astype(np.float32)[:, None]
            S = np.exp(np.minimum(d * a_neg, 0)) * state[s] + (d * b[t]) * x[t][:, None]               # (D, N)
            state[s] = S
            state_pos[s] = pos[t] + 1
            out[t] = (S @ c[t] + d_skip * x[t]) * _silu(z[t])

    def sigmoid_mul(self, x, gate, out) -> None:
        np.multiply(x, 1.0 / (1.0 + np.exp(-gate)), out=out)

    def embed(self, table: np.ndarray, ids, out) -> None:
        np.take(table, ids, axis=0, out=out)

    def matmul(self, x, w, out) -> None:
        np.matmul(x, w.T, out=out)

    def rmsnorm(self, x, w, eps, out) -> None:
        with np.errstate(over="ignore"):
            ms = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
        # rows whose float32 mean square overflowed though they are finite (|x| past ~1e19): in float64, as the
        # C kernel's rmsnorm_row_wide (a row with an inf or NaN keeps the float32 result: NaN, refused upstream)
        wide = np.isinf(ms[..., 0])
        if wide.any():
            wide &= np.isfinite(x).all(axis=-1)
            x64 = x[wide].astype(np.float64)
        with np.errstate(invalid="ignore"):
            np.multiply(x, 1.0 / np.sqrt(ms + np.float32(eps)), out=out)
        out *= w
        if wide.any():
            out[wide] = x64 / np.sqrt(np.mean(np.square(x64), axis=-1, keepdims=True) + eps) * w

    def add_rows(self, x, bias, out) -> None:
        np.add(x, bias, out=out)

    def rope(self, x, pos, inv_freq, neox) -> None:
        half = len(inv_freq)
        ang = pos.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :]   # (n, half)
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        if neox:   # pairs (i, i + half): HF rotate_half
            a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:2 * half] = a * sin + b * cos
        else:      # adjacent pairs (2i, 2i+1): GGUF llama
            a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
            x[..., 0:2 * half:2] = a * cos - b * sin
            x[..., 1:2 * half:2] = a * sin + b * cos

    def rope_sections(self, x, pos, inv_freq, neox, sections, interleaved=False) -> None:
        """The oracle: each pair's angle from its own section's position, in one pass."""
        half = len(inv_freq)
        which = pair_sections(sections, half, interleaved)          # pair -> section
        if pos.shape[0] != len(sections):
            raise ValueError(f"pos is not one row a section of {list(sections)}")
        ang = pos.astype(np.float64)[which].T * inv_freq.astype(np.float64)[None, :]   # (n, half), as rope's
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        if neox:
            a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:2 * half] = a * sin + b * cos
        else:
            a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
            x[..., 0:2 * half:2] = a * cos - b * sin
            x[..., 1:2 * half:2] = a * sin + b * cos

    def kv_store(self, cache: KVCache, layer, k, v, slots, pos) -> None:
        cache.k[layer][slots, pos] = k
        cache.v[layer][slots, pos] = v

    def _scores(self, q, cache: KVCache, layer, slots, pos, scale, window, softcap, kend=None):
        """Per slot: (its rows, masked scores (heads, rows, keys) with -inf where not visible, values).
        A row sees keys max(0, p - window + 1)..end - 1, end = p + 1 or its kend."""
        n, n_heads, hd = q.shape
        group = n_heads // cache.n_kv
        for slot in np.unique(slots):
            rows = np.nonzero(slots == slot)[0]
            p = pos[rows]
            end = p + 1 if kend is None else np.asarray(kend)[rows]
            if kend is not None and (np.any(end <= p) or int(end.max()) > cache.n_ctx):
                raise ValueError("attention: each kend must be in pos + 1 .. n_ctx")
            t = int(end.max())
            k = np.repeat(cache.k[layer][slot, :t].astype(np.float32), group, axis=1)  # (t, heads, hd)
            v = np.repeat(cache.v[layer][slot, :t].astype(np.float32), group, axis=1)
            s = np.einsum("nhd,thd->hnt", q[rows], k) * np.float32(scale)          # (heads, m, t)
            if softcap > 0:
                s = np.float32(softcap) * np.tanh(s / np.float32(softcap))
            j = np.arange(t)[None, :]
            visible = j < end[:, None]
            if window > 0:
                visible &= j > p[:, None] - window
            yield rows, np.where(visible[None], s, -np.inf), v

    def attention(self, q, cache: KVCache, layer, slots, pos, out, scale, window, softcap, kend=None) -> None:
        for rows, s, v in self._scores(q, cache, layer, slots, pos, scale, window, softcap, kend):
            s -= s.max(axis=-1, keepdims=True)
            e = np.exp(s)
            e /= e.sum(axis=-1, keepdims=True)
            out[rows] = np.einsum("hnt,thd->nhd", e, v)

    def attention_sinks(self, q, cache: KVCache, layer, slots, pos, out, scale, window, softcap, sinks) -> None:
        for rows, s, _ in self._scores(q, cache, layer, slots, pos, scale, window, softcap):
            mx = s.max(axis=-1)                                                    # (heads, m)
            log_z = mx + np.log(np.exp(s - mx[..., None]).sum(axis=-1))
            keep = 1.0 / (1.0 + np.exp(sinks[:, None] - log_z))                   # Z / (Z + e^sink)
            out[rows] *= keep.T[:, :, None].astype(np.float32)

    def silu_mul(self, gate, up, out) -> None:
        np.multiply(gate / (1.0 + np.exp(-gate)), up, out=out)

    def gelu_mul(self, gate, up, out) -> None:
        c = np.float32(np.sqrt(2.0 / np.pi))
        g = 0.5 * gate * (1.0 + np.tanh(c * (gate + np.float32(0.044715) * gate ** 3)))
        np.multiply(g, up, out=out)

    def gaussian_topk(self, x, mult) -> None:
        mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
        std = np.sqrt(np.square(x - mean).mean(axis=-1, keepdims=True, dtype=np.float32))
        np.maximum(x - (mean + std * np.float32(mult)), 0, out=x)

    def ids_below(self, ids, limit, out) -> None:
        np.copyto(out, np.where((ids >= 0) & (ids < limit), ids, 0))

    def mul_rows(self, x, w, out) -> None:
        np.multiply(x, w, out=out)

    def rms_match(self, y, target, out) -> None:
        want = np.sqrt(np.mean(np.square(target), axis=-1, keepdims=True, dtype=np.float32))
        have = np.sqrt(np.maximum(np.mean(np.square(y), axis=-1, keepdims=True, dtype=np.float32), np.float32(1e-5)))
        np.multiply(y, want / have, out=out)

    def altup_predict(self, x, coef, out) -> None:
        A = x.shape[0]
        c = coef.reshape(-1, A, A)                      # (n, j, i)
        out[...] = x + np.einsum("tji,itd->jtd", c, x)

    def altup_correct(self, pred, coef, active, idx, out) -> None:
        innovation = active - pred[idx]
        out[...] = pred + coef.T[:, :, None] * innovation[None]

    def xielu(self, x, alpha_p, alpha_n, beta, eps) -> None:
        f = np.float32
        inf = np.isinf(x)
        limits = x[inf]       # the formula's limit at +-inf (its terms give 0 * inf or inf - inf): ops.c's xielu_at_inf
        limits = np.where(limits > 0, _signed_inf(alpha_p if alpha_p else beta, 0.0),
                          _signed_inf(f(alpha_n) - f(beta), -f(alpha_n)))
        with np.errstate(invalid="ignore", over="ignore"):
            neg = (np.expm1(np.minimum(x, f(eps))) - x) * f(alpha_n) if alpha_n else np.zeros_like(x)
            np.copyto(x, np.where(x > 0, f(alpha_p) * x * x, neg) + f(beta) * x)
        x[inf] = limits

    def gelu_erf(self, x) -> None:
        x *= 0.5 * (1.0 + _erf(x.astype(np.float64) / np.sqrt(2.0)))

    def prepare_dense(self, w, bias):
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        return np.ascontiguousarray(w, dtype=np.float32), b

    def dense(self, x, d, out) -> None:
        w, b = d
        np.matmul(x, w.T, out=out)
        if b is not None:
            out += b

    def add_layernorm(self, x, r, w, b, eps, out) -> None:
        y = x + r if r is not None else x.copy()
        y -= y.mean(axis=-1, keepdims=True)
        y *= 1.0 / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + np.float32(eps))
        out[...] = y * w + b

    def encoder_attention(self, qkv, starts, n_heads, out) -> None:
        n, h3 = qkv.shape
        hd = h3 // 3 // n_heads
        heads = qkv.reshape(n, 3, n_heads, hd)
        for s in range(len(starts) - 1):
            rows = slice(int(starts[s]), int(starts[s + 1]))
            t = rows.stop - rows.start
            group = max(1, min(n_heads, ENCODER_SCORES_MAX // (t * t)))    # heads whose scores are held at once
            for h0 in range(0, n_heads, group):
                hs = slice(h0, min(h0 + group, n_heads))
                q, k, v = (heads[rows, i, hs].transpose(1, 0, 2) for i in range(3))     # (heads, t, hd)
                sc = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(1 / np.sqrt(hd))
                sc -= sc.max(axis=-1, keepdims=True)
                np.exp(sc, out=sc)
                sc /= sc.sum(axis=-1, keepdims=True)
                out[rows].reshape(t, n_heads, hd)[:, hs] = np.matmul(sc, v).transpose(1, 0, 2)

    def encoder_rotate(self, qkv, cos, sin, n_heads) -> None:
        n, width = qkv.shape[0], qkv.shape[1] // 3
        d = width // n_heads
        half = d // 2
        c, s = cos[:, None, :], sin[:, None, :]
        for part in (qkv[:, :width], qkv[:, width:2 * width]):
            heads = part.reshape(n, n_heads, d)
            a = heads[..., :half].copy()
            b = heads[..., half:]
            heads[..., :half] = a * c - b * s
            heads[..., half:] = b * c + a * s

    def copy_blocks(self, src, dst, n, groups, width, src_at, dst_at) -> None:
        def view(a, at):
            flat = a.reshape(-1)
            row, group, off = at
            return np.lib.stride_tricks.as_strided(flat[off:], (n, groups, width), (row * 4, group * 4, 4))
        view(dst, dst_at)[...] = view(src, src_at)

    def add(self, a, b, out) -> None:
        np.add(a, b, out=out)

    def scale(self, x, s) -> None:
        x *= np.float32(s)

    def pos_scale(self, x, pos, beta, length) -> None:
        pos = np.asarray(pos)
        if pos.dtype != np.int32 or pos.shape != (len(x),) or (pos < 0).any():
            raise ValueError(f"pos_scale: pos must be {len(x)} int32 positions >= 0")
        if not np.isfinite(beta) or int(length) < 1:
            raise ValueError(f"pos_scale: beta must be finite and length >= 1, got {beta}, {length}")
        band = pos.astype(np.int64) // int(length)
        f = (1.0 + float(beta) * np.log1p(band.astype(np.float64))).astype(np.float32)
        rows = np.flatnonzero(f != 1.0)
        if len(rows):
            x[rows] *= f[rows].reshape((-1,) + (1,) * (x.ndim - 1))

    def softcap(self, x, cap) -> None:
        np.multiply(np.tanh(x / np.float32(cap)), np.float32(cap), out=x)

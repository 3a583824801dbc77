"""The encoder's C ops (csrc/matmul/dense.c, csrc/ops/encoder.c) against NumPy float64, on every ISA
path this CPU offers, on random data with odd shapes and tails, on 1 and 2 threads; and their
argument checks (a ValueError naming the op, never a crash).

Budgets: float32 sums over k terms drift by ~k ulp at worst; the dense bf16 format is compared
with the float64 product of the bfloat16-rounded operands, which it computes up to float32 sums.
"""
import numpy as np
import pytest

from llambda.backends.numpy_ref import NumpyBackend

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32, BF16 = 0, 1


@pytest.fixture(params=[1, 2])
def threads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


def bf16(a):
    """float32 -> bfloat16 (nearest even) -> float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def packed(fmt, w):
    rows, cols = w.shape
    size = native.dense_packed_size(fmt, rows, cols)
    raw = np.zeros(size + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    dst = raw[off:off + size]
    native.dense_pack(fmt, w, dst, rows, cols)
    return dst


@pytest.mark.parametrize("fmt", [F32, BF16])
@pytest.mark.parametrize("n,rows,cols", [(1, 1, 1), (3, 31, 7), (13, 33, 45), (49, 70, 129), (100, 96, 384),
                                         (61, 1152, 96)])
def test_dense_matches_numpy(isa, threads, fmt, n, rows, cols):
    g = np.random.default_rng(n * 1000 + rows + cols)
    w = g.standard_normal((rows, cols)).astype(np.float32)
    b = g.standard_normal(rows).astype(np.float32)
    x = g.standard_normal((n, cols)).astype(np.float32)
    dst = packed(fmt, w)
    out = np.full((n, rows), np.nan, np.float32)
    native.dense(fmt, dst, b, x, out, n, rows, cols)
    xs, ws = (bf16(x), bf16(w)) if fmt == BF16 else (x, w)
    want = xs.astype(np.float64) @ ws.astype(np.float64).T + b
    scale = np.abs(xs).astype(np.float64) @ np.abs(ws).astype(np.float64).T + 1
    assert np.all(np.abs(out - want) <= 4e-7 * cols * scale / np.sqrt(cols) + 1e-6), (isa, fmt)
    # no bias; and a row's result does not depend on the rest of its batch
    alone = np.empty((1, rows), np.float32)
    native.dense(fmt, dst, None, x[-1:], alone, 1, rows, cols)
    native.dense(fmt, dst, None, x, out, n, rows, cols)
    assert np.array_equal(alone[0], out[-1])


@pytest.mark.parametrize("n,d", [(1, 1), (5, 17), (40, 384), (300, 385)])
def test_add_layernorm_matches_numpy(isa, threads, n, d):
    g = np.random.default_rng(d)
    x = (g.standard_normal((n, d)) * 3 + 1).astype(np.float32)
    r = g.standard_normal((n, d)).astype(np.float32)
    w, b = g.standard_normal(d).astype(np.float32), g.standard_normal(d).astype(np.float32)
    y = x.astype(np.float64) + r
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-12) * w + b
    out = np.empty_like(x)
    native.add_layernorm(x, r, w, b, out, n, d, 1e-12)
    assert np.abs(out - y).max() < 2e-5 * (1 + np.abs(w).max()), isa
    native.add_layernorm(x, None, w, b, out, n, d, 1e-12)
    z = x.astype(np.float64)
    z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-12) * w + b
    assert np.abs(out - z).max() < 2e-5 * (1 + np.abs(w).max())
    native.add_layernorm(x, r, w, b, r, n, d, 1e-12)           # in place on the residual
    assert np.abs(r - y).max() < 2e-5 * (1 + np.abs(w).max())


@pytest.mark.parametrize("lens,n_heads,head_dim", [([1], 1, 1), ([3, 1, 17], 2, 5), ([9, 15, 40, 2], 12, 32),
                                                    ([130], 3, 64), ([7, 301], 2, 72), ([260], 1, 20)])
def test_encoder_attention_matches_numpy(isa, threads, lens, n_heads, head_dim):
    g = np.random.default_rng(sum(lens) + n_heads)
    starts = np.zeros(len(lens) + 1, np.int32)
    np.cumsum(lens, out=starts[1:])
    n = int(starts[-1])
    qkv = (g.standard_normal((n, 3 * n_heads * head_dim)) * 2).astype(np.float32)
    out = np.full((n, n_heads * head_dim), np.nan, np.float32)
    native.encoder_attention(qkv, starts, out, n, len(lens), n_heads, head_dim, 1 / np.sqrt(head_dim))
    want = np.empty_like(out)
    NumpyBackend().encoder_attention(qkv.astype(np.float64), starts, n_heads, want)
    assert np.abs(out - want).max() < 2e-5, isa


def test_encoder_ops_refuse_bad_arguments():
    w = np.ones((4, 8), np.float32)
    dst = packed(F32, w)
    x, out = np.ones((2, 8), np.float32), np.empty((2, 4), np.float32)
    with pytest.raises(ValueError, match="dense: .*fmt"):
        native.dense(2, dst, None, x, out, 2, 4, 8)
    with pytest.raises(ValueError, match="dense: .*packed"):
        native.dense(F32, dst[:-1], None, x, out, 2, 4, 8)
    with pytest.raises(ValueError, match="dense: .*x"):
        native.dense(F32, dst, None, x[:1], out, 2, 4, 8)
    with pytest.raises(ValueError, match="dense: .*bias"):
        native.dense(F32, dst, np.ones(3, np.float32), x, out, 2, 4, 8)
    with pytest.raises(ValueError, match="dense: out overlaps"):
        native.dense(F32, dst, None, x, x, 2, 4, 8)
    with pytest.raises(ValueError, match="dense_pack: .*w"):
        native.dense_pack(F32, w[:3], dst, 4, 8)
    qkv, o = np.ones((5, 6), np.float32), np.empty((5, 2), np.float32)
    with pytest.raises(ValueError, match="encoder_attention: starts"):
        native.encoder_attention(qkv, np.array([0, 3, 4], np.int32), o, 5, 2, 1, 2, 1.0)
    with pytest.raises(ValueError, match="encoder_attention: sequence 1"):
        native.encoder_attention(qkv, np.array([0, 3, 3, 5], np.int32), o, 5, 3, 1, 2, 1.0)
    with pytest.raises(ValueError, match="encoder_attention: .*qkv"):
        native.encoder_attention(qkv[:4], np.array([0, 5], np.int32), o, 5, 1, 1, 2, 1.0)
    with pytest.raises(ValueError, match="add_layernorm: .*eps"):
        native.add_layernorm(x, None, np.ones(8, np.float32), np.ones(8, np.float32), x, 2, 8, 0.0)
    with pytest.raises(ValueError, match="add_layernorm: out overlaps"):
        native.add_layernorm(x, None, np.ones(8, np.float32), np.ones(8, np.float32), x.reshape(-1)[1:9].reshape(1, 8),
                             1, 8, 1e-5)


@pytest.mark.parametrize("n,n_heads,head_dim", [(1, 1, 2), (7, 3, 10), (64, 2, 16), (300, 16, 80)])
def test_encoder_rotate_matches_numpy(isa, threads, n, n_heads, head_dim):
    """q and k rotated (rotate_half pairs) by each row's own angles, v untouched; the last shape passes the
    threaded size (n * width >= 65536)."""
    g = np.random.default_rng(n + head_dim)
    qkv = (g.standard_normal((n, 3 * n_heads * head_dim)) * 2).astype(np.float32)
    ang = (g.standard_normal((n, head_dim // 2)) * 5).astype(np.float32)
    cos, sin = np.cos(ang), np.sin(ang)
    got, want = qkv.copy(), qkv.astype(np.float64)
    native.encoder_rotate(got, cos, sin, n, n_heads, head_dim)
    NumpyBackend().encoder_rotate(want, cos.astype(np.float64), sin.astype(np.float64), n_heads)
    assert np.abs(got - want).max() < 1e-5 * (1 + np.abs(want).max()), isa
    width = n_heads * head_dim
    assert np.array_equal(got[:, 2 * width:], qkv[:, 2 * width:])
    q = qkv[:, :width].reshape(n, n_heads, head_dim).astype(np.float64)          # norms kept per pair
    r = got[:, :width].reshape(n, n_heads, head_dim).astype(np.float64)
    half = head_dim // 2
    assert np.allclose(q[..., :half] ** 2 + q[..., half:] ** 2, r[..., :half] ** 2 + r[..., half:] ** 2, rtol=1e-4,
                       atol=1e-5)


def test_encoder_rotate_refuses_bad_arguments():
    qkv, t = np.ones((3, 12), np.float32), np.ones((3, 2), np.float32)
    native.encoder_rotate(qkv, t, t, 3, 1, 4)
    with pytest.raises(ValueError, match="encoder_rotate: head_dim must be even"):
        native.encoder_rotate(qkv, t, t, 3, 1, 3)
    with pytest.raises(ValueError, match="encoder_rotate: .*cos"):
        native.encoder_rotate(qkv, t[:2], t, 3, 1, 4)
    with pytest.raises(ValueError, match="encoder_rotate: .*qkv"):
        native.encoder_rotate(qkv[:2], t, t, 3, 1, 4)
    with pytest.raises(ValueError, match="encoder_rotate: out overlaps"):
        native.encoder_rotate(qkv, qkv.reshape(-1)[:6].reshape(3, 2), t, 3, 1, 4)
    with pytest.raises(ValueError):
        native.encoder_rotate(qkv.astype(np.float64), t, t, 3, 1, 4)

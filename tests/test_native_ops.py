"""The C core's elementwise / norm / RoPE / KV-cache / attention ops against NumPy float64.

Every op runs on every SIMD path this CPU offers (scalar, avx2, avx512 via set_isa) on random
data with odd sizes and tails. Error budgets are written next to each check: they bound what
float32 arithmetic (and our exp/tanh polynomials, ~2 ulp) can cost, with margin, and are far
below what a wrong index, a dropped tail element or a missing rescale would produce.
"""
import numpy as np
import pytest

from llambda.formats.quants import QType, dequantize, quantize

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32 = np.float32


def rng(seed):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- references (float64)


def ref_rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def ref_rope(x, pos, inv_freq, rope_dim, neox):
    """x (n, heads, head_dim). The angle is the float32 product pos * inv_freq, as HF computes it."""
    x = x.astype(np.float64).copy()
    half = rope_dim // 2
    angle = (pos.astype(F32)[:, None] * inv_freq[None, :half]).astype(np.float64)  # float32 product
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half:rope_dim].copy()
        x[..., :half], x[..., half:rope_dim] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:rope_dim:2].copy(), x[..., 1:rope_dim:2].copy()
        x[..., 0:rope_dim:2], x[..., 1:rope_dim:2] = a * c - b * s, a * s + b * c
    return x


def rows(c):
    """A cache of the C layout (n_slots, n_kv, n_ctx, ...) viewed as (n_slots, n_ctx, n_kv, ...)."""
    return np.moveaxis(c, 2, 1)


def cache_values(c, n_kv, hd):
    """What a cache holds, as float64 (n_slots, n_ctx, n_kv, hd): a q8_0 cache (bytes) through the
    NumPy dequantizer. A float64 array is taken as such values already."""
    if c.dtype == np.float64:
        return c
    c = rows(c)
    if c.dtype == np.uint8:
        c = dequantize(np.ascontiguousarray(c).ravel(), QType.Q8_0, (c.size // (hd // 32 * 34), hd)).reshape(c.shape[:3] + (hd,))
    return c.astype(np.float64)


def ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, scale, window, softcap):
    """q (n, n_heads, hd); caches (n_slots, n_ctx, n_kv, hd) as float64 of what the cache holds."""
    kc, vc = cache_values(kc, n_kv, q.shape[-1]), cache_values(vc, n_kv, q.shape[-1])
    group = n_heads // n_kv
    out = np.zeros(q.shape, np.float64)
    for i in range(q.shape[0]):
        p = int(pos[i])
        lo = max(0, p - window + 1) if window > 0 else 0
        k = kc[slots[i], lo : p + 1]  # (L, n_kv, hd)
        v = vc[slots[i], lo : p + 1]
        for h in range(n_heads):
            s = scale * (k[:, h // group] @ q[i, h].astype(np.float64))
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            e = np.exp(s - s.max())
            out[i, h] = (e / e.sum()) @ v[:, h // group]
    return out


def gelu_tanh(x):
    """0.5 x (1 + tanh(t)) written as x / (1 + exp(-2t)): the same function, but float64 does not
    cancel 1 + tanh(t) to 0 for very negative x, so the reference stays exact in the tail."""
    t = np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-2 * t))


def check_gelu(out, g, u):
    """Budget: 3e-6 relative (exp to ~2 ulp, a divide), plus the float32 rounding of the exp
    argument -2t = -2 sqrt(2/pi) (g + 0.044715 g^3) (about 1.5 ulp of |2t|), which matters only
    in the far tail where gelu is ~1e-10 of g or smaller; atol covers float32 underflow."""
    t2 = 2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)
    want = gelu_tanh(g) * u
    tol = (3e-6 + 1.8e-7 * np.abs(t2)) * np.abs(want) + 1e-30
    bad = np.abs(out.astype(np.float64) - want) > tol
    assert not bad.any(), (np.flatnonzero(bad)[:5], out[bad][:5], want[bad][:5])


def test_gelu_reference_is_the_tanh_form():
    x = np.linspace(-6, 6, 1001)
    np.testing.assert_allclose(gelu_tanh(x), 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
                               rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------- rmsnorm


@pytest.mark.parametrize("n,d", [(1, 576), (37, 17), (5, 1), (3, 4099), (64, 640)])
def test_rmsnorm(isa, n, d):
    r = rng(n * 1000 + d)
    x = r.standard_normal((n, d)).astype(F32) * 3
    w = r.standard_normal(d).astype(F32)
    out = np.empty_like(x)
    native.rmsnorm(x, w, out, n, d, 1e-5)
    # float32: sum of squares over d terms in several accumulators, then 2 roundings per output.
    np.testing.assert_allclose(out, ref_rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_rmsnorm_in_place_and_eps(isa):
    r = rng(1)
    x = (r.standard_normal((4, 33)) * 1e-3).astype(F32)  # eps dominates the tiny mean square
    w = r.standard_normal(33).astype(F32)
    want = ref_rmsnorm(x, w, 1e-2)
    native.rmsnorm(x, w, x, 4, 33, 1e-2)  # out aliases x
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("d", [64, 576, 4099])
def test_rmsnorm_of_rows_whose_squares_overflow_float32(isa, d):
    """RMSNorm is scale-invariant, so a finite row past ~1e19 (x^2 past float32's max) has a norm: it was 0 (the
    sum of squares inf, x / inf); now the C kernel on every ISA and its NumPy twin give the float64 reference,
    in place too. Rows with an inf or a NaN stay non-finite (NaN), for the engine's check to refuse; the normal
    rows around them are untouched by the wide path."""
    from llambda.backends.numpy_ref import NumpyBackend
    r = rng(d)
    x = r.standard_normal((6, d)).astype(F32)
    x[1] *= F32(1e20)
    x[2] *= F32(3e37)
    x[3, 5:] *= F32(1e-30)                      # one huge value among tiny ones
    x[3, :5] = [3e38, -1e25, 7.0, -3e38, 1e19]
    w = r.standard_normal(d).astype(F32)
    want = ref_rmsnorm(x, w, 1e-5)
    assert np.isfinite(want).all() and np.abs(want).max() > 1.0
    bad = np.vstack([x, x[:2]])
    bad[6, 3], bad[7, 0] = np.inf, np.nan
    bad[7, 1] = 1e30
    normal = r.standard_normal((1, d)).astype(F32)
    alone = np.empty_like(normal)
    native.rmsnorm(normal, w, alone, 1, d, 1e-5)
    for name, norm in (("native", lambda a, o, n: native.rmsnorm(a, w, o, n, d, 1e-5)),
                       ("numpy", lambda a, o, n: NumpyBackend().rmsnorm(a, w, 1e-5, o))):
        out = np.empty_like(x)
        norm(x, out, 6)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, err_msg=name)
        y = x.copy()
        norm(y, y, 6)                                 # out aliases x
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6, err_msg=name)
        got = np.empty_like(bad)
        norm(bad, got, 8)
        assert np.isnan(got[6, 3]) and np.isnan(got[7]).all(), name
        np.testing.assert_allclose(got[:6], want, rtol=1e-5, atol=1e-6, err_msg=name)
    both = np.vstack([normal, x[1:2]])
    out = np.empty_like(both)
    native.rmsnorm(both, w, out, 2, d, 1e-5)
    np.testing.assert_array_equal(out[0], alone[0])   # the fast path, bit for bit


# ---------------------------------------------------------------- rope


@pytest.mark.parametrize("neox", [0, 1])
@pytest.mark.parametrize("n,n_heads,head_dim,rope_dim", [(1, 9, 64, 64), (37, 3, 128, 64), (5, 2, 256, 256), (7, 1, 16, 6)])
def test_rope(isa, neox, n, n_heads, head_dim, rope_dim):
    r = rng(n + head_dim + rope_dim + neox)
    x = r.standard_normal((n, n_heads, head_dim)).astype(F32)
    pos = r.integers(0, 8192, n).astype(np.int32)
    pos[0] = 0
    base = 10000.0
    inv_freq = (1.0 / base ** (np.arange(0, rope_dim, 2) / rope_dim)).astype(F32)
    want = ref_rope(x, pos, inv_freq, rope_dim, neox)
    native.rope(x, pos, inv_freq, n, n_heads, head_dim, rope_dim, neox)
    # cos/sin are rounded to float32 (0.5 ulp each), then a 2-term float32 combination.
    np.testing.assert_allclose(x, want, rtol=0, atol=3e-6 * np.abs(want).max())
    # Dims >= rope_dim are untouched, bit for bit.
    assert np.array_equal(x[..., rope_dim:], want[..., rope_dim:].astype(F32))


# ---------------------------------------------------------------- kv_store


def make_cache(n_slots, n_ctx, n_kv, hd, cache_type):
    """K and V caches in the C layout: (n_slots, n_kv, n_ctx, hd) values, or q8_0's 34 bytes per 32."""
    if cache_type == 2:
        shape = (n_slots, n_kv, n_ctx, hd // 32 * 34)
        return np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    dt = F32 if cache_type == 0 else np.float16
    return np.zeros((n_slots, n_kv, n_ctx, hd), dt), np.zeros((n_slots, n_kv, n_ctx, hd), dt)


def fill_cache(c, values, n_kv, hd):
    """Store float values (n_slots, n_ctx, n_kv, hd) into a cache of any type (q8_0: the NumPy quantizer)."""
    if c.dtype == np.uint8:
        rows(c)[:] = quantize(values.reshape(-1, hd).astype(F32), QType.Q8_0).reshape(rows(c).shape)
    else:
        rows(c)[:] = values


@pytest.mark.parametrize("cache_type", [0, 1])
def test_kv_store(isa, cache_type):
    r = rng(7 + cache_type)
    n_slots, n_ctx, n_kv, hd, n = 3, 50, 2, 20, 37
    kc, vc = make_cache(n_slots, n_ctx, n_kv, hd, cache_type)
    kc[:] = 7  # untouched cells keep this
    k = r.standard_normal((n, n_kv, hd)).astype(F32)
    v = r.standard_normal((n, n_kv, hd)).astype(F32)
    slots = np.repeat(np.array([2, 0, 1], np.int32), [13, 12, 12])
    pos = np.concatenate([np.arange(5, 18), np.arange(38, 50), np.arange(0, 12)]).astype(np.int32)
    native.kv_store(k, v, kc, vc, slots, pos, n, n_kv, hd, n_slots, n_ctx, cache_type)
    dt = kc.dtype
    assert np.array_equal(rows(kc)[slots, pos], k.astype(dt))  # f16: same rounding as NumPy (nearest even)
    assert np.array_equal(rows(vc)[slots, pos], v.astype(dt))
    written = np.zeros((n_slots, n_ctx), bool)
    written[slots, pos] = True
    assert np.all(rows(kc)[~written] == 7) and np.all(rows(vc)[~written] == 0)


def test_kv_store_q8_0(isa):
    """Rows quantized as the NumPy Q8_0 quantizer does, byte for byte (scales, halves away from
    zero, all-zero blocks), only at the given positions."""
    r = rng(9)
    n_slots, n_ctx, n_kv, hd, n = 3, 50, 2, 96, 37
    kc, vc = make_cache(n_slots, n_ctx, n_kv, hd, 2)
    kc[:] = 7
    k = (r.standard_normal((n, n_kv, hd)) * r.uniform(0.01, 100, (n, n_kv, 1))).astype(F32)
    v = r.standard_normal((n, n_kv, hd)).astype(F32)
    k[3] = 0.0  # a zero scale: codes 0
    v[4, 0, :32] = np.concatenate([[127.0, -127.0], np.arange(30) - 14.5])  # scale 1: codes at exact halves
    slots = np.repeat(np.array([2, 0, 1], np.int32), [13, 12, 12])
    pos = np.concatenate([np.arange(5, 18), np.arange(38, 50), np.arange(0, 12)]).astype(np.int32)
    native.kv_store(k, v, kc, vc, slots, pos, n, n_kv, hd, n_slots, n_ctx, 2)
    assert np.array_equal(rows(kc)[slots, pos], quantize(k.reshape(n, -1), QType.Q8_0).reshape(n, n_kv, -1))
    assert np.array_equal(rows(vc)[slots, pos], quantize(v.reshape(n, -1), QType.Q8_0).reshape(n, n_kv, -1))
    written = np.zeros((n_slots, n_ctx), bool)
    written[slots, pos] = True
    assert np.all(rows(kc)[~written] == 7) and np.all(rows(vc)[~written] == 0)


def q8_0_keys_with_base(rows, base):
    """What kv_store writes for keys with a base: per 32-value block, Q8_0 of the keys or of their
    difference from the base (its scale's sign bit set), whichever has the smaller amax."""
    plain = quantize(rows, QType.Q8_0).reshape(len(rows), -1, 34)
    rel = quantize(rows - base, QType.Q8_0).reshape(len(rows), -1, 34).copy()
    rel[:, :, 1] |= 0x80
    b = rows.reshape(len(rows), -1, 32)
    use_rel = np.abs(b - base.reshape(-1, 32)).max(axis=2) < np.abs(b).max(axis=2)
    return np.where(use_rel[:, :, None], rel, plain).reshape(len(rows), -1)


def test_kv_q8_0_key_base(isa):
    """Keys with a few huge channels (as Qwen2.5's): position 0 sets the slot's base, blocks that
    quantize better as differences from it are stored so, and attention reads base + difference:
    far closer to the float keys than plain Q8_0 blocks."""
    r = rng(12)
    n_ctx, n_kv, hd, n_heads, n = 300, 2, 64, 6, 290
    offset = np.zeros((n_kv, hd), F32)
    offset[:, 60:] = [150.0, -90.0, 120.0, 70.0]
    k = (r.standard_normal((n, n_kv, hd)) + offset).astype(F32)
    v = r.standard_normal((n, n_kv, hd)).astype(F32)
    kc, vc = make_cache(2, n_ctx, n_kv, hd, 2)
    kbase = np.full((2, n_kv * hd), 5.0, F32)
    slots, pos = np.ones(n, np.int32), np.arange(n, dtype=np.int32)
    for a, b in ((0, 100), (100, n)):  # position 0 in the first call: later calls keep its base
        native.kv_store(k[a:b], v[a:b], kc, vc, slots[a:b], pos[a:b], b - a, n_kv, hd, 2, n_ctx, 2, kbase)
    assert np.array_equal(kbase[1], k[0].ravel()) and np.all(kbase[0] == 5.0)
    assert np.array_equal(rows(kc)[1, :n], q8_0_keys_with_base(k.reshape(n, -1), kbase[1]).reshape(n, n_kv, -1))
    assert np.array_equal(rows(vc)[1, :n], quantize(v.reshape(n, -1), QType.Q8_0).reshape(n, n_kv, -1))  # values: plain blocks
    q = r.standard_normal((1, n_heads, hd)).astype(F32) * 0.1
    want = ref_attention(q, np.zeros((2, n_ctx, n_kv, hd)) + np.pad(k, ((0, n_ctx - n), (0, 0), (0, 0)))[None],
                         cache_values(vc, n_kv, hd), slots[:1], pos[-1:], n_heads, n_kv, 0.125, 0, 0.0)
    out = np.empty_like(q)
    native.attention(q, kc, vc, out, slots[:1], pos[-1:], 1, n_heads, n_kv, hd, 2, n_ctx, 2, 0.125, 0, 0.0, kbase)
    err_base = np.abs(out - want).max()
    plain = np.empty_like(q)
    kc_plain = kc.copy()
    rows(kc_plain)[1, :n] = quantize(k.reshape(n, -1), QType.Q8_0).reshape(n, n_kv, -1)
    native.attention(q, kc_plain, vc, plain, slots[:1], pos[-1:], 1, n_heads, n_kv, hd, 2, n_ctx, 2, 0.125, 0, 0.0)
    assert err_base < 0.01 and err_base < np.abs(plain - want).max() / 3, (err_base, np.abs(plain - want).max())
    with pytest.raises(ValueError, match="q8_0"):
        native.attention(q, *make_cache(2, n_ctx, n_kv, hd, 1), out, slots[:1], pos[-1:], 1, n_heads, n_kv, hd, 2,
                         n_ctx, 1, 0.125, 0, 0.0, kbase)


def test_kv_q8_0_needs_whole_blocks():
    kc, vc = make_cache(1, 4, 1, 32, 2)
    k = np.zeros((1, 1, 20), F32)
    with pytest.raises(ValueError, match="multiple of 32"):
        native.kv_store(k, k, kc, vc, np.zeros(1, np.int32), np.zeros(1, np.int32), 1, 1, 20, 1, 4, 2)
    q = np.zeros((1, 1, 20), F32)
    with pytest.raises(ValueError, match="multiple of 32"):
        native.attention(q, kc, vc, q.copy(), np.zeros(1, np.int32), np.zeros(1, np.int32), 1, 1, 1, 20, 1, 4, 2,
                         0.25, 0, 0.0)


def test_kv_store_f16_special_values(isa):
    """Rounding of ties, overflow to inf, subnormals, signed zero, NaN: as NumPy's float16."""
    vals = np.array(
        [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e6, -1e6, np.inf, -np.inf,
         2.0**-24, 1.5 * 2.0**-24, 2.5 * 2.0**-24, 2.0**-25, 2.0**-26, 0.999 * 2.0**-14, 2.0**-14,
         1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 3.14159, -2.71828, 1e-10, 1000.5, 2049.0],
        F32,
    )
    hd = len(vals)
    k = vals.reshape(1, 1, hd)
    kc, vc = make_cache(1, 1, 1, hd, 1)
    native.kv_store(k, k, kc, vc, np.zeros(1, np.int32), np.zeros(1, np.int32), 1, 1, hd, 1, 1, 1)
    with np.errstate(over="ignore"):
        want = vals.astype(np.float16)
    assert np.array_equal(kc.view(np.uint16).ravel(), want.view(np.uint16))
    nan = np.array([np.nan, -np.nan], F32).reshape(1, 1, 2)
    kc, vc = make_cache(1, 1, 1, 2, 1)
    native.kv_store(nan, nan, kc, vc, np.zeros(1, np.int32), np.zeros(1, np.int32), 1, 1, 2, 1, 1, 1)
    assert np.all(np.isnan(kc))


def test_kv_store_of_keys_only(isa):
    """A cache whose values are its keys (kcache is vcache, k is v: latent attention's compressed rows):
    each row written once, attention's values read from it; refused with different k and v or a key base."""
    n_kv, hd, n_ctx = 1, 64, 8
    kc, _ = make_cache(1, n_ctx, n_kv, hd, 2)
    k = rng(7).standard_normal((3, n_kv, hd)).astype(F32)
    slots, pos = np.zeros(3, np.int32), np.arange(3, dtype=np.int32)
    native.kv_store(k, k, kc, kc, slots, pos, 3, n_kv, hd, 1, n_ctx, 2)
    assert np.array_equal(rows(kc)[0, :3], quantize(k.reshape(3, -1), QType.Q8_0).reshape(rows(kc)[0, :3].shape))
    q = rng(8).standard_normal((1, 4, hd)).astype(F32)
    out = np.full_like(q, np.nan)
    native.attention(q, kc, kc, out, slots[-1:], pos[-1:], 1, 4, n_kv, hd, 1, n_ctx, 2, 0.125, 0, 0.0)
    np.testing.assert_allclose(out, ref_attention(q, kc, kc, slots[-1:], pos[-1:], 4, n_kv, 0.125, 0, 0.0), atol=1e-5)
    with pytest.raises(ValueError, match="k and v differ"):
        native.kv_store(k, k.copy(), kc, kc, slots, pos, 3, n_kv, hd, 1, n_ctx, 2)
    with pytest.raises(ValueError, match="takes no kbase"):
        native.kv_store(k, k, kc, kc, slots, pos, 3, n_kv, hd, 1, n_ctx, 2, np.zeros((1, hd), F32))


# ---------------------------------------------------------------- attention

# (head_dim, n_heads, n_kv, n, window, softcap, n_slots, n_ctx)
ATTN_CASES = [
    (64, 9, 3, 1, 0, 0.0, 2, 300),     # smollm decode
    (64, 9, 3, 37, 0, 0.0, 2, 300),    # smollm prefill chunk, pos not starting at 0
    (128, 12, 4, 37, 0, 0.0, 3, 200),  # GQA 3
    (256, 4, 1, 37, 16, 0.0, 2, 100),  # gemma local layer: window, GQA 4
    (256, 4, 1, 1, 33, 0.0, 1, 150),   # window on decode
    (16, 7, 1, 37, 0, 5.0, 2, 90),     # GQA 7, softcap
    (64, 14, 2, 1, 0, 2.0, 1, 200),    # qwen-like, softcap biting hard
    (16, 2, 2, 1, 1, 0.0, 1, 10),      # window 1: attends only itself
    (20, 3, 3, 37, 0, 0.0, 2, 60),     # head_dim tail (not a multiple of 8 or 16)
    (40, 6, 2, 5, 7, 3.0, 2, 140),     # tail + window + softcap, crossing a 64-key block
    (128, 2, 1, 1, 0, 0.0, 1, 700),    # decode split into 256-key chunks, merged
    (64, 4, 1, 1, 300, 1.5, 2, 700),   # split + window + softcap
    (64, 4, 1, 5, 0, 0.0, 3, 600),     # several tokens split into different numbers of chunks
    (16, 16, 1, 1, 0, 0.0, 1, 50),     # GQA 16: the group is handled in two passes of 8 heads
    (32, 24, 2, 3, 0, 0.0, 2, 40),     # GQA 12
    (16, 24, 1, 6, 0, 0.0, 1, 40),     # GQA 24: more heads than vector lanes, tiles in passes
    (64, 4, 2, 37, 0, 0.0, 1, 60),     # GQA 2: 8 tokens per tile on avx512
    (24, 10, 2, 19, 0, 0.0, 2, 80),    # GQA 5, head_dim tail: 9 tokens x 5 heads in 3 vectors on avx512
    (48, 7, 1, 21, 9, 2.0, 2, 120),    # GQA 7, window, softcap: 6 tokens x 7 heads (42 of 48 lanes)
    (32, 2, 2, 25, 0, 0.0, 1, 90),     # no GQA: a tile of 25 rows takes 2 vectors on avx512
    (16, 64, 1, 5, 0, 0.0, 1, 40),     # GQA 64: passes of 48 and 16 heads
    (576, 16, 1, 1, 0, 0.0, 2, 300),   # the largest head: latent attention's compressed rows, decode
    (576, 16, 1, 37, 0, 0.0, 1, 120),  # and a prefill chunk of them
]


def attention_data(seed, hd, n_heads, n_kv, n, n_slots, n_ctx, cache_type):
    r = rng(seed)
    kc, vc = make_cache(n_slots, n_ctx, n_kv, hd, cache_type)
    fill_cache(kc, r.standard_normal((n_slots, n_ctx, n_kv, hd)), n_kv, hd)
    fill_cache(vc, r.standard_normal((n_slots, n_ctx, n_kv, hd)), n_kv, hd)
    q = r.standard_normal((n, n_heads, hd)).astype(F32)
    slots = r.integers(0, n_slots, n).astype(np.int32)
    if n == 1:
        pos = np.array([n_ctx - 1 - r.integers(0, 5)], np.int32)
    else:  # a prefill chunk continuing a sequence: consecutive positions not starting at 0
        start = int(r.integers(1, n_ctx - n))
        pos = np.arange(start, start + n, dtype=np.int32)
        slots[:] = slots[0]
    return q, kc, vc, slots, pos


@pytest.mark.parametrize("cache_type", [0, 1, 2], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("case", ATTN_CASES, ids=lambda c: "hd%d-h%d-kv%d-n%d-w%d-cap%g" % c[:6])
def test_attention(isa, cache_type, case):
    hd, n_heads, n_kv, n, window, softcap, n_slots, n_ctx = case
    if cache_type == 2 and hd % 32:
        pytest.skip("a q8_0 cache needs head_dim a multiple of 32 (test_kv_q8_0_needs_whole_blocks)")
    q, kc, vc, slots, pos = attention_data(hash(case) % 2**32, hd, n_heads, n_kv, n, n_slots, n_ctx, cache_type)
    scale = 1.0 / np.sqrt(hd)
    out = np.full_like(q, np.nan)
    native.attention(q, kc, vc, out, slots, pos, n, n_heads, n_kv, hd, n_slots, n_ctx, cache_type, scale, window, softcap)
    want = ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, scale, window, softcap)
    # Budget: float32 dot products (<= 256 terms, relative ~1e-6 of |q||k|), exp/tanh to ~2 ulp,
    # float32 sums over <= 700 keys; outputs are O(1) averages of unit-variance values.
    np.testing.assert_allclose(out, want, rtol=0, atol=5e-6)


def test_attention_out_aliases_q(isa):
    q, kc, vc, slots, pos = attention_data(3, 64, 4, 2, 5, 1, 40, 1)
    want = ref_attention(q, kc, vc, slots, pos, 4, 2, 0.125, 0, 0.0)
    native.attention(q, kc, vc, q, slots, pos, 5, 4, 2, 64, 1, 40, 1, 0.125, 0, 0.0)
    np.testing.assert_allclose(q, want, rtol=0, atol=5e-6)


@pytest.mark.parametrize("cache_type", [0, 1, 2], ids=["f32", "f16", "q8_0"])
def test_attention_prefill_of_two_sequences(isa, cache_type):
    """One batch holding two prompts in different slots: tiles of tokens must not mix slots."""
    hd, n_heads, n_kv, n_slots, n_ctx, n = 64, 6, 2, 3, 64, 37
    q, kc, vc, _, _ = attention_data(21, hd, n_heads, n_kv, n, n_slots, n_ctx, cache_type)
    slots = np.array([1] * 20 + [0] * 17, np.int32)
    pos = np.concatenate([np.arange(5, 25), np.arange(0, 17)]).astype(np.int32)
    out = np.empty_like(q)
    native.attention(q, kc, vc, out, slots, pos, n, n_heads, n_kv, hd, n_slots, n_ctx, cache_type, 0.125, 0, 0.0)
    want = ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, 0.125, 0, 0.0)
    np.testing.assert_allclose(out, want, rtol=0, atol=5e-6)


@pytest.mark.parametrize("window", [0, 20])
def test_attention_scattered_positions_in_one_slot(isa, window):
    """Tokens of one slot at far-apart positions share a tile: with a window, some rows have no key
    at all in the tile's first blocks, and their running max must stay -inf without turning NaN."""
    hd, n_heads, n_kv, n_slots, n_ctx, n = 32, 4, 2, 1, 300, 8
    q, kc, vc, _, _ = attention_data(31, hd, n_heads, n_kv, n, n_slots, n_ctx, 1)
    slots = np.zeros(n, np.int32)
    pos = np.array([3, 290, 40, 41, 150, 299, 0, 200], np.int32)
    out = np.empty_like(q)
    native.attention(q, kc, vc, out, slots, pos, n, n_heads, n_kv, hd, n_slots, n_ctx, 1, 0.2, window, 0.0)
    want = ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, 0.2, window, 0.0)
    np.testing.assert_allclose(out, want, rtol=0, atol=5e-6)


def test_attention_batch_of_slots(isa):
    """Several sequences decoding together: token i reads only its own slot."""
    hd, n_heads, n_kv, n_slots, n_ctx = 64, 6, 2, 4, 80
    q, kc, vc, _, _ = attention_data(11, hd, n_heads, n_kv, 4, n_slots, n_ctx, 1)
    slots = np.array([3, 0, 2, 1], np.int32)
    pos = np.array([79, 0, 40, 7], np.int32)
    out = np.empty_like(q)
    native.attention(q, kc, vc, out, slots, pos, 4, n_heads, n_kv, hd, n_slots, n_ctx, 1, 0.125, 0, 0.0)
    want = ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, 0.125, 0, 0.0)
    np.testing.assert_allclose(out, want, rtol=0, atol=5e-6)
    # pos 0 attends one key: the output is that value row exactly (softmax weight 1).
    np.testing.assert_allclose(out[1], rows(vc)[0, 0].astype(F32).repeat(3, axis=0).reshape(6, hd), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- elementwise

COUNTS = [1, 7, 15, 16, 17, 33, 1000, 100003]


@pytest.mark.parametrize("count", COUNTS)
def test_silu_gelu_mul(isa, count):
    r = rng(count)
    gate = (r.standard_normal(count) * 4).astype(F32)
    gate[: min(count, 6)] = [-100.0, -88.5, -20.0, 0.0, 30.0, 95.0][: min(count, 6)]  # exp over/underflow paths
    up = r.standard_normal(count).astype(F32)
    g, u = gate.astype(np.float64), up.astype(np.float64)
    out = np.empty_like(gate)
    native.silu_mul(gate, up, out, count)
    # exp to ~2 ulp, one divide: 3e-6 relative; atol covers results that underflow float32.
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * u, rtol=3e-6, atol=1e-30)
    native.gelu_mul(gate, up, out, count)
    check_gelu(out, g, u)


def test_silu_gelu_dense_range(isa):
    """A fine sweep of gate values checks the exp polynomial over its whole reduced range."""
    gate = np.linspace(-30, 30, 60001).astype(F32)
    up = np.ones_like(gate)
    out = np.empty_like(gate)
    g = gate.astype(np.float64)
    native.silu_mul(gate, up, out, gate.size)
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)), rtol=3e-6, atol=1e-30)
    native.gelu_mul(gate, up, out, gate.size)
    check_gelu(out, g, 1.0)


@pytest.mark.parametrize("count", COUNTS)
def test_gelu_erf(isa, count, threads2):
    """BERT's exact GELU in place, against erf in float64 (Abramowitz-Stegun's erf on the SIMD paths:
    |erf error| < 1.5e-7, so |gelu error| < 0.75e-7 |x| plus float32 rounding)."""
    import math
    r = rng(count + 2)
    x = (r.standard_normal(count) * 4).astype(F32)
    x[: min(count, 7)] = [-100.0, -9.0, -1e-3, 0.0, 1e-20, 8.0, 1e6][: min(count, 7)]
    # 1 + erf(z) as erfc(-z): the float64 reference must not cancel in the far negative tail either
    want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
    got = x.copy()
    native.gelu_erf(got, count)
    err = np.abs(got - want)
    # erf's 1.5e-7 times |x|/2, plus a few float32 roundings of terms no larger than |x| (AVX2's
    # reciprocal is rcp + a Newton step: an ulp more)
    assert np.all(err <= 4e-7 * np.abs(x) + 1e-30), float((err / np.maximum(np.abs(x), 1e-30)).max())
    dense = np.linspace(-12, 12, 48001).astype(F32)
    want = 0.5 * dense.astype(np.float64) * np.vectorize(math.erfc)(-dense.astype(np.float64) / math.sqrt(2))
    x = dense.copy()
    native.gelu_erf(dense, dense.size)
    assert np.all(np.abs(dense - want) <= 4e-7 * np.abs(x) + 1e-30)
    # the tanh approximation would be off by up to ~5e-4 here: the test tells the two apart
    assert np.abs(dense - want).max() < 1e-5


@pytest.mark.parametrize("count", COUNTS)
def test_softcap(isa, count):
    r = rng(count + 1)
    x = (r.standard_normal(count) * 40).astype(F32)
    x[: min(count, 5)] = [0.0, 1e-6, -0.3, 1e4, -1e4][: min(count, 5)]
    want = 30.0 * np.tanh(x.astype(np.float64) / 30.0)
    native.softcap(x, 30.0, count)
    # tanh: series near 0 (no cancellation), 1 - 2/(e^2x + 1) elsewhere: ~3 ulp.
    np.testing.assert_allclose(x, want, rtol=3e-6, atol=1e-30)


def test_tanh_dense_range(isa):
    x = np.linspace(-12, 12, 48001).astype(F32)
    want = np.tanh(x.astype(np.float64))
    native.softcap(x, 1.0, x.size)
    np.testing.assert_allclose(x, want, rtol=3e-6, atol=1e-30)


@pytest.mark.parametrize("count", COUNTS)
def test_add_scale(isa, count):
    r = rng(count + 2)
    a = r.standard_normal(count).astype(F32)
    b = r.standard_normal(count).astype(F32)
    out = np.empty_like(a)
    native.add(a, b, out, count)
    assert np.array_equal(out, a + b)  # one float32 rounding: exact
    native.add(a, b, a, count)  # out aliases a
    assert np.array_equal(a, out)
    native.scale(a, 0.37, count)
    assert np.array_equal(a, out * F32(0.37))


@pytest.mark.parametrize("n,d", [(1, 896), (37, 17), (3, 1), (100, 1000)])
def test_add_rows(isa, n, d):
    r = rng(n + d)
    x = r.standard_normal((n, d)).astype(F32)
    bias = r.standard_normal(d).astype(F32)
    out = np.empty_like(x)
    native.add_rows(x, bias, out, n, d)
    assert np.array_equal(out, x + bias)


# ---------------------------------------------------------------- threads: results do not depend on them


def run_all_ops(seed):
    """Every op once, at sizes where the pool splits the work; returns the outputs."""
    r = rng(seed)
    res = {}
    x = r.standard_normal((64, 640)).astype(F32)
    w = r.standard_normal(640).astype(F32)
    res["rmsnorm"] = np.empty_like(x)
    native.rmsnorm(x, w, res["rmsnorm"], 64, 640, 1e-6)
    g = r.standard_normal(50001).astype(F32)
    u = r.standard_normal(50001).astype(F32)
    for name in ("silu_mul", "gelu_mul", "add"):
        res[name] = np.empty_like(g)
        getattr(native, name)(g, u, res[name], g.size)
    res["softcap"] = g * 10
    native.softcap(res["softcap"], 5.0, g.size)
    res["rope"] = r.standard_normal((40, 9, 64)).astype(F32)
    inv = (1.0 / 10000 ** (np.arange(0, 64, 2) / 64)).astype(F32)
    native.rope(res["rope"], np.arange(3, 43, dtype=np.int32), inv, 40, 9, 64, 64, 1)
    for ct in (0, 1):
        q, kc, vc, slots, pos = attention_data(seed, 64, 9, 3, 37, 2, 300, ct)
        out = np.empty_like(q)
        native.attention(q, kc, vc, out, slots, pos, 37, 9, 3, 64, 2, 300, ct, 0.125, 0, 0.0)
        res["attention%d" % ct] = out
        q1 = q[:1].copy()
        out1 = np.empty_like(q1)
        native.attention(q1, kc, vc, out1, slots[:1], np.array([299], np.int32), 1, 9, 3, 64, 2, 300, ct, 0.125, 0, 0.0)
        res["decode%d" % ct] = out1
        kc2, vc2 = make_cache(2, 300, 3, 64, ct)
        kv = r.standard_normal((300, 3, 64)).astype(F32)
        native.kv_store(kv, kv, kc2, vc2, np.zeros(300, np.int32), np.arange(300, dtype=np.int32), 300, 3, 64, 2, 300, ct)
        res["kv%d" % ct] = kc2
    return res


def test_threads_do_not_change_results(isa):
    before = native.threads()
    try:
        native.set_threads(1)
        one = run_all_ops(5)
        native.set_threads(2)
        two = run_all_ops(5)
        native.set_threads(3)  # more threads than cores: slower, still identical
        three = run_all_ops(5)
    finally:
        native.set_threads(before)
    for name in one:
        assert np.array_equal(one[name], two[name]), name
        assert np.array_equal(one[name], three[name]), name


def test_ops_do_not_allocate(threads2):
    run_all_ops(1)
    before = native.alloc_stats()
    run_all_ops(2)
    assert native.alloc_stats() == before


# ---------------------------------------------------------------- bad arguments


def attn_args(**over):
    n_slots, n_ctx, n_kv, hd, n, n_heads = 2, 16, 2, 16, 3, 4
    kc, vc = make_cache(n_slots, n_ctx, n_kv, hd, 1)
    a = dict(q=np.zeros((n, n_heads, hd), F32), kcache=kc, vcache=vc, out=np.zeros((n, n_heads, hd), F32),
             slots=np.zeros(n, np.int32), pos=np.arange(n, dtype=np.int32), n=n, n_heads=n_heads, n_kv=n_kv,
             head_dim=hd, n_slots=n_slots, n_ctx=n_ctx, cache_type=1, scale=0.25, window=0, softcap=0.0)
    a.update(over)
    return list(a.values())


def test_attention_valid_baseline():
    native.attention(*attn_args())  # the baseline for the bad-argument cases below is itself fine


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(q=np.zeros(10, F32)), "q has"),
        (dict(out=np.zeros((3, 4, 16), F32)[:, :, ::2]), "contiguous"),
        (dict(out=np.zeros(100, F32)), "out has"),
        (dict(q=np.zeros((3, 4, 16), np.float64)), "float32"),
        (dict(slots=np.array([0, 2, 0], np.int32)), r"slots\[1\] = 2"),
        (dict(slots=np.array([0, -1, 0], np.int32)), "slots"),
        (dict(pos=np.array([0, 16, 2], np.int32)), r"pos\[1\] = 16"),
        (dict(pos=np.array([0, -5, 2], np.int32)), "pos"),
        (dict(pos=np.arange(3, dtype=np.int64)), "int32"),
        (dict(slots=np.zeros(2, np.int32)), "slots has"),
        (dict(window=-1), "window"),
        (dict(head_dim=32), "q has"),
        (dict(n_ctx=32), "kcache has"),
        (dict(n_kv=3), "multiple of n_kv"),
        (dict(n=0), "n must be"),
        (dict(cache_type=0), "float32"),  # an f16 cache declared as f32
        (dict(cache_type=2), "multiple of 32"),  # q8_0 needs whole 32-value blocks per head
        (dict(cache_type=5), "cache_type"),
        (dict(softcap=-1.0), "softcap"),
        (dict(scale=float("nan")), "scale"),
        (dict(head_dim=2000), "head_dim"),
    ],
)
def test_attention_bad_arguments(over, match):
    with pytest.raises(ValueError, match=match):
        native.attention(*attn_args(**over))


def test_attention_head_dim_mismatch_with_big_q():
    """q/out big enough for the wrong head_dim: the cache size still exposes it."""
    big = np.zeros((3, 4, 32), F32)
    with pytest.raises(ValueError, match="kcache has"):
        native.attention(*attn_args(q=big, out=big.copy(), head_dim=32))


def test_readonly_output_rejected():
    x = np.zeros(8, F32)
    x.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        native.scale(x, 2.0, 8)
    with pytest.raises(ValueError, match="writable"):
        native.add(np.zeros(8, F32), np.zeros(8, F32), x, 8)


def test_other_ops_bad_arguments():
    z, c, q8 = np.zeros(64, F32), np.zeros(64, F32), np.zeros((1, 4, 34), np.uint8)
    i32 = np.zeros(4, np.int32)
    cases = [
        (lambda: native.rmsnorm(z, z, z, 2, 64, 1e-5), "x has"),
        (lambda: native.rmsnorm(z, z[:10], z, 1, 64, 1e-5), "w has"),
        (lambda: native.rmsnorm(z, z, z, 1, 64, -1.0), r"eps must be finite and >= 0\.0, got -1\.0$"),
        (lambda: native.rmsnorm(z, z, z, 1, 0, 1e-5), "d must be"),
        (lambda: native.rope(z, i32, z, 4, 1, 16, 15, 0), "even"),
        (lambda: native.rope(z, i32, z, 4, 1, 16, 18, 0), "rope_dim"),
        (lambda: native.rope(z, np.array([0, 1, -1, 2], np.int32), z, 4, 1, 16, 16, 0), "pos"),
        (lambda: native.rope(z, i32, z[:3], 4, 1, 16, 16, 0), "inv_freq has"),
        (lambda: native.rope(z, i32, z, 4, 1, 16, 16, 2), "neox"),
        (lambda: native.kv_store(z, z, np.zeros(63, F32), np.zeros(64, F32), i32[:1], i32[:1], 1, 1, 16, 1, 4, 0), "kcache has"),
        (lambda: native.kv_store(z, z, z.copy(), z.copy(), i32[:1], np.array([4], np.int32), 1, 1, 16, 1, 4, 0), "pos"),
        (lambda: native.kv_store(z, z, z.copy(), z.copy(), np.array([1], np.int32), i32[:1], 1, 1, 16, 1, 4, 0), "slots"),
        (lambda: native.kv_store(z, z.copy(), c, c, i32[:1], i32[:1], 1, 1, 16, 1, 4, 0), "same buffer but k and v"),
        (lambda: native.kv_store(z, z, z.copy(), z.copy(), i32[:1], i32[:1], 1, 1, 16, 1, 4, 1), "float16"),
        # a cache shares every row with the other or none, and nothing read overlaps one (wrong rows, no error)
        (lambda: native.kv_store(z[:16], z[:16], c[:32], c[16:48], i32[:1], i32[:1], 1, 1, 16, 1, 2, 0),
         "kcache and vcache overlap without"),
        (lambda: native.kv_store(c[:16], c[:16], c, c, i32[:1], i32[:1], 1, 1, 16, 1, 4, 0), "overlaps the cache"),
        (lambda: native.kv_store(z[:16], z[:16], c, c, c[:1].view(np.int32), i32[:1], 1, 1, 16, 1, 4, 0),
         "overlaps the cache"),
        (lambda: native.attention(z[:16], c, c, c[:16], i32[:1], i32[:1], 1, 1, 1, 16, 1, 4, 0, 0.25, 0, 0.0),
         "out overlaps kcache"),
        (lambda: native.attention(z[:32], c, c, z[16:48], i32[:1], i32[:1], 1, 2, 1, 16, 1, 4, 0, 0.25, 0, 0.0),
         "out overlaps q without being it"),
        (lambda: native.attention(z[:32], q8, q8, c[:32], i32[:1], i32[:1], 1, 1, 1, 32, 1, 4, 2, 0.25, 0, 0.0,
                                  np.zeros(32, F32)), "kcache is vcache"),
        (lambda: native.silu_mul(z, z, z, 65), "out has|gate has"),
        (lambda: native.gelu_mul(z, z[:5], z, 6), "up has"),
        (lambda: native.add(z, z, z, 0), "count"),
        (lambda: native.add_rows(z, z[:3], z, 16, 4), "bias has"),
        (lambda: native.scale(z, float("inf"), 64), "finite"),
        (lambda: native.softcap(z, 0.0, 64), "cap"),
        (lambda: native.softcap(z[::2], 1.0, 32), "contiguous"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError):
        native.add(z, z, z)
    with pytest.raises(TypeError):
        native.scale(z, 2.0, "64")


def test_raw_byte_buffers_accepted():
    """Views of a byte arena (format 'B') are accepted when large enough and aligned."""
    arena = np.zeros(4 * 64 + 4, np.uint8)
    a = arena[: 4 * 64]
    native.add(a, a, a, 64)
    native.add(bytes(256), a, a, 64)  # read-only bytes are fine as an input
    with pytest.raises(ValueError, match="aligned"):
        native.add(arena[1 : 1 + 4 * 32], a, a, 32)


# ---------------------------------------------------------------- attention at depth

# (head_dim, n_heads, n_kv, n, n_ctx): decode and short batches over thousands of cached keys
DEEP_CASES = [
    (64, 14, 2, 1, 4100),   # Qwen2.5-0.5B decode at depth ~4096: 16 chunks of 256 keys, merged
    (64, 9, 3, 1, 6000),    # SmolLM2 decode deeper still
    (128, 16, 2, 3, 3000),  # three tokens of one sequence (a short prefill chunk or speculative batch)
    (128, 12, 2, 67, 3100), # Qwen2.5-1.5B prefill chunk at depth ~3000: tiles of 8 tokens x 6 heads, a short last one
    (64, 9, 3, 1, 200),     # SmolLM2 decode in one chunk: 3 kv heads on 2 threads are cut by query heads
    (256, 4, 1, 1, 180),    # Gemma 3's one kv head in one chunk: its 4 heads cut over the threads
]


@pytest.mark.parametrize("cache_type", [0, 1, 2], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("invariant", [False, True], ids=["default", "invariant"])
@pytest.mark.parametrize("case", DEEP_CASES, ids=lambda c: "hd%d-h%d-kv%d-n%d-ctx%d" % c)
def test_attention_at_depth(isa, cache_type, invariant, case):
    """Against the NumPy oracle over thousands of keys, and bit-identical whatever the thread count
    (the chunks and their merge order come from the row alone, whichever thread runs a chunk)."""
    hd, n_heads, n_kv, n, n_ctx = case
    q, kc, vc, slots, pos = attention_data(sum(case), hd, n_heads, n_kv, n, 1, n_ctx, cache_type)
    if n > 1:
        pos = np.arange(n_ctx - n, n_ctx, dtype=np.int32)
    scale = 1.0 / np.sqrt(hd)
    want = ref_attention(q, kc, vc, slots, pos, n_heads, n_kv, scale, 0, 0.0)
    threads = native.threads()
    outs = []
    try:
        native.set_batch_invariant(invariant)
        for t in (1, 2, 3):
            native.set_threads(t)
            out = np.full_like(q, np.nan)
            native.attention(q, kc, vc, out, slots, pos, n, n_heads, n_kv, hd, 1, n_ctx, cache_type, scale, 0, 0.0)
            outs.append(out)
    finally:
        native.set_threads(threads)
        native.set_batch_invariant(False)  # the module's default
    # Budget: as test_attention, plus float32 sums over up to 6000 keys (16-24 merged partials).
    np.testing.assert_allclose(outs[0], want, rtol=0, atol=1e-5)
    for out in outs[1:]:
        assert np.array_equal(out, outs[0])


# ---------------------------------------------------------------- copy_blocks


def test_copy_blocks():
    """A strided block copy (latent attention assembles its heads with it): each block lands where asked,
    a group stride of 0 repeats the source block, nothing else in dst is touched, bad extents are refused."""
    r = rng(7)
    src = r.normal(0, 1, (5, 3, 10)).astype(F32)
    dst = np.full((5, 3, 16), 7.0, F32)
    native.copy_blocks(src, dst, 5, 3, 6, 30, 10, 2, 48, 16, 4)
    want = np.full((5, 3, 16), 7.0, F32)
    want[:, :, 4:10] = src[:, :, 2:8]
    np.testing.assert_array_equal(dst, want)
    shared = r.normal(0, 1, (5, 8)).astype(F32)
    native.copy_blocks(shared, dst, 5, 3, 8, 8, 0, 0, 48, 16, 8)
    want[:, :, 8:16] = shared[:, None, :]
    np.testing.assert_array_equal(dst, want)
    with pytest.raises(ValueError):         # reaches past src's end
        native.copy_blocks(src, dst, 5, 3, 6, 30, 10, 5, 48, 16, 4)
    with pytest.raises(ValueError):         # past dst's
        native.copy_blocks(src, dst, 5, 3, 6, 30, 10, 2, 48, 16, 11)
    with pytest.raises(ValueError):         # overlapping
        native.copy_blocks(dst, dst[1:], 2, 1, 4, 48, 0, 0, 48, 0, 0)
    with pytest.raises(ValueError):
        native.copy_blocks(src, dst, 0, 3, 6, 30, 10, 2, 48, 16, 4)


# ---------------------------------------------------------------- Mamba2 (Granite 4): conv bias, selective scan


def ref_ssm_scan(xbc, dt, z, state, a_neg, dt_bias, d_skip, norm_w, eps, slots, pos, groups):
    """float64, token by token from each slot's history: Mamba2's scan, D skip, silu(z) gate, group RMSNorm
    (none when norm_w is None)."""
    n_slots, H, N, P = state.shape
    S = state.astype(np.float64).copy()
    out = np.zeros((len(slots), H * P))
    for t, (s, p) in enumerate(zip(slots, pos)):
        if p == 0:
            S[s] = 0
        row = xbc[t].astype(np.float64)
        x, rest = row[:H * P].reshape(H, P), row[H * P:]
        B, C = rest[:groups * N].reshape(groups, N), rest[groups * N:].reshape(groups, N)
        for h in range(H):
            g = h // (H // groups)
            d = np.log1p(np.exp(float(dt[t, h]) + float(dt_bias[h])))
            S[s, h] = np.exp(d * float(a_neg[h])) * S[s, h] + d * np.outer(B[g], x[h])
            zh = z[t, h * P:(h + 1) * P].astype(np.float64)
            out[t, h * P:(h + 1) * P] = (C[g] @ S[s, h] + float(d_skip[h]) * x[h]) * zh / (1 + np.exp(-zh))
        if norm_w is not None:
            y = out[t].reshape(groups, -1)
            out[t] = (y / np.sqrt((y * y).mean(-1, keepdims=True) + eps)).reshape(-1) * norm_w
    return out, S


@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("groups, heads, dstate, dhead", [(1, 4, 8, 16), (2, 8, 16, 5), (3, 3, 7, 33)])
def test_ssm_scan(isa, groups, heads, dstate, dhead, normed):
    """Slots interleaved in one batch, one restarted at position 0 mid-batch, against float64 from history;
    with the gated group norm, or without (norm_w None: Falcon-H1's mamba_rms_norm false)."""
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    r = rng(heads * dstate + dhead)
    n_slots, xd = 3, heads * dhead
    slots = np.array([0, 1, 0, 2, 1, 0, 2, 2, 1], np.int32)
    pos = np.array([4, 0, 5, 7, 1, 0, 8, 9, 2], np.int32)          # slot 0 restarts at its third token
    n = len(slots)
    xbc = r.standard_normal((n, xd + 2 * groups * dstate)).astype(F32)
    dt, z = r.standard_normal((n, heads)).astype(F32), r.standard_normal((n, xd)).astype(F32)
    state0 = r.standard_normal((n_slots, heads, dstate, dhead)).astype(F32)
    a_neg = -np.exp(r.uniform(-2, 0.5, heads)).astype(F32)
    dt_bias, d_skip = r.standard_normal(heads).astype(F32), r.standard_normal(heads).astype(F32)
    norm_w = (1 + 0.1 * r.standard_normal(xd)).astype(F32) if normed else None
    want, want_state = ref_ssm_scan(xbc, dt, z, state0, a_neg, dt_bias, d_skip, norm_w, 1e-6, slots, pos, groups)
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        state, taken = state0.copy(), np.array([4, 0, 7], np.int32)
        out = np.full((n, xd), np.nan, F32)
        backend.ssm_scan(xbc, dt, z, state, taken, a_neg, dt_bias, d_skip, norm_w, 1e-6, slots, pos, out, groups)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5, err_msg=backend.name)
        np.testing.assert_allclose(state, want_state, rtol=2e-5, atol=2e-5, err_msg=backend.name)
        assert taken.tolist() == [1, 3, 10]


def test_conv_silu_bias(isa):
    """Mamba2's convolution: silu(conv + bias) from each slot's history, the state as without a bias; a bias on
    LFM2's gated convolution is refused."""
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    r = rng(11)
    d, width = 37, 4
    slots, pos = np.array([0, 1, 0, 1], np.int32), np.array([0, 3, 1, 4], np.int32)
    x = r.standard_normal((4, d)).astype(F32)
    kernel, bias = r.standard_normal((d, width)).astype(F32), r.standard_normal(d).astype(F32)
    state0 = r.standard_normal((2, width - 1, d)).astype(F32)
    state, want = state0.astype(np.float64).copy(), np.zeros((4, d))       # the oracle, float64
    for t, (s, p) in enumerate(zip(slots, pos)):
        if p == 0:
            state[s] = 0
        window = np.concatenate([state[s], x[t].astype(np.float64)[None]])
        y = np.einsum("jc,cj->c", window, kernel.astype(np.float64)) + bias
        want[t] = y / (1 + np.exp(-y))
        state[s] = window[1:]
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        st, taken, out = state0.copy(), np.array([0, 3], np.int32), np.empty((4, d), F32)
        backend.conv_silu(x, st, taken, kernel, slots, pos, out, bias=bias)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5, err_msg=backend.name)
        np.testing.assert_allclose(st, state, rtol=1e-6, atol=1e-6, err_msg=backend.name)
        assert taken.tolist() == [2, 5]
    with pytest.raises(ValueError, match="ungated"):
        native.short_conv(np.zeros((1, 3 * d), F32), np.zeros((1, width - 1, d), F32), np.zeros(1, np.int32), kernel,
                          np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, d), F32), 1, d, width, 1, 1, bias)


def test_ssm_scan_refuses_bad_arguments():
    """A position that does not continue its slot's state, a written array over an input, sizes that do not
    divide or do not fit: ValueErrors, nothing run."""
    H, G, N, P, n = 4, 2, 8, 4, 2
    xbc, dt, z = np.zeros((n, H * P + 2 * G * N), F32), np.zeros((n, H), F32), np.zeros((n, H * P), F32)
    state, taken = np.zeros((1, H, N, P), F32), np.array([3], np.int32)
    vec, w = np.zeros(H, F32), np.ones(H * P, F32)
    slots, pos, out = np.zeros(n, np.int32), np.array([3, 4], np.int32), np.zeros((n, H * P), F32)

    def call(**kw):
        a = dict(xbc=xbc, dt=dt, z=z, state=state, taken=taken, slots=slots, pos=pos, out=out, heads=H, groups=G)
        a.update(kw)
        native.ssm_scan(a["xbc"], a["dt"], a["z"], a["state"], a["taken"], vec, vec, vec, w, a["slots"], a["pos"],
                        a["out"], n, a["groups"], a["heads"], N, P, 1, 1e-6)

    call()
    assert taken[0] == 5
    over = np.zeros((n, H * P), F32)      # written arrays over the indices: slots under out, taken under pos
    for kw in (dict(out=over, slots=over.reshape(-1)[:n].view(np.int32)),
               dict(taken=pos[:1], pos=pos), dict(state=state, out=state.reshape(-1)[:n * H * P].reshape(n, H * P))):
        with pytest.raises(ValueError, match="overlaps"):
            call(**kw)
    # without the norm's weights (None: no norm) the written arrays are still told apart and named
    with pytest.raises(ValueError, match="out overlaps slots"):
        native.ssm_scan(xbc, dt, z, state, taken, vec, vec, vec, None, over.reshape(-1)[:n].view(np.int32), pos, over,
                        n, G, H, N, P, 1, 1e-6)
    for kw, match in ((dict(pos=np.array([3, 4], np.int32)), "continue"),         # the state is now at 5
                      (dict(out=xbc.reshape(-1)[:n * H * P].reshape(n, H * P)), "overlaps"), (dict(groups=3), "multiple"),
                      (dict(state=np.zeros((1, H, N, P - 1), F32)), "state"), (dict(slots=np.array([0, 1], np.int32)),
                                                                              "slot")):
        with pytest.raises(ValueError, match=match):
            call(**kw)
    assert taken[0] == 5

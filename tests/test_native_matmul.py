"""The C matmul kernels (llambda._native) against NumPy.

Weights are random (quantized random floats, or random bytes with sane fp16
scales for the K-quants); the oracle is gguf-py's NumPy dequantizer (an
independent implementation of the block formats) and x @ W.T in float64.

Error budgets, per output element (i, r), with A = |W| except for the types
with a separate min term (those whose traits have min_at: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) where A = |scale*q| + |min| (the two
terms the kernels compute separately, so their rounding scales with both):
  exact (FP32 activations):      |err| <= EXACT_RTOL * sum_k |x[i,k]| A[r,k]
  fast (8-bit activations):      |err| <= sum_k A[r,k] * amax(32-block of x[i] holding k) / 254
                                           + EXACT_RTOL * sum_k |x[i,k]| A[r,k]
The fast bound is the worst case of rounding each activation to the nearest
multiple of amax/127 (half a step, 1/254 of the block's absmax); everything
else in the integer kernels is exact or FP32 rounding. Fast mode must also
match, to EXACT_RTOL, the product with activations quantized in NumPy exactly
as specified (one scale per 32 values for every quantized type, the K-quants
included; d = amax/127, codes = round-half-even(x * 127/amax); in the 32-block
types an outlier block adds the codes of its residual, see quantized_activations),
so an error that rounding would hide (a wrong block scale, truncation instead of
rounding, a residual skipped or added twice) still fails. The fast bound above
holds with the residual too (it only shrinks each block's rounding error).
"""
import numpy as np
import pytest

gguf_quants = pytest.importorskip("gguf.quants", reason="gguf-py (test dependency) provides the NumPy oracle")
from gguf import GGMLQuantizationType as G  # noqa: E402

from llambda import _native as nat  # noqa: E402

from llambda.formats import quants as Q  # noqa: E402

# Every type the C core runs, from its type table: name -> ggml id, values per block.
TYPES = {t["name"]: t["id"] for t in nat.qtypes()}
BLOCK = {t["name"]: t["block"] for t in nat.qtypes()}
FAR_SKEW = {t["name"]: t["far_skew"] for t in nat.qtypes()}  # bytes past a page where the arena starts a matrix on AMD
FLOATS = [t for t, b in BLOCK.items() if b == 1]
ACT_BLOCK = {t: min(b, 32) for t, b in BLOCK.items()}
ISAS = nat.isa_available()
OUTLIER = nat.outlier_threshold()  # LLB_OUTLIER (kernels.h), as this build has it
EXACT_RTOL = 2e-6  # FP32 accumulation over up to ~9000 terms; measured <= 3e-7 at 1536
N_VALUES = (1, 2, 3, 7, 16, 33, 65)


@pytest.fixture(autouse=True)
def _restore_native_state():
    isa, threads = nat.isa(), nat.threads()
    yield
    nat.set_isa(isa)
    nat.set_threads(threads)


def mm64(a, b):
    """a @ b in float64 without BLAS: OpenBLAS's threads, oversubscribed next to our pool on
    a small machine, can make each small product 50x slower."""
    return np.einsum("ik,kj->ij", np.asarray(a, np.float64), np.asarray(b, np.float64))


def _f16_scales(rng, n, lo, hi):
    return rng.uniform(lo, hi, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)


def make_weights(tname, rows, cols, rng):
    """Random weights in the file layout: uint8 array (rows, row_bytes). Quantized from Gaussian
    floats where gguf-py has a quantizer for the type, else random codes with sane scales."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, : min(cols, 8)] *= 4  # a few large weights per row, as real matrices have
    if tname == "F32":
        return w.view(np.uint8).reshape(rows, -1)
    try:
        raw = gguf_quants.quantize(w, getattr(G, tname))
    except NotImplementedError:  # the K-quants, IQ4 and MXFP4: gguf-py only dequantizes them
        return Q.random_blocks(rng, tname, rows * cols // BLOCK[tname], spread=2e-2).reshape(rows, -1)
    return np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)


def dequant(tname, raw, rows, cols):
    if tname == "F32":
        return raw.view(np.float32).reshape(rows, cols).copy()
    return gguf_quants.dequantize(raw.reshape(rows, -1), getattr(G, tname)).reshape(rows, cols)


def magnitude(tname, raw, rows, cols, w):
    """A = |scale*q| + |min| for min-carrying types, else |W| (see module docstring)."""
    tr = Q.TRAITS[Q.QType[tname]]
    if tr.min_at is None:
        return np.abs(w)
    nomin = raw.reshape(-1, tr.type_size).copy()
    nomin[:, tr.min_at:tr.min_at + 2] = 0  # the min's fp16 scale
    w0 = dequant(tname, nomin, rows, cols)
    return np.abs(w0) + np.abs(w - w0)


def pack(tname, raw, rows, cols):
    dst = np.zeros(nat.packed_size(TYPES[tname], rows, cols), np.uint8)
    layout = nat.pack(TYPES[tname], raw, dst, rows, cols)
    return layout, dst


def run(tname, layout, wbuf, rows, cols, x, exact):
    out = np.full((x.shape[0], rows), np.nan, np.float32)
    nat.matmul(TYPES[tname], layout, wbuf, rows, cols, x, out, x.shape[0], exact)
    return out


def half_steps(tname, x):
    """h[i, k]: half the quantization step of activation x[i, k] (amax of its 32-block / 254)."""
    blk = ACT_BLOCK[tname]
    amax = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, blk).max(axis=2)
    return np.repeat(amax / 254.0, blk, axis=1)


def _codes(xb):
    """Codes and scale per block (last axis), as the C code rounds: float32 product, half to even."""
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.rint(xb * inv), (amax / np.float32(127)).astype(np.float32), amax


def quantized_activations(tname, x):
    """x as the fast kernels see it: 8-bit codes times a float32 scale per 32 values; in the 32-block
    types a block whose absmax^2 exceeds OUTLIER^2 * mean(x^2) of its row adds the 8-bit code of its
    residual x - d*q (rounded once, as the C code's fused multiply-add) with its own scale."""
    blk = ACT_BLOCK[tname]
    xb = x.reshape(x.shape[0], -1, blk)
    codes, d, amax = _codes(xb)
    xq = codes.astype(np.float64) * d
    if BLOCK[tname] == 32:
        x64 = x.astype(np.float64)
        t2 = OUTLIER ** 2 * (x64 * x64).sum(axis=1) / x.shape[1]
        flag = amax[..., 0].astype(np.float64) ** 2 > t2[:, None]
        r = (xb.astype(np.float64) - codes * d.astype(np.float64)).astype(np.float32)
        codes2, d2, _ = _codes(r)
        xq += np.where(flag[..., None], codes2.astype(np.float64) * d2, 0.0)
    return xq.reshape(x.shape)


def fast_reference(tname, x, wt64):
    """The fast kernels' result in float64 (wt64 = W.T): every weight type, Q4_1's min term
    included, multiplies the quantized activations."""
    return mm64(quantized_activations(tname, x), wt64)


def budget(tname, x, at64, exact):
    """Per-element tolerance; at64 = A.T in float64."""
    tol = EXACT_RTOL * mm64(np.abs(x), at64)
    if not exact and BLOCK[tname] > 1:
        tol += 1.0001 * mm64(half_steps(tname, x), at64)
    return tol + 1e-30


class Matrix:
    """Random weights with everything the checks derive from them, computed once."""

    def __init__(self, tname, rows, cols, rng):
        self.tname, self.rows, self.cols = tname, rows, cols
        self.raw = make_weights(tname, rows, cols, rng)
        self.w = dequant(tname, self.raw, rows, cols)
        self.a = magnitude(tname, self.raw, rows, cols, self.w)
        self.wt64, self.at64 = self.w.T.astype(np.float64), self.a.T.astype(np.float64)  # (cols, rows)
        self.packed = pack(tname, self.raw, rows, cols)


def check(m, x, exact, layouts=(0, 1)):
    tname, raw, rows, cols = m.tname, m.raw, m.rows, m.cols
    ref = mm64(x, m.wt64)
    tol = budget(tname, x, m.at64, exact)
    for layout, buf in ((0, raw), m.packed):
        if layout not in layouts:
            continue
        out = run(tname, layout, buf, rows, cols, x, exact)
        err = np.abs(out - ref)
        bad = ~(err <= tol)
        where = f"{tname} layout={layout} exact={exact} isa={nat.isa()} rows={rows} cols={cols} n={x.shape[0]}"
        assert not bad.any(), (f"{where}: {bad.sum()} elements over budget, worst err {err.max():.3g} "
                               f"vs tol {tol[np.unravel_index(err.argmax(), err.shape)]:.3g}")
        if not exact and BLOCK[tname] > 1:
            fref = fast_reference(tname, x, m.wt64)
            ftol = EXACT_RTOL * mm64(np.abs(quantized_activations(tname, x)), m.at64) + 1e-30
            ferr = np.abs(out - fref)
            assert (ferr <= ftol).all(), (f"{where}: differs from 8-bit activations emulated in NumPy by "
                                          f"{ferr.max():.3g} (tol {ftol[np.unravel_index(ferr.argmax(), ferr.shape)]:.3g})")


def activations(n, cols, rng):
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, ::17] *= 8  # outliers, as in real activations
    return x


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("exact", [1, 0], ids=["exact", "fast"])
@pytest.mark.parametrize("tname", list(TYPES))
def test_matmul_random(tname, exact, isa):
    nat.set_isa(isa)
    rng = np.random.default_rng(TYPES[tname] * 10 + exact)
    blk = max(BLOCK[tname], 32)
    col_options = (blk, 3 * blk) if blk == 256 else (blk, 5 * blk)
    if tname in FLOATS:
        col_options = (7, 96, 131)  # float types accept any width; a tail of a 32-wide chunk must be handled
    for rows in (1, 15, 17, 100):
        for cols in col_options:
            m = Matrix(tname, rows, cols, rng)
            for n in N_VALUES:
                if rows * n > 2000 and n not in (1, 65):
                    continue  # keep runtime small: the big shapes see the GEMV and the widest GEMM
                check(m, activations(n, cols, rng), exact)


# The four models' matrix shapes (rows, cols) and types, as in their GGUF files; the
# biggest matrices are cut to a slice of their rows (same cols, same code path).
REAL_SHAPES = [
    ("Q4_1", 576, 576), ("Q4_1", 192, 576), ("Q4_1", 1536, 576), ("Q4_1", 576, 1536),  # SmolLM2 attn/ffn
    ("Q8_0", 1000, 576),  # SmolLM2's tied embedding / output head (49152 rows)
    ("Q5_0", 1024, 640), ("Q5_0", 256, 640), ("Q8_0", 256, 640), ("Q4_K", 640, 1024),  # Gemma-3 attn
    ("Q5_0", 2048, 640), ("Q4_K", 640, 2048), ("Q6_K", 640, 2048),  # Gemma-3 ffn
    ("Q5_0", 896, 896), ("Q5_0", 128, 896), ("Q8_0", 128, 896),  # Qwen2.5-0.5B attn
    ("Q5_0", 1200, 896), ("Q4_K", 896, 4864), ("Q6_K", 896, 4864),  # Qwen2.5-0.5B ffn (gate/up: 4864 rows)
    ("Q4_K", 1536, 1536), ("Q4_K", 1000, 1536), ("Q6_K", 300, 8960),  # Qwen2.5-1.5B (ffn 8960)
    # the row-block types at the shapes their files use (K-quant mixes, IQ4, gpt-oss's 2880-wide MXFP4
    # experts); widths that leave a partial decode piece (896, 2880, 4864 are not multiples of 512)
    ("Q5_K", 896, 4864), ("Q3_K", 640, 2048), ("Q2_K", 576, 1536), ("IQ4_XS", 896, 4864),
    ("Q5_1", 896, 896), ("IQ4_NL", 1200, 896), ("MXFP4", 640, 2880),
]


@pytest.mark.parametrize("tname,rows,cols", REAL_SHAPES, ids=[f"{t}-{r}x{c}" for t, r, c in REAL_SHAPES])
def test_matmul_real_shapes(tname, rows, cols):
    rng = np.random.default_rng(rows * 7 + cols)
    m = Matrix(tname, rows, cols, rng)
    xs = {n: activations(n, cols, rng) for n in (1, 5)}
    for isa in ISAS:
        nat.set_isa(isa)
        for n in (1, 5) if isa != "scalar" else (1,):
            for exact in (0, 1):
                check(m, xs[n], exact, layouts=(1,))


class _Given(Matrix):
    """A Matrix of the given file-layout bytes."""

    def __init__(self, tname, raw, rows, cols):
        self.tname, self.rows, self.cols, self.raw = tname, rows, cols, raw
        self.w = dequant(tname, raw, rows, cols)
        self.a = magnitude(tname, raw, rows, cols, self.w)
        self.wt64, self.at64 = self.w.T.astype(np.float64), self.a.T.astype(np.float64)
        self.packed = pack(tname, raw, rows, cols)


@pytest.mark.parametrize("tname", [t for t in TYPES if t not in FLOATS])
def test_matmul_extreme_codes(tname):
    """Every code bit set (the largest codes of most types) against activations that all
    quantize to +127 (and to -127): the integer kernels' narrow partial sums (int16 in the
    AVX2 kernels) must not wrap or saturate. Random codes almost never reach those sums.
    Fast mode only: exact mode has no integer sums (and equal terms' FP32 rounding errors add up
    past EXACT_RTOL, which is set for random data)."""
    rng = np.random.default_rng(TYPES[tname])
    rows, cols = 17, 2 * max(BLOCK[tname], 32)
    tr = Q.TRAITS[Q.QType[tname]]
    keep = Q.random_blocks(rng, tname, rows * cols // BLOCK[tname], spread=2e-2)
    width = 1 if tr.scale_format == "e8m0" else 2
    x = np.ones((9, cols), np.float32)
    x[1::2] *= -1
    # every bit clear too: the codes farthest below a zero point (Q6_K's 0 - 32, summed in int16 words)
    for fill in (0xFF, 0x00):
        raw = keep.copy()
        raw[:] = fill
        for at in tr.scales:  # the scale fields stay finite
            raw[:, at:at + width] = keep[:, at:at + width]
        if tname == "Q6_K" and fill == 0x00:
            raw[:, 192:208] = 0x7F  # its int8 sub-block scales (all 0 would hide the codes)
        m = _Given(tname, raw.reshape(rows, -1), rows, cols)
        for isa in ISAS:
            nat.set_isa(isa)
            for n in (1, 9):
                check(m, x[:n], 0)


def test_mxfp4_every_exponent():
    """MXFP4's E8M0 scales 2^(e-127) from the smallest (e = 0, 1: subnormal floats once halved for
    the doubled grid) to large ones, one exponent per row, each row checked against its own
    magnitude: activations of 1e20 lift the tiny rows' products far above the budget's absolute
    floor, so a scale decoded as 0 (or as the next power of two) fails."""
    rng = np.random.default_rng(39)
    exps = np.array([0, 1, 2, 3, 64, 127, 128, 150], np.uint8)
    rows, cols = 2 * 16, 96  # two packed groups
    raw = Q.random_blocks(rng, "MXFP4", rows * cols // 32, spread=2e-2).reshape(rows, cols // 32, 17)
    raw[:, :, 0] = exps[np.arange(rows) % len(exps)][:, None]
    m = _Given("MXFP4", raw.reshape(rows, -1), rows, cols)
    assert (m.w[0] != 0).any() and np.abs(m.w[0]).max() < 1e-36  # the subnormal scales are there
    x = activations(9, cols, rng) * np.float32(1e20)
    for isa in ISAS:
        nat.set_isa(isa)
        for n in (1, 9):
            for exact in (0, 1):
                check(m, x[:n], exact)


@pytest.mark.parametrize("tname", list(TYPES))
def test_threads_identical(tname):
    """Splitting work over 2 threads changes nothing, bit for bit. The n=70 GEMM and the
    600-row products are above the size (128 KB of weights x activation rows) from which the
    driver splits; n=3 stays on one thread and must match too. Up to 64 rows each thread
    quantizes its own copy of the activations (n=1, 9: a GEMV, a tile and a row); beyond,
    the threads share one (n=70)."""
    rng = np.random.default_rng(5)
    for rows, c, ns in ((75, 512 if BLOCK[tname] == 256 else 160, (3, 70)), (600, 512, (1, 9))):
        raw = make_weights(tname, rows, c, rng)
        layout, buf = pack(tname, raw, rows, c)
        for isa in ISAS:
            nat.set_isa(isa)
            for n in ns:
                x = activations(n, c, rng)
                for exact in (0, 1):
                    nat.set_threads(1)
                    one = run(tname, layout, buf, rows, c, x, exact)
                    nat.set_threads(2)
                    two = run(tname, layout, buf, rows, c, x, exact)
                    assert np.array_equal(one, two), f"{tname} isa={isa} rows={rows} n={n} exact={exact}"


@pytest.mark.parametrize("tname", list(TYPES))
def test_get_rows_and_dequant(tname):
    rng = np.random.default_rng(11)
    rows, cols = 37, 2 * max(BLOCK[tname], 32)
    raw = make_weights(tname, rows, cols, rng)
    w = dequant(tname, raw, rows, cols)
    layout, buf = pack(tname, raw, rows, cols)
    ids = np.array([0, 36, 17, 16, 15, 3, 3], np.int32)
    for lay, b in ((0, raw), (layout, buf)):
        out = np.full((len(ids), cols), np.nan, np.float32)
        nat.get_rows(TYPES[tname], lay, b, rows, cols, ids, out, len(ids))
        np.testing.assert_allclose(out, w[ids], rtol=1e-6, atol=1e-7 * np.abs(w).max())
        full = np.full((rows, cols), np.nan, np.float32)
        nat.dequant_rows(TYPES[tname], lay, b, rows, cols, full)
        np.testing.assert_allclose(full, w, rtol=1e-6, atol=1e-7 * np.abs(w).max())


@pytest.mark.parametrize("tname", list(TYPES))
def test_pack_count_is_each_matrix_packed_on_its_own(tname):
    """pack(..., count): an MoE layer's experts back to back, in one call, byte for byte what packing each
    alone writes (a row count that leaves a partial 16-row group, so no group straddles two matrices)."""
    rng = np.random.default_rng(5)
    count, rows, cols = 3, 21, 2 * max(BLOCK[tname], 32)
    raws = [make_weights(tname, rows, cols, rng) for _ in range(count)]
    size = nat.packed_size(TYPES[tname], rows, cols)
    dst = np.full(size * count, 0xAB, np.uint8)
    layout = nat.pack(TYPES[tname], np.concatenate([r.reshape(-1) for r in raws]), dst, rows, cols, count)
    for e, raw in enumerate(raws):
        one_layout, one = pack(tname, raw, rows, cols)
        assert layout == one_layout and bytes(dst[e * size:(e + 1) * size]) == bytes(one), e


@pytest.mark.parametrize("tname", list(TYPES))
def test_packing_on_1_2_3_threads_writes_the_same_bytes(tname):
    """The pool splits a pack's row groups (over every expert of an MoE tensor) among its threads: the packed
    bytes do not depend on how many (a row count with a partial group, an odd expert count)."""
    rng = np.random.default_rng(8)
    count, rows, cols = 5, 53, 3 * max(BLOCK[tname], 32)
    src = np.concatenate([make_weights(tname, rows, cols, rng).reshape(-1) for _ in range(count)])
    size = nat.packed_size(TYPES[tname], rows, cols)
    was, out = nat.threads(), []
    try:
        for n in (1, 2, 3):
            nat.set_threads(n)
            dst = np.full(size * count, 0xAB, np.uint8)
            out.append((nat.pack(TYPES[tname], src, dst, rows, cols, count), bytes(dst)))
    finally:
        nat.set_threads(was)
    assert out[0] == out[1] == out[2]


def test_pack_count_is_checked():
    q41 = TYPES["Q4_1"]
    rows, cols = 16, 64
    one = nat.row_bytes(q41, cols) * rows
    src, dst = np.zeros(2 * one, np.uint8), np.zeros(2 * nat.packed_size(q41, rows, cols), np.uint8)
    assert nat.pack(q41, src, dst, rows, cols, 2) == nat.pack(q41, src[:one], dst, rows, cols)
    with pytest.raises(ValueError):
        nat.pack(q41, src, dst, rows, cols, 3)       # src and dst hold two
    with pytest.raises(ValueError):
        nat.pack(q41, src, dst, rows, cols, 0)
    with pytest.raises(TypeError):
        nat.pack(q41, src, dst, rows, cols, 2, 1)    # one argument too many


def test_sizes():
    assert nat.row_bytes(TYPES["Q4_1"], 576) == 18 * 20
    assert nat.row_bytes(TYPES["Q6_K"], 512) == 2 * 210
    assert nat.row_bytes(TYPES["BF16"], 7) == 14
    assert nat.packed_size(TYPES["F32"], 3, 5) == 60  # float types keep the file layout
    assert nat.packed_size(TYPES["Q4_0"], 17, 64) == 2 * 2 * 16 * 18  # 2 groups of 16 rows, padded
    assert nat.packed_size(TYPES["Q4_K"], 16, 256) == 2368  # the K-quants carry unpacked scales (+2.8%)


def packed_parts(tnames, rows, c, rng):
    """(type, rows, layout, W) per matrix: packed, but the second in the file layout."""
    mats = []
    for k, (tname, r) in enumerate(zip(tnames, rows)):
        raw = make_weights(tname, r, c, rng)
        mats.append((tname, r, *(pack(tname, raw, r, c) if k != 1 else (0, raw))))
    return mats


def check_many_equals_matmul(mats_list, c, rng, label):
    """matmul_many over each list of parts (each part naming its type) equals a matmul per part, bit
    for bit: on every ISA, 1 and 2 threads, a GEMV, a tile and a row (n=9), a shared-activation GEMM (n=70)."""
    for isa in ISAS:
        nat.set_isa(isa)
        for threads in (1, 2):
            nat.set_threads(threads)
            for n in (1, 9, 70):
                x = activations(n, c, rng)
                for exact in (0, 1):
                    for parts in mats_list:
                        want = [run(tname, layout, buf, rows, c, x, exact) for tname, rows, layout, buf in parts]
                        outs = [np.full((n, rows), np.nan, np.float32) for _, rows, _, _ in parts]
                        nat.matmul_many(TYPES[parts[0][0]], c, x, n, exact,
                                        tuple((layout, buf, rows, o) if tname == parts[0][0] else
                                              (layout, buf, rows, o, TYPES[tname])
                                              for (tname, rows, layout, buf), o in zip(parts, outs)))
                        for k, (w_, o) in enumerate(zip(want, outs)):
                            assert np.array_equal(w_, o), f"{label} isa={isa} threads={threads} n={n} exact={exact} part {k}"


@pytest.mark.parametrize("tname", list(TYPES))
def test_matmul_many_equals_matmul(tname):
    """matmul_many (a layer's Q, K, V: one quantization, one fork/join) gives each output
    exactly as its own matmul call does: packed and file layouts mixed, part sizes that are
    not multiples of the 16-row group."""
    rng = np.random.default_rng(23)
    c = 512 if BLOCK[tname] == 256 else 160
    mats = packed_parts((tname,) * 3, (600, 75, 40), c, rng)
    check_many_equals_matmul((mats, mats[1:]), c, rng, tname)


@pytest.mark.parametrize("mix", [("Q5_0", "Q5_0", "Q8_0"), ("Q8_0", "Q4_1", "Q5_0"), ("Q4_K", "Q4_K", "Q6_K"),
                                 ("Q4_0", "Q5_0", "Q8_0"), ("Q5_0", "Q6_K"), ("F32", "Q8_0"), ("Q6_K", "F16", "Q4_K")])
def test_matmul_many_mixed_types_equal_matmul(mix):
    """Parts of their own types (a quantized file's Q8_0 V beside Q5_0 Q and K): one call whose
    kernels share the activations, or one call per part where they cannot (other zero points,
    block sizes, float types); each output exactly as its own matmul."""
    rng = np.random.default_rng(29)
    c = 512
    check_many_equals_matmul((packed_parts(mix, (300, 75, 40), c, rng),), c, rng, mix)


def test_matmul_many_bad_arguments():
    q41, cols = TYPES["Q4_1"], 64
    w = np.zeros(4 * nat.row_bytes(q41, cols), np.uint8)
    x = np.zeros((2, cols), np.float32)
    a, b = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)
    nat.matmul_many(q41, cols, x, 2, 0, ((0, w, 4, a), (0, w, 4, b)))
    for parts in ((), ((0, w, 4, a),) * 4, [(0, w, 4, a)], ((0, w, 4),), ((0, w, 4, a), "part")):
        with pytest.raises(TypeError):
            nat.matmul_many(q41, cols, x, 2, 0, parts)
    value_errors = [
        (q41, cols, x, 2, 0, ((0, w, 4, a), (0, w, 4, a))),         # two outs are one array
        (q41, cols, x, 2, 0, ((0, w, 4, a), (0, w, 4, x))),         # an out is x
        (q41, cols, x, 2, 0, ((0, w, 4, a), (0, w, 5, b))),         # W too small for 5 rows
        (q41, cols, x, 2, 0, ((0, w, 4, a), (1, w, 4, b))),         # packed layout, file-layout bytes
        (q41, 48, x, 2, 0, ((0, w, 4, a),)),                        # cols not a multiple of 32
        (q41, cols, x, 3, 0, ((0, w, 4, a),)),                      # n beyond x
        (7, cols, x, 2, 0, ((0, w, 4, a),)),                        # unsupported type
    ]
    for args in value_errors:
        with pytest.raises(ValueError):
            nat.matmul_many(*args)
    with pytest.raises(TypeError):
        nat.matmul_many(q41, cols, x, 2, 0, ((0, w, 4, a.astype(np.float64)),))


def test_bad_arguments():
    q41, rows, cols = TYPES["Q4_1"], 4, 64
    w = np.zeros(rows * nat.row_bytes(q41, cols), np.uint8)
    x = np.zeros((2, cols), np.float32)
    out = np.zeros((2, rows), np.float32)
    ok = (q41, 0, w, rows, cols, x, out, 2, 0)
    nat.matmul(*ok)

    def bad(i, v):
        a = list(ok)
        a[i] = v
        return a

    value_errors = [
        bad(0, 7),  # Q5_1: W holds Q4_1's row bytes, too few
        bad(0, 99),
        bad(1, 5),  # unknown layout
        bad(3, 0), bad(3, -1), bad(4, 0), bad(4, 48),  # cols not a multiple of 32
        bad(3, 5),  # W too small for 5 rows (and out too small)
        bad(7, 3), bad(7, 0),  # n beyond x / out, n = 0
        bad(8, 2),
        bad(2, w[:-1]),
        bad(5, x[:1]),
        bad(1, 1),  # packed layout but W holds the file layout's bytes only... (packed needs 16 rows)
    ]
    for a in value_errors:
        with pytest.raises(ValueError):
            nat.matmul(*a)
    type_errors = [
        bad(5, x.astype(np.float64)),
        bad(5, np.zeros((2, 2 * cols), np.float32)[:, ::2]),  # not C-contiguous
        bad(6, out.astype(np.int32)),
        bad(6, bytes(out.nbytes)),  # read-only
        bad(2, "weights"),
        bad(0, 2.0),
        bad(3, None),
    ]
    for a in type_errors:
        with pytest.raises(TypeError):
            nat.matmul(*a)
    with pytest.raises(TypeError):
        nat.matmul(*ok[:-1])
    buf = np.zeros((2, cols), np.float32)
    with pytest.raises(ValueError):  # out aliasing x
        nat.matmul(q41, 0, w, rows, cols, buf, buf, 2, 0)

    ids = np.array([0, 4], np.int32)
    emb = np.zeros((2, cols), np.float32)
    with pytest.raises(ValueError):
        nat.get_rows(q41, 0, w, rows, cols, ids, emb, 2)  # id 4 out of range
    with pytest.raises(ValueError):
        nat.get_rows(q41, 0, w, rows, cols, np.array([0, -1], np.int32), emb, 2)
    with pytest.raises(TypeError):
        nat.get_rows(q41, 0, w, rows, cols, ids.astype(np.int64), emb, 2)
    with pytest.raises(ValueError):
        nat.get_rows(q41, 0, w, rows, cols, ids[:1], emb, 2)  # ids shorter than n
    with pytest.raises(ValueError):
        nat.dequant_rows(q41, 0, w, rows, cols, np.zeros((rows, cols - 1), np.float32))
    with pytest.raises(ValueError):
        nat.pack(q41, w, np.zeros(10, np.uint8), rows, cols)  # dst too small
    with pytest.raises(TypeError):
        nat.pack(q41, w, bytes(nat.packed_size(q41, rows, cols)), rows, cols)  # dst read-only
    with pytest.raises(ValueError):
        nat.packed_size(TYPES["Q6_K"], 1, 896)  # 896 is not a multiple of 256
    with pytest.raises(ValueError):
        nat.row_bytes(q41, 31)


def test_other_gguf_types_convert_at_load_or_fail_clearly():
    """A type the C core does not run is decoded by the oracle and re-quantized to Q8_0 at load, with
    one warning per model naming the tensors and the cost; a type nothing here decodes is a ModelFormatError naming it."""
    import warnings

    from llambda.backends.native import NATIVE_TYPES, NativeBackend
    from llambda.errors import LlambdaWarning, ModelFormatError
    from llambda.formats.weights import WeightTensor

    assert int(Q.QType.TQ2_0) not in NATIVE_TYPES  # else this test needs another non-native type
    rng = np.random.default_rng(3)
    B = NativeBackend(threads=1, activations="f32")
    rows, cols = 40, 512
    tensors = [WeightTensor(f"w{k}", Q.QType.TQ2_0, (rows, cols),
                            Q.random_blocks(rng, "TQ2_0", rows * cols // 256).reshape(-1)) for k in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mats = [B.prepare_matrix(t) for t in tensors]
        B.end_load()                 # one warning for the whole model, naming the tensors and the cost
    msgs = [str(c.message) for c in caught if issubclass(c.category, LlambdaWarning)]
    assert len(msgs) == 1 and "TQ2_0" in msgs[0] and "Q8_0" in msgs[0] and "w0, w1" in msgs[0], msgs
    assert "MB more memory" in msgs[0], msgs
    x = rng.standard_normal((3, cols)).astype(np.float32)
    for t, m in zip(tensors, mats):
        assert m.qtype == int(Q.QType.Q8_0)
        w = t.to_float32()
        out = np.empty((3, rows), np.float32)
        B.matmul(x, m, out)
        # ternary weights re-quantized to Q8_0 lose only the f16 rounding of the scale
        assert (np.abs(out - mm64(x, w.T)) <= 1e-3 * mm64(np.abs(x), np.abs(w).T) + 1e-30).all()
    bad = WeightTensor("blk.0.attn_q.weight", Q.QType.IQ2_XXS, (16, 256), np.zeros(16 * 66, np.uint8))
    with pytest.raises(ModelFormatError, match="'blk.0.attn_q.weight' is IQ2_XXS"):
        B.prepare_matrix(bad)


@pytest.mark.parametrize("tname", [t for t in TYPES if BLOCK[t] > 1])
def test_products_do_not_depend_on_where_the_matrix_starts(tname):
    """On AMD the arena starts some types' matrices far_skew bytes past a page (the type table's column,
    backends/native.weight_skew); every ISA's GEMV and GEMM must give the same bits at any start, so each
    offset is tried on every host, not only where the skew is on."""
    rng = np.random.default_rng(13)
    rows, c = 40, 2 * max(BLOCK[tname], 32)
    raw = make_weights(tname, rows, c, rng)
    layout, ref = pack(tname, raw, rows, c)
    size = ref.size
    base = np.zeros(size + 8192, np.uint8)
    page0 = -base.ctypes.data % 4096
    assert FAR_SKEW[tname] in (0, 16)
    for isa in ISAS:
        nat.set_isa(isa)
        for n in (1, 5):
            x = activations(n, c, rng)
            for exact in (0, 1):
                want = run(tname, layout, ref, rows, c, x, exact)
                for off in sorted({0, 16, 48, FAR_SKEW[tname]}):
                    buf = base[page0 + off:page0 + off + size]
                    buf[:] = ref
                    got = run(tname, layout, buf, rows, c, x, exact)
                    assert np.array_equal(got, want), f"{tname} isa={isa} n={n} exact={exact} offset={off}"

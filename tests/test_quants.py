"""llambda.formats.quants against the gguf package's NumPy (de)quantizers and round-trip budgets."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package is the independent oracle")
from gguf import GGMLQuantizationType as G  # noqa: E402

from llambda.formats import quants as Q  # noqa: E402
from llambda.errors import ModelFormatError  # noqa: E402
from llambda.formats.quants import QType  # noqa: E402

try:
    from llambda import _native as nat
except ImportError:  # the oracle tests need no C core
    nat = None

# Every block type with a NumPy dequantizer in the oracle and in gguf-py.
BLOCK_TYPES_WITH_ORACLE = [q for q in Q.TRAITS if q in Q._DEQUANT and q not in (QType.Q8_1, QType.Q8_K)]
NATIVE = {t["id"]: t for t in nat.qtypes()} if nat else {}


def random_blocks(rng, qtype, nblocks):
    return Q.random_blocks(rng, qtype, nblocks)


def test_traits_match_gguf_constants():
    for qt, (bs, ts) in gguf.GGML_QUANT_SIZES.items():
        if qt.name == "Q8_1":
            continue  # gguf-py still lists the pre-2023 float layout; ggml's is 36 bytes
        ours = Q.TRAITS[QType[qt.name]]
        assert int(QType[qt.name]) == int(qt)
        assert (ours.block_size, ours.type_size) == (bs, ts), qt.name
    assert Q.TRAITS[QType.Q8_1].type_size == 36


def test_row_nbytes_and_errors():
    assert Q.row_nbytes(QType.Q4_0, 576) == 18 * 18
    assert Q.row_nbytes(QType.Q4_K, 512) == 2 * 144
    assert Q.row_nbytes(QType.F32, 7) == 28
    assert Q.row_nbytes(QType.BF16, 3) == 6
    assert Q.tensor_nbytes(QType.Q6_K, (3, 2, 256)) == 6 * 210
    with pytest.raises(ModelFormatError, match="multiple of the Q4_K block size 256"):
        Q.row_nbytes(QType.Q4_K, 640)
    with pytest.raises(ModelFormatError, match="unknown ggml tensor type"):
        Q.row_nbytes(4, 32)  # Q4_2 was removed from ggml
    assert Q.as_qtype("Q8_0") is QType.Q8_0 and Q.as_qtype(8) is QType.Q8_0


@pytest.mark.parametrize("qtype", BLOCK_TYPES_WITH_ORACLE, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,blocks_per_row", [(1, 1), (7, 3), (33, 2)])
def test_dequantize_matches_gguf_on_random_blocks(qtype, rows, blocks_per_row):
    rng = np.random.default_rng(int(qtype) * 100 + rows)
    raw = random_blocks(rng, qtype, rows * blocks_per_row).reshape(rows, -1)
    ref = gguf.quants.dequantize(raw, G(int(qtype)))
    ncols = blocks_per_row * Q.TRAITS[qtype].block_size
    ours = Q.dequantize(raw, qtype, (rows, ncols))
    assert ours.dtype == np.float32 and ours.shape == (rows, ncols) == ref.shape
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16])
def test_dequantize_float_types_match_gguf(qtype):
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, (5, 2 * 13), dtype=np.uint8)
    if qtype == QType.F32:
        raw = rng.standard_normal((5, 13)).astype("<f4").view(np.uint8)
    ref = gguf.quants.dequantize(raw, G(int(qtype))).astype(np.float32)
    ours = Q.dequantize(raw, qtype, ref.shape)
    np.testing.assert_array_equal(ours, ref)  # exact, NaN payloads aside
    assert ours.dtype == np.float32


def test_dequantize_3d_shape_and_noncontiguous_input():
    rng = np.random.default_rng(1)
    raw = random_blocks(rng, QType.Q8_0, 2 * 3 * 2).reshape(-1)
    ref = gguf.quants.dequantize(raw.reshape(6, -1), G.Q8_0).reshape(2, 3, 64)
    np.testing.assert_allclose(Q.dequantize(raw, QType.Q8_0, (2, 3, 64)), ref, rtol=1e-6)
    strided = np.repeat(raw, 2)[::2]  # same bytes, not contiguous
    np.testing.assert_allclose(Q.dequantize(strided, QType.Q8_0, (2, 3, 64)), ref, rtol=1e-6)


def test_dequantize_rejects_bad_input():
    raw = np.zeros(34, np.uint8)
    with pytest.raises(ModelFormatError, match="expected 68 bytes, got 34"):
        Q.dequantize(raw, QType.Q8_0, (2, 32))
    with pytest.raises(ModelFormatError, match="multiple of the Q8_0 block size"):
        Q.dequantize(raw, QType.Q8_0, (1, 33))
    with pytest.raises(ModelFormatError, match="not supported"):
        Q.dequantize(np.zeros(66, np.uint8), QType.IQ2_XXS, (256,))
    with pytest.raises(TypeError, match="uint8"):
        Q.dequantize(np.zeros(17, np.uint16), QType.Q8_0, (32,))


# ---------------------------------------------------------------- quantize

# RMS error / RMS(x) for standard-normal data, worst row of the test below (measured: Q8_0 .0059,
# Q6_K .021, Q5_* .040-.046, Q4_* .078-.092, IQ4_* .081, Q3_K .163, Q2_K .326, MXFP4 .126): budgets
# leave ~10% headroom for the searching quantizers (deterministic on this data), more for the others.
ROUND_TRIP_BUDGET = {
    QType.F32: 0.0, QType.F16: 5e-4, QType.BF16: 3e-3,
    QType.Q8_0: 0.007, QType.Q8_1: 0.007, QType.Q8_K: 0.009, QType.Q6_K: 0.024,
    QType.Q5_0: 0.055, QType.Q5_1: 0.05, QType.Q5_K: 0.045,
    QType.Q4_0: 0.11, QType.Q4_1: 0.1, QType.Q4_K: 0.086,
    QType.Q3_K: 0.18, QType.Q2_K: 0.36,
    QType.IQ4_NL: 0.09, QType.IQ4_XS: 0.09, QType.MXFP4: 0.14,
}


@pytest.mark.parametrize("qtype", list(ROUND_TRIP_BUDGET), ids=lambda t: t.name)
def test_round_trip_error_budget(qtype):
    rng = np.random.default_rng(int(qtype))
    ncols = max(2 * Q.TRAITS[qtype].block_size, 512)  # enough values for a stable RMS
    # rows of very different magnitudes: scales must follow each block
    x = rng.standard_normal((37, ncols)).astype(np.float32)
    x *= np.logspace(-3, 2, 37, dtype=np.float32)[:, None]
    raw = Q.quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (37, Q.row_nbytes(qtype, ncols))
    y = Q.dequantize(raw, qtype, x.shape)
    rel = np.sqrt(np.mean((y - x) ** 2, axis=1) / np.mean(x ** 2, axis=1))
    assert rel.max() <= ROUND_TRIP_BUDGET[qtype], (qtype.name, rel.max())
    if qtype in BLOCK_TYPES_WITH_ORACLE:
        # Our packing must mean the same thing to an independent decoder.
        ref = gguf.quants.dequantize(raw, G(int(qtype)))
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-9)


# The searching quantizers against llama.cpp's own (ggml_quantize_chunk without an importance matrix,
# llama-cpp-python 0.3.36): gguf-py has no quantizer for these types, so llama.cpp's RMS error on the
# data below (relative to RMS(x)), measured once, is written here; with llama-cpp-python installed
# the next test also compares live.
LLAMA_CPP_RMSE = {
    QType.Q2_K: 0.31257, QType.Q3_K: 0.15644, QType.Q4_K: 0.07883, QType.Q5_K: 0.03947,
    QType.Q6_K: 0.01909, QType.IQ4_NL: 0.08230, QType.IQ4_XS: 0.08343, QType.MXFP4: 0.12105,
}


def _heavy_tailed_rows():
    x = np.random.default_rng(13).standard_normal((64, 1024)).astype(np.float32)
    x[:, :8] *= 6   # a few outlier columns, as real weights have
    return x


def _rel_rmse(x, raw, qtype):
    return float(np.sqrt(np.mean((Q.dequantize(raw, qtype, x.shape) - x) ** 2) / np.mean(x ** 2)))


@pytest.mark.parametrize("qtype", list(LLAMA_CPP_RMSE), ids=lambda t: t.name)
def test_quantizers_are_as_good_as_llama_cpp(qtype):
    x = _heavy_tailed_rows()
    assert _rel_rmse(x, Q.quantize(x, qtype), qtype) <= LLAMA_CPP_RMSE[qtype] * 1.002


@pytest.mark.parametrize("qtype", list(LLAMA_CPP_RMSE), ids=lambda t: t.name)
def test_quantizers_against_llama_cpp_live(qtype):
    from llamacpp_ref import ggml_base, ggml_quantize
    lib = ggml_base()
    if lib is None:
        pytest.skip("llama-cpp-python is not installed (the written figures above still apply)")
    x = _heavy_tailed_rows()
    theirs = _rel_rmse(x, ggml_quantize(lib, x, int(qtype), Q.row_nbytes(qtype, x.shape[1])), qtype)
    assert abs(theirs - LLAMA_CPP_RMSE[qtype]) < 1e-4, "the written figure no longer matches llama.cpp"
    assert _rel_rmse(x, Q.quantize(x, qtype), qtype) <= theirs * 1.002


def test_round_trip_zeros_and_constants():
    for qtype in ROUND_TRIP_BUDGET:
        bs = max(Q.TRAITS[qtype].block_size, 32)
        x = np.zeros((3, bs), np.float32)
        x[1] = 0.75
        x[2] = -2.5
        y = Q.dequantize(Q.quantize(x, qtype), qtype, x.shape)
        assert np.isfinite(y).all(), qtype.name
        # e2m1 has one mantissa bit: 2.5 lies halfway between 2 and 3 at any scale
        atol = 0.5 if qtype == QType.MXFP4 else 0.02 * 2.5
        np.testing.assert_allclose(y, x, atol=atol, err_msg=qtype.name)
        np.testing.assert_array_equal(y[0], 0, err_msg=qtype.name)


@pytest.mark.parametrize("qtype", [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0,
                                   QType.BF16], ids=lambda t: t.name)
def test_quantize_is_byte_exact_with_ggml_reference(qtype):
    """gguf-py reproduces ggml's reference quantizers bit for bit; so must we."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    x[0] = 0  # d = 0
    x[1] = 3.0  # constant block
    x[2, :32] = np.arange(32) * 0.5 - 8  # exact halves: rounding ties
    x[3, :32] = np.float32(0.49999997)  # where trunc(x + 0.5) != roundf(x)
    x[3, 32:64] = -np.float32(0.49999997)
    x[3, 0] = 127  # makes the previous values round at scale 1
    x[3, 32] = -127
    if qtype == QType.BF16:
        x[4, :4] = [np.inf, -np.inf, np.nan, -0.0]
    ours = Q.quantize(x, qtype)
    ref = gguf.quants.quantize(x, G(int(qtype)))
    np.testing.assert_array_equal(ours, ref.view(np.uint8).reshape(ours.shape))


def test_q8_0_exact_values_round_trip_exactly():
    rng = np.random.default_rng(3)
    q = rng.integers(-127, 128, (10, 64))
    q[:, ::32] = 127  # every block spans the full range, so d = 2**-4 exactly
    x = (q * 2.0 ** -4).astype(np.float32)
    np.testing.assert_array_equal(Q.dequantize(Q.quantize(x, QType.Q8_0), QType.Q8_0, x.shape), x)


def test_q8_1_and_q8_k_side_fields():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    b1 = Q.quantize(x, QType.Q8_1).reshape(-1, 36)
    d = b1[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0]
    s = b1[:, 2:4].copy().view("<f2").astype(np.float32)[:, 0]
    qs = b1[:, 4:].view(np.int8).astype(np.int32)
    np.testing.assert_allclose(s, d * qs.sum(axis=1), rtol=2e-3)
    bk = Q.quantize(x, QType.Q8_K).reshape(-1, 292)
    qk = bk[:, 4:260].view(np.int8).astype(np.int32)
    bsums = bk[:, 260:].copy().view("<i2")
    np.testing.assert_array_equal(bsums, qk.reshape(-1, 16, 16).sum(axis=2))
    assert np.abs(qk).max() == 127


def test_quantize_rejects_bad_input():
    with pytest.raises(ModelFormatError, match="multiple of the Q4_0 block size 32"):
        Q.quantize(np.zeros((2, 48), np.float32), QType.Q4_0)
    with pytest.raises(ModelFormatError, match="quantization to IQ2_XXS is not supported"):
        Q.quantize(np.zeros(256, np.float32), QType.IQ2_XXS)
    with pytest.raises(ValueError):
        Q.quantize(np.float32(1.0), QType.F32)


def test_quantize_plain_types():
    x = np.array([[1.5, -2.0, 3.25]], np.float64)
    assert Q.quantize(x, QType.F32).view("<f4").tolist() == [[1.5, -2.0, 3.25]]
    assert Q.quantize(x, QType.F16).view("<f2").tolist() == [[1.5, -2.0, 3.25]]
    ints = np.array([1, -2, 300], np.int64)
    assert Q.dequantize(Q.quantize(ints, QType.I32), QType.I32, (3,)).tolist() == [1, -2, 300]


# ---------------------------------------------------------------- real files

def _sample_tensors(path, per_type=2):
    from llambda.formats.gguf import GGUFFile

    f = GGUFFile(path)
    picked, count = [], {}
    for t in f.tensors.values():
        if count.get(t.qtype, 0) < per_type:
            picked.append(t)
            count[t.qtype] = count.get(t.qtype, 0) + 1
    return f, picked


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["smollm2_gguf", "qwen05_gguf", "gemma3_gguf"])
def test_dequantize_real_tensors_matches_gguf(fixture, request):
    f, picked = _sample_tensors(request.getfixturevalue(fixture))
    with f:
        assert len({t.qtype for t in picked}) >= 3
        for t in picked:
            if t.nbytes <= 8 << 20:
                ref = gguf.quants.dequantize(t.rows2d(), G(int(t.qtype))).reshape(t.shape)
                ours = t.as_float32()
            else:  # big embeddings: a sample of rows keeps the test fast
                rows = np.r_[0:64, t.nrows - 64:t.nrows]
                ref = gguf.quants.dequantize(t.rows2d()[rows], G(int(t.qtype)))
                ours = Q.dequantize(t.rows2d()[rows], t.qtype, (len(rows), t.ncols))
            np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-9, err_msg=t.name)
        emb = f.tensors["token_embd.weight"]
        rows = [0, 1, emb.nrows // 2, emb.nrows - 1]
        got = Q.dequantize(emb.rows2d()[rows], emb.qtype, (len(rows), emb.ncols))
        ref = gguf.quants.dequantize(emb.rows2d()[rows], G(int(emb.qtype)))
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_requantize_real_weight_within_budget(smollm2_gguf):
    """A real (non-Gaussian) weight matrix survives our quantizers within budget."""
    from llambda.formats.gguf import GGUFFile

    with GGUFFile(smollm2_gguf) as f:
        w = f.tensors["blk.0.ffn_down.weight"].as_float32()  # (576, 1536)
    for qtype in (QType.Q8_0, QType.Q6_K, QType.Q5_K, QType.Q4_K, QType.Q4_0, QType.Q3_K, QType.Q2_K, QType.IQ4_XS):
        y = Q.dequantize(Q.quantize(w, qtype), qtype, w.shape)
        rel = np.sqrt(np.mean((y - w) ** 2) / np.mean(w ** 2))
        assert rel <= ROUND_TRIP_BUDGET[qtype] * 1.5, (qtype.name, rel)


@pytest.mark.skipif(nat is None, reason="the C core is not built")
def test_native_type_table_matches_oracle_table():
    """The C core's type table (what _native runs) and the oracle's are keyed by the same ggml ids
    and agree on every block's size; each native block type has a NumPy dequantizer to test against."""
    assert NATIVE, "qtypes() lists no type"
    for qid, t in NATIVE.items():
        tr = Q.TRAITS[QType(qid)]
        assert (t["name"], t["block"], t["block_bytes"]) == (tr.name, tr.block_size, tr.type_size)
        assert QType(qid) in Q.DEQUANTIZABLE
    for name in ("Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS", "MXFP4"):
        assert int(QType[name]) in NATIVE, name


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q3_K, QType.IQ4_XS])
def test_quantize_threads_change_nothing(qtype):
    """quantize() shares a big tensor's chunks among threads: the bytes are those of the rows quantized
    one slice at a time (each slice below one chunk, so on the calling thread alone)."""
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((300, 2048)) * 0.02).astype(np.float32)   # 600 Ki values: 3 chunks
    whole = Q.quantize(x, qtype)
    parts = np.concatenate([Q.quantize(x[i:i + 50], qtype) for i in range(0, 300, 50)])
    assert np.array_equal(whole, parts)

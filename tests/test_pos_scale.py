"""pos_scale: row i of x times (float)(1 + beta * ln(1 + floor(pos[i] / length))), in place (the query temperature
of Ministral 3 / Llama 4 style attention).

The C op against its NumPy twin (backends/numpy_ref.py) and against the row-by-row formula, bit for bit: random rows
at positions across several bands, huge positions (up to int32 max), the factor of every band in a long range;
rows of band 0 keep their bits; a recorded plan reads each replay's positions from the buffer and refuses a
negative one before writing; hostile arguments are refused with a typed error by both.
"""
from __future__ import annotations

import numpy as np
import pytest

from llambda.backends.numpy_ref import NumpyBackend

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32, I32 = np.float32, np.int32
I32_MAX = np.iinfo(I32).max


def formula(x, pos, beta, length):
    """Each row times its own float32 factor, the factor from float64 as the model always computed it."""
    out = x.copy()
    for i, p in enumerate(pos):
        f = F32(1.0 + beta * np.log1p(np.float64(int(p) // length)))
        if f != 1.0:
            out[i] *= f
    return out


def both(x, pos, beta, length):
    """(the C op's result, the NumPy twin's) on copies of x."""
    a, b = x.copy(), x.copy()
    n = len(x)
    native.pos_scale(a, pos, n, a.size // n, beta, length)
    NumpyBackend().pos_scale(b, pos, beta, length)
    return a, b


@pytest.mark.parametrize("beta,length", [(0.1, 16), (0.1, 16384), (1.0, 1), (37.25, 3), (100.0, 8192), (-0.5, 7)])
def test_random_rows_across_bands_match_the_twin_and_the_formula(beta, length):
    rng = np.random.default_rng(length)
    n, heads, hd = 41, 4, 24
    x = (rng.standard_normal((n, heads, hd)) * 10).astype(F32)
    pos = np.concatenate([
        [0, length - 1, length, 2 * length - 1, 2 * length, 5 * length + 3],     # each side of the first steps
        rng.integers(0, 10 * length, 15),                                          # a few bands
        rng.integers(0, I32_MAX, 14, endpoint=True),                               # anywhere
        [I32_MAX, I32_MAX - 1, I32_MAX // length * length, I32_MAX // length * length - 1, 1, 2],
    ]).astype(I32)[:n]
    a, b = both(x, pos, beta, length)
    want = formula(x, pos, beta, length)
    assert a.tobytes() == b.tobytes() == want.tobytes()
    moved = [i for i in range(n) if int(pos[i]) >= length]
    assert moved and all(not np.array_equal(a[i], x[i]) for i in moved)


@pytest.mark.parametrize("beta", [0.1, 1.0, 100.0])
def test_every_factor_of_two_million_bands_and_of_positions_to_int32_max(beta):
    """Width 1, x = 1: the op writes each row's factor itself; the C core's log1p rounds to the twin's float32."""
    rng = np.random.default_rng(3)
    for pos in (np.arange(2_000_000, dtype=I32), rng.integers(0, I32_MAX, 1_000_000, endpoint=True).astype(I32)):
        a, b = both(np.ones((len(pos), 1), F32), pos, beta, 1)
        assert a.tobytes() == b.tobytes()


def test_rows_of_band_zero_keep_their_bits():
    """Below the length the factor is exactly 1: -0.0, NaN payloads, infinities untouched; so is a row whose factor
    rounds to 1 (a tiny beta)."""
    x = np.array([[-0.0, np.inf, -np.inf, 1e-45]] * 3, F32)
    x.view(np.uint32)[:, 0] = 0x7FC00123          # a NaN with a payload
    pos = np.array([0, 15, 16], I32)
    a, b = both(x, pos, 0.1, 16)
    assert a[:2].tobytes() == b[:2].tobytes() == x[:2].tobytes()
    a, b = both(x, np.array([16, 1 << 20, I32_MAX], I32), 1e-12, 16)
    assert a.tobytes() == b.tobytes() == x.tobytes()


def test_a_recorded_plan_reads_each_replays_positions():
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((6, 10)).astype(F32)
    x, pos = x0.copy(), np.array([0, 3, 16, 40, 100, 7], I32)
    plan = native.Plan()
    plan.begin()
    try:
        native.pos_scale(x, pos, 6, 10, 0.25, 16)
    finally:
        plan.end()
    assert len(plan) == 1 and x.tobytes() == formula(x0, pos, 0.25, 16).tobytes()
    for new in ([17, 1 << 30, 0, 15, 33, I32_MAX], [5, 6, 7, 8, 9, 10]):
        pos[:] = new
        x[:] = x0
        plan.replay()
        assert x.tobytes() == formula(x0, pos, 0.25, 16).tobytes(), new
    pos[:] = [16, 16, -1, 16, 16, 16]                # refused at replay, before anything is written
    x[:] = x0
    with pytest.raises(ValueError, match=r"pos_scale: pos\[2\] = -1"):
        plan.replay()
    assert x.tobytes() == x0.tobytes()


def _call(x, pos, n, width, beta, length):
    return lambda: native.pos_scale(x, pos, n, width, beta, length)


def test_hostile_arguments_are_refused():
    x, pos = np.ones((4, 8), F32), np.array([0, 16, 32, 48], I32)
    raw = np.zeros(64, np.uint8)
    cases = [
        (ValueError, "beta must be finite", _call(x, pos, 4, 8, float("nan"), 16)),
        (ValueError, "beta must be finite", _call(x, pos, 4, 8, float("inf"), 16)),
        (ValueError, "beta must be finite", _call(x, pos, 4, 8, -float("inf"), 16)),
        (TypeError, "beta must be a number", _call(x, pos, 4, 8, "0.1", 16)),
        (TypeError, "beta must be a number", _call(x, pos, 4, 8, None, 16)),
        (ValueError, "length must be in", _call(x, pos, 4, 8, 0.1, 0)),
        (ValueError, "length must be in", _call(x, pos, 4, 8, 0.1, -16)),
        (ValueError, "n must be in", _call(x, pos, 0, 8, 0.1, 16)),
        (ValueError, "width must be in", _call(x, pos, 4, 0, 0.1, 16)),
        (ValueError, "width must be in", _call(x, pos, 4, -1, 0.1, 16)),
        (ValueError, "x has 128 bytes", _call(x, pos, 4, 9, 0.1, 16)),                  # x too short for n * width
        (ValueError, "pos has 12 bytes", _call(x, pos[:3], 4, 8, 0.1, 16)),            # too few positions
        (ValueError, "pos must hold int32", _call(x, pos.astype(np.int64), 4, 8, 0.1, 16)),
        (ValueError, "pos must hold int32", _call(x, pos.astype(F32), 4, 8, 0.1, 16)),
        (ValueError, "x must hold float32", _call(x.astype(np.float64), pos, 4, 8, 0.1, 16)),
        (ValueError, "not C-contiguous", _call(x[:, ::2], pos, 4, 4, 0.1, 16)),             # not contiguous
        (ValueError, "read-only", _call(np.frombuffer(x.tobytes(), F32), pos, 4, 8, 0.1, 16)),   # read-only
        (ValueError, r"pos\[1\] = -5", _call(x, np.array([0, -5, 0, 0], I32), 4, 8, 0.1, 16)),
        (ValueError, "overlap", _call(raw[:32].view(F32), raw[16:48].view(I32), 2, 4, 0.1, 16)),
        (ValueError, "n must be in", _call(x, pos, 1 << 31, 1, 0.1, 16)),
        (ValueError, "x would need more than", _call(x, pos, I32_MAX, I32_MAX, 0.1, 16)),
        (TypeError, "takes 6 positional arguments", lambda: native.pos_scale(x, pos, 4, 8, 0.1)),
    ]
    before = x.copy()
    for exc, match, fn in cases:
        with pytest.raises(exc, match=match):
            fn()
    assert x.tobytes() == before.tobytes()


@pytest.mark.parametrize("pos,beta,length", [
    (np.array([0, -1], I32), 0.1, 16), (np.array([0, 1], np.int64), 0.1, 16), (np.array([0], I32), 0.1, 16),
    (np.array([0, 1], I32), float("nan"), 16), (np.array([0, 1], I32), float("inf"), 16),
    (np.array([0, 1], I32), 0.1, 0)])
def test_the_twin_refuses_them_too(pos, beta, length):
    with pytest.raises(ValueError, match="pos_scale"):
        NumpyBackend().pos_scale(np.ones((2, 3), F32), pos, beta, length)

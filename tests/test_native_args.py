"""Argument checking shared by every _native binding (csrc/python/args.c).

Error messages must read as text: PyErr_Format copies the rest of a format string
raw after a specifier it does not know (it has no %g), which printed
"must be finite and >= %g, got %S" to the user. The matmul and op bindings check
their buffers with one helper set, so they agree on what a buffer must be.
"""
import re

import numpy as np
import pytest

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32, I32 = np.float32, np.int32
Q4_1 = 3
RAW_SPEC = re.compile(r"%[-+ #0-9.]*[a-zA-Z]")


def message(call):
    with pytest.raises((TypeError, ValueError)) as e:
        call()
    return str(e.value)


def test_float_bound_is_formatted():
    z = np.zeros(64, F32)
    msg = message(lambda: native.rmsnorm(z, z, z, 1, 64, -1.0))
    assert msg == "rmsnorm: eps must be finite and >= 0.0, got -1.0"
    msg = message(lambda: native.softcap(z, -2.5, 64))
    assert msg == "softcap: cap must be finite and >= 0.0, got -2.5"


def test_no_message_prints_a_raw_format_string():
    z = np.zeros(64, F32)
    w = np.zeros(4 * native.row_bytes(Q4_1, 64), np.uint8)
    calls = [
        lambda: native.rmsnorm(z, z, z, 1, 64, float("nan")),
        lambda: native.rmsnorm(z, z, z, 1, 64, -1e-9),
        lambda: native.scale(z, float("inf"), 64),
        lambda: native.attention(z, z, z, z, np.zeros(1, I32), np.zeros(1, I32), 1, 1, 1, 16, 1, 4, 0, 1.0, 0, -1.0),
        lambda: native.add(z, z, z, 0),
        lambda: native.add(z, z, z),
        lambda: native.add(z, "z", z, 64),
        lambda: native.add(z, z, z, "64"),
        lambda: native.add(z, z, z, 2**40),
        lambda: native.rope(z, np.zeros(4, I32), z, 4, 1, 16, 15, 0),
        lambda: native.matmul(Q4_1, 0, w, 4, 64, z, z, 1, 2),
        lambda: native.matmul(Q4_1, 0, w, 4, 64, z.astype(np.float64), z, 1, 0),
        lambda: native.matmul(7, 0, w, 4, 64, z, z, 1, 0),
        lambda: native.matmul(Q4_1, 0, w, 4, 48, z, z, 1, 0),
        lambda: native.matmul(Q4_1, 0, w, 4),
        lambda: native.matmul_many(Q4_1, 64, z, 1, 0, ()),
        lambda: native.get_rows(Q4_1, 0, w, 4, 64, np.array([9], I32), z, 1),
        lambda: native.set_threads(0),
        lambda: native.set_isa("sse"),
    ]
    for call in calls:
        msg = message(call)
        assert not RAW_SPEC.search(msg), msg


def test_same_buffer_rules_for_matmul_and_ops():
    """Both binding families take raw-byte (arena) views of float buffers and refuse misaligned ones."""
    rng = np.random.default_rng(0)
    rows, cols = 16, 64
    x = rng.standard_normal((1, cols)).astype(F32)
    w = np.zeros(rows * native.row_bytes(Q4_1, cols), np.uint8)
    w[::20] = 60  # some nonzero scales
    want = np.zeros((1, rows), F32)
    native.matmul(Q4_1, 0, w, rows, cols, x, want, 1, 1)

    arena = np.zeros(4 * cols + 4 * rows + 8, np.uint8)
    xa, oa = arena[: 4 * cols], arena[4 * cols: 4 * cols + 4 * rows]
    xa[:] = x.view(np.uint8).reshape(-1)
    native.matmul(Q4_1, 0, w, rows, cols, xa, oa, 1, 1)  # byte views, as ops take them
    assert np.array_equal(oa.view(F32), want.reshape(-1))

    odd = arena[1: 1 + 4 * cols]  # a float32 buffer that does not start on a 4-byte boundary
    with pytest.raises(ValueError, match="aligned"):
        native.matmul(Q4_1, 0, w, rows, cols, odd, oa, 1, 1)
    with pytest.raises(ValueError, match="aligned"):
        native.add(odd, odd, xa, cols)


def test_argument_count_message_is_one_form():
    z = np.zeros(8, F32)
    with pytest.raises(TypeError, match=r"^add\(a, b, out, count\) takes 4 positional arguments, got 3$"):
        native.add(z, z, z)
    with pytest.raises(TypeError, match=r"^row_bytes\(qtype, cols\) takes 2 positional arguments, got 1$"):
        native.row_bytes(Q4_1)

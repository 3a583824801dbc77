"""With batch invariance on, a row's matmul result does not depend on the batch size."""
import numpy as np
import pytest

from llambda.backends import available_backends
from llambda.quants import QType, quantize

pytestmark = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")


@pytest.mark.parametrize("qtype", [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q8_0, QType.Q4_K, QType.Q6_K, QType.F16])
def test_single_rows_equal_batch_rows(qtype):
    from llambda import _native as C

    rng = np.random.default_rng(int(qtype))
    rows, cols = 100, 512
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype).ravel()
    dst = np.empty(C.packed_size(int(qtype), rows, cols), np.uint8)
    layout = C.pack(int(qtype), raw, dst, rows, cols)
    x = rng.standard_normal((8, cols)).astype(np.float32)
    prev = C.isa()
    try:
        C.set_batch_invariant(True)
        for isa in C.isa_available():
            C.set_isa(isa)
            batch = np.empty((8, rows), np.float32)
            C.matmul(int(qtype), layout, dst, rows, cols, x, batch, 8, 0)
            for i in range(8):
                one = np.empty((1, rows), np.float32)
                C.matmul(int(qtype), layout, dst, rows, cols, x[i:i + 1].copy(), one, 1, 0)
                assert np.array_equal(one[0], batch[i]), (isa, i)
    finally:
        C.set_batch_invariant(False)
        C.set_isa(prev)

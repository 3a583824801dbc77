"""The KV cache's layout behind KVCache: each backend keeps its own (the native core each kv head's
keys of a slot as one run of rows), and what reads or copies positions goes through
KVCache.positions, so a prefix copy moves exactly the positions asked for, in every layout."""
import numpy as np
import pytest

from llambda.backends.numpy_ref import NumpyBackend

F32 = np.float32
N_SLOTS, N_CTX, N_KV, HD = 3, 40, 2, 32


def backends():
    out = [pytest.param(lambda: NumpyBackend(), id="numpy")]
    for kv_type in ("f32", "f16", "q8_0"):
        def make(kv_type=kv_type):
            native = pytest.importorskip("llambda.backends.native")
            if not native.native_available():
                pytest.skip("the native core did not build here")
            return native.NativeBackend(threads=1, kv_type=kv_type)
        out.append(pytest.param(make, id=f"native-{kv_type}"))
    return out


def filled(be):
    cache = be.create_kv_cache(1, N_SLOTS, N_CTX, N_KV, HD)
    r = np.random.default_rng(3)
    for s in range(N_SLOTS):
        kv = r.standard_normal((2, N_CTX, N_KV, HD)).astype(F32)
        be.kv_store(cache, 0, kv[0], kv[1], np.full(N_CTX, s, np.int32), np.arange(N_CTX, dtype=np.int32))
    return cache


def attend(be, cache, slot, pos):
    q = np.random.default_rng(4).standard_normal((1, 4, HD)).astype(F32)
    out = np.zeros_like(q)
    be.attention(q, cache, 0, np.array([slot], np.int32), np.array([pos], np.int32), out, 1 / np.sqrt(HD), 0, 0.0)
    return out


@pytest.mark.parametrize("make", backends())
def test_positions_view_and_prefix_copy(make):
    be = make()
    cache = filled(be)
    for a in cache.arrays:
        view = cache.positions(a)
        assert view.shape[:3] == (N_SLOTS, N_CTX, N_KV) and np.shares_memory(view, a)
    n = 17
    tail = [cache.positions(a)[1, n:].copy() for a in cache.arrays]
    other = [cache.positions(a)[2].copy() for a in cache.arrays]
    assert not np.array_equal(attend(be, cache, 1, n - 1), attend(be, cache, 0, n - 1))
    cache.copy_prefix(0, 1, n)
    # slot 1 now reads slot 0's first n positions bit for bit, keeps its own after them, and slot 2 is untouched
    assert np.array_equal(attend(be, cache, 1, n - 1), attend(be, cache, 0, n - 1))
    for a, t, o in zip(cache.arrays, tail, other):
        assert np.array_equal(cache.positions(a)[1, :n], cache.positions(a)[0, :n])
        assert np.array_equal(cache.positions(a)[1, n:], t)
        assert np.array_equal(cache.positions(a)[2], o)

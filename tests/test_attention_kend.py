"""Attention's per-row end of visible keys (kend: an image's soft tokens see their whole block), on every
SIMD path this CPU offers, against the NumPy backend: the default schedules (rows, tiles, split decode
rows past 256 keys) and the batch-invariant one, whose rows must keep the same bits alone, batched with
other slots' rows and cut into other chunks. Odd shapes: head sizes 16 and 80, GQA 1..3, windows narrower
than a block, cache types f32, f16 and q8_0."""
import numpy as np
import pytest

from llambda.backends import available_backends
from llambda.backends.numpy_ref import NumpyBackend

pytestmark = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")

F32 = np.float32
# (head_dim, n_heads, n_kv, window, softcap)
CONFIGS = [(16, 4, 2, 8, 0.0), (80, 3, 1, 0, 0.0), (64, 6, 2, 0, 20.0), (16, 9, 3, 37, 0.0), (64, 8, 4, 300, 0.0)]


@pytest.fixture
def C():
    from llambda import _native

    isa, threads, inv = _native.isa(), _native.threads(), _native.batch_invariant()
    yield _native
    _native.set_batch_invariant(inv)
    _native.set_isa(isa)
    _native.set_threads(threads)


def blocks_layout(n_ctx: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Positions 0..n_ctx-1 of one slot and their kend: text rows p + 1, rows of a few blocks the block's end."""
    pos = np.arange(n_ctx, dtype=np.int32)
    kend = pos + 1
    starts = sorted(rng.choice(np.arange(3, n_ctx - 40), size=3, replace=False))
    last = 0
    for s, size in zip(starts, (17, 33, 300 if n_ctx > 700 else 21)):
        s = max(s, last + 1)
        e = min(s + size, n_ctx)
        kend[s:e] = e
        last = e
    return pos, kend.astype(np.int32)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "hd%d-h%d-kv%d-w%d-cap%g" % c)
def test_kend_matches_numpy_on_every_isa(C, config, kv_type):
    from llambda.backends.native import NativeBackend

    hd, n_heads, n_kv, window, softcap = config
    if kv_type == "q8_0" and hd % 32:
        pytest.skip("q8_0 blocks need head_dim % 32 == 0")
    n_ctx = 900
    rng = np.random.default_rng(hd * 31 + n_heads)
    pos, kend = blocks_layout(n_ctx, rng)
    be = NativeBackend(threads=2, kv_type=kv_type)
    ref = NumpyBackend()
    try:
        cache = be.create_kv_cache(1, 2, n_ctx, n_kv, hd)
        rcache = ref.create_kv_cache(1, 2, n_ctx, n_kv, hd)
        kv = rng.standard_normal((2, n_ctx, n_kv, hd)).astype(F32) * F32(1.5)
        zeros = np.zeros(n_ctx, np.int32)
        be.kv_store(cache, 0, kv[0], kv[1], zeros, pos)
        # the reference reads f16 keys as the cache stores them (its rounding is not the point here); a q8_0
        # cache's keys are stored against bases: its rows are checked for batch invariance only
        if kv_type != "q8_0":
            ref.kv_store(rcache, 0, cache.positions(cache.k[0])[0].astype(F32), cache.positions(cache.v[0])[0].astype(F32), zeros, pos)
        q = rng.standard_normal((n_ctx, n_heads, hd)).astype(F32)
        scale = 1.0 / np.sqrt(hd)
        rows = np.flatnonzero(kend > pos + 1)
        some = np.concatenate([rows[:40], rows[-30:], [0, 1, n_ctx - 1], np.flatnonzero(kend == pos + 1)[-20:]])
        some = np.unique(some)
        want = np.empty((len(some), n_heads, hd), F32)
        if kv_type != "q8_0":
            ref.attention(q[some], rcache, 0, zeros[:len(some)], pos[some], want, scale, window, softcap, kend[some])
            causal = np.empty_like(want)
            ref.attention(q[some], rcache, 0, zeros[:len(some)], pos[some], causal, scale, window, softcap)
            seen = kend[some] > pos[some] + 1
            assert np.abs(causal[seen] - want[seen]).max() > 1e-2, "the blocks' rows must see past themselves"

        def run(idx, slot=0):
            out = np.full((len(idx), n_heads, hd), np.nan, F32)
            be.attention(q[idx].copy(), cache, 0, np.full(len(idx), slot, np.int32), pos[idx].copy(), out, scale,
                         window, softcap, kend[idx].copy())
            return out

        tol = 3e-5

        def check(got, exp, msg):
            if kv_type != "q8_0":
                np.testing.assert_allclose(got, exp, rtol=0, atol=tol, err_msg=msg)
            else:
                assert np.isfinite(got).all(), msg
        for isa in C.isa_available():
            C.set_isa(isa)
            for inv in (False, True):
                C.set_batch_invariant(inv)
                batched = run(some)
                check(batched, want, f"{isa} invariant={inv} batch")
                few = run(some[-2:])           # a decode-sized call: split rows past 256 keys
                check(few, want[-2:], f"{isa} invariant={inv} few")
            C.set_batch_invariant(True)
            alone = np.concatenate([run(some[i:i + 1]) for i in range(len(some))])
            assert np.array_equal(alone, batched), f"{isa}: a row's bits depend on the batch"
            cut = np.concatenate([run(some[:7]), run(some[7:8]), run(some[8:])])
            assert np.array_equal(cut, alone), f"{isa}: a row's bits depend on the chunking"
            # text rows of another slot in the same call change nothing for these
            mixed_q = np.concatenate([q[some], q[:5]])
            out = np.full((len(some) + 5, n_heads, hd), np.nan, F32)
            be.attention(mixed_q, cache, 0, np.concatenate([np.zeros(len(some)), np.ones(5)]).astype(np.int32),
                         np.concatenate([pos[some], pos[:5]]).astype(np.int32), out, scale, window, softcap,
                         np.concatenate([kend[some], pos[:5] + 1]).astype(np.int32))
            assert np.array_equal(out[:len(some)], alone), f"{isa}: rows changed beside another slot's"
    finally:
        be.close()


def test_kend_out_of_range_is_refused(C):
    from llambda.backends.native import NativeBackend

    be = NativeBackend(threads=1)
    try:
        cache = be.create_kv_cache(1, 1, 16, 1, 16)
        q = np.zeros((2, 1, 16), F32)
        out = np.zeros_like(q)
        args = (q, cache, 0, np.zeros(2, np.int32), np.array([3, 4], np.int32), out, 0.25, 0, 0.0)
        for bad in ([3, 5], [4, 17], [0, 5]):
            with pytest.raises(ValueError, match="kend"):
                be.attention(*args, np.array(bad, np.int32))
        with pytest.raises((ValueError, TypeError), match="kend"):
            be.attention(*args, np.array([4, 5], np.int64))
        be.attention(*args, np.array([4, 16], np.int32))    # the last key of the cache is fine
    finally:
        be.close()

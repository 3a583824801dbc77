"""The batch-invariant attention's wide tiles at depth: a prefill chunk's rows (in tiles of up to 3
vectors of rows, up to 4 tiles per converted K/V block, each 256-key chunk of a row its own partial)
equal, bit for bit, each row computed alone (n == 1: the row kernel over the same chunks), cut into
other chunks, and with 1 or 2 threads; per ISA path, KV-cache type (f32, f16, q8_0), head size
(64, 80, 128, 256), GQA group (1..8), with and without softcap, sliding windows and sinks. The
f32/f16 results are also checked against a float64 reference."""
import numpy as np
import pytest

from llambda.backends import available_backends
from test_batch_invariance import ref_attention, same_bits

pytestmark = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")

F32 = np.float32
N_CTX = 2700
POS = list(range(2530, 2610))  # 80 rows of one slot at depth ~2500: 10 and 11 chunks of 256 keys

# (head_dim, n_heads, n_kv, window, softcap, sinks): Qwen2.5-Coder-0.5B's and 1.5B's shapes (GQA 7, 6),
# GQA 1 with a head of 80, GQA 8 at 256 in a window wider than the context (every row shares key 0)
# with sinks, GQA 2 in a window of 1000 (rows no longer share a first key: the row kernel) with
# softcap, GQA 3, 4 and 5 (SmolLM2's 9 heads over 3: on 2 threads its rows go in more, smaller items of
# tiles than on 1); latent attention's compressed rows (one kv head of 576 read by 16 heads).
CONFIGS = [(64, 14, 2, 0, 0.0, False), (128, 12, 2, 0, 0.0, False), (80, 3, 3, 0, 0.0, False),
           (256, 8, 1, 4096, 0.0, True), (128, 4, 2, 1000, 30.0, False), (64, 12, 4, 0, 0.0, False),
           (128, 16, 4, 0, 20.0, False), (64, 10, 2, 0, 0.0, True), (576, 16, 1, 0, 0.0, False),
           (64, 9, 3, 0, 0.0, False)]


@pytest.fixture
def C():
    from llambda import _native

    isa, threads, inv = _native.isa(), _native.threads(), _native.batch_invariant()
    _native.set_batch_invariant(True)
    yield _native
    _native.set_batch_invariant(inv)
    _native.set_isa(isa)
    _native.set_threads(threads)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "hd%d-h%d-kv%d-w%d-cap%g-sinks%d" % c)
def test_wide_tiles_equal_rows_alone_at_depth(C, config, kv_type):
    from llambda.backends.native import NativeBackend

    hd, n_heads, n_kv, window, softcap, sinks = config
    if kv_type == "q8_0" and hd % 32:
        pytest.skip("q8_0 blocks need head_dim % 32 == 0")
    be = NativeBackend(threads=2, kv_type=kv_type)
    C.set_batch_invariant(True)
    cache = be.create_kv_cache(1, 1, N_CTX, n_kv, hd)
    r = np.random.default_rng(hd + n_heads)
    kv = r.standard_normal((2, N_CTX, n_kv, hd)).astype(F32)
    kv[0] *= 2.0  # sharper softmaxes: the running max moves between blocks and chunks
    be.kv_store(cache, 0, kv[0], kv[1], np.zeros(N_CTX, np.int32), np.arange(N_CTX, dtype=np.int32))
    q = r.standard_normal((len(POS), n_heads, hd)).astype(F32)
    sink = r.standard_normal(n_heads).astype(F32)
    scale = 1.0 / np.sqrt(hd)

    def run(idx):
        out = np.full((len(idx), n_heads, hd), np.nan, F32)
        args = (q[idx].copy(), cache, 0, np.zeros(len(idx), np.int32), np.asarray(POS, np.int32)[idx].copy(), out, scale,
                window, softcap)
        be.attention_sinks(*args, sink) if sinks else be.attention(*args)
        return out

    rows = np.arange(len(POS))
    for isa in C.isa_available():
        C.set_isa(isa)
        C.set_threads(1)
        alone = np.concatenate([run(rows[i:i + 1]) for i in rows])
        if kv_type != "q8_0" and not sinks:
            some = [0, 29, 30, 79]  # around the 256-key chunk edge at 2560
            want = ref_attention(q[some], cache.k[0], cache.v[0], [0] * 4, [POS[i] for i in some], n_kv, scale, window,
                                 softcap)
            np.testing.assert_allclose(alone[some], want, rtol=0, atol=2e-5)
        for threads in (1, 2):
            C.set_threads(threads)
            assert same_bits(run(rows), alone), (isa, threads, "whole chunk")
            cut = np.concatenate([run(rows[:29]), run(rows[29:33]), run(rows[33:])])
            assert same_bits(cut, alone), (isa, threads, "cut 29/4/47")

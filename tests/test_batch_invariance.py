"""With batch invariance on (the server), a row's result does not depend on what else shares the call.

Matmul: a row computed alone (n == 1, the GEMV-shaped kernel) equals that row of a batch (the
GEMM kernels) bit for bit, per weight type and ISA path. Attention: a query row's output is the
same alone, among 8 decode rows at mixed positions, inside a prefill chunk (cut either way), next
to a prefill chunk, and with 1 or 2 threads, per ISA path and KV-cache type. And the whole model:
a token's logits decoded alone equal its logits inside a batched prefill step. With the invariance
off (or a kernel summing in another order) these comparisons fail on every ISA path.
"""
from pathlib import Path

import numpy as np
import pytest

import llambda

from llambda.backends import available_backends
from llambda.formats.quants import QType, quantize

pytestmark = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")

F32 = np.float32
# every type the C core runs (its type table), so a new type is covered by its table row
WEIGHT_TYPES = []
if "native" in available_backends():
    from llambda import _native as _table
    WEIGHT_TYPES = [QType(t["id"]) for t in _table.qtypes()]


@pytest.fixture
def C():
    from llambda import _native

    isa, threads = _native.isa(), _native.threads()
    _native.set_batch_invariant(True)
    yield _native
    _native.set_batch_invariant(False)
    _native.set_isa(isa)
    _native.set_threads(threads)


# ---------------------------------------------------------------- matmul


def packed_matrix(C, qtype, rows, cols, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(F32)
    raw = w.view(np.uint8).reshape(rows, -1) if qtype == QType.F32 else quantize(w, qtype).reshape(rows, -1)
    dst = np.empty(C.packed_size(int(qtype), rows, cols), np.uint8)
    return C.pack(int(qtype), raw, dst, rows, cols), dst


# (rows, cols): a partial last 16-row group, one K chunk, and K over several 2048-value chunks
# (the GEMM sums K in chunks: the n == 1 kernel must too), and three whole groups (where the GEMM
# takes pairs of groups, a pair then a lone group); float types also get a ragged K.
SHAPES = [(100, 512), (37, 4864), (48, 768)]
FLOAT_SHAPES = [(100, 512), (21, 2085)]


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("exact", [0, 1], ids=["q8", "f32act"])
def test_single_rows_equal_batch_rows(C, qtype, exact):
    shapes = FLOAT_SHAPES if qtype in (QType.F16, QType.BF16, QType.F32) else SHAPES
    for rows, cols in shapes:
        layout, w = packed_matrix(C, qtype, rows, cols, int(qtype) + cols)
        x = np.random.default_rng(cols).standard_normal((9, cols)).astype(F32)
        x[::2, ::23] *= 12  # outliers in every other row: blocks with a residual code (kernels.h, LLB_OUTLIER)
        xs70 = np.random.default_rng(cols + 1).standard_normal((70, cols)).astype(F32)
        xs70[::3, ::29] *= 12
        for isa in C.isa_available():
            C.set_isa(isa)
            for threads in (1, 2):
                C.set_threads(threads)
                batch = np.empty((9, rows), F32)
                C.matmul(int(qtype), layout, w, rows, cols, x, batch, 9, exact)
                for i in range(9):
                    one = np.empty((1, rows), F32)
                    C.matmul(int(qtype), layout, w, rows, cols, x[i:i + 1].copy(), one, 1, exact)
                    assert np.array_equal(one[0].view(np.uint32), batch[i].view(np.uint32)), (isa, threads, rows, cols, i)
                # a unit of fewer rows than a GEMM tile (AVX2 Q4_K decodes in the tile, without a panel)
                three = np.empty((3, rows), F32)
                C.matmul(int(qtype), layout, w, rows, cols, x[:3].copy(), three, 3, exact)
                assert np.array_equal(three.view(np.uint32), batch[:3].view(np.uint32)), (isa, threads, rows, cols)
                # two work units of 64 rows (the GEMM shares a unit's decoding among its tiles) and a tail
                big = np.empty((70, rows), F32)
                C.matmul(int(qtype), layout, w, rows, cols, xs70, big, 70, exact)
                for i in (0, 7, 8, 62, 63, 64, 69):
                    one = np.empty((1, rows), F32)
                    C.matmul(int(qtype), layout, w, rows, cols, xs70[i:i + 1].copy(), one, 1, exact)
                    assert np.array_equal(one[0].view(np.uint32), big[i].view(np.uint32)), (isa, threads, rows, cols, i)


# ---------------------------------------------------------------- attention

# (head_dim, n_heads, n_kv, window, softcap): SmolLM2-like, GQA 7 with softcap, a Gemma local
# layer (window, head_dim 256: past the window, rows no longer share a first key nor a tile),
# a head_dim with a vector tail, blocks of 48 keys (not a divisor of the 256-key chunk), and
# GQA 24 (tiles in several passes over the heads).
ATTN_CONFIGS = [(64, 9, 3, 0, 0.0), (64, 14, 2, 0, 3.0), (256, 4, 1, 300, 0.0), (20, 6, 2, 0, 0.0),
                (40, 4, 2, 0, 0.0), (16, 24, 1, 0, 2.0)]
N_SLOTS, N_CTX = 3, 700


def ref_attention(q, kc, vc, slots, pos, n_kv, scale, window, softcap):
    """float64, to check the invariant schedule is also right (not just consistent). Caches in the C
    layout (n_slots, n_kv, n_ctx, hd), read here as (n_slots, n_ctx, n_kv, hd)."""
    kc, vc = np.moveaxis(kc, 2, 1).astype(np.float64), np.moveaxis(vc, 2, 1).astype(np.float64)
    n, n_heads, _ = q.shape
    group = n_heads // n_kv
    out = np.zeros(q.shape, np.float64)
    for i in range(n):
        p = int(pos[i])
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_heads):
            s = scale * (kc[slots[i], lo:p + 1, h // group] @ q[i, h].astype(np.float64))
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            e = np.exp(s - s.max())
            out[i, h] = (e / e.sum()) @ vc[slots[i], lo:p + 1, h // group]
    return out


class Attn:
    def __init__(self, C, config, cache_type, seed):
        self.C = C
        self.hd, self.n_heads, self.n_kv, self.window, self.softcap = config
        self.ct = cache_type
        r = np.random.default_rng(seed)
        dt = F32 if cache_type == 0 else np.float16
        shape = (N_SLOTS, self.n_kv, N_CTX, self.hd)     # the C layout
        self.kc = r.standard_normal(shape).astype(dt)
        self.vc = r.standard_normal(shape).astype(dt)
        self.scale = 1.0 / np.sqrt(self.hd)

    def q(self, n, seed):
        return np.random.default_rng(seed).standard_normal((n, self.n_heads, self.hd)).astype(F32)

    def run(self, q, slots, pos):
        out = np.full_like(q, np.nan)
        self.C.attention(q, self.kc, self.vc, out, np.asarray(slots, np.int32), np.asarray(pos, np.int32), len(q),
                         self.n_heads, self.n_kv, self.hd, N_SLOTS, N_CTX, self.ct, self.scale, self.window, self.softcap)
        return out

    def alone(self, q, slots, pos):
        return np.stack([self.run(q[i:i + 1].copy(), slots[i:i + 1], pos[i:i + 1])[0] for i in range(len(q))])


def same_bits(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


# 8 decode rows: one key, 255/256/257 keys (the chunk edges), several chunks, the last position.
DECODE_SLOTS = [0, 1, 2, 0, 1, 2, 1, 0]
DECODE_POS = [0, 254, 255, 256, 511, 600, 333, 699]


@pytest.mark.parametrize("cache_type", [0, 1], ids=["f32", "f16"])
@pytest.mark.parametrize("config", ATTN_CONFIGS, ids=lambda c: "hd%d-h%d-kv%d-w%d-cap%g" % c)
def test_attention_rows_equal_alone(C, config, cache_type):
    for isa in C.isa_available():
        C.set_isa(isa)
        A = Attn(C, config, cache_type, seed=config[0] + config[1])
        # decode rows: alone (1 thread) is the yardstick for everything else
        qd = A.q(8, 1)
        C.set_threads(1)
        want_d = A.alone(qd, DECODE_SLOTS, DECODE_POS)
        np.testing.assert_allclose(want_d, ref_attention(qd, A.kc, A.vc, DECODE_SLOTS, DECODE_POS, A.n_kv, A.scale,
                                                         A.window, A.softcap), rtol=0, atol=5e-6)
        # a prefill chunk of 60 tokens in slot 2 crossing the 256-key chunk edge (and the window of 300)
        qp = A.q(60, 2)
        pslots, ppos = [2] * 60, list(range(245, 305))
        want_p = A.alone(qp, pslots, ppos)
        np.testing.assert_allclose(want_p, ref_attention(qp, A.kc, A.vc, pslots, ppos, A.n_kv, A.scale, A.window,
                                                         A.softcap), rtol=0, atol=5e-6)
        for threads in (1, 2):
            C.set_threads(threads)
            assert same_bits(A.alone(qd, DECODE_SLOTS, DECODE_POS), want_d), (isa, threads, "alone")
            assert same_bits(A.run(qd, DECODE_SLOTS, DECODE_POS), want_d), (isa, threads, "batch of 8")
            assert same_bits(A.run(qp, pslots, ppos), want_p), (isa, threads, "prefill chunk")
            # the same prompt cut differently: two chunks of 13 and 47 tokens
            assert same_bits(np.concatenate([A.run(qp[:13].copy(), pslots[:13], ppos[:13]),
                                             A.run(qp[13:].copy(), pslots[13:], ppos[13:])]), want_p), (isa, threads)
            # a server step: decode rows around a prefill chunk
            mixed = A.run(np.concatenate([qd[:3], qp, qd[3:]]), DECODE_SLOTS[:3] + pslots + DECODE_SLOTS[3:],
                          DECODE_POS[:3] + ppos + DECODE_POS[3:])
            assert same_bits(mixed, np.concatenate([want_d[:3], want_p, want_d[3:]])), (isa, threads, "mixed step")


def test_attention_out_may_alias_q(C):
    """Decode rows (one chunk or several) and a prefill chunk in tiles, written over their own q."""
    A = Attn(C, ATTN_CONFIGS[0], 1, seed=5)
    slots = DECODE_SLOTS + [2] * 30
    pos = DECODE_POS + list(range(240, 270))
    for threads in (1, 2):
        C.set_threads(threads)
        q = A.q(38, 3)
        want = A.run(q, slots, pos)
        C.attention(q, A.kc, A.vc, q, np.asarray(slots, np.int32), np.asarray(pos, np.int32), 38, A.n_heads, A.n_kv,
                    A.hd, N_SLOTS, N_CTX, 1, A.scale, 0, 0.0)
        assert same_bits(q, want), threads


def test_attention_long_prefill_in_passes(C):
    """A prefill whose chunk partials overflow one pass of scratch (16 MB) gives each row its lone value."""
    hd, n_heads, n_kv, n_ctx = 64, 16, 4, 4096
    r = np.random.default_rng(9)
    kc = r.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    vc = r.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    n = 400  # 400 rows x 16 chunks x 4 kv heads x (4 x 64 + 8) floats = 27 MB of partials
    q = r.standard_normal((n, n_heads, hd)).astype(F32)
    pos = np.arange(n_ctx - n, n_ctx, dtype=np.int32)
    slots = np.zeros(n, np.int32)
    C.set_threads(2)

    def run(idx):
        out = np.empty((len(idx), n_heads, hd), F32)
        C.attention(q[idx].copy(), kc, vc, out, slots[idx].copy(), pos[idx].copy(), len(idx), n_heads, n_kv, hd, 1, n_ctx,
                    1, 0.125, 0, 0.0)
        return out

    whole = run(np.arange(n))
    for i in (0, 199, 399):
        assert same_bits(whole[i:i + 1], run(np.array([i]))), i


# ---------------------------------------------------------------- the whole model


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_model_logits_do_not_depend_on_the_batch(smollm2_gguf, kv_type):
    """SmolLM2 with invariance on, as the server runs it: a token's logits are the same bits whether
    the token is decoded alone or sits in a prefill chunk (any chunking) beside another sequence's
    decode token, with contexts past one 256-key attention chunk. (The server's default f32 KV cache,
    and q8_0, whose keys depend on their slot's position 0; the attention tests above cover f16.)"""
    import llambda
    from llambda import _native

    rng = np.random.default_rng(3)
    L = 280
    prompt = [int(t) for t in rng.integers(100, 30000, L)]
    check = [0, 1, 130, 255, 256, 257, L - 1]                # rows compared (logits are 49152 floats each)
    with llambda.load(smollm2_gguf, backend="native", threads=2, n_ctx=300, n_slots=2, kv_type=kv_type) as m:
        tr = m.transformer
        tr.backend.set_batch_invariant(True)
        try:
            _native.set_threads(1)                             # alone on one thread, batched on two
            alone = {}
            for p, tok in enumerate(prompt):                   # token by token on slot 0
                logits = tr.forward([tok], [0], [p], [0])
                if p in check:
                    alone[p] = logits[0].copy()
            extra = tr.forward([77], [0], [L], [0])[0].copy()  # slot 0 decodes one more token
            _native.set_threads(2)

            for cut in (128, 97):                              # the prompt on slot 1, in chunks of `cut` tokens
                for s in range(0, L, cut):
                    ids = prompt[s:s + cut]
                    n = len(ids)
                    # each chunk shares its step with slot 0's decode token (last row)
                    logits = tr.forward(ids + [77], [1] * n + [0], list(range(s, s + n)) + [L], list(range(n + 1)))
                    for r in range(n):
                        if s + r in check:
                            assert same_bits(logits[r], alone[s + r]), (cut, s + r)
                    assert same_bits(logits[n], extra), (cut, s)
        finally:
            tr.backend.set_batch_invariant(False)
            _native.set_threads(2)


def test_invariant_decode_allocates_nothing(smollm2_gguf):
    """The invariant attention sizes its scratch for the whole context up front: decode steps past
    the 256-key chunk edge (where rows start to need partials) allocate nothing once warmed up."""
    import llambda
    from llambda import _native

    with llambda.load(smollm2_gguf, backend="native", n_ctx=600, kv_type="f32") as m:
        tr = m.transformer
        tr.backend.set_batch_invariant(True)
        try:
            tok = 1
            for pos in range(0, 5):                        # warm up: plan, scratch
                tok = int(np.argmax(tr.forward([tok], [0], [pos], [0])[0]))
            before = _native.alloc_stats()
            for pos in range(5, 300):
                tok = int(np.argmax(tr.forward([tok], [0], [pos], [0])[0]))
            assert _native.alloc_stats() == before, "the C core allocated during invariant decode"
        finally:
            tr.backend.set_batch_invariant(False)


def test_a_servers_switch_does_not_change_a_library_model():
    """Batch invariance is the C core's process-wide switch: a model whose backend turned it on (the
    server's) must not change what another model in the same process computes, nor the reverse."""
    from llambda.backends.native import NativeBackend  # noqa: F401 (the native core is built: pytestmark)
    from llambda.server.scheduler import Scheduler

    path = str(Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama")
    ids = list(range(3, 40))
    with llambda.load(path) as lib:
        assert lib.backend.batch_invariant          # the default; turned off here to tell the two apart
        lib.backend.set_batch_invariant(False)
        before = lib.logits(ids).copy()
        with llambda.load(path, n_slots=2) as served:
            Scheduler(served.transformer)            # turns invariance on for its backend
            served.logits(ids)
            assert _native_flag() is True
            after = lib.logits(ids)
            assert _native_flag() is False
        np.testing.assert_array_equal(after, before)


def _native_flag() -> bool:
    from llambda import _native
    return _native.batch_invariant()

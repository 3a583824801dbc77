"""_native.Plan: op calls recorded once and replayed from C.

A replay must write bitwise what calling the same ops one by one writes (every ISA path),
re-read token ids / slots / positions from their buffers on each replay and refuse
out-of-range ones before writing anything, and hold (then release) the buffers it uses.
"""
import gc
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

F32, I32 = np.float32, np.int32
Q8_0, Q4_1, F16 = 8, 3, 1


def q8_0_bytes(rng, rows, cols):
    """Q8_0 file layout: per 32 values an fp16 scale and 32 int8 codes."""
    nb = rows * cols // 32
    d = rng.uniform(0.002, 0.02, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    qs = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
    return np.ascontiguousarray(np.concatenate([d, qs], axis=1)).reshape(-1)


def q4_1_bytes(rng, rows, cols):
    """Q4_1 file layout: per 32 values fp16 scale, fp16 min, 16 bytes of nibbles."""
    nb = rows * cols // 32
    d = rng.uniform(0.002, 0.02, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    m = rng.uniform(-0.1, 0.0, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    qs = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
    return np.ascontiguousarray(np.concatenate([d, m, qs], axis=1)).reshape(-1)


class Mat:
    """A weight matrix packed into the kernels' layout, as the native backend holds it."""

    def __init__(self, qtype, raw, rows, cols):
        self.qtype, self.rows, self.cols = qtype, rows, cols
        self.data = np.empty(native.packed_size(qtype, rows, cols), np.uint8)
        self.layout = native.pack(qtype, raw, self.data, rows, cols)

    def matmul(self, x, out, n, exact):
        native.matmul(self.qtype, self.layout, self.data, self.rows, self.cols, x, out, n, exact)


def make_model(seed, qtype, *, cache_f16, gemma):
    """Buffers and weights of one small transformer block (every op the native backend emits)."""
    rng = np.random.default_rng(seed)
    d, heads, n_kv, hd, ffn, vocab, n_slots, n_ctx, n = 64, 4, 2, 16, 96, 50, 3, 24, 2
    raw = q8_0_bytes if qtype == Q8_0 else q4_1_bytes
    m = dict(d=d, heads=heads, n_kv=n_kv, hd=hd, ffn=ffn, vocab=vocab, n_slots=n_slots, n_ctx=n_ctx, n=n, gemma=gemma)
    m["embd"] = Mat(F16, rng.standard_normal((vocab, d)).astype(np.float16).view(np.uint8).reshape(-1), vocab, d)
    for name, rows, cols in [("wq", heads * hd, d), ("wk", n_kv * hd, d), ("wv", n_kv * hd, d), ("wo", d, heads * hd),
                             ("gate", ffn, d), ("up", ffn, d), ("down", d, ffn), ("head", vocab, d)]:
        m[name] = Mat(qtype, raw(rng, rows, cols), rows, cols)
    for name, size in [("norm1", d), ("norm2", d), ("bq", heads * hd), ("bk", n_kv * hd), ("bv", n_kv * hd)]:
        m[name] = rng.uniform(0.5, 1.5, size).astype(F32)
    m["inv_freq"] = (10000.0 ** (-np.arange(0, hd, 2) / hd)).astype(F32)
    ctype = np.float16 if cache_f16 else F32
    m["ctype"] = 1 if cache_f16 else 0
    # the mutable state: activations, caches, ids (what a decode step reads and writes)
    m["state"] = dict(
        tok=rng.integers(0, vocab, n).astype(I32), slots=np.array([0, 2], I32), pos=np.array([3, 7], I32),
        x=np.zeros((n, d), F32), h=np.zeros((n, d), F32), q=np.zeros((n, heads, hd), F32),
        k=np.zeros((n, n_kv, hd), F32), v=np.zeros((n, n_kv, hd), F32), attn=np.zeros((n, heads, hd), F32),
        proj=np.zeros((n, d), F32), g=np.zeros((n, ffn), F32), u=np.zeros((n, ffn), F32),
        logits=np.zeros((n, vocab), F32),
        kc=(rng.standard_normal((n_slots, n_ctx, n_kv, hd)) * 0.5).astype(ctype),
        vc=(rng.standard_normal((n_slots, n_ctx, n_kv, hd)) * 0.5).astype(ctype),
    )
    return m


def step(m, s, exact):
    """One decode step of a block: the op sequence of models/base.py, with biases and the
    Gemma extras (embedding scale, sliding window, softcaps, GELU) when m['gemma']."""
    n, d, heads, n_kv, hd = m["n"], m["d"], m["heads"], m["n_kv"], m["hd"]
    e = m["embd"]
    native.get_rows(e.qtype, e.layout, e.data, e.rows, e.cols, s["tok"], s["x"], n)
    if m["gemma"]:
        native.scale(s["x"], 8.0, s["x"].size)
    native.rmsnorm(s["x"], m["norm1"], s["h"], n, d, 1e-5)
    q2, k2, v2 = s["q"].reshape(n, -1), s["k"].reshape(n, -1), s["v"].reshape(n, -1)
    m["wq"].matmul(s["h"], q2, n, exact)
    m["wk"].matmul(s["h"], k2, n, exact)
    m["wv"].matmul(s["h"], v2, n, exact)
    native.add_rows(q2, m["bq"], q2, n, heads * hd)
    native.add_rows(k2, m["bk"], k2, n, n_kv * hd)
    native.add_rows(v2, m["bv"], v2, n, n_kv * hd)
    if m["gemma"]:
        native.rmsnorm(s["q"], m["norm1"][:hd], s["q"], n * heads, hd, 1e-6)
    for t in (s["q"], s["k"]):
        native.rope(t, s["pos"], m["inv_freq"], n, t.shape[1], hd, hd, 1 if m["gemma"] else 0)
    native.kv_store(s["k"], s["v"], s["kc"], s["vc"], s["slots"], s["pos"], n, n_kv, hd, m["n_slots"], m["n_ctx"],
                    m["ctype"])
    window, cap = (4, 30.0) if m["gemma"] else (0, 0.0)
    native.attention(s["q"], s["kc"], s["vc"], s["attn"], s["slots"], s["pos"], n, heads, n_kv, hd, m["n_slots"],
                     m["n_ctx"], m["ctype"], hd ** -0.5, window, cap)
    m["wo"].matmul(s["attn"].reshape(n, -1), s["proj"], n, exact)
    native.add(s["x"], s["proj"], s["x"], n * d)
    native.rmsnorm(s["x"], m["norm2"], s["h"], n, d, 1e-5)
    m["gate"].matmul(s["h"], s["g"], n, exact)
    m["up"].matmul(s["h"], s["u"], n, exact)
    (native.gelu_mul if m["gemma"] else native.silu_mul)(s["g"], s["u"], s["g"], s["g"].size)
    m["down"].matmul(s["g"], s["proj"], n, exact)
    native.add(s["x"], s["proj"], s["x"], n * d)
    m["head"].matmul(s["x"], s["logits"], n, exact)
    if m["gemma"]:
        native.softcap(s["logits"], 15.0, s["logits"].size)


def copy_state(s):
    return {k: v.copy() for k, v in s.items()}


def advance(s, rng, vocab, n_ctx):
    """The next token's ids, written into the buffers in place (as the engine does in its arena)."""
    s["tok"][:] = rng.integers(0, vocab, len(s["tok"]))
    s["pos"][:] = (s["pos"] + 1) % n_ctx
    s["slots"][:] = s["slots"][::-1]


def assert_states_equal(a, b, when):
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs {when}"


def record(fn):
    plan = native.Plan()
    plan.begin()
    try:
        fn()
    finally:
        plan.end()
    return plan


# ------------------------------------------------------------------ replay == calls


@pytest.mark.parametrize("qtype,cache_f16,gemma,exact", [
    (Q8_0, True, False, 0), (Q4_1, True, False, 0), (Q8_0, False, True, 1), (Q4_1, False, True, 0),
])
def test_replay_writes_bitwise_what_the_calls_write(isa, qtype, cache_f16, gemma, exact):
    m = make_model(1, qtype, cache_f16=cache_f16, gemma=gemma)
    calls, replayed = copy_state(m["state"]), copy_state(m["state"])
    step(m, calls, exact)
    plan = record(lambda: step(m, replayed, exact))
    assert len(plan) >= 20
    assert_states_equal(calls, replayed, "after the recorded step")
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    for t in range(4):  # new ids/positions each step, read by the replay from the same buffers
        advance(calls, rng_a, m["vocab"], m["n_ctx"])
        advance(replayed, rng_b, m["vocab"], m["n_ctx"])
        step(m, calls, exact)
        plan.replay()
        assert_states_equal(calls, replayed, f"after replay {t}")
    assert np.abs(replayed["logits"]).max() > 0


def test_replay_follows_the_active_isa():
    """Kernels are picked at run time: a plan recorded on one path replays on another."""
    isas = native.isa_available()
    if len(isas) < 2:
        pytest.skip("this CPU offers a single SIMD path")
    before = native.isa()
    try:
        m = make_model(2, Q8_0, cache_f16=True, gemma=False)
        recorded = copy_state(m["state"])
        native.set_isa(isas[0])
        plan = record(lambda: step(m, recorded, 0))
        for other in isas[1:]:
            native.set_isa(other)
            calls = copy_state(m["state"])
            step(m, calls, 0)
            for k in recorded:  # replay on the plan's own buffers, from the same starting state
                recorded[k][...] = m["state"][k]
            plan.replay()
            assert_states_equal(calls, recorded, f"replayed on {other}")
    finally:
        native.set_isa(before)


# ------------------------------------------------------------------ re-validation at replay


@pytest.mark.parametrize("field,index,value", [
    ("tok", 1, 50),        # token id == table rows
    ("tok", 0, -1),
    ("slots", 0, 3),       # slot == n_slots
    ("pos", 1, 24),        # position == n_ctx
    ("pos", 0, -5),
])
def test_out_of_range_ids_raise_at_replay_and_write_nothing(field, index, value):
    m = make_model(3, Q8_0, cache_f16=True, gemma=False)
    s = m["state"]
    plan = record(lambda: step(m, s, 0))
    s[field][index] = value
    # what the binding itself says about this value
    with pytest.raises(ValueError) as direct:
        step(m, copy_state(s), 0)
    before = copy_state(s)
    with pytest.raises(ValueError) as replayed:
        plan.replay()
    assert str(replayed.value) == str(direct.value)
    assert f"= {value}" in str(replayed.value) or f"={value}" in str(replayed.value)
    assert_states_equal(before, s, "after a refused replay")
    s[field][index] = 1  # back in range: the plan works again
    plan.replay()


def test_ids_written_by_an_earlier_op_of_the_plan_are_checked_before_use():
    """pos is an int32 view of a float32 buffer that an `add` of the plan writes: the values
    checked before the replay are not the ones rope reads, so rope re-checks them."""
    arena = np.zeros(4, F32)
    pos = arena[:1].view(I32)
    tiny = np.array([1e-45], F32)  # bit pattern 1: position 1
    zero = np.zeros(1, F32)
    x = np.ones((1, 1, 4), F32)
    inv_freq = np.ones(2, F32)
    plan = record(lambda: (native.add(tiny, zero, arena[:1], 1), native.rope(x, pos, inv_freq, 1, 1, 4, 4, 0)))
    assert int(pos[0]) == 1
    plan.replay()
    tiny[0] = 1.0  # bits 0x3f800000: far beyond any context
    with pytest.raises(ValueError, match=r"rope: pos\[0\] = 1065353216 is out of range .*earlier op"):
        plan.replay()


# ------------------------------------------------------------------ ownership of buffers


def test_plan_pins_its_buffers_and_releases_them_when_freed():
    ba = bytearray(64)  # raw bytes are accepted as float32 by the elementwise ops
    arr = np.ones(16, F32)
    refs = sys.getrefcount(arr)
    plan = record(lambda: (native.scale(ba, 2.0, 16), native.add(arr, arr, arr, 16)))
    assert len(plan) == 2 and plan.buffers == 4
    assert sys.getrefcount(arr) == refs + 3  # one per view the plan holds
    with pytest.raises(BufferError):
        ba.extend(b"0000")  # exported: cannot move while the plan may write it
    del plan
    ba.extend(b"0000")
    assert sys.getrefcount(arr) == refs
    arr.resize(32, refcheck=True)  # no view left


def test_a_plan_in_a_reference_cycle_is_collected():
    class Buf(bytearray):
        pass

    b = Buf(64)
    plan = record(lambda: native.scale(b, 2.0, 16))
    b.plan = plan  # plan -> its view of b -> b -> plan
    alive = weakref.ref(b)
    del b, plan
    gc.collect()
    assert alive() is None


def test_plans_hold_nothing_when_not_recording():
    arr = np.ones(8, F32)
    refs = sys.getrefcount(arr)
    native.add(arr, arr, arr, 8)
    assert sys.getrefcount(arr) == refs


# ------------------------------------------------------------------ the life cycle


def test_failed_ops_are_not_recorded_and_recording_is_per_thread():
    arr = np.ones(8, F32)
    plan = native.Plan()
    plan.begin()
    try:
        native.add(arr, arr, arr, 8)
        with pytest.raises(ValueError):
            native.add(arr, arr, arr, 9)  # too short: refused, not kept
        other = threading.Thread(target=native.scale, args=(np.ones(4, F32), 3.0, 4))
        other.start()
        other.join()
    finally:
        plan.end()
    assert len(plan) == 1 and plan.buffers == 3
    arr[:] = 1
    plan.replay()
    assert (arr == 2).all()


def test_life_cycle_errors():
    arr = np.ones(8, F32)
    plan = native.Plan()
    with pytest.raises(RuntimeError, match="empty"):
        plan.replay()
    with pytest.raises(RuntimeError, match="not being recorded"):
        plan.end()
    plan.begin()
    try:
        with pytest.raises(RuntimeError, match="already recording"):
            native.Plan().begin()
        with pytest.raises(RuntimeError, match="still being recorded"):
            plan.replay()
        with pytest.raises(RuntimeError, match="records a Plan"):
            native.pack(Q8_0, q8_0_bytes(np.random.default_rng(0), 1, 32), np.empty(64, np.uint8), 1, 32)
        native.scale(arr, 2.0, 8)
    finally:
        plan.end()
    with pytest.raises(RuntimeError, match="recorded once"):
        plan.begin()
    other = native.Plan()
    other.begin()
    try:
        with pytest.raises(RuntimeError, match="cannot hold a replay"):
            plan.replay()
    finally:
        other.end()
    plan.replay()
    assert (arr == 4).all()
    with pytest.raises(TypeError):
        native.Plan(1)
    assert "recorded, 1 calls" in repr(plan)


# ------------------------------------------------------------------ a replay's thread cap


def test_replay_times_each_call_and_names_them():
    """replay(times=...) adds each call's nanoseconds to its element (benchmarks) and writes the same
    bits; ops names the calls; a times array of the wrong kind or length is refused before any call."""
    a, b = np.ones(16, F32), np.zeros(16, F32)
    plan = record(lambda: (native.add(a, a, b, 16), native.scale(b, 3.0, 16)))
    assert plan.ops == ("add", "scale")
    times = np.zeros(2, np.int64)
    for _ in range(3):
        b[:] = 0
        plan.replay(times=times)
        assert (b == 6).all()
    first = times.copy()
    assert (first > 0).all()
    plan.replay(threads=1, times=times)
    assert (times > first).all()    # added, not overwritten
    b[:] = 5
    for bad in (np.zeros(3, np.int64), np.zeros(2, np.float64), np.zeros(2, np.int32), np.zeros(4, np.int64)[::2],
                np.zeros(2, np.int64).view(np.uint8)[:16]):
        with pytest.raises(ValueError, match="times"):
            plan.replay(times=bad)
    frozen = np.zeros(2, np.int64)
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        plan.replay(times=frozen)
    assert (b == 5).all()           # nothing ran


def test_replay_on_fewer_threads_writes_the_same_bits(isa):
    """replay(threads=k) caps the pool for that replay (the decode loop's thread tuner): big enough
    ops to fork (a matmul, attention over 2000 cached keys) write the same bits on any count."""
    rng = np.random.default_rng(11)
    rows, cols, heads, n_kv, hd, n_ctx = 512, 256, 4, 2, 32, 2048
    w = Mat(Q8_0, q8_0_bytes(rng, rows, cols), rows, cols)
    x = rng.standard_normal((1, cols)).astype(F32)
    out = np.zeros((1, rows), F32)
    q = rng.standard_normal((1, heads, hd)).astype(F32)
    kc = rng.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    vc = rng.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    att = np.zeros((1, heads, hd), F32)
    slots, pos = np.zeros(1, I32), np.array([1999], I32)
    before = native.threads()
    native.set_threads(2)
    try:
        plan = record(lambda: (w.matmul(x, out, 1, 0),
                               native.attention(q, kc, vc, att, slots, pos, 1, heads, n_kv, hd, 1, n_ctx, 1,
                                                hd ** -0.5, 0, 0.0)))
        seen = set()
        for threads in (0, 1, 2, 1, 0):
            out[:], att[:] = 0, 0
            plan.replay(threads=threads)
            seen.add(out.tobytes() + att.tobytes())
        assert len(seen) == 1 and np.abs(out).max() > 0
        for bad in (-1, 257):
            with pytest.raises(ValueError, match="threads"):
                plan.replay(threads=bad)
        with pytest.raises(TypeError):
            plan.replay(2)          # keyword only
    finally:
        native.set_threads(before)


def test_a_replayed_decode_step_equals_the_general_forward_and_refuses_the_same_inputs():
    """engine.decode's replay path (inputs checked and stored as Python ints, no NumPy) writes the bits
    the recorded step and the general forward write, and refuses what the general path refuses."""
    import llambda
    from llambda import engine
    from llambda.errors import ContextOverflowError
    path = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
    with llambda.load(str(path), backend="native", n_ctx=32, n_slots=2) as m:
        tr = m.transformer
        engine.prefill(tr, 0, [1, 2, 3], 0)
        engine.prefill(tr, 1, [4, 5], 0)
        recorded = engine.decode(tr, [0, 1], [7, 8], [3, 2]).copy()
        assert 2 in tr._plans
        replayed = engine.decode(tr, np.array([0, 1], I32), np.array([7, 8], I32), [3, 2]).copy()
        general = tr.forward([7, 8], [0, 1], [3, 2], np.arange(2), out=np.empty_like(recorded))
        assert recorded.tobytes() == replayed.tobytes() == general.tobytes()
        for slots, tokens, pos, err, match in [([0], [10 ** 6], [3], ValueError, "token id out of range"),
                                               ([0], [-1], [3], ValueError, "token id out of range"),
                                               ([2], [7], [3], ValueError, "slot out of range"),
                                               ([0], [7], [32], ContextOverflowError, "position 32"),
                                               ([0], [7], [-1], ContextOverflowError, "does not fit")]:
            for rows in (range(1), np.arange(1)):       # the replay path and the general one
                with pytest.raises(err, match=match):
                    tr.forward(tokens, slots, pos, rows)
        assert engine.decode(tr, [0, 1], [7, 8], [3, 2]).tobytes() == recorded.tobytes()

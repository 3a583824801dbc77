"""Mamba 1's selective scan (the ssm_scan1 op, csrc/ops/ssmscan1.c) on every ISA path and thread count against a
float64 oracle written from transformers' recurrent form, the NumPy backend's twin alike; hostile arguments refused
by the binding with a ValueError or TypeError, never a crash."""
import numpy as np
import pytest

from test_hybrid import interleaved_batch, need


def scan1_oracle(x, dt, b, c, z, state, a_neg, dt_bias, d_skip, slots, pos):
    """float64, token by token (transformers' mamba_selective_state_update, per channel): the outputs and the
    states."""
    S = state.astype(np.float64).copy()
    out = np.zeros(x.shape)
    for t, (s, p) in enumerate(zip(slots, pos)):
        if p == 0:
            S[s] = 0
        d = np.log1p(np.exp(dt[t].astype(np.float64) + dt_bias))[:, None]        # (D, 1)
        S[s] = np.exp(d * a_neg) * S[s] + d * b[t].astype(np.float64)[None, :] * x[t].astype(np.float64)[:, None]
        zz = z[t].astype(np.float64)
        out[t] = (S[s] @ c[t].astype(np.float64) + d_skip * x[t]) * zz / (1 + np.exp(-zz))
    return out, S


def scan_case(rng, d_inner, dstate, n_slots):
    slots, pos = interleaved_batch(rng, n_slots)
    n = len(slots)
    f32 = np.float32
    args = dict(x=rng.standard_normal((n, d_inner)).astype(f32), dt=rng.standard_normal((n, d_inner)).astype(f32),
                b=rng.standard_normal((n, dstate)).astype(f32), c=rng.standard_normal((n, dstate)).astype(f32),
                z=rng.standard_normal((n, d_inner)).astype(f32),
                a_neg=(-rng.uniform(0.05, 4.0, (d_inner, dstate))).astype(f32),
                dt_bias=rng.standard_normal(d_inner).astype(f32),
                d_skip=(1 + 0.5 * rng.standard_normal(d_inner)).astype(f32))
    state0 = (0.5 * rng.standard_normal((n_slots, d_inner, dstate))).astype(f32)
    return args, state0, slots, pos


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("d_inner, dstate, n_slots", [(128, 16, 3), (37, 16, 2), (515, 7, 4), (3, 33, 1), (1, 1, 1),
                                                      (64, 48, 2)])
def test_ssm_scan1_matches_the_oracle(isa, threads, d_inner, dstate, n_slots):
    need("native")
    from llambda import _native as C
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    rng = np.random.default_rng(d_inner * 1000 + dstate)
    args, state0, slots, pos = scan_case(rng, d_inner, dstate, n_slots)
    want, want_state = scan1_oracle(state=state0, slots=slots, pos=pos, **args)
    before = C.threads()
    C.set_threads(threads)
    try:
        for backend in (NumpyBackend(), NativeBackend(activations="f32")):
            state, taken = state0.copy(), np.full(n_slots, 5, np.int32)
            out = np.full((len(slots), d_inner), np.nan, np.float32)
            backend.ssm_scan1(args["x"], args["dt"], args["b"], args["c"], args["z"], state, taken, args["a_neg"],
                              args["dt_bias"], args["d_skip"], slots, pos, out)
            np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5, err_msg=backend.name)
            np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=2e-5, err_msg=backend.name)
            assert [taken[s] for s in range(n_slots)] == [pos[slots == s].max() + 1 for s in range(n_slots)]
    finally:
        C.set_threads(before)


def test_ssm_scan1_results_do_not_depend_on_threads_or_the_batch(isa):
    """A slot's outputs are the same bits alone, beside other slots' tokens, and over 1 or 2 threads."""
    need("native")
    from llambda import _native as C
    rng = np.random.default_rng(7)
    D, N = 600, 16          # past the size the op splits over the pool
    args, state0, slots, pos = scan_case(rng, D, N, 3)
    before = C.threads()

    def run(keep, threads):
        C.set_threads(threads)
        state, taken = state0.copy(), np.full(3, 5, np.int32)
        out = np.zeros((int(keep.sum()), D), np.float32)
        rows = {k: np.ascontiguousarray(v[keep]) for k, v in args.items() if k in ("x", "dt", "b", "c", "z")}
        C.ssm_scan1(rows["x"], rows["dt"], rows["b"], rows["c"], rows["z"], state, taken, args["a_neg"],
                    args["dt_bias"], args["d_skip"], np.ascontiguousarray(slots[keep]),
                    np.ascontiguousarray(pos[keep]), out, len(out), D, N, 3)
        return out
    try:
        mine = slots == 2
        alone = run(mine, 1)
        assert np.array_equal(run(np.ones(len(slots), bool), 2)[mine], alone)
        assert np.array_equal(run(np.ones(len(slots), bool), 1)[mine], alone)
    finally:
        C.set_threads(before)


def test_extreme_time_steps_and_gates_stay_exact(isa):
    """dt far past softplus's bends (|dt| up to 120: e^-|dt| under float's range) and gates z up to +-120: the
    vectorized softplus and SiLU against the float64 oracle, nothing overflowing to inf or NaN."""
    need("native")
    from llambda.backends.native import NativeBackend
    rng = np.random.default_rng(11)
    args, state0, slots, pos = scan_case(rng, 130, 16, 2)
    args["dt"] = (rng.uniform(-1, 1, args["dt"].shape) ** 3 * 120).astype(np.float32)
    args["z"] = (rng.uniform(-1, 1, args["z"].shape) ** 3 * 120).astype(np.float32)
    args["a_neg"] *= np.float32(0.05)          # large steps times A: decays from 1 down to 0
    want, want_state = scan1_oracle(state=state0, slots=slots, pos=pos, **args)
    state, out = state0.copy(), np.full((len(slots), 130), np.nan, np.float32)
    NativeBackend(activations="f32").ssm_scan1(args["x"], args["dt"], args["b"], args["c"], args["z"], state,
                                                np.full(2, 5, np.int32), args["a_neg"], args["dt_bias"],
                                                args["d_skip"], slots, pos, out)
    assert np.isfinite(out).all() and np.isfinite(state).all()
    np.testing.assert_allclose(out, want, rtol=2e-4, atol=1e-4)
    np.testing.assert_allclose(state, want_state, rtol=2e-4, atol=1e-4)


def test_a_positive_decay_is_taken_as_zero():
    """a_neg is never positive in a model (the loader refuses one); the op and its twin take it as 0: a decay of 1."""
    need("native")
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    rng = np.random.default_rng(3)
    args, state0, slots, pos = scan_case(rng, 8, 4, 1)
    args["a_neg"][:] = 50.0
    want, _ = scan1_oracle(state=state0, slots=slots, pos=pos, **dict(args, a_neg=np.zeros_like(args["a_neg"])))
    for backend in (NumpyBackend(), NativeBackend(activations="f32")):
        out = np.zeros((len(slots), 8), np.float32)
        backend.ssm_scan1(args["x"], args["dt"], args["b"], args["c"], args["z"], state0.copy(),
                          np.full(1, 5, np.int32), args["a_neg"], args["dt_bias"], args["d_skip"], slots, pos, out)
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-5, err_msg=backend.name)


def test_ssm_scan1_refuses_bad_arguments():
    need("native")
    from llambda import _native as C
    D, N, n = 8, 4, 2
    f = np.float32
    x, dt, z, out = (np.zeros((n, D), f) for _ in range(4))
    b, c = np.zeros((n, N), f), np.zeros((n, N), f)
    state, taken, a_neg = np.zeros((1, D, N), f), np.zeros(1, np.int32), -np.ones((D, N), f)
    vec = np.zeros(D, f)
    slots, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)

    def call(*over, sizes=(n, D, N, 1), **named):
        a = dict(x=x, dt=dt, b=b, c=c, z=z, state=state, state_pos=taken, a_neg=a_neg, dt_bias=vec, d_skip=vec,
                 slots=slots, pos=pos, out=out)
        a.update(named)
        return C.ssm_scan1(*a.values(), *sizes)

    call()
    assert taken[0] == 2
    with pytest.raises(ValueError, match="does not continue"):
        call(pos=np.array([5, 6], np.int32))
    with pytest.raises(ValueError, match="slots"):
        call(slots=np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match="slots"):
        call(slots=np.array([0, -1], np.int32))
    with pytest.raises(ValueError, match="state"):
        call(state=np.zeros((1, D, N - 1), f))                   # short
    with pytest.raises(ValueError, match="a_neg"):
        call(a_neg=-np.ones((D, N + 1), f))                      # not exactly (D, N)
    with pytest.raises(ValueError, match="b"):
        call(b=np.zeros((n, N - 1), f))
    with pytest.raises(ValueError, match="overlap"):
        call(out=x)                                              # out over its own input
    with pytest.raises(ValueError, match="overlap"):
        call(state_pos=pos[:1])                                  # counts written over positions
    with pytest.raises(ValueError, match="dstate"):
        call(sizes=(n, D, 0, 1))
    with pytest.raises(ValueError, match="n"):
        call(sizes=(n + 1, D, N, 1))                             # more tokens than the buffers hold
    with pytest.raises(ValueError):
        call(x=np.zeros((n, D), np.float64))                     # wrong element type
    with pytest.raises(ValueError):
        call(out=np.zeros((n, D), f)[:, ::2].copy()[:, :0])      # empty
    with pytest.raises(ValueError):
        call(x=np.zeros((n, 2 * D), f)[:, ::2])                  # not contiguous
    with pytest.raises((ValueError, TypeError)):
        call(x=None)
    with pytest.raises(TypeError):
        C.ssm_scan1(x, dt, b, c)                                 # too few arguments
    ro = np.zeros((n, D), f)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        call(out=ro)

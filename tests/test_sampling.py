"""Sampling chain and stop strings.

Distributions are checked against a slow, plain-Python statement of the chain
(sort everything, cut, renormalize) with a fixed seed: empirical frequencies must
sit within 5 standard errors of the expected probabilities, and tokens the chain
removes must never be drawn.
"""
import math
import random
import warnings

import numpy as np
import pytest

from llambda.errors import LlambdaError
from llambda.finite import finite_as_float
from llambda.sampling import (MAX_LOGPROBS, Sampler, SamplingError, SamplingParams, StopMatcher, TokenChoice,
                              top_k_indices)


# --- reference -----------------------------------------------------------------------------

def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x[np.isfinite(x)].max()
    return x - (m + math.log(np.exp(x - m).sum()))


def expected_probs(logits, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0):
    """The chain written the slow way: full sort by (-logit, id), then cut."""
    x = [float(v) for v in logits]
    n = len(x)
    m = max(x)
    order = sorted(range(n), key=lambda i: (-x[i], i))
    if 0 < top_k < n:
        order = order[:top_k]
    if top_p < 1.0:
        z = sum(math.exp(x[i] - m) for i in order)
        kept, cum = [], 0.0
        for i in order:
            kept.append(i)
            cum += math.exp(x[i] - m) / z
            if cum >= top_p:
                break
        order = kept
    if min_p > 0.0:
        order = [i for i in order if math.exp(x[i] - m) >= min_p]   # p_i / p_max >= min_p
    w = {i: math.exp((x[i] - m) / temperature) for i in order}
    z = sum(w.values())
    probs = np.zeros(n)
    for i, v in w.items():
        probs[i] = v / z
    return probs


def draw_counts(params, logits, n_draws):
    sampler = Sampler(params)
    counts = np.zeros(len(logits), dtype=np.int64)
    for _ in range(n_draws):
        counts[sampler.sample(logits).token] += 1
    return counts


def assert_matches_distribution(counts, probs):
    n = counts.sum()
    freq = counts / n
    never = probs == 0
    assert counts[never].sum() == 0, f"drew removed tokens {np.flatnonzero(never & (counts > 0))[:10]}"
    tol = 5 * np.sqrt(probs * (1 - probs) / n) + 1e-12
    bad = np.flatnonzero(np.abs(freq - probs) > tol)
    assert bad.size == 0, f"token(s) {bad[:5]}: freq {freq[bad[:5]]} vs expected {probs[bad[:5]]}"


# --- parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "1"),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True),
    ("top_p", 1.5), ("top_p", -0.01),
    ("min_p", 1.01), ("min_p", -0.5),
    ("repeat_penalty", 0.0), ("repeat_penalty", -1.0),
    ("repeat_last_n", -2), ("repeat_last_n", 3.0),
    ("presence_penalty", 2.5), ("frequency_penalty", -2.01),
    ("seed", -2), ("seed", 1.5), ("seed", 2**64),
    ("logprobs", -1), ("logprobs", MAX_LOGPROBS + 1),
    ("logit_bias", {-1: 1.0}), ("logit_bias", {"5": 1.0}), ("logit_bias", {5: float("inf")}),
    ("logit_bias", {5: float("nan")}), ("logit_bias", {5: "x"}), ("logit_bias", [(5, 1.0)]),
    ("chosen_logprob", 1), ("chosen_logprob", None),
    # float() of these raised OverflowError
    pytest.param("temperature", 10**400, id="temperature-10**400"),
    pytest.param("logit_bias", {5: 10**400}, id="logit_bias-10**400"),
])
def test_invalid_params_raise_a_clear_value_error(field, value):
    params = SamplingParams(**{field: value})
    with pytest.raises(SamplingError) as exc:
        params.validate()
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, LlambdaError)
    assert field in str(exc.value)
    with pytest.raises(SamplingError):
        Sampler(params)


def test_valid_params_pass():
    SamplingParams().validate()
    SamplingParams(temperature=0, top_k=0, top_p=0.0, min_p=0.0, repeat_last_n=-1, seed=-1,
                   logprobs=MAX_LOGPROBS, logit_bias={3: float("-inf"), np.int64(4): -100}).validate()
    SamplingParams(seed=2**64 - 1, presence_penalty=-2, frequency_penalty=2).validate()


def test_finite_as_float():
    """The check sampling's fields and a LoRA adapter's scale share: an int past float's range is not
    finite (float() of it raises), nor is a value float() refuses."""
    assert finite_as_float(1) and finite_as_float(np.float16(2.5)) and finite_as_float(-10**300)
    assert not any(finite_as_float(v) for v in (10**400, -10**400, math.inf, -math.inf, math.nan, None, "x"))
    with pytest.raises(SamplingError, match="logit_bias"):
        SamplingParams(logit_bias={5: -10**400}).validate()     # past float's range: not -inf


@pytest.mark.parametrize("logits,what", [
    (np.zeros((2, 3), np.float32), "1-D"),
    (np.zeros(0, np.float32), "non-empty"),
    (np.array([0.0, np.nan, 1.0], np.float32), "NaN"),
    (np.array([0.0, np.inf], np.float32), "inf"),
    (np.array([-np.inf, -np.inf]), "-inf"),
    (np.array(["a", "b"]), "dtype"),
])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_bad_logits_raise(logits, what, temperature):
    with pytest.raises(SamplingError, match=what.replace("+", r"\+")):
        Sampler(SamplingParams(temperature=temperature)).sample(logits)


# --- greedy --------------------------------------------------------------------------------

def test_greedy_takes_argmax_and_lowest_id_on_ties():
    s = Sampler(SamplingParams(temperature=0.0))
    assert s.sample(np.array([0.1, 3.0, -2.0, 2.9], np.float32)).token == 1
    assert s.sample(np.array([1.0, 5.0, 2.0, 5.0, 5.0], np.float32)).token == 1
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(x).token == int(np.argmax(x))


def test_greedy_ignores_truncation_settings_and_seed():
    x = np.random.default_rng(1).standard_normal(500).astype(np.float32)
    for params in (SamplingParams(temperature=0, top_k=1), SamplingParams(temperature=0, top_p=0.1, seed=5),
                   SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0)):
        assert Sampler(params).sample(x).token == int(np.argmax(x))


# --- logprobs ------------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [0.0, 100.0, -50.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("temperature,top_k", [(0.0, 40), (0.8, 40), (1.3, 0)])
def test_logprobs_are_log_softmax_of_unmodified_logits(shift, dtype, temperature, top_k):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(3000) * 3 + shift).astype(dtype)
    x[17] = -np.inf
    ref = log_softmax(x)
    s = Sampler(SamplingParams(temperature=temperature, top_k=top_k, logprobs=5, seed=1))
    for _ in range(5):
        c = s.sample(x)
        assert isinstance(c, TokenChoice)
        assert c.logprob == pytest.approx(ref[c.token], abs=1e-5)
        want = np.lexsort((np.arange(x.size), -ref))[:5]
        assert [t for t, _ in c.top] == list(want)
        assert [lp for _, lp in c.top] == pytest.approx(list(ref[want]), abs=1e-5)
        assert all(a[1] >= b[1] for a, b in zip(c.top, c.top[1:]))


def test_logprobs_ignore_penalties_and_bias():
    x = np.array([2.0, 1.5, 0.5, -1.0, 0.0], np.float32)
    ref = log_softmax(x)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=3.0, presence_penalty=1.0, logit_bias={4: 10.0},
                               logprobs=3))
    c = s.sample(x, history=[0, 1])
    assert c.token == 4
    assert c.logprob == pytest.approx(ref[4], abs=1e-6)
    assert [t for t, _ in c.top] == [0, 1, 2]
    assert [lp for _, lp in c.top] == pytest.approx(list(ref[[0, 1, 2]]), abs=1e-6)


def test_no_alternatives_unless_asked():
    c = Sampler(SamplingParams(seed=0)).sample(np.arange(10, dtype=np.float32))
    assert c.top == []
    assert c.logprob < 0


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_chosen_logprob_can_be_skipped_without_changing_the_choice(temperature):
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    full = Sampler(SamplingParams(temperature=temperature, seed=5))
    lean = Sampler(SamplingParams(temperature=temperature, seed=5, chosen_logprob=False))
    for _ in range(20):
        a, b = full.sample(x), lean.sample(x)
        assert a.token == b.token and np.isfinite(a.logprob) and np.isnan(b.logprob) and b.top == []
    # asking for alternatives brings the chosen token's logprob back
    c = Sampler(SamplingParams(temperature=0, logprobs=2, chosen_logprob=False)).sample(x)
    lsm = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum())
    assert c.token == int(np.argmax(x)) and c.logprob == pytest.approx(lsm[c.token], abs=1e-5) and len(c.top) == 2


def test_logprobs_more_than_vocab():
    x = np.array([1.0, 2.0, 0.0], np.float32)
    c = Sampler(SamplingParams(temperature=0, logprobs=10)).sample(x)
    assert [t for t, _ in c.top] == [1, 0, 2]


# --- distributions -------------------------------------------------------------------------

# cumulative .31 .52 .66 .775 .86 .922 .96 .987 .9965 1: no top_p or min_p below sits on a boundary
SMALL = np.log(np.array([0.31, 0.21, 0.14, 0.115, 0.085, 0.062, 0.038, 0.027, 0.0095, 0.0035]))


@pytest.mark.parametrize("params", [
    dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0),
    dict(top_k=3, top_p=1.0, min_p=0.0, temperature=1.0),
    dict(top_k=0, top_p=0.7, min_p=0.0, temperature=1.0),
    dict(top_k=0, top_p=1.0, min_p=0.25, temperature=1.0),
    dict(top_k=6, top_p=0.9, min_p=0.1, temperature=1.0),
    dict(top_k=5, top_p=1.0, min_p=0.0, temperature=0.5),
    dict(top_k=0, top_p=1.0, min_p=0.0, temperature=2.0),
    dict(top_k=0, top_p=1.0, min_p=0.1, temperature=0.5),      # min-p sees temperature-1 probs
    dict(top_k=0, top_p=0.9, min_p=0.0, temperature=1.5),      # top-p too
    dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8),   # the defaults
])
def test_small_vocab_distribution(params):
    logits = np.random.default_rng(0).permutation(SMALL).astype(np.float32)   # order must not matter
    counts = draw_counts(SamplingParams(seed=1234, **params), logits, 10000)
    assert_matches_distribution(counts, expected_probs(logits, **params))


def test_hand_computed_truncations():
    # p = .5 .3 .15 .05: top_p=.75 keeps {0, 1}; min_p=.25 keeps p >= .125 -> {0, 1, 2}
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert np.allclose(expected_probs(x, top_p=0.75), [0.625, 0.375, 0, 0])
    counts = draw_counts(SamplingParams(top_k=0, top_p=0.75, min_p=0, temperature=1, seed=3), x, 8000)
    assert_matches_distribution(counts, np.array([0.625, 0.375, 0, 0]))
    counts = draw_counts(SamplingParams(top_k=0, top_p=1, min_p=0.25, temperature=1, seed=4), x, 8000)
    assert_matches_distribution(counts, np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    counts = draw_counts(SamplingParams(top_k=1, temperature=1, seed=5), x, 200)
    assert counts[0] == 200


def test_top_k_on_large_vocab_matches_reference():
    rng = np.random.default_rng(11)
    logits = (rng.standard_normal(50000) * 2.5).astype(np.float32)
    logits[rng.choice(50000, 8, replace=False)] += 9.0   # a few likely tokens, far apart
    params = dict(top_k=40, top_p=1.0, min_p=0.0, temperature=1.0)
    counts = draw_counts(SamplingParams(seed=99, **params), logits, 10000)
    assert_matches_distribution(counts, expected_probs(logits, **params))


def test_top_p_whole_vocab_widens_past_tiny_tokens():
    # One token holds ~88% of the mass; 2999 tied tokens of relative weight e^-10 hold the rest.
    # top_p=0.95 must take the lowest-id tied tokens (ties -> lower id) until the mass is reached.
    logits = np.full(3000, 10.0, np.float32)
    logits[1234] = 20.0
    params = dict(top_k=0, top_p=0.95, min_p=0.0, temperature=1.0)
    probs = expected_probs(logits, **params)
    kept = np.flatnonzero(probs)
    assert 1234 in kept and 100 < kept.size < 3000
    counts = draw_counts(SamplingParams(seed=5, **params), logits, 10000)
    assert counts[probs == 0].sum() == 0
    assert counts[1234] / 10000 == pytest.approx(probs[1234], abs=5 * math.sqrt(probs[1234] * 0.2 / 10000))


@pytest.mark.parametrize("min_p,temperature", [(0.0, 1.0), (0.1, 0.7)])
def test_top_p_whole_vocab_on_a_flat_distribution(min_p, temperature):
    # top_p needs hundreds of tokens: the kept set must be exactly the reference prefix.
    logits = np.random.default_rng(8).standard_normal(3000).astype(np.float32)
    params = dict(top_k=0, top_p=0.5, min_p=min_p, temperature=temperature)
    probs = expected_probs(logits, **params)
    assert 200 < np.count_nonzero(probs) < 1500
    counts = draw_counts(SamplingParams(seed=17, **params), logits, 6000)
    assert_matches_distribution(counts, probs)
    # the least likely kept tokens do get drawn (the cut is not too early)
    kept = np.flatnonzero(probs)
    weakest = kept[np.argsort(probs[kept])[:100]]
    assert counts[weakest].sum() > 0


def test_whole_vocab_draw_across_blocks():
    # Vocab larger than the draw's block (2048) with a partial tail block; hot tokens sit on
    # block edges. Per-token and per-block frequencies must follow the full softmax.
    n = 5000
    logits = np.full(n, -4.0, np.float32)
    hot = [0, 1000, 2047, 2048, 3000, 4095, 4096, 4999]
    logits[hot] = np.log(np.array([1, 2, 3, 4, 5, 6, 7, 8], np.float32))
    logits[[5, 6, 7]] = -np.inf
    params = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)
    probs = expected_probs(logits, **params)
    counts = draw_counts(SamplingParams(seed=21, **params), logits, 20000)
    assert counts[[5, 6, 7]].sum() == 0
    freq = counts / counts.sum()
    for t in hot:
        assert abs(freq[t] - probs[t]) < 5 * math.sqrt(probs[t] * (1 - probs[t]) / 20000)
    for b in range(0, n, 2048):
        p = probs[b:b + 2048].sum()
        assert abs(freq[b:b + 2048].sum() - p) < 5 * math.sqrt(p * (1 - p) / 20000)


def test_zero_top_p_is_greedy_and_tiny_temperature_is_greedy():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    for params in (SamplingParams(top_k=0, top_p=0.0, seed=1), SamplingParams(temperature=1e-6, seed=1)):
        s = Sampler(params)
        assert {s.sample(x).token for _ in range(50)} == {int(np.argmax(x))}


# --- top-k selection ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 100, 5000, 70001, 262144])
@pytest.mark.parametrize("k", [1, 3, 40, 1000])
def test_top_k_indices_match_full_sort_including_ties(n, k):
    rng = np.random.default_rng(n + k)
    for x in (rng.standard_normal(n).astype(np.float32),
              rng.integers(0, 10, n).astype(np.float32),          # heavy ties
              np.sort(rng.standard_normal(n)).astype(np.float32)):  # sorted: stride sample sees the tail only
        want = np.lexsort((np.arange(n), -x))[:k]
        assert np.array_equal(top_k_indices(x, k), want)


# --- seeds ---------------------------------------------------------------------------------

def test_same_seed_same_sequence_different_seed_differs():
    x = np.random.default_rng(0).standard_normal(2000).astype(np.float32)

    def run(seed, **kw):
        s = Sampler(SamplingParams(seed=seed, temperature=1.5, **kw))
        return [s.sample(x).token for _ in range(300)]

    assert run(42) == run(42)
    assert run(42, top_k=0) == run(42, top_k=0)
    assert run(42) != run(43)
    assert len(set(run(None))) > 10


# --- penalties and bias ---------------------------------------------------------------------

def test_penalty_numerics():
    x = np.array([2.0, -1.0, 0.5, 3.0, 0.0], np.float32)
    s = Sampler(SamplingParams(repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25))
    got = s.adjust_logits(x, history=[0, 1, 1, 2, 0, 0, 4])
    # token 0: 2/2 - 3*.25 - .5; token 1: -1*2 - 2*.25 - .5; token 2: .5/2 - .25 - .5;
    # token 3: untouched; token 4 (logit 0 counts as non-positive): 0*2 - .25 - .5
    assert got == pytest.approx([-0.25, -3.0, -0.5, 3.0, -0.75])
    assert x[0] == 2.0   # input untouched


def test_penalty_window():
    x = np.zeros(4, np.float32) + 1.0
    hist = [0, 0, 0, 1, 2]
    last2 = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=2)).adjust_logits(x, hist)
    assert last2 == pytest.approx([1.0, 0.5, 0.5, 1.0])
    every = Sampler(SamplingParams(frequency_penalty=0.1, repeat_last_n=-1)).adjust_logits(x, hist)
    assert every == pytest.approx([0.7, 0.9, 0.9, 1.0])
    off = Sampler(SamplingParams(repeat_penalty=2.0, repeat_last_n=0)).adjust_logits(x, hist)
    assert off == pytest.approx(x)


def test_penalty_changes_greedy_choice():
    x = np.array([5.0, 4.9, 0.0], np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(x, history=[0]).token == 0
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=1.1)).sample(x, history=[0]).token == 1
    assert Sampler(SamplingParams(temperature=0, presence_penalty=0.2)).sample(x, history=[0]).token == 1


def test_logit_bias_forces_and_bans():
    x = np.array([3.0, 0.0, 2.9, 1.0], np.float32)
    assert Sampler(SamplingParams(temperature=0, logit_bias={1: 100.0})).sample(x).token == 1
    assert Sampler(SamplingParams(temperature=0, logit_bias={0: float("-inf")})).sample(x).token == 2
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1, min_p=0, seed=3, logit_bias={0: float("-inf")}))
    assert 0 not in {s.sample(x).token for _ in range(500)}


def test_numpy_scalars_of_small_types_sample_as_python_numbers():
    # top_k=np.int8(40) went into k * 128 in int8 (a raw OverflowError); 1 / np.float16(1e-5) is inf
    x = np.random.default_rng(1).standard_normal(49152).astype(np.float32)
    for t in (np.int8, np.int16, np.uint8):
        small = dict(top_k=t(40), logprobs=t(5), repeat_last_n=t(3), seed=t(7), repeat_penalty=np.float16(1.1),
                     temperature=np.float16(0.7), top_p=np.float16(0.9), min_p=np.float16(0.01))
        plain = {k: int(v) if isinstance(v, np.integer) else float(v) for k, v in small.items()}
        a = Sampler(SamplingParams(**small)).sample(x, [1, 2, 3])
        b = Sampler(SamplingParams(**plain)).sample(x, [1, 2, 3])
        assert (a.token, a.top) == (b.token, b.top)


TRUNCATIONS = [dict(), dict(top_k=0, top_p=0.9, min_p=0.0), dict(top_k=0, top_p=1.0, min_p=0.0)]


@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=["default", "top_p", "whole_vocab"])
@pytest.mark.parametrize("push", ["bias", "repeat_penalty"])
def test_logits_pushed_past_the_float_range_tie(trunc, push):
    # a finite bias of 1e39 is inf in float32 (and so is a positive logit / 1e-300): inf - inf made the
    # weights NaN, which raised an IndexError under top_p and otherwise always drew the first such token
    x = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    x[[3, 4]] = np.abs(x[[3, 4]]) + 0.1
    kw = dict(logit_bias={3: 1e39, 4: 1e39}) if push == "bias" else dict(repeat_penalty=1e-300, repeat_last_n=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = [Sampler(SamplingParams(temperature=1.0, seed=s, **trunc, **kw)).sample(x, [3, 4]).token
                 for s in range(400)]
    assert set(drawn) == {3, 4}
    assert abs(drawn.count(3) - 200) < 5 * math.sqrt(100)    # a fair coin: 5 standard errors


@pytest.mark.parametrize("trunc", TRUNCATIONS, ids=["default", "top_p", "whole_vocab"])
def test_a_temperature_too_small_for_float32_is_greedy_without_warnings(trunc):
    x = np.random.default_rng(5).standard_normal(3000).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # 1/1e-300 was inf in float32: 0 * inf overflowed to NaN
        drawn = {Sampler(SamplingParams(temperature=1e-300, seed=s, **trunc)).sample(x).token for s in range(50)}
    assert drawn == {int(np.argmax(x))}


@pytest.mark.parametrize("ban", ["mask", "bias"])
def test_a_huge_temperature_is_uniform_over_the_allowed_tokens(ban):
    # 1/1e300 was 0 in float32 and -inf * 0 NaN: with any banned token every draw was the last id
    x = np.arange(10, dtype=np.float32)
    banned = np.arange(10) % 2 == 0
    kw = dict(logit_bias={i: -math.inf for i in range(0, 10, 2)}) if ban == "bias" else {}
    s = Sampler(SamplingParams(temperature=1e300, top_k=0, top_p=1.0, min_p=0.0, seed=9, **kw))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = np.bincount([s.sample(x, banned=banned if ban == "mask" else None).token for _ in range(2000)],
                            minlength=10)
    assert drawn[banned].sum() == 0
    assert np.all(np.abs(drawn[~banned] - 400) < 5 * math.sqrt(2000 * 0.2 * 0.8))


def test_bias_and_history_out_of_vocab_raise():
    x = np.zeros(10, np.float32)
    with pytest.raises(SamplingError, match="logit_bias"):
        Sampler(SamplingParams(logit_bias={10: 1.0})).sample(x)
    with pytest.raises(SamplingError, match="history"):
        Sampler(SamplingParams(repeat_penalty=1.1)).sample(x, history=[1, 10])
    with pytest.raises(SamplingError, match="history"):
        Sampler(SamplingParams(repeat_penalty=1.1)).sample(x, history=[-1])
    with pytest.raises(SamplingError, match="-inf"):
        Sampler(SamplingParams(logit_bias={i: float("-inf") for i in range(10)})).sample(x)


# --- stop strings ---------------------------------------------------------------------------

def feed_all(matcher, pieces):
    out, stopped = [], False
    for p in pieces:
        emit, stopped = matcher.feed(p)
        out.append(emit)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


def test_stop_split_across_pieces():
    m = StopMatcher(["</s>"])
    assert m.feed("Hello <") == ("Hello ", False)
    assert m.feed("/") == ("", False)
    assert m.feed("s> and more") == ("", True)
    assert m.matched == "</s>" and m.stopped
    assert m.feed("ignored") == ("", True)
    assert m.flush() == ""


def test_held_text_is_released_when_it_is_not_a_stop():
    m = StopMatcher(["</s>"])
    assert m.feed("a <") == ("a ", False)
    assert m.feed("b") == ("<b", False)
    assert m.feed("c</") == ("c", False)
    assert m.flush() == "</"
    assert not m.stopped


def test_stop_at_the_very_start():
    assert StopMatcher(["STOP"]).feed("STOP here") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.feed("ST") == ("", False)
    assert m.feed("OP") == ("", True)


def test_overlapping_prefixes():
    m = StopMatcher(["abcd", "bce"])
    assert m.feed("xab") == ("x", False)
    assert m.feed("c") == ("", False)        # "abc" may become abcd, "bc" may become bce
    assert m.feed("e") == ("a", True)
    assert m.matched == "bce"
    # a stop that overlaps itself
    assert feed_all(StopMatcher(["aab"]), ["a", "a", "a", "b"]) == ("a", True)


def test_first_completed_stop_wins_regardless_of_splits():
    assert feed_all(StopMatcher(["world", "lo"]), ["hello world"]) == ("hel", True)
    # "bc" completes before "abcd" could: the same answer however the text is split
    assert feed_all(StopMatcher(["abcd", "bc"]), ["abcd"]) == ("a", True)
    assert feed_all(StopMatcher(["abcd", "bc"]), ["ab", "cd"]) == ("a", True)


def test_no_stop_passes_everything_through():
    assert feed_all(StopMatcher(["</s>"]), ["no ", "stop ", "here <", "/"]) == ("no stop here </", False)
    assert feed_all(StopMatcher([]), ["a", "b"]) == ("ab", False)


@pytest.mark.parametrize("stops", [[""], "stop", [None], None, ["ok", 3]])
def test_bad_stops_raise(stops):
    with pytest.raises(SamplingError):
        StopMatcher(stops)


def test_stop_matcher_random_splits_match_reference():
    rng = random.Random(5)
    alphabet = "ab<>/"
    for _ in range(400):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        # reference: the occurrence that ends first (ties: starts first)
        ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
        want = (text[:min(ends)[1]], True) if ends else (text, False)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        got = feed_all(StopMatcher(stops), pieces)
        assert got == want, (stops, text, pieces)
        # never emits any part of a stop string that later completes
        m, emitted = StopMatcher(stops), ""
        for p in pieces:
            e, done = m.feed(p)
            emitted += e
            assert want[0].startswith(emitted)
            if done:
                break

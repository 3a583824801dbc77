"""Speculative decoding changes the speed, never the output.

Greedy: the same tokens as plain decoding, on every ISA path, in the exact (f32 activations) and
the default (8-bit activations) mode, with float and quantized weights: verification rows must equal
lone decode rows bit for bit. Sampling: with the same seed the same tokens (each verified position
goes through the plain sampler, which draws once per emitted token), and over many seeds the same
distribution as plain sampling (a two-sample chi-square test). Penalties, logit bias, stop strings and
grammars hold. The drafters' own logic (n-gram lookup, draft length, vocabulary check) is tested
directly. Nothing here asserts a speed.
"""
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError
from llambda.speculative import (DraftLength, PromptLookup, VocabularyMismatchError, accepted_count,
                                 check_vocabularies)

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
NATIVE = "native" in available_backends()
# a prompt that repeats itself, so prompt lookup finds matches
PROMPT = [5, 9, 13, 5, 9, 13, 5, 9, 17, 3, 5, 9, 13, 5]


def isas():
    if not NATIVE:
        return []
    from llambda import _native
    return list(_native.isa_available())


@pytest.fixture
def isa_switch():
    """Run on a chosen ISA path; restored afterwards."""
    from llambda import _native
    before = _native.isa()
    yield _native.set_isa
    _native.set_isa(before)


def tiny_pair(activations="q8", quantize=None, draft="llama"):
    m = llambda.load(TINY / "llama", n_ctx=256, activations=activations, quantize=quantize, draft=TINY / draft)
    m.drafter.p_min = 0.0       # draft the full length even from a random model's flat distributions
    return m


# ---------------------------------------------------------------- greedy, every path


@pytest.mark.skipif(not NATIVE, reason="the native C core is not built")
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("activations", ["q8", "f32"], ids=["fast", "exact"])
@pytest.mark.parametrize("quantize", [None, "q8_0", "q4_0"], ids=["f32w", "q8_0", "q4_0"])
def test_greedy_output_is_plain_decodings_on_every_path(isa_switch, isa, activations, quantize):
    isa_switch(isa)
    with tiny_pair(activations, quantize) as m:
        kw = dict(max_tokens=48, temperature=0, ignore_eos=True)
        plain = list(m.generate(PROMPT, speculative=None, **kw))
        assert len(plain) == 48
        for mode in ("draft", "lookup"):
            for draft_max in (1, 4, 15):
                assert list(m.generate(PROMPT, speculative=mode, draft_max=draft_max, **kw)) == plain, (mode, draft_max)
                if mode == "draft":    # the same model drafting greedily: every draft is the target's choice
                    assert m.spec_stats.accepted == m.spec_stats.drafted > 0
    # a different draft model: most drafts are rejected, the output is still the target's
    with tiny_pair(activations, quantize, draft="qwen2") as m:
        assert list(m.generate(PROMPT, speculative="draft", **kw)) == plain
        assert m.spec_stats.drafted > m.spec_stats.accepted


def test_numpy_backend_speculates_too():
    with llambda.load(TINY / "llama", backend="numpy", n_ctx=128, draft=TINY / "llama") as m:
        m.drafter.p_min = 0.0
        kw = dict(max_tokens=20, temperature=0, ignore_eos=True)
        plain = list(m.generate(PROMPT, speculative=None, **kw))
        assert list(m.generate(PROMPT, **kw)) == plain          # "auto": the loaded draft model
        assert m.spec_stats.accepted > 0


# ---------------------------------------------------------------- sampling


SAMPLING = [dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
            dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repeat_penalty=1.3, presence_penalty=0.5,
                 frequency_penalty=0.2, logit_bias={232: 3.0, 383: -math.inf})]


@pytest.mark.parametrize("sampling", SAMPLING, ids=["plain", "penalties-bias-truncation"])
def test_same_seed_same_tokens(sampling):
    with tiny_pair() as m:
        for seed in range(6):
            kw = dict(max_tokens=32, ignore_eos=True, seed=seed, **sampling)
            plain = list(m.generate(PROMPT, speculative=None, **kw))
            assert list(m.generate(PROMPT, speculative="draft", draft_max=6, **kw)) == plain
            assert list(m.generate(PROMPT, speculative="lookup", **kw)) == plain
            if "logit_bias" in sampling:
                assert 383 not in plain
        assert m.spec_stats.drafted > 0


def two_sample_chi_square(a: Counter, b: Counter, min_count: int = 5) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of 'both samples come from one distribution';
    rare categories pooled into one."""
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= min_count]
    rest = (sum(a.values()) - sum(a[k] for k in keys), sum(b.values()) - sum(b[k] for k in keys))
    rows = [(a[k], b[k]) for k in keys] + ([rest] if sum(rest) else [])
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for x, y in rows:
        t = x + y
        for obs, n in ((x, na), (y, nb)):
            e = t * n / (na + nb)
            stat += (obs - e) ** 2 / e
    return stat, len(rows) - 1


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (z of the normal), Wilson-Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_distribution_is_plain_samplings():
    """Different seeds for the two samples: the test sees distributions, not the per-seed identity."""
    n = 300
    with tiny_pair() as m:
        kw = dict(max_tokens=4, ignore_eos=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        plain = [tuple(m.generate(PROMPT, speculative=None, seed=s, **kw)) for s in range(n)]
        spec = [tuple(m.generate(PROMPT, speculative="draft", seed=n + s, **kw)) for s in range(n)]
        assert m.spec_stats.drafted > 0
        greedy = tuple(m.generate(PROMPT, speculative=None, max_tokens=4, ignore_eos=True, temperature=0))
    for pos in range(4):
        stat, df = two_sample_chi_square(Counter(t[pos] for t in plain), Counter(t[pos] for t in spec))
        assert df >= 1
        assert stat < chi_square_critical(df), (pos, stat, df)
    # and the test can tell: accepting every (greedy) draft, a wrong rule, would give the greedy text
    stat, df = two_sample_chi_square(Counter(t[1] for t in plain), Counter(greedy[1] for _ in range(n)))
    assert stat > chi_square_critical(df)


# ---------------------------------------------------------------- the drafters


def test_prompt_lookup_drafts_what_followed_the_latest_match():
    pl = PromptLookup(ngram_max=3)
    toks = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert pl.draft(toks, 2) == [7, 8]            # the latest occurrence of [1, 2, 3] wins
    toks += [7]
    assert pl.draft(toks, 5) == [8, 1, 2, 3, 7]   # incremental: the new token is indexed
    assert pl.draft([4, 6, 4], 3) == [6, 4]       # another sequence: reindexed, the 1-gram [4] matched
    assert pl.draft([1, 2], 3) == []              # no earlier match


def test_draft_length_follows_acceptance():
    d = DraftLength(8, start=4)
    d.update(4, 4)
    assert d.k == 5
    d.update(5, 1)
    assert d.k == 2
    for _ in range(20):
        d.update(d.k, d.k)
    assert d.k == 8
    d.update(8, 0)
    assert d.k == 1


def test_accepted_count_stops_at_the_first_difference():
    ev = [SimpleNamespace(token=t) for t in (4, 5, 6)]
    assert accepted_count([4, 5, 7], ev) == 2
    assert accepted_count([9, 5], ev) == 0


def fake_tokenizer(tokens, eot=(0,)):
    return SimpleNamespace(vocab=SimpleNamespace(tokens=tokens), eot_ids=list(eot))


def test_vocabulary_check():
    a = fake_tokenizer(["<eos>", "a", "b", "c"])
    check_vocabularies(a, fake_tokenizer(["<eos>", "a", "b", "c"]), 4, 4)
    check_vocabularies(a, a, 4, 4 + 64)                    # padded embedding rows
    with pytest.raises(VocabularyMismatchError, match="token 2"):
        check_vocabularies(a, fake_tokenizer(["<eos>", "a", "x", "c"]), 4, 4)
    with pytest.raises(VocabularyMismatchError):
        check_vocabularies(a, a, 4, 4000)
    with pytest.raises(VocabularyMismatchError, match="ends text"):
        check_vocabularies(a, fake_tokenizer(["<eos>", "a", "b", "c"], eot=(3,)), 4, 4)
    with pytest.raises(VocabularyMismatchError, match="no tokenizer"):
        check_vocabularies(None, a, 4, 4)


def test_bad_requests_are_typed_errors():
    with llambda.load(TINY / "llama", n_ctx=64) as m:
        with pytest.raises(InvalidInputError, match="draft model"):
            m.stream(PROMPT, speculative="draft")
        with pytest.raises(InvalidInputError, match="speculative"):
            m.stream(PROMPT, speculative="medusa")
        for bad in (0, 1000, 2.5, True):
            with pytest.raises(InvalidInputError, match="draft_max"):
                m.stream(PROMPT, speculative="lookup", draft_max=bad)


def test_context_end_and_max_tokens_hold():
    with tiny_pair() as m:
        n = m.n_ctx - len(PROMPT)
        plain = list(m.stream(PROMPT, speculative=None, max_tokens=None, temperature=0, ignore_eos=True))
        spec = list(m.stream(PROMPT, speculative="draft", max_tokens=None, temperature=0, ignore_eos=True))
        assert [e.token for e in spec] == [e.token for e in plain]
        assert sum(e.token >= 0 for e in spec) == n and spec[-1].context_full
        for mt in (1, 2, 7):
            assert len(list(m.generate(PROMPT, speculative="draft", max_tokens=mt, temperature=0, ignore_eos=True))) == mt


def test_interleaved_generators_keep_their_own_text():
    """A speculative generator and a plain one on the same slot, consumed alternately."""
    with tiny_pair() as m:
        kw = dict(max_tokens=24, temperature=0, ignore_eos=True)
        a_alone = list(m.generate(PROMPT, speculative="draft", **kw))
        b_alone = list(m.generate(PROMPT[::-1], speculative=None, **kw))
        ga, gb = m.generate(PROMPT, speculative="draft", **kw), m.generate(PROMPT[::-1], speculative=None, **kw)
        a, b = [], []
        for x, y in zip(ga, gb):
            a.append(x)
            b.append(y)
        assert a == a_alone and b == b_alone


# ---------------------------------------------------------------- a real model: text features


def test_real_model_stop_strings_grammar_and_vocabularies(smollm2_gguf, qwen05_gguf):
    prompt = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
              "Write both functions again, unchanged:\n")
    with llambda.load(smollm2_gguf, n_ctx=512, draft=smollm2_gguf) as m:
        cases = [dict(temperature=0),
                 dict(temperature=0, stop=["return a - b"]),
                 dict(temperature=0.8, seed=3, logprobs=2),
                 dict(temperature=0, regex=r"def [a-z]+\(a, b\):\n    return a [+-] b\n"),
                 dict(temperature=0.9, seed=11, json_schema={"type": "object", "properties": {
                     "name": {"type": "string"}}, "required": ["name"]})]
        for kw in cases:
            plain = [(e.token, e.text, e.logprob) for e in m.stream(prompt, speculative=None, max_tokens=60, **kw)]
            for mode in ("lookup", "draft"):
                got = [(e.token, e.text, e.logprob) for e in m.stream(prompt, speculative=mode, max_tokens=60, **kw)]
                assert got == plain, (kw, mode)
        assert "return a - b" not in m.complete(prompt, speculative="lookup", max_tokens=60, temperature=0,
                                                 stop=["return a - b"])
        assert m.spec_stats.accepted > 0
    with pytest.raises(VocabularyMismatchError):
        llambda.load(smollm2_gguf, n_ctx=256, draft=qwen05_gguf)


@pytest.mark.skipif(not NATIVE, reason="the native C core is not built")
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("activations", ["q8", "f32"], ids=["fast", "exact"])
def test_verification_rows_are_lone_decode_rows_bit_for_bit(isa_switch, isa, activations):
    """The logits of each row of a verification forward equal plain decode's, one token at a time."""
    isa_switch(isa)
    with llambda.load(TINY / "llama", n_ctx=128, activations=activations) as m:
        t, tail = m.transformer, [7, 8, 9, 10, 11]
        lone = []
        for i in range(len(tail) + 1):      # plain decoding: the prompt, then one token per step
            lone.append(m._prefill_reusing(PROMPT + tail[:i]).copy())
        m._sync(PROMPT[:-1])
        n = len(tail) + 1
        with m.rows_invariant():     # as speculative.stream verifies
            rows = t.forward(np.asarray(PROMPT[-1:] + tail, np.int32), np.zeros(n, np.int32),
                             np.arange(len(PROMPT) - 1, len(PROMPT) - 1 + n, dtype=np.int32), np.arange(n))
        for i in range(n):
            assert np.array_equal(rows[i], lone[i]), i


@pytest.mark.skipif(not NATIVE, reason="the native C core is not built")
def test_draft_threads_change_nothing_but_the_draft_forwards():
    """The draft's forwards are capped at draft_threads (tests/test_model_threads.py watches the cap); the
    process's pool is not resized around them (that changed the thread count of every other model's calls)."""
    from llambda import _native
    before = _native.threads()
    kw = dict(max_tokens=24, temperature=0, ignore_eos=True)
    with llambda.load(TINY / "llama", n_ctx=128, threads=2, draft=TINY / "llama", draft_threads=1) as m:
        m.drafter.p_min = 0.0
        pool = _native.threads()    # 2, or more where an earlier test of this process grew the pool
        seen = []
        inner = m.drafter._draft
        m.drafter._draft = lambda *a: (seen.append(_native.threads()), inner(*a))[1]
        assert list(m.generate(PROMPT, **kw)) == list(m.generate(PROMPT, speculative=None, **kw))
        assert seen and set(seen) == {pool} and _native.threads() == pool and pool >= 2
    _native.set_threads(before)
    with pytest.raises(InvalidInputError, match="draft_threads"):
        llambda.load(TINY / "llama", n_ctx=64, draft=TINY / "llama", draft_threads=0)

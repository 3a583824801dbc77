"""Each model's computations run on its own thread count, though the C core's pool is one per process.

The pool's test hook `pool_widest()` says, per calling thread, the most threads a pool call was given
since it was last read: a model loaded with threads=1 gives its calls no more than one thread (0: none
reached the pool), one loaded with threads=2 gives them two, whichever was loaded last and also while
both run at once from two Python threads; and their results are the bits each computes alone.
"""
import threading
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import InvalidInputError

native = pytest.importorskip("llambda._native", reason="the C core is not built")

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
GREEDY = dict(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(autouse=True)
def restore_pool():
    before = native.threads()
    yield
    native.cap_threads(0)
    native.set_threads(before)


def prompt(m, n):
    return [(7 * i + 3) % m.config.vocab_size for i in range(n)]


def run(m) -> tuple:
    """What the model computes (a prefill's logits, greedy text, embeddings) and the widest pool call it made."""
    native.pool_widest()
    out = m.logits(prompt(m, 100)), list(m.generate(prompt(m, 9), **GREEDY)), m.embed([prompt(m, 40)])
    return out, native.pool_widest()


def same(x, y) -> bool:
    return np.array_equal(x[0], y[0]) and x[1] == y[1] and np.array_equal(x[2], y[2])


def alone(threads: int) -> tuple:
    native.set_threads(threads)
    with llambda.load(TINY, n_ctx=128, threads=threads) as m:
        return run(m)[0]


def test_cap_threads_caps_this_threads_calls_only():
    native.set_threads(2)
    native.pool_widest()                        # reading resets it: earlier tests' calls ran on this thread
    assert native.cap_threads(1) == 0
    native._pool_probe(5, items=16)
    assert native.pool_widest() == 0            # one thread allowed: the calls never reached the pool
    got = []
    t = threading.Thread(target=lambda: (native._pool_probe(5, items=16), got.append(native.pool_widest())))
    t.start()
    t.join()
    assert got == [2]                           # another thread's calls are not capped
    assert native.cap_threads(3) == 1           # above the pool's size: no cap until the pool grows
    native._pool_probe(5, items=16)
    assert native.pool_widest() == 2
    for bad, error in ((-1, ValueError), (257, ValueError), (True, TypeError), ("2", TypeError), (2.0, TypeError)):
        with pytest.raises(error, match="cap_threads"):
            native.cap_threads(bad)
    assert native.cap_threads(0) == 3           # a refused value changed nothing


@pytest.mark.parametrize("order", [(1, 2), (2, 1)])
def test_two_models_each_use_their_own_count(order):
    want = {1: alone(1), 2: alone(2)}
    native.set_threads(1)
    first = llambda.load(TINY, n_ctx=128, threads=order[0])
    with first, llambda.load(TINY, n_ctx=128, threads=order[1]) as second:
        assert native.threads() == 2            # grown for the model that asked for 2, never shrunk
        for m in (first, second, first):
            got, widest = run(m)
            assert same(got, want[m.backend.threads])
            assert widest == (0 if m.backend.threads == 1 else 2)
    assert native.cap_threads(0) == 0           # each forward put the caller's cap back


def test_two_models_at_once_from_two_threads():
    want = {1: alone(1), 2: alone(2)}
    with llambda.load(TINY, n_ctx=128, threads=1) as one, llambda.load(TINY, n_ctx=128, threads=2) as two:
        results, start = {}, threading.Barrier(2)

        def work(m):
            start.wait()
            results[m.backend.threads] = [run(m) for _ in range(4)]

        threads = [threading.Thread(target=work, args=(m,)) for m in (one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        for n, widest in ((1, 0), (2, 2)):
            assert len(results[n]) == 4
            for got, w in results[n]:
                assert same(got, want[n]) and w == widest


def test_the_thread_tuner_stays_within_the_models_count():
    native.set_threads(3)
    with llambda.load(TINY, n_ctx=128, threads=2) as m:
        native.pool_widest()
        for _ in range(3):
            list(m.generate(prompt(m, 9), max_tokens=40, temperature=0, ignore_eos=True))
        assert native.pool_widest() == 2
        assert m.backend.replays and all(n == 2 and 1 <= on <= 2 for n, on in m.backend.replays)


@pytest.mark.parametrize("target, draft", [(2, 1), (1, 2)])
def test_the_draft_model_runs_on_draft_threads(target, draft):
    native.set_threads(1)
    with llambda.load(TINY, n_ctx=128, threads=target, draft=TINY, draft_threads=draft) as m:
        assert native.threads() == 2
        m.drafter.p_min = 0.0
        seen, inner = [], m.drafter._draft

        def drafting(*a):
            native.pool_widest()
            try:
                return inner(*a)
            finally:
                seen.append(native.pool_widest())
        m.drafter._draft = drafting
        assert list(m.generate(prompt(m, 9), **GREEDY)) == list(m.generate(prompt(m, 9), speculative=None, **GREEDY))
        assert seen and set(seen) == {0 if draft == 1 else 2}
        assert m.draft.backend.call_threads() == target      # the draft's own calls keep its count
        native.pool_widest()
        list(m.draft.generate(prompt(m, 9), **GREEDY))
        assert native.pool_widest() == (0 if target == 1 else 2)


def test_draft_threads_beyond_the_pools_maximum_are_refused():
    with pytest.raises(InvalidInputError, match="draft_threads"):
        llambda.load(TINY, n_ctx=64, draft=TINY, draft_threads=10**6)


def test_llambda_bench_runs_the_model_on_each_count_it_measures():
    from llambda.backends.native import default_threads
    from llambda.tools.bench import OurEngine
    e = OurEngine(TINY, n_ctx=128)      # loaded with the default count
    try:
        for t in (1, default_threads() + 1, 2):
            e.set_threads(t)
            _, widest = run(e.model)
            assert native.threads() == t and widest == (0 if t == 1 else t)
    finally:
        e.model.close()

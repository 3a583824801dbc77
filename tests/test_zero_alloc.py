"""The decode loop allocates nothing: native counters and tracemalloc across 100 steps."""
import tracemalloc

import numpy as np
import pytest

import llambda
from llambda import engine
from llambda.backends import available_backends

pytestmark = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")


def test_hundred_decode_steps_allocate_nothing(smollm2_gguf):
    from llambda import _native

    with llambda.load(smollm2_gguf, backend="native", n_ctx=256) as m:
        tr = m.transformer
        engine.prefill(tr, 0, [504, 3575, 282, 4649, 314], 0)
        tok = 1
        for pos in range(5, 10):     # warm up: records the decode plan, sizes scratch
            tok = int(np.argmax(engine.decode(tr, [0], [tok], [pos])[0]))
        count0, bytes0 = _native.alloc_stats()
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        for pos in range(10, 110):
            tok = int(np.argmax(engine.decode(tr, [0], [tok], [pos])[0]))
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        count1, bytes1 = _native.alloc_stats()
    assert (count1, bytes1) == (count0, bytes0), "the C core allocated during decode"
    grown = sum(s.size_diff for s in snap1.compare_to(snap0, "filename") if s.size_diff > 0)
    assert grown < 64 * 1024, f"Python heap grew by {grown} bytes over 100 decode steps"


def test_memory_budget_is_reported(smollm2_gguf):
    with llambda.load(smollm2_gguf, backend="native", n_ctx=256) as m:
        mem = m.memory_report()
    assert mem["weights"] > 50e6 and mem["kv_cache"] == 30 * 2 * 256 * 3 * 64 * 4 and mem["activations"] > 0


def test_one_and_two_threads_give_the_same_greedy_text(smollm2_gguf):
    texts = []
    for threads in (1, 2):
        with llambda.load(smollm2_gguf, backend="native", threads=threads, n_ctx=128) as m:
            texts.append(m.complete("def fibonacci(n):", max_tokens=24, temperature=0))
    assert texts[0] == texts[1]

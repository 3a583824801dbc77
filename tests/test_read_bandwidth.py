"""The C core's read-bandwidth probe (`_native.read_bandwidth`, csrc/core/readbw.c): the bound
`llambda bench` compares decode's GB/s with. Sane figures on every ISA path and thread count, and
ValueError/TypeError (never a crash) on arguments out of range. Never asserts a speed."""
import math

import pytest

_native = pytest.importorskip("llambda._native")

MB = 1 << 20


@pytest.mark.parametrize("threads", [1, 2])
def test_probe_figures_are_sane(isa, threads2, threads):
    for nbytes in (MB, 3 * MB + 4096 + 100):          # the smallest buffer; one not a multiple of a chunk or 4 KB
        gbs = _native.read_bandwidth(nbytes, threads, 3)
        assert len(gbs) == 3
        assert all(isinstance(g, float) and math.isfinite(g) and 0.01 < g < 100_000 for g in gbs), gbs


def test_probe_allocates_nothing_it_keeps(threads2):
    before = _native.alloc_stats()
    _native.read_bandwidth(4 * MB, 2, 2)              # its buffer is mapped and unmapped by the probe itself
    assert _native.alloc_stats() == before


@pytest.mark.parametrize("args, exc", [
    ((MB - 1, 1, 1), ValueError),                     # below the smallest buffer
    ((-5, 1, 1), ValueError),
    (((1 << 40) + 1, 1, 1), ValueError),              # above the largest
    ((1 << 40, 1, 1), ValueError),                    # more than half this machine's memory (the probe writes it)
    ((MB, 0, 1), ValueError),                         # no thread
    ((MB, 3, 1), ValueError),                         # more threads than the pool has
    ((MB, 1, 0), ValueError),                         # no repetition
    ((MB, 1, 1001), ValueError),
    ((MB, True, 1), TypeError),                       # a flag where a count belongs
    ((float(MB), 1, 1), TypeError),
    (("1", 1, 1), TypeError),
    ((MB, 1), TypeError),                             # wrong arity
])
def test_probe_refuses_bad_arguments(threads2, args, exc):
    with pytest.raises(exc):
        _native.read_bandwidth(*args)


def test_bench_uses_the_native_probe(threads2):
    from llambda.tools import bench
    assert bench.read_bandwidth(MB, 2, reps=2) > 0    # resizes nothing: the pool has 2 threads
    assert _native.threads() == 2
    assert bench.numpy_read_bandwidth(MB, 1, reps=1) > 0

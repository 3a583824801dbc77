"""The packed-weight arena: page-aligned, zero-filled, non-overlapping slices in load order."""
import numpy as np
import pytest

from llambda.backends.weight_arena import ALIGN, HUGE, WeightArena


def test_slices_are_aligned_disjoint_and_in_order():
    arena = WeightArena(chunk=4 * HUGE)
    sizes = [1, 4095, 4096, 4097, 100_000, 3 * HUGE, 12345]
    arrays = [arena.alloc(n) for n in sizes]
    for a, n in zip(arrays, sizes):
        assert a.dtype == np.uint8 and a.shape == (n,)
        assert a.ctypes.data % ALIGN == 0
        assert not a.any()                     # fresh mappings are zero-filled
        a[:] = 7                               # writable; must not clobber a neighbour
    assert all((a == 7).all() for a in arrays)
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    # small matrices follow each other in load order in one mapping
    addr = [a.ctypes.data for a in arrays[:5]]
    assert addr == sorted(addr) and addr[-1] - addr[0] < 4 * HUGE


def test_big_matrix_gets_its_own_mapping_and_keeps_the_tail():
    arena = WeightArena(chunk=HUGE)
    a = arena.alloc(1000)
    big = arena.alloc(5 * HUGE)                # larger than a chunk
    b = arena.alloc(1000)                      # still from the first mapping's tail
    assert big.nbytes == 5 * HUGE and big.ctypes.data % HUGE == 0
    assert b.ctypes.data - a.ctypes.data == ALIGN
    assert len(arena._maps) == 2


def test_mappings_start_on_huge_page_boundaries():
    arena = WeightArena(chunk=2 * HUGE)
    first = arena.alloc(10)
    assert first.ctypes.data % HUGE == 0
    assert arena.mapped_bytes >= 3 * HUGE


def test_huge_page_bytes_counts_only_the_arena():
    arena = WeightArena(chunk=4 * HUGE)
    assert arena.huge_page_bytes() in (0, None)            # nothing mapped yet
    other = np.ones(16 * HUGE // 8)                         # another mapping of the process, touched
    a = arena.alloc(3 * HUGE)
    a[:] = 1                                                # faulted in (in 2 MB pages where THP allows)
    got = arena.huge_page_bytes()
    if got is None:
        pytest.skip("no /proc/self/smaps")
    assert 0 <= got <= arena.mapped_bytes and got % HUGE == 0
    assert other.sum() > 0

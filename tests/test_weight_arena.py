"""The packed-weight arena: page-aligned, zero-filled, non-overlapping slices in load order."""
import os

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


def test_each_mapping_is_used_up_to_its_last_allocation():
    """How far a mapping is used (what collapse covers) follows its own allocations, whichever mapping
    the current tail is in and however the mappings lie in the address space."""
    arena = WeightArena(chunk=HUGE)
    a = arena.alloc(1000)
    big = arena.alloc(5 * HUGE + 1)            # a mapping of its own
    b = arena.alloc(1000)                      # the first mapping's tail again
    c = arena.alloc(HUGE - ALIGN)              # does not fit that tail: a new mapping becomes the tail
    arena.alloc(0)                             # takes a page of its own, as any allocation
    assert [m.lo <= x.ctypes.data < m.hi for m, x in zip(arena._maps, (a, big, c))] == [True] * 3

    def page_end(x):
        return -(-(x.ctypes.data + x.nbytes) // ALIGN) * ALIGN
    assert [m.lo + m.used for m in arena._maps] == [page_end(b), page_end(big), page_end(c) + ALIGN]
    arena.reserve(2 * 64 << 20)                # a fresh reservation: nothing allocated in it yet
    assert arena._maps[-1].used == 0 and len(arena._free) >= 2 * 64 << 20
    e = arena.alloc(10)
    assert arena._maps[-1].lo + arena._maps[-1].used == page_end(e)
    arena.end_reserve()


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


def _resident(a: np.ndarray) -> int:
    """Bytes of `a`'s pages resident now, by mincore(2) over exactly its range (smaps' Rss is per mapping, and
    the kernel merges neighbouring anonymous mappings, so a full test run counted other arrays' pages too)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    lo = a.ctypes.data // page * page
    n = -(-(a.ctypes.data + a.nbytes - lo) // page)
    vec = (ctypes.c_ubyte * n)()
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) * page


@pytest.mark.parametrize("prefault", ["1", "0"])
def test_reservation_carves_in_order_and_prefaults_ahead(monkeypatch, prefault):
    monkeypatch.setenv("LLAMBDA_ARENA_PREFAULT", prefault)
    arena = WeightArena(chunk=HUGE)
    arena.reserve(40 * HUGE)
    sizes = [4097, 3 * HUGE + 5, 1, 7 * HUGE]
    arrays = [arena.alloc(n) for n in sizes]
    addr = [a.ctypes.data for a in arrays]
    assert addr == sorted(addr) and addr[-1] + sizes[-1] - addr[0] < 12 * HUGE      # one mapping, in order
    assert len(arena._maps) == 1
    for a, n in zip(arrays, sizes):
        assert a.shape == (n,) and a.ctypes.data % ALIGN == 0 and not a.any()       # zero-filled, prefaulted or not
        a[:] = 3
    assert (arena._prefaulter is not None) == (prefault == "1")
    arena.end_reserve()
    arena.end_reserve()                                                             # idempotent
    assert arena._prefaulter is None
    assert all((a == 3).all() for a in arrays)          # the trim behind the last allocation spared them
    more = arena.alloc(HUGE)                            # after the load: the reservation's tail, zero-filled
    assert not more.any() and more.ctypes.data > addr[-1]


def test_a_reservation_allocated_to_its_last_byte_keeps_its_pages(monkeypatch):
    """end_reserve gives back only what was faulted past the last allocation: with none left (the
    reservation carved to its end) it gives back nothing, whatever an empty view's address says."""
    from llambda.backends import weight_arena
    if weight_arena._C is None or not hasattr(weight_arena._C, "populate_write"):
        pytest.skip("the C core is not built")
    monkeypatch.setenv("LLAMBDA_ARENA_PREFAULT", "1")
    monkeypatch.setattr(weight_arena, "RESERVE_MIN", 0)
    arena = WeightArena(chunk=HUGE)
    arena.reserve(4 * HUGE)
    a = arena.alloc(len(arena._free))
    a[:] = 3
    import time
    for _ in range(200):
        if arena._prefaulter.done > 0:
            break
        time.sleep(0.01)
    arena.end_reserve()
    assert len(arena._free) == 0 and (a == 3).all()


def test_prefaulter_stays_a_window_ahead():
    from llambda.backends.weight_arena import Prefaulter, _C
    if _C is None or not hasattr(_C, "populate_write"):
        pytest.skip("the C core is not built")
    arena = WeightArena(chunk=HUGE)
    buf = arena._new_mapping(64 * HUGE).free
    pf = Prefaulter(buf, window=8 * HUGE, step=HUGE)
    pf.advance(4 * HUGE)
    import time
    for _ in range(200):                        # the thread reaches 4 + 8 huge pages and stops there
        if pf.done >= 12 * HUGE:
            break
        time.sleep(0.01)
    time.sleep(0.05)
    done = pf.stop()
    if done == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE")
    assert done == 12 * HUGE
    assert 0 < _resident(buf) <= 13 * HUGE          # faulted in, and no further than the window
    assert not buf.any()                            # zero-filled


def test_populate_write_refuses_read_only_buffers():
    from llambda.backends.weight_arena import _C
    if _C is None or not hasattr(_C, "populate_write"):
        pytest.skip("the C core is not built")
    with pytest.raises((TypeError, BufferError)):
        _C.populate_write(b"read only")
    assert _C.populate_write(bytearray(10)) in (0, 1)


_COLLAPSE_PROBE = r"""
import json, mmap, sys
from llambda.backends.weight_arena import HUGE, WeightArena
arena = WeightArena(chunk=8 * HUGE)
a = arena.alloc(3 * HUGE)
m = arena._maps[0].mm
m.madvise(mmap.MADV_NOHUGEPAGE)            # fault a in 4 KB pages, as a fragmented machine would
a[:] = 3
m.madvise(mmap.MADV_HUGEPAGE)
before = arena.huge_page_bytes()
arena.collapse()
after = arena.huge_page_bytes()
error = None
if after is not None and after < 2 * HUGE:
    try:                                   # an old kernel (EINVAL), no free 2 MB page now (EAGAIN, ENOMEM)
        m.madvise(25, 0, 3 * HUGE)
    except OSError as e:
        error = str(e)
free = arena._free
print(json.dumps(dict(before=before, after=after, error=error, intact=bool((a == 3).all()),
                      free=[free.ctypes.data, free.nbytes])))
sys.stdout.flush()
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
page = os.sysconf("SC_PAGE_SIZE")
n = free.nbytes // page
vec = (ctypes.c_ubyte * n)()
assert libc.mincore(ctypes.c_void_p(free.ctypes.data), ctypes.c_size_t(n * page), vec) == 0
print(sum(v & 1 for v in vec) * page)
"""


def test_collapse_backs_4k_pages_by_2mb_ones_up_to_the_last_allocation():
    """A load whose faults got 4 KB pages (no free 2 MB page then) gets 2 MB ones after it (MADV_COLLAPSE),
    and the mapping past its last allocation stays untouched. In a fresh process: smaps counts huge pages
    per merged mapping, and in a long test run the arena's mapping merged with a loaded model's (CI counted
    486 MB 'before')."""
    import json
    import subprocess
    import sys
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            if "[never]" in f.read():
                pytest.skip("transparent huge pages are off on this host")
    except OSError:
        pytest.skip("no transparent huge pages on this host")
    out = subprocess.run([sys.executable, "-c", _COLLAPSE_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    got, resident_tail = json.loads(lines[0]), int(lines[1])
    if got["before"] is None:
        pytest.skip("no /proc/self/smaps")
    if got["error"] is not None:
        pytest.skip(f"MADV_COLLAPSE did not run here: {got['error']}")
    assert got["after"] >= 2 * HUGE > got["before"]     # a's whole 2 MB ranges (its start is 2 MB aligned)
    assert got["intact"]
    assert resident_tail == 0                  # the tail was never allocated: never filled in

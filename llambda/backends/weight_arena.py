"""Packed weights in a few large anonymous mappings backed by transparent huge pages.

Decode streams every weight once per token, so it lives on the memory bandwidth
of one core. With 4 KB pages a 145 MB model touches ~36,000 pages per token and
the page walks cost ~10% of single-thread read bandwidth here (14.2 vs 12.7 GB/s,
A/B on this machine); 2 MB pages remove them. Matrices are laid out in the
order they are packed (the model packs in execution order), so the kernels'
software prefetch runs from one matrix into the next instead of into a cold page.

A load reserves its weights' bytes at once (`reserve`: the memory plan's size, one mapping). Opted in
(`LLAMBDA_ARENA_PREFAULT=1`: alternated cold loads showed no gain on the 2-core development VM, where the
packing already keeps both cores busy), a thread faults the reservation in (zero-filled 2 MB pages, `_native.populate_write`, the GIL released) up to
PREFAULT bytes ahead of the last matrix allocated, while the pool packs: the first touch of fresh memory
(on the development VM 1.5-3 CPU-seconds per GB, the hypervisor backing the guest's pages) then runs
beside the packing and the disk's reads instead of inside the packing. By default the packing faults
the pages itself.
"""
from __future__ import annotations

import mmap

import numpy as np

from .. import switches
from ..formats.runs_ahead import RunsAhead

try:
    from .. import _native as _C
except ImportError:     # not built: the packing faults its pages itself
    _C = None

HUGE = 2 << 20          # transparent huge page size on x86-64 and most arm64 kernels
ALIGN = 4096            # start of each matrix: page-aligned, so no two share a line or page
CHUNK = 64 << 20        # one mapping serves many matrices; bigger ones get their own
PREFAULT = 256 << 20    # how far past the last allocation the reservation's pages are faulted in
STEP = 8 << 20          # one populate call: short enough for the prefaulter to stop soon
RESERVE_MIN = CHUNK     # a load of fewer weights than this (a small model) takes chunks as they come
MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)    # Linux 6.1; Python's mmap names it from 3.13


def collapse_enabled() -> bool:
    return switches.flag("LLAMBDA_ARENA_COLLAPSE", True)


def prefault_enabled() -> bool:
    return switches.flag("LLAMBDA_ARENA_PREFAULT", False)


class Prefaulter:
    """Faults the pages of `buf` (a zero-filled anonymous mapping) in for writing, in order, on a thread of
    its own, up to `window` bytes past the position `advance` was last told (the arena's allocations)."""

    def __init__(self, buf: np.ndarray, window: int = PREFAULT, step: int = STEP):
        self._buf = buf
        # behind the packer it goes on from the packer's huge page: the packer faults those itself
        self._runs = RunsAhead(len(buf), self._fault, window, step, align=HUGE, name="llambda-prefault")
        self.advance = self._runs.advance

    @property
    def done(self) -> int:
        """The faulted end."""
        return self._runs.done

    def stop(self) -> int:
        """Stop (after the current step) and return how far the buffer was faulted in. Idempotent."""
        done = self._runs.stop()
        self._buf = None
        return done

    def _fault(self, lo: int, hi: int) -> bool:
        return _C.populate_write(self._buf[lo:hi]) == 0      # a kernel without it, out of memory: the packing faults


class _Mapping:
    """One anonymous mapping of the arena and how far it is carved (`end`, an offset in it): the one record
    of both its unused tail (`free`) and what collapse covers (`used`)."""
    __slots__ = ("mm", "buf", "lo", "hi", "start", "stop", "end")

    def __init__(self, mm: mmap.mmap):
        self.mm = mm
        self.buf = np.frombuffer(mm, np.uint8)
        self.lo, self.hi = self.buf.ctypes.data, self.buf.ctypes.data + len(mm)
        self.start = (-self.lo) % HUGE                  # where its allocations begin: a 2 MB boundary
        self.stop = len(mm) - HUGE + self.start         # and where they end
        self.end = self.start

    @property
    def free(self) -> np.ndarray:
        return self.buf[self.end:self.stop]

    @property
    def used(self) -> int:
        """Bytes from the mapping's start to the end of its last allocation (page-rounded); 0 before any."""
        return self.end if self.end > self.start else 0

    def take(self, nbytes: int, padded: int) -> np.ndarray:
        out = self.buf[self.end:self.end + nbytes]
        self.end += padded
        return out


class WeightArena:
    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self._maps: list[_Mapping] = []      # kept alive while any matrix views them
        self._tail: _Mapping | None = None   # the mapping small matrices are carved from now
        self.mapped_bytes = 0
        self._reserved: _Mapping | None = None      # the load's reservation (reserve), while it loads
        self._prefaulter: Prefaulter | None = None

    @property
    def _free(self) -> np.ndarray:
        """The unused tail of the current mapping."""
        return self._tail.free if self._tail is not None else np.empty(0, np.uint8)

    def _new_mapping(self, nbytes: int) -> _Mapping:
        size = -(-(nbytes + HUGE) // HUGE) * HUGE     # room to start on a 2 MB boundary
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                m.madvise(advice)
            except OSError:     # THP disabled in this kernel: plain pages still work
                pass
        mapping = _Mapping(m)
        self._maps.append(mapping)
        self.mapped_bytes += size
        return mapping

    def alloc(self, nbytes: int, skew: int = 0) -> np.ndarray:
        """A zero-filled uint8 array of nbytes starting skew bytes past a page boundary."""
        return self._alloc(nbytes + skew)[skew:]

    def _alloc(self, nbytes: int) -> np.ndarray:
        padded = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if padded > len(self._free):
            fresh = self._new_mapping(max(self.chunk, padded))
            if padded > self.chunk:            # a matrix of its own: keep the current tail
                return fresh.take(nbytes, padded)
            self._tail = fresh
        out = self._tail.take(nbytes, padded)
        if self._prefaulter is not None and self._reserved is not None:
            self._prefaulter.advance(self._carved())
        return out

    def _carved(self) -> int:
        """How far the reservation is allocated (all of it once the tail moved on: it ran out)."""
        r = self._reserved
        return (r.end if self._tail is r else r.stop) - r.start

    def reserve(self, nbytes: int) -> None:
        """A load of about `nbytes` of packed weights begins: map them at once (what does not fit goes to
        mappings of its own, as without a reservation) and fault the pages in ahead of the allocations on a
        thread, until `end_reserve`."""
        self.end_reserve()
        if nbytes <= RESERVE_MIN:
            return
        self._tail = self._reserved = self._new_mapping(int(nbytes) + int(nbytes) // 64 + self.chunk)  # + padding
        if _C is not None and hasattr(_C, "populate_write") and prefault_enabled():
            self._prefaulter = Prefaulter(self._tail.free[:int(nbytes)])    # never past the plan: peak RSS

    def end_reserve(self) -> None:
        """The load ended (or failed): stop faulting, and give back the pages faulted past the last
        allocation (they fault again, zero-filled, if a later allocation takes them). Idempotent."""
        pf, self._prefaulter = self._prefaulter, None
        if pf is None or self._reserved is None:
            self._reserved = None
            return
        done = pf.stop()
        lo = -(-self._carved() // HUGE) * HUGE
        if done > lo:
            try:
                self._reserved.mm.madvise(mmap.MADV_DONTNEED, self._reserved.start + lo, done - lo)
            except (OSError, ValueError):    # only a help: the pages stay, zero-filled
                pass
        self._reserved = None

    def collapse(self) -> None:
        """After a load: ask the kernel to back what the packing faulted in 4 KB pages by 2 MB pages now
        (MADV_COLLAPSE: it compacts or reclaims for them, whatever the THP sysfs settings other than
        `never`). A fault gets a 4 KB page when no free 2 MB one is at hand: a page cache full of the
        model file left a 48-layer MoE with part of its arena on 4 KB pages and decoding 28% slower.
        Only up to each mapping's last allocation; 2 MB ranges already huge cost a table walk.
        Opt-out: LLAMBDA_ARENA_COLLAPSE=0. Errors (an older kernel, no memory to compact) leave the
        pages as they are: only a help."""
        if not collapse_enabled():
            return
        for m in self._maps:
            n = m.used                                # up to the last allocation: never past it (unused
            if n <= 0:                                # memory would be filled in, zeroed)
                continue
            try:
                m.mm.madvise(MADV_COLLAPSE, 0, n)
            except (OSError, ValueError):
                pass

    def huge_page_bytes(self) -> int | None:
        """Bytes of the arena the kernel backs with transparent huge pages now (AnonHugePages of its
        mappings in /proc/self/smaps; None where that file does not exist). For benchmarks: a decode
        on 4 KB pages pays page walks a huge-page arena does not. An upper bound where a mapping was
        merged with a neighbour's (smaps counts per merged entry)."""
        try:
            with open("/proc/self/smaps") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        # The kernel merges neighbouring anonymous mappings of the same flags into one entry (another
        # arena, a large NumPy array): an entry's count is capped at the bytes it shares with ours.
        total, overlap = 0, 0
        for line in lines:
            head = line.split(None, 1)[0] if line else ""
            if "-" in head and not head.endswith(":"):          # a mapping's header: "start-end perms ..."
                lo, hi = (int(v, 16) for v in head.split("-"))
                overlap = sum(max(0, min(hi, m.hi) - max(lo, m.lo)) for m in self._maps)
            elif overlap and head == "AnonHugePages:":
                total += min(int(line.split()[1]) * 1024, overlap // HUGE * HUGE)
        return total

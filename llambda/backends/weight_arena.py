"""Packed weights in a few large anonymous mappings backed by transparent huge pages.

Decode streams every weight once per token, so it lives on the memory bandwidth
of one core. With 4 KB pages a 145 MB model touches ~36,000 pages per token and
the page walks cost ~10% of single-thread read bandwidth here (14.2 vs 12.7 GB/s,
A/B on this machine); 2 MB pages remove them. Matrices are laid out in the
order they are packed (the model packs in execution order), so the kernels'
software prefetch runs from one matrix into the next instead of into a cold page.
"""
from __future__ import annotations

import mmap

import numpy as np

HUGE = 2 << 20          # transparent huge page size on x86-64 and most arm64 kernels
ALIGN = 4096            # start of each matrix: page-aligned, so no two share a line or page
CHUNK = 64 << 20        # one mapping serves many matrices; bigger ones get their own


class WeightArena:
    def __init__(self, chunk: int = CHUNK):
        self.chunk = chunk
        self._maps: list[mmap.mmap] = []     # kept alive while any matrix views them
        self._free = np.empty(0, np.uint8)   # the unused tail of the current mapping
        self.mapped_bytes = 0
        self._ranges: list[tuple[int, int]] = []  # [start, end) of each mapping

    def _new_mapping(self, nbytes: int) -> np.ndarray:
        size = -(-(nbytes + HUGE) // HUGE) * HUGE     # room to start on a 2 MB boundary
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            try:
                m.madvise(advice)
            except OSError:     # THP disabled in this kernel: plain pages still work
                pass
        self._maps.append(m)
        self.mapped_bytes += size
        buf = np.frombuffer(m, np.uint8)
        self._ranges.append((buf.ctypes.data, buf.ctypes.data + size))
        start = (-buf.ctypes.data) % HUGE
        return buf[start:start + size - HUGE]

    def alloc(self, nbytes: int) -> np.ndarray:
        """A zero-filled, page-aligned uint8 array of nbytes."""
        padded = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if padded > len(self._free):
            fresh = self._new_mapping(max(self.chunk, padded))
            if padded > self.chunk:            # a matrix of its own: keep the current tail
                return fresh[:nbytes]
            self._free = fresh
        out, self._free = self._free[:nbytes], self._free[padded:]
        return out

    def huge_page_bytes(self) -> int | None:
        """Bytes of the arena the kernel backs with transparent huge pages now (AnonHugePages of its
        mappings in /proc/self/smaps; None where that file does not exist). For benchmarks: a decode
        on 4 KB pages pays page walks a huge-page arena does not."""
        try:
            with open("/proc/self/smaps") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        total, ours = 0, False
        for line in lines:
            head = line.split(None, 1)[0] if line else ""
            if "-" in head and not head.endswith(":"):          # a mapping's header: "start-end perms ..."
                lo, hi = (int(v, 16) for v in head.split("-"))
                ours = any(lo < end and start < hi for start, end in self._ranges)
            elif ours and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
        return total

"""A model file's bytes dropped from the page cache once packed (posix_fadvise DONTNEED), as a load goes.

Once a tensor is packed, the arena holds its bytes (regrouped): a second copy in the page cache is memory
no one needs for a model of many GB, and on a virtual machine it is also where the arena's memory comes
from cheaply. The arena's first touch of fresh memory costs about 2.5 CPU-seconds per GB on the
development VM (the hypervisor backs guest memory on first touch and takes back what the guest frees),
while pages the guest just freed come back for about 0.07 s per GB. Dropping each packed tensor's file
pages at once hands the next tensors' arena those pages: a load costs the disk's read, not the disk's
read plus the hypervisor's. The price: the next load of the file reads the disk again. So the drop is
for big files only (`should_drop`): a file larger than a quarter of the memory available when the load
starts, where a second copy in the page cache squeezes the model itself; a small model stays cached and
its next load (the next `llambda run`) reads no disk. `LLAMBDA_KEEP_FILE_CACHE=1` never drops,
`=0` always does.

The kernel drops only whole folios inside a range (the page cache holds a file in folios up to 2 MB), so
the ranges released are joined, and each drop reaches MARGIN into its released neighbours: a folio that
straddles two tensors goes once both are packed. Pages still mapped (by this process or another one) are
skipped by the kernel: dropping them is only ever a help, never a loss of data.
"""
from __future__ import annotations

import bisect
import os

from .. import switches

GAP = 64 << 10      # released ranges this close are joined (alignment padding, a small tensor never released)
MARGIN = 4 << 20    # how far a drop reaches into the joined neighbours (twice the largest page-cache folio)


def mem_available() -> int | None:
    """The kernel's MemAvailable in bytes, None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


BIG = 0.25          # a file above this fraction of MemAvailable leaves the page cache as it is packed


def should_drop(file_bytes: int, available: int | None) -> bool:
    """Whether a load drops the file's packed bytes from the page cache (see the module's doc)."""
    keep = switches.flag("LLAMBDA_KEEP_FILE_CACHE", None)
    if keep is not None:
        return not keep
    return available is not None and file_bytes > BIG * available


class PageCacheDropper:
    """Drops byte ranges of the file at `path` from the page cache once released (`drop(lo, hi)`)."""

    def __init__(self, path):
        self._fd = os.open(path, os.O_RDONLY) if hasattr(os, "posix_fadvise") else None
        self._lo: list[int] = []        # the joined released ranges, sorted: starts and ends
        self._hi: list[int] = []
        self.dropped = 0                # bytes asked to be dropped (what the kernel drops may be less)

    def drop(self, lo: int, hi: int) -> None:
        if self._fd is None or hi <= lo:
            return
        i = bisect.bisect_left(self._hi, lo - GAP)           # the first range that ends near or after lo
        j = bisect.bisect_right(self._lo, hi + GAP)          # past the last range that starts near or before hi
        jl, jh = (min(lo, self._lo[i]), max(hi, self._hi[j - 1])) if i < j else (lo, hi)
        self._lo[i:j], self._hi[i:j] = [jl], [jh]
        a, b = max(jl, lo - MARGIN), min(jh, hi + MARGIN)
        self._advise(a, b - a)

    def _advise(self, offset: int, length: int) -> None:
        try:
            os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)
            self.dropped += length
        except OSError:     # a file system without it: the pages stay cached (reclaimable)
            pass

    def drop_all(self, start: int = 0) -> None:
        """Drop every cached, unmapped page of the file from `start` on (at a load's end: folios that straddled
        a tensor never released)."""
        if self._fd is not None:
            self._advise(start, 0)      # length 0: to the end of the file

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

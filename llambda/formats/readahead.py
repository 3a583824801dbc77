"""Reading a mapped model file ahead of the loader, on a thread of its own.

Packing a tensor that is not yet in the page cache waits for the disk page fault by page fault, and
while the disk reads nothing packs: a cold load took the disk's time plus the packing's. A ReadAhead
pages the file in, in file order, a window ahead of the tensor the loader last let go of
(`advance`), on a thread that waits for the disk with the GIL released (`_native.populate`:
MADV_POPULATE_READ), and drops its own mapping of those pages again at once (they stay in the page
cache, where the loader's faults find them): the process's resident set never holds the window.
Without the C core it asks the kernel to read ahead (MADV_WILLNEED) and paces nothing.
"""
from __future__ import annotations

import mmap
import threading

import numpy as np

from .files import READ_AHEAD, release_pages

try:
    from .. import _native as _C
except ImportError:     # not built: the kernel's asynchronous read-ahead only
    _C = None

WINDOW = 512 << 20      # how far past the loader's last released tensor the file is read (an MoE layer's experts)
CHUNK = 16 << 20        # one read: long enough for the disk's queue, short enough to stop soon on close


class ReadAhead:
    """Pages of `base` (the uint8 array over read-only file mapping `mm`) read ahead of the loader."""

    def __init__(self, mm: mmap.mmap, base: np.ndarray, start: int = 0, window: int = WINDOW, chunk: int = CHUNK):
        self._mm, self._base, self.window, self.chunk = mm, base, window, chunk
        self._at = self._pos = max(0, int(start))      # the loader's position; the next byte to read
        self._cond = threading.Condition()
        self._stopped = False
        self.bytes_read = 0
        self._thread = threading.Thread(target=self._run, name="llambda-readahead", daemon=True)
        self._thread.start()

    def advance(self, offset: int) -> None:
        """The loader let go of the bytes before `offset`: read on to offset + window (from there, if the loader
        is past what was read: it jumped, or the disk is slower than the packing)."""
        with self._cond:
            self._at = int(offset)
            self._pos = max(self._pos, self._at)
            self._cond.notify()

    def stop(self) -> None:
        """Stop reading and wait for the current read (a chunk) to end. Idempotent."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
            self._mm = self._base = None     # the mapping can be closed now

    def _run(self) -> None:
        size = len(self._base)
        while True:
            with self._cond:
                while not self._stopped and self._pos >= min(size, self._at + self.window):
                    self._cond.wait()
                if self._stopped:
                    return
                lo = self._pos
                hi = self._pos = min(size, lo + self.chunk, self._at + self.window)
            page = lo - lo % mmap.PAGESIZE      # madvise takes a page-aligned start
            try:
                if _C is not None and _C.populate(self._base[lo:hi]) == 0:
                    self._mm.madvise(mmap.MADV_DONTNEED, page, hi - page)
                else:
                    self._mm.madvise(mmap.MADV_WILLNEED, page, hi - page)
            except (OSError, ValueError):   # a closed mapping, a kernel without madvise: reading ahead is only a help
                return
            self.bytes_read += hi - lo


class ReadsAhead:
    """What a mapped model file (GGUFFile, SafetensorsFile: `_mm`, `_base`, `data_start`) does for a load:
    read itself ahead of the loader while one runs, and let go of each tensor's pages once packed."""

    _ahead: ReadAhead | None = None

    def read_ahead(self) -> None:
        """Start reading the tensor data ahead of the loader (until stop_read_ahead or close). Idempotent."""
        if self._ahead is None and self._mm is not None and self._base is not None:
            self._ahead = ReadAhead(self._mm, self._base, self.data_start)

    def stop_read_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.stop()

    @property
    def reading_ahead(self) -> bool:
        return self._ahead is not None

    def release(self, data: np.ndarray) -> int:
        """Drop this process's pages of a tensor's bytes once they were copied (files.release_pages)."""
        return release_pages(self._mm, self._base, data, READ_AHEAD, self._ahead)

"""Reading a mapped model file ahead of the loader, on a thread of its own.

Packing a tensor that is not yet in the page cache waits for the disk page fault by page fault, and
while the disk reads nothing packs: a cold load took the disk's time plus the packing's. A ReadAhead
pages the file in, in the order the loader packs it (`load_order`), a window ahead of the tensor the
loader last let go of
(`advance`), on a thread that waits for the disk with the GIL released (`_native.populate`:
MADV_POPULATE_READ), and drops its own mapping of those pages again at once (they stay in the page
cache, where the loader's faults find them): the process's resident set never holds the window.
Without the C core it asks the kernel to read ahead (MADV_WILLNEED) and paces nothing.
"""
from __future__ import annotations

import bisect
import mmap
import re

import numpy as np

from .files import READ_AHEAD, release_pages
from .pagecache import PageCacheDropper, mem_available, should_drop
from .runs_ahead import RunsAhead
from .staging import Stager, enabled as staging_enabled

try:
    from .. import _native as _C
except ImportError:     # not built: the kernel's asynchronous read-ahead only
    _C = None

WINDOW = 512 << 20      # how far past the loader's last released tensor the file is read (an MoE layer's experts)
CHUNK = 16 << 20        # one read: long enough for the disk's queue, short enough to stop soon on close
JOIN = 64 << 10         # tensors this close in the file are read as one range
_LAYER = re.compile(r"(?:^|\.)(\d+)\.")     # blk.12.attn_q.weight, model.layers.12.mlp.up_proj.weight


def load_sorted(spans) -> list[tuple[str, int, int]]:
    """`spans` ((name, start, end) of each tensor) in the order a model is packed: the tensors outside the
    layers first (embeddings, output head), then layer by layer, each layer's in file order. (Files keep
    tensors in any order: llama.cpp's quantizer writes blk.1, blk.10, ..., blk.19, blk.2, ... and the
    output head first or last.)"""
    def key(span):
        m = _LAYER.search(span[0])
        return (-1 if m is None else int(m.group(1)), span[1])
    return sorted((s for s in spans if s[2] > s[1]), key=key)


def load_order(spans) -> list[tuple[int, int]]:
    """The byte ranges of `spans` in the order a model is packed (load_sorted), neighbours in the file joined."""
    out: list[list[int]] = []
    for _, lo, hi in load_sorted(spans):
        if out and 0 <= lo - out[-1][1] <= JOIN:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


class ReadAhead:
    """Pages of `base` (the uint8 array over read-only file mapping `mm`) read ahead of the loader: the byte
    `ranges` in the order the loader packs them (default: from `start` to the end), a window ahead of it."""

    def __init__(self, mm: mmap.mmap, base: np.ndarray, start: int = 0, window: int = WINDOW, chunk: int = CHUNK,
                 ranges: list[tuple[int, int]] | None = None):
        self._mm, self._base, self.window, self.chunk = mm, base, window, chunk
        self._ranges = list(ranges) if ranges else [(max(0, int(start)), len(base))]
        self._cum = [0]                 # where each range starts in the reading order
        for lo, hi in self._ranges:
            self._cum.append(self._cum[-1] + hi - lo)
        self._starts = sorted((lo, i) for i, (lo, _) in enumerate(self._ranges))
        self._runs = RunsAhead(self._cum[-1], self._read, window, chunk, name="llambda-readahead")

    @property
    def bytes_read(self) -> int:
        return self._runs.worked

    def _order_pos(self, offset: int) -> int:
        """File offset `offset` (the end of a released tensor) as a position in the reading order."""
        k = bisect.bisect_left(self._starts, (offset, -1)) - 1       # the last range starting before offset
        if k < 0:
            return 0
        lo, i = self._starts[k]
        return self._cum[i] + min(offset - lo, self._ranges[i][1] - lo)

    def advance(self, offset: int) -> None:
        """The loader let go of the bytes before file offset `offset`: read on to its position + window (from
        there, if the loader is past what was read: it jumped, or the disk is slower than the packing)."""
        self._runs.advance(self._order_pos(int(offset)))

    def stop(self) -> None:
        """Stop reading and wait for the current read (a chunk) to end. Idempotent."""
        self._runs.stop()
        if not self._runs.alive:
            self._mm = self._base = None     # the mapping can be closed now

    def _pieces(self, lo: int, hi: int):
        """The file byte ranges of reading-order positions [lo, hi)."""
        i = bisect.bisect_right(self._cum, lo) - 1
        while lo < hi:
            r0, r1 = self._ranges[i]
            a = r0 + lo - self._cum[i]
            b = min(r1, a + hi - lo)
            yield a, b
            lo += b - a
            i += 1

    def _read(self, lo: int, hi: int) -> bool:
        """One step: reading-order positions [lo, hi) into the page cache, out of this process."""
        for a, b in self._pieces(lo, hi):
            page = a - a % mmap.PAGESIZE      # madvise takes a page-aligned start
            try:
                if _C is not None and _C.populate(self._base[a:b]) == 0:
                    self._mm.madvise(mmap.MADV_DONTNEED, page, b - page)
                else:
                    self._mm.madvise(mmap.MADV_WILLNEED, page, b - page)
            except (OSError, ValueError):   # a closed mapping, a kernel without madvise: only a help
                return False
        return True


class ReadsAhead:
    """What a mapped model file (GGUFFile, SafetensorsFile: `_mm`, `_base`, `data_start`, `path`, `tensors`)
    does for a load: read itself ahead of the loader, in the loader's order, while one runs, and let go of
    each tensor's pages once packed: from this process, and from the page cache (pagecache.py); close()
    unmaps it.

    With `LLAMBDA_STAGED_READ=1`, a big file (pagecache.should_drop) of a format that takes its tensors'
    bytes through `view` (`stages`) is read instead into staging buffers (staging.py), never into the page
    cache. Not the default: on the development VM it costs twice the CPU of the mapped read (staging.py)."""

    stages = False      # the format's tensor lookup calls view(): a Stager may serve its big tensors
    _ahead: ReadAhead | None = None
    _stager: Stager | None = None
    _dropper: PageCacheDropper | None = None

    def _spans(self) -> list[tuple[str, int, int]]:
        lo = self._base.__array_interface__["data"][0]
        out = []
        for name, t in self.tensors.items():
            data = getattr(t, "data", None)
            if data is not None and data.nbytes:
                start = data.__array_interface__["data"][0] - lo
                out.append((name, start, start + data.nbytes))
        return out

    def read_ahead(self) -> None:
        """Start reading the tensor data ahead of the loader (until stop_read_ahead or close). Idempotent."""
        if self._ahead is not None or self._stager is not None or self._mm is None or self._base is None:
            return
        big = should_drop(len(self._base), mem_available())
        if big and self.stages and staging_enabled():
            try:
                self._stager = Stager(self.path, [(a, b) for _, a, b in load_sorted(self._spans())], len(self._base))
            except OSError:     # the file went away: the mapping still reads it
                self._stager = None
        if self._stager is None:
            self._ahead = ReadAhead(self._mm, self._base, self.data_start, ranges=load_order(self._spans()))
        if big:
            try:
                self._dropper = PageCacheDropper(self.path)
            except OSError:     # the file went away: its pages are the kernel's business
                self._dropper = None

    def stop_read_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.stop()
        stager, self._stager = self._stager, None
        if stager is not None:
            stager.stop()
        dropper, self._dropper = self._dropper, None
        if dropper is not None:
            dropper.drop_all(self.data_start)
            dropper.close()

    def close(self) -> None:
        """Stop reading ahead and unmap the file. Views still held elsewhere keep the mapping alive until freed."""
        self.stop_read_ahead()
        self._base = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a tensor view is still referenced; the mapping goes with it
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def reading_ahead(self) -> bool:
        return self._ahead is not None or self._stager is not None

    def view(self, data: np.ndarray) -> np.ndarray:
        """A tensor's bytes for the loader: `data` (its view of the mapping), or while a Stager reads the file,
        the same bytes in a staging buffer."""
        if self._stager is None or self._base is None or not data.nbytes:
            return data
        start = data.__array_interface__["data"][0] - self._base.__array_interface__["data"][0]
        staged = self._stager.view(start, start + data.nbytes)
        return data if staged is None else staged

    def release(self, data: np.ndarray) -> int:
        """Drop this process's pages of a tensor's bytes once they were copied (files.release_pages), and while
        a load reads ahead, the page cache's; a staged tensor's buffer goes back to the Stager."""
        if self._stager is not None and data is not None and data.nbytes:
            n = self._stager.release(data)
            if n:
                return n
        n = release_pages(self._mm, self._base, data, 0 if self._stager is not None else READ_AHEAD, self._ahead)
        if n and self._dropper is not None:
            start = data.__array_interface__["data"][0] - self._base.__array_interface__["data"][0]
            self._dropper.drop(start, start + data.nbytes)
        return n

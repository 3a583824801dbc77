"""A big file's tensors read into a few reused staging buffers ahead of the loader, bypassing the page cache
(opt-in: `LLAMBDA_STAGED_READ=1`; readahead.ReadsAhead starts a Stager instead of its mapped read-ahead).

A Stager reads each big tensor (STAGE_MIN and more) with large sequential reads (O_DIRECT where the file
system allows it: the disk writes straight into the buffer and the page cache never holds the file; else
plain reads told SEQUENTIAL and dropped behind with DONTNEED) into a staging buffer, on a thread of its own
(the reads release the GIL), in the loader's order (`readahead.load_sorted`) and at most WINDOW ahead of it.
The loader takes the tensor's bytes from the buffer (`view`), packs them into the arena and lets go of them
(`release`); the buffer, already touched, serves a later tensor. The arena is the only copy that grows; the
staging memory stays about WINDOW plus the largest tensor.

Why it is not the default: on the development VM (a hypervisor that backs guest memory on first touch and
takes freed memory back) memory is cheap only where the host filled it: the page cache, which the disk's
DMA writes (the host's I/O thread pays), and pages freed a moment ago. The mapped load reads the file
into the page cache and drops each packed tensor's pages (pagecache.py), so the arena's pages are those
just freed; a staged load's arena is fresh anonymous memory the guest must zero, paying the backing on its
own CPU. Measured cold on a 7.4 GB MoE file, alternated at load average 7-8: staged 61 s wall / 27.4
CPU-s, mapped 28.7 s / 14.1 CPU-s (staged with 4 KB arena pages 48.7 s / 20.4 CPU-s). Where fresh
memory costs only its zeroing (bare metal), staging saves the page cache's churn; `bench/bench_load.py
--modes llambda,llambda-staged` compares the two.

A buffer is reused only when no view of it is left (its reference count): a loader that keeps a tensor's
bytes (a backend that does not copy) costs memory, never correctness. A tensor the loader asks for far
out of the reading order is served from the file's mapping instead. A read that ends early (the file was
truncated while loading) is a ModelFormatError raised in the loader, never a buffer of stale bytes.
"""
from __future__ import annotations

import errno
import mmap
import os
import sys
import threading

import numpy as np

from .. import switches
from ..errors import ModelFormatError

STAGE_MIN = 1 << 20     # smaller tensors (norms, biases, small projections) are served from the mapping
WINDOW = 256 << 20      # read at most this far ahead of the loader (besides the tensor it waits for)
CHUNK = 16 << 20        # one read call: long enough for the disk's queue, short enough to stop soon
ALIGN = 4096            # O_DIRECT: offsets, lengths and buffer addresses in whole logical blocks
ROUND = 4 << 20         # buffer capacities round up to this, so that a later layer's tensors reuse them


def enabled() -> bool:
    """Whether a big file's load stages its tensors (LLAMBDA_STAGED_READ=1)."""
    return switches.flag("LLAMBDA_STAGED_READ", False)


class _Buffer:
    __slots__ = ("mm", "arr", "cap")

    def __init__(self, cap: int):
        self.mm = mmap.mmap(-1, cap, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.arr = np.frombuffer(self.mm, np.uint8)     # the only reference the Stager keeps
        self.cap = cap

    def unused(self) -> bool:
        """No view of this buffer is alive outside the Stager (getrefcount: the attribute and its argument)."""
        return sys.getrefcount(self.arr) <= 2

    def close(self) -> None:
        self.arr = None
        try:
            self.mm.close()
        except BufferError:     # a view still exported: the mapping goes when the view does
            pass


def open_direct(path, direct: bool = True) -> tuple[int, bool]:
    """A descriptor of `path` for staging reads and whether it is O_DIRECT (a file system that refuses it,
    or `direct` False: a plain one, told the reads are sequential)."""
    flag = getattr(os, "O_DIRECT", 0)
    if direct and flag and switches.flag("LLAMBDA_DIRECT_IO", True):
        try:
            return os.open(path, os.O_RDONLY | flag), True
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd, False


class Stager:
    """Tensors `spans` ((start, end) file byte ranges, in the loader's order) of the file at `path` read
    into staging buffers ahead of the loader. `view(start, end)` the staged bytes (None: take them from
    the mapping), `release(array)` once packed, `stop()` at the load's end."""

    def __init__(self, path, spans, file_size: int, window: int = WINDOW, chunk: int = CHUNK):
        self.path, self.size, self.window, self.chunk = str(path), int(file_size), window, chunk
        self._spans = [(int(a), int(b)) for a, b in spans if b - a >= STAGE_MIN]
        self._index = {a: i for i, (a, _) in enumerate(self._spans)}
        self._fd, self.direct = open_direct(path)
        largest = max((self._need(i) for i in range(len(self._spans))), default=0)
        self._limit = window + largest      # the staging memory, unless the loader keeps views
        self._cond = threading.Condition()
        self._ready: dict[int, tuple[_Buffer, np.ndarray]] = {}    # read, not yet released
        self._by_addr: dict[int, int] = {}      # a ready view's address -> its index
        self._free: list[_Buffer] = []
        self._skip: set[int] = set()
        self._handed: set[int] = set()          # indices view() returned
        self._next = 0                          # the next index the reader reads
        self._ahead = 0                         # capacity of the ready buffers
        self._allocated = 0
        self._want: int | None = None           # the index the loader waits for
        self._error: BaseException | None = None
        self._stopped = False
        self.bytes_read = 0
        self.buffers_made = 0
        self._thread = threading.Thread(target=self._run, name="llambda-stager", daemon=True)
        self._thread.start()

    def _bounds(self, i: int) -> tuple[int, int]:
        a, b = self._spans[i]
        return a - a % ALIGN, min(-(-b // ALIGN) * ALIGN, -(-self.size // ALIGN) * ALIGN)

    def _need(self, i: int) -> int:
        lo, hi = self._bounds(i)
        return -(-(hi - lo) // ROUND) * ROUND

    # -- the loader's side ---------------------------------------------------
    def view(self, start: int, end: int) -> np.ndarray | None:
        i = self._index.get(int(start))
        if i is None or self._spans[i][1] != end:
            return None
        with self._cond:
            while True:
                got = self._ready.get(i)    # read whole before any later read failed: its bytes are good
                if got is None and self._error is not None:
                    raise self._error
                if got is not None:
                    self._want = None
                    self._handed.add(i)
                    for k in [k for k in self._ready if k < i and k not in self._handed]:
                        self._let_go(k)     # read ahead, passed over: a tensor the model does not use
                    return got[1]
                if i < self._next or self._stopped or i in self._skip:     # read and let go of already, or skipped
                    return None
                between = sum(self._need(k) for k in range(self._next, i))
                if between > self.window:       # far out of order: not worth holding what lies between
                    self._skip.add(i)
                    return None
                self._want = i
                self._cond.notify_all()
                self._cond.wait()

    def release(self, data: np.ndarray) -> int:
        """Let go of a staged tensor's bytes (any view starting where `view` returned); 0 if not staged."""
        addr = data.__array_interface__["data"][0]
        with self._cond:
            i = self._by_addr.get(addr)
            return 0 if i is None else self._let_go(i)

    def _let_go(self, i: int) -> int:
        buf, v = self._ready.pop(i)
        del self._by_addr[v.__array_interface__["data"][0]]
        self._ahead -= buf.cap
        self._free.append(buf)
        self._cond.notify_all()
        return v.nbytes

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            for buf in self._free:
                buf.close()
            self._free.clear()
            self._ready.clear()
            self._by_addr.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the reader's side -------------------------------------------------
    def _buffer(self, need: int) -> _Buffer:
        """A free, unreferenced buffer of at least `need` bytes, or a new one (freeing unused ones first
        while over the limit). Called with the lock held."""
        fits = [b for b in self._free if b.cap >= need and b.unused()]
        if fits:
            b = min(fits, key=lambda b: b.cap)
            self._free.remove(b)
            return b
        for b in sorted(self._free, key=lambda b: -b.cap):
            if self._allocated + need <= self._limit:
                break
            if b.unused():
                self._free.remove(b)
                self._allocated -= b.cap
                b.close()
        self._allocated += need
        self.buffers_made += 1
        return _Buffer(need)

    def _read(self, buf: _Buffer, lo: int, hi: int) -> int:
        """File bytes [lo, hi) into the start of `buf`: a short read is an error."""
        pos = lo
        with memoryview(buf.mm) as mv:
            while pos < hi and not self._stopped:
                n = min(self.chunk, hi - pos)
                try:
                    got = os.preadv(self._fd, [mv[pos - lo:pos - lo + n]], pos)
                except OSError as e:
                    if not self.direct or e.errno != errno.EINVAL:
                        raise
                    self._plain()       # O_DIRECT opened but refused these reads (block size): plain reads
                    continue
                if got <= 0:
                    break
                if not self.direct and hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(self._fd, pos, got, os.POSIX_FADV_DONTNEED)
                pos += got
        self.bytes_read += pos - lo
        return pos

    def _plain(self) -> None:
        fd, self._fd = self._fd, None
        os.close(fd)
        self._fd, self.direct = open_direct(self.path, direct=False)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:      # a read error: the loader raises it
            with self._cond:
                self._error = e if isinstance(e, ModelFormatError) else ModelFormatError(
                    f"{self.path}: reading the tensor data failed: {e}")
                self._cond.notify_all()

    def _loop(self) -> None:
        for i in range(len(self._spans)):
            need = self._need(i)
            with self._cond:
                while not self._stopped and i not in self._skip and self._ahead > 0 \
                        and self._ahead + need > self.window and (self._want is None or self._want < i):
                    self._cond.wait()
                if self._stopped:
                    return
                if i in self._skip:
                    self._next = i + 1
                    self._cond.notify_all()
                    continue
                buf = self._buffer(need)
            lo, hi = self._bounds(i)
            end = self._read(buf, lo, hi)
            a, b = self._spans[i]
            with self._cond:
                if self._stopped:
                    buf.close()
                    return
                if end < b:
                    raise ModelFormatError(f"{self.path}: the tensor data at bytes {a}-{b} ends at byte {end}: "
                                           "the file is truncated")
                v = buf.arr[a - lo:b - lo]
                self._ready[i] = (buf, v)
                self._by_addr[v.__array_interface__["data"][0]] = i
                self._ahead += buf.cap
                self._next = i + 1
                self._cond.notify_all()

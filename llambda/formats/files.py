"""Opening the files of a model: regular files only, JSON with a size and depth guard.

A FIFO, a device, a socket or a directory where a model file should be would block a
read forever (a FIFO without a writer), never end (/dev/zero) or fail obscurely, so every
model file is opened without blocking and refused unless it is a regular file.
"""
from __future__ import annotations

import json
import mmap
import os
import stat
from contextlib import contextmanager
from typing import BinaryIO, Iterator

from ..errors import ModelFormatError

# config.json and its siblings are kilobytes, index files a few MB; tokenizer.json reaches ~35 MB (Gemma 3).
MAX_JSON_BYTES = 64 << 20
# The tokenizers library holds ~16x a tokenizer.json's size once loaded (a 70 MB one of 2.5M tokens: 1.1 GB),
# so this cap is what bounds a load's memory (~2 GB); it is ~4x the largest real one we know (Gemma 3's 35 MB).
MAX_TOKENIZER_JSON_BYTES = 128 << 20


def open_regular(path, what: str = "model file", error: type = ModelFormatError) -> BinaryIO:
    """`path` opened for binary reading, if it is a regular file; `error` naming it otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise       # a missing path is the caller's mistake, not a malformed file (as load() says too)
    except OSError as e:
        raise error(f"{path}: cannot open the {what} ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
            raise error(f"{path}: the {what} is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def replacing(path) -> Iterator[BinaryIO]:
    """A file to write that becomes `path` only once whole (a temporary renamed over it): an export that
    fails leaves the old file, if any, and no partial one behind."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_small(path, what: str, error: type = ModelFormatError, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file at `path`, refused (`error` naming it) past max_bytes."""
    with open_regular(path, what, error) as f:
        if os.fstat(f.fileno()).st_size > max_bytes:   # (read(n) would allocate all n bytes up front)
            raise error(f"{path}: {what} is larger than {max_bytes >> 20} MB")
        return f.read()


def read_json(path, what: str, error: type = ModelFormatError, max_bytes: int = MAX_JSON_BYTES):
    """The parsed JSON document at `path`; `error` naming the file for anything but valid JSON."""
    raw = read_small(path, what, error, max_bytes)
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:      # nesting deeper than the interpreter's stack
        raise error(f"{path}: {what} nests too deeply to be a model file") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise error(f"{path}: {what} is not valid JSON ({e})") from None


READ_AHEAD = 64 << 20      # after releasing a tensor, ask the kernel to start reading this much beyond it


def release_pages(mm, base, data, read_ahead: int = 0, reader=None) -> int:
    """Unmap from this process the pages of a read-only file mapping under `data` (a NumPy view into `base`,
    the uint8 array over mapping `mm`) once its bytes were copied elsewhere (packed); returns the bytes
    released, 0 if `data` is not in that mapping.

    The file's pages stay in the page cache (clean and reclaimable, shared with other readers) but leave
    this process's resident set, so a model packed tensor by tensor never holds the file and its packed
    copy at once. MADV_DONTNEED on a shared file mapping loses nothing: a later read of those bytes faults
    them back in from the page cache or the disk. (On an anonymous mapping it would zero them: this is only
    ever called with a file mapping.) The range is widened to whole pages; a neighbour's page dropped with
    it is read back if needed. `reader` (a readahead.ReadAhead over this mapping) is told where the loader
    is, so it reads on from there; without one, `read_ahead` bytes after `data` are requested
    (MADV_WILLNEED, asynchronous): tensors are packed in file order, so a cold load reads the disk while
    it packs instead of between packs.
    """
    if mm is None or base is None or data is None or not getattr(data, "nbytes", 0):
        return 0
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return 0
    lo = base.__array_interface__["data"][0]
    start = data.__array_interface__["data"][0] - lo
    if start < 0 or start + data.nbytes > base.nbytes:
        return 0
    page = mmap.PAGESIZE
    begin = start - start % page
    end = min(-(-(start + data.nbytes) // page) * page, len(mm))
    try:
        mm.madvise(advice, begin, end - begin)
        if reader is not None:
            reader.advance(start + data.nbytes)
            return end - begin
        ahead = min(read_ahead, len(mm) - end)
        if ahead > 0 and hasattr(mmap, "MADV_WILLNEED"):
            mm.madvise(mmap.MADV_WILLNEED, end, ahead)
    except (OSError, ValueError):      # a closed mapping or a kernel without madvise: nothing to release
        return 0
    return end - begin

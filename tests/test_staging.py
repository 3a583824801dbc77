"""A big file's tensors read into reused staging buffers (formats/staging.py) instead of the page cache:
the same packed weights as the mapped load, typed errors on a short file, buffers reused only when no
view of them is left."""
from __future__ import annotations

import os

import numpy as np
import pytest

from llambda.errors import ModelFormatError
from llambda.formats.staging import STAGE_MIN, Stager

from test_memory import _write_big_llama

native = pytest.importorskip("llambda._native")
MB = 1 << 20


def _file(tmp_path, nbytes: int, seed: int = 0):
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    return path, data


@pytest.mark.parametrize("direct", ["1", "0"])
def test_staged_views_hold_the_files_bytes_at_odd_offsets(tmp_path, monkeypatch, direct):
    monkeypatch.setenv("LLAMBDA_DIRECT_IO", direct)
    path, data = _file(tmp_path, 9 * MB + 777)
    spans = [(4097, 4097 + 2 * MB + 3), (3 * MB + 1, 5 * MB), (5 * MB, 9 * MB + 777), (10, 20)]
    s = Stager(path, spans, len(data), window=4 * MB)
    try:
        assert s.direct == (direct == "1" and hasattr(os, "O_DIRECT")) or not s.direct
        for a, b in spans[:3]:
            v = s.view(a, b)
            assert v is not None and np.array_equal(v, data[a:b])
            assert s.release(v) == b - a
        assert s.view(10, 20) is None          # below STAGE_MIN: the mapping serves it
        assert s.view(4097, 4097 + 2 * MB + 3) is None     # released: the mapping serves it again
    finally:
        s.stop()


def test_a_short_file_is_a_format_error_not_stale_bytes(tmp_path):
    path, data = _file(tmp_path, 3 * MB)
    s = Stager(path, [(0, 2 * MB), (2 * MB, 5 * MB)], 5 * MB)     # a header that promises more than the file
    try:
        v = s.view(0, 2 * MB)
        assert np.array_equal(v, data[:2 * MB])
        s.release(v)
        with pytest.raises(ModelFormatError, match="truncated"):
            s.view(2 * MB, 5 * MB)
    finally:
        s.stop()


def test_a_buffer_still_viewed_is_never_reused(tmp_path):
    path, data = _file(tmp_path, 8 * MB)
    spans = [(k * 2 * MB, (k + 1) * 2 * MB) for k in range(4)]
    s = Stager(path, spans, len(data), window=2 * MB)
    try:
        kept = s.view(*spans[0])[10:20]         # a backend that keeps a slice of the bytes
        s.release(s.view(*spans[0]))
        for a, b in spans[1:]:
            v = s.view(a, b)
            assert np.array_equal(v, data[a:b])
            s.release(v)
            del v
        assert np.array_equal(kept, data[10:20])
    finally:
        s.stop()


def test_far_out_of_order_tensors_come_from_the_mapping_and_unused_ones_are_let_go(tmp_path):
    path, data = _file(tmp_path, 12 * MB)
    spans = [(k * 2 * MB, (k + 1) * 2 * MB) for k in range(6)]
    s = Stager(path, spans, len(data), window=8 * MB)      # 2 buffers (of 4 MB: staging.ROUND)
    try:
        assert s.view(*spans[5]) is None        # 5 buffers past the reader, more than its window
        v = s.view(*spans[1])                   # the next but one: tensor 0 was read and never asked for
        assert np.array_equal(v, data[spans[1][0]:spans[1][1]])
        assert 0 not in s._ready
        s.release(v)
        for a, b in spans[2:5]:
            v = s.view(a, b)
            assert np.array_equal(v, data[a:b])
            s.release(v)
    finally:
        s.stop()


def _packed(path, threads):
    import llambda
    with llambda.load(path, backend="native", threads=threads, n_ctx=64) as m:
        arena = m.backend._weights
        return b"".join(bytes(m.mm) for m in arena._maps), np.array(m.logits([1, 2, 3]))


@pytest.mark.filterwarnings("ignore:3 threads")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_staged_load_packs_the_same_bytes_as_a_mapped_one(tmp_path, monkeypatch, threads):
    from llambda.formats import staging
    made = []
    real = staging.Stager.__init__
    monkeypatch.setattr(staging.Stager, "__init__", lambda self, *a, **k: (made.append(self), real(self, *a, **k))[1])
    path = _write_big_llama(tmp_path / "m.gguf", layers=2, d=512, ff=2048)     # 2048 x 512 Q8_0: > STAGE_MIN
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "0")       # a "big" file
    monkeypatch.setenv("LLAMBDA_STAGED_READ", "0")
    want = _packed(path, threads)
    assert not made
    monkeypatch.setenv("LLAMBDA_STAGED_READ", "1")
    got = _packed(path, threads)
    assert made and made[0].bytes_read >= 6 * 2048 * 512 * 34 // 32 and not made[0]._skip
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1])
    assert 2048 * 512 * 34 // 32 >= STAGE_MIN


def test_the_plan_counts_the_staging_buffers(tmp_path, monkeypatch):
    from llambda.formats import staging
    from llambda.formats.open import open_model
    from llambda.models.memory import plan
    path = _write_big_llama(tmp_path / "m.gguf", layers=2, d=512, ff=2048)
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "0")
    src = open_model(path)
    try:
        monkeypatch.setenv("LLAMBDA_STAGED_READ", "0")
        mapped = plan(src, 64).largest_tensor
        monkeypatch.setenv("LLAMBDA_STAGED_READ", "1")
        assert plan(src, 64).largest_tensor == mapped + staging.WINDOW + staging.ROUND
    finally:
        src.close()


def test_direct_reads_refused_fall_back_to_plain_reads(tmp_path, monkeypatch):
    import errno
    from llambda.formats import staging
    path, data = _file(tmp_path, 3 * MB)
    real = os.preadv
    def preadv(fd, bufs, pos):
        if fcntl_direct(fd):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, pos)
    def fcntl_direct(fd):
        import fcntl
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))
    monkeypatch.setattr(staging.os, "preadv", preadv)
    s = Stager(path, [(5, 2 * MB + 5)], len(data))
    try:
        v = s.view(5, 2 * MB + 5)
        assert np.array_equal(v, data[5:2 * MB + 5]) and not s.direct
    finally:
        s.stop()


@pytest.mark.filterwarnings("ignore:3 threads")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_an_arena_faulted_in_ahead_packs_the_same_bytes(tmp_path, monkeypatch, threads):
    from llambda.backends import weight_arena
    path = _write_big_llama(tmp_path / "m.gguf", layers=2, d=512, ff=2048)
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "0")
    plain = _packed(path, threads)                              # a small model: chunks as they come
    monkeypatch.setattr(weight_arena, "RESERVE_MIN", 0)         # reserved at once, as a big model is
    made = []
    real = weight_arena.Prefaulter.__init__
    monkeypatch.setattr(weight_arena.Prefaulter, "__init__", lambda self, *a, **k: (made.append(self), real(self, *a, **k))[1])
    monkeypatch.setenv("LLAMBDA_ARENA_PREFAULT", "0")
    want = _packed(path, threads)
    assert not made
    monkeypatch.setenv("LLAMBDA_ARENA_PREFAULT", "1")
    got = _packed(path, threads)
    assert made and made[0].done > 0 or not hasattr(native, "populate_write")
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[1], plain[1])

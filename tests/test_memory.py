"""Loading a big model holds the file's pages and the packed weights one tensor at a time, not both whole.

The file is mapped read-only; each matrix is packed into the backend's arena and its file pages are then
released from this process (formats/files.release_pages), so peak memory is about the weights once
(plus the KV cache and activations), not twice. Measured in a fresh process: its VmHWM (peak resident
set) after loading, against the interpreter's own before it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import TRAITS, QType

native = pytest.importorskip("llambda._native")


def _write_big_llama(path: Path, layers: int = 16, d: int = 1024, ff: int = 4096) -> Path:
    """A random Q8_0 llama of ~285 MB: random quant bytes with a small fp16 scale (one array per shape,
    written for every layer: the writer holds a layer's worth of memory, not the file's)."""
    rng = np.random.default_rng(0)
    tr = TRAITS[QType.Q8_0]
    shapes = {"attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_output": (d, d),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    raws = {}
    for name, (r, c) in shapes.items():
        raw = rng.integers(0, 256, (r * c // tr.block_size, tr.type_size), dtype=np.uint8)
        raw[:, :2] = np.array([0.001], np.float16).view(np.uint8)
        raws[name] = raw.reshape(-1)
    vocab = 256
    ones = np.ones(d, np.float32)
    items = [("token_embd.weight", QType.F32, rng.standard_normal((vocab, d)).astype(np.float32)),
             ("output_norm.weight", QType.F32, ones)]
    for i in range(layers):
        items += [(f"blk.{i}.attn_norm.weight", QType.F32, ones), (f"blk.{i}.ffn_norm.weight", QType.F32, ones)]
        items += [(f"blk.{i}.{n}.weight", QType.Q8_0, raws[n], shapes[n]) for n in shapes]
    meta = {"general.architecture": "llama", "llama.block_count": layers, "llama.embedding_length": d,
            "llama.feed_forward_length": ff, "llama.attention.head_count": 16, "llama.attention.head_count_kv": 16,
            "llama.context_length": 8192, "llama.rope.freq_base": 10000.0, "llama.vocab_size": vocab,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    write_gguf(path, meta, items)
    return path


_PROBE = r"""
import json, sys
import llambda

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
def mapped_rss(path):
    # resident bytes of this process's mappings of `path` (RssFile would count every shared library)
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and len(head[1]) == 4:     # a mapping's header line
                inside = len(head) >= 6 and line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total

before = status("VmRSS")
m = llambda.load(sys.argv[1], backend="native", threads=1, n_ctx=64, max_batch=16)
out = m.backend.weight_bytes
m.logits([1, 2, 3])
print(json.dumps({"before": before, "peak": status("VmHWM"), "file_rss": mapped_rss(sys.argv[1]), "weights": out}))
"""


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory):
    return _write_big_llama(tmp_path_factory.mktemp("big") / "big.gguf")


def test_loading_holds_the_weights_once_not_twice(big_gguf):
    file_bytes = big_gguf.stat().st_size
    assert file_bytes > 250e6
    res = subprocess.run([sys.executable, "-c", _PROBE, str(big_gguf.resolve())], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["weights"] > 0.95 * file_bytes          # every matrix was packed (Q8_0: the file's size)
    grown = r["peak"] - r["before"]
    # file + packed copy both resident would be ~2x the weights; once plus KV, activations and the
    # tokenizer-less source's bookkeeping stays well under 1.3x + 64 MB
    assert grown < 1.3 * r["weights"] + 64e6, (grown / 1e6, r["weights"] / 1e6)
    assert r["file_rss"] < 0.1 * file_bytes         # the file's pages left the process after packing


def test_release_only_touches_its_own_mapping(tmp_path):
    """release() of bytes outside the file's mapping (a copy, an anonymous array) does nothing: MADV_DONTNEED
    on anonymous memory would zero it."""
    path = _write_big_llama(tmp_path / "small.gguf", layers=1, d=256, ff=256)
    with GGUFFile(path) as f:
        t = f.tensors["blk.0.ffn_up.weight"]
        copy = np.array(t.data)
        assert f.release(copy) == 0 and np.array_equal(copy, t.data)
        before = bytes(t.data)
        assert f.release(t.data) >= t.nbytes           # whole pages around the tensor
        assert bytes(t.data) == before                 # read back from the file, unchanged
        assert f.release(t.data[:0]) == 0


def _mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of `path` (as _PROBE's mapped_rss)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and len(head[1]) == 4:
                inside = len(head) >= 6 and line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def _wait_for(cond, seconds=20.0):
    import time
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_read_ahead_reads_a_window_past_the_loader_and_holds_none_of_it(tmp_path):
    """The read-ahead thread reads the file in order up to a window past where the loader let go (its
    own pages dropped from the process again: the page cache holds them), waits there, follows the loader,
    and stops when told; the loader's bytes are the file's."""
    import mmap
    from llambda.formats.readahead import ReadAhead
    path = tmp_path / "blob.bin"
    payload = np.random.default_rng(0).integers(0, 256, 24 << 20, dtype=np.uint8)
    path.write_bytes(payload.tobytes())
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    base = np.frombuffer(mm, np.uint8)
    r = ReadAhead(mm, base, start=4096, window=4 << 20, chunk=1 << 20)
    try:
        assert _wait_for(lambda: r.bytes_read == 4 << 20)
        assert not _wait_for(lambda: r.bytes_read > 4 << 20, seconds=0.2)       # it waits for the loader
        r.advance(10 << 20)                    # the loader jumped ahead: reading goes on from there
        assert _wait_for(lambda: r.bytes_read == 8 << 20)
        assert _mapped_rss(path) < (1 << 20) + 8192       # at most the chunk being read
        assert np.array_equal(base[10 << 20:14 << 20], payload[10 << 20:14 << 20])
        r.advance(len(base))                   # the loader reached the end: nothing is left to read
        assert not _wait_for(lambda: r.bytes_read > 8 << 20, seconds=0.2)
    finally:
        r.stop()
    assert not r._runs.alive
    r.stop()                                   # idempotent
    del base
    mm.close()


def test_a_load_reads_ahead_only_while_it_loads(tmp_path):
    import llambda
    path = _write_big_llama(tmp_path / "small.gguf", layers=2, d=256, ff=512)
    with llambda.load(path, backend="native", threads=1, n_ctx=64) as m:
        (f,) = m.source.readers
        assert not f.reading_ahead             # stopped once every tensor was packed
        with m.source.reading_ahead():
            assert f.reading_ahead
        assert not f.reading_ahead


def test_populate_pages_a_mapping_in(tmp_path):
    import mmap
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x01" * (1 << 20))
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    base = np.frombuffer(mm, np.uint8)
    assert native.populate(base[100:200_000]) in (0, 1)       # 1: a kernel before 5.14 only reads ahead
    assert native.populate(base[:0]) == 0
    with pytest.raises(TypeError):
        native.populate(12)
    del base
    mm.close()


def test_the_plan_is_what_the_load_allocates(tmp_path):
    import llambda
    path = _write_big_llama(tmp_path / "small.gguf", layers=2, d=256, ff=512)
    with llambda.load(path, backend="native", threads=1, n_ctx=128, n_slots=2, kv_type="f16") as m:
        p, got = m.memory_plan, m.memory_report()
        assert p.kv_cache == got["kv_cache"] == 2 * 2 * 256 * 2 * 128 * 2    # k+v x layers x kv_dim x f16 x ctx x slots
        assert p.kv_per_token == 2 * 2 * 256 * 2
        assert p.activations == got["activations"]
        assert 0.95 * got["weights"] <= p.weights <= 1.05 * got["weights"]
        assert p.total == p.weights + p.kv_cache + p.activations
        assert any("KV cache" in line for line in p.lines())
    wide = _write_big_llama(tmp_path / "wide.gguf", layers=2, d=512, ff=512)     # head_dim 32: q8_0 blocks
    with llambda.load(wide, backend="native", threads=1, n_ctx=128, n_slots=2, kv_type="q8_0") as m:
        p, got = m.memory_plan, m.memory_report()
        base = 2 * 512 * 4 * 2                                # layers x kv_dim x f32 x slots: the key bases
        assert p.kv_cache == got["kv_cache"] == 2 * 2 * 512 * 34 // 32 * 128 * 2 + base
        assert p.activations == got["activations"]
    with llambda.load(path, backend="native", threads=1, n_ctx=64, quantize="q4_0") as m:   # the F32 embeddings
        got = m.memory_report()["weights"]
        assert 0.95 * got <= m.memory_plan.weights <= 1.05 * got


def test_a_load_that_cannot_fit_is_refused_before_reading_weights(tmp_path, monkeypatch):
    import llambda
    from llambda.models import memory
    from llambda.errors import InsufficientMemoryError
    from llambda.models import base
    path = _write_big_llama(tmp_path / "small.gguf", layers=2, d=256, ff=512)
    monkeypatch.setattr(memory, "mem_available", lambda: 12 << 20)
    monkeypatch.setattr(base.Transformer, "_load", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(InsufficientMemoryError, match=r"context of at most \d+ tokens .*f16"):
        llambda.load(path, backend="native", threads=1, n_ctx=4096)
    with pytest.raises(InsufficientMemoryError, match="weights and activations alone do not fit"):
        monkeypatch.setattr(memory, "mem_available", lambda: 1 << 20)
        llambda.load(path, backend="native", threads=1, n_ctx=64)


def test_too_many_slots_are_named_with_the_count_that_fits(tmp_path, monkeypatch, capsys):
    # `llambda serve --parallel 100000` said "a context of at most 1 tokens would fit", nothing of the slots
    import llambda
    from llambda.cli import main
    from llambda.errors import InsufficientMemoryError
    from llambda.models import base, memory
    path = _write_big_llama(tmp_path / "small.gguf", layers=2, d=256, ff=512)
    monkeypatch.setattr(memory, "mem_available", lambda: 12 << 20)
    monkeypatch.setattr(base.Transformer, "_load", lambda *a: pytest.fail("weights were read"))
    with pytest.raises(InsufficientMemoryError) as e:
        llambda.load(path, backend="native", threads=1, n_ctx=512, n_slots=100_001)
    assert "no context fits with 100001 slots; at 512 tokens, at most 2 slots (n_slots) would fit" in str(e.value)
    assert "tokens (-c/n_ctx) would fit" not in str(e.value) and e.value.slots_fit == 2
    monkeypatch.undo()       # 2 slots of 512 tokens do load: the count is not a guess
    monkeypatch.setattr(memory, "mem_available", lambda: 12 << 20)
    llambda.load(path, backend="native", threads=1, n_ctx=512, n_slots=2).close()
    with pytest.raises(InsufficientMemoryError):
        llambda.load(path, backend="native", threads=1, n_ctx=512, n_slots=3)
    assert main(["serve", "-m", str(path), "--backend", "native", "-t", "1", "-c", "512", "--kv-type", "f32",
                 "--port", "0", "--parallel", "100000"]) == 1
    err = capsys.readouterr().err
    assert "--parallel 100000 asks for 100001 slots" in err and "at most --parallel 1 would fit" in err, err


def test_show_sizes_the_kv_cache_it_is_asked_for(tmp_path):
    """`llambda show --kv-type` (describe) sizes the cache in that type: f16 half of f32, q8_0 34/32 of a byte."""
    from llambda.formats.open import open_model
    from llambda.tools.model_info import describe
    path = _write_big_llama(tmp_path / "wide.gguf", layers=2, d=512, ff=512)
    src = open_model(path)
    try:
        sizes = {t: describe(src, 128, t)["kv_cache_bytes"] for t in ("f32", "f16", "q8_0")}
    finally:
        src.close()
    assert sizes == {"f32": 2 * 2 * 128 * 512 * 4, "f16": 2 * 2 * 128 * 512 * 2, "q8_0": 2 * 2 * 128 * 512 * 34 // 32}


def test_the_plan_counts_an_moe_layers_experts_held_together(tmp_path):
    """An MoE layer's gate, up and down experts are let go of once all three are packed: the plan's peak
    while loading holds all three (and the read-ahead's chunk), not the largest tensor alone."""
    from llambda.formats.open import open_model
    from llambda.formats.quants import tensor_nbytes
    from llambda.formats.readahead import CHUNK
    from llambda.models import memory
    from llambda.tools.export import export
    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "qwen3_moe"
    path = export(str(tiny), tmp_path / "m.gguf", fmt="gguf", qtype="f32")
    src = open_model(Path(path))
    try:
        blk = next(n.split(".ffn_")[0] for n in src.tensor_names if "_exps." in n)     # (layer 0 may be dense)
        layer = sum(tensor_nbytes(t.qtype, t.shape) for t in (src.tensor(f"{blk}.ffn_{w}_exps.weight")
                                                               for w in ("gate", "up", "down")))
        p = memory.plan(src, 64)
        assert p.largest_tensor >= layer + CHUNK
        assert "paged in as it is packed" in p.lines()[0]
    finally:
        src.close()


def test_the_read_ahead_follows_the_loaders_order_not_the_files():
    """llama.cpp's quantizer writes blk.0, blk.1, blk.10, ..., blk.2, ... and the head first or last: the
    read-ahead reads the tensors outside the layers first, then layer by layer, neighbours joined."""
    from llambda.formats.readahead import load_order
    k = 1 << 20        # tensors far apart: closer ones are read as one range
    spans = [("output.weight", 0, 100), ("blk.0.a", 100, 200), ("blk.0.b", 200, 300), ("blk.10.a", 300, 400),
             ("blk.2.a", 400, 500), ("token_embd.weight", 500, 600), ("model.layers.1.mlp.w", 600, 700),
             ("blk.3.empty", 700, 700)]
    spans = [(name, lo * k, hi * k) for name, lo, hi in spans]
    want = [(0, 100), (500, 600), (100, 300), (600, 700), (400, 500), (300, 400)]
    assert load_order(spans) == [(lo * k, hi * k) for lo, hi in want]


def test_the_read_ahead_reads_ranges_in_order_and_maps_the_loaders_offsets(tmp_path):
    import mmap
    from llambda.formats.readahead import ReadAhead
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(16 << 20))
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    base = np.frombuffer(mm, np.uint8)
    mb = 1 << 20
    r = ReadAhead(mm, base, window=3 * mb, chunk=mb, ranges=[(8 * mb, 12 * mb), (0, 4 * mb), (12 * mb, 16 * mb)])
    try:
        assert _wait_for(lambda: r.bytes_read == 3 * mb)
        assert list(r._pieces(3 * mb, 6 * mb)) == [(11 * mb, 12 * mb), (0, 2 * mb)]
        assert r._order_pos(10 * mb) == 2 * mb and r._order_pos(2 * mb) == 6 * mb and r._order_pos(16 * mb) == 12 * mb
        r.advance(2 * mb)                      # the loader is 6 MB into the order: reading goes on from there
        assert _wait_for(lambda: r.bytes_read == 6 * mb)
        r.advance(9 * mb)                      # an offset behind the loader's position moves nothing back
        assert not _wait_for(lambda: r.bytes_read > 6 * mb, seconds=0.2)
    finally:
        r.stop()
    del base
    mm.close()


def test_packed_tensors_leave_the_page_cache(tmp_path, monkeypatch):
    """A load of a big file (forced here by LLAMBDA_KEEP_FILE_CACHE=0) drops each packed tensor's file pages
    from the page cache (the arena reuses that memory), joined with its released neighbours so that folios
    straddling two tensors go too; LLAMBDA_KEEP_FILE_CACHE=1 keeps them."""
    import llambda
    from llambda.formats import pagecache
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "0")
    calls = []
    real = pagecache.PageCacheDropper._advise
    monkeypatch.setattr(pagecache.PageCacheDropper, "_advise",
                        lambda self, off, n: (calls.append((off, n)), real(self, off, n)))
    path = _write_big_llama(tmp_path / "small.gguf", layers=2, d=256, ff=512)
    with llambda.load(path, backend="native", threads=1, n_ctx=64) as m:
        f = m.source.readers[0]
        spans = sorted((lo, hi) for _, lo, hi in f._spans())
        assert calls and calls[-1][1] == 0              # at the end: every cached page of the file
        dropped = [c for c in calls[:-1]]
        lo, hi = min(c[0] for c in dropped), max(c[0] + c[1] for c in dropped)
        assert lo <= spans[0][0] and hi >= spans[-1][1]  # every tensor's bytes asked to go
        before = m.logits([1, 2, 3])
    calls.clear()
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "1")
    with llambda.load(path, backend="native", threads=1, n_ctx=64) as m:
        assert not calls
        assert np.array_equal(m.logits([1, 2, 3]), before)


def test_only_big_files_leave_the_page_cache(monkeypatch):
    """By default the page cache is dropped only for a file above a quarter of the memory available (a small
    model's next load then reads no disk); the environment variable overrides both ways."""
    from llambda.formats.pagecache import BIG, should_drop
    monkeypatch.delenv("LLAMBDA_KEEP_FILE_CACHE", raising=False)
    gb = 1 << 30
    assert not should_drop(1 * gb, 20 * gb)
    assert should_drop(int(BIG * 20 * gb) + 1, 20 * gb)
    assert not should_drop(17 * gb, None)             # the kernel does not say: keep
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "1")
    assert not should_drop(17 * gb, 20 * gb)
    monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", "0")
    assert should_drop(1, 20 * gb)


def test_the_page_cache_dropper_joins_released_ranges(tmp_path):
    from llambda.formats.pagecache import GAP, MARGIN, PageCacheDropper
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(64 << 20))
    d = PageCacheDropper(path)
    asked = []
    d._advise = lambda off, n: asked.append((off, off + n))
    mb = 1 << 20
    d.drop(10 * mb, 20 * mb)
    d.drop(20 * mb + 32, 30 * mb)                  # alignment padding between: joined, the drop reaches back
    d.drop(40 * mb, 41 * mb)                       # a gap: a range of its own
    d.drop(30 * mb + GAP, 40 * mb)                 # fills the gap: one range again
    assert asked == [(10 * mb, 20 * mb), (20 * mb + 32 - MARGIN, 30 * mb), (40 * mb, 41 * mb),
                     (30 * mb + GAP - MARGIN, 41 * mb)]
    assert (d._lo, d._hi) == ([10 * mb], [41 * mb])
    d.close()


@pytest.mark.parametrize("family", ["lfm2", "qwen3_next", "granitemoehybrid"])
def test_the_plan_counts_a_hybrid_models_recurrent_state(family):
    """A short-conv or delta-net layer's state per slot is in the plan (and its total), equal to what the load
    allocates, and writing all of it grows the resident set by that much (within 10% + 4 MB)."""
    import llambda
    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / family
    with llambda.load(str(tiny), backend="native", threads=1, n_ctx=16, n_slots=1024) as m:
        p, got = m.memory_plan, m.memory_report()
        assert p.recurrent > 0 and p.recurrent == got["recurrent"]
        assert p.kv_cache == got["kv_cache"] and p.activations == got["activations"]
        assert p.total == p.weights + p.kv_cache + p.recurrent + p.activations
        assert any(line.startswith("recurrent state") for line in p.lines())

    # the resident set's growth measured in a fresh process: in this one, memory freed by earlier tests
    # comes back already resident (the growth read 0 in a full suite)
    code = f"""
import os, llambda
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
with llambda.load({str(tiny)!r}, backend="native", threads=1, n_ctx=16, n_slots=1024) as m:
    before = rss()
    for a in m.transformer.cache.state:
        a.fill(1)
    print(rss() - before)
"""
    grown = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               timeout=120).stdout.split()[-1])
    # slack of two 2 MB pages: transparent huge pages back the arrays' first and last megabytes whole
    # (a clean venv read 4 MB for LFM2's 1.5 MB)
    assert 0.9 * p.recurrent - (4 << 20) <= grown <= 1.1 * p.recurrent + (4 << 20), (grown, p.recurrent)


@pytest.mark.parametrize("activations", [None, "f32"])
def test_an_encoders_plan_is_what_its_load_allocates(tmp_path, activations):
    """An encoder (BERT) has a plan too (--verbose prints it): its dense layers as the native backend keeps
    them (bfloat16 in the fast mode, float32 exact), its float32 embeddings, no KV cache."""
    import llambda
    from test_embeddings import _tiny_bert_dir
    path, _, _ = _tiny_bert_dir(tmp_path, classifier=True)
    with llambda.load(path, backend="native", threads=1, activations=activations) as m:
        p, enc = m.memory_plan, m.encoder
        emb = sum(a.nbytes for a in (enc.word, enc.pos, enc.types))
        dense = m.memory_report()["weights"]
        assert 0.95 * (emb + dense) <= p.weights <= 1.05 * (emb + dense) + (64 << 10)
        assert p.activations > 0 and p.total == p.weights + p.activations
        assert any("no KV cache" in line for line in p.lines())
        assert ("float32" if activations else "bfloat16") in p.lines()[0]


@pytest.mark.parametrize("qtype", ["TQ2_0", "F64"])
def test_show_verbose_prints_the_plan_of_the_default_backends_load(tmp_path, capsys, qtype):
    """`llambda show -v` planned without a backend: the matrices the native one converts (TQ2_0 to Q8_0, F64
    to F32) were counted at the file's size, not what the load it describes keeps."""
    import llambda
    from llambda.cli import main
    path = _llama_of_type(tmp_path, qtype)
    assert main(["show", "-v", "-c", "32", str(path)]) == 0
    printed = capsys.readouterr().out.split("memory plan (native backend):\n", 1)[1].splitlines()
    with llambda.load(path, threads=1, n_ctx=32) as m:
        assert m.backend.name == "native"
        want = m.memory_plan.lines()
    assert [line.strip() for line in printed[:-1]] == want[:-1]     # (the total's line says MemAvailable now)


def test_show_verbose_prints_an_encoders_plan(tmp_path, capsys):
    from llambda.cli import main
    from test_embeddings import _tiny_bert_dir
    path, _, _ = _tiny_bert_dir(tmp_path)
    assert main(["show", "-v", str(path)]) == 0
    out = capsys.readouterr().out
    assert "memory plan" in out and "no KV cache" in out


@pytest.mark.parametrize("folder, has_dense", [("qwen2_moe", False), ("mixtral", False), ("gpt_oss", False),
                                               ("qwen3_moe", True)])
def test_a_model_without_dense_layers_plans_no_dense_mlp_buffers(folder, has_dense):
    """The gate and up activations were sized by feed_forward_length even where every layer is MoE (Qwen2-MoE's
    is 4x its experts' width): planned and allocated, never used. Only a model with a dense layer has them."""
    import llambda
    from llambda.models.base import Workspace
    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / folder
    tokens = 256
    with llambda.load(str(tiny), backend="native", threads=1, n_ctx=32, max_batch=tokens) as m:
        cfg, p, be = m.config, m.memory_plan, m.transformer.backend
        assert p.activations == m.memory_report()["activations"]
        assert ("gate" in m.transformer.ws.specs) == has_dense
        every_buffer = Workspace(cfg, tokens, 16, be.workspace_specs(cfg, tokens)).nbytes()
        assert p.activations == every_buffer - (0 if has_dense else 2 * tokens * cfg.ffn_dim * 4)
        assert np.isfinite(m.logits([1, 2, 3])).all()


def _llama_of_type(tmp_path: Path, qtype: str) -> Path:
    """A one-layer random llama GGUF whose matrices are all `qtype`."""
    from llambda.formats.quants import random_blocks
    rng = np.random.default_rng(0)
    d, ff, vocab = 256, 512, 256
    q = QType[qtype]

    def w(*shape):
        if q == QType.F64:
            return q, (rng.standard_normal(shape) * 0.05).astype(np.float64).view(np.uint8).reshape(-1), shape
        return q, random_blocks(rng, q, shape[0] * shape[1] // TRAITS[q].block_size).reshape(-1), shape

    ones = (QType.F32, np.ones(d, np.float32))
    meta = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": d,
            "llama.feed_forward_length": ff, "llama.attention.head_count": 4, "llama.context_length": 64,
            "llama.vocab_size": vocab}
    tensors = {"token_embd.weight": w(vocab, d), "output_norm.weight": ones, "blk.0.attn_norm.weight": ones,
               "blk.0.ffn_norm.weight": ones, "blk.0.attn_q.weight": w(d, d), "blk.0.attn_k.weight": w(d, d),
               "blk.0.attn_v.weight": w(d, d), "blk.0.attn_output.weight": w(d, d), "blk.0.ffn_gate.weight": w(ff, d),
               "blk.0.ffn_up.weight": w(ff, d), "blk.0.ffn_down.weight": w(d, ff)}
    path = tmp_path / f"{qtype}.gguf"
    write_gguf(path, meta, tensors)
    return path


@pytest.mark.parametrize("qtype", ["TQ2_0", "F64"])
def test_the_plan_counts_what_the_native_backend_converts_a_type_into(tmp_path, qtype):
    """The weights of a type the C core does not run are converted at load (TQ2_0's 2 bits to Q8_0's 8.5, F64 to
    F32): the plan counted the file's bytes, a quarter of what TQ2_0 matrices then took (a load the check let
    through could run out of memory), twice what F64 ones did."""
    import llambda
    path = _llama_of_type(tmp_path, qtype)
    with llambda.load(path, backend="native", threads=1, n_ctx=32) as m:
        got = m.memory_report()["weights"]
        assert 0.95 * got <= m.memory_plan.weights <= 1.05 * got, (m.memory_plan.weights, got)

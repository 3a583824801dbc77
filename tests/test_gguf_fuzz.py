"""Corrupted GGUF files: every mutation must end in ModelFormatError (or load, if harmless),
fast, and a file that loads must be internally consistent.

The 1 s bound per case is a correctness bound (a length of 2**63 must fail fast, not
allocate or loop), not a benchmark: a parse of this file takes well under 1 ms.
"""
import struct
import time

import numpy as np
import pytest

from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType as VT
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.quants import DEQUANTIZABLE, QType

CASE_SECONDS = 1.0
SCALAR_SIZES = {VT.UINT8: 1, VT.INT8: 1, VT.UINT16: 2, VT.INT16: 2, VT.UINT32: 4, VT.INT32: 4,
                VT.FLOAT32: 4, VT.BOOL: 1, VT.UINT64: 8, VT.INT64: 8, VT.FLOAT64: 8}


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("fuzz") / "valid.gguf"
    meta = {
        "general.architecture": "llama",
        "general.name": "fuzz ☃",
        "llama.block_count": 2,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": GGUFValue(VT.FLOAT64, 1e-5),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": ["<s>", "a", "bc", "ü", ""],
        "tokenizer.ggml.scores": [0.0, -1.0, -2.5, -3.0, -4.0],
        "tokenizer.ggml.token_type": GGUFValue((VT.ARRAY, VT.INT32), [3, 1, 1, 1, 1]),
        "general.tags": [["x", "y"], ["z"]],
        "general.alignment": 32,
    }
    tensors = {
        "token_embd.weight": (QType.Q8_0, rng.standard_normal((5, 64))),
        "blk.0.attn_norm.weight": (QType.F32, rng.standard_normal(64)),
        "blk.0.ffn_up.weight": (QType.Q4_K, rng.standard_normal((2, 256))),
    }
    write_gguf(path, meta, tensors)
    data = path.read_bytes()
    with GGUFFile(path) as f:
        data_end = max(t.offset + t.nbytes for t in f.tensors.values())
        return data, f.data_offset, data_end


class Fields:
    """Byte offsets of every field of a header, found by an independent minimal walk."""

    def __init__(self, data: bytes):
        self.lengths = [8, 16]  # u64 counts and lengths (tensor count, kv count, ...)
        self.value_types, self.element_types = [], []
        self.n_dims, self.dims, self.tensor_types, self.tensor_offsets = [], [], [], []
        self.data, self.pos = data, 24
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        for _ in range(n_kv):
            self._string()
            self.value_types.append(self.pos)
            self._value(self._u32())
        for _ in range(n_tensors):
            self._string()
            self.n_dims.append(self.pos)
            n = self._u32()
            for _ in range(n):
                self.dims.append(self.pos)
                self.pos += 8
            self.tensor_types.append(self.pos)
            self.pos += 4
            self.tensor_offsets.append(self.pos)
            self.pos += 8
        self.header_end = self.pos

    def _u32(self):
        self.pos += 4
        return struct.unpack_from("<I", self.data, self.pos - 4)[0]

    def _u64(self):
        self.pos += 8
        return struct.unpack_from("<Q", self.data, self.pos - 8)[0]

    def _string(self):
        self.lengths.append(self.pos)
        n = self._u64()
        self.pos += n

    def _value(self, vtype):
        if vtype == VT.STRING:
            self._string()
        elif vtype == VT.ARRAY:
            self.element_types.append(self.pos)
            etype = self._u32()
            self.lengths.append(self.pos)
            for _ in range(self._u64()):
                self._value(etype)
        else:
            self.pos += SCALAR_SIZES[VT(vtype)]


def check_consistent(f: GGUFFile) -> None:
    """What a successfully opened file promises its users."""
    for t in f.tensors.values():
        assert t.data.size == t.nbytes
        assert f.data_offset <= t.offset and t.offset + t.nbytes <= f.file_size
        assert t.offset % f.alignment == 0
        assert t.rows2d().shape[0] == t.nrows
        if t.qtype in DEQUANTIZABLE:
            with np.errstate(all="ignore"):
                assert t.as_float32().shape == t.shape
    for key in f.metadata:
        assert isinstance(key, str) and key in f.metadata_types


class Runner:
    def __init__(self, tmp_path):
        self.tmp, self.n, self.loaded = tmp_path, 0, 0

    def __call__(self, data: bytes, label: str, must_fail: bool = False) -> None:
        self.n += 1
        path = self.tmp / f"case{self.n}.gguf"
        path.write_bytes(data)
        start = time.perf_counter()
        try:
            with GGUFFile(path) as f:
                check_consistent(f)
            ok = True
        except ModelFormatError as e:
            ok = False
            assert str(e), label
        except Exception as e:  # anything else is a bug in the reader
            pytest.fail(f"{label}: {type(e).__name__}: {e}")
        finally:
            path.unlink()
        elapsed = time.perf_counter() - start
        assert elapsed < CASE_SECONDS, f"{label}: took {elapsed:.2f}s"
        assert not (must_fail and ok), f"{label}: loaded but must fail"
        self.loaded += ok


def put_u64(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<Q", value) + data[at + 8:]


def put_u32(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<I", value) + data[at + 4:]


def test_walker_sees_the_whole_header(valid_file):
    data, data_offset, _ = valid_file
    fields = Fields(data)
    assert fields.header_end <= data_offset < fields.header_end + 32
    assert len(fields.tensor_types) == 3 and len(fields.value_types) == 11


def test_truncation(valid_file, tmp_path):
    data, data_offset, data_end = valid_file
    run = Runner(tmp_path)
    rng = np.random.default_rng(1)
    cuts = list(range(data_offset + 1)) + sorted(rng.integers(data_offset, len(data), 60).tolist())
    for cut in cuts:
        # Anything short of the last tensor's bytes is broken; trailing padding is not.
        run(data[:cut], f"truncated at {cut}", must_fail=cut < data_end)
    run(data, "untouched")
    assert run.loaded >= 1


HUGE = [2**63, 2**64 - 1, 2**63 - 1, 2**32, 2**32 + 32, 2**31, 2**40]


def test_huge_lengths_and_counts(valid_file, tmp_path):
    data, _, _ = valid_file
    fields = Fields(data)
    run = Runner(tmp_path)
    for at in fields.lengths + fields.dims + fields.tensor_offsets:
        for value in HUGE:
            run(put_u64(data, at, value), f"u64 at {at} = {value}", must_fail=True)
        for value in (0, 1, 31, len(data)):
            run(put_u64(data, at, value), f"u64 at {at} = {value}")  # may be harmless
    for at in fields.n_dims:
        for value in (0, 5, 255, 2**31, 2**32 - 1):
            run(put_u32(data, at, value), f"n_dims at {at} = {value}", must_fail=True)
    for value in (0, 1, 4, 2**32 - 1):
        run(put_u32(data, 4, value), f"version = {value}", must_fail=True)


def test_unknown_types(valid_file, tmp_path):
    data, _, _ = valid_file
    fields = Fields(data)
    run = Runner(tmp_path)
    for at in fields.value_types + fields.element_types:
        for value in (13, 255, 2**31, 2**32 - 1):
            run(put_u32(data, at, value), f"value type at {at} = {value}", must_fail=True)
    for at in fields.tensor_types:
        for value in (4, 5, 31, 32, 33, 36, 99, 2**32 - 1):
            run(put_u32(data, at, value), f"tensor type at {at} = {value}", must_fail=True)
        for qtype in QType:  # known types: a valid file or a clean error, never a crash
            run(put_u32(data, at, int(qtype)), f"tensor type at {at} = {qtype.name}")


def test_random_byte_flips(valid_file, tmp_path):
    data, data_offset, _ = valid_file
    run = Runner(tmp_path)
    rng = np.random.default_rng(1234)
    for i in range(2000):
        mutated = bytearray(data)
        span = data_offset if i % 5 else len(data)  # mostly the header, sometimes anywhere
        for _ in range(int(rng.integers(1, 5))):
            mutated[int(rng.integers(0, span))] = int(rng.integers(0, 256))
        run(bytes(mutated), f"flip case {i}")
    # Sanity of the harness: some flips (in padding, in values) must be harmless.
    assert 0 < run.loaded < 2000

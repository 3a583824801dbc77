"""GGUF reader and writer: round trips, the gguf package as a second reader, real files,
and one hand-made file per validation rule."""
import filecmp
import struct

import numpy as np
import pytest

from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType as VT, TensorInfo
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.quants import QType, dequantize, quantize

U64 = 2**64 - 1


# ---------------------------------------------------------------- hand-made files

def gstr(s) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def u32kv(key, v):
    return kv(key, VT.UINT32, struct.pack("<I", v))


def tinfo(name, ne, qtype=QType.F32, offset=0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
            + struct.pack("<IQ", qtype, offset))


def gguf_bytes(kvs=(), infos=(), data=b"", version=3, n_kv=None, n_tensors=None, alignment=32):
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(infos)
    return head + b"\0" * ((-len(head)) % alignment) + data


@pytest.fixture
def put(tmp_path):
    """Write bytes to a fresh file, return its path."""
    counter = iter(range(10**6))

    def _put(data: bytes):
        p = tmp_path / f"f{next(counter)}.gguf"
        p.write_bytes(data)
        return p
    return _put


def test_minimal_hand_made_file(put):
    data = np.arange(8, dtype="<f4").tobytes()
    p = put(gguf_bytes([u32kv("a.b", 7)], [tinfo("w", (4, 2))], data))
    with GGUFFile(p) as f:
        assert f.version == 3 and f.metadata == {"a.b": 7} and f.metadata_types == {"a.b": VT.UINT32}
        t = f.tensors["w"]
        assert (t.shape, t.ne, t.qtype, t.nbytes) == ((2, 4), (4, 2), QType.F32, 32)
        assert t.offset == f.data_offset and f.data_offset % 32 == 0
        np.testing.assert_array_equal(t.as_float32(), np.arange(8).reshape(2, 4))


BAD_FILES = {
    "bad magic": (b"GGML" + b"\0" * 40, "not a GGUF file"),
    "version 1": (gguf_bytes(version=1), "version 1 is not supported"),
    "version 4": (gguf_bytes(version=4), "version 4 is not supported"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "tensor count 2^63": (gguf_bytes(n_tensors=2**63), "tensor count 9223372036854775808"),
    "tensor count 2^32": (gguf_bytes(n_tensors=2**32), "tensor count"),
    "kv count 2^64-1": (gguf_bytes(n_kv=U64), "key/value count"),
    "kv count too big": (gguf_bytes([u32kv("a", 1)], n_kv=3), "key/value count 3"),
    "kv count one too many": (gguf_bytes([u32kv("a", 1)], n_kv=2), "metadata key 1 is empty"),
    "key length 2^63": (gguf_bytes([struct.pack("<Q", 2**63) + b"abcdefgh"]),
                        "metadata key 0: string length 9223372036854775808"),
    "value length 2^64-1": (gguf_bytes([kv("k", VT.STRING, struct.pack("<Q", U64))]),
                            "metadata key 'k': string length 18446744073709551615"),
    "array length 2^63": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.UINT8, 2**63))]),
                          "metadata key 'k': array length 9223372036854775808"),
    "string array length": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**40))]),
                            "array length 1099511627776"),
    "string in array past end": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2)
                                                + gstr("ok") + struct.pack("<Q", 2**32))]),
                                 r"metadata key 'k'\[1\]: string length 4294967296"),
    "unknown value type": (gguf_bytes([kv("k", 13, b"\0" * 8)]), "metadata key 'k': unknown value type 13"),
    "unknown element type": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", 99, 1) + b"\0" * 8)]),
                             "unknown value type 99"),
    "bool 2": (gguf_bytes([kv("k", VT.BOOL, b"\x02")]), "bool value 2"),
    "bool array 7": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.BOOL, 2) + b"\x01\x07")]),
                     r"k'\[1\]: bool value 7"),
    "utf-8 key": (gguf_bytes([u32kv(b"a\xffb", 1)]), "metadata key 0: string is not valid UTF-8"),
    "utf-8 value": (gguf_bytes([kv("k", VT.STRING, gstr(b"\xc3("))]), "key 'k': string is not valid UTF-8"),
    "utf-8 in array": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2) + gstr("a")
                                      + gstr(b"\xed\xa0\x80"))]), r"'k'\[1\]: string is not valid UTF-8"),
    "nesting": (gguf_bytes([kv("k", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) * 9
                               + struct.pack("<IQ", VT.UINT8, 0))]), "nested deeper than 8"),
    "duplicate key": (gguf_bytes([u32kv("k", 1), u32kv("k", 2)]), "metadata key 'k' appears twice"),
    "empty key": (gguf_bytes([u32kv("", 1)]), "metadata key 0 is empty"),
    "alignment 0": (gguf_bytes([u32kv("general.alignment", 0)]), "'general.alignment' = 0 is not"),
    "alignment 48": (gguf_bytes([u32kv("general.alignment", 48)]), "'general.alignment' = 48 is not"),
    "alignment float": (gguf_bytes([kv("general.alignment", VT.FLOAT32, struct.pack("<f", 32))]),
                        "'general.alignment' must be an integer"),
    "tensor type 4": (gguf_bytes(infos=[tinfo("blk.0.w", (32,), 4)]), "tensor 'blk.0.w': unknown tensor type 4"),
    "tensor type 2^32-1": (gguf_bytes(infos=[tinfo("w", (32,), 2**32 - 1)]), "unknown tensor type 4294967295"),
    "n_dims 0": (gguf_bytes(infos=[tinfo("w", ())]), "tensor 'w': n_dims 0 is not between 1 and 4"),
    "n_dims 5": (gguf_bytes(infos=[tinfo("w", (1, 1, 1, 1, 1))]), "n_dims 5"),
    "n_dims 2^31": (gguf_bytes(infos=[gstr("w") + struct.pack("<I", 2**31) + b"\0" * 40]), "n_dims 2147483648"),
    "negative dim": (gguf_bytes(infos=[tinfo("w", (4, 2**63))]), r"ne\[1\] = 9223372036854775808 is negative"),
    "dims overflow": (gguf_bytes(infos=[tinfo("w", (2**32, 2**32, 2))]), "overflows 64 bits"),
    "row not whole blocks": (gguf_bytes(infos=[tinfo("w", (33, 2), QType.Q8_0)], data=b"\0" * 100),
                             r"ne\[0\] = 33 is not a multiple of the Q8_0 block size 32"),
    "misaligned offset": (gguf_bytes(infos=[tinfo("w", (4,), offset=16)], data=b"\0" * 64),
                          "tensor 'w': offset 16 is not a multiple of the alignment 32"),
    "offset past end": (gguf_bytes(infos=[tinfo("blk.0.attn_q.weight", (4,), offset=2**40)], data=b"\0" * 16),
                        r"tensor 'blk.0.attn_q.weight': data at offset \d+ \+ 16 bytes runs past end of file"),
    "offset 2^64-32": (gguf_bytes(infos=[tinfo("w", (4,), offset=2**64 - 32)], data=b"\0" * 16),
                       "runs past end of file"),
    "size past end": (gguf_bytes(infos=[tinfo("w", (64, 64))], data=b"\0" * 64), "runs past end of file"),
    "overlap": (gguf_bytes(infos=[tinfo("a", (16,)), tinfo("b", (8,), offset=32)], data=b"\0" * 96),
                "tensor 'b': data overlaps tensor 'a'"),
    "duplicate tensor": (gguf_bytes(infos=[tinfo("a", (8,)), tinfo("a", (8,), offset=32)], data=b"\0" * 64),
                         "tensor 'a' appears twice"),
    "empty tensor name": (gguf_bytes(infos=[tinfo("", (8,))], data=b"\0" * 32), "tensor 0 has an empty name"),
    "utf-8 tensor name": (gguf_bytes(infos=[tinfo(b"\x80", (8,))], data=b"\0" * 32),
                          "tensor 0 name: string is not valid UTF-8"),
    "truncated tensor info": (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + tinfo("w", (8, 8))[:-4],
                              "tensor 'w': offset: needs 8 bytes at offset 57, but only 4 remain"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_invalid_file_raises_naming_the_field(case, put):
    data, pattern = BAD_FILES[case]
    with pytest.raises(ModelFormatError, match=pattern):
        GGUFFile(put(data))


def test_empty_directory_and_missing_files(tmp_path, put):
    with pytest.raises(ModelFormatError, match="0 bytes is too small"):
        GGUFFile(put(b""))
    with pytest.raises(ModelFormatError, match="too small"):
        GGUFFile(put(b"GGUF\x03\0\0\0"))
    with pytest.raises(ModelFormatError, match="is a directory"):
        GGUFFile(tmp_path)
    with pytest.raises(FileNotFoundError):
        GGUFFile(tmp_path / "nope.gguf")


def test_accepts_what_the_rules_allow(put):
    # nested arrays, integer alignment of another width, zero-size tensors, v2
    nested = struct.pack("<IQ", VT.ARRAY, 2) + struct.pack("<IQ", VT.INT8, 2) + b"\x01\xff" \
        + struct.pack("<IQ", VT.STRING, 1) + gstr("x")
    kvs = [kv("n", VT.ARRAY, nested), kv("general.alignment", VT.UINT64, struct.pack("<Q", 64))]
    infos = [tinfo("empty", (32, 0), QType.Q8_0), tinfo("w", (2,), QType.F32)]
    p = put(gguf_bytes(kvs, infos, b"\0" * 8, version=2, alignment=64))
    with GGUFFile(p) as f:
        assert f.version == 2 and f.alignment == 64 and f.data_offset % 64 == 0
        assert f.metadata["n"] == [[1, -1], ["x"]]
        assert f.metadata_types["n"] == (VT.ARRAY, VT.ARRAY)  # inner types differ
        assert f.tensors["empty"].nbytes == 0 and f.tensors["empty"].rows2d().shape == (0, 34)
        assert f.tensors["w"].as_float32().tolist() == [0.0, 0.0]


def test_arrays_nested_in_arrays_are_bounded(put):
    """Each array inside an array became a Python list at ~15 us apiece: a 25 MB header of 2M one-byte arrays held
    180 MB for 30 s (a 1 GB one would run out of memory). ggml reads none; 65536 are taken, one more is refused."""
    MAX_NESTED_ARRAYS = 1 << 16
    one = struct.pack("<IQ", VT.UINT8, 1) + b"\x07"
    for n, ok in ((MAX_NESTED_ARRAYS, True), (MAX_NESTED_ARRAYS + 1, False), (2_000_000, False)):
        p = put(gguf_bytes([kv("n", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, n) + one * n)]))
        if ok:
            with GGUFFile(p) as f:
                assert len(f.metadata["n"]) == n
        else:
            with pytest.raises(ModelFormatError, match=f"'n': more than {MAX_NESTED_ARRAYS} arrays nested in arrays"):
                GGUFFile(p)


# ---------------------------------------------------------------- writer round trips

def all_kinds_metadata():
    rng = np.random.default_rng(0)
    return {
        "general.architecture": "llama",
        "u8": GGUFValue(VT.UINT8, 255), "i8": GGUFValue(VT.INT8, -128),
        "u16": GGUFValue(VT.UINT16, 65535), "i16": GGUFValue(VT.INT16, -32768),
        "u32": 4_000_000_000, "i32": -5, "u64": 2**63 + 5, "i64": -2**40,
        "f32": 1e-5, "f64": GGUFValue(VT.FLOAT64, 0.1), "bool": True,
        "np.u16": np.uint16(9), "np.f64": np.float64(2.5),
        "str": "héllo ☃ \0 nul", "empty.str": "",
        "arr.u32": [1, 2, 3], "arr.i32": [-1, 2], "arr.f32": [0.5, 1],
        "arr.bool": [True, False], "arr.str": ["a", "", "ü", "<|im_start|>"],
        "arr.empty": [], "arr.nested": [[1, 2], [3]],
        "arr.typed": GGUFValue((VT.ARRAY, VT.INT16), [1, -2]),
        "big.f32": rng.standard_normal(1000).astype(np.float32),
        "big.i32": np.arange(300, dtype=np.int32),
        "big.u8": np.arange(256, dtype=np.uint8),
        "big.str": [f"tok{i}" for i in range(1000)],
    }


EXPECTED_TYPES = {
    "general.architecture": VT.STRING, "u8": VT.UINT8, "i8": VT.INT8, "u16": VT.UINT16,
    "i16": VT.INT16, "u32": VT.UINT32, "i32": VT.INT32, "u64": VT.UINT64, "i64": VT.INT64,
    "f32": VT.FLOAT32, "f64": VT.FLOAT64, "bool": VT.BOOL, "np.u16": VT.UINT16, "np.f64": VT.FLOAT64,
    "str": VT.STRING, "empty.str": VT.STRING, "arr.u32": (VT.ARRAY, VT.UINT32),
    "arr.i32": (VT.ARRAY, VT.INT32), "arr.f32": (VT.ARRAY, VT.FLOAT32), "arr.bool": (VT.ARRAY, VT.BOOL),
    "arr.str": (VT.ARRAY, VT.STRING), "arr.empty": (VT.ARRAY, VT.UINT32),
    "arr.nested": (VT.ARRAY, (VT.ARRAY, VT.UINT32)), "arr.typed": (VT.ARRAY, VT.INT16),
    "big.f32": (VT.ARRAY, VT.FLOAT32), "big.i32": (VT.ARRAY, VT.INT32), "big.u8": (VT.ARRAY, VT.UINT8),
    "big.str": (VT.ARRAY, VT.STRING),
}


def plain(v):
    return v.value if isinstance(v, GGUFValue) else v


def tiny_tensors(rng):
    w = rng.standard_normal((48, 64)).astype(np.float32)
    return w, {
        "token_embd.weight": (QType.Q8_0, w),
        "blk.0.attn_norm.weight": (QType.F32, rng.standard_normal(64).astype(np.float32)),
        "blk.0.ffn_up.weight": (QType.Q4_K, rng.standard_normal((3, 256))),
        "blk.0.ffn_down.weight": (QType.Q6_K, rng.standard_normal((2, 2, 256)).astype(np.float32)),
        "blk.0.raw.weight": (QType.Q4_0, quantize(w, QType.Q4_0), w.shape),
        "blk.0.bf16.weight": (QType.BF16, w[:3]),
        "blk.0.f16.weight": (QType.F16, w[:1, :5]),
        "ids": (QType.I32, np.array([1, -2, 3], np.int32)),
    }


@pytest.mark.parametrize("alignment", [32, 1, 64, 4096])
def test_write_read_round_trip(tmp_path, alignment):
    rng = np.random.default_rng(1)
    meta = all_kinds_metadata()
    w, tensors = tiny_tensors(rng)
    p = tmp_path / "m.gguf"
    write_gguf(p, meta, tensors, alignment=alignment)
    with GGUFFile(p) as f:
        assert f.alignment == alignment
        for key, value in meta.items():
            got, value = f.metadata[key], plain(value)
            assert f.metadata_types[key] == EXPECTED_TYPES[key], key
            if key == "f32":
                assert got == pytest.approx(value, rel=1e-7) and got != value  # stored as f32
            elif isinstance(value, np.ndarray):
                assert isinstance(got, np.ndarray) and got.dtype == value.dtype.newbyteorder("<")
                np.testing.assert_array_equal(got, value)
            else:
                assert got == value and type(got) is type(value if not isinstance(value, np.generic)
                                                          else value.item()), key
        if alignment == 32:
            assert "general.alignment" not in f.metadata
        else:
            assert f.metadata["general.alignment"] == alignment
        assert list(f.tensors) == list(tensors)
        for name, spec in tensors.items():
            t = f.tensors[name]
            qtype, arr = spec[0], spec[1]
            shape = spec[2] if len(spec) == 3 else arr.shape
            assert t.qtype == qtype and t.shape == shape and t.ne == tuple(reversed(shape))
            assert t.offset % alignment == 0 and t.offset >= f.data_offset
            expected = arr.reshape(-1) if len(spec) == 3 else quantize(arr, qtype).reshape(-1)
            np.testing.assert_array_equal(t.data, expected, err_msg=name)
            assert t.rows2d().shape == (int(np.prod(shape[:-1])), t.row_nbytes)
        np.testing.assert_array_equal(f.tensors["blk.0.raw.weight"].as_float32(),
                                      dequantize(quantize(w, QType.Q4_0), QType.Q4_0, w.shape))
        norm = f.tensors["blk.0.attn_norm.weight"]
        assert np.shares_memory(norm.as_float32(), norm.data)  # F32: zero-copy
        np.testing.assert_array_equal(norm.as_float32(), tensors["blk.0.attn_norm.weight"][1])
        assert not norm.data.flags.writeable


def test_gguf_package_reads_our_files(tmp_path):
    gguf = pytest.importorskip("gguf", reason="gguf-py is the independent reader")
    rng = np.random.default_rng(2)
    meta = all_kinds_metadata()
    del meta["arr.nested"]  # gguf-py flattens nested arrays on read
    _, tensors = tiny_tensors(rng)
    p = tmp_path / "m.gguf"
    write_gguf(p, meta, tensors, alignment=64)
    r = gguf.GGUFReader(p)
    for key, value in meta.items():
        got, value = r.fields[key].contents(), plain(value)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if key == "f32":
            value = float(np.float32(value))
        assert got == value, key
    with GGUFFile(p) as f:
        assert [t.name for t in r.tensors] == list(f.tensors)
        for rt in r.tensors:
            ours = f.tensors[rt.name]
            assert int(rt.tensor_type) == ours.qtype and tuple(int(n) for n in rt.shape) == ours.ne
            assert rt.data_offset == ours.offset and rt.n_bytes == ours.nbytes
            np.testing.assert_array_equal(np.asarray(rt.data).view(np.uint8).reshape(-1), ours.data)


def test_rewrite_from_metadata_types_is_identical(tmp_path):
    p1, p2 = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _, tensors = tiny_tensors(np.random.default_rng(3))
    write_gguf(p1, all_kinds_metadata(), tensors, alignment=64)
    with GGUFFile(p1) as f:
        write_gguf(p2, f.metadata, list(f.tensors.values()), metadata_types=f.metadata_types)
    assert filecmp.cmp(p1, p2, shallow=False)


def test_writer_version_2_and_empty(tmp_path):
    p = tmp_path / "e.gguf"
    write_gguf(p, {}, {}, version=2)
    with GGUFFile(p) as f:
        assert f.version == 2 and f.metadata == {} and f.tensors == {}
    assert p.stat().st_size == 32  # 24-byte header padded to the alignment


def test_writer_rejects_bad_input(tmp_path):
    p = tmp_path / "x.gguf"
    f32 = np.zeros((2, 32), np.float32)
    with pytest.raises(TypeError, match="ambiguous"):
        write_gguf(p, {}, {"w": (QType.Q4_0, np.zeros((2, 18), np.uint8))})
    with pytest.raises(ValueError, match="takes 36 bytes, raw data has 35"):
        write_gguf(p, {}, {"w": (QType.Q4_0, np.zeros(35, np.uint8), (2, 32))})
    with pytest.raises(ValueError, match="given twice"):
        write_gguf(p, {}, [("w", QType.F32, f32), ("w", QType.F32, f32)])
    with pytest.raises(ValueError, match="longer than 63 bytes"):
        write_gguf(p, {}, {"x" * 64: (QType.F32, f32)})
    with pytest.raises(ModelFormatError, match="multiple of the Q4_K block size"):
        write_gguf(p, {}, {"w": (QType.Q4_K, f32)})
    with pytest.raises(ValueError, match="shape"):
        write_gguf(p, {}, {"w": (QType.F32, np.zeros((1, 1, 1, 1, 2), np.float32))})
    with pytest.raises(ValueError, match="out of range for UINT8"):
        write_gguf(p, {"k": GGUFValue(VT.UINT8, 256)}, {})
    with pytest.raises(ValueError, match="out of range for INT16"):
        write_gguf(p, {"k": GGUFValue((VT.ARRAY, VT.INT16), [1, 40000])}, {})
    with pytest.raises(TypeError, match="needs an integer"):
        write_gguf(p, {"k": 1.5}, {}, metadata_types={"k": VT.UINT32})
    with pytest.raises(TypeError, match="no GGUF type"):
        write_gguf(p, {"k": object()}, {})
    with pytest.raises(ValueError, match="disagrees"):
        write_gguf(p, {"general.alignment": 64}, {}, alignment=32)
    with pytest.raises(ValueError, match="power of two"):
        write_gguf(p, {}, {}, alignment=48)
    assert not p.exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_close_keeps_held_views_valid(tmp_path):
    p = tmp_path / "m.gguf"
    x = np.arange(64, dtype=np.float32)
    write_gguf(p, {"a": 1}, {"w": (QType.F32, x)})
    f = GGUFFile(p)
    view = f.tensors["w"].as_float32()
    f.close()
    f.close()  # idempotent
    np.testing.assert_array_equal(view, x)
    with GGUFFile(p) as g:
        assert isinstance(g.tensors["w"], TensorInfo)
    assert g._mm is None


# ---------------------------------------------------------------- real files

REAL = ["smollm2_gguf", "qwen05_gguf", "gemma3_gguf"]


@pytest.mark.slow
def test_real_file_agrees_with_gguf_package(smollm2_gguf):
    # gguf-py's reader takes 4 s on this file and 13-16 s on the others; those
    # are covered by the byte-identical rewrite test below instead.
    gguf = pytest.importorskip("gguf", reason="gguf-py is the independent reader")
    path = smollm2_gguf
    r = gguf.GGUFReader(path)
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == 32
        assert [t.name for t in r.tensors] == list(f.tensors)
        for rt in r.tensors:
            t = f.tensors[rt.name]
            assert (int(rt.tensor_type), tuple(int(n) for n in rt.shape)) == (t.qtype, t.ne)
            assert (rt.data_offset, rt.n_bytes) == (t.offset, t.nbytes)
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert keys == list(f.metadata)
        for k in keys:
            ours = f.metadata[k]
            ours = ours.tolist() if isinstance(ours, np.ndarray) else ours
            assert r.fields[k].contents() == ours, k
        arch = f.metadata["general.architecture"]
        assert f.tensors["token_embd.weight"].shape == (
            len(f.metadata["tokenizer.ggml.tokens"]), f.metadata[f"{arch}.embedding_length"])


@pytest.mark.slow
def test_real_file_types_and_shapes(smollm2_gguf, gemma3_gguf):
    with GGUFFile(smollm2_gguf) as f:
        q = f.tensors["blk.0.ffn_up.weight"]
        assert q.qtype == QType.Q4_1 and q.shape == (1536, 576) and q.ne == (576, 1536)
        assert q.rows2d().shape == (1536, 576 // 32 * 20)
        assert f.metadata["llama.rope.freq_base"] == 100000.0
        assert f.metadata_types["tokenizer.ggml.add_bos_token"] == VT.BOOL
    with GGUFFile(gemma3_gguf) as f:
        scores = f.metadata["tokenizer.ggml.scores"]
        assert isinstance(scores, np.ndarray) and scores.dtype == np.float32 and scores.shape == (262144,)
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 262144


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("fixture", REAL)
def test_real_file_rewrites_byte_identical(fixture, request, tmp_path):
    """Reader + writer lose nothing: re-exporting a llama.cpp file reproduces it exactly."""
    src = request.getfixturevalue(fixture)
    out = tmp_path / "copy.gguf"
    try:
        with GGUFFile(src) as f:
            write_gguf(out, f.metadata, list(f.tensors.values()), metadata_types=f.metadata_types)
        assert filecmp.cmp(src, out, shallow=False)
    finally:
        out.unlink(missing_ok=True)  # hundreds of MB: do not leave them in pytest's tmp

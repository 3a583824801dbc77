"""Our safetensors reader/writer: round trips, and every malformation is a ModelFormatError."""
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from llambda.errors import ModelFormatError
from llambda.formats.safetensors import SafetensorsFile, open_safetensors_dir, write_safetensors
from llambda.formats.quants import QType
from llambda.formats.weights import WeightTensor

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"


def raw_file(path: Path, header, data: bytes = b"", header_len: int | None = None) -> Path:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(blob) if header_len is None else header_len
    path.write_bytes(struct.pack("<Q", n) + blob + data)
    return path


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_round_trip_f32_f16_bf16(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float16)
    c = rng.standard_normal((2, 4)).astype(np.float32)
    c_bf16 = WeightTensor("c", QType.BF16, (2, 4), bf16_bits(c).view(np.uint8).reshape(-1))
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"a": a, "b": b, "c": c_bf16}, metadata={"format": "pt"})
    with SafetensorsFile(path) as f:
        assert f.metadata == {"format": "pt"}
        assert [f.tensors[k].qtype for k in "abc"] == [QType.F32, QType.F16, QType.BF16]
        np.testing.assert_array_equal(f.tensors["a"].to_float32(), a)
        np.testing.assert_array_equal(f.tensors["b"].to_float32(), b.astype(np.float32))
        c_back = (bf16_bits(c).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(f.tensors["c"].to_float32(), c_back)
        assert f.tensors["a"].data.base is not None       # a view into the mapping, not a copy
    raw = path.read_bytes()
    assert struct.unpack("<Q", raw[:8])[0] % 8 == 0         # data section aligned as the reference writer does


def test_reads_the_tiny_fixture_files():
    with SafetensorsFile(TINY / "llama-bf16" / "model.safetensors") as f:
        assert {t.qtype for t in f.tensors.values()} == {QType.BF16}
        emb = f.tensors["model.embed_tokens.weight"]
        assert emb.shape == (512, 64)
    with SafetensorsFile(TINY / "llama" / "model.safetensors") as g:
        # llama-bf16 holds llama's weights rounded to bf16
        a = g.tensors["model.embed_tokens.weight"].to_float32()
    with SafetensorsFile(TINY / "llama-bf16" / "model.safetensors") as f:
        b = f.tensors["model.embed_tokens.weight"].to_float32()
    assert np.abs(a - b).max() <= np.abs(a).max() * 2 ** -8


def test_scalar_and_empty_tensors(tmp_path):
    path = raw_file(tmp_path / "s.safetensors",
                    {"s": entry("F32", [], 0, 4), "e": entry("F32", [0, 4], 4, 4)}, np.float32([1.5]).tobytes())
    with SafetensorsFile(path) as f:
        assert f.tensors["s"].to_float32().tolist() == [1.5]
        assert f.tensors["e"].shape == (0, 4)


GOOD = {"a": entry("F32", [2, 2], 0, 16), "b": entry("F16", [4], 16, 24)}
DATA = bytes(range(24))


@pytest.mark.parametrize("header, data, header_len, message", [
    (GOOD, DATA, 0, "header length 0"),
    (GOOD, DATA, 2**40, "header length"),
    (GOOD, DATA, 200 * 2**20, "header length"),
    (GOOD, DATA, len(json.dumps(GOOD)) + len(DATA) + 1, "header length"),
    (b"{not json", DATA, None, "not valid JSON"),
    (b"\xff\xfe{}", DATA, None, "not valid JSON"),
    (b"[1, 2]", DATA, None, "JSON object"),
    (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', DATA, None, "twice"),
    ({"a": 5}, DATA, None, "'a'.*object"),
    ({"a": {"shape": [1], "data_offsets": [0, 4]}}, DATA, None, "'a'.*lacks 'dtype'"),
    ({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, DATA, None, "'a'.*lacks 'shape'"),
    ({"a": {"dtype": "F32", "shape": [1]}}, DATA, None, "'a'.*lacks 'data_offsets'"),
    ({"a": entry("I8", [4], 0, 4)}, DATA, None, "'a'.*unsupported dtype 'I8'"),
    ({"a": entry("Q9", [4], 0, 4)}, DATA, None, "'a'.*unknown dtype"),
    ({"a": entry(["F32"], [4], 0, 16)}, DATA, None, "'a'.*unknown dtype"),     # unhashable: once a TypeError
    ({"a": entry({"F32": 1}, [4], 0, 16)}, DATA, None, "'a'.*unknown dtype"),
    ({"a": entry("F32", [-1, 4], 0, 16)}, DATA, None, "'a'.*negative"),
    ({"a": entry("F32", [1.5], 0, 4)}, DATA, None, "'a'.*integer"),
    ({"a": entry("F32", [True], 0, 4)}, DATA, None, "'a'.*integer"),
    ({"a": entry("F32", "4", 0, 16)}, DATA, None, "'a'.*shape"),
    ({"a": entry("F32", [2], 0, 16)}, DATA, None, "'a'.*needs 8 bytes"),
    ({"a": entry("F32", [8], 0, 32)}, DATA, None, "'a'.*outside"),
    ({"a": entry("F32", [2], 8, 0)}, DATA, None, "'a'.*outside"),
    ({"a": entry("F32", [2], -8, 0)}, DATA, None, "'a'.*outside"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, DATA, None, "'a'.*data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}, DATA, None, "'a'.*integer"),
    ({"a": entry("F32", [4], 0, 16), "b": entry("F32", [2], 8, 16)}, DATA, None, "overlaps"),
    ({"a": entry("F32", [4], 0, 16), "z": entry("F32", [0], 4, 4), "b": entry("F32", [1], 12, 16)}, DATA, None,
     "overlaps"),
    ({"__metadata__": {"k": 1}}, DATA, None, "__metadata__"),
    ({"__metadata__": []}, DATA, None, "__metadata__"),
])
def test_malformed_files(tmp_path, header, data, header_len, message):
    path = raw_file(tmp_path / "bad.safetensors", header, data, header_len)
    with pytest.raises(ModelFormatError, match=message):
        SafetensorsFile(path)


def test_too_small_and_directory(tmp_path):
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01\x00")
    with pytest.raises(ModelFormatError, match="too small"):
        SafetensorsFile(tmp_path / "tiny.safetensors")
    with pytest.raises(ModelFormatError, match="directory"):
        SafetensorsFile(tmp_path)


def test_every_truncation_is_an_error(tmp_path):
    good = raw_file(tmp_path / "good.safetensors", GOOD, DATA).read_bytes()
    SafetensorsFile(tmp_path / "good.safetensors").close()
    for n in range(len(good)):
        p = tmp_path / "cut.safetensors"
        p.write_bytes(good[:n])
        with pytest.raises(ModelFormatError):
            SafetensorsFile(p)


def test_random_header_corruption_never_escapes_as_another_error(tmp_path):
    good = bytearray(raw_file(tmp_path / "good.safetensors", GOOD, DATA).read_bytes())
    rng = np.random.default_rng(1)
    hlen = struct.unpack("<Q", good[:8])[0]
    for _ in range(300):
        b = bytearray(good)
        for pos in rng.integers(0, 8 + hlen, size=rng.integers(1, 4)):
            b[pos] = int(rng.integers(0, 256))
        p = tmp_path / "fuzz.safetensors"
        p.write_bytes(bytes(b))
        try:
            SafetensorsFile(p).close()
        except ModelFormatError:
            pass


def _sharded(tmp_path: Path, weight_map: dict, shards: dict) -> Path:
    for name, tensors in shards.items():
        write_safetensors(tmp_path / name, tensors)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp_path


def test_sharded_checkpoint(tmp_path):
    a, b = np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32)
    d = _sharded(tmp_path, {"a": "s1.safetensors", "b": "s2.safetensors"},
                 {"s1.safetensors": {"a": a}, "s2.safetensors": {"b": b}})
    st = open_safetensors_dir(d)
    try:
        np.testing.assert_array_equal(st.get("b").to_float32(), b)
        assert set(st.tensors) == {"a", "b"}
    finally:
        st.close()


@pytest.mark.parametrize("weight_map, message", [
    ({"a": "missing.safetensors"}, "missing"),
    ({"a": "s1.safetensors", "c": "s1.safetensors"}, "'c' is not in its shard"),
    ({"a": "../s1.safetensors"}, "bad shard name"),
    ({}, "weight_map"),
])
def test_bad_index(tmp_path, weight_map, message):
    d = _sharded(tmp_path, weight_map, {"s1.safetensors": {"a": np.ones(2, np.float32)}})
    with pytest.raises(ModelFormatError, match=message):
        open_safetensors_dir(d)


def test_a_shards_tensor_the_index_leaves_out_is_read_from_it(tmp_path):
    """Tensors a shard holds beyond its weight_map entries were dropped unread (a checkpoint's biases, say):
    transformers reads every tensor of a named shard, and so do we."""
    two = {"a": np.ones(2, np.float32), "b": np.full(3, 7, np.float32)}
    d = _sharded(tmp_path, {"a": "s1.safetensors"}, {"s1.safetensors": two})
    st = open_safetensors_dir(d)
    try:
        assert sorted(st.tensors) == ["a", "b"]
        np.testing.assert_array_equal(st.get("b").to_float32(), two["b"])
    finally:
        st.close()


@pytest.mark.parametrize("weight_map, shards", [
    ({"a": "s1.safetensors", "b": "s2.safetensors"}, {"s1.safetensors": ["a", "b"], "s2.safetensors": ["b"]}),
    ({"a": "s1.safetensors", "c": "s2.safetensors"}, {"s1.safetensors": ["a", "b"], "s2.safetensors": ["b", "c"]}),
])
def test_a_tensor_two_shards_hold_is_refused(tmp_path, weight_map, shards):
    arrays = {n: np.ones(2, np.float32) for n in "abc"}
    d = _sharded(tmp_path, weight_map, {s: {n: arrays[n] for n in names} for s, names in shards.items()})
    with pytest.raises(ModelFormatError, match="tensor 'b' is in shard .* and in .*disagree"):
        open_safetensors_dir(d)


def test_sharded_tiny_model_gives_the_same_logits(tmp_path):
    """The llama fixture split over two shards with an index loads to the same model."""
    import shutil

    import llambda
    src = TINY / "llama"
    with SafetensorsFile(src / "model.safetensors") as f:
        names = sorted(f.tensors)
        half = len(names) // 2
        parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        for shard, keys in parts.items():
            write_safetensors(tmp_path / shard, {k: f.tensors[k] for k in keys})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in parts.items() for k in keys}}))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    ids = list(range(1, 30))
    with llambda.load(src, backend="numpy", n_ctx=64) as m1, llambda.load(tmp_path, backend="numpy", n_ctx=64) as m2:
        np.testing.assert_array_equal(m1.logits(ids), m2.logits(ids))


def test_writer_refuses_quantized_tensors(tmp_path):
    t = WeightTensor("q", QType.Q8_0, (1, 32), np.zeros(34, np.uint8))
    with pytest.raises(ModelFormatError, match="Q8_0"):
        write_safetensors(tmp_path / "x.safetensors", {"q": t})
    assert not (tmp_path / "x.safetensors").exists()


def test_f64_tensors_load_rounded_to_float32_on_every_backend(tmp_path):
    """F64 (which the safetensors package writes from float64 arrays) was refused while GGUF's F64 loads:
    each is rounded to float32 as GGUF's is, so the file gives the logits of the F32 file it rounds to."""
    import shutil
    import warnings

    from safetensors.numpy import load_file, save_file

    import llambda
    from llambda.backends import available_backends
    src = TINY / "llama"
    shutil.copytree(src, tmp_path / "f64")
    tensors = load_file(src / "model.safetensors")
    wide = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    for name in wide:       # float32's values nudged by far less than half a float32 step: they round back
        tensors[name] = tensors[name].astype(np.float64) * (1 + 2.0 ** -40)
    save_file(tensors, tmp_path / "f64" / "model.safetensors")
    with SafetensorsFile(tmp_path / "f64" / "model.safetensors") as f:
        assert {f.tensors[n].qtype for n in wide} == {QType.F64}
    ids = list(range(1, 20))
    for backend in available_backends():
        with warnings.catch_warnings():
            warnings.simplefilter("error")      # no conversion warning: F64 is rounded, silently
            with llambda.load(tmp_path / "f64", backend=backend, n_ctx=64) as m:
                got = m.logits(ids)
        with llambda.load(src, backend=backend, n_ctx=64) as m:
            np.testing.assert_array_equal(got, m.logits(ids), err_msg=backend)
    tensors["model.norm.weight"][3] = 1e300
    save_file(tensors, tmp_path / "f64" / "model.safetensors")
    with pytest.raises(ModelFormatError, match=r"'model.norm.weight' \(F64\) holds 1e\+300 at index 3, past float32"):
        llambda.load(tmp_path / "f64", backend="numpy", n_ctx=64)

"""safetensors: reader (mmap, zero-copy) and writer, our own.

Layout: an 8-byte little-endian header length N, N bytes of JSON, then the
data section. The JSON maps tensor names to {"dtype", "shape", "data_offsets":
[begin, end)} with offsets relative to the data section; an optional
"__metadata__" maps strings to strings. We accept the float types a model is
stored in (F32, F16, BF16; F64, which the loader rounds to F32 as it does GGUF's) and U8 (packed
MXFP4 codes and exponents, read as raw bytes for the loader to repack); everything else is refused by
name rather than guessed at.

A sharded checkpoint has `model.safetensors.index.json` whose "weight_map"
names the shard holding each tensor: a shard outside the directory, a missing one, a tensor not in
its shard or one two shards hold are refused; a shard's tensor the map leaves out is read from that
shard (transformers reads every tensor of the shards an index names).
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError
from .files import open_regular, read_json, replacing
from .readahead import ReadsAhead
from .quants import QType
from .weights import ByteTensor, WeightTensor

MAX_HEADER_BYTES = 100 * 2**20
INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype name -> (QType, bytes per element)
DTYPES = {"F32": (QType.F32, 4), "F16": (QType.F16, 2), "BF16": (QType.BF16, 2), "F64": (QType.F64, 8)}
QTYPE_NAMES = {q: name for name, (q, _) in DTYPES.items()}
# Types that exist in the format but that a model weight never needs here.
_KNOWN_OTHER = {"I64", "I32", "I16", "I8", "U64", "U32", "U16", "BOOL",
                "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"}


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ModelFormatError(f"safetensors header: key {k!r} appears twice")
        out[k] = v
    return out


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFormatError(f"{what} should be an integer, got {v!r}")
    return v


class SafetensorsFile(ReadsAhead):
    """One open .safetensors file: `tensors` (name -> WeightTensor, views into the mapping) and `metadata`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._mm: mmap.mmap | None = None
        self._base: np.ndarray | None = None
        self.data_start = 0
        self.tensors: dict[str, WeightTensor] = {}
        self.metadata: dict[str, str] = {}
        with open_regular(self.path, "safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ModelFormatError(f"{self.path}: {size} bytes is too small for a safetensors header")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(size)
        except BaseException:
            self.close()
            raise

    def _parse(self, size: int) -> None:
        where = str(self.path)
        (n,) = struct.unpack("<Q", self._mm[:8])
        if n == 0 or n > MAX_HEADER_BYTES or n > size - 8:
            raise ModelFormatError(
                f"{where}: header length {n} is not in 1..{min(MAX_HEADER_BYTES, size - 8)} "
                f"(file of {size} bytes; truncated or not a safetensors file?)")
        try:
            header = json.loads(bytes(self._mm[8:8 + n]).decode("utf-8"), object_pairs_hook=_no_duplicates)
        except RecursionError:
            raise ModelFormatError(f"{where}: header nests too deeply") from None
        except (UnicodeDecodeError, ValueError) as e:
            if isinstance(e, ModelFormatError):
                raise ModelFormatError(f"{where}: {e}") from None
            raise ModelFormatError(f"{where}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise ModelFormatError(f"{where}: header must be a JSON object")
        meta = header.pop("__metadata__", None)
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise ModelFormatError(f"{where}: __metadata__ must map strings to strings")
            self.metadata = meta
        data_start = self.data_start = 8 + n
        data_size = size - data_start
        base = self._base = np.frombuffer(self._mm, dtype=np.uint8)
        spans = []
        for name, info in header.items():
            # BERT checkpoints save the int64 buffer `embeddings.position_ids` (0..n-1), not a weight
            if name.endswith("position_ids") and isinstance(info, dict) and info.get("dtype") in ("I64", "I32"):
                continue
            # ... and old GPT-NeoX (Pythia) checkpoints the boolean causal mask `attention.bias`, not a weight
            if name.endswith(".attention.bias") and isinstance(info, dict) and info.get("dtype") == "BOOL":
                continue
            qtype, shape, begin, end = self._entry(name, info, data_size)
            spans.append((begin, end, name))
            raw = base[data_start + begin:data_start + end]
            # U8: bytes for a loader to interpret (ByteTensor), never a weight as they are
            self.tensors[name] = (WeightTensor(name, qtype, shape, raw) if qtype is not None
                                  else ByteTensor(name, QType.I8, shape, raw))
        reach, holder = 0, None     # furthest end so far among non-empty tensors, and whose
        for begin, end, name in sorted(s for s in spans if s[1] > s[0]):
            if begin < reach:
                raise ModelFormatError(f"{where}: tensor {name!r} overlaps tensor {holder!r} in the data section")
            reach, holder = end, name

    def _entry(self, name: str, info, data_size: int):
        what = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ModelFormatError(f"{what}: entry must be an object, got {type(info).__name__}")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in info:
                raise ModelFormatError(f"{what}: entry lacks {key!r}")
        dtype = info["dtype"]
        # a JSON list or object here is unhashable: test the type before any set/dict lookup
        if not isinstance(dtype, str) or (dtype not in DTYPES and dtype != "U8"):
            kind = "unsupported" if isinstance(dtype, str) and dtype in _KNOWN_OTHER else "unknown"
            raise ModelFormatError(f"{what}: {kind} dtype {dtype!r} (only F32, F16, BF16 and F64 weights and U8 "
                                   "MXFP4 blocks are read)")
        qtype, itemsize = DTYPES[dtype] if dtype != "U8" else (None, 1)
        shape = info["shape"]
        if not isinstance(shape, list) or len(shape) > 8:
            raise ModelFormatError(f"{what}: shape must be a list of at most 8 dimensions, got {shape!r}")
        shape = tuple(_int(s, f"{what}: shape entry") for s in shape)
        if any(s < 0 for s in shape):
            raise ModelFormatError(f"{what}: negative dimension in shape {list(shape)}")
        offs = info["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2:
            raise ModelFormatError(f"{what}: data_offsets must be [begin, end], got {offs!r}")
        begin, end = (_int(o, f"{what}: data_offsets entry") for o in offs)
        if not 0 <= begin <= end <= data_size:
            raise ModelFormatError(
                f"{what}: data_offsets [{begin}, {end}) are outside the data section of {data_size} bytes")
        numel = math.prod(shape)
        if end - begin != numel * itemsize:
            raise ModelFormatError(
                f"{what}: {dtype} {list(shape)} needs {numel * itemsize} bytes, data_offsets give {end - begin}")
        return qtype, (shape or (1,)), begin, end

    def close(self) -> None:
        self.tensors = {}       # first: their views would keep the mapping open
        super().close()


class SafetensorsSet:
    """All tensors of a checkpoint directory: one file, or shards listed in the index."""

    def __init__(self, files: list[SafetensorsFile], tensors: dict[str, WeightTensor]):
        self.files, self.tensors = files, tensors
        self._reading = False

    def read_ahead(self) -> None:
        """The first shard is read ahead of the loader at once, each other one from its first released tensor."""
        self._reading = True
        if self.files:
            self.files[0].read_ahead()

    def stop_read_ahead(self) -> None:
        self._reading = False
        for f in self.files:
            f.stop_read_ahead()

    def get(self, name: str) -> WeightTensor | None:
        return self.tensors.get(name)

    def release(self, data: np.ndarray) -> int:
        done = 0
        for f in self.files:
            n = f.release(data)
            if n and self._reading and not f.reading_ahead:
                f.read_ahead()
                f.release(data)     # (tells the new reader where the loader is)
            done += n
        return done

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []
        self.tensors = {}


def open_safetensors_dir(folder: str | os.PathLike) -> SafetensorsSet:
    """Open `model.safetensors`, or the shards of `model.safetensors.index.json`, or every *.safetensors."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    files: list[SafetensorsFile] = []
    try:
        # exists(), not is_file(): a FIFO or directory under these names is refused by name, not skipped
        if index.exists():
            return _open_index(folder, index, files)
        single = folder / "model.safetensors"
        paths = [single] if single.exists() else sorted(p for p in folder.glob("*.safetensors") if p.exists())
        if not paths:
            raise ModelFormatError(f"{folder}: no model.safetensors (nor an index, nor any *.safetensors file)")
        tensors: dict[str, WeightTensor] = {}
        for p in paths:
            f = SafetensorsFile(p)
            files.append(f)
            for name, t in f.tensors.items():
                if name in tensors:
                    raise ModelFormatError(f"{folder}: tensor {name!r} is in more than one file")
                tensors[name] = t
        return SafetensorsSet(files, tensors)
    except BaseException:
        for f in files:
            f.close()
        raise


def _open_index(folder: Path, index: Path, files: list) -> SafetensorsSet:
    doc = read_json(index, INDEX_NAME)
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise ModelFormatError(f"{index}: lacks a non-empty 'weight_map' object")
    opened: dict[str, SafetensorsFile] = {}
    tensors: dict[str, WeightTensor] = {}
    for name, shard in wmap.items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
            raise ModelFormatError(f"{index}: tensor {name!r} maps to a bad shard name {shard!r}")
        if shard not in opened:
            path = folder / shard
            try:
                found = path.is_file()
            except OSError:     # a name longer than the file system takes (ENAMETOOLONG) was a raw OSError
                found = False
            if not found:
                raise ModelFormatError(f"{index}: shard {shard!r} (holding {name!r}) is missing")
            opened[shard] = SafetensorsFile(path)
            files.append(opened[shard])
        t = opened[shard].tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{index}: tensor {name!r} is not in its shard {shard!r}")
        tensors[name] = t
    # a shard's tensor the index leaves out was dropped unread (a checkpoint's q/k/v biases, say, and the
    # model ran without them): transformers reads every tensor of the shards the index names, so it is
    # taken from its shard; one two shards hold, or one the map gives to another shard, is ambiguous
    unlisted: dict[str, str] = {}
    for shard, f in opened.items():
        for name in f.tensors:
            if wmap.get(name, shard) != shard or name in unlisted:
                other = wmap.get(name) or unlisted[name]
                raise ModelFormatError(f"{index}: tensor {name!r} is in shard {shard!r} and in {other!r}: "
                                       "the index and its shards disagree")
            if name not in wmap:
                unlisted[name] = shard
                tensors[name] = f.tensors[name]
    return SafetensorsSet(files, tensors)


# ---------------------------------------------------------------- writing

def write_safetensors(path: str | os.PathLike, tensors, metadata: dict[str, str] | None = None) -> None:
    """Write tensors (name -> WeightTensor or float32/float16 NumPy array) to `path`, atomically.

    WeightTensors must be F32, F16, BF16 or F64; their bytes are written as they are. uint8 arrays are
    written as U8 (MXFP4 blocks and scales in the Hub's layout).
    """
    entries, header = [], {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, t in tensors.items():
        if isinstance(t, WeightTensor):
            if t.qtype not in QTYPE_NAMES:
                raise ModelFormatError(f"tensor {name!r}: {t.qtype.name} cannot be stored in safetensors")
            dtype, shape, raw = QTYPE_NAMES[t.qtype], list(t.shape), np.ascontiguousarray(t.data).view(np.uint8)
        else:
            a = np.asarray(t)
            if a.dtype == np.float32:
                dtype = "F32"
            elif a.dtype == np.float16:
                dtype = "F16"
            elif a.dtype == np.uint8:
                dtype = "U8"
            else:
                raise ModelFormatError(f"tensor {name!r}: cannot store {a.dtype} arrays")
            little = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<")))
            shape, raw = list(a.shape), little.reshape(-1).view(np.uint8)
        raw = raw.reshape(-1)
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ModelFormatError(f"bad tensor name {name!r}")
        if raw.size != math.prod(shape) * (DTYPES[dtype][1] if dtype in DTYPES else 1):
            raise ModelFormatError(f"tensor {name!r}: {raw.size} bytes do not hold {dtype} {shape}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + raw.size]}
        entries.append(raw)
        offset += raw.size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)    # data section 8-byte aligned, as the reference writer does
    with replacing(path) as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in entries:
            f.write(memoryview(raw))

"""GGUF v2/v3 reader: strict validation, mmap, zero-copy tensor views.

Layout (all little-endian): magic "GGUF", u32 version, u64 tensor count,
u64 key/value count; the key/values (string key, u32 value type, value);
the tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
u64 offset relative to the data section); padding to `general.alignment`
(default 32); the tensor data. Strings are a u64 byte length + UTF-8 bytes;
arrays are a u32 element type + u64 count + elements.

Every length and count is checked against the bytes that remain before it is
used, so a corrupt or hostile file fails fast with a ModelFormatError naming
the field, never with a huge allocation, a hang or a crash.
"""
from __future__ import annotations

import enum
import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelFormatError
from .files import open_regular
from .readahead import ReadsAhead
from .quants import TRAITS, QType, dequantize, row_nbytes

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_NESTING = 8
# Arrays inside arrays, in the whole header: ggml's reader takes none, and each costs a Python list and
# ~15 us here (a 25 MB file of 2M of them held 180 MB for 30 s; a 1 GB one would run out of memory).
MAX_NESTED_ARRAYS = 1 << 16
# Numeric arrays longer than this come back as NumPy arrays (tokenizer scores
# and token types have 100k+ entries); shorter ones as Python lists.
ARRAY_AS_NUMPY_MIN = 256
_INT64_MAX = (1 << 63) - 1


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


VT = GGUFValueType
# Fixed-size value types: struct format and the matching NumPy dtype.
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h",
    VT.UINT32: "<I", VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<B",
    VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}
NUMPY_DTYPES: dict[GGUFValueType, np.dtype] = {
    t: np.dtype(f) for t, f in SCALAR_FORMATS.items() if t != VT.BOOL}
INTEGER_TYPES = frozenset({VT.UINT8, VT.INT8, VT.UINT16, VT.INT16,
                           VT.UINT32, VT.INT32, VT.UINT64, VT.INT64})
_STRUCTS = {t: struct.Struct(f) for t, f in SCALAR_FORMATS.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Smallest encodings, to bound counts by the bytes left: a key/value is a
# non-empty key + type + 1-byte value; a tensor info a non-empty name, n_dims,
# one dim, type and offset; an array element its fixed size, a string its
# length field, a nested array its type and count.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


def _min_elem_bytes(vtype: GGUFValueType) -> int:
    if vtype == VT.STRING:
        return 8
    if vtype == VT.ARRAY:
        return 4 + 8
    return _STRUCTS[vtype].size


@dataclass(eq=False)
class TensorInfo:
    """One tensor: where it lives in the file and a zero-copy view of its bytes."""

    name: str
    qtype: QType
    shape: tuple[int, ...]  # NumPy order: reversed ggml ne; rows along the last axis
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    offset: int  # absolute byte offset in the file
    nbytes: int
    data: np.ndarray = field(repr=False)  # read-only 1-D uint8 view of the mmap

    @property
    def ncols(self) -> int:
        return self.ne[0]

    @property
    def nrows(self) -> int:
        n = 1
        for s in self.ne[1:]:
            n *= s
        return n

    @property
    def row_nbytes(self) -> int:
        return row_nbytes(self.qtype, self.ne[0])

    def rows2d(self) -> np.ndarray:
        """The bytes as (rows, row_nbytes): row i is one output row of a weight."""
        return self.data.reshape(self.nrows, self.row_nbytes)

    def as_float32(self) -> np.ndarray:
        """F32 tensors: a zero-copy view; other types: a dequantized copy."""
        if self.qtype == QType.F32:
            return self.data.view("<f4").reshape(self.shape)
        return dequantize(self.data, self.qtype, self.shape)


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    __slots__ = ("buf", "pos", "end", "nested")

    def __init__(self, buf, pos: int, end: int):
        self.buf, self.pos, self.end = buf, pos, end
        self.nested = 0     # arrays read inside arrays so far

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise ModelFormatError(
                f"{what}: needs {n} bytes at offset {self.pos}, "
                f"but only {self.end - self.pos} remain in the file")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(f"{what} (length)")
        if n > self.end - self.pos:
            raise ModelFormatError(
                f"{what}: string length {n} at offset {self.pos - 8} runs past the end "
                f"of the file ({self.end - self.pos} bytes remain)")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(
                f"{what}: string is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def value_type(self, what: str) -> GGUFValueType:
        t = self.u32(f"{what} (value type)")
        try:
            return GGUFValueType(t)
        except ValueError:
            raise ModelFormatError(f"{what}: unknown value type {t}") from None

    def scalar(self, vtype: GGUFValueType, what: str):
        st = _STRUCTS[vtype]
        self.need(st.size, what)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        if vtype == VT.BOOL:
            if v > 1:
                raise ModelFormatError(f"{what}: bool value {v} is neither 0 nor 1")
            return bool(v)
        return v

    def value(self, vtype: GGUFValueType, what: str, depth: int = 0):
        """Returns (value, type descriptor); see GGUFFile.metadata_types."""
        if vtype == VT.STRING:
            return self.string(what), vtype
        if vtype == VT.ARRAY:
            return self.array(what, depth + 1)
        return self.scalar(vtype, what), vtype

    def array(self, what: str, depth: int):
        if depth > MAX_ARRAY_NESTING:
            raise ModelFormatError(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING}")
        etype = self.value_type(f"{what} (array element type)")
        count = self.u64(f"{what} (array length)")
        esize = _min_elem_bytes(etype)
        if count > (self.end - self.pos) // esize:
            raise ModelFormatError(
                f"{what}: array length {count} of {etype.name} cannot fit in the "
                f"{self.end - self.pos} bytes that remain")
        if etype == VT.STRING:
            return self._string_array(count, what), (VT.ARRAY, etype)
        if etype == VT.ARRAY:
            self.nested += count
            if self.nested > MAX_NESTED_ARRAYS:
                raise ModelFormatError(f"{what}: more than {MAX_NESTED_ARRAYS} arrays nested in arrays in the header "
                                       "(llama.cpp's reader takes none)")
            items, descs = [], set()
            for i in range(count):
                item, desc = self.array(f"{what}[{i}]", depth + 1)
                items.append(item)
                descs.add(desc)
            # One inner descriptor if all agree; plain ARRAY ("each its own") if not.
            inner = descs.pop() if len(descs) == 1 else (VT.ARRAY, None) if not descs else VT.ARRAY
            return items, (VT.ARRAY, inner)
        nbytes = count * esize
        if etype == VT.BOOL:
            raw = np.frombuffer(self.buf, np.uint8, count, self.pos)
            if count and raw.max() > 1:
                i = int(np.argmax(raw > 1))
                raise ModelFormatError(f"{what}[{i}]: bool value {raw[i]} is neither 0 nor 1")
            arr = raw.astype(bool)
        else:
            arr = np.frombuffer(self.buf, NUMPY_DTYPES[etype], count, self.pos).copy()
        self.pos += nbytes
        return (arr if count >= ARRAY_AS_NUMPY_MIN else arr.tolist()), (VT.ARRAY, etype)

    def _string_array(self, count: int, what: str) -> list[str]:
        # The hot loop for 100k-262k token vocabularies: locals only, no calls
        # beyond the unavoidable unpack/slice/decode.
        buf, pos, end = self.buf, self.pos, self.end
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        i = 0
        try:
            for i in range(count):
                if end - pos < 8:
                    raise ModelFormatError(f"{what}[{i}]: string length runs past the end of the file")
                n = unpack(buf, pos)[0]
                pos += 8
                if n > end - pos:
                    raise ModelFormatError(
                        f"{what}[{i}]: string length {n} at offset {pos - 8} runs past the end "
                        f"of the file ({end - pos} bytes remain)")
                append(buf[pos:pos + n].decode("utf-8"))
                pos += n
        except UnicodeDecodeError as e:
            raise ModelFormatError(
                f"{what}[{i}]: string is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        self.pos = pos
        return out


class GGUFFile(ReadsAhead):
    """An open GGUF file. `GGUFFile(path)` maps it and validates the whole header.

    Attributes: `path`, `version`, `metadata` (key -> value, in file order),
    `metadata_types` (key -> GGUFValueType, or (GGUFValueType.ARRAY, element
    descriptor) for arrays), `tensors` (name -> TensorInfo, in file order),
    `alignment`, `data_offset`, `file_size`.
    """

    stages = True      # gguf_model takes every tensor's bytes through view()

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._mm: mmap.mmap | None = None
        self._base: np.ndarray | None = None
        with open_regular(self.path, "GGUF file") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            if self.file_size < 24:
                raise ModelFormatError(
                    f"{self.path}: {self.file_size} bytes is too small for a GGUF header (24 bytes)")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing ---------------------------------------------------------

    def _parse(self) -> None:
        mm = self._mm
        cur = _Cursor(mm, 0, self.file_size)
        magic = mm[0:4]
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                raise ModelFormatError(f"{self.path}: big-endian GGUF files are not supported")
            raise ModelFormatError(
                f"{self.path}: GGUF version {version} is not supported (only 2 and 3)")
        self.version = version
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata key/value count")
        left = cur.end - cur.pos
        if n_kv > left // _MIN_KV_BYTES:
            raise ModelFormatError(
                f"metadata key/value count {n_kv} is more than the file's {left} header bytes can hold")
        if n_tensors > left // _MIN_TENSOR_INFO_BYTES:
            raise ModelFormatError(
                f"tensor count {n_tensors} is more than the file's {left} header bytes can hold")
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > left:
            raise ModelFormatError(
                f"{n_kv} key/values and {n_tensors} tensor infos cannot fit in the file's "
                f"{left} header bytes")

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}")
            if not key:
                raise ModelFormatError(f"metadata key {i} is empty")
            if key in self.metadata:
                raise ModelFormatError(f"metadata key {key!r} appears twice")
            what = f"metadata key {key!r}"
            value, desc = cur.value(cur.value_type(what), what)
            self.metadata[key] = value
            self.metadata_types[key] = desc

        self.alignment = self._read_alignment()
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self._base = np.frombuffer(mm, dtype=np.uint8)
        self.tensors: dict[str, TensorInfo] = {}
        for name, qtype, ne, rel_offset in infos:
            self.tensors[name] = self._place_tensor(name, qtype, ne, rel_offset)
        self._check_overlaps()

    def _read_alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        a = self.metadata["general.alignment"]
        if self.metadata_types["general.alignment"] not in INTEGER_TYPES:
            raise ModelFormatError(
                f"metadata key 'general.alignment' must be an integer, got {a!r}")
        if a <= 0 or a & (a - 1):
            raise ModelFormatError(
                f"metadata key 'general.alignment' = {a} is not a nonzero power of two")
        return a

    def _read_tensor_info(self, cur: _Cursor, i: int):
        name = cur.string(f"tensor {i} name")
        if not name:
            raise ModelFormatError(f"tensor {i} has an empty name")
        what = f"tensor {name!r}"
        n_dims = cur.u32(f"{what}: n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFormatError(f"{what}: n_dims {n_dims} is not between 1 and {MAX_DIMS}")
        ne = tuple(cur.u64(f"{what}: ne[{d}]") for d in range(n_dims))
        count = 1
        for d, n in enumerate(ne):
            if n > _INT64_MAX:
                raise ModelFormatError(f"{what}: ne[{d}] = {n} is negative as a signed 64-bit dimension")
            count *= n
        if count > _INT64_MAX:
            raise ModelFormatError(f"{what}: element count of dims {list(ne)} overflows 64 bits")
        t = cur.u32(f"{what}: type")
        try:
            qtype = QType(t)
        except ValueError:
            raise ModelFormatError(f"{what}: unknown tensor type {t}") from None
        if ne[0] % TRAITS[qtype].block_size:
            raise ModelFormatError(
                f"{what}: row length ne[0] = {ne[0]} is not a multiple of the "
                f"{qtype.name} block size {TRAITS[qtype].block_size}")
        offset = cur.u64(f"{what}: offset")
        return name, qtype, ne, offset

    def _place_tensor(self, name: str, qtype: QType, ne: tuple, rel_offset: int) -> TensorInfo:
        what = f"tensor {name!r}"
        if name in self.tensors:
            raise ModelFormatError(f"{what} appears twice")
        if rel_offset % self.alignment:
            raise ModelFormatError(
                f"{what}: offset {rel_offset} is not a multiple of the alignment {self.alignment}")
        nrows = 1
        for n in ne[1:]:
            nrows *= n
        nbytes = nrows * row_nbytes(qtype, ne[0])
        start = self.data_offset + rel_offset
        if nbytes and start + nbytes > self.file_size:
            raise ModelFormatError(
                f"{what}: data at offset {start} + {nbytes} bytes runs past end of file "
                f"({self.file_size} bytes)")
        return TensorInfo(name=name, qtype=qtype, shape=tuple(reversed(ne)), ne=ne,
                          offset=start, nbytes=nbytes, data=self._base[start:start + nbytes])

    def _check_overlaps(self) -> None:
        spans = sorted((t.offset, t.offset + t.nbytes, t.name)
                       for t in self.tensors.values() if t.nbytes)
        for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
            if start_b < end_a:
                raise ModelFormatError(f"tensor {b!r}: data overlaps tensor {a!r}")

    # -- access ------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def data_start(self) -> int:
        return self.data_offset

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")

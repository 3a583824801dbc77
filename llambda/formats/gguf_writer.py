"""GGUF writer: tiny random test models, and `llambda export`.

    write_gguf(path, {"general.architecture": "llama",
                      "llama.rope.freq_base": 10000.0,
                      "llama.vocab_size": GGUFValue(GGUFValueType.INT32, 32)},
               {"token_embd.weight": (QType.Q8_0, np.random.randn(32, 64)),
                "output.weight": (QType.Q4_0, raw_bytes, (32, 64))})

Metadata types are inferred from Python types unless given explicitly (a
GGUFValue wrapper, or `metadata_types`, in the form GGUFFile.metadata_types
uses): bool -> BOOL; int -> UINT32 if 0 <= v < 2**32, INT32 if negative and in
range, else UINT64/INT64; float -> FLOAT32 (the GGUF convention, not
FLOAT64); str -> STRING (bytes -> STRING written verbatim); NumPy scalars and
arrays -> their dtype; lists and tuples -> ARRAY of the common element type
(ints by the int rule over all elements, floats or mixed int/float -> FLOAT32,
an empty list -> UINT32). Keys whose element type llama.cpp's vocabulary loader
insists on (LLAMA_CPP_TYPES: token types INT32, scores FLOAT32) get that type
unless one is given explicitly.

Tensors are a dict name -> (qtype, values) or (qtype, raw_bytes, shape), or a
list of (name, qtype, values), (name, qtype, raw_bytes, shape) or TensorInfo.
`values` (any numeric dtype except uint8, which would be ambiguous) are
quantized to `qtype`; raw bytes are written as they are. Shapes are in NumPy
order (rows along the last axis), like GGUFFile's TensorInfo.shape.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from .files import replacing
from .quants import QType, as_qtype, quantize, tensor_nbytes
from .gguf import (DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS, NUMPY_DTYPES, SCALAR_FORMATS,
                   GGUFValueType, TensorInfo)

VT = GGUFValueType
MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME is 64 including the NUL

_NUMPY_TO_VT = {np.dtype(d): t for t, d in NUMPY_DTYPES.items()}
_INT_RANGES = {
    VT.UINT8: (0, 2**8 - 1), VT.INT8: (-2**7, 2**7 - 1),
    VT.UINT16: (0, 2**16 - 1), VT.INT16: (-2**15, 2**15 - 1),
    VT.UINT32: (0, 2**32 - 1), VT.INT32: (-2**31, 2**31 - 1),
    VT.UINT64: (0, 2**64 - 1), VT.INT64: (-2**63, 2**63 - 1),
}


@dataclass(frozen=True)
class GGUFValue:
    """A metadata value with an explicit type: a GGUFValueType for scalars,
    (GGUFValueType.ARRAY, element type or None to infer) for arrays."""

    type: Any
    value: Any


# ---------------------------------------------------------------- type inference

def _int_type(lo: int, hi: int) -> GGUFValueType:
    if lo >= 0:
        if hi < 2**32:
            return VT.UINT32
        if hi < 2**64:
            return VT.UINT64
    elif lo >= -2**31 and hi < 2**31:
        return VT.INT32
    elif lo >= -2**63 and hi < 2**63:
        return VT.INT64
    raise ValueError(f"integers in [{lo}, {hi}] fit no GGUF integer type")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def infer_type(value: Any):
    """The type descriptor write_gguf uses for `value` (see the module docstring)."""
    if isinstance(value, GGUFValue):
        return value.type
    if isinstance(value, (bool, np.bool_)):
        return VT.BOOL
    if isinstance(value, np.generic) and value.dtype in _NUMPY_TO_VT:
        return _NUMPY_TO_VT[value.dtype]
    if isinstance(value, int):
        return _int_type(value, value)
    if isinstance(value, float):
        return VT.FLOAT32
    if isinstance(value, (str, bytes)):
        return VT.STRING
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"array values must be 1-D, got shape {value.shape}")
        if value.dtype == np.bool_:
            return (VT.ARRAY, VT.BOOL)
        if value.dtype.kind in "US":
            return (VT.ARRAY, VT.STRING)
        if value.dtype.newbyteorder("<") in _NUMPY_TO_VT:
            return (VT.ARRAY, _NUMPY_TO_VT[value.dtype.newbyteorder("<")])
        raise ValueError(f"no GGUF type for arrays of {value.dtype}")
    if isinstance(value, (list, tuple)):
        return (VT.ARRAY, _infer_element_type(value))
    raise TypeError(f"no GGUF type for {type(value).__name__} values")


def _infer_element_type(items) -> Any:
    if not items:
        return VT.UINT32
    if all(isinstance(v, (bool, np.bool_)) for v in items):
        return VT.BOOL
    if all(isinstance(v, (str, bytes)) for v in items):
        return VT.STRING
    if all(_is_int(v) for v in items):
        return _int_type(int(min(items)), int(max(items)))
    if all(_is_int(v) or isinstance(v, (float, np.floating)) for v in items):
        return VT.FLOAT32
    if all(isinstance(v, (list, tuple, np.ndarray)) for v in items):
        return VT.ARRAY  # each inner array infers its own element type
    raise TypeError("array elements must all be bools, strings, numbers or arrays")


# ---------------------------------------------------------------- encoding

def _pack_string(value, what: str) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _pack_scalar(vtype: GGUFValueType, value, what: str) -> bytes:
    if vtype == VT.STRING:
        return _pack_string(value, what)
    if vtype == VT.BOOL:
        return b"\x01" if value else b"\x00"
    if vtype in _INT_RANGES:
        if not _is_int(value):
            raise TypeError(f"{what}: {vtype.name} needs an integer, got {value!r}")
        lo, hi = _INT_RANGES[vtype]
        if not lo <= int(value) <= hi:
            raise ValueError(f"{what}: {value} is out of range for {vtype.name}")
        value = int(value)
    try:
        return struct.pack(SCALAR_FORMATS[vtype], value)
    except struct.error as e:
        raise TypeError(f"{what}: cannot store {value!r} as {vtype.name}: {e}") from None


def _pack_numeric_array(etype: GGUFValueType, items, what: str) -> bytes:
    dtype = NUMPY_DTYPES[etype] if etype != VT.BOOL else np.dtype(np.uint8)
    src = np.asarray(items)
    if src.size == 0:
        return b""
    if etype in _INT_RANGES:
        if src.dtype.kind not in "iub":
            raise TypeError(f"{what}: {etype.name} array needs integers, got {src.dtype}")
        lo, hi = _INT_RANGES[etype]
        if int(src.min()) < lo or int(src.max()) > hi:
            raise ValueError(f"{what}: values out of range for {etype.name}")
    elif etype == VT.BOOL:
        src = src.astype(bool)
    return np.ascontiguousarray(src.astype(dtype)).tobytes()


def encode_value(desc, value, what: str = "value", depth: int = 0) -> bytes:
    """Bytes of `value` (without its type field) encoded as descriptor `desc`."""
    if isinstance(value, GGUFValue):
        value = value.value
    if isinstance(desc, tuple):
        vtype, etype = desc
    else:
        vtype, etype = desc, None
    vtype = VT(vtype)
    if vtype != VT.ARRAY:
        return _pack_scalar(vtype, value, what)
    if depth >= 8:
        raise ValueError(f"{what}: arrays nested too deep")
    if isinstance(value, np.ndarray) and value.ndim != 1:
        raise ValueError(f"{what}: array values must be 1-D, got shape {value.shape}")
    items = value if isinstance(value, np.ndarray) else list(value)
    if etype is None:
        etype = infer_type(value)[1]
    inner = None
    if isinstance(etype, tuple):  # nested arrays with a given inner descriptor
        inner, etype = etype, VT.ARRAY
    etype = VT(etype)
    head = struct.pack("<IQ", etype, len(items))
    if etype == VT.STRING:
        return head + b"".join(_pack_string(v, what) for v in items)
    if etype == VT.ARRAY:
        parts = []
        for i, v in enumerate(items):
            # each inner array carries its own element type and count
            d = inner if inner is not None else infer_type(v)
            if not (isinstance(d, tuple) and d[0] == VT.ARRAY):
                raise TypeError(f"{what}[{i}]: elements of a nested array must be arrays")
            parts.append(encode_value(d, v, f"{what}[{i}]", depth + 1))
        return head + b"".join(parts)
    return head + _pack_numeric_array(etype, items, what)


def _encode_kv(key: str, desc, value) -> bytes:
    what = f"metadata key {key!r}"
    vtype = desc[0] if isinstance(desc, tuple) else desc
    return _pack_string(key, what) + struct.pack("<I", VT(vtype)) + encode_value(desc, value, what)


# ---------------------------------------------------------------- tensors

@dataclass
class _PendingTensor:
    name: str
    qtype: QType
    shape: tuple[int, ...]
    nbytes: int
    values: Any = None  # to quantize
    raw: Any = None  # already in the file's byte layout

    def payload(self) -> np.ndarray:
        if self.raw is not None:
            return self.raw
        return quantize(self.values, self.qtype).reshape(-1)


def _raw_bytes(raw) -> np.ndarray:
    if isinstance(raw, np.ndarray):
        return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    return np.frombuffer(memoryview(raw).cast("B"), dtype=np.uint8)


def _pending(name: str, qtype, data, shape=None) -> _PendingTensor:
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
    if len(name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:
        raise ValueError(f"tensor {name!r}: name longer than {MAX_TENSOR_NAME_BYTES} bytes")
    qtype = as_qtype(qtype)
    if shape is None:
        values = np.asarray(data)
        if values.dtype == np.uint8:
            raise TypeError(
                f"tensor {name!r}: uint8 data is ambiguous; pass (qtype, raw_bytes, shape) "
                "for pre-quantized bytes or a float array of values")
        if values.dtype.kind not in "iuf":
            raise TypeError(f"tensor {name!r}: cannot store {values.dtype} values")
        shape = values.shape
    else:
        values = None
    shape = tuple(int(s) for s in shape)
    if not 1 <= len(shape) <= MAX_DIMS or any(s < 0 for s in shape):
        raise ValueError(f"tensor {name!r}: shape {shape} must have 1 to {MAX_DIMS} dims >= 0")
    nbytes = tensor_nbytes(qtype, shape)
    if values is not None:
        return _PendingTensor(name, qtype, shape, nbytes, values=values)
    raw = _raw_bytes(data)
    if raw.size != nbytes:
        raise ValueError(
            f"tensor {name!r}: {qtype.name} {shape} takes {nbytes} bytes, raw data has {raw.size}")
    return _PendingTensor(name, qtype, shape, nbytes, raw=raw)


def _normalize_tensors(tensors) -> list[_PendingTensor]:
    entries: Iterable
    if isinstance(tensors, dict):
        entries = ((name, *spec) for name, spec in tensors.items())
    else:
        entries = tensors
    out, seen = [], set()
    for entry in entries:
        if isinstance(entry, TensorInfo):
            t = _pending(entry.name, entry.qtype, entry.data, entry.shape)
        elif isinstance(entry, (tuple, list)) and len(entry) in (3, 4):
            t = _pending(*entry)
        else:
            raise TypeError(
                "each tensor must be (name, qtype, values), (name, qtype, raw, shape) or a "
                f"TensorInfo; got {type(entry).__name__}")
        if t.name in seen:
            raise ValueError(f"tensor {t.name!r} given twice")
        seen.add(t.name)
        out.append(t)
    return out


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# ---------------------------------------------------------------- the file

# Array keys llama.cpp's vocabulary loader refuses in any other element type
# ("invalid gguf type for tokenizer.ggml.token_type"); it reads them as int32 / float arrays.
LLAMA_CPP_TYPES = {"tokenizer.ggml.token_type": (VT.ARRAY, VT.INT32),
                   "tokenizer.ggml.scores": (VT.ARRAY, VT.FLOAT32)}


def write_gguf(path: str | os.PathLike, metadata: dict[str, Any], tensors=(),
               alignment: int | None = None, metadata_types: dict[str, Any] | None = None,
               version: int = 3) -> None:
    """Write a GGUF file (atomically: a temporary file renamed into place).

    `alignment` defaults to metadata["general.alignment"] if present, else 32;
    a non-default alignment is recorded as general.alignment (UINT32).
    """
    metadata = dict(metadata)
    types = dict(metadata_types or {})
    given = metadata.get("general.alignment")
    given = given.value if isinstance(given, GGUFValue) else given
    if alignment is None:
        alignment = DEFAULT_ALIGNMENT if given is None else given
    if not _is_int(alignment) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a nonzero power of two, got {alignment!r}")
    if version not in (2, 3):
        raise ValueError(f"can only write GGUF versions 2 and 3, got {version}")
    if given is not None:
        if given != alignment:
            raise ValueError(f"metadata general.alignment={given} disagrees with alignment={alignment}")
    elif alignment != DEFAULT_ALIGNMENT:
        metadata["general.alignment"] = GGUFValue(VT.UINT32, alignment)

    header = bytearray(GGUF_MAGIC)
    pending = _normalize_tensors(tensors)
    header += struct.pack("<IQQ", version, len(pending), len(metadata))
    for key, value in metadata.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metadata keys must be non-empty strings, got {key!r}")
        if key in types:
            desc = types[key]
        elif key in LLAMA_CPP_TYPES and not isinstance(value, GGUFValue):
            desc = LLAMA_CPP_TYPES[key]
        else:
            desc = infer_type(value)
        header += _encode_kv(key, desc, value)

    offset = 0
    for t in pending:
        header += _pack_string(t.name, t.name)
        ne = tuple(reversed(t.shape))
        header += struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, t.qtype, offset)
        offset = _align(offset + t.nbytes, alignment)

    with replacing(path) as f:
        f.write(header)
        f.write(b"\0" * (_align(len(header), alignment) - len(header)))
        for t in pending:
            data = t.payload()
            assert data.size == t.nbytes, t.name  # quantize() honours tensor_nbytes
            f.write(memoryview(data))
            f.write(b"\0" * (_align(t.nbytes, alignment) - t.nbytes))

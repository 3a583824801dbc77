"""Weight tensors as the model code sees them, whatever file they came from.

A `WeightTensor` is raw bytes in a ggml block format (F32/F16/BF16 included)
with a NumPy-order shape; backends turn it into whatever their kernels want.
Rows are independent in every format, so fused tensors (Phi-3's qkv) can be
split by rows without touching the data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError
from .quants import DEQUANTIZABLE, QType, dequantize, row_nbytes


# Types ggml defines but never reads a weight in (llama.cpp can neither dequantize nor multiply one): the integer
# types (indices, positions) and the blocks activations are quantized to for the dot products. A weight, norm or
# bias of one is a corrupt or hostile file.
NOT_WEIGHT_TYPES = {QType.I8: "an integer type", QType.I16: "an integer type", QType.I32: "an integer type",
                    QType.I64: "an integer type", QType.Q8_1: "the activations' block type of Q4_1 and Q5_1 products",
                    QType.Q8_K: "the activations' block type of the K-quants' products"}


def check_weight_type(name: str, qtype) -> None:
    """ModelFormatError where a tensor's type is none a weight is stored in (NOT_WEIGHT_TYPES)."""
    kind = NOT_WEIGHT_TYPES.get(qtype)
    if kind is not None:
        raise ModelFormatError(f"tensor {name!r} is {QType(qtype).name}, {kind}: no weight, norm or bias is stored "
                               "in it (llama.cpp cannot read one either), the model file is corrupt")


def _f64_to_f32(name: str, data: np.ndarray, shape) -> np.ndarray:
    """An F64 tensor as float32 (rounding only); a value past float32's range is refused, not made infinite."""
    v = np.ascontiguousarray(data).reshape(-1)
    if v.size != 8 * int(np.prod(shape)):
        raise ModelFormatError(f"tensor {name!r}: {v.size} bytes for an F64 tensor of shape {tuple(shape)}")
    v = v.view("<f8")
    big = np.flatnonzero(np.abs(v) > np.finfo(np.float32).max)
    if len(big):
        raise ModelFormatError(f"tensor {name!r} (F64) holds {float(v[big[0]])!r} at index {int(big[0])}, past "
                               "float32's range: the model file is corrupt")
    return v.astype(np.float32).reshape(shape)


@dataclass
class WeightTensor:
    name: str
    qtype: QType
    shape: tuple[int, ...]     # NumPy order: (rows, cols) for a matrix, (n,) for a vector
    data: np.ndarray           # uint8, row-major bytes, zero-copy where the file allows

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.shape[-1])

    def rows2d(self) -> np.ndarray:
        """The bytes as (rows, row_nbytes)."""
        return self.data.reshape(self.rows, row_nbytes(self.qtype, self.cols))

    def to_float32(self) -> np.ndarray:
        check_weight_type(self.name, self.qtype)
        if self.qtype not in DEQUANTIZABLE:
            raise ModelFormatError(f"tensor {self.name!r}: {self.qtype.name} weights are not supported "
                                   "by any backend (no dequantizer)")
        if self.qtype == QType.F64:
            return _f64_to_f32(self.name, self.data, self.shape)
        return dequantize(self.data, self.qtype, self.shape)

    def split_rows(self, sizes: list[int]) -> list["WeightTensor"]:
        """Split a fused matrix (e.g. qkv) into consecutive row blocks."""
        if sum(sizes) != self.rows or len(self.shape) != 2:
            raise ModelFormatError(f"tensor {self.name!r}: cannot split {self.shape} into rows {sizes}")
        out, start, raw = [], 0, self.rows2d()
        for i, n in enumerate(sizes):
            out.append(WeightTensor(f"{self.name}[{i}]", self.qtype, (n, self.cols),
                                    raw[start:start + n].reshape(-1)))
            start += n
        return out

    def take_rows(self, index) -> "WeightTensor":
        """A matrix of the rows `index` (a copy): a file's grouped layout regrouped at load."""
        index = np.asarray(index, dtype=np.intp)
        if len(self.shape) != 2 or index.ndim != 1 or (len(index) and (index.min() < 0 or index.max() >= self.rows)):
            raise ModelFormatError(f"tensor {self.name!r}: cannot take rows of {self.shape}")
        return WeightTensor(self.name, self.qtype, (len(index), self.cols), self.rows2d()[index].reshape(-1))

    @classmethod
    def from_float(cls, name: str, array: np.ndarray) -> "WeightTensor":
        a = np.ascontiguousarray(array, dtype=np.float32)
        return cls(name, QType.F32, tuple(a.shape), a.reshape(-1).view(np.uint8))


class ByteTensor(WeightTensor):
    """Raw bytes that are not a weight by themselves (safetensors U8: the Hub's MXFP4 codes and
    exponents, which formats/experts.py repacks into MXFP4 weights); `data` is (numel,) uint8."""

    def to_float32(self) -> np.ndarray:
        raise ModelFormatError(f"tensor {self.name!r}: U8 bytes are not a weight by themselves")

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
        if self.qtype not in DEQUANTIZABLE:
            raise ModelFormatError(f"tensor {self.name!r}: {self.qtype.name} weights are not supported "
                                   "by any backend (no dequantizer)")
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

"""llama.cpp as an independent reference, through llama-cpp-python's bundled libraries (optional):
its quantizers (ggml_quantize_chunk in libggml-base) and its model runner."""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np


def ggml_base():
    """libggml-base from llama-cpp-python, or None when the package is absent."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def ggml_quantize(lib, x: np.ndarray, qtype: int, row_bytes: int) -> np.ndarray:
    """x (rows, cols) float32 -> the bytes llama.cpp's quantizer writes (no importance matrix)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], row_bytes), np.uint8)
    lib.ggml_quantize_init(qtype)
    n = lib.ggml_quantize_chunk(qtype, x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
    assert n == out.size, (n, out.size)
    return out

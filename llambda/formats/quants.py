"""ggml tensor types: the traits table and NumPy (de)quantization.

A quantized tensor is a sequence of rows; each row is a sequence of fixed-size
blocks, each block holding `block_size` values in `type_size` bytes. The byte
layouts below follow ggml's (the file format is the contract); the NumPy code
is ours and is the oracle the C kernels are tested against.

Dequantizers take blocks as a (n, type_size) uint8 array and return (n,
block_size) float32; quantizers do the reverse. Both are vectorized over
blocks and run in chunks so that dequantizing a large embedding does not need
gigabytes of temporaries.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ModelFormatError
from .quant_fit import (GROUP_EPS, affine_fit, grid_fit, nearest_level, refined_symmetric_fit, signed_absmax,
                        symmetric_fit)

QK_K = 256  # values per super-block of the K-quants


class QType(enum.IntEnum):
    """ggml tensor type ids, as stored in GGUF tensor infos."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


@dataclass(frozen=True)
class QTraits:
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block
    # Byte offsets of the block's scale fields (fp16, or one E8M0 exponent byte for MXFP4) and of
    # its fp16 min (a term subtracted apart from scale*q), where it has them: tests write sane
    # scales into random blocks and bound the rounding of the separate min term.
    scales: tuple[int, ...] = ()
    min_at: int | None = None
    scale_format: str = "f16"


def _t(qtype: QType, block_size: int, type_size: int, scales: tuple[int, ...] = (), min_at: int | None = None,
       scale_format: str = "f16") -> tuple[QType, QTraits]:
    return qtype, QTraits(qtype.name, block_size, type_size, scales, min_at, scale_format)


TRAITS: dict[QType, QTraits] = dict([
    _t(QType.F32, 1, 4),
    _t(QType.F16, 1, 2),
    _t(QType.Q4_0, 32, 2 + 16, (0,)),
    _t(QType.Q4_1, 32, 2 + 2 + 16, (0, 2), min_at=2),
    _t(QType.Q5_0, 32, 2 + 4 + 16, (0,)),
    _t(QType.Q5_1, 32, 2 + 2 + 4 + 16, (0, 2), min_at=2),
    _t(QType.Q8_0, 32, 2 + 32, (0,)),
    # ggml's block_q8_1 is two halves + 32 int8 (36 bytes); gguf-py's table
    # still lists the old 40-byte float layout. It never appears in files.
    _t(QType.Q8_1, 32, 2 + 2 + 32),
    _t(QType.Q2_K, QK_K, 16 + 64 + 2 + 2, (80, 82), min_at=82),
    _t(QType.Q3_K, QK_K, 32 + 64 + 12 + 2, (108,)),
    _t(QType.Q4_K, QK_K, 2 + 2 + 12 + 128, (0, 2), min_at=2),
    _t(QType.Q5_K, QK_K, 2 + 2 + 12 + 32 + 128, (0, 2), min_at=2),
    _t(QType.Q6_K, QK_K, 128 + 64 + 16 + 2, (208,)),
    _t(QType.Q8_K, QK_K, 4 + 256 + 32),
    _t(QType.IQ2_XXS, QK_K, 2 + 64),
    _t(QType.IQ2_XS, QK_K, 2 + 64 + 8),
    _t(QType.IQ3_XXS, QK_K, 2 + 64 + 32),
    _t(QType.IQ1_S, QK_K, 2 + 32 + 16),
    _t(QType.IQ4_NL, 32, 2 + 16, (0,)),
    _t(QType.IQ3_S, QK_K, 2 + 64 + 32 + 8 + 4),
    _t(QType.IQ2_S, QK_K, 2 + 64 + 16),
    _t(QType.IQ4_XS, QK_K, 2 + 2 + 128 + 4, (0,)),
    _t(QType.I8, 1, 1),
    _t(QType.I16, 1, 2),
    _t(QType.I32, 1, 4),
    _t(QType.I64, 1, 8),
    _t(QType.F64, 1, 8),
    _t(QType.IQ1_M, QK_K, 32 + 16 + 8),
    _t(QType.BF16, 1, 2),
    _t(QType.TQ1_0, QK_K, 2 + 52, (52,)),
    _t(QType.TQ2_0, QK_K, 2 + 64, (64,)),
    _t(QType.MXFP4, 32, 1 + 16, (0,), scale_format="e8m0"),
    _t(QType.NVFP4, 64, 4 + 32),
    _t(QType.Q1_0, 128, 2 + 16),
])

# Plain element types: a tensor of these is just a NumPy array of this dtype.
_PLAIN_DTYPES: dict[QType, np.dtype] = {
    QType.F32: np.dtype("<f4"),
    QType.F16: np.dtype("<f2"),
    QType.F64: np.dtype("<f8"),
    QType.I8: np.dtype("i1"),
    QType.I16: np.dtype("<i2"),
    QType.I32: np.dtype("<i4"),
    QType.I64: np.dtype("<i8"),
}


def as_qtype(qtype) -> QType:
    """`qtype` as a QType (accepts ints and names); unknown ids raise ModelFormatError."""
    if isinstance(qtype, QType):
        return qtype
    try:
        return QType[qtype] if isinstance(qtype, str) else QType(int(qtype))
    except (KeyError, ValueError, TypeError):
        raise ModelFormatError(f"unknown ggml tensor type {qtype!r}") from None


def row_nbytes(qtype, ncols: int) -> int:
    """Bytes of one row of `ncols` values of type `qtype`."""
    tr = TRAITS[as_qtype(qtype)]
    if ncols < 0 or ncols % tr.block_size:
        raise ModelFormatError(
            f"row length {ncols} is not a multiple of the {tr.name} block size {tr.block_size}")
    return ncols // tr.block_size * tr.type_size


def tensor_nbytes(qtype, shape) -> int:
    """Bytes of a tensor of NumPy-order `shape` (rows along the last axis)."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ModelFormatError("a tensor needs at least one dimension")
    nrows = 1
    for s in shape[:-1]:
        nrows *= s
    return nrows * row_nbytes(qtype, shape[-1])


def random_blocks(rng: np.random.Generator, qtype, nblocks: int, spread: float = 0.05) -> np.ndarray:
    """(nblocks, type_size) random blocks whose scale fields are finite and moderate (|d| <= spread, or
    an E8M0 exponent near 2^-6): any code bits are valid, garbage scales are not. For tests and benchmarks."""
    tr = TRAITS[as_qtype(qtype)]
    raw = rng.integers(0, 256, (nblocks, tr.type_size), dtype=np.uint8)
    for at in tr.scales:
        if tr.scale_format == "e8m0":
            raw[:, at] = rng.integers(119, 123, nblocks, dtype=np.uint8)
        else:
            d = rng.uniform(-spread, spread, nblocks).astype("<f2")
            raw[:, at:at + 2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw


# ---------------------------------------------------------------- helpers

def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The little-endian half at byte `at` of each block, as a (n, 1) float32 column."""
    return blocks[:, at:at + 2].view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., k) packed bytes -> (..., 2k) values: all low nibbles, then all high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits_le(b: np.ndarray) -> np.ndarray:
    """(..., k) bytes -> (..., 8k) bits, bit j of byte i at position 8i + j."""
    return np.unpackbits(b, axis=-1, bitorder="little")


def _k_scales_unpack(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes hold eight 6-bit scales and eight 6-bit mins.

    Bytes 0-3: scales 0-3 (low 6 bits) + top 2 bits of scales 4-7;
    bytes 4-7: mins 0-3 + top 2 bits of mins 4-7; bytes 8-11: low nibble =
    scales 4-7 low 4 bits, high nibble = mins 4-7 low 4 bits.
    """
    a, b, c = sc12[:, 0:4], sc12[:, 4:8], sc12[:, 8:12]
    scales = np.concatenate([a & 63, (c & 0x0F) | ((a >> 6) << 4)], axis=1)
    mins = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return scales, mins


def _k_scales_pack(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """Inverse of _k_scales_unpack; scales and mins are (n, 8) ints in 0..63."""
    scales = scales.astype(np.uint8)
    mins = mins.astype(np.uint8)
    a = (scales[:, :4] & 63) | ((scales[:, 4:] >> 4) << 6)
    b = (mins[:, :4] & 63) | ((mins[:, 4:] >> 4) << 6)
    c = (scales[:, 4:] & 0x0F) | ((mins[:, 4:] & 0x0F) << 4)
    return np.concatenate([a, b, c], axis=1)


def _as_bytes(*parts: np.ndarray) -> np.ndarray:
    """Concatenate per-block fields (each (n, k) of any dtype) into (n, type_size) uint8."""
    n = parts[0].shape[0]
    return np.concatenate(
        [np.ascontiguousarray(p).view(np.uint8).reshape(n, -1) for p in parts], axis=1)


def _half(x: np.ndarray) -> np.ndarray:
    """float32 column -> little-endian float16 (the stored scale)."""
    return x.astype("<f2")


# ---------------------------------------------------------------- dequantizers

def _dq_q4_0(b):
    d = _f16(b, 0)
    return (_nibbles(b[:, 2:18]).astype(np.int8) - 8) * d


def _dq_q4_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    return _nibbles(b[:, 4:20]) * d + m


def _dq_q5_0(b):
    d = _f16(b, 0)
    q = _nibbles(b[:, 6:22]) | (_bits_le(b[:, 2:6]) << 4)
    return (q.astype(np.int8) - 16) * d


def _dq_q5_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 8:24]) | (_bits_le(b[:, 4:8]) << 4)
    return q * d + m


def _dq_q8_0(b):
    return b[:, 2:34].view(np.int8) * _f16(b, 0)


def _dq_q8_1(b):
    return b[:, 4:36].view(np.int8) * _f16(b, 0)


def _dq_q8_k(b):
    d = b[:, 0:4].view("<f4")
    return b[:, 4:260].view(np.int8) * d


def _dq_q2_k(b):
    n = b.shape[0]
    sc = b[:, 0:16]
    d, dmin = _f16(b, 80), _f16(b, 82)
    # Each 32-byte half of qs holds 128 values as four 2-bit planes.
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = (qs >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (n, 2, 4, 32)
    q = q.reshape(n, 16, 16)
    scale = (d * (sc & 0x0F))[:, :, None]
    offset = (dmin * (sc >> 4))[:, :, None]
    return (q * scale - offset).reshape(n, QK_K)


def _q3_k_scales(sc12: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit scales (stored +32): low nibbles in bytes 0-7, top 2 bits in bytes 8-11."""
    low = np.concatenate([sc12[:, :8] & 0x0F, sc12[:, :8] >> 4], axis=1)
    top = (sc12[:, 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3  # (n, 4 bytes, 4 shifts)
    top = top.transpose(0, 2, 1).reshape(-1, 16)  # scale i takes shift i//4 of byte i%4
    return (low | (top << 4)).astype(np.int8) - 32


def _dq_q3_k(b):
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    d = _f16(b, 108)
    scales = _q3_k_scales(b[:, 96:108])
    low = ((qs >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).reshape(n, 8, 32)
    # High bit j of hmask[l] belongs to plane j; a clear bit means "subtract 4".
    high = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    q = low.astype(np.int8) - ((high ^ 1) << 2).astype(np.int8)
    return (q.reshape(n, 16, 16) * (d * scales)[:, :, None]).reshape(n, QK_K)


def _dq_q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales_unpack(b[:, 4:16])
    # 4 chunks of 32 bytes; each gives 32 values from low nibbles then 32 from high.
    q = _nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    return (q * (d * sc)[:, :, None] - (dmin * mn)[:, :, None]).reshape(n, QK_K)


def _dq_q5_k(b):
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scales_unpack(b[:, 4:16])
    low = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    # Bit s of qh[l] is the fifth bit of value l of sub-block s.
    high = (b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    q = low | (high << 4)
    return (q * (d * sc)[:, :, None] - (dmin * mn)[:, :, None]).reshape(n, QK_K)


def _dq_q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    scales = b[:, 192:208].view(np.int8)
    d = _f16(b, 208)
    # Per 128-value half: low nibbles of ql give values 0-63, high nibbles 64-127;
    # qh byte l carries the top 2 bits of values l, l+32, l+64, l+96.
    low = _nibbles(ql).reshape(n, 2, 4, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    q = (low | (high << 4)).astype(np.int8) - 32
    return (q.reshape(n, 16, 16) * (d * scales)[:, :, None]).reshape(n, QK_K)


# IQ4_NL/IQ4_XS: a nibble indexes this non-uniform grid (ggml's kvalues_iq4nl), times the scale.
IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# MXFP4: a nibble is an FP4 (e2m1) value, here doubled to integers; the scale 2^(e-127) is halved.
FP4_GRID = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _grid_nibbles(qs: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) grid values: low nibbles, then high nibbles."""
    return grid[_nibbles(qs)].astype(np.float32)


def _dq_iq4_nl(b):
    return _grid_nibbles(b[:, 2:18], IQ4_GRID) * _f16(b, 0)


def _iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """Eight 6-bit sub-block scales (stored +32): low nibbles in bytes 4-7, top 2 bits in the u16 at 2."""
    lo = _nibbles(b[:, 4:8])[:, [0, 4, 1, 5, 2, 6, 3, 7]]  # sub-block j: nibble j%2 of byte j//2
    hi = (b[:, 2:4].view("<u2").astype(np.int32) >> (2 * np.arange(8))) & 3
    return (lo | (hi << 4)).astype(np.int32) - 32


def _dq_iq4_xs(b):
    n = b.shape[0]
    q = _grid_nibbles(b[:, 8:136].reshape(n, 8, 16), IQ4_GRID)  # (n, 8, 32)
    return (q * (_f16(b, 0) * _iq4_xs_scales(b))[:, :, None]).reshape(n, QK_K)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 exponent byte -> 2^(e-127) / 2, exactly (tiny exponents are subnormal floats)."""
    return np.ldexp(np.float32(1), e.astype(np.int32) - 128).astype(np.float32)


def _dq_mxfp4(b):
    return _grid_nibbles(b[:, 1:17], FP4_GRID) * _e8m0_half(b[:, 0:1])


def _dq_tq2_0(b):
    # ternary codes as Q2_K's 2-bit planes: two 32-byte halves, four shifts each; value = (q - 1) * d
    n = b.shape[0]
    q = (b[:, 0:64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    return (q.reshape(n, QK_K).astype(np.float32) - 1) * _f16(b, 64)


def _trits(qs: np.ndarray, count: int) -> np.ndarray:
    """Base-3 digits packed 5 (or 4) per byte as fixed-point fractions of 256: digit k is the top
    of (byte * 3^k mod 256) * 3 / 256. (n, m) bytes -> (n, count, m) digits 0..2."""
    pow3 = np.array([1, 3, 9, 27, 81], np.uint16)[:count, None]
    frac = (qs[:, None, :].astype(np.uint16) * pow3) & 0xFF
    return ((frac * 3) >> 8).astype(np.int8)


def _dq_tq1_0(b):
    n = b.shape[0]
    q = np.concatenate([_trits(b[:, 0:32], 5).reshape(n, 160), _trits(b[:, 32:48], 5).reshape(n, 80),
                        _trits(b[:, 48:52], 4).reshape(n, 16)], axis=1)
    return (q.astype(np.float32) - 1) * _f16(b, 52)


_DEQUANT: dict[QType, Callable[[np.ndarray], np.ndarray]] = {
    QType.Q4_0: _dq_q4_0,
    QType.Q4_1: _dq_q4_1,
    QType.Q5_0: _dq_q5_0,
    QType.Q5_1: _dq_q5_1,
    QType.Q8_0: _dq_q8_0,
    QType.Q8_1: _dq_q8_1,
    QType.Q2_K: _dq_q2_k,
    QType.Q3_K: _dq_q3_k,
    QType.Q4_K: _dq_q4_k,
    QType.Q5_K: _dq_q5_k,
    QType.Q6_K: _dq_q6_k,
    QType.Q8_K: _dq_q8_k,
    QType.IQ4_NL: _dq_iq4_nl,
    QType.IQ4_XS: _dq_iq4_xs,
    QType.MXFP4: _dq_mxfp4,
    QType.TQ1_0: _dq_tq1_0,
    QType.TQ2_0: _dq_tq2_0,
}

DEQUANTIZABLE = frozenset(_DEQUANT) | {QType.BF16} | frozenset(_PLAIN_DTYPES)

# Values per chunk: bounds the temporaries (a few x 4 MiB) and keeps them in cache.
_CHUNK_VALUES = 1 << 20


def _dequantize_blocks(blocks: np.ndarray, qtype: QType) -> np.ndarray:
    """(n, type_size) uint8 -> (n * block_size,) float32, in chunks."""
    tr = TRAITS[qtype]
    fn = _DEQUANT[qtype]
    n = blocks.shape[0]
    out = np.empty((n, tr.block_size), dtype=np.float32)
    step = max(1, _CHUNK_VALUES // tr.block_size)
    with np.errstate(invalid="ignore", over="ignore"):  # garbage scales may be inf/nan
        for i in range(0, n, step):
            out[i:i + step] = fn(blocks[i:i + step])
    return out.reshape(-1)


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _check_raw(raw: np.ndarray, expected: int, what: str) -> np.ndarray:
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"{what}: raw data must be uint8, got {raw.dtype}")
    if raw.size != expected:
        raise ModelFormatError(f"{what}: expected {expected} bytes, got {raw.size}")
    if not raw.flags.c_contiguous:
        raw = np.ascontiguousarray(raw)
    return raw.reshape(-1)


def dequantize(raw: np.ndarray, qtype, shape) -> np.ndarray:
    """Bytes of a `qtype` tensor of NumPy-order `shape` -> float32 array of that shape."""
    qtype = as_qtype(qtype)
    shape = tuple(int(s) for s in shape)
    raw = _check_raw(raw, tensor_nbytes(qtype, shape), f"{qtype.name} tensor of shape {shape}")
    if qtype in _PLAIN_DTYPES:
        return raw.view(_PLAIN_DTYPES[qtype]).astype(np.float32).reshape(shape)
    if qtype == QType.BF16:
        return _bf16_to_f32(raw).reshape(shape)
    if qtype not in _DEQUANT:
        raise ModelFormatError(f"dequantization of {qtype.name} tensors is not supported")
    blocks = raw.reshape(-1, TRAITS[qtype].type_size)
    return _dequantize_blocks(blocks, qtype).reshape(shape)


# ---------------------------------------------------------------- quantizers


def _inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _round_away(x: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero (np.round rounds halves to even).

    Not trunc(x + 0.5): that addition itself rounds, e.g. for 0.49999997.
    """
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= np.float32(0.5)), x)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 2k) values < 16 -> (n, k) bytes: first half low nibbles, second half high."""
    k = q.shape[1] // 2
    return (q[:, :k] & 0x0F) | (q[:, k:] << 4)


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) values < 32 -> (n, 4) bytes holding bit 4 of each, little-endian bit order."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


# The legacy 32-blocks use ggml's reference rounding (truncate after +0.5
# offsets) so that our bytes match files quantized by ggml.

def _q_q4_0(x):
    d = signed_absmax(x) / np.float32(-8)
    q = np.minimum(np.trunc(x * _inv(d) + np.float32(8.5)), 15).astype(np.uint8)
    return _as_bytes(_half(d), _pack_nibbles(q))


def _q_q4_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = np.minimum(np.trunc((x - lo) * _inv(d) + np.float32(0.5)), 15).astype(np.uint8)
    return _as_bytes(_half(d), _half(lo), _pack_nibbles(q))


def _q_q5_0(x):
    d = signed_absmax(x) / np.float32(-16)
    q = np.minimum(np.trunc(x * _inv(d) + np.float32(16.5)), 31).astype(np.uint8)
    return _as_bytes(_half(d), _pack_fifth_bits(q), _pack_nibbles(q & 0x0F))


def _q_q5_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(31)
    q = np.minimum(np.trunc((x - lo) * _inv(d) + np.float32(0.5)), 31).astype(np.uint8)
    return _as_bytes(_half(d), _half(lo), _pack_fifth_bits(q), _pack_nibbles(q & 0x0F))


def _q_q8_0(x):
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_away(x * _inv(d)).astype(np.int8)
    return _as_bytes(_half(d), q)


def _q_q8_1(x):
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_away(x * _inv(d)).astype(np.int8)
    s = d * q.sum(axis=1, keepdims=True, dtype=np.int32).astype(np.float32)
    return _as_bytes(_half(d), _half(s), q)


def _q_q8_k(x):
    n = x.shape[0]
    amax = signed_absmax(x)
    iscale = _inv(amax) * np.float32(-127)
    q = np.minimum(np.rint(x * iscale), 127).astype(np.int8)
    d = _inv(iscale)
    bsums = q.reshape(n, 16, 16).sum(axis=2, dtype=np.int16).astype("<i2")
    return _as_bytes(d.astype("<f4"), q, bsums)


def _two_bit_planes(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes < 4 -> (n, 64) bytes: per 128-value half, value 32j + l in bits 2j of byte l."""
    n = q.shape[0]
    planes = q.reshape(n, 2, 4, 32).astype(np.uint8) << np.array([0, 2, 4, 6], np.uint8)[:, None]
    return planes.sum(axis=2, dtype=np.uint8).reshape(n, 64)


def _codes(x: np.ndarray, step: np.ndarray, lo: int, hi: int, offset: np.ndarray | float = 0) -> np.ndarray:
    """round((x + offset) / step) clipped to lo..hi, per group (step and offset are (..., 1));
    where step is 0 the code is 0 (the group then decodes to -offset whatever its codes)."""
    return np.clip(np.rint((x + offset) * _inv(step)), lo, hi).astype(np.int32)


def _super_scale(sub: np.ndarray, top: float) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative sub-block values (n, k) -> (f16 super-scale d (n, 1), codes round(sub / d) <= top)
    with the largest value at `top`."""
    big = sub.max(axis=1, keepdims=True)
    d = _half(big / np.float32(top)).astype(np.float32)
    codes = np.clip(np.rint(sub * _safe_inv(big / np.float32(top))), 0, top)
    return d, codes


def _safe_inv(d: np.ndarray) -> np.ndarray:
    return _inv(d.astype(np.float32))


def _q_k_affine(x, nmax: int, group: int, top: int, search: tuple) -> tuple:
    """Q2_K/Q4_K/Q5_K: per `group`-value sub-block a scale and a min, both coded in 0..top under
    f16 super-scales d and dmin; codes in 0..nmax. Sub-block fits by `affine_fit(*search)` (weights
    |x| for Q2_K, rms + |x| for the others, as ggml). Returns (d, dmin, sc, mn, q (n, 256))."""
    n = x.shape[0]
    sub = x.reshape(n * QK_K // group, group)
    if group == 16:
        w = np.abs(sub)
    else:
        w = np.sqrt(np.mean(sub * sub, axis=1, keepdims=True)) + np.abs(sub)
    scale, neg_min = affine_fit(sub, w, nmax, *search)
    scale = np.maximum(scale, 0).astype(np.float32).reshape(n, -1)
    neg_min = neg_min.astype(np.float32).reshape(n, -1)
    d, sc = _super_scale(scale, top)
    dmin, mn = _super_scale(neg_min, top)
    step = (d * sc)[:, :, None]
    q = _codes(x.reshape(n, -1, group), step, 0, nmax, (dmin * mn)[:, :, None])
    return d, dmin, sc.astype(np.uint8), mn.astype(np.uint8), q.reshape(n, QK_K)


def _q_q2_k(x):
    d, dmin, sc, mn, q = _q_k_affine(x, 3, 16, 15, (-0.5, 0.1, 15, True))
    return _as_bytes(sc | (mn << 4), _two_bit_planes(q), _half(d), _half(dmin))


def _q_q3_k(x):
    n = x.shape[0]
    scale = refined_symmetric_fit(x.reshape(n * 16, 16), 4).astype(np.float32).reshape(n, 16)
    big = signed_absmax(scale)
    iscale = np.float32(-32) * _inv(big)
    ls = np.clip(np.rint(scale * iscale), -32, 31).astype(np.int32)
    d = _half(_inv(iscale)).astype(np.float32)
    ls = np.where(big == 0, -32, ls)      # an all-zero block: zero scale bytes
    q = _codes(x.reshape(n, 16, 16), (d * ls)[:, :, None], -4, 3).reshape(n, QK_K) + 4
    hmask = np.packbits((q > 3).reshape(n, 8, 32).astype(np.uint8), axis=1, bitorder="little")[:, 0, :]
    u = (ls + 32).astype(np.uint8)
    low = (u[:, :8] & 0x0F) | ((u[:, 8:] & 0x0F) << 4)
    top = (u >> 4).reshape(n, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]  # scale j -> byte j%4
    return _as_bytes(hmask, _two_bit_planes(q & 3), low, top.sum(axis=1, dtype=np.uint8), _half(d))


def _q_q4_k(x):
    d, dmin, sc, mn, q = _q_k_affine(x, 15, 32, 63, (-1.0, 0.1, 20))
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).astype(np.uint8).reshape(-1, 128)
    return _as_bytes(_half(d), _half(dmin), _k_scales_pack(sc, mn), qs)


def _q_q5_k(x):
    n = x.shape[0]
    d, dmin, sc, mn, q = _q_k_affine(x, 31, 32, 63, (-0.5, 0.1, 15))
    q = q.astype(np.uint8).reshape(n, 4, 2, 32)
    qs = ((q[:, :, 0, :] & 0x0F) | ((q[:, :, 1, :] & 0x0F) << 4)).reshape(n, 128)
    fifth = ((q >> 4) & 1).reshape(n, 8, 32)  # sub-block s -> bit s of qh[l]
    qh = (fifth << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1, dtype=np.uint8)
    return _as_bytes(_half(d), _half(dmin), _k_scales_pack(sc, mn), qh, qs)


def _q_q6_k(x):
    n = x.shape[0]
    sub = x.reshape(n * 16, 16)
    scale = symmetric_fit(sub, sub * sub, 32).astype(np.float32).reshape(n, 16)
    big = signed_absmax(scale)
    zero = np.abs(big) < GROUP_EPS
    iscale = np.where(zero, 0, np.float32(-128) * _inv(big)).astype(np.float32)
    d = _half(_inv(iscale)).astype(np.float32)
    sc = np.minimum(np.rint(scale * iscale), 127).astype(np.int8)
    q = (_codes(x.reshape(n, 16, 16), (d * sc)[:, :, None], -32, 31) + 32).astype(np.uint8)
    q = np.where(zero[:, :, None], 0, q).reshape(n, 2, 4, 32)  # half, group of 32, value
    ql = (q[:, :, 0:2, :] & 0x0F) | ((q[:, :, 2:4, :] & 0x0F) << 4)  # (n, 2, 2, 32)
    qh = ((q >> 4) << np.array([0, 2, 4, 6], np.uint8)[:, None]).sum(axis=2, dtype=np.uint8)
    return _as_bytes(ql.reshape(n, 128), qh.reshape(n, 64), sc, _half(d))


# IQ4: ggml's grid search with weights x^2 and 7 shifts of the grid each way.
_IQ4_TRIES = 7


def _iq4_codes(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Nibbles of x / step on the IQ4 grid (ascending, so the index is the code)."""
    return nearest_level(x * _inv(step), IQ4_GRID.astype(np.float32)).astype(np.uint8)


def _q_iq4_nl(x):
    d = _half(grid_fit(x, x * x, IQ4_GRID, _IQ4_TRIES).astype(np.float32)[:, None]).astype(np.float32)
    return _as_bytes(_half(d), _pack_nibbles(_iq4_codes(x, d)))


def _q_iq4_xs(x):
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    s = grid_fit(sub, sub * sub, IQ4_GRID, _IQ4_TRIES).astype(np.float32).reshape(n, 8)
    d = _half(signed_absmax(s) / np.float32(-32)).astype(np.float32)  # the largest step at scale -32
    ls = np.clip(np.rint(s * _inv(d)), -32, 31).astype(np.int32)
    q = _iq4_codes(x.reshape(n, 8, 32), (d * ls)[:, :, None])
    u = (ls + 32).astype(np.uint16)
    lo = (u & 0x0F).astype(np.uint8)
    scales_l = lo[:, 0::2] | (lo[:, 1::2] << 4)
    scales_h = ((u >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)[:, None]
    return _as_bytes(_half(d), scales_h.astype("<u2"), scales_l, _pack_nibbles(q.reshape(n * 8, 32)).reshape(n, 128))


def _q_mxfp4(x):
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        # the block's largest value lands in [4, 8) times the scale, near e2m1's top (6)
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0)
    e = np.clip(e, 0, 254).astype(np.uint8)
    v = (x * np.ldexp(1.0, 128 - e.astype(np.int32))).astype(np.float32)  # doubled units; 2^128 is not a float32
    mag = nearest_level(np.abs(v), FP4_GRID[:8].astype(np.float32)).astype(np.uint8)
    q = np.where((v < 0) & (mag > 0), mag | 8, mag).astype(np.uint8)
    return _as_bytes(e, _pack_nibbles(q))


_QUANT: dict[QType, Callable[[np.ndarray], np.ndarray]] = {
    QType.Q4_0: _q_q4_0,
    QType.Q4_1: _q_q4_1,
    QType.Q5_0: _q_q5_0,
    QType.Q5_1: _q_q5_1,
    QType.Q8_0: _q_q8_0,
    QType.Q8_1: _q_q8_1,
    QType.Q2_K: _q_q2_k,
    QType.Q3_K: _q_q3_k,
    QType.Q4_K: _q_q4_k,
    QType.Q5_K: _q_q5_k,
    QType.Q6_K: _q_q6_k,
    QType.Q8_K: _q_q8_k,
    QType.IQ4_NL: _q_iq4_nl,
    QType.IQ4_XS: _q_iq4_xs,
    QType.MXFP4: _q_mxfp4,
}


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even; NaNs stay NaN (quieted) rather than rounding to inf."""
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    quiet = ((u >> 16) | 0x40).astype(np.uint16)
    return np.where(nan, quiet, rounded).astype("<u2")


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """float array (rows along the last axis) -> uint8 of shape x.shape[:-1] + (row_nbytes,).

    `.ravel()` of the result is the tensor's bytes as stored in a GGUF file.
    """
    qtype = as_qtype(qtype)
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("quantize needs at least a 1-D array")
    rb = row_nbytes(qtype, x.shape[-1])
    out_shape = x.shape[:-1] + (rb,)
    if qtype in _PLAIN_DTYPES:
        return np.ascontiguousarray(x.astype(_PLAIN_DTYPES[qtype])).view(np.uint8).reshape(out_shape)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == QType.BF16:
        return _f32_to_bf16(x).view(np.uint8).reshape(out_shape)
    if qtype not in _QUANT:
        raise ModelFormatError(f"quantization to {qtype.name} is not supported")
    tr = TRAITS[qtype]
    blocks = x.reshape(-1, tr.block_size)
    out = np.empty((blocks.shape[0], tr.type_size), dtype=np.uint8)
    step = max(1, _QUANT_CHUNK_VALUES // tr.block_size)

    def chunk(i: int) -> None:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):   # per thread
            out[i:i + step] = _QUANT[qtype](blocks[i:i + step])

    starts = range(0, blocks.shape[0], step)
    if len(starts) > 1 and _quant_workers() > 1:   # NumPy releases the GIL inside each array operation
        list(_quant_pool().map(chunk, starts))
    else:
        for i in starts:
            chunk(i)
    return out.reshape(out_shape)


# quantize(): values per chunk (each chunk's temporaries stay near the core's L2; measured 1.3x faster
# than 1 Mi values) and the threads that share the chunks: the CPUs this process may run on.
_QUANT_CHUNK_VALUES = 1 << 18
_POOL: dict = {}   # pid -> its pool (a forked child has none of its parent's threads)


def _quant_workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)))


def _quant_pool():
    pid = os.getpid()
    if pid not in _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.clear()
        _POOL[pid] = ThreadPoolExecutor(_quant_workers(), thread_name_prefix="llambda-quantize")
    return _POOL[pid]

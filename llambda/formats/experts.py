"""Expert weights as one 3-D tensor (E, rows, cols), whether the file stores them so (GGUF
`ffn_*_exps`) or one matrix per expert (the Hugging Face Hub layout, stacked here).

Backends take expert e as a (rows, cols) matrix (`expert_matrix`); a stack of per-expert
tensors is never concatenated unless a backend asks for the whole 3-D data.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .quants import QType
from .weights import ByteTensor, WeightTensor


class StackedExperts(WeightTensor):
    """E per-expert (rows, cols) tensors of one type seen as one (E, rows, cols) tensor."""

    def __init__(self, name: str, parts: list[WeightTensor]):
        first = parts[0]
        self.name, self.qtype, self.parts = name, first.qtype, parts
        self.shape = (len(parts), *first.shape)

    @property
    def data(self) -> np.ndarray:       # only when a backend wants the whole tensor (the NumPy oracle)
        return np.concatenate([p.data.reshape(-1) for p in self.parts])


def expert_matrix(w: WeightTensor, e: int) -> WeightTensor:
    """Expert e of a 3-D expert tensor as a (rows, cols) matrix, without copying."""
    if len(w.shape) != 3 or not 0 <= e < w.shape[0]:
        raise ModelFormatError(f"tensor {w.name!r} of shape {w.shape} has no expert {e}")
    if isinstance(w, StackedExperts):
        return w.parts[e]
    rows = w.shape[1]
    raw = w.rows2d()
    return WeightTensor(f"{w.name}[{e}]", w.qtype, tuple(w.shape[1:]), raw[e * rows:(e + 1) * rows].reshape(-1))


class ExpertStacks:
    """Collects per-expert tensors by their stacked name, then checks and stacks them."""

    def __init__(self):
        self.parts: dict[str, dict[int, tuple[str, WeightTensor]]] = {}

    def add(self, stacked_name: str, expert: int, file_name: str, t: WeightTensor) -> None:
        group = self.parts.setdefault(stacked_name, {})
        if expert in group:
            raise ModelFormatError(f"tensor {file_name!r}: expert {expert} appears twice")
        group[expert] = (file_name, t)

    def stacked(self) -> dict[str, WeightTensor]:
        out = {}
        for name, group in self.parts.items():
            n = len(group)
            if sorted(group) != list(range(n)):
                # n distinct ids that are not 0..n-1 leave a gap below n; range(max + 1) was a set of
                # billions for an expert numbered 3000000000 in a tensor name
                missing = [e for e in range(n) if e not in group]
                raise ModelFormatError(f"{name}: experts {missing[:8]} are missing (ids go up to {max(group)})")
            parts = [group[e][1] for e in range(n)]
            for e, p in enumerate(parts):
                if len(p.shape) != 2:       # expert 0's own shape was named as the one it differed from
                    raise ModelFormatError(f"tensor {group[e][0]!r} has shape {p.shape}: an expert's weight is a matrix")
                if p.shape != parts[0].shape or p.qtype != parts[0].qtype:
                    raise ModelFormatError(f"tensor {group[e][0]!r} has shape {p.shape} ({p.qtype.name}), unlike "
                                           f"expert 0's {parts[0].shape} ({parts[0].qtype.name})")
            out[name] = StackedExperts(name, parts)
        return out


# GPT-OSS's Hub layout: all experts in one tensor, input-major (x @ W), gate and up interleaved
# by column; -> GGUF's (E, rows, cols) output-major tensors, gate and up apart.
# fused tensor -> the canonical leaves split_gpt_oss makes of it
GPT_OSS_LEAVES = {"mlp.experts.gate_up_proj": ("ffn_gate_exps.weight", "ffn_up_exps.weight"),
                  "mlp.experts.gate_up_proj_bias": ("ffn_gate_exps.bias", "ffn_up_exps.bias"),
                  "mlp.experts.down_proj": ("ffn_down_exps.weight",),
                  "mlp.experts.down_proj_bias": ("ffn_down_exps.bias",)}
GPT_OSS_FUSED = tuple(GPT_OSS_LEAVES)


def split_gpt_oss(suffix: str, t: WeightTensor, file_name: str) -> dict[str, WeightTensor]:
    """One fused GPT-OSS expert tensor as canonical leaf name -> tensor (floats, transposed)."""
    if suffix not in GPT_OSS_FUSED:
        raise ModelFormatError(f"tensor {file_name!r} is not supported (unknown layer tensor)")
    want = 3 if suffix.endswith("proj") else 2
    if len(t.shape) != want or (suffix.startswith("mlp.experts.gate_up") and t.shape[-1] % 2):
        raise ModelFormatError(f"tensor {file_name!r} has shape {t.shape}, not a GPT-OSS expert tensor")
    v = t.to_float32().reshape(t.shape)
    f = WeightTensor.from_float
    if suffix == "mlp.experts.gate_up_proj":          # (E, in, 2I)
        return {"ffn_gate_exps.weight": f(file_name, v[:, :, 0::2].transpose(0, 2, 1)),
                "ffn_up_exps.weight": f(file_name, v[:, :, 1::2].transpose(0, 2, 1))}
    if suffix == "mlp.experts.gate_up_proj_bias":     # (E, 2I)
        return {"ffn_gate_exps.bias": f(file_name, v[:, 0::2]), "ffn_up_exps.bias": f(file_name, v[:, 1::2])}
    if suffix == "mlp.experts.down_proj":             # (E, I, d)
        return {"ffn_down_exps.weight": f(file_name, v.transpose(0, 2, 1))}
    return {"ffn_down_exps.bias": f(file_name, v)}    # (E, d)


# The Hub's MXFP4 GPT-OSS experts (quantization_config quant_method "mxfp4"): for each fused tensor
# `{name}_blocks` (E, rows, n_blocks, 16) uint8 and `{name}_scales` (E, rows, n_blocks) uint8, output-major
# (rows: 2I gate/up interleaved, or d for down_proj). A block's 32 values are the FP4 codes of its 16
# bytes with value 2j in byte j's low nibble and value 2j+1 in its high nibble; ggml's block_mxfp4 is
# the E8M0 byte, then 16 bytes with value j in byte j's low nibble and value j+16 in its high nibble.
# Both scale by 2^(e-127) the same e2m1 values, so the exponent byte is copied as it is.
GPT_OSS_MXFP4 = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _check_mxfp4(blocks: WeightTensor, scales: WeightTensor, names: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Checked Hub blocks + scales as (E, rows, n_blocks, 16) and (E, rows, n_blocks) views of the file."""
    for t, n, dims in ((blocks, names[0], 4), (scales, names[1], 3)):
        if not isinstance(t, ByteTensor):
            raise ModelFormatError(f"tensor {n!r} is {t.qtype.name}, not U8 MXFP4 data")
        if len(t.shape) != dims:
            raise ModelFormatError(f"tensor {n!r} has shape {t.shape}, not {dims}-D MXFP4 data")
    if blocks.shape[-1] != 16 or tuple(scales.shape) != tuple(blocks.shape[:3]) or 0 in blocks.shape:
        raise ModelFormatError(f"tensor {names[0]!r} has shape {blocks.shape} (scales {scales.shape}), not "
                               "(experts, rows, blocks, 16) with a scale per block")
    return blocks.data.reshape(blocks.shape), scales.data.reshape(scales.shape)


def _repack_mxfp4(b: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The Hub's (..., 16) code bytes and (...) exponents -> ggml's (..., 17) MXFP4 blocks."""
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:-1], 32)   # the Hub's value order
    packed = codes[..., :16] | (codes[..., 16:] << 4)                            # ggml's
    return np.concatenate([e[..., None], packed], axis=-1)


class _RepackedExpert(WeightTensor):
    """One expert's rows of a Hub MXFP4 tensor, repacked into ggml blocks when its bytes are read: a
    load holds one expert's repacked copy at a time, not the model's (the file stays mapped)."""

    def __init__(self, name: str, blocks: np.ndarray, scales: np.ndarray):
        self.name, self.qtype, self._blocks, self._scales = name, QType.MXFP4, blocks, scales
        self.shape = (blocks.shape[0], blocks.shape[1] * 32)

    @property
    def data(self) -> np.ndarray:
        return _repack_mxfp4(self._blocks, self._scales).reshape(-1)


def split_gpt_oss_mxfp4(base: str, blocks: WeightTensor, scales: WeightTensor,
                        names: tuple[str, str]) -> dict[str, WeightTensor]:
    """A fused MXFP4 expert tensor as canonical leaf name -> MXFP4 (E, rows, cols) tensor (not dequantized)."""
    b, e = _check_mxfp4(blocks, scales, names)

    def mx(rows: slice) -> WeightTensor:
        return StackedExperts(names[0], [_RepackedExpert(f"{names[0]}[{x}]", b[x, rows], e[x, rows])
                                         for x in range(b.shape[0])])

    if base == "mlp.experts.down_proj":
        return {"ffn_down_exps.weight": mx(slice(None))}
    if b.shape[1] % 2:
        raise ModelFormatError(f"tensor {names[0]!r} has {b.shape[1]} rows: gate and up rows are interleaved, "
                               "so even")
    return {"ffn_gate_exps.weight": mx(slice(0, None, 2)), "ffn_up_exps.weight": mx(slice(1, None, 2))}


class TransposedExpert(WeightTensor):
    """Expert e of a float (E, C, R) tensor stored input-major (x @ W, as some Hub checkpoints keep their fused
    experts), columns lo..hi-1 as the output-major (hi - lo, C) matrix a backend takes. Its bytes are a transposed
    copy of that expert alone, made each time they are read (a backend packs an expert once): opening the file
    copies nothing."""

    def __init__(self, name: str, src: WeightTensor, e: int, lo: int, hi: int):
        if src.qtype not in (QType.F32, QType.F16, QType.BF16) or len(src.shape) != 3:
            raise ModelFormatError(f"tensor {src.name!r} ({src.qtype.name}, {src.shape}): input-major experts are "
                                   "read as F32, F16 or BF16 (E, in, out) tensors")
        if not (0 <= e < src.shape[0] and 0 <= lo < hi <= src.shape[2]):
            raise ModelFormatError(f"tensor {src.name!r} of shape {src.shape} has no expert {e} columns {lo}..{hi}")
        self.name, self.qtype, self.shape = name, src.qtype, (hi - lo, src.shape[1])
        self._src, self._at = src, (e, lo, hi)

    @property
    def data(self) -> np.ndarray:
        e, lo, hi = self._at
        E, C, R = self._src.shape
        size = 4 if self.qtype == QType.F32 else 2
        raw = self._src.data.reshape(E, C, R, size)[e, :, lo:hi]
        return np.ascontiguousarray(raw.transpose(1, 0, 2)).reshape(-1)

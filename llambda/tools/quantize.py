"""Re-quantize float weights at load (`llambda.load(..., quantize="q8_0")`).

Only the 2-D float matrices (projections, embeddings, the output head) are
quantized: they are where the bytes and the time go, and the block kernels apply
to them. Norm weights and biases (1-D) stay as they are, and so does a matrix
whose row length is not a multiple of the 32-value block.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import LlambdaError
from ..formats.quants import QType, TRAITS, quantize
from ..formats.weights import WeightTensor

# Types the loader may quantize to: those the oracle quantizes and the kernels run. A matrix whose rows
# do not split into the type's blocks (256 values for the K-quants and IQ4_XS) stays as it is.
LOAD_QTYPES = {q.name.lower(): q for q in (QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.IQ4_NL, QType.Q2_K, QType.Q3_K,
                                           QType.MXFP4, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.IQ4_XS)}
FLOAT_QTYPES = (QType.F32, QType.F16, QType.BF16)

Lookup = Callable[[str], Optional[WeightTensor]]


def load_qtype(name: str) -> QType:
    q = LOAD_QTYPES.get(str(name).lower())
    if q is None:
        raise LlambdaError(f"cannot quantize to {name!r} at load; choose one of {', '.join(LOAD_QTYPES)}")
    return q


def quantizable(t: WeightTensor, qtype: QType) -> bool:
    """A float matrix (or 3-D stack of expert matrices) whose rows split into whole blocks of `qtype`."""
    return (t.qtype in FLOAT_QTYPES and len(t.shape) in (2, 3) and t.rows > 0
            and t.cols % TRAITS[qtype].block_size == 0)


def quantized_at_load(name: str, t: WeightTensor, qtype: QType) -> bool:
    """Whether `quantizing_lookup` converts this tensor: an MoE router stays float (its logits choose the
    experts, as export does), biases too."""
    return quantizable(t, qtype) and ".ffn_gate_inp" not in name and not name.endswith(".bias")


def qtype_at_load(qtype_name: str) -> Callable[[str, WeightTensor], QType]:
    """A tensor's type once `quantizing_lookup(..., qtype_name)` has converted it (for the memory plan)."""
    qtype = load_qtype(qtype_name)
    return lambda name, t: qtype if quantized_at_load(name, t, qtype) else t.qtype


def quantize_tensor(t: WeightTensor, qtype: QType) -> WeightTensor:
    raw = quantize(t.to_float32().reshape(t.rows, t.cols), qtype)
    return WeightTensor(t.name, qtype, t.shape, raw.reshape(-1))


def quantizing_lookup(lookup: Lookup, qtype_name: str, release=None) -> Lookup:
    """`lookup` with every quantizable float matrix converted to `qtype_name` as it is fetched; `release`
    (ModelSource.release) is told the float bytes once quantized."""
    release = release or (lambda data: 0)
    qtype = load_qtype(qtype_name)
    last: dict[tuple, WeightTensor] = {}   # fused tensors are fetched once per part: quantize them once

    def get(name: str) -> WeightTensor | None:
        t = lookup(name)
        if t is None or not quantized_at_load(name, t, qtype):
            return t
        if len(t.shape) == 3:       # experts: fetched once each
            q = quantize_tensor(t, qtype)
            for part in getattr(t, "parts", None) or [t]:     # a stack of per-expert tensors: each part's bytes
                release(part.data)
            return q
        key = (name, t.qtype, t.shape, t.data.__array_interface__["data"][0])
        if key not in last:
            last.clear()
            last[key] = quantize_tensor(t, qtype)
            release(t.data)
        return last[key]

    return get

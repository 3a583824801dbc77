"""Re-quantize float weights at load (`llambda.load(..., quantize="q8_0")`).

Only the 2-D float matrices (projections, embeddings, the output head) are
quantized: they are where the bytes and the time go, and the block kernels apply
to them. Norm weights and biases (1-D) stay as they are. A matrix whose rows do
not split into the type's blocks (256 values for the K-quants and IQ4_XS: SmolLM2's
576-wide rows) takes llama.cpp's 32-block fallback (quant_mix.FALLBACK: Q4_K -> Q5_0,
...) and stays as it is when not even that fits; `fallback_note` says so once, at load.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import LlambdaError
from ..formats.quants import QType, TRAITS, quantize
from ..formats.weights import WeightTensor
from .quant_mix import FALLBACK, fallback_note

# Types the loader may quantize to: those the oracle quantizes and the kernels run.
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


def _candidate(name: str, t: WeightTensor) -> bool:
    """A float matrix the loader converts: not an MoE router (its logits choose the experts, as export keeps
    it), nor a bias."""
    return (t.qtype in FLOAT_QTYPES and len(t.shape) in (2, 3) and t.rows > 0 and ".ffn_gate_inp" not in name
            and not name.endswith(".bias"))


def target_at_load(name: str, t: WeightTensor, qtype: QType) -> QType | None:
    """The type `quantizing_lookup` converts this tensor to: `qtype`, or llama.cpp's fallback for rows that do
    not split into its blocks (where we quantize to it); None when it stays as it is."""
    if not _candidate(name, t):
        return None
    for q in (qtype, FALLBACK.get(qtype)):
        if q is not None and q in LOAD_QTYPES.values() and quantizable(t, q):
            return q
    return None


def qtype_at_load(qtype_name: str) -> Callable[[str, WeightTensor], QType]:
    """A tensor's type once `quantizing_lookup(..., qtype_name)` has converted it (for the memory plan)."""
    qtype = load_qtype(qtype_name)
    return lambda name, t: target_at_load(name, t, qtype) or t.qtype


def load_fallback_note(tensors, qtype_name: str) -> str | None:
    """The one line saying which float matrices of `tensors` ((name, tensor) pairs) do not get the type asked
    for at load, and what they get (a fallback type, or their own); None when all do."""
    qtype = load_qtype(qtype_name)
    missed = {}
    for name, t in tensors:
        if _candidate(name, t) and not quantizable(t, qtype):
            missed[name] = (qtype, target_at_load(name, t, qtype))
    return fallback_note(missed, f"quantize={qtype_name!r}")


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
        target = None if t is None else target_at_load(name, t, qtype)
        if target is None:
            return t
        if len(t.shape) == 3:       # experts: fetched once each
            q = quantize_tensor(t, target)
            for part in getattr(t, "parts", None) or [t]:     # a stack of per-expert tensors: each part's bytes
                release(part.data)
            return q
        key = (name, t.qtype, t.shape, t.data.__array_interface__["data"][0])
        if key not in last:
            last.clear()
            last[key] = quantize_tensor(t, target)
            release(t.data)
        return last[key]

    return get

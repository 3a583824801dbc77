"""LoRA adapters merged into a base model's weights as the loader fetches them: W' = W + sum of
scale * factor * B @ A over the adapters that name W.

A float weight (F32, F16, BF16) is merged in float32 and stored back in its own type; a quantized one is
dequantized, merged and quantized again to its own type by the NumPy quantizers (one warning says so:
the merged weight carries a second rounding). Types, shapes and so the memory plan stay the base's.
A merged block of rows past what a forward survives (MERGED_MAX) is refused naming the adapter.
Every adapter is checked against the base before any weight is read (checked_adapters).
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import numpy as np

from ..errors import AdapterError, LlambdaWarning
from .lora import LoraAdapter, LoraPair, open_adapter
from .quants import QType, dequantize, quantize, row_nbytes, tensor_nbytes
from .rope_rows import PERMUTED_GGUF_ARCHS, rope_permutation
from .source import ModelSource
from .weights import WeightTensor

FLOAT_QTYPES = (QType.F32, QType.F16, QType.BF16)
MERGE_CHUNK_BYTES = 4 << 20     # a weight is merged this many float32 bytes of its rows at a time
# llama.cpp writes Mistral and Mixtral as `llama`; otherwise an adapter's architecture is the base's module
_SAME_GGUF_ARCH = {"mistral": "llama", "mixtral": "llama"}

Lookup = Callable[[str], Optional[WeightTensor]]
# a merged weight past this (F16's largest) and past the base's own largest in its block of rows is refused:
# finite in float32, it still overflows a forward's sums of squares or saturates every norm after it
MERGED_MAX = 65504.0


def _magnitude(w: np.ndarray) -> float:
    """The largest |value| (NaN if any is NaN), without an array of absolute values."""
    return max(float(w.max()), -float(w.min())) if w.size else 0.0


def _family(arch: str) -> str:
    from ..models import ARCHITECTURES
    mod = ARCHITECTURES.get(arch, arch)
    return _SAME_GGUF_ARCH.get(mod, mod)


def _requantizable(qtype: QType) -> bool:
    """Whether the NumPy quantizers write `qtype` (a probe of one block)."""
    from .quants import TRAITS
    try:
        quantize(np.zeros((1, TRAITS[qtype].block_size), np.float32), qtype)
        return True
    except Exception:       # noqa: BLE001 - no quantizer for the type, whatever it raises
        return False


def open_adapters(specs: list[tuple[str, float]], src: ModelSource) -> list[LoraAdapter]:
    """Each (path, scale) opened and checked against the base model `src` (checked_adapters)."""
    cfg, out = src.config, []
    try:
        for path, scale in specs:
            out.append(open_adapter(path, scale, cfg.n_layers, cfg.post_norms, cfg.arch))
        check_adapters(out, src)
        return out
    except BaseException:
        for a in out:
            a.close()
        raise


def base_arch(src: ModelSource) -> str:
    arch = src.metadata.get("general.architecture") if src.format == "gguf" else None
    return arch if isinstance(arch, str) else src.config.arch


def check_adapters(adapters: list[LoraAdapter], src: ModelSource) -> None:
    """AdapterError unless every adapter fits the base: its architecture (GGUF adapters say theirs), every
    weight it names present in the base, a matrix of the pair's shape, of a type merged here."""
    cfg, arch = src.config, base_arch(src)
    # the base file's q/k rows: GGUF-llama's permuted order in a GGUF file of those architectures, the
    # checkpoint's own order otherwise (HF's, which a PEFT adapter shares: DeepSeek's interleaved rows too)
    base_permuted = src.format == "gguf" and arch in PERMUTED_GGUF_ARCHS
    from ..models import ARCHITECTURES, arch_module
    refused = getattr(arch_module(arch), "LORA_REFUSED", None) if arch in ARCHITECTURES else None
    # the weights a family regroups at load from its checkpoint's row order (Falcon's kv-grouped query_key_value):
    # a PEFT adapter's B rows are in the checkpoint's order, so its update would land on other rows
    regrouped = getattr(arch_module(arch), "lora_regrouped", lambda c: ())(cfg) if arch in ARCHITECTURES else ()
    for ad in adapters:
        where = f"LoRA adapter {ad.path}"
        ad.permute_qk = ad.interleaved != base_permuted
        if ad.arch is not None and _family(ad.arch) != _family(arch):
            raise AdapterError(f"{where} is for architecture {ad.arch!r}, the model is {arch!r}")
        if refused:          # a family whose weights an adapter's updates do not add to as they are (Falcon-H1's)
            raise AdapterError(f"{where}: LoRA adapters on a {arch!r} model are not supported ({refused})")
        for name, pair in ad.pairs.items():
            if ad.format == "peft" and name.split(".", 2)[-1] in regrouped:
                raise AdapterError(f"{where}: {pair.source_name!r} adapts a fused weight whose rows this {arch!r} "
                                   "model regroups at load (llama.cpp's order), which a PEFT adapter's rows are not "
                                   "in: not supported")
            t = src.tensor(name)
            if t is None:
                raise AdapterError(f"{where}: {pair.source_name!r} adapts {name!r}, which the model does not have "
                                   "(an adapter for another model?)")
            if len(t.shape) != 2:
                raise AdapterError(f"{where}: {name!r} is a {len(t.shape)}-D tensor {t.shape}: LoRA is merged "
                                   "into matrices only (no expert stacks)")
            out_rows, in_cols = pair.b.shape[0], pair.a.shape[1]
            if (out_rows, in_cols) != tuple(t.shape):
                raise AdapterError(f"{where}: {pair.source_name!r} is a {out_rows}x{in_cols} update but the "
                                   f"model's {name!r} is {t.shape[0]}x{t.shape[1]} (an adapter for another model?)")
            if pair.rank > min(t.shape):
                raise AdapterError(f"{where}: {pair.source_name!r} has rank {pair.rank}, more than its "
                                   f"{t.shape[0]}x{t.shape[1]} weight's; not a low-rank adapter (A and B swapped?)")
            if t.qtype not in FLOAT_QTYPES and not _requantizable(t.qtype):
                raise AdapterError(f"{where}: {name!r} is {t.qtype.name}, which llambda cannot quantize again "
                                   "after merging (use a float or another quantized base)")
            if ad.permute_qk and _leaf(name) in ("attn_q", "attn_k") \
                    and (cfg.rope_dim != cfg.head_dim or cfg.qk_norm):
                raise AdapterError(f"{where}: its q/k rows are in another RoPE row order than the model's, which "
                                   "cannot be converted for a partial-rotary or q/k-norm model")


def _leaf(name: str) -> str:
    return name.split(".")[2] if name.startswith("blk.") and name.count(".") >= 2 else ""


def merge_peak(adapters: list[LoraAdapter], src: ModelSource) -> int:
    """The memory the merge holds at once on top of the packed weights, at its largest weight: the merged
    copy in the weight's type (until the backend has packed it), every adapter's float32 A and scaled B of
    that weight, and a block of rows' float32 buffers (the dequantized rows, the update's product, the
    round trip's check: MERGE_CHUNK_BYTES each)."""
    names = {name for ad in adapters for name in ad.pairs}
    peak = 0
    for name in names:
        t = src.tensor(name)
        if t is None or len(t.shape) != 2:
            continue
        rows, cols = t.shape
        factors = sum(4 * p.rank * (rows + cols) for p in (ad.pairs.get(name) for ad in adapters) if p is not None)
        block = 4 * cols * min(rows, max(1, MERGE_CHUNK_BYTES // (4 * cols)))
        peak = max(peak, tensor_nbytes(t.qtype, t.shape) + factors + 3 * block)
    return peak


class LoraMerge:
    """`lookup(name)`: the base's tensor with every adapter naming it merged in. `finish()` after the load:
    AdapterError if a pair was never merged, and the one warning about re-quantized weights."""

    def __init__(self, lookup: Lookup, adapters: list[LoraAdapter], config, release=None):
        self.base, self.adapters, self.config = lookup, adapters, config
        self.release = release or (lambda data: 0)
        self.merged: set[str] = set()
        self.requantized: dict[str, int] = {}      # type name -> weights
        self._last: tuple[str, WeightTensor] | None = None   # a fused tensor is fetched once per part

    def _delta_rows(self, name: str, ad: LoraAdapter, pair: LoraPair) -> np.ndarray:
        b = pair.b.to_float32().reshape(pair.b.shape)
        leaf = _leaf(name)
        if ad.permute_qk and leaf in ("attn_q", "attn_k"):
            heads = self.config.n_heads if leaf == "attn_q" else self.config.n_kv_heads
            b = b[rope_permutation(heads, self.config.head_dim, to_interleaved=not ad.interleaved)]
        return b * np.float32(ad.scale * pair.factor)

    def lookup(self, name: str) -> WeightTensor | None:
        t = self.base(name)
        uses = [(ad, ad.pairs[name]) for ad in self.adapters if name in ad.pairs]
        if t is None or not uses:
            return t
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        updates = [(self._delta_rows(name, ad, pair), pair.a.to_float32().reshape(pair.a.shape)) for ad, pair in uses]
        rows, cols = t.shape
        src, out = t.rows2d(), np.empty((rows, row_nbytes(t.qtype, cols)), np.uint8)
        step = max(1, MERGE_CHUNK_BYTES // (4 * cols))
        for r0 in range(0, rows, step):      # a block of rows at a time: a float32 copy of the whole
            r1 = min(rows, r0 + step)         # matrix (the output head's: GBs) is never made
            w = dequantize(src[r0:r1], t.qtype, (r1 - r0, cols))       # (a fresh array, any type)
            limit = max(MERGED_MAX, _magnitude(w))
            for delta, a in updates:
                w += delta[r0:r1] @ a
            peak = _magnitude(w)
            if not peak <= limit:       # (NaN too)
                what = "non-finite weights" if not np.isfinite(peak) else \
                    f"weights up to {peak:.3g} in magnitude, past {limit:.3g} (F16's range or the base's own largest)"
                self._refuse(name, uses, what)
            with np.errstate(over="ignore"):        # (past a quantized type's block scales: checked just below)
                q = quantize(w, t.qtype).reshape(r1 - r0, -1)
            if t.qtype != QType.F32 and not np.isfinite(dequantize(q, t.qtype, w.shape)).all():
                self._refuse(name, uses, f"weights past what its type {t.qtype.name} holds (up to {peak:.3g})")
            out[r0:r1] = q
            self.release(src[r0:r1].reshape(-1))    # the base's file pages of those rows, as a packed tensor's
        if t.qtype not in FLOAT_QTYPES:
            self.requantized[t.qtype.name] = self.requantized.get(t.qtype.name, 0) + 1
        merged = WeightTensor(t.name, t.qtype, t.shape, out.reshape(-1))
        self.release(t.data)
        self.merged.add(name)
        self._last = (name, merged)
        return merged

    @staticmethod
    def _refuse(name: str, uses, what: str):
        pairs = ", ".join(f"{ad.path} ({pair.source_name!r})" for ad, pair in uses)
        raise AdapterError(f"LoRA adapter {pairs}: merging it into {name!r} gave {what}: the adapter's "
                           "values or scale are too large (the model's forwards would overflow)")

    def finish(self) -> None:
        self._last = None
        for ad in self.adapters:
            missed = [n for n in ad.pairs if n not in self.merged]
            if missed:
                raise AdapterError(f"LoRA adapter {ad.path}: the model never read {missed[0]!r} "
                                   f"({len(missed)} adapted weights unused)")
        if self.requantized:
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.requantized.items()))
            warnings.warn(f"LoRA: {kinds} weights were dequantized, merged and quantized again to their own "
                          "type (a second rounding; a float base merges exactly)", LlambdaWarning, stacklevel=3)


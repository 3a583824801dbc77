"""The native backend: the C core (llambda._native) behind the Backend interface.

Weights are packed once at load into the kernels' layout (row-interleaved
blocks where that is faster); activations and the KV cache live in one arena
allocated at load. Each op is one call into C, which validates its arguments,
releases the GIL and splits the work over the persistent thread pool.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import LlambdaWarning, ModelFormatError, NativeUnavailableError
from ..formats.quants import DEQUANTIZABLE, TRAITS, QType, quantize
from ..formats.weights import WeightTensor
from .base import Backend, KVCache
from .weight_arena import WeightArena

try:
    from .. import _native as C
except ImportError as e:  # not built (no compiler at install time)
    C = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""

KV_TYPES = {"f16": (np.float16, 1), "f32": (np.float32, 0)}
# The weight types the C core runs (its type table), by ggml id.
NATIVE_TYPES: dict[int, dict] = {t["id"]: t for t in C.qtypes()} if C is not None else {}
# What a tensor of another type becomes at load (when the oracle can decode it).
CONVERT_TO = QType.Q8_0


def native_available() -> bool:
    return C is not None


# The C attention kernel's largest head (LLB_ATTN_MAX_HEAD_DIM in csrc/ops.h).
MAX_HEAD_DIM = 512


def physical_cores() -> int:
    """Cores this process may run on, counting SMT siblings once."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(c))
    return max(1, len(cores))


MATMUL_MANY_MAX = 3   # matrices one native matmul_many call takes (LLB_MM_MAX_PARTS)


@dataclass
class NativeMatrix:
    qtype: int
    layout: int
    data: np.ndarray      # uint8, the kernel's layout
    rows: int
    cols: int


class NativeBackend(Backend):
    name = "native"

    def __init__(self, threads: int | None = None, activations: str = "q8", kv_type: str = "f16"):
        if C is None:
            raise NativeUnavailableError(f"the C core is not built ({_IMPORT_ERROR}); use backend='numpy'")
        if activations not in ("q8", "f32"):
            raise ValueError(f"activations must be 'q8' or 'f32', got {activations!r}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}")
        self.exact = activations == "f32"
        self.precision = "f32 activations (exact)" if self.exact else "8-bit activations"
        self.kv_dtype, self.kv_code = KV_TYPES[kv_type]
        self.threads = int(threads) if threads else physical_cores()
        if self.threads < 1:
            raise ValueError("threads must be >= 1")
        C.set_threads(self.threads)
        self.weight_bytes = 0
        self._weights = WeightArena()
        self._recording = None  # the _native.Plan being recorded
        self._batch_invariant = False
        self._converted: list[tuple[str, str, str, int]] = []   # (tensor, from, to, extra bytes): end_load

    # -- op plans: record a decode step's C calls once, replay them per token --
    # The C core records: while a _native.Plan is recording on this thread, every op
    # binding keeps its validated arguments and buffers in it, and Plan.replay() runs
    # them all from C with the GIL released once (token ids, slots and positions are
    # re-read from the arena and re-validated on each replay).
    supports_plans = True

    def begin_recording(self) -> None:
        if self._recording is not None:
            raise RuntimeError("begin_recording: already recording a plan")
        plan = C.Plan()
        plan.begin()
        self._recording = plan

    def end_recording(self):
        plan, self._recording = self._recording, None
        if plan is None:
            raise RuntimeError("end_recording: no plan is being recorded")
        plan.end()
        return plan

    def replay(self, plan) -> None:
        plan.replay()

    # -- load time -------------------------------------------------------
    def _convert(self, w: WeightTensor) -> WeightTensor:
        """A tensor of a type the C core does not run, decoded by the NumPy oracle and re-quantized to
        CONVERT_TO (F32 if its rows do not split into that type's blocks); warns once per type."""
        name = QType(int(w.qtype)).name  # the file reader already refused ids ggml does not define
        if w.qtype not in DEQUANTIZABLE:
            raise ModelFormatError(
                f"tensor {w.name!r} is {name}, a type llambda can neither run nor convert (supported: "
                f"{', '.join(sorted(t['name'] for t in NATIVE_TYPES.values()))}); use a file with another quantization")
        to = CONVERT_TO if w.cols % TRAITS[CONVERT_TO].block_size == 0 else QType.F32
        f = w.to_float32().reshape(w.rows, w.cols)
        out = WeightTensor(w.name, to, (w.rows, w.cols), quantize(f, to).reshape(-1))
        self._converted.append((w.name, name, to.name, out.data.nbytes - w.data.nbytes))
        return out

    def prepare_matrix(self, w: WeightTensor) -> NativeMatrix:
        if int(w.qtype) not in NATIVE_TYPES:
            w = self._convert(w)
        rows, cols, qt = w.rows, w.cols, int(w.qtype)
        size = C.packed_size(qt, rows, cols)
        dst = self._weights.alloc(size)
        layout = C.pack(qt, w.data, dst, rows, cols)
        self.weight_bytes += size
        return NativeMatrix(qt, layout, dst, rows, cols)

    def end_load(self) -> None:
        if not self._converted:
            return
        names = [n for n, _, _, _ in self._converted]
        types = sorted({t for _, t, _, _ in self._converted})
        into = sorted({t for _, _, t, _ in self._converted})
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        extra = sum(b for _, _, _, b in self._converted) / 2**20
        warnings.warn(f"the native core has no kernels for {', '.join(types)}: {len(names)} tensors ({shown}) "
                      f"were converted at load to {' and '.join(into)}, {extra:.1f} MB more memory than in the "
                      "file, and decode is slower on them", LlambdaWarning, stacklevel=4)
        self._converted = []

    def create_kv_cache(self, n_layers, n_slots, n_ctx, n_kv, head_dim, extra=None) -> KVCache:
        if head_dim > MAX_HEAD_DIM:
            raise ModelFormatError(f"head_dim {head_dim} is more than the native core's {MAX_HEAD_DIM}; "
                                   "use backend='numpy'")
        return super().create_kv_cache(n_layers, n_slots, n_ctx, n_kv, head_dim, extra)

    def set_batch_invariant(self, flag: bool) -> None:
        """Make every row's result independent of what else shares its step, bit for bit: matmuls
        sum each row in the GEMM's order also when it is alone, and attention cuts each query row
        into the same key chunks whatever the batch, its prompt chunking or the thread count. The
        server turns this on, so batched greedy output equals one-at-a-time output (process-wide
        in the C core; off, single rows may take faster kernels that round differently).
        The switch is the C core's, process-wide: each forward pass of this backend sets it to
        this backend's own choice (begin_forward), so a server's model does not change how a
        library model in the same process computes, nor the reverse."""
        self._batch_invariant = bool(flag)
        C.set_batch_invariant(self._batch_invariant)

    @property
    def batch_invariant(self) -> bool:
        return self._batch_invariant

    def begin_forward(self) -> None:
        C.set_batch_invariant(self._batch_invariant)     # one store in C: cheaper than asking first

    def memory_report(self) -> dict[str, int]:
        return {"weights": self.weight_bytes}

    # -- ops ---------------------------------------------------------------
    def embed(self, table: NativeMatrix, ids, out) -> None:
        C.get_rows(table.qtype, table.layout, table.data, table.rows, table.cols, ids, out, len(ids))

    def matmul(self, x, w: NativeMatrix, out) -> None:
        C.matmul(w.qtype, w.layout, w.data, w.rows, w.cols, x, out, x.shape[0], self.exact)

    def matmul_many(self, x, ws, outs) -> None:
        # Matrices of one type go in one call: the activations are quantized once and one
        # fork/join covers them all (Q, K, V of a decode step: three calls of 8-12 us each
        # paid that overhead three times). Each output is the same as matmul's, bit for bit.
        if 1 < len(ws) <= MATMUL_MANY_MAX and len(ws) == len(outs) and len({w.qtype for w in ws}) == 1 \
                and all(w.cols == x.shape[-1] for w in ws):
            C.matmul_many(ws[0].qtype, ws[0].cols, x, x.shape[0], self.exact,
                          tuple((w.layout, w.data, w.rows, out) for w, out in zip(ws, outs)))
        else:
            super().matmul_many(x, ws, outs)

    def rmsnorm(self, x, w, eps, out) -> None:
        d = x.shape[-1]
        C.rmsnorm(x, w, out, x.size // d, d, eps)

    def add_rows(self, x, bias, out) -> None:
        C.add_rows(x, bias, out, x.shape[0], x.shape[1])

    def rope(self, x, pos, inv_freq, neox) -> None:
        n, heads, hd = x.shape
        C.rope(x, pos, inv_freq, n, heads, hd, 2 * len(inv_freq), 1 if neox else 0)

    def kv_store(self, cache: KVCache, layer, k, v, slots, pos) -> None:
        n, n_kv, hd = k.shape
        C.kv_store(k, v, cache.k[layer], cache.v[layer], slots, pos, n, n_kv, hd, cache.n_slots, cache.n_ctx,
                   self.kv_code)

    def attention(self, q, cache: KVCache, layer, slots, pos, out, scale, window, softcap) -> None:
        n, heads, hd = q.shape
        C.attention(q, cache.k[layer], cache.v[layer], out, slots, pos, n, heads, cache.n_kv, hd, cache.n_slots,
                    cache.n_ctx, self.kv_code, scale, window, softcap)

    def silu_mul(self, gate, up, out) -> None:
        C.silu_mul(gate, up, out, gate.size)

    def gelu_erf(self, x) -> None:
        C.gelu_erf(x, x.size)

    def gelu_mul(self, gate, up, out) -> None:
        C.gelu_mul(gate, up, out, gate.size)

    def add(self, a, b, out) -> None:
        C.add(a, b, out, a.size)

    def scale(self, x, s) -> None:
        C.scale(x, s, x.size)

    def softcap(self, x, cap) -> None:
        C.softcap(x, cap, x.size)

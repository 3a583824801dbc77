"""The native backend: the C core (llambda._native) behind the Backend interface.

Weights are packed once at load into the kernels' layout (row-interleaved
blocks where that is faster); activations and the KV cache live in one arena
allocated at load. Each op is one call into C, which validates its arguments,
releases the GIL and splits the work over the persistent thread pool.
"""
from __future__ import annotations

from contextlib import contextmanager

import math
import os
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .. import switches
from ..errors import InvalidInputError, LlambdaWarning, ModelFormatError, NativeUnavailableError
from ..formats.experts import StackedExperts, expert_matrix
from ..formats.quants import DEQUANTIZABLE, TRAITS, QType, quantize
from ..formats.weights import WeightTensor, check_weight_type
from .base import Backend, KVCache
from .thread_tuner import ThreadTuner
from .weight_arena import WeightArena

try:
    from .. import _native as C
except ImportError as e:  # not built (no compiler at install time)
    C = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""

# Decode steps pick their thread count by timing (thread_tuner.py); LLAMBDA_THREAD_TUNING=0 keeps every thread.
THREAD_TUNING = switches.flag("LLAMBDA_THREAD_TUNING", True)
# kv_type -> (cache element dtype, the C core's cache_type). q8_0: ggml Q8_0 blocks (an f16 scale and
# 32 int8 codes per 32 values of a head's row), 34 bytes where f16 takes 64: the cache is raw bytes.
KV_TYPES = {"f16": (np.float16, 1), "f32": (np.float32, 0), "q8_0": (np.uint8, 2)}
Q8_0_BLOCK, Q8_0_BYTES = 32, 34
# The weight types the C core runs (its type table), by ggml id.
NATIVE_TYPES: dict[int, dict] = {t["id"]: t for t in C.qtypes()} if C is not None else {}
# What a tensor of another type becomes at load (when the oracle can decode it).
CONVERT_TO = QType.Q8_0


def weight_skew(qtype: int) -> int:
    """Bytes past a page boundary where a packed matrix of qtype starts: the type table's far_skew where the
    GEMVs stream as on AMD (_native.far_stream), else 0 (quants.h says why)."""
    t = NATIVE_TYPES.get(int(qtype))
    return t["far_skew"] if t and C.far_stream() else 0


def native_available() -> bool:
    return C is not None


# The C attention kernel's largest head (LLB_ATTN_MAX_HEAD_DIM in csrc/ops.h).
MAX_HEAD_DIM = 576


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


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of time this process's cgroup may use (quota / period), None when unlimited or
    unknown. cgroup v2 (cpu.max: "QUOTA PERIOD" or "max PERIOD") and v1 (cpu.cfs_quota_us, -1
    unlimited); the process's own group first, then the root's (inside a container the group is
    mounted as the root)."""
    def read(path):
        try:
            with open(path) as f:
                return f.read().split()
        except OSError:
            return None

    v2_path = v1_path = None
    try:
        with open(proc_cgroup) as f:
            for line in f:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                if parts[0] == "0" and parts[1] == "":
                    v2_path = parts[2]
                elif "cpu" in parts[1].split(","):
                    v1_path = parts[2]
    except OSError:
        pass
    limits = []
    for group in dict.fromkeys(g for g in (v2_path, "/") if g is not None):
        words = read(os.path.join(root, group.lstrip("/"), "cpu.max"))
        if words and len(words) == 2 and words[0] != "max":
            try:
                limits.append(int(words[0]) / int(words[1]))
            except (ValueError, ZeroDivisionError):
                pass
    for mount in ("cpu", "cpu,cpuacct"):
        for group in dict.fromkeys(g for g in (v1_path, "/") if g is not None):
            base = os.path.join(root, mount, group.lstrip("/"))
            quota, period = read(os.path.join(base, "cpu.cfs_quota_us")), read(os.path.join(base, "cpu.cfs_period_us"))
            try:
                if quota and period and int(quota[0]) > 0 and int(period[0]) > 0:
                    limits.append(int(quota[0]) / int(period[0]))
            except ValueError:
                pass
    limits = [q for q in limits if q > 0]
    return min(limits) if limits else None


def usable_cpus() -> int:
    """CPUs this process may keep busy: its affinity mask, capped by its cgroup's CPU quota
    (rounded up: 1.5 CPUs' worth still runs 2 threads at once, part of the time)."""
    try:
        n = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        n = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return n


def default_threads() -> int:
    """One thread per physical core this process may use, within its CPU quota."""
    return max(1, min(physical_cores(), usable_cpus()))


class _SwitchGate:
    """The C core's batch-invariance switch is process-wide, and each forward sets it to its
    backend's choice: forwards of backends that want it otherwise must not overlap (one flipped it
    under another's ops, whose logits then moved by up to 0.3). Those that agree run together."""

    def __init__(self):
        self._cond = threading.Condition()
        self._mode: bool | None = None
        self._count = 0

    def enter(self, mode: bool) -> None:
        """Waits for forwards that want the switch set otherwise, then sets it (one store in C: cheaper
        than asking first)."""
        with self._cond:
            while self._count and self._mode != mode:
                self._cond.wait()
            self._mode = mode
            self._count += 1
            C.set_batch_invariant(mode)

    def exit(self) -> None:
        with self._cond:
            self._count -= 1
            if not self._count:
                self._cond.notify_all()

    def set_if_idle(self, mode: bool) -> None:
        """Sets the switch now unless a forward runs (its own enter sets it then): ops called
        outside forwards (benchmarks, tests) see a backend's choice at once, as before the gate."""
        with self._cond:
            if not self._count:
                C.set_batch_invariant(mode)


_SWITCH_GATE = _SwitchGate()

MATMUL_MANY_MAX = 3   # matrices one native matmul_many call takes (LLB_MM_MAX_PARTS)


@dataclass
class NativeMatrix:
    qtype: int
    layout: int
    data: np.ndarray      # uint8, the kernel's layout
    rows: int
    cols: int


@dataclass
class NativeExperts:
    """An MoE layer's gate, up and down experts, each E packed matrices back to back (one allocation)."""
    gate: NativeMatrix      # data holds E matrices; rows, cols are one expert's
    up: NativeMatrix
    down: NativeMatrix
    n_expert: int
    biases: tuple = (None, None, None)    # float32 (E, ff), (E, ff), (E, d) or None


@dataclass
class NativeDense:
    """An encoder's float matrix packed for _native.dense: f32 panels (exact), or bfloat16 ones."""
    fmt: int              # DENSE_F32 or DENSE_BF16 (csrc/matmul/dense.h)
    data: np.ndarray      # uint8, the panels
    bias: np.ndarray | None
    rows: int
    cols: int


DENSE_F32, DENSE_BF16 = 0, 1


MOE_ROUTING_IDS = {"softmax_topk": 0, "topk_softmax": 1, "sigmoid_topk": 2}     # csrc/moe/moe.h
MOE_ACT_IDS = {"silu": 0, "swiglu_oai": 1}


# The C core's thread pool is one per process: a load grows it to the model's count (never shrinks it under
# the models loaded before), and each backend caps the pool calls of its own forwards at its count.
_POOL_LOCK = threading.Lock()


def grow_pool(n: int, what: str = "") -> None:
    """At least n threads in the pool: more when a model asks for more than any before it. More than the
    pool's maximum is an InvalidInputError (`what` first: the setting it came from)."""
    with _POOL_LOCK:
        if C.threads() < n:
            try:
                C.set_threads(n)
            except ValueError as e:     # the C core names its range
                raise InvalidInputError(f"{what}{e}") from None


class NativeBackend(Backend):
    name = "native"
    max_head_dim = MAX_HEAD_DIM

    def __init__(self, threads: int | None = None, activations: str = "q8", kv_type: str = "f16"):
        if C is None:
            raise NativeUnavailableError(f"the C core is not built ({_IMPORT_ERROR}); use backend='numpy'")
        if activations not in ("q8", "f32"):
            raise InvalidInputError(f"activations must be 'q8' or 'f32', got {activations!r}")
        if not isinstance(kv_type, str) or kv_type not in KV_TYPES:
            raise InvalidInputError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        self.exact = activations == "f32"
        self.precision = "f32 activations (exact)" if self.exact else "8-bit activations"
        self.kv_dtype, self.kv_code = KV_TYPES[kv_type]
        self.kv_type = kv_type
        self.threads = int(threads) if threads else default_threads()
        if self.threads < 1:
            raise InvalidInputError("threads must be >= 1")
        grow_pool(self.threads)
        self._caps = threading.local()    # per calling thread: the caps its forwards replaced, and an override
        self.weight_bytes = 0
        self._weights = WeightArena()
        self._recording = None  # the _native.Plan being recorded
        self._tuners: dict[tuple, ThreadTuner] = {}   # (id(plan), threads) -> its tuner (plans live as long as the model)
        self.replays: dict[tuple, int] = {}            # (threads, threads run on) -> replayed steps (for benchmarks)
        # On by default: a prompt's result must not depend on what its cache already held (prefix reuse
        # prefills a different chunk) - the same greedy call gives the same text. Costs ~1-4% of a 512-token
        # prefill; at depth 16384 its prefill attention op takes ~1.3-1.6x the default's CPU time (wide tiles
        # summing in the decode kernel's order, each row's 256-key chunks merged).
        self._batch_invariant = True
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

    def weight_pages(self) -> tuple[int, int | None]:
        """(bytes the packed weights' arena maps, of those in transparent huge pages now or None): for benchmarks."""
        return self._weights.mapped_bytes, self._weights.huge_page_bytes()

    def replay(self, plan) -> None:
        """Replay a decode step on the thread count its ThreadTuner finds fastest now (a busy
        machine runs a step faster on fewer threads); the count never changes a result."""
        threads = min(self.call_threads(), C.threads())   # this model's count within the pool's size now
        if threads <= 1 or not THREAD_TUNING:
            self.replays[threads, threads] = self.replays.get((threads, threads), 0) + 1
            plan.replay()
            return
        key = (id(plan), threads)
        tuner = self._tuners.get(key)
        if tuner is None:
            tuner = self._tuners[key] = ThreadTuner(threads)
        run_on = tuner.threads()
        self.replays[threads, run_on] = self.replays.get((threads, run_on), 0) + 1
        t0 = time.perf_counter()
        plan.replay(threads=run_on)
        tuner.record(time.perf_counter() - t0)

    # -- load time -------------------------------------------------------
    def packed_type(self, qtype, cols: int) -> QType:
        """A matrix's type once packed: its own where the core runs it; else what _convert makes of it:
        F32 from F64, CONVERT_TO (F32 if its rows do not split into that type's blocks) from the rest."""
        if int(qtype) in NATIVE_TYPES or qtype not in DEQUANTIZABLE:
            return QType(int(qtype))
        if qtype == QType.F64 or cols % TRAITS[CONVERT_TO].block_size:
            return QType.F32
        return CONVERT_TO

    def _convert(self, w: WeightTensor) -> WeightTensor:
        """A tensor of a type the C core does not run, decoded by the NumPy oracle and re-quantized to
        packed_type's; warns once per type. F64 becomes F32 (a rounding, as the NumPy backend's), silently:
        no bigger, no slower than the file says."""
        name = QType(int(w.qtype)).name  # the file reader already refused ids ggml does not define
        if w.qtype not in DEQUANTIZABLE:
            raise ModelFormatError(
                f"tensor {w.name!r} is {name}, a type llambda can neither run nor convert (supported: "
                f"{', '.join(sorted(t['name'] for t in NATIVE_TYPES.values()))}); use a file with another quantization")
        f = w.to_float32().reshape(w.rows, w.cols)
        to = self.packed_type(w.qtype, w.cols)
        if w.qtype == QType.F64:
            return WeightTensor.from_float(w.name, f)
        out = WeightTensor(w.name, to, (w.rows, w.cols), quantize(f, to).reshape(-1))
        self._converted.append((w.name, name, to.name, out.data.nbytes - w.data.nbytes))
        return out

    def prepare_matrix(self, w: WeightTensor) -> NativeMatrix:
        if int(w.qtype) not in NATIVE_TYPES:
            w = self._convert(w)
        rows, cols, qt = w.rows, w.cols, int(w.qtype)
        size = C.packed_size(qt, rows, cols)
        dst = self._weights.alloc(size, weight_skew(qt))
        layout = C.pack(qt, w.data, dst, rows, cols)
        self.weight_bytes += size
        return NativeMatrix(qt, layout, dst, rows, cols)

    def prepare_experts(self, gate: WeightTensor, up: WeightTensor, down: WeightTensor, biases=None) -> NativeExperts:
        b = (None,) * 3 if biases is None else tuple(
            np.ascontiguousarray(t.to_float32().reshape(t.shape), dtype=np.float32) for t in biases)
        return NativeExperts(*(self._pack_experts(w) for w in (gate, up, down)), n_expert=gate.shape[0], biases=b)

    def _pack_experts(self, w: WeightTensor) -> NativeMatrix:
        """Each expert packed on its own (a matrix's row groups never straddle two experts), back to back: in
        one call (one fork/join over every expert's rows) when the file holds them back to back (GGUF)."""
        E, rows, cols = w.shape
        check_weight_type(w.name, w.qtype)      # named as the file does, before the experts are split
        whole = int(w.qtype) in NATIVE_TYPES and not isinstance(w, StackedExperts)
        mats = None if whole else [expert_matrix(w, e) for e in range(E)]
        if not whole and int(w.qtype) not in NATIVE_TYPES:
            mats = [self._convert(m) for m in mats]
        qt = int(w.qtype) if whole else int(mats[0].qtype)
        size = C.packed_size(qt, rows, cols)
        dst = self._weights.alloc(size * E, weight_skew(qt))
        if whole:
            layout = C.pack(qt, w.data, dst, rows, cols, E)
        else:
            for e, m in enumerate(mats):
                layout = C.pack(qt, m.data, dst[e * size:(e + 1) * size], rows, cols)
        self.weight_bytes += size * E
        return NativeMatrix(qt, layout, dst, rows, cols)

    def workspace_specs(self, cfg, max_tokens: int) -> dict:
        if not cfg.n_experts:
            return {}
        nk = max_tokens * cfg.n_experts_used
        d, ff = cfg.d_model, cfg.expert_ffn_dim
        return {"moe_f": ((nk * (2 * d + 2 * ff + 1),), np.float32),       # csrc/moe/moe.h: llb_moe_fscratch
                "moe_i": ((3 * nk + cfg.n_experts + 1,), np.int32)}         # llb_moe_iscratch

    @contextmanager
    def loading(self, nbytes: int):
        self._weights.reserve(nbytes)
        self._cap()         # the packing runs on this model's threads too
        try:
            yield self
        finally:
            self._uncap()
            self._weights.end_reserve()

    def end_load(self) -> None:
        self._weights.end_reserve()     # before the KV cache: pages faulted past the last matrix go back now
        self._weights.collapse()        # what the packing got in 4 KB pages, in 2 MB pages where the kernel can
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

    def create_kv_cache(self, n_layers, n_slots, n_ctx, n_kv, head_dim, extra=None, values_are_keys=False) -> KVCache:
        if head_dim > MAX_HEAD_DIM:
            raise ModelFormatError(f"head_dim {head_dim} is more than the native core's {MAX_HEAD_DIM}; "
                                   "use backend='numpy'")
        q8 = self.kv_code == KV_TYPES["q8_0"][1]
        if q8 and head_dim % Q8_0_BLOCK and values_are_keys:     # latent attention's compressed rows (KVCache)
            raise InvalidInputError(
                f"kv_type='q8_0' stores a cache row in blocks of {Q8_0_BLOCK} values; this model's latent attention "
                f"caches one compressed row a token, kv_lora_rank + qk_rope_head_dim = {head_dim} values: use "
                "kv_type='f16' or 'f32' (--kv-type), or LLAMBDA_MLA_EXPANDED=1 to cache its expanded heads instead "
                f"(a larger cache, whose head_dim q8_0 needs a multiple of {Q8_0_BLOCK} too)")
        if q8 and head_dim % Q8_0_BLOCK:
            raise InvalidInputError(f"kv_type='q8_0' needs head_dim a multiple of {Q8_0_BLOCK}; this model's is "
                                    f"{head_dim}: use kv_type='f16'")
        extra = dict(extra or {})
        based = q8 and not values_are_keys     # a value read from a key's row cannot take the key's base
        if based:  # each slot's key base per layer (see the C core's kv_store)
            extra.update({f"kbase{i}": ((n_slots, n_kv * head_dim), np.float32) for i in range(n_layers)})
        cache = super().create_kv_cache(n_layers, n_slots, n_ctx, n_kv, head_dim, extra, values_are_keys)
        cache.kbase = [cache.extra.pop(f"kbase{i}") for i in range(n_layers)] if based else [None] * n_layers
        return cache

    # The C core's layout (ops.h's llb_kv_elem): each kv head's keys of a slot one run of rows, so a
    # decode streams whole lines of one head (position-major rows, at head_dim 128, cost the op from
    # memory 1.3x the time alone and ~1.1x inside a decode step; docs/BENCHMARKS.md, session 42)
    kv_pos_axis = 2

    def kv_shape(self, n_slots, n_ctx, n_kv, head_dim) -> tuple:
        if self.kv_code == KV_TYPES["q8_0"][1]:
            return (n_slots, n_kv, n_ctx, head_dim // Q8_0_BLOCK * Q8_0_BYTES)
        return (n_slots, n_kv, n_ctx, head_dim)

    def set_batch_invariant(self, flag: bool) -> None:
        """Make every row's result independent of what else shares its step, bit for bit: matmuls
        sum each row in the GEMM's order also when it is alone, and attention cuts each query row
        into the same key chunks whatever the batch, its prompt chunking or the thread count. The
        backend starts with it on (the server relies on it: batched greedy output equals
        one-at-a-time output; a library call's text does not depend on the prefix its cache reused);
        off, prefills may take a faster schedule (~1-4% at 512 tokens; at depth the attention op 1.3-1.6x) and single rows
        kernels that round differently.
        The switch is the C core's, process-wide: each forward pass of this backend sets it to
        this backend's own choice (enter_forward), and forwards that want it otherwise do not
        overlap (_SwitchGate), so a server's model does not change how a library model in the same
        process computes, nor the reverse, also from another thread."""
        self._batch_invariant = bool(flag)
        _SWITCH_GATE.set_if_idle(self._batch_invariant)   # not under another backend's running forward

    @property
    def batch_invariant(self) -> bool:
        return self._batch_invariant

    def enter_forward(self) -> None:
        _SWITCH_GATE.enter(self._batch_invariant)
        self._cap()

    def exit_forward(self) -> None:
        self._uncap()
        _SWITCH_GATE.exit()

    # -- threads: the pool is the process's; this backend's calls run on at most its own count --
    def call_threads(self) -> int:
        """The threads this backend's calls from this thread may use: its count, or run_on's."""
        return getattr(self._caps, "override", None) or self.threads

    @contextmanager
    def run_on(self, threads: int):
        """This thread's forwards of this backend on `threads` (a draft model's draft_threads, the pool grown
        to it by grow_pool) instead of its own count."""
        before = getattr(self._caps, "override", None)
        self._caps.override = threads
        try:
            yield
        finally:
            self._caps.override = before

    def _cap(self) -> None:
        stack = self._caps.__dict__.setdefault("replaced", [])
        stack.append(C.cap_threads(self.call_threads()))

    def _uncap(self) -> None:
        C.cap_threads(self._caps.replaced.pop())

    def close(self) -> None:
        """The model closed: drop the packed weights' arena too (each mapping is unmapped when the last matrix
        viewing it goes, with the closed model) and the tuners of its recorded plans."""
        super().close()
        self._weights = WeightArena()
        self._tuners.clear()
        self._recording = None

    def memory_report(self) -> dict[str, int]:
        # the core's own allocations: each calling thread's scratch (shared by the pool's workers of an op,
        # grown to the largest op run so far) and its tables; counted since the process started
        return {"weights": self.weight_bytes, "C core scratch": C.alloc_stats()[1]}

    # -- ops ---------------------------------------------------------------
    def embed(self, table: NativeMatrix, ids, out) -> None:
        C.get_rows(table.qtype, table.layout, table.data, table.rows, table.cols, ids, out, len(ids))

    def matmul(self, x, w: NativeMatrix, out) -> None:
        C.matmul(w.qtype, w.layout, w.data, w.rows, w.cols, x, out, x.shape[0], self.exact)

    def matmul_many(self, x, ws, outs) -> None:
        # The matrices go in one call: the activations are quantized once and one fork/join
        # covers them all (Q, K, V of a decode step: three calls of 8-12 us each paid that
        # overhead three times). A part of another type than the first names its own (a Q8_0 V
        # beside Q5_0 Q and K); the C core runs a mix its kernels cannot share as one call per
        # part. Each output is the same as matmul's, bit for bit.
        if 1 < len(ws) <= MATMUL_MANY_MAX and len(ws) == len(outs) and all(w.cols == x.shape[-1] for w in ws):
            q0 = ws[0].qtype
            C.matmul_many(q0, ws[0].cols, x, x.shape[0], self.exact,
                          tuple((w.layout, w.data, w.rows, out) if w.qtype == q0 else
                                (w.layout, w.data, w.rows, out, w.qtype) for w, out in zip(ws, outs)))
        else:
            super().matmul_many(x, ws, outs)

    def moe(self, x, logits, experts: NativeExperts, k, routing, norm, out, shared=None, shared_logit=None,
            scratch=None, act=("silu",), groups=(1, 1, 1), scale=1.0, choice_bias=None) -> None:
        n, d = x.shape
        g, u, dn = experts.gate, experts.up, experts.down
        alpha, limit = (act[1], act[2]) if len(act) == 3 else (1.0, 1.0)
        C.moe(x, logits, out, n, d, experts.n_expert, k, g.rows, MOE_ROUTING_IDS[routing], int(norm), self.exact,
              (g.qtype, g.layout, g.data), (u.qtype, u.layout, u.data), (dn.qtype, dn.layout, dn.data),
              scratch.moe_f, scratch.moe_i, shared, shared_logit, MOE_ACT_IDS[act[0]], alpha, limit, *experts.biases,
              *groups, scale, choice_bias)

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
                   self.kv_code, cache.kbase[layer])

    def attention(self, q, cache: KVCache, layer, slots, pos, out, scale, window, softcap, kend=None) -> None:
        n, heads, hd = q.shape
        C.attention(q, cache.k[layer], cache.v[layer], out, slots, pos, n, heads, cache.n_kv, hd, cache.n_slots,
                    cache.n_ctx, self.kv_code, scale, window, softcap, cache.kbase[layer], kend)

    def attention_sinks(self, q, cache: KVCache, layer, slots, pos, out, scale, window, softcap, sinks) -> None:
        n, heads, hd = q.shape
        C.attention_sinks(q, cache.k[layer], cache.v[layer], out, slots, pos, n, heads, cache.n_kv, hd, cache.n_slots,
                          cache.n_ctx, self.kv_code, scale, window, softcap, sinks, cache.kbase[layer])

    def short_conv(self, bcx, state, state_pos, kernel, slots, pos, out) -> None:
        n, d = out.shape
        C.short_conv(bcx, state, state_pos, kernel, slots, pos, out, n, d, kernel.shape[1], state.shape[0], 1)

    def conv_silu(self, x, state, state_pos, kernel, slots, pos, out, bias=None) -> None:
        n, d = out.shape
        C.short_conv(x, state, state_pos, kernel, slots, pos, out, n, d, kernel.shape[1], state.shape[0], 0, bias)

    def ssm_scan(self, xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, eps, slots, pos, out,
                 groups) -> None:
        n_slots, heads, dstate, dhead = state.shape
        C.ssm_scan(xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, slots, pos, out, len(slots), groups,
                   heads, dstate, dhead, n_slots, eps)

    def ssm_scan1(self, x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out) -> None:
        n_slots, d_inner, dstate = state.shape
        C.ssm_scan1(x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out, len(slots), d_inner,
                    dstate, n_slots)

    def gated_delta(self, qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, eps, slots, pos, out, k_heads) -> None:
        n_slots, hv, dk, dv = state.shape
        C.gated_delta(qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, slots, pos, out, len(slots), k_heads, hv,
                      dk, dv, n_slots, eps)

    def sigmoid_mul(self, x, gate, out) -> None:
        C.sigmoid_mul(x, gate, out, x.size)

    def silu_mul(self, gate, up, out) -> None:
        C.silu_mul(gate, up, out, gate.size)

    def gelu_erf(self, x) -> None:
        C.gelu_erf(x, x.size)

    def xielu(self, x, alpha_p, alpha_n, beta, eps) -> None:
        C.xielu(x, x.size, alpha_p, alpha_n, beta, eps)

    def prepare_dense(self, w, bias) -> NativeDense:
        # the exact mode keeps float32 weights; the fast mode packs bfloat16 weights and rounds the
        # activations to bfloat16 (AVX512-BF16 products: all-MiniLM-L6-v2's vectors stay at a cosine
        # above 0.9999 to the float32 ones)
        w = np.ascontiguousarray(w, dtype=np.float32)
        rows, cols = w.shape
        fmt = DENSE_F32 if self.exact else DENSE_BF16
        dst = self._weights.alloc(C.dense_packed_size(fmt, rows, cols))
        C.dense_pack(fmt, w, dst, rows, cols)
        self.weight_bytes += dst.nbytes
        if not self.exact:
            self.precision = "bfloat16 products"
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        return NativeDense(fmt, dst, b, rows, cols)

    def dense(self, x, d: NativeDense, out) -> None:
        C.dense(d.fmt, d.data, d.bias, x, out, x.shape[0], d.rows, d.cols)

    def add_layernorm(self, x, r, w, b, eps, out) -> None:
        C.add_layernorm(x, r, w, b, out, x.shape[0], x.shape[1], eps)

    def encoder_attention(self, qkv, starts, n_heads, out) -> None:
        n_seqs = len(starts) - 1
        hd = qkv.shape[1] // 3 // n_heads
        C.encoder_attention(qkv, starts, out, qkv.shape[0], n_seqs, n_heads, hd, 1 / math.sqrt(hd))

    def encoder_rotate(self, qkv, cos, sin, n_heads) -> None:
        C.encoder_rotate(qkv, cos, sin, qkv.shape[0], n_heads, qkv.shape[1] // 3 // n_heads)

    def gelu_mul(self, gate, up, out) -> None:
        C.gelu_mul(gate, up, out, gate.size)

    def gaussian_topk(self, x, mult) -> None:
        d = x.shape[-1]
        C.gaussian_topk(x, x.size // d, d, mult)

    def ids_below(self, ids, limit, out) -> None:
        C.ids_below(ids, limit, out, len(ids))

    def mul_rows(self, x, w, out) -> None:
        C.mul_rows(x, w, out, x.shape[0], x.shape[1])

    def rms_match(self, y, target, out) -> None:
        C.rms_match(y, target, out, y.shape[0], y.shape[1])

    def altup_predict(self, x, coef, out) -> None:
        A, n, d = x.shape
        C.altup_predict(x, coef, out, A, n, d)

    def altup_correct(self, pred, coef, active, idx, out) -> None:
        A, n, d = pred.shape
        C.altup_correct(pred, coef, active, idx, out, A, n, d)

    def copy_blocks(self, src, dst, n, groups, width, src_at, dst_at) -> None:
        C.copy_blocks(src, dst, n, groups, width, *src_at, *dst_at)

    def add(self, a, b, out) -> None:
        C.add(a, b, out, a.size)

    def scale(self, x, s) -> None:
        C.scale(x, s, x.size)

    def pos_scale(self, x, pos, beta, length) -> None:
        n = len(x)
        C.pos_scale(x, pos, n, x.size // n if n else 0, float(beta), int(length))

    def softcap(self, x, cap) -> None:
        C.softcap(x, cap, x.size)

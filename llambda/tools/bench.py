"""`llambda bench`: prefill (pp) and decode (tg) tokens/s, optionally beside llama.cpp.

Like llama-bench: pp N evaluates N prompt tokens as one batch from an empty
cache; tg N generates N tokens one at a time (decode steps, no sampling cost
beyond argmax). Each repetition alternates engines (A/B) so drift on a noisy
machine hits both alike; we report the median and the min-max spread.

`depth` (llama-bench's -d) first fills the cache with that many tokens, untimed, so
pp and tg are measured on top of a long context. `load` runs that many busy-loop
processes beside both engines, as other work on a shared machine would. Decode rows
say how many bytes a token reads (weights + the K/V at that depth) and the rate that
implies, beside this machine's read bandwidth measured at the same working-set size and thread count
(the C core's streaming read probe, read_bandwidth below): the bound decode's GB/s is a share of.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class BenchRow:
    engine: str
    test: str
    threads: int
    samples: list[float] = field(default_factory=list)   # tokens/s per repetition

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> str:
        return f"{min(self.samples):.1f}–{max(self.samples):.1f}" if self.samples else "-"


def _tokens(vocab: int, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, min(vocab, 30000), n)]


class OurEngine:
    name = "llambda"

    def __init__(self, path, backend=None, activations=None, n_ctx=None, kv_type=None):
        from ..api import load
        self.model = load(path, backend=backend, activations=activations, n_ctx=n_ctx, kv_type=kv_type,
                          vision=False)
        self.tr = self.model.transformer

    def set_threads(self, t: int) -> None:
        if self.model.backend.name == "native":
            from .. import _native
            _native.set_threads(t)
            self.model.backend.threads = t     # the model's forwards run on at most its own count

    def fill(self, ids: list[int]) -> float:
        """The cache holds `ids` at positions 0.. (the depth of the next test); returns the seconds it took."""
        from .. import engine
        t0 = time.perf_counter()
        for i in range(0, len(ids), 512):
            engine.prefill(self.tr, 0, ids[i:i + 512], i)
        return time.perf_counter() - t0

    def pp(self, ids: list[int], depth: list[int]) -> float:
        from .. import engine
        self.fill(depth)
        t0 = time.perf_counter()
        engine.prefill(self.tr, 0, ids, len(depth))
        return len(ids) / (time.perf_counter() - t0)

    def tg(self, n: int, first: int, depth: list[int]) -> float:
        from .. import engine
        self.last_fill = self.fill(depth)
        tok, d = first, len(depth)
        t0 = time.perf_counter()
        for i in range(n):
            logits = engine.decode(self.tr, [0], [tok], [d + i])
            tok = int(np.argmax(logits[0]))
        return n / (time.perf_counter() - t0)

    def decode_bytes(self, depth: float) -> tuple[int, int]:
        """(weight bytes, K/V bytes) one decode token reads at `depth` cached tokens."""
        from .model_info import decode_weight_bytes
        cache = self.tr.cache     # its layers: the attention layers (a hybrid model's others keep no K/V)
        kv = len(cache.arrays) * cache.positions(cache.k[0])[0, 0].nbytes * depth  # one position of every kv head (any kv_type)
        return decode_weight_bytes(self.model.source), int(kv)



# llama.cpp keeps the log callback's address for the rest of the process: the ctypes callback
# must never be freed (one freed with its owner made a later llama.cpp call in the same process
# jump into freed memory). So it hangs on the module, installed once.
def _silence_llama_cpp(llama_cpp) -> None:
    """Silence llama.cpp's load log (our table is the output)."""
    if getattr(llama_cpp, "_llambda_quiet_log", None) is None:
        llama_cpp._llambda_quiet_log = llama_cpp.llama_log_callback(lambda level, text, user: None)
        llama_cpp.llama_log_set(llama_cpp._llambda_quiet_log, None)


# A llama-cpp-python built for the CPU it was installed on (GGML_NATIVE, pip's default) uses AMX where the
# CPU advertises it; a VM that does not grant AMX kills the process inside llama_decode (seen: SIGSEGV).
# So the engine below first runs a prompt batch and a decode step in a child process: a crash there is a message.
_LLAMA_CPP_TRIAL = """
import sys
from llambda.tools.bench import LlamaCppEngine
e = LlamaCppEngine(sys.argv[1], n_ctx=256)
e.set_threads(1)
ids = [i % e.n_vocab for i in range(128)]
e.pp(ids, [])
e.tg(1, ids[0], [])
"""


def check_llama_cpp_runs(path, timeout: float = 900.0) -> None:
    """Raise SystemExit with what to do if llama.cpp dies on a signal running `path` (in a child process).
    Other failures (no package, a file it cannot load) are left to LlamaCppEngine's own messages."""
    env = dict(os.environ)   # the child imports this llambda, installed or not
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        r = subprocess.run([sys.executable, "-c", _LLAMA_CPP_TRIAL, str(path)], capture_output=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return                      # slow, not dead: the benchmark itself will tell
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = f"signal {-r.returncode}"
        raise SystemExit(
            f"llama.cpp crashed ({sig}) running {path} in a trial process, so --vs llama-cpp cannot run it here. "
            "A llama-cpp-python built for this CPU uses AMX where the CPU advertises it, and a VM may not grant "
            "it: rebuild without AMX, e.g. CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON\" "
            "pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python")


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python's C bindings, driven the way llama-bench does it.

    We call llama_decode directly (one batch for pp, one token per call for tg,
    argmax over the last row's logits) instead of Llama.eval, which copies every
    step's logits into NumPy and would charge Python overhead to llama.cpp.
    """
    name = "llama.cpp"

    def __init__(self, path, n_ctx: int):
        try:
            import llama_cpp
        except ImportError:
            raise SystemExit("--vs llama-cpp needs the llama-cpp-python package: pip install '.[bench]'") from None
        needed = ("llama_model_load_from_file", "llama_init_from_model", "llama_get_memory",
                  "llama_memory_clear", "llama_batch_get_one", "llama_decode", "llama_get_logits_ith")
        missing = [f for f in needed if not hasattr(llama_cpp, f)]
        if missing:
            raise SystemExit(f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks {', '.join(missing)}; "
                             "install a newer one (pip install -U '.[bench]')")
        self.L = llama_cpp
        _silence_llama_cpp(llama_cpp)
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.n_ctx = n_ctx
        self.ctx, self.threads = None, None

    def set_threads(self, t: int) -> None:
        if self.threads == t:
            return
        L = self.L
        if self.ctx is not None:
            L.llama_free(self.ctx)
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = self.n_ctx, 512, 512
        p.n_threads = p.n_threads_batch = t
        self.ctx = L.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create a context")
        self.memory, self.threads = L.llama_get_memory(self.ctx), t

    def _decode(self, ids: list[int]) -> None:
        arr = (self.L.llama_token * len(ids))(*ids)
        if self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax_last(self) -> int:
        ptr = self.L.llama_get_logits_ith(self.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def fill(self, ids: list[int]) -> float:
        self.L.llama_memory_clear(self.memory, True)
        t0 = time.perf_counter()
        for i in range(0, len(ids), 512):
            self._decode(ids[i:i + 512])
        self.L.llama_synchronize(self.ctx)
        return time.perf_counter() - t0

    def pp(self, ids: list[int], depth: list[int]) -> float:
        self.fill(depth)
        t0 = time.perf_counter()
        for i in range(0, len(ids), 512):        # n_batch chunks, as llama-bench does
            self._decode(ids[i:i + 512])
        self.L.llama_synchronize(self.ctx)
        return len(ids) / (time.perf_counter() - t0)

    def tg(self, n: int, first: int, depth: list[int]) -> float:
        self.last_fill = self.fill(depth)
        tok = first
        t0 = time.perf_counter()
        for _ in range(n):
            self._decode([tok])
            tok = self._argmax_last()
        return n / (time.perf_counter() - t0)


def _spin() -> None:
    while True:
        pass


class BusyLoad:
    """`n` processes spinning on the CPU while the benchmark runs (both engines alike)."""

    def __init__(self, n: int):
        self.procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]

    def __enter__(self):
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(5)


def read_bandwidth(nbytes: int, threads: int, reps: int = 5) -> float:
    """GB/s this machine reads at a working set of `nbytes` (at least 64 MiB) on `threads` threads: the
    C core's probe (`_native.read_bandwidth`: the active ISA's widest loads streaming a buffer in 2 MB
    pages over the thread pool, as a decode step reads its weights, timed in the threads' CPU time so
    that other processes on a shared machine do not lower it), median of `reps`; without the C core,
    a NumPy read's median (wall clock, which reads less than our own 1-thread decode: no bound)."""
    try:
        from .. import _native
    except ImportError:
        return numpy_read_bandwidth(nbytes, threads, reps)
    if _native.threads() < threads:
        _native.set_threads(threads)
    return statistics.median(_native.read_bandwidth(max(nbytes, 64 << 20), threads, reps))


def numpy_read_bandwidth(nbytes: int, threads: int, reps: int = 5) -> float:
    """GB/s of reading an array of `nbytes` (at least 64 MiB) with `threads` threads; median of `reps`.

    NumPy reductions release the GIL, so the threads read their slices at once; the array is
    written first so every page is in memory, as a model's packed weights are."""
    n = max(nbytes, 64 << 20) // 4
    a = np.ones(n, dtype=np.float32)
    parts = np.array_split(a, threads)
    out = []
    for _ in range(reps + 1):
        ts = [threading.Thread(target=np.max, args=(p,)) for p in parts]   # SIMD max: memory-bound, unlike sum
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(out[1:])


@dataclass
class Bench:
    rows: list[BenchRow]
    depth: int = 0
    load: int = 0
    decode_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)   # test -> (weights, kv) per token
    bandwidth: dict[int, float] = field(default_factory=dict)                # threads -> GB/s


def run_bench(path, pp: list[int], tg: list[int], threads: list[int], reps: int = 5, vs_llama_cpp: bool = False,
              backend=None, activations=None, log=print, depth: int = 0, load: int = 0,
              kv_type: str | None = None) -> Bench:
    """Every repetition runs each engine at each thread count, in an order reversed from one
    repetition to the next, so drift on a shared machine hits every configuration alike.
    With a depth, each decode test's fill (DEPTH tokens from an empty cache in batches of 512,
    as llama-bench's n_batch) is timed too: the `fill` rows, a prefill of DEPTH tokens."""
    n_ctx = depth + max(pp + tg + [16]) + 8
    engines = [OurEngine(path, backend, activations, n_ctx, kv_type)]
    if vs_llama_cpp:
        check_llama_cpp_runs(path)
        engines.append(LlamaCppEngine(path, n_ctx))
    vocab = engines[0].model.config.vocab_size
    fill = _tokens(vocab, depth, seed=1)
    out = Bench([], depth, load)
    for n in tg:
        out.decode_bytes[f"tg{n}"] = engines[0].decode_bytes(depth + n / 2)
    rows: dict[tuple, BenchRow] = {}

    def record(engine: str, test: str, t: int, v: float) -> None:
        rows.setdefault((engine, test, t), BenchRow(engine, test, t)).samples.append(v)

    configs = [(e, t) for t in threads for e in engines]
    # What the machine reads at the decode working set, under the same load: probed before the
    # runs and again right after each decode repetition of ours (a probe minutes away from the
    # runs read 19 and 40 GB/s on one evening), the median of all the probes.
    probes: dict[int, list[float]] = {t: [] for t in threads}

    def probe(t: int) -> None:
        probes[t].append(read_bandwidth(sum(max(out.decode_bytes.values())), t, reps=3))
        out.bandwidth[t] = statistics.median(probes[t])

    weight_pages = getattr(engines[0].model.backend, "weight_pages", None)
    mapped, huge = weight_pages() if weight_pages else (0, None)
    if huge is not None:   # a decode on 4 KB pages pays page walks the 2 MB-page arena does not
        log(f"  llambda's packed weights: {mapped / 1e6:.0f} MB mapped, {huge / 1e6:.0f} MB of them in 2 MB pages")
    with BusyLoad(load):
        if tg:
            for t in threads:
                probe(t)
                log(f"  read bandwidth, {t} thread(s): {out.bandwidth[t]:.1f} GB/s (C probe; a NumPy read: "
                    f"{numpy_read_bandwidth(sum(max(out.decode_bytes.values())), t, reps=3):.1f})")
        for kind, n in [("pp", n) for n in pp] + [("tg", n) for n in tg]:
            ids = _tokens(vocab, n)
            for e, t in configs:            # warm-up (page in weights, build caches)
                e.set_threads(t)
                e.pp(ids[:min(n, 16)], []) if kind == "pp" else e.tg(min(n, 4), ids[0], [])
            for r in range(reps):
                for e, t in (configs if r % 2 == 0 else configs[::-1]):
                    e.set_threads(t)
                    v = e.pp(ids, fill) if kind == "pp" else e.tg(n, ids[0], fill)
                    record(e.name, f"{kind}{n}", t, v)
                    if kind == "tg" and depth:
                        record(e.name, f"fill{depth}", t, depth / e.last_fill)
                    if kind == "tg" and e is engines[0]:
                        probe(t)
            for t in threads:
                if kind == "tg":
                    log(f"  read bandwidth, {t} thread(s), median of {len(probes[t])} probes: "
                        f"{out.bandwidth[t]:.1f} GB/s ({min(probes[t]):.1f}-{max(probes[t]):.1f})")
                log(f"  {kind}{n} threads={t}: " + ", ".join(
                    f"{e.name} {rows[(e.name, f'{kind}{n}', t)].median:.1f} t/s" for e in engines))
                replays = getattr(engines[0].model.backend, "replays", {})
                fewer = sum(v for (pool, on), v in replays.items() if pool == t and on < t)
                if kind == "tg" and fewer:   # the thread tuner ran some of our decode steps on fewer threads
                    log(f"  llambda decode steps on fewer than {t} threads (thread tuner), so far: {fewer} of "
                        f"{sum(v for (pool, _), v in replays.items() if pool == t)}")
    out.rows = list(rows.values())
    return out


def markdown(bench: Bench, model_name: str) -> str:
    rows = bench.rows
    ours = {(r.test, r.threads): r for r in rows if r.engine == "llambda"}
    theirs = {(r.test, r.threads): r for r in rows if r.engine != "llambda"}
    head = "| model | test | threads | llambda t/s (median, min–max) |"
    sep = "|---|---|---|---|"
    if theirs:
        head += " llama.cpp t/s (median, min–max) | ratio |"
        sep += "---|---|"
    head += " decode GB/s (% of measured read bandwidth) |"
    sep += "---|"
    out = [head, sep]
    load = f" (load {bench.load})" if bench.load else ""
    for key, r in ours.items():
        at = f" @ d{bench.depth}" if bench.depth and not r.test.startswith("fill") else ""
        line = f"| {model_name} | {r.test}{at}{load} | {r.threads} | {r.median:.1f} ({r.spread}) |"
        if theirs:
            o = theirs.get(key)
            line += f" {o.median:.1f} ({o.spread}) | {r.median / o.median:.2f}× |" if o else " - | - |"
        per_token = bench.decode_bytes.get(r.test)
        if per_token and r.threads in bench.bandwidth:
            gbs = r.median * sum(per_token) / 1e9
            line += f" {gbs:.1f} ({100 * gbs / bench.bandwidth[r.threads]:.0f}% of {bench.bandwidth[r.threads]:.1f}) |"
        else:
            line += " - |"
        out.append(line)
    if any(r.test.startswith("fill") for r in rows):
        out.append(f"\nfill{bench.depth}: the prefill of {bench.depth} tokens from an empty cache (in batches of 512) "
                   "before each decode repetition")
    for test, (w, kv) in bench.decode_bytes.items():
        out.append(f"\n{test} reads {(w + kv) / 1e6:.1f} MB per token: weights {w / 1e6:.1f} MB + K/V {kv / 1e6:.1f} MB "
                   f"(at a mean depth of {bench.depth + int(test[2:]) // 2} tokens)")
    return "\n".join(out)

"""`llambda bench`: prefill (pp) and decode (tg) tokens/s, optionally beside llama.cpp.

Like llama-bench: pp N evaluates N prompt tokens as one batch from an empty
cache; tg N generates N tokens one at a time (decode steps, no sampling cost
beyond argmax). Each repetition alternates engines (A/B) so drift on a noisy
machine hits both alike; we report the median and the min-max spread.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

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

    def __init__(self, path, backend=None, activations=None, n_ctx=None):
        from ..api import load
        self.model = load(path, backend=backend, activations=activations, n_ctx=n_ctx)
        self.tr = self.model.transformer

    def set_threads(self, t: int) -> None:
        if self.model.backend.name == "native":
            from .. import _native
            _native.set_threads(t)

    def pp(self, ids: list[int]) -> float:
        from .. import engine
        t0 = time.perf_counter()
        engine.prefill(self.tr, 0, ids, 0)
        return len(ids) / (time.perf_counter() - t0)

    def tg(self, n: int, first: int) -> float:
        from .. import engine
        tok = first
        t0 = time.perf_counter()
        for i in range(n):
            logits = engine.decode(self.tr, [0], [tok], [i])
            tok = int(np.argmax(logits[0]))
        return n / (time.perf_counter() - t0)


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
        # Silence llama.cpp's load log: our table is the output. Keep the callback alive.
        self._quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
        llama_cpp.llama_log_set(self._quiet, None)
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

    def pp(self, ids: list[int]) -> float:
        self.L.llama_memory_clear(self.memory, True)
        t0 = time.perf_counter()
        for i in range(0, len(ids), 512):        # n_batch chunks, as llama-bench does
            self._decode(ids[i:i + 512])
        self.L.llama_synchronize(self.ctx)
        return len(ids) / (time.perf_counter() - t0)

    def tg(self, n: int, first: int) -> float:
        self.L.llama_memory_clear(self.memory, True)
        tok = first
        t0 = time.perf_counter()
        for _ in range(n):
            self._decode([tok])
            tok = self._argmax_last()
        return n / (time.perf_counter() - t0)


def run_bench(path, pp: list[int], tg: list[int], threads: list[int], reps: int = 5, vs_llama_cpp: bool = False,
              backend=None, activations=None, log=print) -> list[BenchRow]:
    n_ctx = max(pp + tg + [16]) + 8
    engines = [OurEngine(path, backend, activations, n_ctx)]
    if vs_llama_cpp:
        engines.append(LlamaCppEngine(path, n_ctx))
    vocab = engines[0].model.config.vocab_size
    rows: dict[tuple, BenchRow] = {}
    for t in threads:
        tests = [("pp", n) for n in pp] + [("tg", n) for n in tg]
        for kind, n in tests:
            ids = _tokens(vocab, n)
            for e in engines:            # warm-up (page in weights, build caches)
                e.set_threads(t)
                e.pp(ids[:min(n, 16)]) if kind == "pp" else e.tg(min(n, 4), ids[0])
            for r in range(reps):
                order = engines if r % 2 == 0 else engines[::-1]
                for e in order:
                    e.set_threads(t)
                    v = e.pp(ids) if kind == "pp" else e.tg(n, ids[0])
                    rows.setdefault((e.name, f"{kind}{n}", t), BenchRow(e.name, f"{kind}{n}", t)).samples.append(v)
            log(f"  {kind}{n} threads={t}: " + ", ".join(
                f"{e.name} {rows[(e.name, f'{kind}{n}', t)].median:.1f} t/s" for e in engines))
    return list(rows.values())


def markdown(rows: list[BenchRow], model_name: str) -> str:
    ours = {(r.test, r.threads): r for r in rows if r.engine == "llambda"}
    theirs = {(r.test, r.threads): r for r in rows if r.engine != "llambda"}
    head = "| model | test | threads | llambda t/s (median, min–max) |"
    sep = "|---|---|---|---|"
    if theirs:
        head += " llama.cpp t/s (median, min–max) | ratio |"
        sep += "---|---|"
    out = [head, sep]
    for key, r in ours.items():
        line = f"| {model_name} | {r.test} | {r.threads} | {r.median:.1f} ({r.spread}) |"
        if theirs:
            o = theirs.get(key)
            line += f" {o.median:.1f} ({o.spread}) | {r.median / o.median:.2f}× |" if o else " - | - |"
        out.append(line)
    return "\n".join(out)

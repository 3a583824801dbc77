"""`llambda bench`: our measurements, the table, and how llama.cpp is driven (through a fake
of llama-cpp-python's C API, so the tests never need the optional bench extra)."""
import sys
import types

import pytest

from llambda import cli
from llambda.tools import bench


def test_run_bench_measures_both_tests(smollm2_gguf):
    result = bench.run_bench(smollm2_gguf, pp=[16], tg=[4], threads=[1], reps=2, log=lambda s: None)
    got = {(r.engine, r.test, r.threads): r for r in result.rows}
    assert set(got) == {("llambda", "pp16", 1), ("llambda", "tg4", 1)}
    for r in result.rows:
        assert len(r.samples) == 2 and all(s > 0 for s in r.samples)
    weights, kv = result.decode_bytes["tg4"]
    assert 60e6 < weights < 100e6 and kv > 0             # SmolLM2 Q4_1: ~92 MB of weights, tied head
    assert result.bandwidth[1] > 0
    table = bench.markdown(result, "m.gguf").splitlines()
    assert table[0].startswith("| model | test | threads | llambda") and "GB/s" in table[0]
    assert "ratio" not in table[0]
    assert "tg4 reads" in table[-1]


def test_depth_and_load(smollm2_gguf):
    """-d fills the cache first (the decode reads the K/V at that depth), --load spins beside it."""
    result = bench.run_bench(smollm2_gguf, pp=[8], tg=[4], threads=[1], reps=1, log=lambda s: None, depth=64, load=1)
    _, kv_deep = result.decode_bytes["tg4"]
    _, kv0 = bench.run_bench(smollm2_gguf, pp=[], tg=[4], threads=[1], reps=1, log=lambda s: None).decode_bytes["tg4"]
    assert kv_deep == kv0 * (64 + 2) // 2
    table = bench.markdown(result, "m")
    assert "pp8 @ d64 (load 1)" in table and "mean depth of 66" in table
    fill = [r for r in result.rows if r.test == "fill64"]      # the fill, timed: a prefill of 64 tokens
    assert len(fill) == 1 and fill[0].samples[0] > 0 and "| fill64 (load 1) |" in table


def test_kv_type_and_alternated_thread_counts(smollm2_gguf):
    result = bench.run_bench(smollm2_gguf, pp=[], tg=[2], threads=[1, 2], reps=2, log=lambda s: None, depth=8,
                             kv_type="f16")
    _, kv16 = result.decode_bytes["tg2"]
    _, kv32 = bench.run_bench(smollm2_gguf, pp=[], tg=[2], threads=[1], reps=1, log=lambda s: None,
                              depth=8).decode_bytes["tg2"]
    assert kv16 * 2 == kv32
    assert {(r.test, r.threads) for r in result.rows} == {("tg2", 1), ("tg2", 2), ("fill8", 1), ("fill8", 2)}
    assert all(len(r.samples) == 2 for r in result.rows)


def test_busy_load_processes_end():
    with bench.BusyLoad(2) as load:
        assert all(p.is_alive() for p in load.procs)
    assert not any(p.is_alive() for p in load.procs)


def test_markdown_ratio():
    ours = bench.BenchRow("llambda", "tg8", 2, [30.0, 40.0, 50.0])
    theirs = bench.BenchRow("llama.cpp", "tg8", 2, [20.0])
    result = bench.Bench([ours, theirs], decode_bytes={"tg8": (90_000_000, 10_000_000)}, bandwidth={2: 8.0})
    line = bench.markdown(result, "m").splitlines()[2]
    assert "| 40.0 (30.0–50.0) | 20.0 (20.0–20.0) | 2.00× | 4.0 (50% of 8.0) |" in line


class FakeLlamaCpp(types.ModuleType):
    """The subset of llama-cpp-python's ctypes API the bench uses; logits say 'next = token + 1'."""
    llama_token = __import__("ctypes").c_int32

    def __init__(self, n_vocab=50):
        super().__init__("llama_cpp")
        self.n_vocab, self.calls, self.last = n_vocab, [], None
        self.logits = (__import__("ctypes").c_float * n_vocab)()

    def llama_log_callback(self, fn):
        return fn

    def llama_log_set(self, cb, user):
        self.calls.append("log_set")

    def llama_backend_init(self):
        pass

    def llama_model_default_params(self):
        return None

    def llama_model_load_from_file(self, path, params):
        return object()

    def llama_model_get_vocab(self, model):
        return object()

    def llama_vocab_n_tokens(self, vocab):
        return self.n_vocab

    def llama_context_default_params(self):
        return types.SimpleNamespace()

    def llama_init_from_model(self, model, p):
        self.calls.append(("ctx", p.n_threads, p.n_threads_batch, p.n_batch))
        return object()

    def llama_free(self, ctx):
        self.calls.append("free")

    def llama_get_memory(self, ctx):
        return object()

    def llama_memory_clear(self, mem, data):
        self.calls.append("clear")

    def llama_batch_get_one(self, arr, n):
        return list(arr)[:n]

    def llama_decode(self, ctx, batch):
        self.calls.append(("decode", len(batch)))
        for i in range(self.n_vocab):
            self.logits[i] = 0.0
        self.logits[(batch[-1] + 1) % self.n_vocab] = 1.0
        self.last = batch
        return 0

    def llama_synchronize(self, ctx):
        pass

    def llama_get_logits_ith(self, ctx, i):
        assert i == -1
        return self.logits


def test_llama_cpp_driven_like_llama_bench(monkeypatch):
    fake = FakeLlamaCpp()
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    e = bench.LlamaCppEngine("m.gguf", n_ctx=2048)
    e.set_threads(2)
    e.set_threads(2)                       # same count: the context is kept
    assert [c for c in fake.calls if c[0] == "ctx"] == [("ctx", 2, 2, 512)]
    fake.calls.clear()
    assert e.pp(list(range(1200)), []) > 0     # one prompt in n_batch chunks from an empty cache
    assert fake.calls == ["clear", ("decode", 512), ("decode", 512), ("decode", 176)]
    fake.calls.clear()
    assert e.tg(5, 7, []) > 0            # one token per decode, each the argmax of the last
    assert fake.calls == ["clear"] + [("decode", 1)] * 5 and fake.last == [11]
    fake.calls.clear()
    assert e.tg(2, 7, list(range(600))) > 0   # at depth: the cache is filled first, timed apart
    assert fake.calls == ["clear", ("decode", 512), ("decode", 88), ("decode", 1), ("decode", 1)]
    e.set_threads(1)
    assert "free" in fake.calls


def test_llama_cpp_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(SystemExit, match=r"pip install '\.\[bench\]'"):
        bench.LlamaCppEngine("m.gguf", n_ctx=64)


def test_llama_cpp_too_old_is_a_clear_error(monkeypatch):
    old = types.ModuleType("llama_cpp")
    old.__version__ = "0.2.0"
    monkeypatch.setitem(sys.modules, "llama_cpp", old)
    with pytest.raises(SystemExit, match="0.2.0 lacks llama_model_load_from_file"):
        bench.LlamaCppEngine("m.gguf", n_ctx=64)


@pytest.mark.parametrize("trial, dies", [("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", True),
                                         ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", True),
                                         ("import sys; sys.exit(3)", False), ("pass", False)])
def test_llama_cpp_crash_is_a_clear_error(monkeypatch, trial, dies):
    """llama.cpp runs first in a child: a build that dies there (AMX in a VM that does not grant it) is a
    message saying how to rebuild, not our process killed mid-benchmark; other failures are left to the
    engine's own errors."""
    monkeypatch.setattr(bench, "_LLAMA_CPP_TRIAL", trial)
    if dies:
        with pytest.raises(SystemExit, match=r"llama\.cpp crashed \(SIG(SEGV|ILL)\).*GGML_NATIVE=OFF"):
            bench.check_llama_cpp_runs("m.gguf")
    else:
        bench.check_llama_cpp_runs("m.gguf")


def test_cli_bench_prints_table(smollm2_gguf, capsys):
    assert cli.main(["bench", "-m", str(smollm2_gguf), "-p", "8", "-n", "2", "--threads-list", "1", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "| pp8 | 1 |" in out and "| tg2 | 1 |" in out


@pytest.mark.parametrize("args", [["-p", "-1"], ["-n", "x"], ["--threads-list", "1,-2"], ["-r", "0"]])
def test_cli_bench_bad_numbers(smollm2_gguf, capsys, args):
    assert cli.main(["bench", "-m", str(smollm2_gguf), *args]) != 0
    assert "llambda: error:" in capsys.readouterr().err


def test_spec_bench_measures_plain_and_speculative(smollm2_gguf):
    """--spec: both modes on the same prompt, the same text (greedy), acceptance counted; no speed asserted."""
    from llambda.tools import spec_bench
    for mode, draft in (("lookup", None), ("draft", smollm2_gguf)):
        rows = spec_bench.run_spec_bench(smollm2_gguf, mode, draft, threads=1, reps=2, n_gen=24,
                                         tasks=["edit"], log=lambda s: None)
        got = {(r.engine, r.mode): r for r in rows}
        assert set(got) == {("llambda", "plain"), ("llambda", mode)}
        assert all(len(r.samples) == 2 and all(s > 0 for s in r.samples) for r in rows)
        assert got[("llambda", mode)].text == got[("llambda", "plain")].text
        assert got[("llambda", mode)].drafted >= got[("llambda", mode)].accepted > 0
        table = spec_bench.markdown(rows, "m", "d" if draft else None).splitlines()
        assert table[0].startswith("| model | task | engine | mode |")
        assert table[3].endswith("| yes |") and "×" in table[3]


def test_spec_bench_needs_a_draft_model_for_draft():
    from llambda.tools import spec_bench
    with pytest.raises(ValueError, match="model-draft"):
        spec_bench.run_spec_bench("unused.gguf", "draft", None)

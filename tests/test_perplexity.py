"""Perplexity (llama.cpp's method) and the precision ladder: reference = exact mode, fast mode within 1%."""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.tools.perplexity import perplexity

TEXT = (Path(__file__).parent / "fixtures" / "text" / "marlow_bend.txt").read_text()
needs_native = pytest.mark.skipif("native" not in available_backends(), reason="the native C core is not built")


@pytest.fixture(scope="module")
def ppl_by_mode(smollm2_gguf):
    out = {}
    modes = [("numpy", None)] + ([("native", "f32"), ("native", "q8")] if "native" in available_backends() else [])
    for backend, act in modes:
        with llambda.load(smollm2_gguf, backend=backend, activations=act, n_ctx=128) as m:
            out[(backend, act)] = perplexity(m, TEXT, n_ctx=128)
    return out


def test_perplexity_is_finite_and_plausible(ppl_by_mode):
    r = ppl_by_mode[("numpy", None)]
    assert r.n_windows >= 5 and r.n_scored == r.n_windows * 63
    assert math.isfinite(r.ppl) and 1.5 < r.ppl < 100, r.ppl


@needs_native
def test_native_exact_matches_reference_backend(ppl_by_mode):
    ref, exact = ppl_by_mode[("numpy", None)].ppl, ppl_by_mode[("native", "f32")].ppl
    assert abs(exact / ref - 1) < 1e-3, (exact, ref)


@needs_native
def test_fast_mode_within_one_percent_of_exact(ppl_by_mode):
    exact, fast = ppl_by_mode[("native", "f32")].ppl, ppl_by_mode[("native", "q8")].ppl
    assert abs(fast / exact - 1) < 0.01, (fast, exact)


def test_windows_are_scored_on_their_second_half(smollm2_gguf):
    """Recompute one window by hand from full-sequence logits."""
    with llambda.load(smollm2_gguf, backend="numpy", n_ctx=64) as m:
        ids = m.tokenize(TEXT)[:64]
        res = perplexity(m, m.detokenize(ids) + "", n_ctx=64, max_windows=1)
        tr = m.transformer
        logits = tr.forward(np.array(ids, np.int32), np.zeros(64, np.int32), np.arange(64, dtype=np.int32),
                            np.arange(32, 63), out=np.empty((31, m.config.vocab_size), np.float32))
        x = logits.astype(np.float64)
        lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
        nll = -(x[np.arange(31), ids[33:64]] - lse).mean()
    assert res.n_scored == 31
    assert abs(res.nll - nll) < 1e-4


def test_cli_prints_perplexity_last(smollm2_gguf, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "perplexity", "-m", str(smollm2_gguf), "-f", str(f),
                          "--ctx", "128", "--chunks", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("perplexity: ") and float(last.split()[1]) > 1


def test_text_too_short_is_a_clear_error(smollm2_gguf):
    with llambda.load(smollm2_gguf, backend="numpy", n_ctx=128) as m:
        with pytest.raises(llambda.LlambdaError, match="at least one window"):
            perplexity(m, "too short", n_ctx=128)


@pytest.mark.model
@needs_native
@pytest.mark.parametrize("fixture", ["qwen05_gguf", "gemma3_gguf"])
def test_fast_mode_within_one_percent_of_exact_on_qwen_and_gemma(fixture, request):
    path = request.getfixturevalue(fixture)
    ppl = {}
    for act in ("f32", "q8"):
        with llambda.load(path, backend="native", activations=act, n_ctx=128) as m:
            ppl[act] = perplexity(m, TEXT, n_ctx=128).ppl
    assert abs(ppl["q8"] / ppl["f32"] - 1) < 0.01, ppl


@pytest.mark.parametrize("windows", [-1, 0, 1.5, True])
def test_a_window_count_below_one_is_a_clear_error(smollm2_gguf, windows):
    """--chunks -1 once scored no window and ended in a ZeroDivisionError (0 meant "all" by accident)."""
    with llambda.load(smollm2_gguf, backend="numpy", n_ctx=64) as m:
        with pytest.raises(llambda.errors.InvalidInputError, match="max_windows"):
            perplexity(m, TEXT, n_ctx=64, max_windows=windows)


def test_cli_text_file_that_cannot_be_read_is_an_error_line(tmp_path):
    """-f naming a directory: one error line, not an IsADirectoryError traceback (refused before any load)."""
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "perplexity", "-m", str(tmp_path / "none.gguf"),
                          "-f", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "cannot read the text file" in out.stderr, out.stderr


def test_cli_endless_text_file_is_an_error_line(tmp_path):
    """-f /dev/zero read until memory ran out: the text is read up to a cap, then refused (before any load)."""
    if not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero (an endless file)")
    out = subprocess.run([sys.executable, "-m", "llambda.cli", "perplexity", "-m", str(tmp_path / "none.gguf"),
                          "-f", "/dev/zero"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "more than" in out.stderr, out.stderr


def test_memory_does_not_grow_with_the_window(smollm2_gguf):
    """The logits of one forward step are scored at a time: the whole half-window's (rows x vocab) logits and
    their float64 copies once took 3 GB at -c 4096 (SmolLM2's 49k vocabulary), growing with -c past any plan."""
    import tracemalloc
    with llambda.load(smollm2_gguf, backend=available_backends()[0], n_ctx=1024, max_batch=32) as m:
        half_window = (1024 // 2 - 1) * m.config.vocab_size * 4        # its float32 logits alone: 100 MB
        tracemalloc.start()
        try:
            res = perplexity(m, TEXT * 4, n_ctx=1024, max_windows=1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert res.n_scored == 511 and math.isfinite(res.ppl)
    assert peak < half_window / 2, (peak, half_window)

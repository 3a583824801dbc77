"""LLAMBDA_* environment switches: a value a switch does not take is never guessed at. It gives the
documented default and one warning line naming the switch (Python: llambda/switches.py; C: csrc/core/env.c),
never a crash, a traceback or another path."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from llambda import switches
from llambda.errors import LlambdaWarning

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["abc", "-1", "2", "99999999999999999999", "1e3", "avx9", "oui", "ｙｅｓ", "1\n0", "0x1", "on off",
           "y" * 5000]


@pytest.mark.parametrize("raw, want", [("1", True), ("TRUE", True), (" yes ", True), ("On", True),
                                       ("0", False), ("false", False), ("NO\t", False), ("off", False)])
def test_flag_takes_the_usual_spellings(monkeypatch, raw, want):
    monkeypatch.setenv("LLAMBDA_TEST_FLAG", raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert switches.flag("LLAMBDA_TEST_FLAG", not want) is want


@pytest.mark.parametrize("default", [True, False, None])
def test_flag_unset_or_empty_is_the_default(monkeypatch, default):
    monkeypatch.delenv("LLAMBDA_TEST_FLAG", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert switches.flag("LLAMBDA_TEST_FLAG", default) is default
        for raw in ("", "  "):
            monkeypatch.setenv("LLAMBDA_TEST_FLAG", raw)
            assert switches.flag("LLAMBDA_TEST_FLAG", default) is default


@pytest.mark.parametrize("raw", HOSTILE)
@pytest.mark.parametrize("default", [True, False, None])
def test_flag_warns_once_and_keeps_the_default_on_anything_else(monkeypatch, raw, default):
    monkeypatch.setenv("LLAMBDA_TEST_FLAG", raw)
    with pytest.warns(LlambdaWarning, match="LLAMBDA_TEST_FLAG=.* is not one of 1/true/yes/on or 0/false/no/off; "
                                            "using the default") as got:
        assert switches.flag("LLAMBDA_TEST_FLAG", default) is default
    assert len(got) == 1 and "\n" not in str(got[0].message)


def test_the_python_switches_go_through_the_parser(monkeypatch):
    from llambda.backends import weight_arena
    from llambda.formats import pagecache, staging
    cases = [("LLAMBDA_ARENA_COLLAPSE", weight_arena.collapse_enabled, True),
             ("LLAMBDA_ARENA_PREFAULT", weight_arena.prefault_enabled, False),
             ("LLAMBDA_STAGED_READ", staging.enabled, False)]
    for name, read, default in cases:
        monkeypatch.setenv(name, "off" if default else "on")
        assert read() is not default
        monkeypatch.setenv(name, "maybe")
        with pytest.warns(LlambdaWarning, match=name):
            assert read() is default
        monkeypatch.delenv(name)
    # the page cache: unset is automatic (big files dropped), on keeps, off drops; a typo is automatic
    for raw, small, big in [("", False, True), ("1", False, False), ("off", True, True), ("keep", False, True)]:
        monkeypatch.setenv("LLAMBDA_KEEP_FILE_CACHE", raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert (pagecache.should_drop(1, 100), pagecache.should_drop(99, 100)) == (small, big)


def _native_child(env: dict, code: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LLAMBDA_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)


def _native_or_skip():
    try:
        from llambda import _native  # noqa: F401
    except ImportError:
        pytest.skip("the C core is not built")


C_SWITCHES = {"LLAMBDA_MOE_UNITS": "flag", "LLAMBDA_POOL_REDO": "flag", "LLAMBDA_SPIN_US": "whole",
              "LLAMBDA_BUSY_SPIN_US": "whole", "LLAMBDA_ISA": "isa"}
# a 2-thread pool reads the pool's switches; an MoE call of 2 tokens reads LLAMBDA_MOE_UNITS
USE_THE_CORE = """
import numpy as np
from llambda import _native as C
from llambda.backends.native import NativeBackend
from llambda.formats.quants import QType, quantize
from llambda.formats.weights import WeightTensor
rng = np.random.default_rng(0)
E, k, d, ff, n = 4, 2, 64, 64, 2
def experts(name, rows, cols):
    v = rng.normal(0, 0.1, (E, rows, cols)).astype(np.float32)
    return WeightTensor(name, QType.Q8_0, (E, rows, cols), quantize(v, QType.Q8_0).reshape(-1))
class Scratch:
    moe_f = np.zeros(n * k * (2 * d + 2 * ff + 1), np.float32)
    moe_i = np.zeros(3 * n * k + E + 1, np.int32)
C.set_threads(2)
b = NativeBackend(activations="q8")
h = b.prepare_experts(experts("gate", ff, d), experts("up", ff, d), experts("down", d, ff))
out = np.zeros((n, d), np.float32)
b.moe(rng.normal(0, 1, (n, d)).astype(np.float32), rng.normal(0, 1, (n, E)).astype(np.float32), h, k,
      "softmax_topk", True, out, scratch=Scratch(), act=("silu",))
print(C.isa(), out.tobytes().hex()[:64])
"""


@pytest.mark.parametrize("name", sorted(C_SWITCHES))
def test_c_switches_warn_in_one_line_and_keep_the_default(name):
    _native_or_skip()
    base = _native_child({}, USE_THE_CORE)
    assert base.returncode == 0, base.stderr
    for raw in HOSTILE + ["", " ", "avx2x"]:
        r = _native_child({name: raw}, USE_THE_CORE)
        assert r.returncode == 0, (raw, r.stderr)
        assert r.stdout == base.stdout                      # the default path (the ISA chosen, no other)
        lines = [ln for ln in r.stderr.splitlines() if name in ln]
        valid = C_SWITCHES[name] == "whole" and raw.strip().isdigit() and int(raw) <= 1000000     # "2"
        if raw.strip() and not valid:
            assert len(lines) == 1 and lines[0].startswith("llambda: warning:"), (raw, r.stderr)
        else:
            assert not lines, (raw, r.stderr)


@pytest.mark.parametrize("raw", ["0", "off", "No", " false "])
def test_c_flags_take_the_python_spellings(raw):
    _native_or_skip()
    for name in ("LLAMBDA_MOE_UNITS", "LLAMBDA_POOL_REDO"):
        r = _native_child({name: raw}, USE_THE_CORE)
        assert r.returncode == 0 and name not in r.stderr, (name, raw, r.stderr)


def test_isa_takes_any_case_and_spaces():
    _native_or_skip()
    r = _native_child({"LLAMBDA_ISA": " SCALAR "}, USE_THE_CORE)
    assert r.returncode == 0 and r.stdout.startswith("scalar ") and "LLAMBDA_ISA" not in r.stderr, r.stderr


def test_the_servers_api_key_is_one_a_client_can_send():
    from llambda.cli import _api_key
    assert _api_key(None) is None and _api_key("s3cret-key_1") == "s3cret-key_1"
    for blank in ("", "   "):
        with pytest.warns(LlambdaWarning, match="empty: the server requires none"):
            assert _api_key(blank) is None
    for bad in (" s3cret", "s3cret\n", "clé", "a\tb"):
        with pytest.raises(ValueError, match="printable ASCII"):
            _api_key(bad)

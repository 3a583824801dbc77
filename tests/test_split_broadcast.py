"""The AVX-512 K-quant GEMM with LLAMBDA_SPLIT_BROADCAST forced both ways against the NumPy oracle of
test_native_matmul, and bit-identical between the two: whatever broadcast form a kernel picks by the
switch (docs/BENCHMARKS.md, 2026-12-04: on Zen 4 the K-quant tiles keep the folded {1to16} form, measured
no slower), a row's result may not depend on it.

The switch is read once per process, so each value runs in a subprocess of its own."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llambda import _native as nat

pytest.importorskip("gguf.quants", reason="gguf-py (test dependency) provides the NumPy oracle")
pytestmark = pytest.mark.skipif("avx512" not in nat.isa_available(), reason="needs AVX-512")

KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
# Shapes past one tile, one unit and one K chunk: single tiles, panel units, pairs of groups, tails.
SHAPES = [(48, 512, 9), (100, 768, 70), (64, 1536, 130), (40, 4608, 33)]

CHILD = r"""
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import test_native_matmul as T
nat = T.nat
nat.set_isa("avx512")
hashes = {}
for tname in sys.argv[2].split(","):
    h = hashlib.sha256()
    for rows, cols, n in json.loads(sys.argv[3]):
        rng = np.random.default_rng(rows * 31 + cols + n)
        m = T.Matrix(tname, rows, cols, rng)
        x = T.activations(n, cols, rng)
        T.check(m, x, 0)
        for threads in (1, 2):
            nat.set_threads(threads)
            h.update(T.run(tname, *m.packed, rows, cols, x, 0).tobytes())
    hashes[tname] = h.hexdigest()
print(json.dumps(hashes))
"""


def _run(split):
    env = dict(os.environ, LLAMBDA_SPLIT_BROADCAST=str(split))
    tests = str(Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", CHILD, tests, ",".join(KQUANTS), json.dumps(SHAPES)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_kquant_gemm_split_broadcast_both_ways():
    folded, split = _run(0), _run(1)
    assert folded == split

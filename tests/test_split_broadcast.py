"""The AVX-512 32-block GEMM in both of its forms (LLAMBDA_SPLIT_BROADCAST=1: the split pair tiles picked on
AMD's cores; =0: Intel's folded-broadcast tiles): each against the NumPy oracle of test_native_matmul, and the
two bit for bit equal (the same float operations in the same order). The switch is read once per process,
so each form runs in a child."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

nat = pytest.importorskip("llambda._native")
pytest.importorskip("gguf.quants", reason="gguf-py (test dependency) provides the NumPy oracle")

ROOT = Path(__file__).resolve().parents[1]
TYPES32 = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"]

# rows 100: pairs of groups and a last group alone; n: 8-row and 4-row tiles with every tail (4, 2, 1),
# units of 64 and 128 rows, and a GEMV
CHILD = """
import hashlib, sys
import numpy as np
sys.path.insert(0, "tests")
import test_native_matmul as T
from llambda import _native as nat
nat.set_isa("avx512")
for threads in (1, 2):
    nat.set_threads(threads)
    h = hashlib.sha256()
    for tname in %r:
        rng = np.random.default_rng(T.TYPES[tname])
        for rows, cols in ((100, 160), (64, 2112)):
            m = T.Matrix(tname, rows, cols, rng)
            for n in (1, 7, 16, 23, 65, 131):
                x = T.activations(n, cols, rng)
                T.check(m, x, 0, layouts=(1,))
                h.update(T.run(tname, m.packed[0], m.packed[1], rows, cols, x, 0).tobytes())
    print(threads, h.hexdigest())
"""


@pytest.mark.skipif("avx512" not in nat.isa_available(), reason="this CPU has no AVX-512")
def test_split_and_folded_tiles_match_the_oracle_and_each_other():
    outs = {}
    for split in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMBDA_")}
        env["LLAMBDA_SPLIT_BROADCAST"] = split
        r = subprocess.run([sys.executable, "-c", CHILD % (TYPES32,)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"LLAMBDA_SPLIT_BROADCAST={split}: {r.stderr[-3000:]}"
        outs[split] = r.stdout.split()
        assert len(outs[split]) == 4, r.stdout
    assert outs["0"] == outs["1"], "the split tiles' outputs differ from the folded ones"
    assert outs["0"][1] == outs["0"][3], "1 and 2 threads differ"

"""Latent attention's place in the code (models/mla.py): the shared forward (models/base.py) reaches it through
its hook only and imports no architecture's module; its per-head products are each head's own matmul.
Its numerics are tests/test_deepseek.py's."""
import ast
from pathlib import Path

import numpy as np
import pytest

from llambda.backends import available_backends, create_backend
from llambda.formats.weights import WeightTensor
from llambda.models.mla import per_head_matmuls

BASE = Path(__file__).resolve().parents[1] / "llambda" / "models" / "base.py"
ARCHITECTURES = {"deepseek2", "qwen3next", "lfm2", "gpt_oss", "llama", "qwen2", "qwen3", "gemma2", "gemma3",
                 "granite", "mistral", "mixtral", "olmo2", "phi3", "qwen2moe", "qwen3moe", "smollm3"}


def test_the_shared_forward_imports_no_architecture_module():
    imported = set()
    for node in ast.walk(ast.parse(BASE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.rsplit(".", 1)[-1])
    assert "mla" in imported                      # the walk sees base's imports
    assert not imported & ARCHITECTURES


def test_the_shared_forward_holds_no_latent_attention_block():
    src = BASE.read_text(encoding="utf-8")
    assert "_mla_attention(" in src
    assert "def _mla_" not in src and "absorbed_key_heads" not in src


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_per_head_matmuls_are_each_heads_product(backend):
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    B = create_backend(backend)
    rng = np.random.default_rng(0)
    H, n, k, m = 3, 5, 16, 8
    mats = [rng.standard_normal((m, k)).astype(np.float32) for _ in range(H)]
    weights = [B.prepare_matrix(WeightTensor.from_float(f"w{g}", w)) for g, w in enumerate(mats)]
    B.end_load()
    src = rng.standard_normal(H * n * k).astype(np.float32)
    dst = np.full(H * n * m + 7, np.nan, np.float32)        # past the heads' rows: untouched
    per_head_matmuls(B, src, weights, dst, n, k, m)
    want = np.concatenate([(src[g * n * k:(g + 1) * n * k].reshape(n, k) @ mats[g].T).reshape(-1) for g in range(H)])
    np.testing.assert_allclose(dst[:H * n * m], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(dst[H * n * m:]).all()

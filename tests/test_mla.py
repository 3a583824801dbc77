"""Latent attention's place in the code (models/mla.py): the shared forward (models/base.py) reaches it through
its hook only and imports no architecture's module; its per-head products are each head's own matmul.
Its numerics are tests/test_deepseek.py's."""
import ast
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends, create_backend
from llambda.formats.weights import WeightTensor
from llambda.errors import InvalidInputError
from llambda.models import ARCHITECTURES, ENCODERS
from llambda.models.mla import per_head_matmuls
from test_deepseek import wide_mla_gguf

BASE = Path(__file__).resolve().parents[1] / "llambda" / "models" / "base.py"
ARCHITECTURE_MODULES = set(ARCHITECTURES.values()) | set(ENCODERS.values())


def test_the_shared_forward_imports_no_architecture_module():
    imported = set()
    for node in ast.walk(ast.parse(BASE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.rsplit(".", 1)[-1])
    assert "mla" in imported and "deepseek2" in ARCHITECTURE_MODULES      # the walk sees base's imports
    assert not imported & ARCHITECTURE_MODULES


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


def test_a_q8_0_cache_refuses_a_compressed_row_of_part_blocks_saying_what_to_change(tmp_path, monkeypatch):
    """kv_lora_rank 40 + qk_rope 64: a compressed row of 104 values, not whole q8_0 blocks of 32. The refusal
    names that row (not "head_dim", which is the expanded heads' 192 here) and the two ways out; both work."""
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    path = wide_mla_gguf(tmp_path / "part.gguf", H=2, kvr=40, layers=1)
    monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "0")
    with pytest.raises(InvalidInputError) as e:
        llambda.load(path, backend="native", kv_type="q8_0", n_ctx=32)
    msg = str(e.value)
    assert "kv_lora_rank + qk_rope_head_dim = 104 values" in msg and "head_dim a multiple" not in msg
    assert "kv_type='f16'" in msg and "LLAMBDA_MLA_EXPANDED=1" in msg
    with llambda.load(path, backend="native", kv_type="f16", n_ctx=32) as m:
        assert m.transformer.mla_compressed
    monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1")
    with llambda.load(path, backend="native", kv_type="q8_0", n_ctx=32) as m:
        assert not m.transformer.mla_compressed
        assert np.isfinite(m.logits([1, 2, 3])).all()

"""Granite's MoE and hybrid families beyond the shared tiny-model tests: the Hub's names in both
transformers spellings, fused tensors of a wrong shape, and the GGUF settings read back."""
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.safetensors import open_safetensors_dir

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
IDS = [5, 17, 300, 42, 8, 99, 250, 3, 77]


def rewrite(folder: str, dest: Path, rename) -> Path:
    """A copy of a tiny folder whose tensors are renamed (or reshaped) by rename(name, array) -> (name, array)."""
    from safetensors.numpy import save_file
    shutil.copytree(TINY / folder, dest)
    st = open_safetensors_dir(dest)
    arrays = {}
    for name, t in st.tensors.items():
        new, a = rename(name, t.to_float32())
        arrays[new] = np.ascontiguousarray(a, dtype=np.float32)
    (dest / "model.safetensors").unlink()
    save_file(arrays, str(dest / "model.safetensors"))
    return dest


def logits(path) -> np.ndarray:
    with llambda.load(path, backend="numpy", n_ctx=64) as m:
        return m.logits(IDS)


def test_transformers5_expert_names_load_the_same_model(tmp_path):
    pytest.importorskip("safetensors")
    names = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
             "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
             "block_sparse_moe.router.layer.weight": "block_sparse_moe.router.weight"}

    def rename(name, a):
        for old, new in names.items():
            if name.endswith(old):
                return name[:-len(old)] + new, a
        return name, a

    path = rewrite("granitemoe", tmp_path / "t5", rename)
    np.testing.assert_array_equal(logits(path), logits(TINY / "granitemoe"))


def test_fused_experts_of_odd_height_are_refused(tmp_path):
    pytest.importorskip("safetensors")

    def cut(name, a):
        return name, (a[:, :-1] if name.endswith("input_linear.weight") else a)

    path = rewrite("granitemoe", tmp_path / "odd", cut)
    with pytest.raises(ModelFormatError, match="gate and up rows"):
        llambda.load(path, backend="numpy", n_ctx=64)

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


def _config(folder: str, tmp_path, edit) -> Path:
    from test_hybrid import _edit           # a copy of a tiny folder with its config.json edited
    return _edit(tmp_path, edit, folder)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(time_step_limit=[0.0, 5.0]), "time_step_limit"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(mamba_conv_bias=False), "mamba_conv_bias"),
    (lambda c: c.update(position_embedding_type="alibi"), "position_embedding_type"),
    (lambda c: c.update(mamba_n_heads=7), "mamba_n_heads"),
    (lambda c: c.update(mamba_n_groups=3), "multiple of its groups"),
    (lambda c: c.update(layer_types=["mamba", "cross"] * 2), "layer_types"),
])
def test_hybrid_bad_configs_are_model_format_errors(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_config("granitemoehybrid_dense", tmp_path, edit), backend="numpy", n_ctx=32)


def test_hybrid_old_layer_type_spelling_and_rope_switch(tmp_path):
    """The Hub's "mamba"/"attention" layer types (transformers 5 writes linear/full_attention) read alike; the GGUF
    export keeps RoPE off for a "nope" model and the dense MLP's width, and reads both back."""
    from llambda.formats.open import open_model
    from llambda.tools.export import export
    path = _config("granitemoehybrid_dense", tmp_path, lambda c: c.update(layer_types=["mamba", "attention", "mamba",
                                                                                       "mamba"]))
    np.testing.assert_array_equal(logits(path), logits(TINY / "granitemoehybrid_dense"))
    for folder, rope, ffn in (("granitemoehybrid_dense", False, 96), ("granitemoehybrid", True, 32)):
        gg = export(TINY / folder, tmp_path / f"{folder}.gguf", fmt="gguf")
        src = open_model(gg)
        try:
            c = src.config
            assert c.layer_kinds == ["mamba2", "attention", "mamba2", "mamba2"]
            assert c.layer_rope == [rope] * 4 and c.rope_neox is False
            assert (c.ffn_dim if not c.n_experts else c.shared_ffn_dim) == ffn
            assert (c.ssm_k_heads, c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim, c.conv_kernel) == \
                (2 if folder.endswith("dense") else 1, 8, 16, 16, 4)
            assert (c.embed_scale, c.attn_scale, c.logit_scale) == (12.0, 0.0625, 2.0)
        finally:
            src.close()


def test_hybrid_refuses_speculation():
    from llambda.errors import InvalidInputError
    with llambda.load(TINY / "granitemoehybrid", backend="numpy", n_ctx=64) as m:
        with pytest.raises(InvalidInputError, match="speculative decoding is not supported"):
            m.stream(IDS, max_tokens=4, speculative="lookup")

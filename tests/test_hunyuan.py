"""Tencent Hunyuan dense (`hunyuan_v1_dense`, llama.cpp's `hunyuan-dense`): q/k norms after RoPE, NTK alpha RoPE
scaling folded into the base, tied embeddings.

The tiny reference (fixtures/reference/tiny/hunyuan_dense, made by tools/make_tiny_hunyuan.py; README_exahun.md
there) is run from its HF directory by test_tiny_models.py (also with transformers 4's rope_scaling spelling) and
exported and run in llama.cpp by test_export.py, with every other folder. Here: our GGUF export on every backend
against transformers; the settings each format yields; controls (the q/k norms before RoPE, or the alpha
ignored, give another model); decode steps through the KV cache against a prefill; refusals.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.tools.export import export
from test_exaone4 import check_against_transformers, decode_error
from test_glm import MODES, exported, max_err, reference  # noqa: F401 (exported: a fixture)
from test_tiny_models import _copy, native_vs_numpy

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDER = "hunyuan_dense"
# transformers' ntk_alpha base for the fixture: theta 1e4, alpha 1000, head_dim 16
BASE = 10000.0 * 1000.0 ** (16 / 14)


@pytest.mark.parametrize("mode", list(MODES))
def test_our_gguf_matches_transformers(exported, mode):
    check_against_transformers(exported(FOLDER), FOLDER, mode, "hunyuan-dense")


def test_settings_from_each_format(exported):
    """The alpha is folded into the base in both formats (llama.cpp's converter writes the scaled base and no
    scaling type); the head is the embedding (no output.weight written)."""
    gguf = exported(FOLDER)
    with GGUFFile(gguf) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == "hunyuan-dense"
    assert meta["hunyuan-dense.rope.freq_base"] == pytest.approx(BASE, rel=1e-6)
    assert "hunyuan-dense.rope.scaling.type" not in meta
    assert "output.weight" not in names and {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= names
    for path in (TINY / FOLDER, gguf):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
            assert m.transformer.output is m.transformer.tok_embd, path
        assert c.rope_theta == pytest.approx(BASE, rel=1e-6) and c.rope_scaling is None, path
        assert (c.qk_norm, c.qk_norm_after_rope, c.qk_norm_whole, c.pre_norms, c.post_norms) == \
            (True, True, False, True, False), path
        assert (c.rope_neox, c.attn_bias, any(c.layer_sliding), c.head_dim) == (True, False, False, 16), path


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_prefill(exported, mode):
    assert decode_error(exported(FOLDER), FOLDER, mode) <= 1e-4


def test_quantized_native_matches_numpy():
    """Q8_0 weights (quantized at load): the quantized kernels with the q/k norms after RoPE against the NumPy
    oracle on the same weights: exact mode within the float budget; fast mode's 8-bit activations within
    test_tiny_models' bound for the dense families (0.68 measured, logits' std 3.9, as smollm3's)."""
    errs = native_vs_numpy(FOLDER, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, errs


@pytest.mark.parametrize("monkey, budget", [
    (None, 1e-3),
    ({"qk_norm_after_rope": False}, None),           # Qwen3's order: norms before RoPE
    ({"rope_theta": 10000.0}, None),                  # the alpha ignored
])
def test_controls(monkeypatch, monkey, budget):
    """The control: as read, the checkpoint matches transformers; with its q/k norms before RoPE, or its RoPE
    base without the alpha, it does not (so the fixture pins both)."""
    from llambda.models import hunyuan
    if monkey:
        real = hunyuan.config_from_hf

        def changed(cfg):
            c = real(cfg)
            for k, v in monkey.items():
                setattr(c, k, v)
            return c
        monkeypatch.setattr(hunyuan, "config_from_hf", changed)
    with llambda.load(TINY / FOLDER, backend="numpy", n_ctx=128) as m:
        err = max_err(m, FOLDER)
    assert err <= budget if budget else err > 0.05


def alpha_gguf(src: Path, out: Path, alpha: float | None) -> Path:
    """Our GGUF with the unscaled base 1e4 and, unless None, `rope.scaling.alpha` beside it."""
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    meta["hunyuan-dense.rope.freq_base"] = GGUFValue(GGUFValueType.FLOAT32, 10000.0)
    if alpha is not None:
        meta["hunyuan-dense.rope.scaling.alpha"] = GGUFValue(GGUFValueType.FLOAT32, alpha)
    write_gguf(out, meta, items)
    return out


def test_a_gguf_alpha_key_scales_the_base_as_llama_cpp_does(exported, tmp_path):
    """llama.cpp applies `hunyuan-dense.rope.scaling.alpha` (when > 0) to rope.freq_base at load (its converter
    writes the scaled base instead): such a file is the same model; without the key, another one. llama.cpp's
    logits on the keyed file agree with ours."""
    keyed = alpha_gguf(exported(FOLDER), tmp_path / "alpha.gguf", 1000.0)
    with llambda.load(keyed, backend="numpy", n_ctx=128) as m:
        assert m.config.rope_theta == pytest.approx(BASE, rel=1e-6) and max_err(m, FOLDER) <= 1e-3
    with llambda.load(alpha_gguf(exported(FOLDER), tmp_path / "plain.gguf", None), backend="numpy", n_ctx=128) as m:
        assert m.config.rope_theta == 10000.0 and max_err(m, FOLDER) > 0.05
    with pytest.raises(ModelFormatError, match="rope.scaling.alpha"):
        llambda.load(alpha_gguf(exported(FOLDER), tmp_path / "neg.gguf", -3.0), backend="numpy", n_ctx=32)
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    ids = reference(FOLDER)["inputs"][1]["input_ids"][:12]
    with llambda.load(keyed, backend="numpy", n_ctx=64) as m:
        assert float(np.abs(m.logits(ids) - llama_cpp_logits(keyed, ids)).max()) <= 0.05


@pytest.mark.parametrize("edit, theta", [
    # transformers 4's spelling: rope_theta beside rope_scaling {"type": "dynamic", "alpha"}
    (lambda c: (c.pop("rope_parameters"), c.update(rope_theta=1e4, rope_scaling={"type": "dynamic", "alpha": 50.0,
                                                                                  "factor": 1.0})),
     1e4 * 50.0 ** (16 / 14)),
    # no scaling: the plain base
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 5e5}), 5e5),
])
def test_rope_base_from_config(tmp_path, edit, theta):
    d = _copy(FOLDER, tmp_path / "m", edit)
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert math.isclose(m.config.rope_theta, theta, rel_tol=1e-9) and m.config.rope_scaling is None


def test_hf_export_is_refused(tmp_path):
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / FOLDER, tmp_path / "hf", fmt="hf")


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["rope_parameters"].pop("alpha"), "alpha"),                 # sequence-length-dependent NTK
    (lambda c: c["rope_parameters"].update(alpha=-2.0), "alpha"),
    (lambda c: c["rope_parameters"].update(alpha="big"), "alpha"),
    (lambda c: c["rope_parameters"].update(alpha=1e300), "alpha"),         # the base overflows
    (lambda c: c["rope_parameters"].update(rope_theta=0), "rope_theta"),
    (lambda c: c.update(head_dim=2, num_attention_heads=32, num_key_value_heads=16), "head_dim"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(attention_bias="yes"), "attention_bias"),
    (lambda c: c.update(attention_bias=True), r"o_proj\.bias"),    # biases said, none in the checkpoint
    (lambda c: c.pop("intermediate_size"), "intermediate_size"),
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    d = _copy(FOLDER, tmp_path / "m", edit)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)

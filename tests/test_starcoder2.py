"""StarCoder2 (`starcoder2`): LayerNorms with biases, biases on every projection, an MLP without a gate
(GELU, tanh approximation), half-split RoPE, a sliding window on every layer.

The tiny reference (fixtures/reference/tiny/starcoder2, made by tools/make_tiny_cohere.py; README_cohere.md
there) is run from its HF directory by test_tiny_models.py and exported for llama.cpp by test_export.py.
Here: our GGUF export on every backend against transformers; the settings each format yields (the window of
a file without one, as llama.cpp's converter writes it); decode steps; quantized kernels; refusals.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from test_cohere import _drop_key, decode_matches_forward, matches_transformers
from test_glm import MODES, exported, max_err, reference  # noqa: F401 (exported: a fixture)
from test_hybrid import _edit

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"


@pytest.mark.parametrize("mode", list(MODES))
def test_our_gguf_matches_transformers(exported, mode):
    matches_transformers(exported("starcoder2"), "starcoder2", mode, "starcoder2")


def test_settings_from_each_format(exported):
    with GGUFFile(exported("starcoder2")) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["starcoder2.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert meta["starcoder2.attention.sliding_window"] == 16
    assert {"output_norm.bias", "blk.2.attn_norm.bias", "blk.2.ffn_norm.bias", "blk.2.ffn_up.bias",
            "blk.2.ffn_down.bias", "blk.2.attn_output.bias", "blk.2.attn_q.bias", "output.weight"} <= names
    assert "blk.0.ffn_gate.weight" not in names
    for path in (TINY / "starcoder2", exported("starcoder2")):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
        assert (c.norm_kind, c.norm_bias, c.ffn_gated, c.ffn_bias, c.activation) == \
            ("layer", True, False, True, "gelu_tanh"), path
        assert (c.attn_bias, c.attn_out_bias, c.rope_neox, c.parallel_block) == (True, True, True, False), path
        assert c.sliding_window == 16 and all(c.layer_sliding), path


def test_a_gguf_without_a_window_runs_without_one(exported, tmp_path):
    """llama.cpp's converter writes no window for StarCoder2 and llama.cpp runs none: such a file runs here as
    there, the same as transformers within the window of 16 and not past it (the control: the window counts)."""
    path = _drop_key(exported("starcoder2"), tmp_path / "nowindow.gguf", "starcoder2.attention.sliding_window")
    ref = reference("starcoder2")["inputs"]
    with llambda.load(path, backend="numpy", n_ctx=128) as m:
        assert m.config.sliding_window == 0 and not any(m.config.layer_sliding)
        short = np.stack([m.logits(ref[0]["input_ids"][:p + 1]) for p in ref[0]["last_positions"]])
        assert float(np.abs(short - np.array(ref[0]["logits_last3"], np.float32)).max()) <= 1e-3   # 7 tokens
        assert max_err(m, "starcoder2") > 0.05                                                      # 40 and 100


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_decode_steps_equal_a_full_forward(backend):
    ids = reference("starcoder2")["inputs"][2]["input_ids"][:60]
    decode_matches_forward(TINY / "starcoder2", ids, prefill=10, backend=backend,
                           act=None if backend == "numpy" else "f32")


def test_quantized_native_matches_numpy():
    """Q8_0 weights (quantized at load): the ungated MLP, LayerNorm biases and projection biases on the native
    kernels against the NumPy oracle; fast mode within test_tiny_models' bound of 1 (measured 0.13, logits'
    std 2.5)."""
    from test_tiny_models import native_vs_numpy
    errs = native_vs_numpy("starcoder2", "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, errs


def test_without_biases(tmp_path):
    """use_bias false: no projection biases expected (the LayerNorms keep theirs, nn.LayerNorm's); a
    checkpoint that still holds them is refused as holding unread tensors, not run without them."""
    with pytest.raises(ModelFormatError, match=r"not part of the model.*mlp\.c_fc\.bias"):
        llambda.load(_edit(tmp_path, lambda c: c.update(use_bias=False), "starcoder2"), backend="numpy", n_ctx=32)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("hidden_size"), "hidden_size"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(norm_epsilon=-1.0), "norm_epsilon"),
    (lambda c: c.update(use_bias="no"), "use_bias"),
    (lambda c: c.update(sliding_window=-4), "sliding_window"),
    (lambda c: c.update(intermediate_size=0), "intermediate_size"),
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_edit(tmp_path, edit, "starcoder2"), backend="numpy", n_ctx=32)


def test_a_missing_bias_is_named_by_its_hf_name(tmp_path):
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = tmp_path / "m"
    shutil.copytree(TINY / "starcoder2", d)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    del arrays["model.layers.1.mlp.c_fc.bias"]
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=r"model\.layers\.1\.mlp\.c_fc\.bias"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_a_gguf_missing_its_norm_epsilon_is_refused(exported, tmp_path):
    """llama.cpp requires starcoder2.attention.layer_norm_epsilon."""
    path = _drop_key(exported("starcoder2"), tmp_path / "bad.gguf", "starcoder2.attention.layer_norm_epsilon")
    with pytest.raises(ModelFormatError, match="layer_norm_epsilon"):
        llambda.load(path, backend="numpy", n_ctx=32)

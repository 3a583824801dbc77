"""Seed-OSS (`seed_oss`), Arcee AFM (`arcee`) and Apertus (`apertus`).

The tiny references (fixtures/reference/tiny/<folder>, tools/make_tiny_morearch.py, README_morearch.md there) run
from their HF directories in test_tiny_models.py and, exported, in llama.cpp in test_export.py. Here: our GGUF
exports on every backend against transformers, the settings each format gives, decode steps against full forwards,
what each family adds (Seed-OSS's optional o_proj bias), and the configs refused.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from archkit import (MODES, TINY, decode_vs_full, edited_copy, exported, greedy_matches, load,  # noqa: F401
                     max_err, reference)
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.tools.export import export

FOLDERS = ["seed_oss"]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    with load(exported(folder), mode) as m:
        assert m.config.arch == folder
        assert max_err(m, folder) <= MODES[mode][2]
        assert greedy_matches(m, folder)


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_steps_equal_a_full_forward(folder, mode):
    ids = reference(folder)["inputs"][2]["input_ids"]
    with load(TINY / folder, mode) as m:
        assert decode_vs_full(m, ids, prefill=60) <= 1e-4


# ---------------------------------------------------------------- Seed-OSS

def test_seed_oss_settings_from_each_format(exported):
    with GGUFFile(exported("seed_oss")) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == "seed_oss" and meta["seed_oss.attention.key_length"] == 16
    # llama.cpp's name of the norm before the MLP; q/k/v biases, no o_proj bias
    assert {"blk.0.post_attention_norm.weight", "blk.0.attn_q.bias", "blk.0.attn_v.bias"} <= names
    assert "blk.0.ffn_norm.weight" not in names and "blk.0.attn_output.bias" not in names
    for path in (TINY / "seed_oss", exported("seed_oss")):
        with load(path, n_ctx=32) as m:
            c = m.config
        assert (c.n_heads, c.n_kv_heads, c.head_dim, c.q_dim, c.d_model) == (6, 2, 16, 96, 64)
        assert (c.attn_bias, c.attn_out_bias, c.rope_neox) == (True, False, True) and c.norm_eps == pytest.approx(1e-6)


def test_seed_oss_hf_export_round_trip(tmp_path):
    hf = export(export(TINY / "seed_oss", tmp_path / "m.gguf", fmt="gguf"), tmp_path / "hf", fmt="hf")
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "seed_oss" and cfg["attention_bias"] is True and cfg["attention_out_bias"] is False
    with load(hf) as m:
        assert max_err(m, "seed_oss") <= 1e-3


def _with_out_bias(tmp_path, scale: float):
    """seed_oss with attention_out_bias true and o_proj biases of N(0, scale^2)."""
    d = edited_copy("seed_oss", tmp_path / f"b{scale}", attention_out_bias=True)
    (d / "model.safetensors").unlink()
    with SafetensorsFile(TINY / "seed_oss" / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    rng = np.random.default_rng(9)
    for i in range(3):
        arrays[f"model.layers.{i}.self_attn.o_proj.bias"] = (scale * rng.standard_normal(64)).astype(np.float32)
    write_safetensors(d / "model.safetensors", arrays)
    return d


def test_seed_oss_output_bias_is_read_and_exported(tmp_path):
    """attention_out_bias: zero biases leave the reference's logits; others move them, the same in our GGUF."""
    with load(_with_out_bias(tmp_path, 0.0)) as m:
        assert m.config.attn_out_bias and max_err(m, "seed_oss") <= 1e-3
    biased = _with_out_bias(tmp_path, 0.5)
    ids = reference("seed_oss")["inputs"][0]["input_ids"]
    with load(biased) as m:
        assert max_err(m, "seed_oss") > 0.05
        want = m.logits(ids)
    gg = export(biased, tmp_path / "b.gguf", fmt="gguf")
    with load(gg) as m:
        assert m.config.attn_out_bias
        np.testing.assert_allclose(m.logits(ids), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("changes, field", [
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"head_dim": 0}, "head_dim"),
    ({"num_key_value_heads": 4}, "n_kv_heads"),
    ({"attention_bias": "yes"}, "attention_bias"),
    ({"attention_out_bias": [1]}, "attention_out_bias"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"hidden_size": None}, "hidden_size"),
])
def test_seed_oss_malformed_configs_are_refused_by_name(tmp_path, changes, field):
    with pytest.raises(ModelFormatError, match=field):
        load(edited_copy("seed_oss", tmp_path / "m", **changes), n_ctx=32)

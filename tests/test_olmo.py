"""OLMo 1 beyond the shared tiny-model tests (test_tiny_models.py, test_export.py run both folders against
transformers and llama.cpp): LayerNorms without parameters in both formats, its GGUF on every backend against
transformers, decode steps against a full forward, and what is refused (clip_qkv, norm weights)."""
import numpy as np
import pytest

import llambda
from archkit import (MODES, TINY, decode_vs_full, each_format, edited_copy, exported, load, max_err,  # noqa: F401
                     reference)
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType, dequantize

FOLDERS = ["olmo", "olmo_tied"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_config_from_each_format_is_one_model(folder, exported):
    for path, src in each_format(folder, exported):
        c = src.config
        assert c.arch == "olmo" and c.norm_kind == "layer" and not c.norm_bias and c.norm_eps == pytest.approx(1e-5)
        assert not c.attn_bias and (path != TINY / folder or c.tie_embeddings is (folder == "olmo_tied"))
        assert (src.tensor("output.weight") is None) is (folder == "olmo_tied")
        # the norms' weights: ones, held by no tensor of either file
        for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.1.ffn_norm.weight"):
            assert np.all(src.tensor(name).to_float32() == 1.0), name


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_export_holds_no_norm_tensor(folder, exported):
    with GGUFFile(exported(folder)) as f:
        names, meta = set(f.tensors), f.metadata
    assert not [n for n in names if "norm" in n]
    assert meta["olmo.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert ("output.weight" in names) is (folder == "olmo")


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_export_matches_transformers(folder, mode, exported):
    with load(exported(folder), mode) as m:
        assert max_err(m, folder) <= MODES[mode][2]


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_full_forward(mode, exported):
    """Through the KV cache, from the GGUF (its q/k rows permuted for llama.cpp's rope, unpermuted at load)."""
    for folder in FOLDERS:
        with load(exported(folder), mode) as m:
            assert decode_vs_full(m, reference(folder)["inputs"][2]["input_ids"][:40], 16) <= 1e-4, folder


@pytest.mark.parametrize("changes, message", [
    ({"clip_qkv": 8.0}, "clip_qkv"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"quantization_config": {"quant_method": "fp8"}}, "fp8"),
])
def test_bad_configs_are_model_format_errors(tmp_path, changes, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited_copy("olmo", tmp_path / "m", **changes), backend="numpy", n_ctx=16)


def test_a_checkpoint_with_norm_weights_is_refused(tmp_path):
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    d = edited_copy("olmo", tmp_path / "m")
    st = open_safetensors_dir(TINY / "olmo")
    try:
        arrays = {n: t.to_float32() for n, t in st.tensors.items()}
    finally:
        st.close()
    arrays["model.layers.1.input_layernorm.weight"] = np.ones(64, np.float32)
    (d / "model.safetensors").unlink()
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match="input_layernorm"):
        llambda.load(d, backend="numpy", n_ctx=16)


def _rewritten(src, out, meta_changes=None, extra=None):
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = [(n, QType.F32, dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32))
                 for n, t in f.tensors.items()]
    meta.update(meta_changes or {})
    items += [(n, QType.F32, a) for n, a in (extra or {}).items()]
    write_gguf(out, meta, items, metadata_types=types)
    return out


def test_gguf_clamp_and_norm_weights_are_refused(exported, tmp_path):
    path = _rewritten(exported("olmo"), tmp_path / "clamp.gguf", {"olmo.attention.clamp_kqv": 8.0})
    with pytest.raises(ModelFormatError, match="clamp_kqv"):
        llambda.load(path, backend="numpy", n_ctx=16)
    path = _rewritten(exported("olmo"), tmp_path / "norm.gguf",
                      extra={"blk.0.attn_norm.weight": np.full(64, 2.0, np.float32)})
    with pytest.raises(ModelFormatError, match="blk.0.attn_norm.weight"):
        llambda.load(path, backend="numpy", n_ctx=16)

"""Gemma 1 (`gemma`), Phi-2 (`phi`, llama.cpp `phi2`), StableLM (`stablelm`), GPT-NeoX / Pythia (`gpt_neox`,
llama.cpp `gptneox`) and Nemotron (`nemotron`).

The tiny references (fixtures/reference/tiny/{gemma, phi, stablelm, stablelm_parallel, gpt_neox, nemotron}, made by
tools/make_tiny_classic.py; README_classic.md there) are run from their HF directories by test_tiny_models.py and
exported for llama.cpp by test_export.py. Here: our GGUF export on every backend against transformers; the
settings each format yields; controls showing what the references depend on; decode steps through the KV cache
against full forwards; quantized kernels; refusals.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import llambda
from archkit import MODES, TINY, edited_copy, exported, max_err, reference  # noqa: F401 (exported: a fixture)
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.tools.export import export
from test_cohere import _drop_key, _with, decode_matches_forward, matches_transformers

FOLDERS = ["gemma", "phi", "stablelm", "stablelm_parallel", "gpt_neox", "nemotron"]
GGUF_ARCH = {"gemma": "gemma", "phi": "phi2", "stablelm": "stablelm", "stablelm_parallel": "stablelm",
             "gpt_neox": "gptneox", "nemotron": "nemotron"}
HF_ARCH = {"stablelm_parallel": "stablelm"}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    matches_transformers(exported(folder), folder, mode, GGUF_ARCH[folder])


# (norm kind, norm bias, norm offset from HF, parallel block, parallel with two norms, gated MLP, activation,
#  q/k/v bias, o bias, MLP bias, head bias, q/k norms per head, rotated dims, embedding scale)
SETTINGS = {
    "gemma": ("rms", False, 1.0, False, False, True, "gelu_tanh", False, False, False, False, False, 32, 8.0),
    "phi": ("layer", True, 0.0, True, False, False, "gelu_tanh", True, True, True, True, False, 6, None),
    "stablelm": ("layer", True, 0.0, False, False, True, "silu", True, False, False, False, False, 4, None),
    "stablelm_parallel": ("layer", True, 0.0, True, False, True, "silu", False, False, False, False, True, 4, None),
    "gpt_neox": ("layer", True, 0.0, False, True, False, "gelu_erf", True, True, True, False, False, 4, None),
    "nemotron": ("layer", True, 1.0, False, False, False, "relu2", False, False, False, False, False, 8, None),
}


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    """The same model from config.json and from llama.cpp's keys and tensors (the norm offset aside: GGUF norms hold
    the weights as applied)."""
    arch = GGUF_ARCH[folder]
    with GGUFFile(exported(folder)) as f:
        meta, names = f.metadata, set(f.tensors)
    if arch != "gemma":
        assert meta[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
        want = SETTINGS[folder]
        got = (c.norm_kind, c.norm_bias, c.norm_offset, c.parallel_block, c.parallel_ffn_norm,
               c.ffn_gated and c.activation in ("silu", "gelu_tanh"), c.activation, c.attn_bias, c.attn_out_bias,
               c.ffn_bias, c.output_bias, c.qk_norm_heads, c.rope_dim, c.embed_scale)
        offset = want[2] if path == TINY / folder else 0.0
        assert got == want[:2] + (offset,) + want[3:], path
        assert c.rope_neox and c.arch == (HF_ARCH.get(folder, folder) if path == TINY / folder else arch), path
    if folder == "gpt_neox":
        assert meta["gptneox.use_parallel_residual"] is True
        assert {"blk.0.attn_qkv.weight", "blk.0.attn_qkv.bias"} <= names and "blk.0.attn_q.weight" not in names
    if folder == "phi":
        assert {"output.bias", "output_norm.bias", "blk.1.ffn_up.bias", "blk.1.attn_output.bias"} <= names
        assert "blk.0.ffn_norm.weight" not in names and "blk.0.ffn_gate.weight" not in names
    if folder == "stablelm_parallel":
        with GGUFFile(exported(folder)) as f:
            assert f.tensors["blk.0.attn_q_norm.weight"].shape in ((4, 16), (16, 4))
        assert "blk.0.ffn_norm.weight" not in names
    if folder in ("gemma", "nemotron"):       # GGUF norms hold 1 + w (HF stores w)
        with GGUFFile(exported(folder)) as f:
            gguf_norm = np.array(f.tensors["output_norm.weight"].data).view(np.float32)
        from llambda.formats.safetensors import SafetensorsFile
        with SafetensorsFile(TINY / folder / "model.safetensors") as st:
            hf_norm = st.tensors["model.norm.weight"].to_float32().reshape(-1)
        np.testing.assert_allclose(gguf_norm, hf_norm + 1.0, rtol=1e-6)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_decode_steps_equal_a_full_forward(folder, backend):
    ids = reference(folder)["inputs"][2]["input_ids"][:60]
    decode_matches_forward(TINY / folder, ids, prefill=10, backend=backend, act=None if backend == "numpy" else "f32")


# measured (fast mode's 8-bit activations on Q8_0 weights, against NumPy on the same weights): gemma 0.70 (the
# embedding scale of 8 and a tied head: logits' std 6), phi 0.04, stablelm 0.26, stablelm_parallel 0.24,
# gpt_neox 0.05, nemotron 0.31; exact mode within 4e-5
@pytest.mark.parametrize("folder", FOLDERS)
def test_quantized_native_matches_numpy(folder):
    from test_tiny_models import native_vs_numpy
    errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, errs


# ---------------------------------------------------------------- controls: what the references depend on

def _swapped(monkeypatch, module, change):
    real = module.config_from_hf
    monkeypatch.setattr(module, "config_from_hf", lambda cfg: _with(real(cfg), **change))


@pytest.mark.parametrize("folder, module, change", [
    ("gpt_neox", "gpt_neox", dict(parallel_ffn_norm=False)),          # sequential: the MLP reads x + attn
    ("gpt_neox", "gpt_neox", dict(rope_dim=16)),                      # RoPE on every dim
    ("phi", "phi", dict(rope_dim=16)),
    ("stablelm_parallel", "stablelm", dict(rope_dim=8)),
    ("nemotron", "nemotron", dict(norm_offset=0.0)),                  # LayerNorm, not LayerNorm1P
    ("gemma", "gemma", dict(embed_scale=None)),
    ("gemma", "gemma", dict(norm_offset=0.0)),
])
def test_controls(monkeypatch, folder, module, change):
    """Each reference tells its features apart: the same weights run without one are another model."""
    import importlib
    _swapped(monkeypatch, importlib.import_module(f"llambda.models.{module}"), change)
    with llambda.load(TINY / folder, backend="numpy", n_ctx=128) as m:
        assert max_err(m, folder) > 0.05, change


def _with_arrays(folder: str, dest, change):
    """A copy of the folder whose checkpoint `change(arrays)` edited (a dict of float32 arrays by HF name)."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    shutil.copytree(TINY / folder, dest)
    with SafetensorsFile(dest / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    change(arrays)
    write_safetensors(dest / "model.safetensors", arrays)
    return dest


def test_phi_head_bias_counts(tmp_path, monkeypatch):
    """Phi's lm_head bias: zeroed, another model; left out of the config, refused as an unread tensor."""
    d = _with_arrays("phi", tmp_path / "m", lambda a: a["lm_head.bias"].fill(0.0))
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "phi") > 0.05
    from llambda.models import phi
    _swapped(monkeypatch, phi, dict(output_bias=False))
    with pytest.raises(ModelFormatError, match=r"lm_head\.bias"):
        llambda.load(TINY / "phi", backend="numpy", n_ctx=32)


def test_gpt_neox_rows_are_regrouped_per_head(monkeypatch):
    """HF's fused query_key_value is grouped per head: read as llama.cpp's q|k|v blocks without regrouping, it is
    another model."""
    from llambda.models import gpt_neox
    monkeypatch.setattr(gpt_neox, "qkv_order", lambda heads, hd: np.arange(3 * heads * hd))
    with llambda.load(TINY / "gpt_neox", backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt_neox") > 0.05


def test_gpt_neox_tanh_gelu_is_close_but_not_the_reference(tmp_path):
    """hidden_act gelu_new on Pythia's weights: the tanh approximation (what llama.cpp runs on every gptneox file),
    near the exact GELU's logits but not within the float budget; a GGUF could not say it, so no export."""
    d = edited_copy("gpt_neox", tmp_path / "m", hidden_act="gelu_new")
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.activation == "gelu_tanh" and 1e-4 < max_err(m, "gpt_neox") < 0.05
    with pytest.raises(ModelFormatError, match="activation"):
        export(d, tmp_path / "t.gguf", fmt="gguf")


def test_gemma_hf_export_round_trip(tmp_path):
    """Gemma is RMSNorm: it exports as a Hugging Face directory too (w stored, 1 + w computed) and runs the same."""
    out = export(TINY / "gemma", tmp_path / "hf", fmt="hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gemma" and "query_pre_attn_scalar" not in cfg     # Gemma 2's keys
    with llambda.load(out, backend="numpy", n_ctx=128) as m:
        assert m.config.arch == "gemma" and max_err(m, "gemma") <= 1e-4


@pytest.mark.parametrize("folder", ["phi", "stablelm", "gpt_neox", "nemotron"])
def test_layernorm_families_export_as_gguf_only(folder, tmp_path):
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / folder, tmp_path / "hf", fmt="hf")


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("folder, edit, message", [
    ("gemma", dict(hidden_size=None), "hidden_size"),
    ("gemma", dict(hidden_act="silu"), "activation"),
    ("gemma", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("gemma", dict(head_dim=0), "head_dim"),
    ("phi", dict(hidden_act="relu"), "hidden_act"),
    ("phi", dict(qk_layernorm=True), "qk_layernorm"),
    ("phi", dict(layer_norm_eps=-1.0), "layer_norm_eps"),
    ("phi", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0}),
     "partial_rotary_factor"),
    ("stablelm", dict(use_qkv_bias="yes"), "use_qkv_bias"),
    ("stablelm", dict(use_parallel_residual=1.5), "use_parallel_residual"),
    ("stablelm", dict(hidden_act="gelu"), "hidden_act"),
    ("gpt_neox", dict(num_key_value_heads=2), "num_key_value_heads"),
    ("gpt_neox", dict(hidden_act="relu"), "hidden_act"),
    ("gpt_neox", dict(use_parallel_residual="no"), "use_parallel_residual"),
    ("gpt_neox", dict(num_attention_heads=3), "num_attention_heads"),
    ("nemotron", dict(hidden_act="silu"), "hidden_act"),
    ("nemotron", dict(norm_eps=0), "norm_eps"),
    ("nemotron", dict(intermediate_size=None), "intermediate_size"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited_copy(folder, tmp_path / "m", **edit), backend="numpy", n_ctx=32)


def test_stablelm_config_and_checkpoint_must_agree_on_qk_norms(tmp_path):
    """qk_layernorm false over a checkpoint holding per-head norms: refused by the tensor's name, not run without
    them; true over one without: the missing norm named."""
    with pytest.raises(ModelFormatError, match=r"[qk]_layernorm\.norms\.0\.weight"):
        llambda.load(edited_copy("stablelm_parallel", tmp_path / "a", qk_layernorm=False), backend="numpy", n_ctx=32)
    with pytest.raises(ModelFormatError, match=r"q_layernorm|attn_q_norm"):
        llambda.load(edited_copy("stablelm", tmp_path / "b", qk_layernorm=True), backend="numpy", n_ctx=32)


def test_stablelm_a_missing_head_norm_is_named(tmp_path):
    d = _with_arrays("stablelm_parallel", tmp_path / "m",
                     lambda a: a.pop("model.layers.1.self_attn.k_layernorm.norms.1.weight"))
    with pytest.raises(ModelFormatError, match=r"head 1"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_gpt_neox_misshapen_fused_qkv_is_named(tmp_path):
    name = "gpt_neox.layers.2.attention.query_key_value.bias"
    d = _with_arrays("gpt_neox", tmp_path / "m", lambda a: a.update({name: a[name][:-16]}))
    with pytest.raises(ModelFormatError, match=r"gpt_neox\.layers\.2\.attention\.query_key_value\.bias"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_gpt_neox_missing_tensor_is_named_by_its_hf_name(tmp_path):
    d = _with_arrays("gpt_neox", tmp_path / "m", lambda a: a.pop("gpt_neox.layers.1.mlp.dense_4h_to_h.bias"))
    with pytest.raises(ModelFormatError, match=r"gpt_neox\.layers\.1\.mlp\.dense_4h_to_h\.bias"):
        llambda.load(d, backend="numpy", n_ctx=32)


@pytest.mark.parametrize("folder, key", [
    ("phi", "phi2.attention.layer_norm_epsilon"),
    ("stablelm", "stablelm.attention.layer_norm_epsilon"),
    ("gpt_neox", "gptneox.attention.layer_norm_epsilon"),
    ("gpt_neox", "gptneox.use_parallel_residual"),
    ("nemotron", "nemotron.attention.layer_norm_epsilon"),
])
def test_a_gguf_missing_a_required_key_is_refused(exported, tmp_path, folder, key):
    """llama.cpp requires these keys too."""
    path = _drop_key(exported(folder), tmp_path / "bad.gguf", key)
    with pytest.raises(ModelFormatError, match=key.split(".", 1)[1]):
        llambda.load(path, backend="numpy", n_ctx=32)


def test_gptneox_gguf_with_a_short_fused_bias_is_refused(exported, tmp_path):
    with GGUFFile(exported("gpt_neox")) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    items = [(n, q, d[:-64], (s[0] - 16,)) if n == "blk.1.attn_qkv.bias" else (n, q, d, s) for n, q, d, s in items]
    write_gguf(tmp_path / "bad.gguf", meta, items)
    with pytest.raises(ModelFormatError, match=r"blk\.1\.attn_qkv\.bias"):
        llambda.load(tmp_path / "bad.gguf", backend="numpy", n_ctx=32)


def test_phi2_gguf_without_its_head_bias_is_refused(exported, tmp_path):
    with GGUFFile(exported("phi")) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values() if t.name != "output.bias"]
    write_gguf(tmp_path / "bad.gguf", meta, items)
    with pytest.raises(ModelFormatError, match="output.bias"):
        llambda.load(tmp_path / "bad.gguf", backend="numpy", n_ctx=32)


def test_transformers4_gpt_neox_spelling(tmp_path):
    """rotary_pct / rotary_emb_base (no rope_parameters) as Pythia's configs on the Hub spell them; a
    rotary_pct of 1 rotates every dim (another model here)."""
    cfg = json.loads((TINY / "gpt_neox" / "config.json").read_text())
    d = edited_copy("gpt_neox", tmp_path / "a", rope_parameters=None, rotary_pct=0.25, rotary_emb_base=10000)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.rope_dim == 4 and max_err(m, "gpt_neox") <= 1e-4
    d = edited_copy("gpt_neox", tmp_path / "b", rope_parameters=None, rotary_pct=1.0, rotary_emb_base=10000)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.rope_dim == cfg["hidden_size"] // cfg["num_attention_heads"] and max_err(m, "gpt_neox") > 0.05


def test_gpt_neox_causal_mask_buffers_are_skipped(tmp_path):
    """Pythia's older checkpoints hold `attention.bias` (a BOOL causal mask) and `attention.masked_bias` (a float
    scalar) per layer, which transformers ignores: skipped here too, the model the same."""
    import struct
    from llambda.formats.safetensors import SafetensorsFile
    d = _with_arrays("gpt_neox", tmp_path / "m",
                     lambda a: a.update({f"gpt_neox.layers.{i}.attention.masked_bias": np.array(-1e9, np.float32)
                                         for i in range(3)}))
    raw = (d / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    mask = np.tril(np.ones((1, 1, 8, 8), np.uint8)).tobytes()
    for i in range(3):
        header[f"gpt_neox.layers.{i}.attention.bias"] = {"dtype": "BOOL", "shape": [1, 1, 8, 8],
                                                        "data_offsets": [len(data), len(data) + len(mask)]}
        data += mask
    head = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + data)
    with SafetensorsFile(d / "model.safetensors") as st:
        assert "gpt_neox.layers.0.attention.masked_bias" in st.tensors and "gpt_neox.layers.0.attention.bias" not in st.tensors
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt_neox") <= 1e-4


def test_phi2_gguf_with_a_fused_qkv(exported, tmp_path):
    """Older converters wrote Phi-2's q, k and v (and their biases) as one `attn_qkv`, which llama.cpp's phi2 reads
    as well: the same model here, and in llama.cpp where it is installed."""
    with GGUFFile(exported("phi")) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        tensors = {t.name: (t.qtype, np.array(t.data), tuple(t.shape)) for t in f.tensors.values()}
    items = []
    for name, (q, data, shape) in tensors.items():
        layer, _, leaf = name.rpartition(".attn_")
        if leaf in ("k.weight", "v.weight", "k.bias", "v.bias"):
            continue
        if leaf in ("q.weight", "q.bias"):
            kind = leaf.split(".")[1]
            parts = [tensors[f"{layer}.attn_{w}.{kind}"] for w in "qkv"]
            rows = sum(p[2][0] for p in parts)
            name, data, shape = f"{layer}.attn_qkv.{kind}", np.concatenate([p[1] for p in parts]), (rows,) + shape[1:]
        items.append((name, q, data, shape))
    write_gguf(tmp_path / "fused.gguf", meta, items)
    ref = reference("phi")
    with llambda.load(tmp_path / "fused.gguf", backend="numpy", n_ctx=128) as m:
        assert max_err(m, "phi") <= 1e-3
        ids = ref["inputs"][0]["input_ids"]
        ours = m.logits(ids)
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra): ours checked only")
    from llamacpp_ref import llama_cpp_logits
    assert float(np.abs(llama_cpp_logits(tmp_path / "fused.gguf", ids) - ours).max()) <= 0.05


@pytest.mark.parametrize("folder, edit, missing", [
    ("gemma", dict(attention_bias=True), r"model\.layers\.0\.self_attn\.[qo]_proj\.bias"),
    ("nemotron", dict(attention_bias=True), r"model\.layers\.0\.self_attn\.[qo]_proj\.bias"),
    ("nemotron", dict(mlp_bias=True), r"model\.layers\.0\.mlp\.up_proj\.bias"),
])
def test_biases_the_config_names_must_be_in_the_checkpoint(tmp_path, folder, edit, missing):
    """Optional biases (Gemma's and Nemotron's attention_bias, Nemotron's mlp_bias) said by config.json and absent
    from the checkpoint: the missing tensor named by its HF name, not run without it."""
    with pytest.raises(ModelFormatError, match=missing):
        llambda.load(edited_copy(folder, tmp_path / "m", **edit), backend="numpy", n_ctx=32)


@pytest.mark.parametrize("value", ["a quarter", 0, 1.5, True])
def test_gpt_neox_bad_rotary_pct_is_named(tmp_path, value):
    d = edited_copy("gpt_neox", tmp_path / "m", rope_parameters=None, rotary_pct=value, rotary_emb_base=10000)
    with pytest.raises(ModelFormatError, match="rotary_pct"):
        llambda.load(d, backend="numpy", n_ctx=32)

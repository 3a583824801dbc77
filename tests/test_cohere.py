"""Cohere's Command-R / Aya (`cohere`, llama.cpp `command-r`) and Command R7B / Command A (`cohere2`).

The tiny references (fixtures/reference/tiny/cohere and cohere2, made by tools/make_tiny_cohere.py;
README_cohere.md there) are run from their HF directories by test_tiny_models.py with every other folder and
exported for llama.cpp by test_export.py (cohere2; cohere's q/k norms are loaded by llama.cpp only with 64
layers or more: here, on a 64-layer variant). Here: our GGUF export on every backend against transformers;
the settings each format yields; controls showing what the references depend on (RoPE pairs, the NoPE global
layer, the window); decode steps through the KV cache against full forwards; quantized kernels; refusals.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.tools.export import export
from test_glm import MODES, exported, load, max_err, reference  # noqa: F401 (exported: a fixture)
from test_hybrid import _edit

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDERS = ["cohere", "cohere2"]
GGUF_ARCH = {"cohere": "command-r", "cohere2": "cohere2"}


def matches_transformers(path, folder: str, mode: str, arch: str) -> None:
    """The model at `path` on `mode`'s backend: its architecture's name, the reference's logits within the
    mode's budget, and all three greedy continuations."""
    inputs = reference(folder)["inputs"]
    with load(path, mode) as m:
        seen = (m.config.arch, max_err(m, folder))
        greedy = [list(m.generate(i["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) for i in inputs]
    assert seen[0] == arch and seen[1] <= MODES[mode][2], seen
    assert greedy == [i["greedy_new_tokens"] for i in inputs]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    matches_transformers(exported(folder), folder, mode, GGUF_ARCH[folder])


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    """The same model from config.json and from llama.cpp's keys: one LayerNorm feeding attention and MLP,
    the logits multiplied by logit_scale (a divisor of its reciprocal here), adjacent-pair RoPE."""
    arch = GGUF_ARCH[folder]
    with GGUFFile(exported(folder)) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta[f"{arch}.logit_scale"] == {"cohere": 2.0, "cohere2": 0.5}[folder]
    assert meta[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    assert "blk.0.ffn_norm.weight" not in names and "blk.0.attn_norm.bias" not in names and "output.weight" not in names
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
        assert (c.norm_kind, c.parallel_block, c.norm_bias, c.rope_neox) == ("layer", True, False, False), path
        if folder == "cohere":
            assert (c.logit_scale, c.qk_norm, c.qk_norm_heads, c.n_layers) == (0.5, True, True, 3), path
            assert not any(c.layer_sliding) and all(c.layer_rope), path
        else:
            assert (c.logit_scale, c.qk_norm, c.sliding_window) == (2.0, False, 16), path
            assert c.layer_sliding == c.layer_rope == [True, True, True, False], path


def test_cohere2_pattern_from_an_older_config(tmp_path):
    """Configs on the Hub before layer_types say sliding_window_pattern (every n-th layer global, NoPE)."""
    d = tmp_path / "m"
    shutil.copytree(TINY / "cohere2", d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["layer_types"]
    cfg["sliding_window_pattern"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.layer_rope == [True, True, True, False] and max_err(m, "cohere2") <= 1e-3
    cfg["sliding_window_pattern"] = 2
    (d / "config.json").write_text(json.dumps(cfg))
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.layer_sliding == [True, False, True, False] and max_err(m, "cohere2") > 0.05


# ---------------------------------------------------------------- controls: what the references depend on

def test_controls(monkeypatch):
    """Each reference tells its features apart: the same weights run with half-split RoPE pairs, with RoPE on
    the global layer, or without the window are other models (the 100-token input passes the window of 16)."""
    from llambda.models import cohere, cohere2
    monkeypatch.setattr(cohere, "HF_ROPE_NEOX", True)
    with llambda.load(TINY / "cohere", backend="numpy", n_ctx=128) as m:
        assert m.config.rope_neox and max_err(m, "cohere") > 0.05
    monkeypatch.undo()
    real = cohere2.config_from_hf
    for change in (dict(layer_rope=[True] * 4), dict(sliding_window=0, layer_sliding=[False] * 4)):
        monkeypatch.setattr(cohere2, "config_from_hf", lambda cfg, change=change: _with(real(cfg), **change))
        with llambda.load(TINY / "cohere2", backend="numpy", n_ctx=128) as m:
            assert max_err(m, "cohere2") > 0.05, change


def _with(cfg, **fields):
    for k, v in fields.items():
        setattr(cfg, k, v)
    cfg.validate()
    return cfg


# ---------------------------------------------------------------- decode steps, quantized kernels

def decode_matches_forward(path, ids, prefill: int, backend: str = "native", act: str = "f32", tol: float = 1e-4):
    """A prefill of `prefill` tokens, then one token a step through the KV cache: each step's logits equal
    the full forward's row at that position (the window and the cache's layer layout included)."""
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    with llambda.load(path, backend=backend, activations=act, n_ctx=128) as m:
        t, n = m.transformer, len(ids)
        zeros = np.zeros(n, np.int32)
        steps = [t.forward(np.array(ids[:prefill], np.int32), zeros[:prefill], np.arange(prefill, dtype=np.int32),
                           [prefill - 1]).copy()[0]]
        for p in range(prefill, n):
            steps.append(t.forward(np.array([ids[p]], np.int32), zeros[:1], np.array([p], np.int32), [0]).copy()[0])
        full = t.forward(np.array(ids, np.int32), zeros, np.arange(n, dtype=np.int32), range(prefill - 1, n)).copy()
    err = float(np.abs(np.stack(steps) - full).max())
    assert err <= tol, err


@pytest.mark.parametrize("backend", ["numpy", "native"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_steps_equal_a_full_forward(folder, backend):
    ids = reference(folder)["inputs"][2]["input_ids"][:60]       # past the window of 16 (cohere2)
    decode_matches_forward(TINY / folder, ids, prefill=10, backend=backend, act=None if backend == "numpy" else "f32")


@pytest.mark.parametrize("folder", FOLDERS)
def test_quantized_native_matches_numpy(folder):
    """Q8_0 weights (quantized at load): the native kernels on the LayerNorm, per-head q/k norm and parallel
    paths against the NumPy oracle on the same weights: exact mode within the float budget; fast mode's 8-bit
    activations within test_tiny_models' bound of 1 (measured: 0.78 on cohere, whose logits have a std of 8
    (logit_scale 2), 0.25 on cohere2 (std 2))."""
    from test_tiny_models import native_vs_numpy
    errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, (folder, errs)


# ---------------------------------------------------------------- llama.cpp on Command-R's q/k norms

def _rewrite(src: Path, out: Path, keep=lambda name: True, blocks: int | None = None) -> Path:
    """The GGUF at src with the tensors `keep` accepts; with `blocks`, block i a copy of block i % n."""
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        arch = f.metadata["general.architecture"]
        n = f.metadata[f"{arch}.block_count"]
        tensors = [t for t in f.tensors.values() if keep(t.name)]
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in tensors if not t.name.startswith("blk.")]
        for i in range(blocks or n):
            items += [(t.name.replace(f"blk.{i % n}.", f"blk.{i}.", 1), t.qtype, np.array(t.data), t.shape)
                      for t in tensors if t.name.startswith(f"blk.{i % n}.")]
    if blocks:
        meta[f"{arch}.block_count"] = GGUFValue(GGUFValueType.UINT32, blocks)
    write_gguf(out, meta, items)
    return out


def test_llama_cpp_runs_command_r_as_we_do(exported, tmp_path):
    """llama.cpp's command-r, an independent reader of our files: the tiny model without its q/k norms (llama.cpp
    would refuse them in 3 layers), and a 64-layer variant (blocks repeated) with them."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    ids = reference("cohere")["inputs"][1]["input_ids"][:12]
    plain = _rewrite(exported("cohere"), tmp_path / "plain.gguf", keep=lambda n: "_norm.weight" not in n or
                     "attn_norm" in n or "output_norm" in n)
    deep = _rewrite(exported("cohere"), tmp_path / "deep.gguf", blocks=64)
    for path in (plain, deep):
        with llambda.load(path, backend="numpy", n_ctx=64) as m:
            assert m.config.qk_norm == (path == deep)
            ours = m.logits(ids)
        theirs = llama_cpp_logits(path, ids)
        assert float(np.abs(ours - theirs).max()) <= 0.05 * max(1.0, float(ours.std())), path.name


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("folder, edit, message", [
    ("cohere", lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
    ("cohere", lambda c: c.update(logit_scale=-1.0), "logit_scale"),
    ("cohere", lambda c: c.update(layer_norm_eps="1e-5"), "layer_norm_eps"),
    ("cohere", lambda c: c.update(rotary_pct=0.5), "rotary_pct"),
    ("cohere", lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    ("cohere", lambda c: c.update(use_qk_norm="yes"), "use_qk_norm"),
    ("cohere2", lambda c: c.update(sliding_window=None), "sliding_window"),
    ("cohere2", lambda c: c.update(layer_types=["sliding_attention"] * 3), "layer_types"),
    ("cohere2", lambda c: c.update(hidden_size=66), "hidden_size"),
    ("cohere2", lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern=0)), "sliding_window_pattern"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_edit(tmp_path, edit, folder), backend="numpy", n_ctx=32)


def _drop_key(src: Path, out: Path, key: str, value=None) -> Path:
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items() if k != key}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    if value is not None:
        meta[key] = value
    write_gguf(out, meta, items)
    return out


@pytest.mark.parametrize("folder, key, value, message", [
    ("cohere", "command-r.logit_scale", None, "command-r.logit_scale"),
    ("cohere", "command-r.attention.layer_norm_epsilon", None, "layer_norm_epsilon"),
    ("cohere2", "cohere2.attention.sliding_window", None, "sliding_window"),
    ("cohere2", "cohere2.attention.sliding_window_pattern",
     GGUFValue((GGUFValueType.ARRAY, GGUFValueType.BOOL), [True, False, True, False]), "every 4th layer"),
])
def test_bad_gguf_settings_are_model_format_errors(exported, tmp_path, folder, key, value, message):
    """llama.cpp requires the logit scale, the LayerNorm epsilon and cohere2's window, and runs every 4th
    cohere2 layer global whatever a file says."""
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_drop_key(exported(folder), tmp_path / "bad.gguf", key, value), backend="numpy", n_ctx=32)


def test_a_misshapen_qk_norm_is_refused(tmp_path):
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = tmp_path / "m"
    shutil.copytree(TINY / "cohere", d)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    arrays["model.layers.1.self_attn.k_norm.weight"] = np.ones((4, 16), np.float32)    # 2 kv heads, not 4
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=r"k_norm.*expected \(2, 16\)"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_export_to_hf_is_refused(tmp_path):
    for folder in FOLDERS:
        with pytest.raises(LlambdaError, match="GGUF only"):
            export(TINY / folder, tmp_path / folder, fmt="hf")


def test_a_quantized_export_keeps_the_per_head_norms_float(tmp_path):
    """`llambda export --type q8_0` of Command-R: its (heads, head_dim) q/k norm weights are 2-D but norms, kept
    F32 as every norm is, the matrices Q8_0: the file runs as the float checkpoint quantized to Q8_0 at load
    (whose norms stay float)."""
    from llambda.formats.quants import QType
    path = export(TINY / "cohere", tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    with GGUFFile(path) as f:
        assert f.tensors["blk.0.attn_q_norm.weight"].qtype == QType.F32
        assert f.tensors["blk.0.attn_q_norm.weight"].shape == (4, 16)
        assert f.tensors["blk.0.attn_q.weight"].qtype == QType.Q8_0
    ids = reference("cohere")["inputs"][1]["input_ids"]
    with llambda.load(path, backend="numpy", n_ctx=64) as q, \
            llambda.load(TINY / "cohere", backend="numpy", n_ctx=64, quantize="q8_0") as m:
        assert float(np.abs(q.logits(ids) - m.logits(ids)).max()) <= 1e-4


@pytest.mark.parametrize("fields, message", [
    (dict(norm_kind="group"), "norm kind"),
    (dict(norm_bias=True), "layer norms"),
    (dict(qk_norm_heads=True), "per-head q/k norms"),
    (dict(parallel_block=True, post_norms=True), "parallel block"),
    (dict(ffn_gated=False, layer_kinds=["attention", "mamba2"], conv_kernel=4, ssm_k_heads=1, ssm_v_heads=2,
          ssm_k_dim=8, ssm_v_dim=8), "ungated"),
    (dict(parallel_block=1), "parallel_block"),
])
def test_the_block_flags_are_checked(fields, message):
    """The generic fields these families brought (config.py's _check_block): combinations the transformer does
    not run are refused, whatever reader built them."""
    from llambda.models.config import TransformerConfig
    base = dict(arch="x", vocab_size=16, n_layers=2, d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, ffn_dim=32)
    with pytest.raises(ModelFormatError, match=message):
        TransformerConfig(**base, **fields)

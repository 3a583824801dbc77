"""EXAONE 4.0 (`exaone4`): hybrid attention (sliding layers with RoPE, global layers without), post-norms only,
per-head q/k norms before RoPE.

The tiny reference (fixtures/reference/tiny/exaone4, made by tools/make_tiny_exaone4.py; README_exahun.md there)
is run from its HF directory by test_tiny_models.py with every other folder. Here: our GGUF export on every
backend against transformers; the settings each format yields, and the layer patterns config.json and GGUF may
spell; controls (the same checkpoint with RoPE on every layer, or without windows, is another model); decode
steps through the KV cache against a prefill; llama.cpp on 64-layer and windowless variants (it slides only in
a 64-layer file); refusals.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.safetensors import write_safetensors
from llambda.tools.export import export
from test_glm import MODES, exported, load, max_err, reference  # noqa: F401 (exported: a fixture)
from test_tiny_models import _copy, native_vs_numpy

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDER = "exaone4"
SLIDING = [True, True, False, True]


def decode_error(path, folder: str, mode: str = "numpy") -> float:
    """Max |logit diff| between one prefill of the longest reference input and the same tokens decoded one at a
    time through the KV cache (every row, past the sliding window)."""
    ids = reference(folder)["inputs"][2]["input_ids"]
    with load(path, mode, n_ctx=128) as m:
        t = m.transformer
        n = len(ids)
        full = np.array(t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32),
                                  np.arange(n), out=np.empty((n, t.cfg.vocab_size), np.float32)))
        steps = np.stack([np.array(t.forward(np.array([tok], np.int32), np.zeros(1, np.int32),
                                             np.array([i], np.int32), range(1))[0]) for i, tok in enumerate(ids)])
    return float(np.abs(full - steps).max())


def check_against_transformers(path, folder: str, mode: str, arch: str) -> None:
    """The model at `path` (our GGUF of the folder) in `mode`: the reference's logits within the mode's budget,
    its greedy tokens equal."""
    inp = reference(folder)["inputs"][2]
    with load(path, mode) as m:
        assert m.config.arch == arch
        assert max_err(m, folder) <= MODES[mode][2]
        assert list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
            inp["greedy_new_tokens"]


@pytest.fixture(scope="module")
def gguf(exported) -> Path:
    """Our f32 GGUF export of the folder (test_glm's `exported`)."""
    return exported(FOLDER)


@pytest.mark.parametrize("mode", list(MODES))
def test_our_gguf_matches_transformers(gguf, mode):
    check_against_transformers(gguf, FOLDER, mode, "exaone4")


def test_settings_from_each_format(gguf):
    with GGUFFile(gguf) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["exaone4.attention.sliding_window"] == 8
    assert list(meta["exaone4.attention.sliding_window_pattern"]) == SLIDING
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q_norm.weight",
            "output.weight"} <= names
    assert not {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"} & names
    for path in (TINY / FOLDER, gguf):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
            assert m.transformer.output is not m.transformer.tok_embd, path       # an untied head
        assert (c.layer_sliding, c.layer_rope, c.sliding_window) == (SLIDING, SLIDING, 8), path
        assert (c.pre_norms, c.post_norms, c.qk_norm, c.qk_norm_whole, c.qk_norm_after_rope) == \
            (False, True, True, False, False), path
        assert (c.rope_neox, c.head_dim, c.norm_eps) == (True, 16, pytest.approx(1e-5)), path


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_prefill(gguf, mode):
    assert decode_error(gguf, FOLDER, mode) <= 1e-4


def test_quantized_native_matches_numpy():
    """Q8_0 weights (quantized at load): the quantized kernels on the NoPE layer, the windows and the post-norms
    against the NumPy oracle on the same weights: exact mode within the float budget, fast mode's 8-bit
    activations within test_tiny_models' bound for the dense families (0.25 measured, logits' std 2.5)."""
    errs = native_vs_numpy(FOLDER, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, errs


def _run_variant(change: dict) -> float:
    """max_err of the checkpoint run with its config changed by `change` (set after reading config.json)."""
    from llambda.backends.numpy_ref import NumpyBackend
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models.base import Transformer
    src = open_hf_dir(TINY / FOLDER)
    backend = NumpyBackend()
    try:
        for k, v in change.items():
            setattr(src.config, k, v)
        model = Transformer(src.config, src.tensor, backend, n_ctx=128, max_tokens=128)
        errs = []
        for inp in reference(FOLDER)["inputs"]:
            ids = np.array(inp["input_ids"], np.int32)
            got = model.forward(ids, np.zeros(len(ids), np.int32), np.arange(len(ids), dtype=np.int32),
                                inp["last_positions"])
            errs.append(float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max()))
        return max(errs)
    finally:
        backend.close()
        src.close()


def test_controls_rope_on_global_layers_or_no_windows_are_other_models():
    """The control: as read, the checkpoint matches; with RoPE on its global layer too, or with its sliding
    layers global, it does not (so the fixture pins both)."""
    assert _run_variant({}) <= 1e-3
    assert _run_variant({"layer_rope": [True] * 4}) > 0.05
    assert _run_variant({"layer_sliding": [False] * 4}) > 0.05


@pytest.mark.parametrize("edit, sliding, rope, window", [
    # no layer_types: sliding_window_pattern, an int period (every p-th layer global) ...
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern=2)), [True, False, True, False],
     [True, False, True, False], 8),
    # ... Exaone4Config's default period 4 ...
    (lambda c: (c.pop("layer_types"), c.pop("sliding_window_pattern")), [True, True, True, False],
     [True, True, True, False], 8),
    # ... or L/G characters repeated, the last layer global
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern="LG")), [True, False, True, False],
     [True, False, True, False], 8),
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern="LLLLL")), [True, True, True, False],
     [True, True, True, False], 8),
    # no window (EXAONE 4.0 1.2B): every layer global, every layer rotated
    (lambda c: c.update(sliding_window=None, layer_types=["full_attention"] * 4), [False] * 4, [True] * 4, 0),
    # a window but no sliding layer: transformers rotates none
    (lambda c: c.update(layer_types=["full_attention"] * 4), [False] * 4, [False] * 4, 0),
])
def test_layer_patterns_from_config(tmp_path, edit, sliding, rope, window):
    d = _copy(FOLDER, tmp_path / "m", edit)
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert (m.config.layer_sliding, m.config.layer_rope, m.config.sliding_window) == (sliding, rope, window)


def gguf_edit(src: Path, out: Path, drop=(), **keys) -> Path:
    """The GGUF at src with metadata keys `exaone4.<key>` (dots spelled __) set or dropped."""
    with GGUFFile(src) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items() if k not in drop}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    for k, v in keys.items():
        key = f"exaone4.{k.replace('__', '.')}"
        if isinstance(v, list):
            meta[key] = GGUFValue((GGUFValueType.ARRAY, GGUFValueType.BOOL), v)
        else:
            meta[key] = GGUFValue(GGUFValueType.UINT32, v)
    write_gguf(out, meta, items)
    return out


def test_gguf_patterns(gguf, tmp_path):
    """Without a pattern key a file of other than 64 layers has no windows (llama.cpp's rule: every layer global
    and rotated); a period key is read as llama.cpp reads one; a window of 0 with sliding layers is refused."""
    bare = gguf_edit(gguf, tmp_path / "bare.gguf", drop=("exaone4.attention.sliding_window_pattern",))
    with llambda.load(bare, backend="numpy", n_ctx=32) as m:
        assert (m.config.layer_sliding, m.config.layer_rope, m.config.sliding_window) == ([False] * 4, [True] * 4, 0)
    period = gguf_edit(gguf, tmp_path / "period.gguf", attention__sliding_window_pattern=2)
    with llambda.load(period, backend="numpy", n_ctx=32) as m:
        assert m.config.layer_sliding == m.config.layer_rope == [True, False, True, False]
    with pytest.raises(ModelFormatError, match="sliding_window"):
        llambda.load(gguf_edit(gguf, tmp_path / "w0.gguf", attention__sliding_window=0), backend="numpy", n_ctx=32)
    with pytest.raises(ModelFormatError, match="sliding_window_pattern"):
        llambda.load(gguf_edit(gguf, tmp_path / "short.gguf", attention__sliding_window_pattern=[True, False]),
                     backend="numpy", n_ctx=32)


def test_gguf_of_64_layers_without_a_pattern_slides_as_llama_cpp():
    """llama.cpp's rule for a 64-layer file (the 32B's shape) without the keys: window 4096, every 4th layer
    global (and unrotated); with a window key, that window."""
    from llambda.models.exaone4 import config_from_gguf
    meta = {"exaone4.block_count": 64, "exaone4.embedding_length": 32, "exaone4.attention.head_count": 2,
            "exaone4.feed_forward_length": 64, "exaone4.vocab_size": 512}
    flags = [(i + 1) % 4 != 0 for i in range(64)]
    c = config_from_gguf(meta)
    assert (c.layer_sliding, c.layer_rope, c.sliding_window) == (flags, flags, 4096)
    c = config_from_gguf({**meta, "exaone4.attention.sliding_window": 128})
    assert (c.layer_sliding, c.sliding_window) == (flags, 128)
    c = config_from_gguf({**meta, "exaone4.block_count": 30})       # the 1.2B's depth: no windows
    assert (any(c.layer_sliding), c.layer_rope, c.sliding_window) == (False, [True] * 30, 0)


# ---------------------------------------------------------------- llama.cpp on variants it runs as written

def random_exaone4(dest: Path, n_layers: int, layer_types: list[str] | None, window: int | None,
                   seed: int = 11) -> Path:
    """A random EXAONE 4.0 HF directory (hidden 32, 2 heads of 16, 1 kv head, MLP 64, vocab 512)."""
    rng = np.random.default_rng(seed)
    d, hd, ff, V = 32, 16, 64, 512

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n, base=1.0):
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": rng.standard_normal((V, d)).astype(np.float32),
         "model.norm.weight": norm(d, 2.0), "lm_head.weight": mat(V, d)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": mat(2 * hd, d, 1.5), p + "self_attn.k_proj.weight": mat(hd, d, 1.5),
                  p + "self_attn.v_proj.weight": mat(hd, d), p + "self_attn.o_proj.weight": mat(d, 2 * hd, 4.0),
                  p + "self_attn.q_norm.weight": norm(hd, 1.5), p + "self_attn.k_norm.weight": norm(hd, 1.5),
                  p + "mlp.gate_proj.weight": mat(ff, d), p + "mlp.up_proj.weight": mat(ff, d),
                  p + "mlp.down_proj.weight": mat(d, ff, 4.0),
                  p + "post_attention_layernorm.weight": norm(d), p + "post_feedforward_layernorm.weight": norm(d)})
    dest.mkdir()
    write_safetensors(dest / "model.safetensors", t)
    cfg = {"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "vocab_size": V, "hidden_size": d,
           "intermediate_size": ff, "num_hidden_layers": n_layers, "num_attention_heads": 2, "num_key_value_heads": 1,
           "head_dim": hd, "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "hidden_act": "silu",
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False,
           "sliding_window": window}
    if layer_types is not None:
        cfg["layer_types"] = layer_types
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


LLAMA_CPP_IDS = [5, 17, 300, 42, 42, 7, 511, 128, 64, 9, 250, 3, 77, 199, 18, 401]


@pytest.mark.parametrize("n_layers, window", [(64, 4), (3, None)])
def test_llama_cpp_runs_our_gguf_as_we_do(tmp_path, n_layers, window):
    """llama.cpp (an independent reader) where it runs exaone4 files as written: the 64-layer hybrid (the 32B's
    shape: every 4th layer global and unrotated; window 4 here, 16 tokens) and a windowless model (the 1.2B's:
    every layer global and rotated). Our GGUF of each against its logits; and the hybrid run without its
    pattern (RoPE and windows on every layer) is far from them, so the comparison sees the pattern."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    types = None if window is None else \
        ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n_layers)]
    hf = random_exaone4(tmp_path / "hf", n_layers, types, window)
    path = export(hf, tmp_path / "m.gguf", fmt="gguf", qtype="f32")
    theirs = llama_cpp_logits(path, LLAMA_CPP_IDS)
    with llambda.load(path, backend="numpy", n_ctx=64) as m:
        assert m.config.layer_rope == ([t == "sliding_attention" for t in types] if types else [True] * n_layers)
        ours = m.logits(LLAMA_CPP_IDS)
    assert float(np.abs(ours - theirs).max()) <= 0.05 * max(1.0, float(ours.std()))
    if window is not None:       # the same weights (the same seed), every layer sliding and rotated
        flat = random_exaone4(tmp_path / "flat", n_layers, ["sliding_attention"] * n_layers, window)
        with llambda.load(flat, backend="numpy", n_ctx=64) as m:
            assert float(np.abs(m.logits(LLAMA_CPP_IDS) - theirs).max()) > 0.2


def test_hf_export_round_trip(gguf, tmp_path):
    """GGUF -> HF directory: config.json says exaone4 with the window and layer_types, and runs the same."""
    hf = export(gguf, tmp_path / "hf", fmt="hf")
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "exaone4" and cfg["sliding_window"] == 8
    assert cfg["layer_types"] == ["sliding_attention" if s else "full_attention" for s in SLIDING]
    with llambda.load(hf, backend="numpy", n_ctx=128) as m:
        assert max_err(m, FOLDER) <= 1e-3


def test_llama3_rope_scaling_travels_to_gguf(tmp_path):
    """EXAONE 4.0's released configs scale RoPE as Llama 3 does: our GGUF carries it as rope_freqs.weight (llama.cpp's
    converter writes the same for exaone4) and runs the same model as the directory."""
    llama3 = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 16.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    d = _copy(FOLDER, tmp_path / "m", lambda c: c.update(rope_parameters=llama3))
    gg = export(d, tmp_path / "m.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(gg) as f:
        assert f.tensors["rope_freqs.weight"].shape[-1] == 8
    ids = reference(FOLDER)["inputs"][1]["input_ids"]
    with llambda.load(d, backend="numpy", n_ctx=64) as a, llambda.load(gg, backend="numpy", n_ctx=64) as b:
        want = a.logits(ids)
        np.testing.assert_allclose(b.logits(ids), want, atol=1e-4, rtol=0)
    with llambda.load(TINY / FOLDER, backend="numpy", n_ctx=64) as m:
        assert float(np.abs(m.logits(ids) - want).max()) > 0.05       # the scaling changes the model


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(sliding_window=0), "sliding_window"),
    (lambda c: c.update(sliding_window="4k"), "sliding_window"),
    (lambda c: c.update(layer_types=["sliding_attention"] * 3), "layer_types"),
    (lambda c: c.update(layer_types=["chunked_attention"] * 4), "layer_types"),
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern="LLX")), "sliding_window_pattern"),
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern=0)), "sliding_window_pattern"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
    (lambda c: c.update(num_attention_heads=3), "n_heads"),
    (lambda c: c.update(rms_norm_eps=-1.0), "rms_norm_eps"),
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    d = _copy(FOLDER, tmp_path / "m", edit)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_a_missing_post_norm_is_named(tmp_path):
    """A checkpoint without a layer's post-feedforward norm: refused by the file's own name."""
    from llambda.formats.safetensors import SafetensorsFile
    d = tmp_path / "m"
    shutil.copytree(TINY / FOLDER, d)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()
                  if n != "model.layers.1.post_feedforward_layernorm.weight"}
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match="post_feedforward_layernorm"):
        llambda.load(d, backend="numpy", n_ctx=32)

"""Every architecture family, as a tiny random HF model, against Hugging Face transformers.

The folders in fixtures/reference/tiny hold config.json + model.safetensors and the
reference logits / greedy tokens of transformers (fp32, eager). See the README there.
"""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import ModelFormatError, TokenizerError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
# gemma3_vision's reference holds prompts with images (its own format): tests/test_vlm.py tests it
# the vision fixtures (*_vision: Gemma 3's, Idefics3's, Qwen2.5-VL's) have references of their own (test_vlm*.py)
FOLDERS = sorted(p.name for p in TINY.iterdir() if (p / "config.json").is_file() and not p.name.endswith("_vision"))

# (backend, activations, max |logit diff| budget)
MODES = {
    "numpy": ("numpy", None, 1e-3),
    "native-exact": ("native", "f32", 1e-3),
    "native-fast": ("native", "q8", 1e-2),
}


def reference(folder: str) -> dict:
    with open(TINY / folder / "reference.json", encoding="utf-8") as f:
        return json.load(f)


def load(path, mode: str, **kw):
    backend, activations, _ = MODES[mode]
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(path, backend=backend, activations=activations, **kw)


def last_rows(model, inp) -> np.ndarray:
    """Logits at each of `last_positions`, each from a fresh prefill of the prefix."""
    ids = inp["input_ids"]
    return np.stack([model.logits(ids[:p + 1]) for p in inp["last_positions"]])


def test_every_folder_is_tested():
    assert len(FOLDERS) == 64, FOLDERS


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_logits_and_greedy_match_transformers(folder, mode):
    ref = reference(folder)
    budget = MODES[mode][2]
    with load(TINY / folder, mode, n_ctx=256) as m:
        for k, inp in enumerate(ref["inputs"]):
            want = np.array(inp["logits_last3"], dtype=np.float32)
            got = last_rows(m, inp)
            err = float(np.abs(got - want).max())
            kv = np.dtype(getattr(m.backend, "kv_dtype", np.float32)).name
            assert err <= budget, (f"{folder} input {k} (length {inp['length']}): max |logit diff| {err:.3g} > "
                                   f"{budget} (KV cache {kv}; these models need float32 compute and cache)")
            greedy = list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True))
            assert greedy == inp["greedy_new_tokens"], f"{folder} input {k}: greedy continuation differs"


@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_native_kernels_with_f32_kv_cache(folder, activations):
    """The C core with a float32 KV cache: separates kernel error from the KV cache's storage type."""
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    from llambda.backends.native import NativeBackend
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models.base import Transformer
    ref = reference(folder)
    src = open_hf_dir(TINY / folder)
    backend = NativeBackend(activations=activations, kv_type="f32")
    try:
        model = Transformer(src.config, src.tensor, backend, n_ctx=128, max_tokens=128)
        for inp in ref["inputs"]:
            ids = np.array(inp["input_ids"], np.int32)
            got = model.forward(ids, np.zeros(len(ids), np.int32), np.arange(len(ids), dtype=np.int32),
                                inp["last_positions"])
            err = float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max())
            assert err <= 1e-3, f"{folder}: {err}"
    finally:
        backend.close()
        src.close()


@pytest.mark.parametrize("folder", FOLDERS)
def test_rope_inverse_frequencies(folder):
    ref = reference(folder)
    with llambda.load(TINY / folder, backend="numpy", n_ctx=64) as m:
        cfg, inv = m.config, m.transformer.inv_freq
        for kind, values in ref["rope_inv_freq"].items():
            sliding = {"all_layers": None, "sliding_attention": True, "full_attention": False}[kind]
            tables = list(inv.values()) if sliding is None else [inv[sliding]]
            for t in tables:
                np.testing.assert_allclose(t, np.array(values, np.float32), rtol=2e-6, err_msg=f"{folder} {kind}")
        types = ref["config"].get("layer_types")
        if types and cfg.sliding_window:
            assert cfg.layer_sliding == [t == "sliding_attention" for t in types]


def test_sliding_layouts():
    """The per-layer window pattern of each family, from its own config rule."""
    def cfg(folder):
        with llambda.load(TINY / folder, backend="numpy", n_ctx=32) as m:
            return m.config
    assert cfg("gemma2").layer_sliding == [True, False, True, False] and cfg("gemma2").sliding_window == 16
    assert cfg("gemma3").layer_sliding == [True, True, False, True]
    assert cfg("mistral").layer_sliding == [True, True] and cfg("mistral").sliding_window == 16
    assert not any(cfg("qwen2").layer_sliding) and not any(cfg("phi3").layer_sliding)


def _legacy_copy(folder: str, dest: Path) -> Path:
    """The folder with config.json rewritten in the transformers 4 spelling of RoPE settings."""
    ref = reference(folder)
    cfg = target = dict(ref["config"])
    if "rope_parameters" not in cfg and isinstance(cfg.get("text_config"), dict):    # a composite's text model
        cfg["text_config"] = target = dict(cfg["text_config"])
    del target["rope_parameters"]
    target.update(ref["legacy_rope_keys"])
    if folder == "gemma2":
        del cfg["layer_types"]      # older Gemma 2 configs have none: the even/odd rule applies
    dest.mkdir()
    (dest / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    os.symlink(TINY / folder / "model.safetensors", dest / "model.safetensors")
    return dest


@pytest.mark.parametrize("folder", FOLDERS)
def test_transformers4_rope_keys_give_the_same_logits(folder, tmp_path):
    ref = reference(folder)
    inner = ref["config"].get("text_config") or ref["config"]
    if "rope_parameters" not in ref["config"] and "rope_parameters" not in inner:
        pytest.skip(f"{folder}'s config.json has no RoPE settings to spell otherwise (its attention has no positions)")
    legacy = _legacy_copy(folder, tmp_path / folder)
    inp = ref["inputs"][2]
    with llambda.load(legacy, backend="numpy", n_ctx=128) as m:
        got = last_rows(m, inp)
    err = float(np.abs(got - np.array(inp["logits_last3"], np.float32)).max())
    assert err <= 1e-3, f"{folder}: {err}"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", ["smollm3", "granite", "olmo2"])
def test_dense_archs_from_our_gguf_match_transformers(folder, mode, tmp_path):
    """The GGUF path of the newer dense families (written by our exporter with llama.cpp's arch names,
    keys and q/k layouts) against the transformers reference, on every backend."""
    from llambda.tools.export import export
    gg = export(TINY / folder, tmp_path / f"{folder}.gguf", fmt="gguf")
    ref = reference(folder)
    with load(gg, mode, n_ctx=128) as m:
        assert m.config.arch == folder
        for inp in ref["inputs"]:
            err = float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"], np.float32)).max())
            assert err <= MODES[mode][2], f"{folder} GGUF {mode}: {err}"


@pytest.mark.parametrize("folder", ["smollm3", "granite", "olmo2"])
def test_dense_archs_quantized_native_matches_numpy(folder):
    """Q8_0 weights (quantized at load), so the quantized kernels run every new branch (NoPE layers, the
    multipliers, post-norms only, whole-projection q/k norms) against the NumPy oracle on the same
    weights: exact mode within the float budget. Fast mode's 8-bit activations move these sensitive
    models' logits (std about 4) by 0.10 (granite), 0.19 (olmo2) and 0.68 (smollm3, 4 layers; 0.71 with
    RoPE on every layer, so not its NoPE layer; llama's folder: 0.36), hence its looser bound."""
    errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, (folder, errs)


def native_vs_numpy(folder: str, q: str) -> dict:
    """Max |logit diff| of the native exact ("f32") and fast ("q8") modes against the NumPy oracle,
    all on the folder's weights quantized at load to `q`."""
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    ref = reference(folder)
    outs = {}
    for backend, act in (("numpy", None), ("native", "f32"), ("native", "q8")):
        with llambda.load(TINY / folder, backend=backend, activations=act, n_ctx=128, quantize=q) as m:
            outs[act] = [last_rows(m, inp) for inp in ref["inputs"]]
    return {act: max(float(np.abs(a - b).max()) for a, b in zip(outs[act], outs[None])) for act in ("f32", "q8")}


def test_dense_arch_settings_read_from_each_format(tmp_path):
    """SmolLM3's NoPE layers, Granite's multipliers, OLMo 2's norm placement, from config.json and from
    GGUF metadata under llama.cpp's keys (SmolLM3: none; llama.cpp makes every 4th layer NoPE)."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    for folder in ("smollm3", "granite", "olmo2"):
        gg = export(TINY / folder, tmp_path / f"{folder}.gguf", fmt="gguf")
        with GGUFFile(gg) as f:
            meta = f.metadata
        assert meta["general.architecture"] == folder
        if folder == "granite":
            assert meta["granite.embedding_scale"] == 12.0 and meta["granite.logit_scale"] == 2.0
            assert meta["granite.residual_scale"] == pytest.approx(0.22)
            assert meta["granite.attention.scale"] == 0.0625
        for path in (TINY / folder, gg):
            with llambda.load(path, backend="numpy", n_ctx=32) as m:
                c = m.config
            assert c.layer_rope == ([True, True, True, False] if folder == "smollm3" else [True] * c.n_layers)
            assert (c.embed_scale, c.residual_scale, c.scale(), c.logit_scale) == (
                (12.0, pytest.approx(0.22), 0.0625, 2.0) if folder == "granite" else (None, 1.0, 0.25, 1.0))
            assert (c.pre_norms, c.post_norms, c.qk_norm_whole) == (
                (False, True, True) if folder == "olmo2" else (True, False, False))
            assert c.rope_neox == (path != gg or folder == "olmo2")     # llama.cpp permutes smollm3/granite


@pytest.mark.parametrize("edit, flags", [
    (lambda c: c.pop("no_rope_layers"), [True, True, True, False]),          # the interval's default pattern
    (lambda c: (c.pop("no_rope_layers"), c.update(no_rope_layer_interval=2)), [True, False, True, False]),
    (lambda c: c.update(no_rope_layers=[0, 1, 1, 1, 1]), [False, True, True, True]),
])
def test_smollm3_nope_layers_from_config(tmp_path, edit, flags):
    d = _copy("smollm3", tmp_path / "m", edit)
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert m.config.layer_rope == flags


@pytest.mark.parametrize("folder, edit, message", [
    ("smollm3", lambda c: c.update(no_rope_layers=[1, 1, 0]), "no_rope_layers"),
    ("smollm3", lambda c: c.update(no_rope_layers=[1, 1, 2, 0]), "no_rope_layers"),
    ("granite", lambda c: c.update(logits_scaling=0), "logits_scaling"),
    ("granite", lambda c: c.update(residual_multiplier="big"), "residual_multiplier"),
    ("olmo2", lambda c: c.update(hidden_act="gelu"), "hidden_act"),
])
def test_dense_arch_bad_settings_are_model_format_errors(tmp_path, folder, edit, message):
    d = _copy(folder, tmp_path / "m", edit)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_no_tokenizer_files_still_loads_but_cannot_tokenize():
    with llambda.load(TINY / "llama", backend="numpy", n_ctx=32) as m:
        assert m.tokenizer is None
        assert "tokenizer.json" in m.source.tokenizer_error
        with pytest.raises(TokenizerError):
            m.tokenize("hello")


def _copy(folder: str, dest: Path, edit=None) -> Path:
    shutil.copytree(TINY / folder, dest)
    if edit is not None:
        cfg = json.loads((dest / "config.json").read_text())
        edit(cfg)
        (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_architecture_from_class_name_when_model_type_is_missing(tmp_path):
    d = _copy("qwen3", tmp_path / "m", lambda c: c.pop("model_type"))
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert m.config.arch == "qwen3" and m.config.qk_norm


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(model_type="rwkv", architectures=["RwkvForCausalLM"]), "unsupported architecture"),
    # Phi-3.5-MoE: refused with its reason (sparsemixer routing), not run with another routing
    (lambda c: c.update(model_type="phimoe", architectures=["PhimoeForCausalLM"]), "'phimoe'.*sparsemixer"),
    (lambda c: c.update(hidden_act="relu"), "hidden_act"),
    (lambda c: c.update(num_hidden_layers=1), "layer 1"),
    (lambda c: c.update(num_attention_heads=3), "multiple"),
    (lambda c: c.update(hidden_size="64"), "hidden_size"),
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    d = _copy("llama", tmp_path / "m", edit)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_a_phimoe_gguf_is_refused_with_the_reason(tmp_path):
    """llama.cpp's phimoe files: refused by the architecture's reason, as its HF directory is."""
    from llambda.formats.gguf_writer import write_gguf
    path = tmp_path / "phimoe.gguf"
    write_gguf(path, {"general.architecture": "phimoe", "phimoe.block_count": 1}, [])
    with pytest.raises(ModelFormatError, match="sparsemixer"):
        llambda.load(path, backend="numpy", n_ctx=32)


def test_missing_config_or_weights(tmp_path):
    d = _copy("llama", tmp_path / "a")
    (d / "config.json").unlink()
    with pytest.raises(ModelFormatError, match="config.json"):
        llambda.load(d, backend="numpy")
    d = _copy("llama", tmp_path / "b")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError, match="safetensors"):
        llambda.load(d, backend="numpy")
    d = _copy("llama", tmp_path / "c")
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="JSON"):
        llambda.load(d, backend="numpy")


def test_quantize_at_load_q8_0_stays_close():
    """Re-quantizing the float weights to Q8_0 at load: close to the float model, closer than Q4_0."""
    ref = reference("qwen3")
    errs = {}
    for q in ("q8_0", "q4_0"):
        with llambda.load(TINY / "qwen3", backend="numpy", n_ctx=128, quantize=q) as m:
            errs[q] = max(float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"])).max())
                          for inp in ref["inputs"])
    # These models are sensitive by design (bf16 rounding alone moves logits by 0.2).
    assert 1e-4 < errs["q8_0"] < 1.0, errs
    assert errs["q4_0"] > errs["q8_0"], errs


@pytest.mark.parametrize("q", ["q5_1", "iq4_nl", "mxfp4"])
def test_quantize_at_load_new_types_native_matches_numpy(q):
    """A whole model quantized at load to Q5_1, IQ4_NL or MXFP4 (each packed at load) runs on the native kernels as on the NumPy
    oracle (same weights: only the kernels' arithmetic differs). Exact mode within the float budget;
    fast mode's 8-bit activations move these sensitive models' logits by 0.23 (Q4_0) to 0.33 (Q4_1)
    against the same oracle, so the bound is the same order. (The tiny models' rows, 64 and 128 wide,
    do not split into the 256-value blocks: the K-quants and IQ4_XS are covered by the kernel tests.)"""
    errs = native_vs_numpy("qwen3", q)
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 0.5, (q, errs)


@pytest.mark.parametrize("q, fallback", [("q4_k", "q5_0"), ("q5_k", "q5_1"), ("q6_k", "q8_0"), ("q3_k", "q4_0"),
                                         ("q2_k", "q4_0"), ("iq4_xs", "iq4_nl")])
def test_quantize_at_load_to_a_k_type_takes_llama_cpps_fallback_on_narrow_rows(q, fallback):
    """The tiny model's 64- and 128-wide rows do not split into 256-value blocks: quantize="q4_k" left every
    matrix float, silently. Now they take llama-quant.cpp's 32-block fallback (its tensor_type_fallback), one
    warning says how many and why, and the model is the one quantized to the fallback type directly."""
    from llambda.errors import LlambdaWarning
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.formats.quants import QType
    from llambda.tools.quantize import quantizing_lookup
    src = open_hf_dir(TINY / "qwen3")
    try:
        n = sum(1 for name, t in src.tensors() if len(t.shape) == 2)
        get = quantizing_lookup(src.tensor, q)
        assert get("blk.0.attn_q.weight").qtype == get("blk.0.ffn_down.weight").qtype == QType[fallback.upper()]
        assert get("blk.0.attn_norm.weight").qtype == QType.F32
    finally:
        src.close()
    ids = reference("qwen3")["inputs"][0]["input_ids"]
    with pytest.warns(LlambdaWarning) as caught:
        with llambda.load(TINY / "qwen3", backend="numpy", n_ctx=64, quantize=q) as m:
            got = m.logits(ids)
    said = [str(w.message) for w in caught if issubclass(w.category, LlambdaWarning)]
    assert len(said) == 1 and f"quantize={q!r}: " in said[0], said
    assert said[0].endswith(f"256-value blocks took llama.cpp's fallback type: {n} {q.upper()} -> {fallback.upper()}")
    with llambda.load(TINY / "qwen3", backend="numpy", n_ctx=64, quantize=fallback) as m:
        np.testing.assert_array_equal(got, m.logits(ids))


def test_a_matrix_narrower_than_any_block_stays_float_with_a_note():
    from llambda.formats.quants import QType
    from llambda.formats.weights import WeightTensor
    from llambda.tools.quantize import load_fallback_note, qtype_at_load
    narrow = WeightTensor("blk.0.attn_q.weight", QType.F32, (4, 48), np.zeros(4 * 48, np.float32).view(np.uint8))
    wide = WeightTensor("blk.0.attn_k.weight", QType.F32, (4, 256), np.zeros(4 * 256, np.float32).view(np.uint8))
    at = qtype_at_load("q4_k")
    assert at(narrow.name, narrow) == QType.F32 and at(wide.name, wide) == QType.Q4_K
    assert load_fallback_note([(narrow.name, narrow), (wide.name, wide)], "q4_k") == (
        "quantize='q4_k': 1 matrices whose rows do not split into their type's 256-value blocks took llama.cpp's "
        "fallback type: 1 Q4_K -> left as they are")
    assert load_fallback_note([(wide.name, wide)], "q4_k") is None


def test_quantizing_lookup_touches_only_matrices():
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.tools.quantize import quantizing_lookup
    from llambda.formats.quants import QType
    src = open_hf_dir(TINY / "phi3")
    try:
        get = quantizing_lookup(src.tensor, "q8_0")
        assert get("token_embd.weight").qtype == QType.Q8_0
        assert get("blk.0.attn_qkv.weight").qtype == QType.Q8_0
        assert get("blk.0.attn_norm.weight").qtype == QType.F32
        assert get("no.such.tensor") is None
        with pytest.raises(llambda.LlambdaError, match="q8_0"):
            quantizing_lookup(src.tensor, "q4_k_m")
    finally:
        src.close()


def test_chat_template_sources(tmp_path):
    from llambda.formats.hf_dir import open_hf_dir
    d = _copy("llama", tmp_path / "m")
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    src = open_hf_dir(d)
    assert src.chat_template == "{{ messages[0]['content'] }}"
    src.close()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    src = open_hf_dir(d)
    assert src.chat_template == "D"      # tokenizer_config.json wins; its list form picks "default"
    src.close()


def test_multimodal_gemma3_layout_runs_its_text_decoder(tmp_path):
    """Gemma3ForConditionalGeneration checkpoints nest the text config and prefix the decoder's tensors."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = tmp_path / "mm"
    d.mkdir()
    text = json.loads((TINY / "gemma3" / "config.json").read_text())
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
           "vision_config": {"hidden_size": 8}}
    (d / "config.json").write_text(json.dumps(cfg))
    with SafetensorsFile(TINY / "gemma3" / "model.safetensors") as f:
        tensors = {n.replace("model.", "model.language_model.", 1): t for n, t in f.tensors.items()}
        tensors["model.vision_tower.patch.weight"] = np.zeros((2, 2), np.float32)
        write_safetensors(d / "model.safetensors", tensors)
    inp = reference("gemma3")["inputs"][1]
    with llambda.load(d, backend="numpy", n_ctx=64) as m:
        err = float(np.abs(last_rows(m, inp) - np.array(inp["logits_last3"])).max())
    assert err <= 1e-3


def test_unknown_layer_tensor_is_refused(tmp_path):
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = _copy("llama", tmp_path / "m")
    with SafetensorsFile(TINY / "llama" / "model.safetensors") as f:
        tensors = dict(f.tensors)
        tensors["model.layers.0.self_attn.o_proj.scale"] = np.zeros(64, np.float32)
        write_safetensors(d / "model.safetensors", tensors)
    with pytest.raises(ModelFormatError, match="o_proj.scale"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_forward_logit_rows_empty_and_out_of_range():
    """No logit rows (a prefill chunk that only fills the cache) is allowed; rows outside the batch are an error."""
    for mode in ("numpy", "native-fast"):
        tr = load(TINY / FOLDERS[0], mode, n_ctx=32).transformer
        assert tr.forward([1, 2, 3], [0, 0, 0], [0, 1, 2], []).shape[0] == 0
        for bad in ([3], [-1], [0, 5]):
            with pytest.raises(ValueError, match="logit_rows"):
                tr.forward([1, 2, 3], [0, 0, 0], [0, 1, 2], bad)

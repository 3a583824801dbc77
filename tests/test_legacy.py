"""GPT-2 (`gpt2`), GPT-BigCode / StarCoder 1 (`gpt_bigcode`, llama.cpp `starcoder`) and Falcon (`falcon`); BLOOM and
MPT refused by name.

The tiny references (fixtures/reference/tiny/{gpt2, gpt2_scaled, gpt_bigcode, gpt_bigcode_mha, falcon, falcon_new,
falcon2}, made by tools/make_tiny_legacy.py; README_legacy.md there) are run from their HF directories by
test_tiny_models.py, and their exports by llama.cpp in test_export.py. Here: our GGUF export on every backend against
transformers; the settings each format yields; controls showing what the references depend on (the position table,
the inverse layer scale, Conv1D's transpose, the fused rows' regrouping, which norm feeds which branch); the context
the position table allows and slots at other positions; decode steps through the KV cache against full forwards;
quantized kernels and exports; PEFT LoRA on fused rows; refusals.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import llambda
from archkit import MODES, TINY, edited_copy, exported, max_err, reference  # noqa: F401 (exported: a fixture)
from llambda.errors import ContextOverflowError, InvalidInputError, ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.tools.export import export
from test_classic import _with_arrays
from test_cohere import _drop_key, decode_matches_forward, matches_transformers

FOLDERS = ["gpt2", "gpt2_scaled", "gpt_bigcode", "gpt_bigcode_mha", "falcon", "falcon_new", "falcon2"]
GGUF_ARCH = {"gpt2": "gpt2", "gpt2_scaled": "gpt2", "gpt_bigcode": "starcoder", "gpt_bigcode_mha": "starcoder",
             "falcon": "falcon", "falcon_new": "falcon", "falcon2": "falcon"}
HF_ARCH = {"gpt2_scaled": "gpt2", "gpt_bigcode_mha": "gpt_bigcode", "falcon_new": "falcon", "falcon2": "falcon"}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    matches_transformers(exported(folder), folder, mode, GGUF_ARCH[folder])


# (position table, RoPE, kv heads, one-norm parallel block, two-norm parallel, activation, q/k/v and output
#  biases, MLP biases, context limit)
SETTINGS = {
    "gpt2": (True, False, 4, False, False, "gelu_tanh", True, True, 256),
    "gpt2_scaled": (True, False, 4, False, False, "gelu_tanh", True, True, 256),
    "gpt_bigcode": (True, False, 1, False, False, "gelu_tanh", True, True, 256),
    "gpt_bigcode_mha": (True, False, 4, False, False, "gelu_tanh", True, True, 256),
    "falcon": (False, True, 1, True, False, "gelu_erf", False, False, 0),
    "falcon_new": (False, True, 2, False, True, "gelu_erf", False, False, 0),
    "falcon2": (False, True, 2, True, False, "gelu_erf", False, False, 0),
}


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    """The same model from config.json and from llama.cpp's keys and tensors."""
    arch = GGUF_ARCH[folder]
    with GGUFFile(exported(folder)) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == arch
    assert meta[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy") as m:
            c = m.config
            n_ctx = m.transformer.n_ctx
        got = (c.pos_embd, all(c.layer_rope), c.n_kv_heads, c.parallel_block, c.parallel_ffn_norm, c.activation,
               c.attn_bias and c.attn_out_bias, c.ffn_bias, c.ctx_limit)
        assert got == SETTINGS[folder], path
        assert not any(c.layer_rope) or all(c.layer_rope)
        assert c.norm_kind == "layer" and c.norm_bias and not c.ffn_gated, path
        assert c.arch == (HF_ARCH.get(folder, folder) if path == TINY / folder else arch), path
        if c.pos_embd:      # the default context is the whole position table
            assert n_ctx == 256
    assert {"blk.0.attn_qkv.weight", "token_embd.weight"} <= names and "blk.0.attn_q.weight" not in names
    assert ("position_embd.weight" in names) == SETTINGS[folder][0]
    assert ("blk.0.attn_qkv.bias" in names) == SETTINGS[folder][6]
    assert ("output.weight" in names) == (folder not in ("gpt2", "falcon"))       # tied heads written once
    # llama.cpp's two-norm Falcon: ln_attn is attn_norm_2, ln_mlp attn_norm; the one-norm forms have neither ffn_norm
    assert ("blk.0.attn_norm_2.weight" in names) == (folder == "falcon_new")
    assert "blk.0.ffn_norm.weight" not in names or folder.startswith("gpt")


# fast mode's 8-bit activations on Q8_0 weights (the position table among them) against NumPy on the same weights,
# measured: gpt2 0.42, gpt2_scaled 0.11, gpt_bigcode 0.19, gpt_bigcode_mha 0.16, falcon 0.62, falcon_new 0.24, falcon2 0.30; exact
# mode within 4e-5
@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_steps_and_quantized_kernels(folder):
    """Decode steps through the KV cache (the position table read at each step's position) equal a full forward,
    on each backend here; the native kernels on Q8_0 weights within their budgets of NumPy's."""
    from llambda.backends import available_backends
    from test_tiny_models import native_vs_numpy
    ids = reference(folder)["inputs"][2]["input_ids"][:60]
    for backend in [b for b in ("numpy", "native") if b in available_backends()]:
        decode_matches_forward(TINY / folder, ids, prefill=10, backend=backend, act=None if backend == "numpy" else "f32")
    errs = native_vs_numpy(folder, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 1.0, errs


def test_a_quantized_export_keeps_the_position_table_float(tmp_path):
    """As llama.cpp's quantizer does: the matrices quantized, position_embd not; the file runs the same model within
    the quantization's error."""
    from llambda.formats.quants import QType
    path = export(TINY / "gpt2", tmp_path / "q.gguf", fmt="gguf", qtype="q8_0")
    with GGUFFile(path) as f:
        assert f.tensors["position_embd.weight"].qtype == QType.F32
        assert f.tensors["blk.0.attn_qkv.weight"].qtype == QType.Q8_0
    with llambda.load(path, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2") < 0.5


# ---------------------------------------------------------------- controls: what the references depend on

def test_the_position_table_counts(tmp_path):
    """GPT-2's wpe rows added to the embeddings: zeroed, another model; the reference needs each row in its place
    (rolled by one position, another model too)."""
    for k, change in enumerate((lambda a: a["transformer.wpe.weight"].fill(0.0),
                                lambda a: a.update({"transformer.wpe.weight": np.roll(a["transformer.wpe.weight"], 1, 0)}))):
        d = _with_arrays("gpt2", tmp_path / f"m{k}", change)
        with llambda.load(d, backend="numpy", n_ctx=128) as m:
            assert max_err(m, "gpt2") > 0.05


def test_inverse_layer_scale_is_folded_into_the_queries(tmp_path):
    """gpt2_scaled's layer i divides its scores by i + 1 (folded into its query rows at load): without it, another
    model; and with it set on gpt2's weights, another model too."""
    d = edited_copy("gpt2_scaled", tmp_path / "a", scale_attn_by_inverse_layer_idx=False)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2_scaled") > 0.05
    d = edited_copy("gpt2", tmp_path / "b", scale_attn_by_inverse_layer_idx=True)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2") > 0.05


def test_conv1d_weights_are_transposed(monkeypatch):
    """GPT-2's Conv1D weights (in, out) read as (out, in) without the transpose: another model."""
    from llambda.formats.weights import WeightTensor
    from llambda.models import gpt2
    monkeypatch.setattr(gpt2, "transposed", lambda t, name: WeightTensor(t.name, t.qtype, t.shape[::-1], t.data))
    with llambda.load(TINY / "gpt2", backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2") > 0.05


@pytest.mark.parametrize("folder, module", [("gpt_bigcode_mha", "gpt_bigcode"), ("falcon_new", "falcon"),
                                            ("falcon2", "falcon")])
def test_fused_rows_are_regrouped(monkeypatch, folder, module):
    """GPT-BigCode's per-head and Falcon's per-kv-group fused rows read as q|k|v blocks without regrouping: another
    model (7B-style Falcon and multi-query GPT-BigCode are q|k|v already)."""
    import importlib
    mod = importlib.import_module(f"llambda.models.{module}")
    monkeypatch.setattr(mod, "qkv_order", lambda *sizes: np.arange((sizes[0] + 2 * sizes[-2]) * sizes[-1])
                        if module == "falcon" else np.arange(3 * sizes[0] * sizes[1]))
    with llambda.load(TINY / folder, backend="numpy", n_ctx=128) as m:
        assert max_err(m, folder) > 0.05


def test_falcon_two_norms_feed_their_own_branch(tmp_path):
    """new_decoder_architecture's ln_attn feeds attention and ln_mlp the MLP: swapped, another model."""
    def swap(a):
        for i in range(3):
            p = f"transformer.h.{i}."
            for kind in ("weight", "bias"):
                a[p + f"ln_attn.{kind}"], a[p + f"ln_mlp.{kind}"] = a[p + f"ln_mlp.{kind}"], a[p + f"ln_attn.{kind}"]
    with llambda.load(_with_arrays("falcon_new", tmp_path / "m", swap), backend="numpy", n_ctx=128) as m:
        assert max_err(m, "falcon_new") > 0.05


@pytest.mark.parametrize("act, exact", [("gelu", True), ("gelu_new", False), ("gelu_pytorch_tanh", False)])
def test_falcon_activation_spellings(tmp_path, act, exact):
    """Falcon's `activation`: "gelu" is the exact erf GELU of the reference; the tanh approximations (what llama.cpp
    runs on every falcon file) come near its logits but not within the float budget, and a GGUF could not say them:
    no export of those."""
    d = edited_copy("falcon", tmp_path / "m", activation=act)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        err, got = max_err(m, "falcon"), m.config.activation
    assert got == ("gelu_erf" if exact else "gelu_tanh")
    assert err <= 1e-4 if exact else 1e-4 < err < 0.2
    if not exact:
        with pytest.raises(ModelFormatError, match="activation"):
            export(d, tmp_path / "t.gguf", fmt="gguf")


# ---------------------------------------------------------------- the context a position table allows

@pytest.mark.filterwarnings("ignore:a context of 257 tokens")        # (load warns first, then refuses)
def test_no_context_past_the_position_table(exported):
    """256 rows in wpe: a context of 256 runs (its last position reads the last row), 257 is refused at load, and a
    prompt longer than the context is a ContextOverflowError, from either format."""
    ids = (reference("gpt2")["inputs"][2]["input_ids"] * 3)[:256]
    for path in (TINY / "gpt2", exported("gpt2")):
        with llambda.load(path, backend="numpy", n_ctx=256) as m:
            assert np.isfinite(m.logits(ids)).all()
            with pytest.raises(ContextOverflowError):
                m.logits(ids + [5])
        with pytest.raises(InvalidInputError, match="position table has 256 rows"):
            llambda.load(path, backend="numpy", n_ctx=257)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_batch_of_slots_at_other_positions(backend):
    """Two sequences in one batch, each row reading its own position's table row: the same logits as each alone."""
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    ids = reference("gpt2")["inputs"][2]["input_ids"]
    a, b = ids[:30], ids[40:47]
    with llambda.load(TINY / "gpt2", backend=backend, activations=None if backend == "numpy" else "f32", n_ctx=64,
                      n_slots=2) as m:
        t = m.transformer

        def run(tokens, slots, pos):
            n = len(tokens)
            return t.forward(np.array(tokens, np.int32), np.array(slots, np.int32), np.array(pos, np.int32),
                             list(range(n))).copy()
        alone = [run(a, [0] * 30, range(30))[-1], run(b, [1] * 7, range(7))[-1]]
        run(a[:-1], [0] * 29, range(29))
        run(b[:-1], [1] * 6, range(6))
        both = run([a[-1], b[-1]], [0, 1], [29, 6])
    np.testing.assert_allclose(both, np.stack(alone), atol=1e-4)


# ---------------------------------------------------------------- checkpoints as the Hub holds them

def test_gpt2_original_names_and_mask_buffers(tmp_path):
    """OpenAI's gpt2 checkpoints name tensors without `transformer.` (h.0.attn.c_attn.weight, wte.weight) and hold
    causal-mask buffers (h.N.attn.bias, h.N.attn.masked_bias): read as the same model, the buffers skipped."""
    def rename(a):
        for name in list(a):
            a[name[len("transformer."):]] = a.pop(name)
        for i in range(3):
            a[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 8, 8), np.float32))
            a[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    with llambda.load(_with_arrays("gpt2", tmp_path / "m", rename), backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2") <= 1e-4


def test_gpt2_float16_conv1d_keeps_its_type(tmp_path):
    """A float16 checkpoint's Conv1D weights are transposed as float16 (no float32 copy), value for value."""
    from llambda.formats.open import open_model
    from llambda.formats.quants import QType
    name = "transformer.h.1.attn.c_attn.weight"
    d = _with_arrays("gpt2", tmp_path / "m", lambda a: a.update({n: v.astype(np.float16) for n, v in a.items()}))
    src = open_model(d)
    try:
        t = src.tensor("blk.1.attn_qkv.weight")
        assert t.qtype == QType.F16 and t.shape == (192, 64)
        from llambda.formats.safetensors import SafetensorsFile
        with SafetensorsFile(d / "model.safetensors") as st:
            want = st.tensors[name].to_float32().reshape(64, 192).T
        np.testing.assert_array_equal(t.to_float32().reshape(192, 64), want)
    finally:
        src.close()
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "gpt2") < 0.05


def test_refinedweb_config_spelling(tmp_path):
    """The first Falcon checkpoints' config.json (model_type RefinedWebModel, n_embed, n_head, n_layer): the same
    model."""
    cfg = json.loads((TINY / "falcon" / "config.json").read_text())
    edits = {k: None for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "architectures")}
    d = edited_copy("falcon", tmp_path / "m", **edits, model_type="RefinedWebModel", n_embed=cfg["hidden_size"],
                    n_head=cfg["num_attention_heads"], n_layer=cfg["num_hidden_layers"])
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.arch == "falcon" and max_err(m, "falcon") <= 1e-4


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("folder, edit, message", [
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention"),
    ("gpt2", dict(activation_function="relu"), "activation_function"),
    ("gpt2", dict(n_head=3), "n_head"),
    ("gpt2", dict(n_embd=None), "n_embd"),
    ("gpt2", dict(n_positions=None), "n_positions"),
    ("gpt2", dict(n_positions=0), "n_positions"),
    ("gpt2", dict(n_positions=128), r"position_embd|wpe"),         # the table holds 256 rows
    ("gpt2", dict(n_inner="wide"), "n_inner"),
    ("gpt2", dict(layer_norm_epsilon=-1.0), "layer_norm_epsilon"),
    ("gpt2", dict(scale_attn_weights="yes"), "scale_attn_weights"),
    ("gpt_bigcode", dict(multi_query="yes"), "multi_query"),
    ("gpt_bigcode", dict(multi_query=False), r"c_attn"),           # a one-kv-head checkpoint read as MHA
    ("falcon", dict(alibi=True), "alibi"),
    ("falcon", dict(bias=True), "bias"),
    ("falcon", dict(activation="relu"), "activation"),
    ("falcon", dict(hidden_size=None), "hidden_size"),
    ("falcon", dict(multi_query=False), r"query_key_value"),       # a kv head per query head: 192 rows, not 96
    ("falcon_new", dict(num_kv_heads=3), "num_kv_heads"),
    ("falcon_new", dict(parallel_attn=False), "parallel_attn"),
    ("falcon", dict(parallel_attn=False), "parallel_attn"),
    ("falcon_new", dict(num_ln_in_parallel_attn=3), "num_ln_in_parallel_attn"),
    ("falcon_new", dict(num_ln_in_parallel_attn=1), r"ln_mlp"),     # its MLP norm would go unread
    ("falcon2", dict(num_ln_in_parallel_attn=2), r"ln_attn|ln_mlp"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited_copy(folder, tmp_path / "m", **edit), backend="numpy", n_ctx=32)


@pytest.mark.parametrize("folder, name", [("gpt2", "transformer.h.1.attn.c_attn.weight"),
                                          ("gpt2", "transformer.h.2.mlp.c_fc.weight"),
                                          ("gpt2", "transformer.wpe.weight"),
                                          ("gpt_bigcode", "transformer.h.0.attn.c_attn.bias"),
                                          ("falcon_new", "transformer.h.1.self_attention.query_key_value.weight"),
                                          ("falcon_new", "transformer.h.2.ln_mlp.bias")])
def test_a_missing_tensor_is_named_by_its_hf_name(tmp_path, folder, name):
    """(A fused qkv's too, where the loader asks for q's part.)"""
    d = _with_arrays(folder, tmp_path / "m", lambda a: a.pop(name))
    with pytest.raises(ModelFormatError, match=name.replace(".", r"\.")):
        llambda.load(d, backend="numpy", n_ctx=32)


# ---------------------------------------------------------------- PEFT LoRA on the fused projections

@pytest.mark.parametrize("folder, module, merged", [
    ("falcon", "transformer.h.1.self_attention.query_key_value", True),          # q|k|v already: merged as is
    ("falcon_new", "transformer.h.1.self_attention.dense", True),
    ("falcon_new", "transformer.h.1.self_attention.query_key_value", False),     # kv groups regrouped at load
    ("falcon2", "transformer.h.0.self_attention.query_key_value", False),
    ("gpt_bigcode", "transformer.h.2.attn.c_attn", True),                       # multi-query: q|k|v already
    ("gpt_bigcode_mha", "transformer.h.2.attn.c_attn", False),                  # per-head rows regrouped
])
def test_peft_lora_on_fused_rows(tmp_path, folder, module, merged):
    """A PEFT adapter's B rows are in the checkpoint's order: merged where the loader keeps that order (the same
    model as the checkpoint with W + s B A written in), refused where it regroups the rows (the update would land on
    other heads)."""
    from llambda.errors import AdapterError
    from test_lora import write_peft
    rng, ids = np.random.default_rng(3), reference(folder)["inputs"][1]["input_ids"]
    from llambda.formats.safetensors import SafetensorsFile
    with SafetensorsFile(TINY / folder / "model.safetensors") as st:
        rows, cols = st.tensors[module + ".weight"].shape
    a, b = (rng.standard_normal((4, cols)) * 0.3).astype(np.float32), (rng.standard_normal((rows, 4)) * 0.3).astype(np.float32)
    peft = write_peft(tmp_path / "lora", {module: (a, b)}, 8)        # s = 8 / 4
    if not merged:
        with pytest.raises(AdapterError, match="regroups"):
            llambda.load(TINY / folder, backend="numpy", n_ctx=64, lora=str(peft))
        return
    with llambda.load(TINY / folder, backend="numpy", n_ctx=64, lora=str(peft)) as m:
        got = m.logits(ids)
    d = _with_arrays(folder, tmp_path / "merged", lambda arr: arr[module + ".weight"].__iadd__(2.0 * b @ a))
    with llambda.load(d, backend="numpy", n_ctx=64) as m, llambda.load(TINY / folder, backend="numpy", n_ctx=64) as base:
        want, before = m.logits(ids), base.logits(ids)
    assert float(np.abs(got - want).max()) <= 1e-3 < 0.05 < float(np.abs(got - before).max())


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_alibi_families_are_refused_by_name(tmp_path, model_type):
    d = edited_copy("gpt2", tmp_path / "m", model_type=model_type)
    with pytest.raises(ModelFormatError, match="ALiBi"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_gpt2_unscaled_attention_is_read_but_not_exported(tmp_path):
    """scale_attn_weights false (no 1 / sqrt(head_dim)): another model, read as such; llama.cpp's gpt2 always
    scales, so the export refuses it."""
    d = edited_copy("gpt2", tmp_path / "m", scale_attn_weights=False)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.attn_scale == 1.0 and max_err(m, "gpt2") > 0.05
    with pytest.raises(ModelFormatError, match="attention scale"):
        export(d, tmp_path / "t.gguf", fmt="gguf")


# the keys llama.cpp requires of these files too (gpt2's and starcoder's context: the position table's rows)
REQUIRED_KEYS = {"gpt2": ("context_length", "attention.layer_norm_epsilon"),
                 "gpt_bigcode": ("context_length", "attention.layer_norm_epsilon"),
                 "falcon": ("attention.layer_norm_epsilon", "attention.head_count")}


@pytest.mark.parametrize("folder, key", [(f, k) for f, keys in REQUIRED_KEYS.items() for k in keys])
def test_a_gguf_missing_a_required_key_is_refused(exported, tmp_path, folder, key):
    path = _drop_key(exported(folder), tmp_path / "bad.gguf", f"{GGUF_ARCH[folder]}.{key}")
    with pytest.raises(ModelFormatError, match=key):
        llambda.load(path, backend="numpy", n_ctx=32)


# (the canonical name is said: q's part of a fused bias, the MLP norm a two-norm Falcon file calls attn_norm)
@pytest.mark.parametrize("folder, drop, named", [
    ("gpt2", "position_embd.weight", r"position_embd\.weight"),
    ("gpt_bigcode", "blk.1.attn_qkv.bias", r"blk\.1\.attn_q\.bias"),
    ("falcon_new", "blk.2.attn_norm.bias", r"blk\.2\.ffn_norm\.bias"),
    ("falcon_new", "blk.2.attn_norm_2.weight", r"blk\.2\.attn_norm\.weight"),
])
def test_a_gguf_missing_a_tensor_is_refused_by_name(exported, tmp_path, folder, drop, named):
    from llambda.formats.gguf_writer import GGUFValue
    with GGUFFile(exported(folder)) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values() if t.name != drop]
    write_gguf(tmp_path / "bad.gguf", meta, items)
    with pytest.raises(ModelFormatError, match=named):
        llambda.load(tmp_path / "bad.gguf", backend="numpy", n_ctx=32)

"""Nemotron-H beyond the shared tiny-model tests (test_tiny_models.py, test_export.py run both folders against
transformers and llama.cpp): the layer kinds (Mamba2, attention and MLP-only layers, one mixer each), its GGUF on
every backend against transformers, decode steps through the KV cache and the Mamba2 state against a full
forward, the recurrent state's rules (test_hybrid.py's tests on these folders), the tensor names of both
prefixes, and malformed configs and files refused by name."""
import json
import os
import shutil

import numpy as np
import pytest

import llambda
import test_hybrid as hybrid
from archkit import MODES, TINY, decode_vs_full, each_format, exported, load, max_err, reference  # noqa: F401
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf

FOLDERS = ["nemotron_h", "nemotron_h_bias"]
KINDS = {"nemotron_h": ["mamba2", "mamba2", "mlp", "attention", "mlp", "mamba2", "attention", "mlp"],
         "nemotron_h_bias": ["mamba2", "attention", "mlp", "mamba2", "mlp"]}


def edited(tmp_path, edit, folder="nemotron_h"):
    return hybrid._edit(tmp_path, edit, folder)


# ---------------------------------------------------------------- the model, from both formats

@pytest.mark.parametrize("folder", FOLDERS)
def test_config_from_each_format_is_one_model(folder, exported):
    for _, src in each_format(folder, exported):
        c = src.config
        assert c.arch == "nemotron_h" and c.layer_kinds == KINDS[folder] and c.ffn_own_layers
        assert c.layer_rope == [False] * c.n_layers and c.activation == "relu2" and not c.ffn_gated
        assert c.ffn_bias is (folder == "nemotron_h_bias") and c.norm_eps == pytest.approx(1e-5)
        assert c.mamba_norm and c.mamba_conv_bias and c.recurrent


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_layer_holds_one_mixer(folder):
    """A Mamba2 layer holds no MLP and no keys, an attention layer no MLP, an MLP layer nothing but its MLP; only
    the attention layers keep keys and values, only the Mamba2 layers a recurrent state."""
    with llambda.load(TINY / folder, backend="numpy", n_ctx=32) as m:
        t, kinds = m.transformer, KINDS[folder]
        for L, kind in zip(t.layers, kinds):
            assert (L.mamba is not None) == (kind == "mamba2") and (L.wq is not None) == (kind == "attention")
            assert (L.w_up is not None) == (kind == "mlp") and L.w_gate is None
            assert (L.ffn_norm is not None) == (kind == "mlp") and (L.attn_norm is not None) == (kind != "mlp")
            assert (L.b_up is not None) == (kind == "mlp" and folder == "nemotron_h_bias")
        assert m.config.cache_layers() == [i for i, k in enumerate(kinds) if k == "attention"]
        assert sorted(t.conv_state) == sorted(t.delta_state) == [i for i, k in enumerate(kinds) if k == "mamba2"]


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_export_matches_transformers(folder, mode, exported):
    with load(exported(folder), mode) as m:
        assert max_err(m, folder) <= MODES[mode][2]


def test_q8_0_weights_run_alike_on_every_backend(tmp_path):
    """Q8_0 weights: native exact within the float budget of NumPy on the same file; fast mode rounds the
    activations to 8-bit blocks too (0.21 measured here; test_export gives llama.cpp 0.75 for the same rounding)."""
    from llambda.tools.export import export
    gg = export(TINY / "nemotron_h", tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    ids = reference("nemotron_h")["inputs"][1]["input_ids"]
    with load(gg, "numpy") as ref_m:
        want = ref_m.logits(ids)
    for mode in ("native-exact", "native-fast"):
        with load(gg, mode) as m:
            assert float(np.abs(m.logits(ids) - want).max()) <= (1e-3 if mode == "native-exact" else 0.75), mode


def test_transformers5_tensor_names_load_the_same_model(tmp_path):
    """transformers 5 writes NVIDIA's backbone.* names; its in-memory names (model.embeddings, model.layers.N,
    model.norm_f) are read as well."""
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    d = tmp_path / "model_prefix"
    d.mkdir()
    os.symlink(TINY / "nemotron_h" / "config.json", d / "config.json")
    st = open_safetensors_dir(TINY / "nemotron_h")
    try:
        arrays = {n.replace("backbone.", "model.", 1): t.to_float32() for n, t in st.tensors.items()}
    finally:
        st.close()
    assert any(n.startswith("model.layers.") for n in arrays) and "model.norm_f.weight" in arrays
    write_safetensors(d / "model.safetensors", arrays)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "nemotron_h") <= 1e-3


def test_nvidia_config_spelling_is_the_same_model(tmp_path):
    """NVIDIA's config.json spells the layers as hybrid_override_pattern (with num_hidden_layers) and the Mamba2
    keys by their older names; the same model."""
    def nvidia(c):
        del c["layers_block_type"]
        c.update(hybrid_override_pattern="MM-*-M*-", num_hidden_layers=8, mamba_n_groups=c.pop("n_groups"),
                 mamba_d_conv=c.pop("conv_kernel"), time_step_limit=[0.0, float("inf")])
    with llambda.load(edited(tmp_path, nvidia), backend="numpy", n_ctx=128) as m:
        assert m.config.layer_kinds == KINDS["nemotron_h"] and max_err(m, "nemotron_h") <= 1e-3


def test_server_scheduler_runs_sequences_without_prefix_reuse():
    hybrid.test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse("nemotron_h")


# ---------------------------------------------------------------- decode steps and the recurrent state

@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_full_forward(folder, mode):
    ids = reference(folder)["inputs"][2]["input_ids"][:48]
    with load(TINY / folder, mode) as m:
        assert decode_vs_full(m, ids, 20) <= 1e-4


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_equals_prefill_then_decode_steps(folder, mode):
    hybrid.test_generate_equals_prefill_then_decode_steps(folder, mode)


def test_state_cannot_be_rewound_or_skipped():
    hybrid.test_state_cannot_be_rewound_or_skipped("nemotron_h")


@pytest.mark.parametrize("mode", ["numpy", "native-fast"])
def test_reused_prefix_resumes_only_where_the_state_is(mode):
    hybrid.test_reused_prefix_resumes_only_where_the_state_is("nemotron_h", mode)


def test_batch_invariance_with_other_sequences():
    hybrid.test_batch_invariance_with_other_sequences("nemotron_h")


def test_the_memory_plan_is_what_the_load_allocates():
    hybrid.need("native")
    with llambda.load(TINY / "nemotron_h", backend="native", threads=1, n_ctx=16, n_slots=4) as m:
        p, got = m.memory_plan, m.memory_report()
        assert p.recurrent > 0 and p.recurrent == got["recurrent"]
        assert p.kv_cache == got["kv_cache"] and p.activations == got["activations"]


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(layers_block_type=["mamba", "moe", "mlp", "attention", "mlp", "mamba", "attention", "mlp"]),
     "moe"),
    (lambda c: c.update(hybrid_override_pattern="MM-*E-M*-"[:8], layers_block_type=None), "MoE"),
    (lambda c: c.update(hybrid_override_pattern="MM-*x-M*", layers_block_type=None), "hybrid_override_pattern"),
    (lambda c: c.update(hybrid_override_pattern=8, layers_block_type=None), "hybrid_override_pattern"),
    (lambda c: c.update(layers_block_type=["mamba", "conv"]), "layer_types"),
    (lambda c: c.pop("layers_block_type"), "layers_block_type"),
    (lambda c: c.update(num_hidden_layers=7), "num_hidden_layers"),
    (lambda c: c.update(mlp_hidden_act="silu"), "mlp_hidden_act"),
    (lambda c: c.update(mamba_hidden_act="gelu"), "mamba_hidden_act"),
    (lambda c: c.update(attention_bias=True), "attention_bias"),
    (lambda c: c.update(use_bias=True), "use_bias"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(use_conv_bias=False), "use_conv_bias"),
    (lambda c: c.update(time_step_limit=[0.0, 5.0]), "time_step_limit"),
    (lambda c: c.update(sliding_window=16), "sliding_window"),
    (lambda c: c.update(mamba_num_heads=5), "heads"),
    (lambda c: c.update(n_groups=3), "groups"),
    (lambda c: c.update(mamba_head_dim="x"), "mamba_head_dim"),
    (lambda c: c.update(conv_kernel=1), "kernel"),
    (lambda c: c.update(quantization_config={"quant_method": "fp8"}), "fp8"),
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    def apply(c):
        edit(c)
        for k in [k for k, v in c.items() if v is None and k == "layers_block_type"]:
            del c[k]
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited(tmp_path, apply), backend="numpy", n_ctx=16)


def test_a_checkpoint_whose_pattern_disagrees_with_its_tensors_is_refused(tmp_path):
    """An MLP layer said to be Mamba2: its Mamba2 tensors are missing, named as the checkpoint names them."""
    path = edited(tmp_path, lambda c: c.update(layers_block_type=["mamba", "mamba", "mamba", "attention", "mlp",
                                                                   "mamba", "attention", "mlp"]))
    with pytest.raises(ModelFormatError, match=r"layers\.2\.mixer"):
        llambda.load(path, backend="numpy", n_ctx=16)


def _rewritten(src, out, **changes):
    """The GGUF at src (an f32 export) with metadata keys changed."""
    from llambda.formats.quants import QType, dequantize
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = [(n, QType.F32, dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32))
                 for n, t in f.tensors.items()]
    meta.update(changes)
    for k in changes:
        types.pop(k, None)
    write_gguf(out, meta, items, metadata_types=types)
    return out


@pytest.mark.parametrize("changes, message", [
    ({"nemotron_h.feed_forward_length": 96}, "feed_forward_length"),
    ({"nemotron_h.feed_forward_length": [0, 0, 96, 96, 96, 0, 0, 96]}, "kv heads and an MLP"),
    ({"nemotron_h.feed_forward_length": [0, 0, 96, 0, 64, 0, 0, 96]}, "one common"),
    ({"nemotron_h.feed_forward_length": [0, 0, 96]}, "layers"),
    ({"nemotron_h.attention.head_count_kv": [0, 0, 0, 2, 0, 0, 3, 0]}, "head_count_kv"),
])
def test_bad_gguf_metadata_is_refused_by_name(exported, tmp_path, changes, message):
    path = _rewritten(exported("nemotron_h"), tmp_path / "bad.gguf", **changes)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(path, backend="numpy", n_ctx=16)


def test_the_export_holds_what_llama_cpp_reads(exported):
    with GGUFFile(exported("nemotron_h")) as f:
        meta, names = f.metadata, set(f.tensors)
    assert list(meta["nemotron_h.attention.head_count_kv"]) == [0, 0, 0, 2, 0, 0, 2, 0]
    assert list(meta["nemotron_h.feed_forward_length"]) == [0, 0, 96, 0, 96, 0, 0, 96]
    assert meta["nemotron_h.ssm.inner_size"] == 128 and meta["nemotron_h.ssm.group_count"] == 2
    assert {"blk.2.attn_norm.weight", "blk.2.ffn_up.weight", "blk.0.ssm_a", "blk.0.ssm_conv1d.bias"} <= names
    assert not {"blk.2.ffn_norm.weight", "blk.0.ffn_up.weight", "blk.3.ffn_up.weight", "blk.2.ffn_gate.weight"} & names


MAMBA = dict(conv_kernel=4, ssm_k_heads=1, ssm_v_heads=2, ssm_k_dim=8, ssm_v_dim=8)


@pytest.mark.parametrize("fields, message", [
    (dict(layer_kinds=["mlp", "attention"]), "ffn_own_layers"),
    (dict(ffn_own_layers=1), "ffn_own_layers"),
    (dict(ffn_own_layers=True, layer_kinds=["mlp", "attention"], n_experts=4, n_experts_used=2, expert_ffn_dim=8),
     "dense MLPs"),
    (dict(ffn_own_layers=True, layer_kinds=["mlp", "attention"], post_norms=True), "post-norms"),
    (dict(ffn_own_layers=True, layer_kinds=["mlp", "attention"], parallel_block=True), "parallel"),
    (dict(ffn_own_layers=True, layer_kinds=["mlp", "mamba2"], norm_kind="layer", norm_bias=True, **MAMBA), "bias"),
    (dict(activation="relu2", ffn_gated=False, layer_kinds=["attention", "mamba2"], **MAMBA), "without a gate"),
])
def test_mlp_layers_of_their_own_are_checked(fields, message):
    """config.py's rules for the mlp layer kind and ffn_own_layers, whatever reader built the config."""
    from llambda.models.config import TransformerConfig
    base = dict(arch="x", vocab_size=16, n_layers=2, d_model=16, n_heads=2, n_kv_heads=2, head_dim=8, ffn_dim=32)
    with pytest.raises(ModelFormatError, match=message):
        TransformerConfig(**base, **fields)


def test_an_mlp_layer_keeps_no_state():
    """An mlp layer is neither recurrent nor cached: a model of attention and mlp layers alone is no hybrid."""
    from llambda.models.base import recurrent_state_specs
    from llambda.models.config import TransformerConfig
    c = TransformerConfig(arch="x", vocab_size=16, n_layers=3, d_model=16, n_heads=2, n_kv_heads=2, head_dim=8,
                          ffn_dim=32, ffn_own_layers=True, layer_kinds=["attention", "mlp", "mamba2"], **MAMBA)
    conv, delta, _ = recurrent_state_specs(c, 1)
    assert conv == delta == [2] and c.cache_layers() == [0]
    c2 = TransformerConfig(arch="x", vocab_size=16, n_layers=2, d_model=16, n_heads=2, n_kv_heads=2, head_dim=8,
                           ffn_dim=32, ffn_own_layers=True, layer_kinds=["attention", "mlp"])
    assert not c2.recurrent and recurrent_state_specs(c2, 1)[:2] == ([], [])

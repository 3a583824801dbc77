"""LFM2-MoE (`lfm2moe`, HF Lfm2MoeForCausalLM: LFM2-8B-A1B's architecture).

The tiny reference (fixtures/reference/tiny/lfm2_moe, made by tools/make_tiny_lfm2moe.py; README_lfm2moe.md there)
runs from its HF directory in test_tiny_models.py with every other folder, and its exports (f32 to q4_k_m) in
llama.cpp in test_export.py. Here: our GGUF export on every backend against transformers; the settings each
format yields; the recurrent state (decode steps, chunked prefill, batch invariance: test_hybrid.py's checks);
controls that the expert bias, the renormalisation and the scale are what the reference ran; refusals; and the
lfm2 / lfm2moe files llama.cpp runs that are not a causal language model (embedding, windowed), refused.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import llambda
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.tools.export import export

import test_hybrid as hybrid
import test_mamba as mamba
from archkit import MODES, TINY, edited_copy, exported, greedy_matches, load, max_err, reference  # noqa: F401

FOLDER = "lfm2_moe"
A = "lfm2moe"


# max |logit diff| against transformers (logits' std about 3.9; measured 2e-5 on numpy, 3.3e-5 native, whose fast
# mode quantizes no activation beside these float32 weights: test_quantized_native_matches_numpy runs it on Q8_0)
BUDGET = {"numpy": 1e-4, "native-exact": 1e-4, "native-fast": 1e-3}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_both_formats_match_transformers(exported, mode, fmt):
    with load(TINY / FOLDER if fmt == "hf" else exported(FOLDER), mode) as m:
        assert m.config.arch == A
        assert max_err(m, FOLDER) <= BUDGET[mode]
        assert greedy_matches(m, FOLDER)


def test_settings_from_each_format(exported):
    """The GGUF holds llama.cpp's lfm2moe keys and names (its converter's: per-layer kv heads, 0 for a conv layer;
    leading_dense_block_count; sigmoid gating; the bias as exp_probs_b), and both formats read the same model."""
    with GGUFFile(exported(FOLDER)) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == A
    assert list(meta[f"{A}.attention.head_count_kv"]) == [0, 2, 0, 0, 2]
    assert (meta[f"{A}.expert_count"], meta[f"{A}.expert_used_count"], meta[f"{A}.expert_feed_forward_length"]) == \
        (8, 2, 32)
    assert (meta[f"{A}.leading_dense_block_count"], meta[f"{A}.expert_gating_func"], meta[f"{A}.feed_forward_length"],
            meta[f"{A}.shortconv.l_cache"]) == (2, 2, 96, 3)
    assert {"token_embd_norm.weight", "blk.1.ffn_gate.weight", "blk.2.ffn_gate_inp.weight", "blk.2.exp_probs_b.bias",
            "blk.4.ffn_up_exps.weight", "blk.2.shortconv.conv.weight", "blk.4.attn_q_norm.weight"} <= names
    assert not {"output.weight", "output_norm.weight", "blk.2.ffn_gate.weight", "blk.1.exp_probs_b.bias"} & names
    for path in (TINY / FOLDER, exported(FOLDER)):
        with load(path, n_ctx=32) as m:
            c = m.config
        assert c.layer_kinds == ["shortconv", "attention", "shortconv", "shortconv", "attention"], path
        assert (c.ffn_dim, c.conv_kernel, c.qk_norm, c.rope_neox, c.tie_embeddings) == (96, 3, True, True, True), path
        assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.shared_ffn_dim) == (8, 2, 32, 0), path
        assert (c.moe_routing, c.moe_choice_bias, c.moe_norm_topk, c.moe_scale) == ("sigmoid_topk", True, True, 1.0)
        assert c.moe_layers == [False, False, True, True, True], path


# ---------------------------------------------------------------- the recurrent state beside the KV cache

@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_and_chunked_prefill_equal_a_full_forward(mode):
    """Decode steps after a 20-token prefill, and the prompt fed in chunks of 7, 13 and 21 tokens (the conv state
    carried between them), give the rows of one pass (test_mamba.py's check)."""
    mamba.test_decode_steps_and_chunked_prefill_equal_a_full_forward(FOLDER, mode)


@pytest.mark.parametrize("mode", list(MODES))
def test_generate_equals_prefill_then_decode_steps(mode):
    hybrid.test_generate_equals_prefill_then_decode_steps(FOLDER, mode)


def test_state_cannot_be_rewound_or_skipped():
    hybrid.test_state_cannot_be_rewound_or_skipped(FOLDER)


def test_batch_invariance_with_other_sequences():
    hybrid.test_batch_invariance_with_other_sequences(FOLDER)


def test_reused_prefix_resumes_only_where_the_state_is():
    hybrid.test_reused_prefix_resumes_only_where_the_state_is(FOLDER, "native-fast")


def test_server_scheduler_runs_sequences_without_prefix_reuse():
    hybrid.test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse(FOLDER)


def test_quantized_native_matches_numpy():
    """Q8_0 weights (quantized at load): the quantized kernels under short convs and sigmoid routing with a choice
    bias against the NumPy oracle on the same weights. Exact mode within the float budget. Fast mode's 8-bit
    activations move logits by about 0.7 (median row; dense lfm2's max is 0.63) and flip close expert choices,
    which move a row by up to 5.4 (measured: 8 of the 9 rows off by more than 2 have a choice margin under 0.02,
    and a flip reaches later rows through the conv state and attention): its budget is the median and a bound."""
    from archkit import reference as ref_of
    from test_tiny_models import native_vs_numpy
    errs = native_vs_numpy(FOLDER, "q8_0")
    assert errs["f32"] <= 1e-3 and errs["q8"] <= 8.0, errs
    rows = {}
    for backend, act in (("numpy", None), ("native", "q8")):
        with load(TINY / FOLDER, "numpy" if backend == "numpy" else "native-fast", quantize="q8_0") as m:
            ids = ref_of(FOLDER)["inputs"][2]["input_ids"]
            n = len(ids)
            rows[act] = m.transformer.forward(np.array(ids, np.int32), np.zeros(n, np.int32),
                                              np.arange(n, dtype=np.int32), list(range(n))).copy()
    assert float(np.median(np.abs(rows[None] - rows["q8"]).max(-1))) <= 1.0


# ---------------------------------------------------------------- the routing is the reference's (controls)

def without_bias(tmp_path):
    """The fixture with use_expert_bias false and its expert_bias tensors left out (a file holding them with the
    flag false is refused: tensors the config does not describe)."""
    d = edited_copy(FOLDER, tmp_path / "nobias", use_expert_bias=False)
    with SafetensorsFile(TINY / FOLDER / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()
                  if not n.endswith("expert_bias")}
    (d / "model.safetensors").unlink()
    write_safetensors(d / "model.safetensors", arrays)
    return d


@pytest.mark.parametrize("changes", [{"use_expert_bias": False}, {"norm_topk_prob": False},
                                     {"routed_scaling_factor": 1.5}])
def test_each_routing_setting_matters(tmp_path, changes):
    """The reference ran with the expert bias choosing, renormalised weights and no scale: the same weights with
    any of them changed are another model (so the tests above see each)."""
    d = without_bias(tmp_path) if "use_expert_bias" in changes else edited_copy(FOLDER, tmp_path / "m", **changes)
    with load(d) as m:
        assert max_err(m, FOLDER) > 0.05


def test_dense_layers_are_the_files(tmp_path):
    """num_dense_layers against a file with two dense layers: 3 is refused (layer 2 has a router and no dense MLP);
    1 runs the reference, a layer holding a dense MLP and no router being dense whatever the config says (as a
    GGUF's layers are told apart: base.layer_is_moe)."""
    with pytest.raises(ModelFormatError, match="blk.2.ffn_gate.weight|feed_forward.w1"):
        llambda.load(edited_copy(FOLDER, tmp_path / "m3", num_dense_layers=3), backend="numpy", n_ctx=32)
    with load(edited_copy(FOLDER, tmp_path / "m1", num_dense_layers=1)) as m:
        assert m.config.moe_layers[1] and max_err(m, FOLDER) <= 1e-3


def test_without_the_bias_the_export_writes_zeros_llama_cpp_reads(tmp_path):
    """use_expert_bias false: llama.cpp's lfm2moe requires exp_probs_b on every MoE layer, so the export writes a
    zero bias (the same choice): the file runs as the directory does, here and in llama.cpp."""
    d = without_bias(tmp_path)
    gg = export(d, tmp_path / "nobias.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(gg) as f:
        assert not np.array(f.tensors["blk.3.exp_probs_b.bias"].data).any()
    ids = reference(FOLDER)["inputs"][1]["input_ids"]
    with llambda.load(d, backend="numpy", n_ctx=64) as a, llambda.load(gg, backend="numpy", n_ctx=64) as b:
        assert not a.config.moe_choice_bias and b.config.moe_choice_bias
        ours = a.logits(ids)
        assert float(np.abs(ours - b.logits(ids)).max()) <= 1e-4
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    assert float(np.abs(ours - llama_cpp_logits(gg, ids)).max()) <= 0.05


@pytest.mark.parametrize("changes, message", [({"norm_topk_prob": False}, "renormalises"),
                                              ({"routed_scaling_factor": 2.0}, "routed_scaling_factor")])
def test_export_refuses_what_llama_cpp_cannot_run(tmp_path, changes, message):
    with pytest.raises(ModelFormatError, match=message):
        export(edited_copy(FOLDER, tmp_path / "m", **changes), tmp_path / "x.gguf", fmt="gguf")
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / FOLDER, tmp_path / "hf", fmt="hf")


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("changes, field", [
    ({"layer_types": None}, "layer_types"),
    ({"layer_types": ["conv", "mamba", "conv", "conv", "full_attention"]}, "layer_types"),
    ({"num_experts": None}, "num_experts"),
    ({"num_experts_per_tok": 9}, "experts used per token"),
    ({"moe_intermediate_size": -1}, "moe_intermediate_size"),
    ({"num_dense_layers": -1}, "num_dense_layers"),
    ({"use_expert_bias": "yes"}, "use_expert_bias"),
    ({"norm_topk_prob": 2}, "norm_topk_prob"),
    ({"routed_scaling_factor": 0}, "routed_scaling_factor"),
    ({"conv_bias": True}, "conv_bias"),
    ({"conv_L_cache": 1000}, "conv_L_cache"),
    ({"moe_intermediate_size": 16}, "ffn_gate_exps"),      # the tensors' shapes are checked against it
])
def test_malformed_configs_are_refused_by_name(tmp_path, changes, field):
    with pytest.raises(ModelFormatError, match=field):
        llambda.load(edited_copy(FOLDER, tmp_path / "m", **changes), backend="numpy", n_ctx=32)


def test_a_missing_expert_or_bias_is_refused(tmp_path):
    with SafetensorsFile(TINY / FOLDER / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    for drop, message in (("model.layers.3.feed_forward.experts.5.w3.weight", "experts \\[5\\] are missing"),
                          ("model.layers.4.feed_forward.expert_bias", "expert_bias")):
        d = tmp_path / drop.split(".")[-2]
        d.mkdir()
        (d / "config.json").write_text((TINY / FOLDER / "config.json").read_text())
        write_safetensors(d / "model.safetensors", {n: a for n, a in arrays.items() if n != drop})
        with pytest.raises(ModelFormatError, match=message):
            llambda.load(d, backend="numpy", n_ctx=32)


def test_transformers5_fused_experts_are_the_same_model(tmp_path):
    """The experts as transformers 5 saves them without save_original_format (feed_forward.experts.gate_up_proj:
    per expert w1's rows then w3's; down_proj: w2's) give the same logits; a fused tensor of another shape is
    refused by name."""
    with SafetensorsFile(TINY / FOLDER / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    fused = {n: a for n, a in arrays.items() if ".experts." not in n}
    for i in (2, 3, 4):
        p = f"model.layers.{i}.feed_forward.experts."
        fused[p + "gate_up_proj"] = np.stack([np.concatenate([arrays[f"{p}{e}.w1.weight"], arrays[f"{p}{e}.w3.weight"]])
                                              for e in range(8)])
        fused[p + "down_proj"] = np.stack([arrays[f"{p}{e}.w2.weight"] for e in range(8)])
    d = tmp_path / "fused"
    d.mkdir()
    (d / "config.json").write_text((TINY / FOLDER / "config.json").read_text())
    write_safetensors(d / "model.safetensors", fused)
    with load(d) as m:
        assert max_err(m, FOLDER) <= 1e-3
    fused["model.layers.3.feed_forward.experts.down_proj"] = fused["model.layers.3.feed_forward.experts.down_proj"][:7]
    write_safetensors(d / "model.safetensors", fused)
    with pytest.raises(ModelFormatError, match="layers.3.feed_forward.experts.down_proj"):
        llambda.load(d, backend="numpy", n_ctx=32)


def _gguf_edit(src, out, drop_tensors=(), **keys):
    """The GGUF at src with lfm2moe.<key> set (None: removed) and tensors left out."""
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values() if t.name not in drop_tensors]
    for k, v in keys.items():
        types.pop(f"{A}.{k}", None)
        meta.pop(f"{A}.{k}", None)
        if v is not None:
            meta[f"{A}.{k}"] = v
    write_gguf(out, meta, items, metadata_types={k: t for k, t in types.items() if k in meta})
    return out


@pytest.mark.parametrize("keys, drop, message", [
    ({"expert_gating_func": 1}, (), "expert_gating_func"),
    ({"expert_gating_func": None}, (), "expert_gating_func"),
    ({"expert_weights_norm": False}, (), "expert_weights_norm"),
    ({"expert_weights_scale": 2.5}, (), "expert_weights_scale"),
    ({"shortconv.l_cache": None}, (), "l_cache"),
    ({"attention.head_count_kv": [0, 2, 0, 0]}, (), "head_count_kv"),
    ({}, ("blk.3.exp_probs_b.bias",), "exp_probs_b"),
    ({}, ("blk.2.ffn_gate_inp.weight",), "blk.2"),
])
def test_bad_gguf_files_are_model_format_errors(exported, tmp_path, keys, drop, message):
    bad = _gguf_edit(exported(FOLDER), tmp_path / "bad.gguf", drop, **keys)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(bad, backend="numpy", n_ctx=32)


# the lfm2moe keys llama.cpp's converter (LFM2MoeModel over TextModel) writes for this folder, and no others
CONVERTER_KEYS = {"block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                  "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count",
                  "expert_used_count", "expert_feed_forward_length", "leading_dense_block_count",
                  "expert_gating_func", "vocab_size", "shortconv.l_cache"}


def test_the_converters_keys_alone_run_the_reference(exported, tmp_path):
    """Our export less the keys the converter does not write (key/value lengths, rope dimension count,
    expert_weights_norm): what llama.cpp's convert_hf_to_gguf.py makes of the folder (its tensors are ours,
    checked by name in test_settings_from_each_format) is read as the same model. (Checked once by hand on the
    converter's own output of this folder: 2e-5 from transformers.)"""
    with GGUFFile(exported(FOLDER)) as f:
        ours = {k.split(".", 1)[1] for k in f.metadata if k.startswith(A + ".")}
    assert CONVERTER_KEYS <= ours
    gg = _gguf_edit(exported(FOLDER), tmp_path / "conv.gguf", **{k: None for k in ours - CONVERTER_KEYS})
    with GGUFFile(gg) as f:
        assert {k.split(".", 1)[1] for k in f.metadata if k.startswith(A + ".")} == CONVERTER_KEYS
    with load(gg) as m:
        assert max_err(m, FOLDER) <= 1e-4


def test_an_unscaled_gguf_says_scale_one(exported, tmp_path):
    """expert_weights_scale 1.0 (what a converter may write for routed_scaling_factor 1) is the same model."""
    gg = _gguf_edit(exported(FOLDER), tmp_path / "s.gguf", expert_weights_scale=1.0)
    with load(gg) as m:
        assert m.config.moe_scale == 1.0 and max_err(m, FOLDER) <= 1e-3


def test_config_json_round_trip_of_the_fixture_is_transformers():
    """The fixture's config.json is what transformers 5.25 wrote (the keys this module reads, its defaults)."""
    cfg = json.loads((TINY / FOLDER / "config.json").read_text())
    assert cfg["model_type"] == "lfm2_moe" and cfg["architectures"] == ["Lfm2MoeForCausalLM"]
    assert (cfg["num_dense_layers"], cfg["use_expert_bias"], cfg["norm_topk_prob"]) == (2, True, True)


# ---------------------------------------------------------------- what llama.cpp's lfm2 / lfm2moe files may also say

def _with_keys(src, out, arch, keys: dict, tensors=()):
    """The GGUF at src with `arch.key` values added (GGUFValue or plain) and extra tensors."""
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    meta.update({f"{arch}.{k}": v for k, v in keys.items()})
    write_gguf(out, meta, items + list(tensors), metadata_types={k: t for k, t in types.items() if k in meta})
    return out


@pytest.mark.parametrize("folder, arch", [("lfm2", "lfm2"), (FOLDER, A)])
def test_lfm2_embedding_and_windowed_files_are_refused(exported, tmp_path, folder, arch):
    """llama.cpp's lfm2 also runs LFM2.5-Embedding (attention.causal false, every arch reads it), LFM2-ColBERT (a
    dense_2_out projection after the norm) and LFM2.5-Audio's detokenizer (attention.sliding_window on the attention
    layers, lfm2 only): none is the causal language model run here, each was run as one (but ColBERT's, whose
    tensor was unread). A window of 0 is none, and llama.cpp's lfm2moe does not read the key."""
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    from llambda.formats.quants import QType
    src = exported(folder)
    cases = [({"attention.causal": GGUFValue(VT.BOOL, False)}, (), "attention.causal"),
             ({"embedding_length_out": GGUFValue(VT.UINT32, 16)},
              [("dense_2_out.weight", QType.F32, np.zeros((16, 64), np.float32).view(np.uint8).reshape(-1), (16, 64))],
              "dense_2_out")]
    if arch == "lfm2":
        cases.append(({"attention.sliding_window": GGUFValue(VT.UINT32, 4)}, (), "sliding_window"))
    for k, (keys, tensors, message) in enumerate(cases):
        bad = _with_keys(src, tmp_path / f"bad{k}.gguf", arch, keys, tensors)
        with pytest.raises(ModelFormatError, match=message):
            llambda.load(bad, backend="numpy", n_ctx=32)
    ok = _with_keys(src, tmp_path / "ok.gguf", arch, {"attention.causal": GGUFValue(VT.BOOL, True),
                                                      "attention.sliding_window": GGUFValue(VT.UINT32, 0 if arch == "lfm2" else 4)})
    with load(ok) as m:
        assert max_err(m, folder) <= 1e-3 and m.config.sliding_window == 0

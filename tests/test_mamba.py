"""Mamba2, Mamba 1 and FalconMamba beyond the shared tiny-model tests (test_tiny_models.py and test_export.py run the
three folders against transformers and llama.cpp): every layer a state-space mixer, their GGUF on every backend
against transformers, decode steps and chunked prefill through the recurrent state against one full forward, the
state's rules and batch invariance (test_hybrid.py's tests on these folders), and malformed configs and files
refused by name. The Mamba 1 scan op against its NumPy oracle on every ISA is tests/test_ssm_scan1.py."""
import json

import numpy as np
import pytest

import llambda
import test_hybrid as hybrid
from archkit import MODES, TINY, decode_vs_full, each_format, exported, load, max_err, reference  # noqa: F401
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf

FOLDERS = ["mamba2", "mamba", "falcon_mamba"]
KIND = {"mamba2": "mamba2", "mamba": "mamba", "falcon_mamba": "mamba"}


def edited(tmp_path, edit, folder):
    return hybrid._edit(tmp_path, edit, folder)


def present(folder):
    if not (TINY / folder / "config.json").is_file():
        pytest.skip(f"no {folder} folder")


# ---------------------------------------------------------------- the model, from both formats

@pytest.mark.parametrize("folder", FOLDERS)
def test_config_from_each_format_is_one_model(folder, exported):
    present(folder)
    want = json.loads((TINY / folder / "config.json").read_text())
    for _, src in each_format(folder, exported):
        c = src.config
        assert c.layer_kinds == [KIND[folder]] * want["num_hidden_layers"] and c.recurrent and c.ffn_own_layers
        assert c.cache_layers() == [] and c.conv_kernel == want["conv_kernel"] and c.ssm_k_dim == want["state_size"]
        assert c.norm_eps == pytest.approx(want["layer_norm_epsilon"])
        if folder == "mamba2":
            assert (c.ssm_v_heads, c.ssm_v_dim, c.ssm_k_heads) == (want["num_heads"], want["head_dim"],
                                                                    want["n_groups"])
        else:
            assert c.ssm_inner == want["expand"] * want["hidden_size"] and c.ssm_dt_rank == want["time_step_rank"]
            eps = want.get("mixer_rms_eps", 0.0)
            # llama.cpp's mamba norms dt, B and C with the model's one RMS epsilon (its GGUF has no other)
            gguf_eps = want["layer_norm_epsilon"] if eps else 0.0
            assert c.ssm_dt_b_c_eps == pytest.approx(eps if src.format == "hf" else gguf_eps)


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_layer_is_a_mixer_without_mlp_or_keys(folder):
    present(folder)
    with llambda.load(TINY / folder, backend="numpy", n_ctx=32) as m:
        t = m.transformer
        for L in t.layers:
            assert L.wq is None and L.w_up is None and L.moe is None and L.ffn_norm is None
            assert (L.mamba is not None) == (folder == "mamba2") and (L.mamba1 is not None) == (folder != "mamba2")
        assert sorted(t.conv_state) == sorted(t.delta_state) == list(range(len(t.layers)))


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_export_matches_transformers(folder, mode, exported):
    present(folder)
    with load(exported(folder), mode) as m:
        # FalconMamba's GGUF norms dt, B and C with eps 1e-5 where transformers' mixer_rms_eps is 1e-6
        assert max_err(m, folder) <= MODES[mode][2] + (2e-3 if folder == "falcon_mamba" else 0)


# Written budgets against transformers on the HF folders (max |logit diff|, the logits' std about 2.5): float32 on
# NumPy and the native exact mode (measured 3e-5 at most), the fast mode's 8-bit activations (measured the same:
# these folders' float32 weights keep float32 products) under the shared 1e-2
BUDGETS = {"numpy": 1e-4, "native-exact": 1e-4, "native-fast": 1e-2}


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(BUDGETS))
def test_hf_folder_matches_transformers_within_the_written_budget(folder, mode):
    present(folder)
    with load(TINY / folder, mode) as m:
        assert max_err(m, folder) <= BUDGETS[mode]


@pytest.mark.parametrize("folder", FOLDERS)
def test_q8_0_weights_run_alike_on_every_backend(folder, tmp_path):
    """Q8_0 weights: native exact within float error of NumPy on the same file (measured 5e-6); the fast mode rounds
    activations to 8-bit blocks too (measured 0.11, 0.13 and 0.23 on mamba2, mamba and falcon_mamba)."""
    present(folder)
    from llambda.tools.export import export
    gg = export(TINY / folder, tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    ids = reference(folder)["inputs"][1]["input_ids"]
    with load(gg, "numpy") as ref_m:
        want = ref_m.logits(ids)
    for mode, tol in (("native-exact", 1e-3), ("native-fast", 0.5)):
        with load(gg, mode) as m:
            assert float(np.abs(m.logits(ids) - want).max()) <= tol, mode


def test_the_export_holds_what_llama_cpp_reads(exported):
    with GGUFFile(exported("mamba2")) as f:
        meta, t = f.metadata, f.tensors
        assert meta["general.architecture"] == "mamba2" and meta["mamba2.ssm.inner_size"] == 128
        assert meta["mamba2.ssm.time_step_rank"] == 8 and meta["mamba2.ssm.group_count"] == 2
        assert meta["mamba2.attention.head_count"] == 0 and meta["mamba2.feed_forward_length"] == 0
        assert t["blk.0.ssm_a"].shape == (8, 1) and t["blk.0.ssm_norm.weight"].shape == (2, 64)
        assert "output.weight" in t and not any(".ffn_" in n or ".attn_q" in n for n in t)


# ---------------------------------------------------------------- decode steps and the recurrent state

@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_and_chunked_prefill_equal_a_full_forward(folder, mode):
    """Decode steps after a 20-token prefill, and the prompt fed in chunks of 7, 13 and 21 tokens (the state carried
    between them), give the rows of one pass."""
    present(folder)
    ids = reference(folder)["inputs"][2]["input_ids"][:64]
    with load(TINY / folder, mode) as m:
        assert decode_vs_full(m, ids[:48], 20) <= 1e-4
        t, n = m.transformer, len(ids)
        full = t.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32),
                         list(range(n))).copy()
        for size in (7, 13, 21):
            rows = []
            for s in range(0, n, size):
                e = min(n, s + size)
                rows.append(t.forward(np.array(ids[s:e], np.int32), np.zeros(e - s, np.int32),
                                      np.arange(s, e, dtype=np.int32), list(range(e - s))).copy())
            assert float(np.abs(np.concatenate(rows) - full).max()) <= 1e-4, size


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_equals_prefill_then_decode_steps(folder, mode):
    present(folder)
    hybrid.test_generate_equals_prefill_then_decode_steps(folder, mode)


@pytest.mark.parametrize("folder", FOLDERS)
def test_state_cannot_be_rewound_or_skipped(folder):
    present(folder)
    hybrid.test_state_cannot_be_rewound_or_skipped(folder)


@pytest.mark.parametrize("folder", FOLDERS)
def test_batch_invariance_with_other_sequences(folder):
    present(folder)
    hybrid.test_batch_invariance_with_other_sequences(folder)


@pytest.mark.parametrize("folder", ["mamba2", "mamba"])
def test_server_scheduler_runs_sequences_without_prefix_reuse(folder):
    present(folder)
    hybrid.test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse(folder)


def test_the_memory_plan_is_what_the_load_allocates():
    hybrid.need("native")
    for folder in ("mamba2", "mamba"):
        present(folder)
        with llambda.load(TINY / folder, backend="native", threads=1, n_ctx=16, n_slots=4) as m:
            p, got = m.memory_plan, m.memory_report()
            assert p.recurrent > 0 and p.recurrent == got["recurrent"] and p.activations == got["activations"]


# ---------------------------------------------------------------- refusals

def _rewritten(src, out, changes=None, tensors=None):
    """The GGUF at src (an f32 export) with metadata keys changed and tensors replaced."""
    from llambda.formats.quants import QType, dequantize
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = {n: dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32) for n, t in f.tensors.items()}
    meta.update(changes or {})
    items.update(tensors or {})
    for k in changes or {}:
        types.pop(k, None)
    write_gguf(out, meta, [(n, QType.F32, v) for n, v in items.items()], metadata_types=types)
    return out


def test_a_mamba2_gguf_with_a_misshapen_ssm_a_is_refused(exported, tmp_path):
    with GGUFFile(exported("mamba2")) as f:
        a = np.array(f.tensors["blk.1.ssm_a"].data).view(np.float32).reshape(8, 1)
    path = _rewritten(exported("mamba2"), tmp_path / "bad.gguf", tensors={"blk.1.ssm_a": np.concatenate([a, a])})
    with pytest.raises(ModelFormatError, match="ssm_a"):
        llambda.load(path, backend="numpy", n_ctx=16)


def test_the_mamba_exports_hold_what_llama_cpp_reads(exported):
    for folder, rms in (("mamba", False), ("falcon_mamba", True)):
        with GGUFFile(exported(folder)) as f:
            meta, t = f.metadata, f.tensors
            assert meta["general.architecture"] == "mamba" and bool(meta["mamba.ssm.dt_b_c_rms"]) is rms
            assert (meta["mamba.ssm.inner_size"], meta["mamba.ssm.state_size"], meta["mamba.ssm.time_step_rank"]) == \
                (128, 16, 4)
            assert t["blk.0.ssm_a"].shape == (128, 16) and t["blk.0.ssm_d"].shape == (128,)
            assert t["blk.0.ssm_x.weight"].shape == (36, 128) and t["blk.0.ssm_dt.weight"].shape == (128, 4)
            assert t["blk.0.ssm_conv1d.weight"].shape == (128, 4) and "blk.0.ssm_dt.bias" in t
            assert ("output.weight" in t) is rms      # the mamba folder's head is tied


@pytest.mark.parametrize("folder, edit, message", [
    ("mamba2", lambda c: c.update(use_bias=True), "use_bias"),
    ("mamba2", lambda c: c.update(use_conv_bias=False), "use_conv_bias"),
    ("mamba2", lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    ("mamba2", lambda c: c.update(time_step_limit=[0.0, 5.0]), "time_step_limit"),
    ("mamba2", lambda c: c.update(time_step_limit=[0.001, {"__float__": "Infinity"}]), "time_step_limit"),
    ("mamba2", lambda c: c.update(norm_before_gate=True), "norm_before_gate"),
    ("mamba2", lambda c: c.update(rms_norm=False), "rms_norm"),
    ("mamba2", lambda c: c.update(num_heads=7), "num_heads"),
    ("mamba2", lambda c: c.update(head_dim="16"), "head_dim"),
    ("mamba2", lambda c: c.update(n_groups=3), "groups"),
    ("mamba2", lambda c: c.update(state_size=0), "state_size"),
    ("mamba2", lambda c: c.update(conv_kernel=1), "kernel"),
    ("mamba2", lambda c: c.update(layer_norm_epsilon=-1.0), "layer_norm_epsilon"),
    ("mamba2", lambda c: c.update(quantization_config={"quant_method": "fp8"}), "fp8"),
    ("mamba", lambda c: c.update(intermediate_size=96), "in_proj"),       # the tensors are 128 wide
    ("mamba", lambda c: c.update(intermediate_size=0), "intermediate_size"),
    ("mamba", lambda c: c.update(intermediate_size=None, expand=0), "expand"),
    ("mamba", lambda c: c.update(time_step_rank=0), "time_step_rank"),
    ("mamba", lambda c: c.update(time_step_rank="big"), "time_step_rank"),
    ("mamba", lambda c: c.update(state_size=0), "state_size"),
    ("mamba", lambda c: c.update(use_bias=True), "use_bias"),
    ("mamba", lambda c: c.update(use_conv_bias=False), "use_conv_bias"),
    ("mamba", lambda c: c.update(hidden_act="relu"), "hidden_act"),
    ("mamba", lambda c: c.update(conv_kernel=1), "kernel"),
    ("mamba", lambda c: c.update(tie_word_embeddings="no"), "tie_word_embeddings"),
    ("falcon_mamba", lambda c: c.update(mixer_rms_eps=0.0), "mixer_rms_eps"),
    ("falcon_mamba", lambda c: c.update(mixer_rms_eps="small"), "mixer_rms_eps"),
    ("falcon_mamba", lambda c: c.update(quantization_config={"quant_method": "bnb"}), "FalconMamba"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    present(folder)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited(tmp_path, edit, folder), backend="numpy", n_ctx=16)


@pytest.mark.parametrize("folder, changes, message", [
    ("mamba2", {"mamba2.ssm.inner_size": 100}, "inner_size"),
    ("mamba2", {"mamba2.ssm.group_count": 3}, "groups"),
    ("mamba2", {"mamba2.ssm.state_size": 0}, "state_size"),
    ("mamba2", {"mamba2.ssm.conv_kernel": "4"}, "conv_kernel"),
    ("falcon_mamba", {"mamba.ssm.inner_size": 0}, "inner_size"),
    ("falcon_mamba", {"mamba.ssm.inner_size": 96}, "ssm_in"),             # the tensors are another size
    ("falcon_mamba", {"mamba.ssm.time_step_rank": 5}, "ssm_x"),
    ("falcon_mamba", {"mamba.ssm.state_size": 1 << 20}, "state_size"),
    ("falcon_mamba", {"mamba.ssm.dt_b_c_rms": "yes"}, "dt_b_c_rms"),
])
def test_bad_gguf_metadata_is_refused_by_name(exported, tmp_path, folder, changes, message):
    present(folder)
    path = _rewritten(exported(folder), tmp_path / "bad.gguf", changes)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(path, backend="numpy", n_ctx=16)


def test_a_positive_a_in_a_gguf_is_refused(exported, tmp_path):
    """A = -exp(A_log) is negative; a file whose ssm_a is not would grow its state without bound."""
    with GGUFFile(exported("mamba")) as f:
        a = np.array(f.tensors["blk.2.ssm_a"].data).view(np.float32).reshape(128, 16).copy()
    a[5, 3] = 0.5
    path = _rewritten(exported("mamba"), tmp_path / "bad.gguf", tensors={"blk.2.ssm_a": a})
    with pytest.raises(ModelFormatError, match="layer 2.*positive"):
        llambda.load(path, backend="numpy", n_ctx=16)


def test_intermediate_size_wins_over_expand_as_in_transformers(tmp_path):
    """falcon-mamba-7b's config.json says expand 16 beside intermediate_size 8192 (= 2 x 4096): transformers takes
    the latter, and so does the reader; without intermediate_size, expand x hidden_size."""
    for name, change in (("expand", dict(expand=16)), ("no_size", dict(intermediate_size=None))):
        with llambda.load(edited(tmp_path / name, lambda c: c.update(change), "falcon_mamba"), backend="numpy",
                          n_ctx=128) as m:
            assert m.config.ssm_inner == 128 and max_err(m, "falcon_mamba") <= 1e-3


def test_a_missing_mamba_tensor_is_named(tmp_path):
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    d = edited(tmp_path, lambda c: None, "mamba")
    st = open_safetensors_dir(TINY / "mamba")
    try:
        arrays = {n: t.to_float32() for n, t in st.tensors.items() if n != "backbone.layers.1.mixer.x_proj.weight"}
    finally:
        st.close()
    (d / "model.safetensors").unlink()
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=r"layers\.1\.mixer\.x_proj"):
        llambda.load(d, backend="numpy", n_ctx=16)


def test_show_says_there_are_no_heads_or_kv_cache(capsys):
    from llambda.cli import main
    assert main(["show", str(TINY / "mamba")]) == 0
    out = capsys.readouterr().out
    assert "none (no attention layer)" in out and "0.0 MiB of f32 KV cache" in out


def test_mamba2_spellings_that_change_nothing(tmp_path):
    """chunk_size only cuts transformers' prefill into blocks, time_step_limit (0, inf) is no clamp however JSON
    spells it (or left out), and Mamba-Codestral's rms_norm / norm_before_gate are the defaults: the same model."""
    spellings = [dict(chunk_size=256), dict(time_step_limit=[0.0, float("inf")]), dict(time_step_limit=None),
                 dict(rms_norm=True, norm_before_gate=False, residual_in_fp32=False)]
    for k, change in enumerate(spellings):
        with llambda.load(edited(tmp_path / str(k), lambda c: c.update(change), "mamba2"), backend="numpy",
                          n_ctx=128) as m:
            assert max_err(m, "mamba2") <= 1e-4, change


def test_the_older_embedding_name_loads(tmp_path):
    """transformers' Mamba load hook renames backbone.embedding.* (older checkpoints) to embeddings.*: read too."""
    from llambda.formats.safetensors import open_safetensors_dir, write_safetensors
    d = edited(tmp_path, lambda c: None, "mamba")
    st = open_safetensors_dir(TINY / "mamba")
    try:
        arrays = {n.replace("embeddings.", "embedding."): t.to_float32() for n, t in st.tensors.items()}
    finally:
        st.close()
    assert "backbone.embedding.weight" in arrays
    (d / "model.safetensors").unlink()
    write_safetensors(d / "model.safetensors", arrays)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "mamba") <= 1e-4


def test_speculative_decoding_is_refused():
    """The state cannot be rolled back past rejected drafts."""
    from llambda.errors import InvalidInputError
    with llambda.load(TINY / "mamba", backend="numpy", n_ctx=64) as m:
        with pytest.raises(InvalidInputError, match="speculative decoding is not supported"):
            m.stream([1, 2, 3], max_tokens=4, speculative="lookup")

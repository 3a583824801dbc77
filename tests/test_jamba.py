"""Jamba (attention layers among Mamba 1 layers with weighted dt/B/C norms; dense and MoE feed-forwards) and Bamba
(Mamba2 + attention with half-rotary RoPE, dense MLPs) beyond the shared tiny-model tests (test_tiny_models.py and
test_export.py run both folders against transformers and llama.cpp): the layer kinds and feed-forwards each format
gives, written budgets against transformers per mode, the GGUF exports on every backend, decode steps and chunked
prefill through the recurrent state against one full forward, batch invariance, and malformed configs and files
refused by name."""
import json

import numpy as np
import pytest

import llambda
import test_hybrid as hybrid
from archkit import MODES, TINY, decode_vs_full, each_format, exported, load, max_err, reference  # noqa: F401
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf

FOLDERS = ["jamba", "bamba"]


def present(folder):
    if not (TINY / folder / "config.json").is_file():
        pytest.skip(f"no {folder} folder")


def edited(tmp_path, edit, folder):
    return hybrid._edit(tmp_path, edit, folder)


# ---------------------------------------------------------------- the model, from both formats

def test_jamba_layers_from_each_format(exported):
    want = json.loads((TINY / "jamba" / "config.json").read_text())
    n = want["num_hidden_layers"]
    kinds = ["attention" if i % want["attn_layer_period"] == want["attn_layer_offset"] else "mamba" for i in range(n)]
    moe = [i % want["expert_layer_period"] == want["expert_layer_offset"] for i in range(n)]
    assert "attention" in kinds and "mamba" in kinds and any(moe) and not all(moe)     # the fixture has all four
    for _, src in each_format("jamba", exported):
        c = src.config
        assert c.layer_kinds == kinds and c.layer_rope == [False] * n and c.ssm_dt_b_c_norms and not c.ssm_dt_b_c_eps
        assert (c.ssm_inner, c.ssm_dt_rank, c.ssm_k_dim, c.conv_kernel) == (128, 4, 16, 4)
        assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.moe_routing, c.moe_norm_topk) == \
            (4, 2, 96, "softmax_topk", False)
    with llambda.load(TINY / "jamba", backend="numpy", n_ctx=32) as m:
        for i, L in enumerate(m.transformer.layers):
            assert (L.wq is not None) == (kinds[i] == "attention") and (L.mamba1 is not None) == (kinds[i] == "mamba")
            assert (L.moe is not None) == moe[i] and (L.w_down is not None) == (not moe[i])
            if L.mamba1 is not None:
                assert L.mamba1.dt_norm.shape == (4,) and L.mamba1.b_norm.shape == L.mamba1.c_norm.shape == (16,)


# Written budgets against transformers on the HF folders (max |logit diff| over the three inputs' last rows, the
# logits' std about 2.5): float32 on NumPy (measured 3e-5 on jamba, 1e-5 on bamba) and the native exact mode
# (measured 1.0e-4 on jamba: its SIMD sums in another order, through six layers; 1e-5 on bamba), the fast mode's
# 8-bit activations under the shared 1e-2
BUDGETS = {"numpy": 1e-4, "native-exact": 2e-4, "native-fast": 1e-2}


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(BUDGETS))
def test_the_folder_and_its_gguf_export_match_transformers(folder, mode, exported):
    """The HF folder within the written budget, its f32 GGUF export within the shared one (archkit.MODES)."""
    present(folder)
    for path, budget in ((TINY / folder, BUDGETS[mode]), (exported(folder), MODES[mode][2])):
        with load(path, mode) as m:
            assert max_err(m, folder) <= budget, path.name


def test_the_jamba_export_holds_what_llama_cpp_reads(exported):
    with GGUFFile(exported("jamba")) as f:
        meta, t = f.metadata, f.tensors
        assert meta["general.architecture"] == "jamba" and list(meta["jamba.attention.head_count_kv"]) == \
            [0, 2, 0, 0, 2, 0]
        assert (meta["jamba.ssm.inner_size"], meta["jamba.ssm.state_size"], meta["jamba.ssm.time_step_rank"],
                meta["jamba.expert_count"], meta["jamba.expert_used_count"], meta["jamba.feed_forward_length"]) == \
            (128, 16, 4, 4, 2, 96)
        assert t["blk.0.ssm_dt_norm.weight"].shape == (4,) and t["blk.0.ssm_b_norm.weight"].shape == (16,)
        assert t["blk.0.ssm_a"].shape == (128, 16) and t["blk.1.ffn_gate_exps.weight"].shape == (4, 96, 64)
        assert "blk.0.ffn_gate_inp.weight" not in t and "blk.0.ffn_gate.weight" in t and "blk.1.attn_q.weight" in t


@pytest.mark.parametrize("folder", FOLDERS)
def test_q8_0_weights_run_alike_on_every_backend(folder, tmp_path):
    """Q8_0 weights: native exact within float error of NumPy on the same file; the fast mode rounds activations to
    8-bit blocks too, which on jamba flips close expert choices whose weights are not renormalised (measured 1.04;
    bamba, without experts: measured below 0.5), as test_export says of OLMoE."""
    present(folder)
    from llambda.tools.export import export
    gg = export(TINY / folder, tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    ids = reference(folder)["inputs"][1]["input_ids"]
    with load(gg, "numpy") as ref_m:
        want = ref_m.logits(ids)
    for mode, tol in (("native-exact", 1e-3), ("native-fast", 1.5 if folder == "jamba" else 0.5)):
        with load(gg, mode) as m:
            assert float(np.abs(m.logits(ids) - want).max()) <= tol, mode


# ---------------------------------------------------------------- decode steps and the recurrent state

def _in_chunks(t, ids: list, size: int) -> np.ndarray:
    """Every row's logits of ids fed to slot 0 from position 0 in forwards of `size` tokens."""
    out = []
    for s in range(0, len(ids), size):
        part = ids[s:s + size]
        out.append(t.forward(np.array(part, np.int32), np.zeros(len(part), np.int32),
                             np.arange(s, s + len(part), dtype=np.int32), list(range(len(part)))).copy())
    return np.concatenate(out)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_and_chunked_prefill_equal_a_full_forward(folder, mode):
    """Decode steps after a 20-token prefill, and the prompt fed in chunks of 7, 13 and 21 tokens (the state and
    the KV cache carried between them), give the rows of one pass (within 2e-4: measured 1.2e-4 on jamba's NumPy
    run, whose matrix products of other shapes sum in other orders; 1e-5 on bamba)."""
    present(folder)
    ids = reference(folder)["inputs"][2]["input_ids"][:64]
    with load(TINY / folder, mode) as m:
        assert decode_vs_full(m, ids[:48], 20) <= 2e-4
        whole = _in_chunks(m.transformer, ids, len(ids))
        for size in (7, 13, 21):
            assert float(np.abs(_in_chunks(m.transformer, ids, size) - whole).max()) <= 2e-4, size


# test_hybrid's checks of the recurrent state, on these folders: generate() equals prefill then decode steps, the
# state is neither rewound nor skipped, a sequence's decode logits are the same bits beside others, and the server's
# scheduler answers concurrent requests as the library does without reusing a prefix
SHARED = {"generate": "test_generate_equals_prefill_then_decode_steps",
          "rewind": "test_state_cannot_be_rewound_or_skipped", "batch": "test_batch_invariance_with_other_sequences",
          "server": "test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse"}


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("check", list(SHARED))
def test_the_recurrent_state_as_test_hybrid_checks_it(folder, check):
    present(folder)
    run = getattr(hybrid, SHARED[check])
    if check == "generate":
        for mode in MODES:
            run(folder, mode)
    else:
        run(folder)


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(attn_layer_offset=3), "attn_layer_offset"),
    (lambda c: c.update(expert_layer_period=0), "expert_layer_period"),
    (lambda c: c.update(expert_layer_offset=-1), "expert_layer_offset"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(mamba_conv_bias=False), "mamba_conv_bias"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.update(mamba_dt_rank=0), "mamba_dt_rank"),
    (lambda c: c.update(mamba_d_state="16"), "mamba_d_state"),
    (lambda c: c.update(mamba_expand=3), "ssm_in|in_proj"),            # the tensors no longer fit the config
])
def test_malformed_jamba_configs_are_refused_by_name(tmp_path, edit, match):
    with pytest.raises(ModelFormatError, match=match):
        llambda.load(edited(tmp_path, edit, "jamba"), backend="numpy", n_ctx=16)


def test_a_jamba_checkpoint_without_its_dt_norm_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file
    d = edited(tmp_path, lambda c: None, "jamba")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.2.mamba.dt_layernorm.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelFormatError, match="dt_layernorm"):
        llambda.load(d, backend="numpy", n_ctx=16)


def test_a_jamba_expert_past_the_count_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file
    d = edited(tmp_path, lambda c: None, "jamba")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.1.feed_forward.experts.7.up_proj.weight"] = tensors[
        "model.layers.1.feed_forward.experts.0.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelFormatError, match="experts.7"):
        llambda.load(d, backend="numpy", n_ctx=16)


def _rewritten(src, out, changes=None, tensors=None, drop=()):
    """The GGUF at src (an f32 export) with metadata keys changed, tensors replaced or dropped."""
    from llambda.formats.quants import QType, dequantize
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        items = {n: dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32) for n, t in f.tensors.items()}
    meta.update(changes or {})
    items.update(tensors or {})
    for k in list(changes or {}) :
        types.pop(k, None)
    write_gguf(out, meta, [(n, QType.F32, v) for n, v in items.items() if n not in drop], metadata_types=types)
    return out


def test_malformed_jamba_ggufs_are_refused_by_name(exported, tmp_path):
    src = exported("jamba")
    for changes, drop, match in (
            ({"jamba.attention.head_count_kv": 2}, (), "head_count_kv"),
            ({"jamba.attention.head_count_kv": [0, 2, 0]}, (), "head_count_kv"),
            ({"jamba.ssm.time_step_rank": 0}, (), "time_step_rank"),
            ({}, ("blk.3.ssm_c_norm.weight",), "ssm_c_norm"),
            ({}, ("blk.1.ffn_up_exps.weight",), "ffn_up_exps")):
        path = _rewritten(src, tmp_path / "bad.gguf", changes, drop=drop)
        with pytest.raises(ModelFormatError, match=match):
            llambda.load(path, backend="numpy", n_ctx=16)


def test_transformers_5_fused_experts_load_as_the_per_expert_ones(tmp_path):
    """A checkpoint with transformers 5's fused feed_forward.experts.gate_up_proj (E, 2I, d: gate rows, then up
    rows) and down_proj (E, d, I) is the same model as the Hub's one tensor per expert."""
    from safetensors.numpy import load_file, save_file
    d = edited(tmp_path, lambda c: None, "jamba")
    tensors = load_file(d / "model.safetensors")
    for i in (1, 3, 5):
        p = f"model.layers.{i}.feed_forward.experts."
        take = {w: np.stack([tensors.pop(f"{p}{e}.{w}_proj.weight") for e in range(4)]) for w in ("gate", "up", "down")}
        tensors[p + "gate_up_proj"] = np.concatenate([take["gate"], take["up"]], axis=1)
        tensors[p + "down_proj"] = take["down"]
    save_file(tensors, d / "model.safetensors")
    ids = reference("jamba")["inputs"][1]["input_ids"]
    with llambda.load(d, backend="numpy", n_ctx=64) as fused, llambda.load(TINY / "jamba", backend="numpy",
                                                                           n_ctx=64) as hub:
        assert np.array_equal(fused.logits(ids), hub.logits(ids))


def test_one_expert_means_every_mlp_dense():
    """num_experts 1 (AI21-Jamba-Reasoning-3B's kind): transformers builds a dense MLP in every layer."""
    from llambda.models.jamba import config_from_hf
    cfg = json.loads((TINY / "jamba" / "config.json").read_text())
    c = config_from_hf({**cfg, "num_experts": 1})
    assert c.n_experts == 0 and not any(c.moe_layers)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(attn_layer_indices=[1, 4]), "attn_layer_indices"),
    (lambda c: c.update(attn_layer_indices=[1, 1]), "attn_layer_indices"),
    (lambda c: c.update(attn_layer_indices="1"), "attn_layer_indices"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=1.0), "partial_rotary_factor"),
    (lambda c: c.update(attn_rotary_emb=16), "attn_rotary_emb"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(mlp_bias=True), "mlp_bias"),
    (lambda c: c.update(time_step_limit=[0.0, 10.0]), "time_step_limit"),
    (lambda c: c.update(mamba_n_heads=7), "mamba_n_heads"),
])
def test_malformed_bamba_configs_are_refused_by_name(tmp_path, edit, match):
    with pytest.raises(ModelFormatError, match=match):
        llambda.load(edited(tmp_path, edit, "bamba"), backend="numpy", n_ctx=16)


def test_bamba_gguf_rows_permuted_whole_run_as_llama_cpp_runs_them(exported, tmp_path):
    """llama.cpp's converter permutes each head's q/k rows whole; its adjacent-pair RoPE over the first
    rope.dimension_count dims then turns other pairs than transformers' (i, i + head_dim / 4). Such a file runs here
    as llama.cpp runs it (not transformers' model); our export, permuting the rotated half only, runs transformers'."""
    from llambda.formats.rope_rows import partial_rope_permutation, rope_permutation
    src = exported("bamba")
    with GGUFFile(src) as f:
        rows = {n: np.array(f.tensors[n].data).view(np.float32).reshape(f.tensors[n].shape)
                for n in ("blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.3.attn_q.weight", "blk.3.attn_k.weight")}
    whole = {}
    for name, w in rows.items():      # back to HF's rows, then permuted as llama.cpp's converter does
        heads = w.shape[0] // 16
        hf = w[partial_rope_permutation(heads, 16, 8, to_interleaved=False)]
        whole[name] = hf[rope_permutation(heads, 16, to_interleaved=True)]
    path = _rewritten(src, tmp_path / "converter.gguf", tensors=whole)
    ids = reference("bamba")["inputs"][1]["input_ids"][:12]
    with load(path, "numpy") as m:
        ours = m.logits(ids)
        assert max_err(m, "bamba") > 0.05            # not transformers' model
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    assert float(np.abs(llama_cpp_logits(path, ids) - ours).max()) <= 0.05


@pytest.mark.parametrize("folder", FOLDERS)
def test_show_counts_the_keys_and_values_of_attention_layers_only(folder):
    """`llambda show` (describe) sizes the KV cache of the two attention layers, not of every layer (it counted all
    six of jamba's, four of bamba's)."""
    from llambda.formats.open import open_model
    from llambda.tools.model_info import describe
    src = open_model(TINY / folder)
    try:
        assert describe(src, 128)["kv_cache_bytes"] == 2 * 2 * 128 * (2 * 16) * 4      # layers, k and v, kv heads x dim
    finally:
        src.close()

"""Falcon-H1 beyond the shared tiny-model tests (test_tiny_models.py, test_export.py run both folders against
transformers and llama.cpp): decode steps through the KV cache and the Mamba2 state against a full forward,
the recurrent state's rules (test_hybrid.py's tests run on these folders), the multipliers folded as llama.cpp's
converter folds them, what the GGUF holds, and malformed configs and files refused by name."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
import test_hybrid as hybrid           # its recurrent-state tests, run here on Falcon-H1's folders
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.open import open_model
from llambda.formats.quants import QType
from llambda.tools.export import export

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDERS = ["falcon_h1", "falcon_h1_nonorm"]
MODES = hybrid.MODES


def reference(folder: str) -> dict:
    return json.loads((TINY / folder / "reference.json").read_text(encoding="utf-8"))


def edited(tmp_path, edit, folder="falcon_h1") -> Path:
    return hybrid._edit(tmp_path, edit, folder)


# ---------------------------------------------------------------- decode steps against a full forward

@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_full_forward(folder, mode):
    """A prompt prefilled in two chunks, then one token per decode step (the KV cache and the convolution and
    scan states carried): every row's logits equal one forward of the whole sequence from position 0."""
    ids = reference(folder)["inputs"][2]["input_ids"][:60]
    with hybrid.load(TINY / folder, mode, n_ctx=128) as m:
        t = m.transformer
        rows = [t.forward(np.array(ids[:20], np.int32), np.zeros(20, np.int32), np.arange(20, dtype=np.int32),
                          range(20)).copy()]
        rows.append(t.forward(np.array(ids[20:40], np.int32), np.zeros(20, np.int32),
                              np.arange(20, 40, dtype=np.int32), range(20)).copy())
        for p in range(40, 60):
            rows.append(t.forward(np.array([ids[p]], np.int32), np.zeros(1, np.int32), np.array([p], np.int32),
                                  range(1)).copy())
        steps = np.concatenate(rows)
        whole = t.forward(np.array(ids, np.int32), np.zeros(60, np.int32), np.arange(60, dtype=np.int32),
                          np.arange(60), out=np.empty((60, m.config.vocab_size), np.float32))
    assert float(np.abs(steps - whole).max()) <= 1e-4


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_equals_prefill_then_decode_steps(folder, mode):
    hybrid.test_generate_equals_prefill_then_decode_steps(folder, mode)


@pytest.mark.parametrize("folder", FOLDERS)
def test_state_cannot_be_rewound_or_skipped(folder):
    hybrid.test_state_cannot_be_rewound_or_skipped(folder)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", ["numpy", "native-fast"])
def test_reused_prefix_resumes_only_where_the_state_is(folder, mode):
    hybrid.test_reused_prefix_resumes_only_where_the_state_is(folder, mode)


def test_batch_invariance_with_other_sequences():
    hybrid.test_batch_invariance_with_other_sequences("falcon_h1")


def test_server_scheduler_runs_sequences_without_prefix_reuse():
    hybrid.test_server_scheduler_runs_hybrid_sequences_without_prefix_reuse("falcon_h1")


def test_every_layer_keeps_keys_and_a_recurrent_state():
    with llambda.load(TINY / "falcon_h1", backend="numpy", n_ctx=32) as m:
        t, cfg = m.transformer, m.config
        assert cfg.layer_kinds == ["attn_mamba2"] * 3 and cfg.cache_layers() == [0, 1, 2]
        assert sorted(t.conv_state) == sorted(t.delta_state) == [0, 1, 2]
        assert all(L.mamba is not None and L.wq is not None for L in t.layers)
        assert t.delta_state[0].shape == (1, 6, 16, 16)        # (slots, heads, d_state, head dim)
        assert m.memory_report()["recurrent"] > 0


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_memory_plan_is_what_the_load_allocates(folder):
    """Keys and values of every layer and a Mamba2 state of every layer, both in the plan as allocated."""
    hybrid.need("native")
    with llambda.load(TINY / folder, backend="native", threads=1, n_ctx=16, n_slots=4) as m:
        p, got = m.memory_plan, m.memory_report()
        assert p.recurrent > 0 and p.recurrent == got["recurrent"]
        assert p.kv_cache == got["kv_cache"] and p.activations == got["activations"]


# ---------------------------------------------------------------- the multipliers, folded

def test_config_from_each_format_is_one_model(tmp_path):
    """The HF directory's config (multipliers folded into the weights) and its GGUF export's agree, no scale left."""
    for folder, norm, groups, heads, tied in (("falcon_h1", True, 2, 6, False), ("falcon_h1_nonorm", False, 1, 8, False)):
        gg = export(TINY / folder, tmp_path / f"{folder}.gguf", fmt="gguf")
        for path in (TINY / folder, gg):
            src = open_model(path)
            try:
                c = src.config
                assert c.layer_kinds == ["attn_mamba2"] * 3 and c.rope_neox is True
                assert (c.ssm_k_heads, c.ssm_v_heads, c.ssm_k_dim, c.ssm_v_dim, c.conv_kernel) == (groups, heads, 16, 16, 4)
                assert c.mamba_norm is norm and c.mamba_conv_bias is True     # a zero conv bias where none (llama.cpp)
                assert c.embed_scale is None and c.logit_scale == 1.0 and c.attn_scale is None
                assert c.tie_embeddings is tied or src.tensor("output.weight") is not None
            finally:
                src.close()


def test_the_multipliers_are_folded_where_llama_cpp_folds_them():
    """Each canonical tensor is the checkpoint's times its multipliers (in_proj by rows: mup_vector's z, x, B, C, dt)."""
    from llambda.formats.safetensors import open_safetensors_dir
    cfg = json.loads((TINY / "falcon_h1" / "config.json").read_text())
    st = open_safetensors_dir(TINY / "falcon_h1")
    src = open_model(TINY / "falcon_h1")
    try:
        raw = {n: t.to_float32() for n, t in st.tensors.items()}
        got = lambda name: src.tensor(name).to_float32()     # noqa: E731
        p, a, k = "model.layers.1.", cfg["attention_in_multiplier"], cfg["key_multiplier"]
        for canon, hf, scale in (("blk.1.attn_q.weight", "self_attn.q_proj", a), ("blk.1.attn_k.weight", "self_attn.k_proj", a * k),
                                 ("blk.1.attn_v.weight", "self_attn.v_proj", a),
                                 ("blk.1.attn_output.weight", "self_attn.o_proj", cfg["attention_out_multiplier"]),
                                 ("blk.1.ffn_gate.weight", "feed_forward.gate_proj", cfg["mlp_multipliers"][0]),
                                 ("blk.1.ffn_up.weight", "feed_forward.up_proj", 1.0),
                                 ("blk.1.ffn_down.weight", "feed_forward.down_proj", cfg["mlp_multipliers"][1]),
                                 ("blk.1.ssm_out.weight", "mamba.out_proj", cfg["ssm_out_multiplier"])):
            np.testing.assert_allclose(got(canon), raw[p + hf + ".weight"] * np.float32(scale), rtol=1e-6, err_msg=canon)
        rows = np.repeat(cfg["ssm_multipliers"], [96, 96, 32, 32, 6]) * cfg["ssm_in_multiplier"]
        np.testing.assert_allclose(got("blk.1.ssm_in.weight"), raw[p + "mamba.in_proj.weight"] * rows[:, None].astype(np.float32),
                                   rtol=1e-6)
        np.testing.assert_allclose(got("token_embd.weight"), raw["model.embed_tokens.weight"] * np.float32(1.5), rtol=1e-6)
        np.testing.assert_allclose(got("output.weight"), raw["lm_head.weight"] * np.float32(0.75), rtol=1e-6)
        np.testing.assert_array_equal(got("blk.1.ssm_norm.weight"), raw[p + "mamba.norm.weight"])
    finally:
        src.close()
        st.close()


def test_a_tied_head_stays_tied_when_both_multipliers_agree(tmp_path):
    path = edited(tmp_path, lambda c: c.update(lm_head_multiplier=1.5), "falcon_h1_nonorm")
    src = open_model(path)
    try:
        assert src.config.tie_embeddings and src.tensor("output.weight") is None
    finally:
        src.close()


def write_bf16_safetensors(arrays: dict, path: Path) -> None:
    """A safetensors file of BF16 tensors (numpy has no bfloat16: the header written by hand)."""
    from llambda.formats.quants import quantize
    header, blobs, at = {}, [], 0
    for name, a in arrays.items():
        raw = quantize(np.ascontiguousarray(a, np.float32).reshape(-1, a.shape[-1]), QType.BF16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_a_bf16_checkpoint_keeps_its_type_and_its_model(tmp_path):
    """Weights scaled in bfloat16 (rounded once more, as llama.cpp's converter does): BF16 still, the model close
    to the float32 one's (bfloat16's own rounding)."""
    from llambda.formats.safetensors import open_safetensors_dir
    d = tmp_path / "bf16"
    shutil.copytree(TINY / "falcon_h1", d)
    st = open_safetensors_dir(d)
    arrays = {n: t.to_float32() for n, t in st.tensors.items()}
    st.close()
    write_bf16_safetensors(arrays, d / "model.safetensors")
    src = open_model(d)
    try:
        for name in ("blk.0.ssm_in.weight", "blk.0.attn_k.weight", "token_embd.weight", "output.weight"):
            assert src.tensor(name).qtype == QType.BF16, name
    finally:
        src.close()
    ids = reference("falcon_h1")["inputs"][1]["input_ids"]
    with llambda.load(d, backend="numpy", n_ctx=64) as m, llambda.load(TINY / "falcon_h1", backend="numpy", n_ctx=64) as f:
        assert float(np.abs(m.logits(ids) - f.logits(ids)).max()) < 0.05


def test_scaled_tensors_keep_float_types_within_range():
    from llambda.formats.quants import quantize
    from llambda.formats.weights import WeightTensor
    from llambda.models.falcon_h1 import ScaledTensor
    w = np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)
    rows = np.array([1.0, 0.5, 3.0, -2.0], np.float32)
    bf = WeightTensor("w", QType.BF16, (4, 6), quantize(w, QType.BF16).reshape(-1))
    scaled = ScaledTensor(bf, rows)
    assert scaled.qtype == QType.BF16
    np.testing.assert_allclose(scaled.to_float32(), bf.to_float32() * rows[:, None], rtol=2 ** -8)
    part = scaled.take_rows([3, 1])           # only the rows taken, each by its own scale
    assert part.shape == (2, 6) and part.qtype == QType.BF16
    np.testing.assert_array_equal(part.to_float32(), scaled.to_float32()[[3, 1]])
    f16 = WeightTensor("h", QType.F16, (4, 6), quantize(w, QType.F16).reshape(-1))
    big = ScaledTensor(f16, 1e4)       # past float16's range: kept as float32
    assert big.qtype == QType.F32 and np.array_equal(big.to_float32(), f16.to_float32() * np.float32(1e4))
    huge = ScaledTensor(WeightTensor.from_float("x", np.full((2, 2), 3e38, np.float32)), 1e4)
    with pytest.raises(ModelFormatError, match="not finite"):
        huge.to_float32()


# ---------------------------------------------------------------- the GGUF as llama.cpp writes it

def test_gguf_export_holds_llama_cpps_names_and_keys(tmp_path):
    gg = export(TINY / "falcon_h1", tmp_path / "f.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        meta, shapes = f.metadata, {n: tuple(t.shape) for n, t in f.tensors.items()}
    assert meta["general.architecture"] == "falcon-h1"
    assert (meta["falcon-h1.ssm.inner_size"], meta["falcon-h1.ssm.time_step_rank"], meta["falcon-h1.ssm.group_count"],
            meta["falcon-h1.ssm.state_size"], meta["falcon-h1.ssm.conv_kernel"]) == (96, 6, 2, 16, 4)
    assert meta["falcon-h1.attention.key_length"] == 16
    assert "blk.0.ffn_norm" in shapes and "blk.0.ffn_norm.weight" not in shapes      # llama.cpp's name, no suffix
    assert shapes["blk.0.ssm_a"] == shapes["blk.0.ssm_d"] == (6, 1)
    assert shapes["blk.0.ssm_norm.weight"] == (2, 48) and shapes["blk.0.ssm_conv1d.weight"] == (160, 4)
    assert shapes["blk.0.ssm_in.weight"] == (2 * 96 + 2 * 32 + 6, 64) and "output.weight" in shapes


def bare_gguf(tmp_path, drop=lambda n: n.endswith("ssm_conv1d.bias")) -> tuple[Path, Path]:
    """(our export of falcon_h1_nonorm, that file without the tensors `drop` names)."""
    gg = export(TINY / "falcon_h1_nonorm", tmp_path / "f.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        meta, types = dict(f.metadata), f.metadata_types
        items = [(n, t.qtype, np.array(t.data).reshape(-1), tuple(t.shape)) for n, t in f.tensors.items()
                 if not drop(n)]
    bare = tmp_path / "bare.gguf"
    write_gguf(bare, meta, items, metadata_types=types)
    return gg, bare


def test_a_gguf_without_conv_bias_or_norm_runs_without_them(tmp_path):
    """What llama.cpp's loader takes as optional (ssm_conv1d.bias, ssm_norm): a file without them reads as a mixer
    without a norm and with zero conv biases (its export's zero conv biases dropped: the same logits)."""
    gg, bare = bare_gguf(tmp_path)
    ids = reference("falcon_h1_nonorm")["inputs"][0]["input_ids"]
    with llambda.load(bare, backend="numpy", n_ctx=32) as m, llambda.load(gg, backend="numpy", n_ctx=32) as w:
        assert m.config.mamba_conv_bias is True and m.config.mamba_norm is False
        np.testing.assert_array_equal(m.logits(ids), w.logits(ids))


def test_a_gguf_without_conv_biases_exports_with_zero_ones(tmp_path):
    """llama.cpp's falcon-h1 adds the conv bias whether the file holds it or not (a file without: a segmentation
    fault): the export of a file without them holds zero ones, as the export of a HF checkpoint without them does,
    and runs there. A file holding some layers' biases and not others' is refused naming a missing one."""
    _, bare = bare_gguf(tmp_path)
    again = export(bare, tmp_path / "again.gguf", fmt="gguf")
    with GGUFFile(again) as f:
        for i in range(3):
            assert not np.asarray(f.tensors[f"blk.{i}.ssm_conv1d.bias"].data).any()
    ids = reference("falcon_h1_nonorm")["inputs"][0]["input_ids"]
    with llambda.load(bare, backend="numpy", n_ctx=32) as m, llambda.load(again, backend="numpy", n_ctx=32) as w:
        np.testing.assert_array_equal(m.logits(ids), w.logits(ids))
    _, some = bare_gguf(tmp_path, drop=lambda n: n == "blk.1.ssm_conv1d.bias")
    with pytest.raises(ModelFormatError, match="blk.1.ssm_conv1d.bias"):
        llambda.load(some, backend="numpy", n_ctx=32)
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    assert float(np.abs(llama_cpp_logits(again, ids) - numpy_logits(again, ids)).max()) <= 0.05


def numpy_logits(path, ids) -> np.ndarray:
    with llambda.load(path, backend="numpy", n_ctx=32) as m:
        return m.logits(ids)


def converter_gguf(folder: str, out: Path) -> Path:
    """The tiny model as llama.cpp's converter writes a falcon-h1 GGUF, made here from its facts, not by our
    exporter: every multiplier folded into its weight (in_proj by row), A as -exp(A_log) and D as (H, 1)
    columns, the norm as (groups, d_ssm / groups), conv kernels squeezed, the MLP's norm `blk.N.ffn_norm`."""
    from llambda.formats.safetensors import open_safetensors_dir
    cfg = json.loads((TINY / folder / "config.json").read_text())
    st = open_safetensors_dir(TINY / folder)
    w = {n: t.to_float32().reshape(t.shape) for n, t in st.tensors.items()}
    st.close()
    d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    d_ssm = cfg["mamba_d_ssm"] or cfg["mamba_expand"] * d
    heads, groups, N = cfg["mamba_n_heads"], cfg["mamba_n_groups"], cfg["mamba_d_state"]
    a_in, ssm = cfg["attention_in_multiplier"], cfg["ssm_multipliers"]
    rows = cfg["ssm_in_multiplier"] * np.repeat(ssm, [d_ssm, d_ssm, groups * N, groups * N, heads])
    t = {"token_embd.weight": w["model.embed_tokens.weight"] * cfg["embedding_multiplier"],
         "output_norm.weight": w["model.final_layernorm.weight"],
         "output.weight": w.get("lm_head.weight", w["model.embed_tokens.weight"]) * cfg["lm_head_multiplier"]}
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        t.update({b + "attn_norm.weight": w[p + "input_layernorm.weight"], b + "ffn_norm": w[p + "pre_ff_layernorm.weight"],
                  b + "attn_q.weight": w[p + "self_attn.q_proj.weight"] * a_in,
                  b + "attn_k.weight": w[p + "self_attn.k_proj.weight"] * a_in * cfg["key_multiplier"],
                  b + "attn_v.weight": w[p + "self_attn.v_proj.weight"] * a_in,
                  b + "attn_output.weight": w[p + "self_attn.o_proj.weight"] * cfg["attention_out_multiplier"],
                  b + "ffn_gate.weight": w[p + "feed_forward.gate_proj.weight"] * cfg["mlp_multipliers"][0],
                  b + "ffn_up.weight": w[p + "feed_forward.up_proj.weight"],
                  b + "ffn_down.weight": w[p + "feed_forward.down_proj.weight"] * cfg["mlp_multipliers"][1],
                  b + "ssm_in.weight": w[p + "mamba.in_proj.weight"] * rows[:, None],
                  b + "ssm_conv1d.weight": w[p + "mamba.conv1d.weight"][:, 0, :],
                  b + "ssm_dt.bias": w[p + "mamba.dt_bias"], b + "ssm_a": -np.exp(w[p + "mamba.A_log"])[:, None],
                  b + "ssm_d": w[p + "mamba.D"][:, None],
                  b + "ssm_out.weight": w[p + "mamba.out_proj.weight"] * cfg["ssm_out_multiplier"]})
        if p + "mamba.conv1d.bias" in w:
            t[b + "ssm_conv1d.bias"] = w[p + "mamba.conv1d.bias"]
        if p + "mamba.norm.weight" in w:
            t[b + "ssm_norm.weight"] = w[p + "mamba.norm.weight"].reshape(groups, -1)
    a = "falcon-h1"
    meta = {"general.architecture": a, f"{a}.block_count": L, f"{a}.context_length": cfg["max_position_embeddings"],
            f"{a}.embedding_length": d, f"{a}.feed_forward_length": cfg["intermediate_size"],
            f"{a}.attention.head_count": cfg["num_attention_heads"],
            f"{a}.attention.head_count_kv": cfg["num_key_value_heads"], f"{a}.attention.key_length": cfg["head_dim"],
            f"{a}.attention.value_length": cfg["head_dim"], f"{a}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"],
            f"{a}.rope.freq_base": cfg["rope_parameters"]["rope_theta"], f"{a}.ssm.conv_kernel": cfg["mamba_d_conv"],
            f"{a}.ssm.inner_size": d_ssm, f"{a}.ssm.state_size": N, f"{a}.ssm.time_step_rank": heads,
            f"{a}.ssm.group_count": groups, f"{a}.vocab_size": cfg["vocab_size"], "tokenizer.ggml.model": "none"}
    write_gguf(out, meta, {n: (QType.F32, np.ascontiguousarray(v, np.float32)) for n, v in t.items()})
    return out


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_gguf_as_llama_cpps_converter_writes_it_matches_transformers(folder, tmp_path):
    gg = converter_gguf(folder, tmp_path / "c.gguf")
    ref = reference(folder)["inputs"][1]
    want = np.array(ref["logits_last3"][-1], np.float32)
    with llambda.load(gg, backend="numpy", n_ctx=64) as m:
        # a file without conv biases reads as zero ones (an export then holds them: llama.cpp needs them)
        assert m.config.mamba_conv_bias is True and m.config.mamba_norm is (folder == "falcon_h1")
        got = m.logits(ref["input_ids"])
    assert float(np.abs(got - want).max()) <= 1e-4


def test_llama_cpp_runs_the_converters_layout_as_we_do(tmp_path):
    """The converter-style file in llama.cpp (the folder with a conv bias: llama.cpp's falcon-h1 needs one)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    gg = converter_gguf("falcon_h1", tmp_path / "c.gguf")
    ids = reference("falcon_h1")["inputs"][1]["input_ids"][:12]
    with llambda.load(gg, backend="numpy", n_ctx=64) as m:
        ours = m.logits(ids)
    assert float(np.abs(llama_cpp_logits(gg, ids) - ours).max()) <= 0.05


def gguf_edit(tmp_path, edit) -> Path:
    gg = export(TINY / "falcon_h1", tmp_path / "f.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        meta, types = dict(f.metadata), f.metadata_types
        items = [(n, t.qtype, np.array(t.data).reshape(-1), tuple(t.shape)) for n, t in f.tensors.items()]
    edit(meta)
    out = tmp_path / "bad.gguf"
    write_gguf(out, meta, items, metadata_types={k: v for k, v in types.items() if k in meta})
    return out


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update({"falcon-h1.ssm.inner_size": 100}), "inner_size"),
    (lambda m: m.pop("falcon-h1.ssm.time_step_rank"), "time_step_rank"),
    (lambda m: m.update({"falcon-h1.ssm.state_size": 1 << 20}), "state_size"),
    (lambda m: m.update({"falcon-h1.ssm.group_count": 4}), "multiple of its groups"),
])
def test_bad_gguf_metadata_is_a_model_format_error(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(gguf_edit(tmp_path, edit), backend="numpy", n_ctx=32)


# ---------------------------------------------------------------- malformed configs

@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(mamba_n_heads=7), "mamba_n_heads"),
    (lambda c: c.update(mamba_d_ssm=100), "mamba_d_ssm"),
    (lambda c: c.update(mamba_d_ssm="96"), "mamba_d_ssm"),
    (lambda c: c.update(mamba_n_groups=4), "multiple of its groups"),
    (lambda c: c.update(mamba_d_state=0), "Mamba2 layers need"),
    (lambda c: c.update(mamba_d_conv=1), "kernel of at least 2"),
    (lambda c: c.update(ssm_multipliers=[1.0, 1.0]), "ssm_multipliers"),
    (lambda c: c.update(ssm_multipliers=[1.0, 1.0, "x", 1.0, 1.0]), "ssm_multipliers"),
    (lambda c: c.update(mlp_multipliers=1.0), "mlp_multipliers"),
    (lambda c: c.update(key_multiplier=float("nan")), "key_multiplier"),
    (lambda c: c.update(embedding_multiplier=1e9), "embedding_multiplier"),
    (lambda c: c.update(lm_head_multiplier="big"), "lm_head_multiplier"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(projectors_bias=True), "projectors_bias"),
    (lambda c: c.update(attention_bias=True), "attention_bias"),
    (lambda c: c.update(mamba_norm_before_gate=True), "mamba_norm_before_gate"),
    (lambda c: c.pop("mamba_norm_before_gate"), "mamba_norm_before_gate"),       # transformers' default: true
    (lambda c: c.update(time_step_limit=[0.0, 5.0]), "time_step_limit"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
    (lambda c: c.pop("hidden_size"), "hidden_size"),
    (lambda c: c.update(mamba_conv_bias=False), "mamba_conv_bias false"),       # the checkpoint holds the biases
])
def test_bad_configs_are_model_format_errors(tmp_path, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited(tmp_path, edit), backend="numpy", n_ctx=32)


def test_a_missing_mixer_tensor_is_named(tmp_path):
    from safetensors.numpy import save_file
    from llambda.formats.safetensors import open_safetensors_dir
    d = tmp_path / "m"
    shutil.copytree(TINY / "falcon_h1", d)
    st = open_safetensors_dir(d)
    arrays = {n: t.to_float32() for n, t in st.tensors.items() if n != "model.layers.2.mamba.norm.weight"}
    st.close()
    save_file(arrays, str(d / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="model.layers.2.mamba.norm.weight"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_zero_conv_biases_take_one_layers_memory_whatever_the_config_says(tmp_path):
    """mamba_conv_bias false: the zero biases llama.cpp needs are made before any tensor is checked against the
    config, so they must not cost n_layers of them. A checkpoint without in_proj (nothing to check its sizes
    against) under a config of 512 layers of 4 MB biases (2 GiB as one array a layer) is refused without them."""
    import tracemalloc
    from llambda.errors import LlambdaError
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = tmp_path / "m"
    shutil.copytree(TINY / "falcon_h1", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(num_hidden_layers=512, mamba_conv_bias=False, mamba_n_groups=1, mamba_d_state=1024,
               mamba_n_heads=4096, mamba_d_head=256, mamba_d_ssm=1 << 20)
    (d / "config.json").write_text(json.dumps(cfg))
    with SafetensorsFile(TINY / "falcon_h1" / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()
                  if not n.endswith(("mamba.in_proj.weight", "mamba.conv1d.bias"))}
    write_safetensors(d / "model.safetensors", arrays)
    tracemalloc.start()
    try:
        with pytest.raises(LlambdaError):
            llambda.load(d, backend="numpy", n_ctx=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20, f"{peak / 2 ** 20:.0f} MiB traced"


def test_lora_adapters_are_refused(tmp_path):
    """An adapter's update adds to the checkpoint's W; this model holds W times its multipliers: refused, not
    merged wrong (PEFT's, on the HF directory and on its GGUF)."""
    from llambda.errors import AdapterError
    from test_lora import write_peft
    rng = np.random.default_rng(3)
    pairs = {"model.layers.0.self_attn.q_proj": (rng.standard_normal((4, 64)).astype(np.float32),
                                                 rng.standard_normal((64, 4)).astype(np.float32))}
    lora = str(write_peft(tmp_path / "peft", pairs, 8))
    gg = export(TINY / "falcon_h1", tmp_path / "f.gguf", fmt="gguf")
    for base in (TINY / "falcon_h1", gg):
        with pytest.raises(AdapterError, match="not supported"):
            llambda.load(base, backend="numpy", n_ctx=32, lora=lora)


def test_a_gguf_without_a_mixer_tensor_is_refused_by_name(tmp_path):
    gg = export(TINY / "falcon_h1", tmp_path / "f.gguf", fmt="gguf")
    with GGUFFile(gg) as f:
        meta, types = dict(f.metadata), f.metadata_types
        items = [(n, t.qtype, np.array(t.data).reshape(-1), tuple(t.shape)) for n, t in f.tensors.items()
                 if n != "blk.1.ssm_in.weight"]
    bad = tmp_path / "bad.gguf"
    write_gguf(bad, meta, items, metadata_types=types)
    with pytest.raises(ModelFormatError, match="blk.1.ssm_in.weight"):
        llambda.load(bad, backend="numpy", n_ctx=32)


def test_a_hugging_face_export_is_refused(tmp_path):
    from llambda.errors import LlambdaError
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "falcon_h1", tmp_path / "hf", fmt="hf")

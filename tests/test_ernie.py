"""ERNIE 4.5 dense (`ernie4_5`) and MoE (`ernie4_5_moe`; llama.cpp's `ernie4_5-moe`).

The tiny references (fixtures/reference/tiny/ernie4_5 and ernie4_5_moe, made by tools/make_tiny_ernie.py;
README_ernie.md there) are run from their HF directories by test_tiny_models.py with every other folder, and
exported and run in llama.cpp by test_export.py. Here: our GGUF export on every backend against transformers;
decode steps through the KV cache against one full forward; the settings each format yields; the RoPE pairs
and the choice bias as controls; MoE layers placed by start, end and interval; the multi-token-prediction
tensors skipped; refusals of what is not supported.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.tools.export import export
# the GLM tests' helpers, budgets per backend and module-scoped f32 exports, which serve any tiny folder
from test_glm import MODES, exported, last_rows, load, max_err, reference  # noqa: F401  (exported: a fixture)

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDERS = ["ernie4_5", "ernie4_5_moe"]
GGUF_ARCH = {"ernie4_5": "ernie4_5", "ernie4_5_moe": "ernie4_5-moe"}


def all_logits(m, ids) -> np.ndarray:
    """Every position's logits from one forward of `ids` (slot 0, positions from 0)."""
    n = len(ids)
    return m.transformer.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int32),
                                 np.arange(n)).copy()


def copy_folder(folder: str, dest: Path) -> Path:
    shutil.copytree(TINY / folder, dest)
    return dest


def edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


def arrays_of(d: Path) -> dict:
    with SafetensorsFile(d / "model.safetensors") as st:
        return {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}


# ---------------------------------------------------------------- against transformers

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_our_gguf_matches_transformers(exported, folder, mode):
    ref = reference(folder)
    with load(exported(folder), mode) as m:
        assert m.config.arch == folder
        assert max_err(m, folder) <= MODES[mode][2]
        inp = ref["inputs"][2]
        assert list(m.generate(inp["input_ids"], max_tokens=16, temperature=0, ignore_eos=True)) == \
            inp["greedy_new_tokens"]


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_steps_through_the_cache_equal_a_full_forward(folder, mode):
    """A prefill of 60 tokens, then 40 single-token steps through the KV cache: each step's logits are the
    full forward's row at that position (the MoE routes each row alone either way)."""
    ids = reference(folder)["inputs"][2]["input_ids"]
    with load(TINY / folder, mode) as m:
        full = all_logits(m, ids)
        tr, k = m.transformer, 60
        tr.forward(np.array(ids[:k], np.int32), np.zeros(k, np.int32), np.arange(k, dtype=np.int32), np.array([k - 1]))
        for p in range(k, len(ids)):
            row = tr.forward(np.array([ids[p]], np.int32), np.zeros(1, np.int32), np.array([p], np.int32),
                             np.array([0]))[0]
            np.testing.assert_allclose(row, full[p], atol=1e-4, rtol=0, err_msg=f"position {p}")


# max |logit diff| of fast mode (8-bit activations) against the NumPy oracle on Q8_0 weights: on the shortest
# input, and on all three. Measured 0.50 / 1.06 (dense, logits' std 4) and 0.16 / 2.82 (MoE, std 2.5, where
# the rounding flips close expert choices on the longer inputs); llama.cpp on our Q8_0 export parts from the
# same oracle by as much (1.04 on the dense model's first 60 tokens of input 1), so it is these random
# models' sensitivity, not the kernels'.
FAST_Q8 = {"ernie4_5": (0.75, 1.5), "ernie4_5_moe": (0.5, 3.5)}


@pytest.mark.parametrize("folder", FOLDERS)
def test_quantized_native_matches_numpy(folder):
    """Q8_0 weights (quantized at load), so the quantized kernels run the ERNIE branches (adjacent-pair RoPE;
    softmax routing with a choice bias and shared experts) against the NumPy oracle on the same weights: exact
    mode within the float budget, fast mode within FAST_Q8."""
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    outs = {}
    for backend, act in (("numpy", None), ("native", "f32"), ("native", "q8")):
        with llambda.load(TINY / folder, backend=backend, activations=act, n_ctx=128, quantize="q8_0") as m:
            outs[act] = [last_rows(m, inp) for inp in reference(folder)["inputs"]]
    errs = {act: [float(np.abs(a - b).max()) for a, b in zip(outs[act], outs[None])] for act in ("f32", "q8")}
    short, every = FAST_Q8[folder]
    assert max(errs["f32"]) <= 1e-3 and errs["q8"][0] <= short and max(errs["q8"]) <= every, errs


def test_moe_on_every_isa_and_batch_invariant(isa):
    """The MoE model on each ISA path (exact mode against transformers); and with batch invariance on, a decode
    step of one sequence alone or beside another gives the same bits (Q8_0 weights, fast mode)."""
    if "native" not in available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    from llambda import _native
    inp = reference("ernie4_5_moe")["inputs"][1]
    with llambda.load(TINY / "ernie4_5_moe", backend="native", activations="f32", n_ctx=128) as m:
        assert max_err(m, "ernie4_5_moe") <= 1e-3
    before = _native.batch_invariant()
    _native.set_batch_invariant(True)
    try:
        with llambda.load(TINY / "ernie4_5_moe", backend="native", activations="q8", n_ctx=64, n_slots=2,
                          quantize="q8_0") as m:
            tr, ids = m.transformer, np.array(inp["input_ids"][:21], np.int32)
            # both slots filled in one batch (slot 1 with the prefix reversed), then slot 0's step alone or paired
            tr.forward(np.concatenate([ids[:20], ids[19::-1]]), np.repeat(np.arange(2, dtype=np.int32), 20),
                       np.tile(np.arange(20, dtype=np.int32), 2), [19, 39])
            step = [tr.forward(ids[20:21], [0], [20], [0])[0].copy(),
                    tr.forward(ids[[20, 3]], [0, 1], [20, 20], [0, 1])[0].copy()]
            assert np.array_equal(step[0], step[1])
    finally:
        _native.set_batch_invariant(before)


def test_q8_0_gguf_keeps_the_router_and_bias_in_float(tmp_path):
    """A Q8_0 export quantizes the experts, not the router nor its choice bias; native exact runs it as the
    NumPy oracle does."""
    from llambda.formats.quants import QType
    q8 = export(TINY / "ernie4_5_moe", tmp_path / "q8.gguf", fmt="gguf", qtype="q8_0")
    with GGUFFile(q8) as f:
        t = f.tensors
        assert t["blk.1.ffn_up_exps.weight"].qtype == QType.Q8_0 and t["blk.1.ffn_gate_shexp.weight"].qtype == QType.Q8_0
        assert t["blk.1.ffn_gate_inp.weight"].qtype == QType.F32 and t["blk.1.exp_probs_b.bias"].qtype == QType.F32
    ids = reference("ernie4_5_moe")["inputs"][2]["input_ids"]
    rows = {}
    for mode in ("numpy", "native-exact"):
        with load(q8, mode) as m:
            rows[mode] = m.logits(ids)
    assert float(np.abs(rows["native-exact"] - rows["numpy"]).max()) <= 1e-3


# ---------------------------------------------------------------- settings

@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(exported, folder):
    """The same model from config.json and from llama.cpp's GGUF keys (and, for the choice bias, the tensors a
    GGUF holds): RoPE in adjacent pairs on every dim in both, theta 500000."""
    a = GGUF_ARCH[folder]
    with GGUFFile(exported(folder)) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == a and meta[f"{a}.rope.dimension_count"] == 16
    assert meta[f"{a}.rope.freq_base"] == 500000.0
    if folder == "ernie4_5_moe":
        assert (meta[f"{a}.leading_dense_block_count"], meta[f"{a}.interleave_moe_layer_step"],
                meta[f"{a}.expert_shared_feed_forward_length"], meta[f"{a}.expert_shared_count"]) == (1, 1, 32, 2)
        assert {"blk.1.exp_probs_b.bias", "blk.1.ffn_gate_shexp.weight", "blk.0.ffn_gate.weight"} <= names
        assert "blk.0.ffn_gate_inp.weight" not in names and "output.weight" in names     # untied
    else:
        assert "output.weight" not in names          # tied
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            c = m.config
        assert (c.rope_neox, c.rope_dim, c.head_dim, c.rope_theta, c.attn_bias) == (False, 16, 16, 500000.0, False)
        if folder == "ernie4_5":
            assert (c.n_experts, c.tie_embeddings, c.n_layers) == (0, True, 3), path
        else:
            assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.shared_ffn_dim) == (8, 2, 16, 32), path
            assert (c.moe_routing, c.moe_choice_bias, c.moe_norm_topk, c.moe_scale) == ("softmax_topk", True, True, 1.0)
            assert c.moe_layers == [False, True, True, True], path


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_rope_pairs_are_the_adjacent_ones(exported, folder):
    """The control: the same weights, from either format, run with half-split pairs are another model."""
    for path in (TINY / folder, exported(folder)):
        with llambda.load(path, backend="numpy", n_ctx=128) as m:
            assert not m.config.rope_neox and max_err(m, folder) <= 1e-3
            m.transformer.cfg.rope_neox = True
            assert max_err(m, folder) > 0.05, path


def test_the_choice_bias_picks_the_experts_and_does_not_weigh_them(tmp_path):
    """The controls: without the correction bias, and with it added to the weights as well as to the choice,
    the model is another one (the fixture's bias changes 70 of 441 choices)."""
    d = copy_folder("ernie4_5_moe", tmp_path / "m")
    arrays = arrays_of(d)
    zero = {n: (np.zeros_like(a) if n.endswith("e_score_correction_bias") else a) for n, a in arrays.items()}
    write_safetensors(d / "model.safetensors", zero)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "ernie4_5_moe") > 0.05
    from llambda.backends import numpy_ref
    real = numpy_ref._route_general

    def weighed(logits, k, routing, norm, groups, scale, bias):     # the bias in the weights too
        ids, _ = real(logits, k, routing, norm, groups, scale, bias)
        e = np.exp(logits - logits.max(-1, keepdims=True))
        w = np.take_along_axis(e / e.sum(-1, keepdims=True) + bias, ids, axis=-1)
        return ids, (w / w.sum(-1, keepdims=True)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numpy_ref, "_route_general", weighed)
        with llambda.load(TINY / "ernie4_5_moe", backend="numpy", n_ctx=128) as m:
            assert max_err(m, "ernie4_5_moe") > 1e-2


def test_moe_layers_by_start_end_and_interval(tmp_path):
    """Layer i is MoE when start <= i <= end and (i + 1) % interval == 0. A checkpoint whose layer 2 is dense
    (interval 2: layers 1 and 3 MoE) runs from its HF directory and from our GGUF alike, the GGUF saying
    interleave_moe_layer_step 2; an end index before the last layer cannot be said in a GGUF."""
    from llambda.models.ernie4_5_moe import config_from_hf
    cfg = json.loads((TINY / "ernie4_5_moe" / "config.json").read_text())
    for changes, flags in (({}, [False, True, True, True]), ({"moe_layer_interval": 2}, [False, True, False, True]),
                           ({"moe_layer_end_index": 2}, [False, True, True, False]),
                           ({"moe_layer_start_index": 0, "moe_layer_end_index": -1}, [True] * 4),
                           ({"moe_layer_start_index": 3, "moe_layer_interval": 2}, [False, False, False, True])):
        assert config_from_hf({**cfg, **changes}).moe_layers == flags, changes
    d = copy_folder("ernie4_5_moe", tmp_path / "m")
    arrays = {n: a for n, a in arrays_of(d).items() if not n.startswith("model.layers.2.mlp.")}
    arrays.update({n.replace("layers.0.", "layers.2."): a * 0.5 for n, a in arrays.items()
                   if n.startswith("model.layers.0.mlp.")})
    write_safetensors(d / "model.safetensors", arrays)
    edit_config(d, moe_layer_interval=2)
    ids = reference("ernie4_5_moe")["inputs"][1]["input_ids"]
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.moe_layers == [False, True, False, True]
        hf = m.logits(ids)
        assert float(np.abs(hf - np.array(reference("ernie4_5_moe")["inputs"][1]["logits_last3"][-1])).max()) > 0.05
    gg = export(d, tmp_path / "step2.gguf", fmt="gguf", qtype="f32")
    with GGUFFile(gg) as f:
        assert f.metadata["ernie4_5-moe.interleave_moe_layer_step"] == 2
        assert "blk.2.ffn_gate.weight" in f.tensors and "blk.2.ffn_gate_inp.weight" not in f.tensors
    with llambda.load(gg, backend="numpy", n_ctx=128) as m:
        assert m.config.moe_layers == [False, True, False, True]
        np.testing.assert_allclose(m.logits(ids), hf, atol=1e-4, rtol=0)
    edit_config(d, moe_layer_interval=1, moe_layer_end_index=2)        # layer 3 dense instead
    arrays = {n: a for n, a in arrays_of(TINY / "ernie4_5_moe").items() if not n.startswith("model.layers.3.mlp.")}
    arrays.update({n.replace("layers.0.", "layers.3."): a for n, a in arrays.items()
                   if n.startswith("model.layers.0.mlp.")})
    write_safetensors(d / "model.safetensors", arrays)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.moe_layers == [False, True, True, False]
        m.logits(ids[:8])
    with pytest.raises(ModelFormatError, match="interleave step"):
        export(d, tmp_path / "end.gguf", fmt="gguf")


def test_mtp_tensors_of_a_hub_checkpoint_are_skipped(tmp_path):
    """ERNIE-4.5-21B-A3B's checkpoint holds a multi-token-prediction block outside model.layers
    (model.mtp_block.0.*, mtp_emb_norm, mtp_hidden_norm, mtp_linear_proj): not run, passed over."""
    d = copy_folder("ernie4_5_moe", tmp_path / "m")
    arrays = arrays_of(d)
    rng = np.random.default_rng(11)
    extra = {n.replace("model.layers.3.", "model.mtp_block.0."): a + 1.0 for n, a in arrays.items()
             if n.startswith("model.layers.3.")}
    extra.update({"model.mtp_emb_norm.0.weight": np.ones(64, np.float32),
                  "model.mtp_hidden_norm.0.weight": np.ones(64, np.float32),
                  "model.mtp_linear_proj.0.weight": rng.standard_normal((64, 128)).astype(np.float32)})
    write_safetensors(d / "model.safetensors", {**arrays, **extra})
    edit_config(d, num_nextn_predict_layers=1)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert m.config.n_layers == 4 and max_err(m, "ernie4_5_moe") <= 1e-3


def test_the_bias_under_transformers_in_memory_name(tmp_path):
    """The choice bias as transformers 5 names it in memory (mlp.gate.moe_statics.*) reads as the Hub's name
    does; a checkpoint holding both for one layer is refused, not read twice."""
    d = copy_folder("ernie4_5_moe", tmp_path / "m")
    arrays = arrays_of(d)
    moved = {n.replace("mlp.moe_statics.", "mlp.gate.moe_statics."): a for n, a in arrays.items()}
    write_safetensors(d / "model.safetensors", moved)
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        assert max_err(m, "ernie4_5_moe") <= 1e-3
    write_safetensors(d / "model.safetensors", {**arrays, **moved})
    with pytest.raises(ModelFormatError, match="second tensor"):
        llambda.load(d, backend="numpy", n_ctx=32)


# ---------------------------------------------------------------- GGUF files as llama.cpp has them

def _gguf_edit(src: Path, out: Path, drop=(), **keys) -> Path:
    """src with metadata `keys` (ernie4_5-moe's / ernie4_5's, `__` for a dot; None drops one) and without the
    tensors whose names end with any of `drop`."""
    with GGUFFile(src) as f:
        arch = f.metadata["general.architecture"]
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()
                 if not t.name.endswith(tuple(drop))]
    for k, v in keys.items():
        key = f"{arch}.{k.replace('__', '.')}"
        if v is None:
            meta.pop(key, None)
        else:
            kind = GGUFValueType.BOOL if isinstance(v, bool) else GGUFValueType.FLOAT32 if isinstance(v, float) \
                else GGUFValueType.UINT32
            meta[key] = GGUFValue(kind, v)
    write_gguf(out, meta, items)
    return out


def test_a_gguf_without_the_choice_bias_routes_without_one(exported, tmp_path):
    """llama.cpp's exp_probs_b is optional: a file without it chooses by the softmax alone (as our checkpoint
    with a zero bias does)."""
    path = _gguf_edit(exported("ernie4_5_moe"), tmp_path / "nobias.gguf", drop=("exp_probs_b.bias",))
    with llambda.load(path, backend="numpy", n_ctx=128) as m:
        assert not m.config.moe_choice_bias
        ids = reference("ernie4_5_moe")["inputs"][1]["input_ids"]
        plain = m.logits(ids)
    d = copy_folder("ernie4_5_moe", tmp_path / "m")
    write_safetensors(d / "model.safetensors", {n: (np.zeros_like(a) if n.endswith("correction_bias") else a)
                                                for n, a in arrays_of(d).items()})
    with llambda.load(d, backend="numpy", n_ctx=128) as m:
        np.testing.assert_allclose(plain, m.logits(ids), atol=1e-4, rtol=0)


def test_gguf_shared_count_and_weights_norm_as_written_or_absent(exported, tmp_path):
    """Our export writes expert_weights_norm true and expert_shared_count 2 (x 16 = the width 32); llama.cpp's
    converter writes the count and no norm flag: each way the file runs as the checkpoint."""
    src = exported("ernie4_5_moe")
    with GGUFFile(src) as f:
        assert f.metadata["ernie4_5-moe.expert_weights_norm"] is True
        assert f.metadata["ernie4_5-moe.expert_shared_count"] == 2
        assert f.metadata["ernie4_5-moe.expert_shared_feed_forward_length"] == 32
    ids = reference("ernie4_5_moe")["inputs"][0]["input_ids"]
    with llambda.load(src, backend="numpy", n_ctx=64) as m:
        want = m.logits(ids)
    for name, keys in (("bare", {"expert_weights_norm": None, "expert_shared_count": None}),
                       ("counted", {"expert_weights_norm": True, "expert_shared_count": 2})):
        with llambda.load(_gguf_edit(src, tmp_path / f"{name}.gguf", **keys), backend="numpy", n_ctx=64) as m:
            assert m.config.moe_norm_topk and m.config.shared_ffn_dim == 32
            np.testing.assert_array_equal(m.logits(ids), want)


@pytest.mark.parametrize("folder", FOLDERS)
def test_gguf_qkv_biases_are_read_as_llama_cpp_reads_them(exported, tmp_path, folder):
    """llama.cpp's ernie4_5 graphs add optional q/k/v biases (no key says so): a file holding them runs with them
    here too (the logits move), and llama.cpp, an independent reader, agrees with us on it."""
    with GGUFFile(exported(folder)) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
        n = f.metadata[f"{GGUF_ARCH[folder]}.block_count"]
    from llambda.formats.quants import QType
    rng = np.random.default_rng(23)
    for i in range(n):
        for leaf, rows in (("attn_q", 64), ("attn_k", 32), ("attn_v", 32)):
            b = (0.5 * rng.standard_normal(rows)).astype(np.float32)
            items.append((f"blk.{i}.{leaf}.bias", QType.F32, b.view(np.uint8), (rows,)))
    path = tmp_path / "biased.gguf"
    write_gguf(path, meta, items)
    ids = reference(folder)["inputs"][0]["input_ids"]
    with llambda.load(path, backend="numpy", n_ctx=64) as m, llambda.load(exported(folder), backend="numpy",
                                                                          n_ctx=64) as plain:
        assert m.config.attn_bias
        ours = m.logits(ids)
        assert float(np.abs(ours - plain.logits(ids)).max()) > 0.05
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from llamacpp_ref import llama_cpp_logits
    assert float(np.abs(ours - llama_cpp_logits(path, ids)).max()) <= 0.05


@pytest.mark.parametrize("folder, keys, drop, message", [
    ("ernie4_5", {"rope__dimension_count": 8}, (), "rope.dimension_count"),
    ("ernie4_5_moe", {"rope__dimension_count": 8}, (), "rope.dimension_count"),
    ("ernie4_5_moe", {"expert_weights_scale": 2.5}, (), "expert_weights_scale"),
    ("ernie4_5_moe", {"interleave_moe_layer_step": None}, (), "interleave_moe_layer_step"),
    ("ernie4_5_moe", {"interleave_moe_layer_step": 0}, (), "interleave_moe_layer_step"),
    ("ernie4_5_moe", {"leading_dense_block_count": None}, (), "leading_dense_block_count"),
    ("ernie4_5_moe", {"expert_feed_forward_length": None}, (), "expert_feed_forward_length"),
    ("ernie4_5_moe", {"expert_used_count": 9}, (), "expert_used_count"),
    # the shared experts' tensors without their width: llama.cpp would run without them; they are not unread here
    ("ernie4_5_moe", {"expert_shared_feed_forward_length": None, "expert_shared_count": None}, (), "shexp"),
    # the count llama.cpp's converter writes beside the width (llama.cpp reads neither it nor the norm flag)
    ("ernie4_5_moe", {"expert_shared_feed_forward_length": None}, (), "expert_shared_count"),
    ("ernie4_5_moe", {"expert_shared_count": 3}, (), "expert_shared_count"),
    ("ernie4_5_moe", {"expert_shared_count": 0}, (), "expert_shared_count"),
    ("ernie4_5_moe", {"expert_weights_norm": False}, (), "expert_weights_norm"),
    ("ernie4_5_moe", {}, ("blk.2.ffn_down_exps.weight",), "blk.2.ffn_down_exps"),
])
def test_bad_gguf_settings_are_model_format_errors(exported, tmp_path, folder, keys, drop, message):
    path = _gguf_edit(exported(folder), tmp_path / "bad.gguf", drop=drop, **keys)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(path, backend="numpy", n_ctx=32)


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("folder, changes, message", [
    ("ernie4_5", {"use_bias": True}, "use_bias"),
    ("ernie4_5", {"use_bias": "no"}, "use_bias"),
    ("ernie4_5", {"head_dim": None}, "head_dim"),          # transformers reads 128, the quotient is 16
    ("ernie4_5", {"hidden_act": "gelu"}, "hidden_act"),
    ("ernie4_5", {"num_attention_heads": 0}, "num_attention_heads"),
    ("ernie4_5_moe", {"moe_gate_act": "sigmoid"}, "moe_gate_act"),
    ("ernie4_5_moe", {"moe_norm_min": 0.5}, "moe_norm_min"),
    ("ernie4_5_moe", {"moe_norm_min": "tiny"}, "moe_norm_min"),
    ("ernie4_5_moe", {"moe_layer_end_index": 9}, "moe_layer_end_index"),
    ("ernie4_5_moe", {"moe_layer_end_index": -2}, "moe_layer_end_index"),
    ("ernie4_5_moe", {"moe_layer_interval": 0}, "moe_layer_interval"),
    ("ernie4_5_moe", {"moe_layer_start_index": -1}, "moe_layer_start_index"),
    ("ernie4_5_moe", {"moe_layer_start_index": [1, 1]}, "moe_layer_start_index"),   # the VL configs' per-modality lists
    ("ernie4_5_moe", {"moe_num_experts": [8, 8]}, "moe_num_experts"),
    ("ernie4_5_moe", {"moe_k": None}, "moe_k"),
    ("ernie4_5_moe", {"moe_k": 20}, "moe_k"),
    ("ernie4_5_moe", {"moe_k": 0}, "moe_k"),
    ("ernie4_5_moe", {"moe_intermediate_size": None}, "moe_intermediate_size"),
    ("ernie4_5_moe", {"moe_num_shared_experts": -1}, "moe_num_shared_experts"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, changes, message):
    d = copy_folder(folder, tmp_path / "m")
    edit_config(d, **changes)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_missing_choice_bias_or_shared_expert_is_named(tmp_path):
    """A checkpoint without a layer's moe_statics or shared expert is refused by the checkpoint's names."""
    for gone in ("model.layers.2.mlp.moe_statics.e_score_correction_bias",
                 "model.layers.3.mlp.shared_experts.down_proj.weight"):
        d = copy_folder("ernie4_5_moe", tmp_path / gone)
        write_safetensors(d / "model.safetensors", {n: a for n, a in arrays_of(d).items() if n != gone})
        with pytest.raises(ModelFormatError, match=gone.replace(".", r"\.")):
            llambda.load(d, backend="numpy", n_ctx=32)


def test_defaults_where_config_json_is_silent():
    """transformers' defaults: theta 500000, tied embeddings, 131072 positions, two shared experts, MoE from
    layer 1 to the last; head_dim 128 taken only where it is hidden_size / num_attention_heads too."""
    from llambda.models import ernie4_5, ernie4_5_moe
    cfg = json.loads((TINY / "ernie4_5_moe" / "config.json").read_text())
    bare = {k: v for k, v in cfg.items() if k not in (
        "rope_parameters", "tie_word_embeddings", "max_position_embeddings", "moe_num_shared_experts",
        "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "moe_norm_min")}
    c = ernie4_5_moe.config_from_hf(bare)
    assert (c.rope_theta, c.tie_embeddings, c.n_ctx_train, c.shared_ffn_dim) == (500000.0, True, 131072, 32)
    assert c.moe_layers == [False, True, True, True]
    wide = {**bare, "hidden_size": 512, "head_dim": None}
    assert ernie4_5.config_from_hf(wide).head_dim == 128


def test_export_refuses_what_it_cannot_write(tmp_path):
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "ernie4_5", tmp_path / "hf", fmt="hf")
    with pytest.raises(LlambdaError, match="GGUF only"):
        export(TINY / "ernie4_5_moe", tmp_path / "hf2", fmt="hf")

"""DeepSeek-V2/V3 (multi-head latent attention, grouped MoE routing with shared experts).

The tiny references (fixtures/reference/tiny/deepseek_v2 and deepseek_v3, made by
tools/make_tiny_deepseek.py; README_deepseek.md there) are also run from their HF directories by
test_tiny_models.py with every other folder. Here: the GGUF path as llama.cpp's converter writes it,
in its older layout (attn_kv_b) and its newer one (attn_k_b / attn_v_b and the *_mla keys), on every
backend; our exporter's GGUF; the settings read from each format; the compressed KV cache (the default)
against the expanded heads (LLAMBDA_MLA_EXPANDED=1): its size, the same logits and generations;
refusals of what is not supported.
"""
import json
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType
from llambda.formats.safetensors import SafetensorsFile
from test_hybrid import MODES, _edit, assert_matches, last_rows, load, q8_export_is_close

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDERS = ["deepseek_v2", "deepseek_v3"]

# HF name (after model.layers.N.) -> llama.cpp's deepseek2 GGUF name (its gguf-py tensor_mapping)
GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.kv_b_proj": "attn_kv_b", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def reference(folder) -> dict:
    return json.loads((TINY / folder / "reference.json").read_text(encoding="utf-8"))


def converter_gguf(folder: str, out: Path, split_kv_b: bool) -> Path:
    """The tiny model as llama.cpp's convert_hf_to_gguf.py writes it: experts stacked, the router's
    e_score_correction_bias as exp_probs_b.bias; split_kv_b: its newer layout (kv_b_proj split per head
    into attn_k_b, transposed, and attn_v_b; key/value lengths of the compressed cache, the expanded
    heads' under *_mla, one kv head), else its older one (attn_kv_b, the expanded heads' lengths)."""
    cfg = json.loads((TINY / folder / "config.json").read_text())
    H, nope, rope, vd, kvr = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                               "v_head_dim", "kv_lora_rank"))
    tensors, experts = {}, {}
    with SafetensorsFile(TINY / folder / "model.safetensors") as f:
        for name, t in f.tensors.items():
            w = np.array(t.to_float32()).reshape(t.shape).astype(np.float32)
            top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                   "lm_head.weight": "output.weight"}
            if name in top:
                tensors[top[name]] = w
                continue
            _, _, i, rest = name.split(".", 3)
            if rest.startswith("mlp.experts."):
                _, _, e, proj, _ = rest.split(".")
                experts.setdefault((i, proj), {})[int(e)] = w
                continue
            if rest == "mlp.gate.e_score_correction_bias":
                tensors[f"blk.{i}.exp_probs_b.bias"] = w
                continue
            leaf = rest.rsplit(".", 1)[0]
            if leaf == "self_attn.kv_b_proj" and split_kv_b:
                kv = w.reshape(H, nope + vd, kvr)
                tensors[f"blk.{i}.attn_k_b.weight"] = np.ascontiguousarray(kv[:, :nope].transpose(0, 2, 1))
                tensors[f"blk.{i}.attn_v_b.weight"] = np.ascontiguousarray(kv[:, nope:])
                continue
            tensors[f"blk.{i}.{GGUF_NAMES[leaf]}.weight"] = w
    for (i, proj), per in experts.items():
        tensors[f"blk.{i}.ffn_{proj.split('_')[0]}_exps.weight"] = np.stack([per[e] for e in sorted(per)])
    a, v3 = "deepseek2", cfg["model_type"] == "deepseek_v3"
    meta = {"general.architecture": a, f"{a}.block_count": cfg["num_hidden_layers"],
            f"{a}.context_length": cfg["max_position_embeddings"], f"{a}.embedding_length": cfg["hidden_size"],
            f"{a}.feed_forward_length": cfg["intermediate_size"], f"{a}.attention.head_count": H,
            f"{a}.rope.freq_base": cfg["rope_parameters"]["rope_theta"], f"{a}.rope.dimension_count": rope,
            f"{a}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"], f"{a}.vocab_size": cfg["vocab_size"],
            f"{a}.leading_dense_block_count": cfg["first_k_dense_replace"], f"{a}.attention.kv_lora_rank": kvr,
            f"{a}.expert_feed_forward_length": cfg["moe_intermediate_size"],
            f"{a}.expert_count": cfg["n_routed_experts"], f"{a}.expert_used_count": cfg["num_experts_per_tok"],
            f"{a}.expert_shared_count": cfg["n_shared_experts"],
            f"{a}.expert_weights_scale": cfg["routed_scaling_factor"],
            f"{a}.expert_gating_func": 2 if v3 else 1,
            f"{a}.expert_group_count": cfg["n_group"], f"{a}.expert_group_used_count": cfg["topk_group"]}
    if cfg.get("norm_topk_prob"):
        meta[f"{a}.expert_weights_norm"] = True
    if cfg.get("q_lora_rank"):
        meta[f"{a}.attention.q_lora_rank"] = cfg["q_lora_rank"]
    if split_kv_b:
        meta.update({f"{a}.attention.head_count_kv": 1, f"{a}.attention.key_length": kvr + rope,
                     f"{a}.attention.value_length": kvr, f"{a}.attention.key_length_mla": nope + rope,
                     f"{a}.attention.value_length_mla": vd})
    else:
        meta.update({f"{a}.attention.head_count_kv": H, f"{a}.attention.key_length": nope + rope,
                     f"{a}.attention.value_length": vd})
    rp = cfg["rope_parameters"]
    if rp.get("rope_type") == "yarn":
        meta.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": rp["factor"],
                     f"{a}.rope.scaling.original_context_length": rp["original_max_position_embeddings"],
                     f"{a}.rope.scaling.yarn_log_multiplier": 0.1 * rp["mscale_all_dim"]})
    write_gguf(out, meta, {n: (QType.F32, np.ascontiguousarray(w)) for n, w in tensors.items()})
    return out


@pytest.mark.parametrize("split", [False, True], ids=["kv_b", "k_b+v_b"])
@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_matches_transformers(tmp_path, folder, mode, split):
    gg = converter_gguf(folder, tmp_path / f"{folder}.gguf", split)
    ref = reference(folder)
    with load(gg, mode, n_ctx=128) as m:
        assert m.config.arch == "deepseek2" and m.config.mla
        assert_matches(m, ref, mode)


def _settings(c):
    return (c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_neox, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_dim,
            c.v_head_dim, round(c.scale(), 6), c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.shared_ffn_dim,
            c.moe_routing, c.moe_norm_topk, c.moe_groups, c.moe_groups_used, c.moe_group_top, c.moe_scale, c.moe_layers)


@pytest.mark.parametrize("folder", FOLDERS)
def test_settings_from_each_format(tmp_path, folder):
    got = []
    for path in (TINY / folder, converter_gguf(folder, tmp_path / "old.gguf", False),
                 converter_gguf(folder, tmp_path / "new.gguf", True)):
        with llambda.load(path, backend="numpy", n_ctx=32) as m:
            got.append(_settings(m.config))
            np.testing.assert_allclose(m.transformer.inv_freq[False],
                                       np.array(reference(folder)["rope_inv_freq"]["all_layers"], np.float32), rtol=2e-6)
    assert got[0] == got[1] == got[2]
    v3 = folder == "deepseek_v3"
    assert got[0][:9] == (4, 4, 24, 8, False, 24 if v3 else 0, 32, 16, 12)
    assert got[0][14:] == (("sigmoid_topk", True, 4, 2, 2, 2.5) if v3 else ("softmax_topk", False, 4, 2, 1, 2.0)) + \
        ([False, True, True],)
    # V2's YaRN: 24^-0.5 (0.1 * 0.707 * ln 4 + 1)^2; V3: no scaling
    assert got[0][9] == round(24 ** -0.5 * (1 if v3 else (0.1 * 0.707 * np.log(4) + 1) ** 2), 6)


@pytest.mark.parametrize("expanded", [False, True], ids=["compressed", "expanded"])
def test_kv_cache_holds_the_compressed_rows(monkeypatch, expanded):
    """The cost README states: per token and layer, latent attention's compressed cache holds one row of
    kv_lora_rank + qk_rope = 40 values, read as the keys and (its first 32 after the rope dims) the values;
    LLAMBDA_MLA_EXPANDED=1 every head's key and (padded) value, 2 x 4 x 24 values. The memory plan counts
    what is allocated."""
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models import memory
    monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
    with llambda.load(TINY / "deepseek_v2", backend="numpy", n_ctx=64) as m:
        cache = m.transformer.cache
        assert cache.n_layers == 3
        if expanded:
            assert cache.n_kv == 4 and cache.head_dim == 24 and cache.v is not cache.k
            assert cache.k[0].shape == cache.v[0].shape == (1, 64, 4, 24)
        else:
            assert cache.n_kv == 1 and cache.head_dim == 40 and cache.values_are_keys
            assert cache.k[0].shape == (1, 64, 1, 40)
        src = open_hf_dir(TINY / "deepseek_v2")
        try:
            per_token = memory.plan(src, 64).kv_per_token
        finally:
            src.close()
        assert per_token == 3 * 4 * (2 * 4 * 24 if expanded else 40) and cache.nbytes == 64 * per_token
        report = m.memory_report()
        assert (m.memory_plan.kv_cache, m.memory_plan.activations) == (report["kv_cache"], report["activations"])


def _all_logits(m, ids) -> np.ndarray:
    n = len(ids)
    return m.transformer.forward(np.array(ids, np.int32), np.zeros(n, np.int32), np.arange(n), list(range(n))).copy()


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("mode", list(MODES))
def test_compressed_cache_gives_the_expanded_heads_logits(monkeypatch, folder, mode):
    """Absorbing kv_b into the query and the output is the same arithmetic reordered: every row's logits
    of a prompt, and of decode steps after it, as the expanded heads' (float32 rounding; the fast mode's
    q8 activations quantize other vectors: q_nope and the latent output instead of c)."""
    ids = reference(folder)["inputs"][1]["input_ids"]
    got = {}
    for expanded in (True, False):
        monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
        with load(TINY / folder, mode, n_ctx=64) as m:
            assert m.transformer.cache.values_are_keys is not expanded
            prompt = _all_logits(m, ids[:-3])
            steps = [m.transformer.forward(np.array([t], np.int32), np.zeros(1, np.int32), [len(ids) - 3 + j], [0])
                     .copy() for j, t in enumerate(ids[-3:])]
            got[expanded] = np.concatenate([prompt, *steps])
    tol = 5e-2 if mode == "native-fast" else 1e-4
    err = float(np.abs(got[True] - got[False]).max())
    assert err <= tol, err


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_compressed_cache_generates_what_the_expanded_heads_do(monkeypatch, mode):
    """A greedy generation of 48 tokens (past the prompt's positions, each step attending over the cache the
    path wrote) is the same on both paths."""
    prompt = reference("deepseek_v2")["inputs"][0]["input_ids"]
    out = {}
    for expanded in (True, False):
        monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
        with load(TINY / "deepseek_v2", mode, n_ctx=128) as m:
            out[expanded] = list(m.generate(prompt, max_tokens=48, temperature=0, ignore_eos=True))
    assert len(out[True]) == 48 and out[True] == out[False]


@pytest.mark.parametrize("folder", FOLDERS)
def test_export_writes_what_llama_cpps_converter_writes(folder, tmp_path, monkeypatch):
    """`llambda export` of a DeepSeek model: the tensors and keys of the converter's current layout (kv_b
    split into attn_k_b / attn_v_b, the *_mla keys; ours also writes yarn_log_multiplier from the scale and
    the group count for V2, both read back the same), the same logits; q8_0 close to the same weights
    quantized at load; an HF export refused."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    ours = export(TINY / folder, tmp_path / "ours.gguf", fmt="gguf")
    theirs = converter_gguf(folder, tmp_path / "theirs.gguf", True)
    with GGUFFile(ours) as a, GGUFFile(theirs) as b:
        assert set(a.tensors) == set(b.tensors)
        for name, t in b.tensors.items():
            assert tuple(a.tensors[name].shape) == tuple(t.shape), name
            np.testing.assert_array_equal(np.array(a.view(a.tensors[name].data)), np.array(b.view(t.data)), name)
        for key, v in b.metadata.items():
            if key != "general.name":
                assert a.metadata.get(key) == pytest.approx(v), key
    inp = reference(folder)["inputs"][2]
    with llambda.load(ours, backend="numpy", n_ctx=128) as m:
        np.testing.assert_allclose(last_rows(m, inp), np.array(inp["logits_last3"], np.float32), atol=1e-3, rtol=0)
    # at load kv_b is quantized whole; the file's attn_k_b rows (16 wide) stay F16, only its v_b is Q8_0.
    # Expanded, both quantize kv_b's key half (rejoined as Q8_0); the compressed path keeps the file's F16
    # attn_k_b as it is, 0.23 from the at-load one and closer to the float reference (0.27 vs 0.34 on V2)
    monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1")
    q8_export_is_close(folder, tmp_path, inp, ["blk.1.ffn_down_exps.weight", "blk.1.attn_kv_a_mqa.weight"], 0.1)


def test_llama_cpp_reads_our_deepseek_gguf_as_we_do(tmp_path):
    """An independent reader of the same file: llama.cpp's logits on our exported GGUF of the tiny V3
    against ours. (llama.cpp takes a deepseek2 model of other than 27 layers to have a q_lora_rank, so it
    cannot hold the tiny V2, which has none, as V2-Lite.)"""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    from test_moe import llama_cpp_agrees
    llama_cpp_agrees("deepseek_v3", tmp_path)


@pytest.mark.parametrize("folder, edit, message", [
    ("deepseek_v2", lambda c: c["rope_parameters"].update(mscale=1.0), "attention factor"),
    ("deepseek_v2", lambda c: c["rope_parameters"].update(rope_type="longrope"), "rope"),
    ("deepseek_v2", lambda c: c.update(norm_topk_prob=True), "norm_topk_prob"),
    ("deepseek_v2", lambda c: c.update(topk_method="sinkhorn"), "topk_method"),
    ("deepseek_v2", lambda c: c.update(n_group=3), "groups"),
    ("deepseek_v2", lambda c: c.update(kv_lora_rank=0), "kv_lora_rank"),
    ("deepseek_v3", lambda c: c.update(scoring_func="relu"), "scoring_func"),
    ("deepseek_v3", lambda c: c.update(topk_group=5), "of which 5 are used"),
    ("deepseek_v3", lambda c: c.update(v_head_dim=40), "value heads"),
])
def test_bad_configs_are_model_format_errors(tmp_path, folder, edit, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(_edit(tmp_path, edit, folder), backend="numpy", n_ctx=32)


def test_a_split_kv_b_of_the_wrong_shape_is_refused(tmp_path):
    from llambda.formats.gguf import GGUFFile
    gg = converter_gguf("deepseek_v2", tmp_path / "a.gguf", True)
    with GGUFFile(gg) as f:
        meta = dict(f.metadata)
        tensors = {n: (QType.F32, np.array(f.view(t.data)).view(np.float32).reshape(tuple(int(s) for s in t.shape)))
                   for n, t in f.tensors.items()}
    tensors["blk.0.attn_k_b.weight"] = (QType.F32, np.zeros((4, 16, 32), np.float32))     # not transposed
    write_gguf(tmp_path / "b.gguf", meta, tensors)
    with pytest.raises(ModelFormatError, match="attn_k_b"):
        llambda.load(tmp_path / "b.gguf", backend="numpy", n_ctx=32)


def test_split_kv_b_rejoined_as_q8_0_when_quantized():
    """A newer GGUF's attn_k_b / attn_v_b in a quantized type: rejoined (k_b transposed per head) into
    kv_b's rows, re-quantized to Q8_0 (a transposed block cannot keep its type), close to the floats."""
    from llambda.formats.quants import quantize
    from llambda.formats.weights import WeightTensor
    from llambda.models.deepseek2 import join_kv_b
    with llambda.load(TINY / "deepseek_v2", backend="numpy", n_ctx=32) as m:
        cfg = m.config
    H, nope, vd, r = cfg.n_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    g = np.random.default_rng(3)
    k, v = g.normal(0, 1, (H, r, nope)).astype(np.float32), g.normal(0, 1, (H, vd, r)).astype(np.float32)
    kb = WeightTensor.from_float("k_b", k)
    vb = WeightTensor("v_b", QType.Q8_0, (H, vd, r), quantize(v, QType.Q8_0).reshape(-1))
    got = join_kv_b(kb, vb, cfg, "kv_b")
    assert got.qtype == QType.Q8_0 and got.shape == (H * (nope + vd), r)
    want = np.concatenate([k.transpose(0, 2, 1), v], axis=1).reshape(H * (nope + vd), r)
    np.testing.assert_allclose(got.to_float32().reshape(want.shape), want, atol=0.05)
    assert join_kv_b(kb, WeightTensor.from_float("v_b", v), cfg, "kv_b").qtype == QType.F32


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_batch_of_slots_equals_each_sequence_alone(backend):
    """Latent attention's head assembly (copy_blocks) over a batch mixing slots and positions: two sequences'
    decode rows in one forward give each sequence's own logits."""
    if backend not in llambda.backends.available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    from llambda.backends.native import NativeBackend
    from llambda.backends.numpy_ref import NumpyBackend
    from llambda.formats.hf_dir import open_hf_dir
    from llambda.models.base import Transformer
    src = open_hf_dir(TINY / "deepseek_v3")
    make = (lambda: NativeBackend(activations="f32", kv_type="f32")) if backend == "native" else NumpyBackend
    try:
        a, b = reference("deepseek_v3")["inputs"][0]["input_ids"], reference("deepseek_v3")["inputs"][1]["input_ids"][:9]
        alone = []
        for ids in (a, b):
            t = Transformer(src.config, src.tensor, make(), n_ctx=32, n_slots=1, max_tokens=32)
            alone.append(t.forward(np.array(ids, np.int32), np.zeros(len(ids), np.int32), np.arange(len(ids)),
                                   [len(ids) - 1]).copy())
        t = Transformer(src.config, src.tensor, make(), n_ctx=32, n_slots=2, max_tokens=32)
        t.forward(np.array(a[:-1], np.int32), np.zeros(len(a) - 1, np.int32), np.arange(len(a) - 1), [])
        t.forward(np.array(b[:-1], np.int32), np.ones(len(b) - 1, np.int32), np.arange(len(b) - 1), [])
        got = t.forward(np.array([b[-1], a[-1]], np.int32), np.array([1, 0], np.int32),
                        np.array([len(b) - 1, len(a) - 1]), [0, 1])
        np.testing.assert_allclose(got[0], alone[1][0], atol=1e-4)
        np.testing.assert_allclose(got[1], alone[0][0], atol=1e-4)
    finally:
        src.close()


def wide_mla_gguf(out: Path, H=16, kvr=512, rope=64, nope=128, vd=128, d=128, layers=2, vocab=96, ff=64) -> Path:
    """A random dense deepseek2 GGUF (older layout) with DeepSeek-V2-Lite's attention sizes: its compressed
    rows are 576 wide, the native kernel's largest head, and split into q8_0 blocks."""
    r = np.random.default_rng(0)

    def w(*shape):
        return (r.standard_normal(shape) * 0.05).astype(np.float32)

    def ones(n):
        return np.ones(n, np.float32)
    t = {"token_embd.weight": w(vocab, d), "output_norm.weight": ones(d), "output.weight": w(vocab, d)}
    for i in range(layers):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": ones(d), p + "ffn_norm.weight": ones(d), p + "attn_q.weight": w(H * (nope + rope), d),
                  p + "attn_kv_a_mqa.weight": w(kvr + rope, d), p + "attn_kv_a_norm.weight": ones(kvr),
                  p + "attn_kv_b.weight": w(H * (nope + vd), kvr), p + "attn_output.weight": w(d, H * vd),
                  p + "ffn_gate.weight": w(ff, d), p + "ffn_up.weight": w(ff, d), p + "ffn_down.weight": w(d, ff)})
    a = "deepseek2"
    meta = {"general.architecture": a, f"{a}.block_count": layers, f"{a}.context_length": 256,
            f"{a}.embedding_length": d, f"{a}.feed_forward_length": ff, f"{a}.attention.head_count": H,
            f"{a}.rope.freq_base": 10000.0, f"{a}.rope.dimension_count": rope,
            f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.vocab_size": vocab, f"{a}.attention.kv_lora_rank": kvr,
            f"{a}.attention.head_count_kv": H, f"{a}.attention.key_length": nope + rope,
            f"{a}.attention.value_length": vd}
    write_gguf(out, meta, {n: (QType.F32, np.ascontiguousarray(x)) for n, x in t.items()})
    return out


@pytest.mark.parametrize("backend, kv_type, tol", [("numpy", None, 1e-5), ("native", "f32", 1e-5),
                                                   ("native", "f16", 5e-3), ("native", "q8_0", 5e-2)])
def test_compressed_rows_of_deepseek_v2_lites_size(tmp_path, monkeypatch, backend, kv_type, tol):
    """At V2-Lite's attention sizes (16 heads of 128 + 64, kv_lora_rank 512): 576 values a token and layer
    against the expanded 16 x 2 x 192 = 6144, as the plan says (q8_0: 18 blocks of 34 bytes, no key base),
    and every prompt row's logits as the expanded heads' (f16 and q8_0 round other values on each path)."""
    if backend not in llambda.backends.available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    path = wide_mla_gguf(tmp_path / "wide.gguf")
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 96, 40)]
    got, per_token = {}, {}
    for expanded in (True, False):
        monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
        kw = {} if kv_type is None else {"kv_type": kv_type, "activations": "f32"}
        with llambda.load(path, backend=backend, n_ctx=64, **kw) as m:
            base = 2 * 16 * 192 * 4 if expanded and kv_type == "q8_0" else 0      # a float key base per layer
            assert m.transformer.cache.nbytes == m.memory_plan.kv_cache == 64 * m.memory_plan.kv_per_token + base
            per_token[expanded] = m.memory_plan.kv_per_token
            got[expanded] = _all_logits(m, ids)
    values = {"f16": 2, "q8_0": 34 / 32}.get(kv_type, 4)
    assert per_token == {True: 2 * 6144 * values, False: 2 * 576 * values}
    assert float(np.abs(got[True] - got[False]).max()) <= tol

def test_compressed_cache_keeps_batch_invariance_prefix_copies_and_drafts():
    """What the engine does with a cache works on the compressed rows: with batch invariance on, a token's
    logits are the same bits alone (one thread) or in a prefill chunk beside another slot's decode token (two
    threads); a slot's prefix copied to another slot continues as the original (prefix caching); the model
    drafting for itself (speculative decoding) generates what it generates alone."""
    if "native" not in llambda.backends.available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    from llambda import _native
    prompt = reference("deepseek_v2")["inputs"][1]["input_ids"]
    L = len(prompt)
    with llambda.load(TINY / "deepseek_v2", backend="native", threads=2, n_ctx=64, n_slots=2) as m:
        tr = m.transformer
        assert tr.cache.values_are_keys
        tr.backend.set_batch_invariant(True)
        try:
            _native.set_threads(1)
            alone = [tr.forward([t], [0], [p], [0])[0].copy() for p, t in enumerate(prompt)]
            extra = tr.forward([7], [0], [L], [0])[0].copy()
            _native.set_threads(2)
            got = tr.forward(prompt + [7], [1] * L + [0], list(range(L)) + [L], list(range(L + 1)))
            assert all(np.array_equal(got[p], alone[p]) for p in range(L)) and np.array_equal(got[L], extra)
            for a in tr.cache.arrays:       # slot 1's rows gone, then slot 0's prefix copied in
                a[1] = 0
            tr.cache.copy_prefix(0, 1, L)
            np.testing.assert_array_equal(tr.forward([7], [1], [L], [0])[0], extra)
        finally:
            tr.backend.set_batch_invariant(False)
            _native.set_threads(2)
        plain = list(m.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True))
    with llambda.load(TINY / "deepseek_v2", backend="native", n_ctx=64, draft=str(TINY / "deepseek_v2")) as m:
        assert list(m.generate(prompt, max_tokens=12, temperature=0, ignore_eos=True)) == plain

@pytest.mark.parametrize("expanded", [False, True], ids=["compressed", "expanded"])
@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_memory_plan_counts_the_kv_b_the_load_keeps(tmp_path, monkeypatch, qtype, expanded):
    """A newer-layout file's plan counts attn_kv_b as the load keeps it: expanded, rejoined (join_kv_b: Q8_0
    when a half is quantized, as the q8_0 export's Q8_0 v_b and F16 k_b; float32 from F16 halves), not the
    halves' bytes; compressed, the halves as they are (the per-head matrices)."""
    import contextlib
    from llambda.formats.open import open_named
    from llambda.formats.quants import tensor_nbytes
    from llambda.models import memory
    from llambda.tools.export import export
    monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
    split = export(TINY / "deepseek_v3", tmp_path / "split.gguf", fmt="gguf", qtype=qtype)
    with contextlib.closing(open_named(split)[1]) as src:
        want = 0
        for name, t in src.tensors():
            if expanded and name.endswith("attn_v_b.weight"):
                kv = src.tensor(name.replace("attn_v_b", "attn_kv_b"))     # the load's own join
                assert kv.qtype == (QType.Q8_0 if qtype == "q8_0" else QType.F32)
                want += kv.data.nbytes
            elif not expanded or not name.endswith("attn_k_b.weight"):
                want += tensor_nbytes(t.qtype, t.shape)
        assert src.tensor("blk.0.attn_k_b.weight").qtype == QType.F16
        assert memory.plan(src, 64).weights == want
        assert memory.plan(src, 64, qtype_at_load=lambda n, t: t.qtype).weights == want


def test_memory_plan_follows_the_weights_each_path_packs(tmp_path, monkeypatch):
    """What the native backend packs differs between the paths as the plan says (the plan and the packing
    otherwise differ by the same bytes, the vectors, on both): a newer layout's F16 halves kept as they are
    or rejoined in float32. An older layout's Q8_0 kv_b (quantize=), compressed, also keeps its key half
    transposed in float32 (absorbed_key_heads: qk_nope 16 takes no Q8_0 blocks): per layer 4 heads x 32 x 16
    floats instead of 16/28 of kv_b's 112 rows of 34 bytes."""
    from contextlib import closing
    from llambda.formats.open import open_named
    from llambda.models import memory
    from llambda.tools.export import export
    split = export(TINY / "deepseek_v3", tmp_path / "split.gguf", fmt="gguf", qtype="f16")
    older = converter_gguf("deepseek_v3", tmp_path / "older.gguf", split_kv_b=False)
    planned = {}
    for expanded in (True, False):
        monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
        with closing(open_named(older)[1]) as src:
            planned[expanded] = memory.plan(src, 32, qtype_at_load=lambda n, t: QType.Q8_0 if t.cols % 32 == 0 and
                                            len(t.shape) == 2 and t.rows > 1 else t.qtype).weights
    assert planned[False] - planned[True] == 3 * (4 * 32 * 16 * 4 - 112 * 34 * 16 // 28)
    if "native" not in llambda.backends.available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    for path in (split, older):
        gap, packed = {}, {}
        for expanded in (True, False):
            monkeypatch.setenv("LLAMBDA_MLA_EXPANDED", "1" if expanded else "0")
            with llambda.load(path, backend="native", n_ctx=32) as m:
                packed[expanded] = m.memory_report()["weights"]
                gap[expanded] = m.memory_plan.weights - packed[expanded]
        assert gap[True] == gap[False], (path.name, packed, gap)
        assert (packed[True] != packed[False]) == (path == split)


def test_export_of_an_older_layout_gguf_writes_the_split_one(tmp_path):
    """A GGUF of llama.cpp's older layout (attn_kv_b) exported: the current layout, the same logits."""
    from llambda.formats.gguf import GGUFFile
    from llambda.tools.export import export
    out = export(converter_gguf("deepseek_v3", tmp_path / "old.gguf", False), tmp_path / "new.gguf", fmt="gguf")
    with GGUFFile(out) as f:
        assert "blk.0.attn_k_b.weight" in f.tensors and "blk.0.attn_kv_b.weight" not in f.tensors
        assert f.metadata["deepseek2.attention.key_length_mla"] == 24
    inp = reference("deepseek_v3")["inputs"][1]
    with llambda.load(out, backend="numpy", n_ctx=64) as m:
        np.testing.assert_allclose(last_rows(m, inp), np.array(inp["logits_last3"], np.float32), atol=1e-3, rtol=0)


def test_multi_token_prediction_layers_are_skipped_and_fp8_refused(tmp_path):
    """DeepSeek-V3 checkpoints hold num_nextn_predict_layers layers past the decoder's (not run, as llama.cpp's
    converter skips them); the Hub's FP8 block-quantized ones are refused by name."""
    from llambda.formats.safetensors import write_safetensors
    d = _edit(tmp_path, lambda c: c.update(num_nextn_predict_layers=1), "deepseek_v3")
    with SafetensorsFile(TINY / "deepseek_v3" / "model.safetensors") as f:
        tensors = {n: np.array(t.to_float32()).reshape(t.shape) for n, t in f.tensors.items()}
    tensors.update({n.replace("layers.2.", "layers.3."): v for n, v in tensors.items() if "layers.2." in n})
    tensors["model.layers.3.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    write_safetensors(d / "model.safetensors", tensors)
    inp = reference("deepseek_v3")["inputs"][0]
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert m.config.n_layers == 3
        np.testing.assert_allclose(last_rows(m, inp), np.array(inp["logits_last3"], np.float32), atol=1e-3, rtol=0)
    fp8 = _edit(tmp_path / "b", lambda c: c.update(quantization_config={"quant_method": "fp8"}), "deepseek_v3")
    with pytest.raises(ModelFormatError, match="fp8"):
        llambda.load(fp8, backend="numpy", n_ctx=32)


def test_compressed_rows_wider_than_the_native_kernel_fall_back_to_the_expanded_heads(tmp_path):
    """kv_lora_rank + qk_rope past the native attention's 576 (here 584) with heads of 192: the native
    backend runs the expanded heads (it refused the load naming a head_dim the model does not have), its
    cache and plan say so, and its logits are the NumPy reference's over the compressed rows."""
    if "native" not in llambda.backends.available_backends():
        pytest.skip("the native backend is not available here (C core not built)")
    path = wide_mla_gguf(tmp_path / "wider.gguf", H=2, kvr=520, layers=1)
    ids = [int(t) for t in np.random.default_rng(2).integers(0, 96, 12)]
    got = {}
    for backend in ("native", "numpy"):
        kw = {"kv_type": "f32", "activations": "f32"} if backend == "native" else {}
        with llambda.load(path, backend=backend, n_ctx=32, **kw) as m:
            assert m.transformer.mla_compressed == (backend == "numpy")
            assert m.transformer.cache.nbytes == m.memory_plan.kv_cache
            got[backend] = _all_logits(m, ids)
    assert float(np.abs(got["native"] - got["numpy"]).max()) <= 1e-4

"""`llambda quantize IN OUT MIX`: which tensor gets which type (llama.cpp's presets, written here as
the facts they are), the file it writes, and that file in llambda and in llama.cpp."""
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import LlambdaError
from llambda.formats.gguf import GGUFFile
from llambda.formats.quants import QType as Q
from llambda.tools.quant_mix import file_type, tensor_types

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"

# llama.cpp's use_more_bits for 32 layers, spelled out: layers 0-3, 28-31 and every third between
MORE_BITS_32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}


def shapes(n_layers, d, ffn, kv, tied, vocab=1000):
    """A dense decoder's tensors (rows, cols), as WeightTensor shapes."""
    out = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    if not tied:
        out["output.weight"] = (vocab, d)
    for i in range(n_layers):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": (d,), p + "attn_q.weight": (d, d), p + "attn_k.weight": (kv, d),
                    p + "attn_v.weight": (kv, d), p + "attn_q.bias": (d,), p + "attn_output.weight": (d, d),
                    p + "ffn_norm.weight": (d,), p + "ffn_gate.weight": (ffn, d), p + "ffn_up.weight": (ffn, d),
                    p + "ffn_down.weight": (d, ffn)})
    return out


def types_of(mix, n_layers=32, d=4096, ffn=11008, kv=4096, tied=False, gqa=1, pure=False):
    return tensor_types(file_type(mix, pure), shapes(n_layers, d, ffn, kv, tied), n_layers, gqa)


def layer_types(t, leaf, n=32):
    return [t[f"blk.{i}.{leaf}.weight"] for i in range(n)]


@pytest.mark.parametrize("mix,default", [("Q4_K_M", Q.Q4_K), ("q5_k_m", Q.Q5_K)])
def test_k_m_mixes_raise_attn_v_and_ffn_down_in_the_more_bits_layers(mix, default):
    t = types_of(mix)
    want = [Q.Q6_K if i in MORE_BITS_32 else default for i in range(32)]
    assert layer_types(t, "attn_v") == want
    assert layer_types(t, "ffn_down") == want
    for leaf in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
        assert set(layer_types(t, leaf)) == {default}, leaf
    assert t["output.weight"] == Q.Q6_K and t["token_embd.weight"] == default
    assert t["output_norm.weight"] == t["blk.3.attn_norm.weight"] == t["blk.0.attn_q.bias"] == Q.F32


def test_q3_k_m_mix():
    t = types_of("q3_k_m")
    assert layer_types(t, "attn_v") == [Q.Q5_K] * 2 + [Q.Q4_K] * 30           # the first two attn_v
    assert layer_types(t, "ffn_down") == [Q.Q5_K] * 2 + [Q.Q4_K] * 30         # layers < n/16
    assert set(layer_types(t, "attn_output")) == {Q.Q4_K}
    assert set(layer_types(t, "attn_q")) == set(layer_types(t, "ffn_up")) == {Q.Q3_K}
    assert t["output.weight"] == Q.Q6_K


@pytest.mark.parametrize("gqa,attn_v", [(1, Q.Q3_K), (3, Q.Q3_K), (4, Q.Q4_K), (8, Q.Q4_K)])
def test_q2_k_mix(gqa, attn_v):
    t = types_of("Q2_K", kv=4096 // gqa, gqa=gqa)
    assert set(layer_types(t, "attn_v")) == {attn_v}
    assert set(layer_types(t, "ffn_down")) == set(layer_types(t, "attn_output")) == {Q.Q3_K}
    assert set(layer_types(t, "attn_q")) == set(layer_types(t, "ffn_gate")) == {Q.Q2_K}
    assert t["output.weight"] == Q.Q6_K and t["token_embd.weight"] == Q.Q2_K


def test_tied_embedding_is_the_head():
    t = types_of("q4_k_m", tied=True)
    assert "output.weight" not in t and t["token_embd.weight"] == Q.Q6_K


def test_rows_not_a_multiple_of_256_fall_back_as_llama_cpp():
    # SmolLM2-135M: width 576 (2.25 K-blocks), ffn 1536, 3 KV heads of 64, a tied head
    smol = dict(n_layers=30, d=576, ffn=1536, kv=192, tied=True, gqa=3)
    t = types_of("q4_k_m", **smol)
    more = {i for i in range(30) if i < 3 or i >= 26 or (i - 3) % 3 == 2}
    assert layer_types(t, "ffn_down", 30) == [Q.Q6_K if i in more else Q.Q4_K for i in range(30)]  # 1536 cols
    assert layer_types(t, "attn_v", 30) == [Q.Q8_0 if i in more else Q.Q5_0 for i in range(30)]
    assert set(layer_types(t, "attn_q", 30)) == {Q.Q5_0}
    assert t["token_embd.weight"] == Q.Q8_0                      # the head, and 576 % 256 != 0
    assert set(layer_types(types_of("q5_k_m", **smol), "ffn_up", 30)) == {Q.Q5_1}
    assert set(layer_types(types_of("q2_k", **smol), "attn_q", 30)) == {Q.Q4_0}
    assert set(layer_types(types_of("iq4_xs", **smol), "attn_q", 30)) == {Q.IQ4_NL}
    odd = types_of("q4_k_m", n_layers=2, d=48, ffn=96, kv=48, tied=False)  # not even 32-blocks
    assert odd["blk.0.attn_q.weight"] == Q.F16 and odd["output.weight"] == Q.F16


def test_fallbacks_are_recorded_and_said_once():
    from llambda.tools.quant_mix import fallback_note
    fallbacks = {}
    t = tensor_types(file_type("q4_k"), {"blk.0.attn_q.weight": (64, 576), "blk.0.ffn_down.weight": (576, 1536),
                                          "blk.0.attn_k.weight": (64, 48), "blk.0.attn_norm.weight": (576,)},
                     1, 1, fallbacks=fallbacks)
    assert t["blk.0.ffn_down.weight"] == Q.Q4_K and t["blk.0.attn_norm.weight"] == Q.F32
    assert fallbacks == {"blk.0.attn_q.weight": (Q.Q4_K, Q.Q5_0), "blk.0.attn_k.weight": (Q.Q4_K, Q.F16)}
    note = fallback_note(fallbacks, "quantize to q4_k")
    assert note == ("quantize to q4_k: 2 matrices whose rows do not split into their type's 256-value blocks took "
                    "llama.cpp's fallback type: 1 Q4_K -> F16, 1 Q4_K -> Q5_0")
    assert fallback_note({}, "x") is None


def test_plain_types_are_pure_and_q2_k_is_the_mix():
    t = types_of("q4_k")
    assert {q for n, q in t.items() if n.endswith(".weight") and "norm" not in n} == {Q.Q4_K}
    assert types_of("Q6_K")["output.weight"] == Q.Q6_K
    assert set(layer_types(types_of("q2_k"), "ffn_down")) == {Q.Q3_K}
    assert set(layer_types(types_of("q2_k", pure=True), "ffn_down")) == {Q.Q2_K}
    assert types_of("q2_k", pure=True)["output.weight"] == Q.Q2_K
    with pytest.raises(LlambdaError, match="q4_k_m"):
        file_type("q4_k_x")


def test_quantize_command_writes_a_mix_that_runs_natively(tmp_path, capsys):
    from llambda.cli import main
    out = tmp_path / "m.gguf"
    assert main(["quantize", str(TINY / "qwen3"), str(out), "q4_k_m"]) == 0
    assert "Q4_K_M" in capsys.readouterr().err
    with GGUFFile(out) as f:
        assert f.metadata["general.file_type"] == 15              # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M
        types = {n: t.qtype for n, t in f.tensors.items()}
    # the tiny model is 64 wide: every matrix falls back to a 32-block type; of 2 layers the last has more bits
    assert types["blk.0.attn_q.weight"] == types["blk.0.attn_v.weight"] == Q.Q5_0
    assert types["blk.1.attn_v.weight"] == types["blk.1.ffn_down.weight"] == Q.Q8_0
    ids = [1, 5, 9, 2, 7]
    with llambda.load(out, backend="numpy", n_ctx=64) as m:
        want = m.logits(ids)
    if "native" in available_backends():
        with llambda.load(out, backend="native", activations="f32", n_ctx=64) as m:
            assert float(np.abs(m.logits(ids) - want).max()) <= 1e-3


def test_progress_bar_is_one_updating_line_on_stderr(tmp_path, capsys):
    from llambda.tools.export import export
    export(TINY / "qwen3", tmp_path / "p.gguf", qtype="q8_0", progress=True)
    err = capsys.readouterr().err
    assert "quantize" in err and "100%" in err and "\r" in err
    assert err.count("\n") <= 1
    export(TINY / "qwen3", tmp_path / "q.gguf", qtype="q8_0", progress=False)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- a real model, and llama.cpp

def _llama_cpp():
    return pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: no llama.cpp to compare with")


def _gguf_shapes(path):
    with GGUFFile(path) as f:
        a = f.metadata["general.architecture"]
        return ({n: t.shape for n, t in f.tensors.items()}, {n: t.qtype for n, t in f.tensors.items()},
                f.metadata[f"{a}.block_count"],
                f.metadata[f"{a}.attention.head_count"] // f.metadata[f"{a}.attention.head_count_kv"])


@pytest.mark.slow
@pytest.mark.parametrize("mix", ["q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "iq4_xs", "iq4_nl"])
def test_mixes_choose_what_llama_cpp_quantize_chooses(mix, smollm2_gguf, tmp_path):
    """llama.cpp's own quantizer on the same file picks the same type for every tensor."""
    import ctypes
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix.upper()}")
    params.allow_requantize = True      # the catalogued SmolLM2 is Q4_1
    params.nthread = 1
    out = tmp_path / "theirs.gguf"
    assert llama_cpp.llama_model_quantize(str(smollm2_gguf).encode(), str(out).encode(), ctypes.byref(params)) == 0
    shapes, theirs, n_layers, gqa = _gguf_shapes(out)
    ours = tensor_types(file_type(mix), shapes, n_layers, gqa)
    assert {n: q.name for n, q in ours.items()} == {n: q.name for n, q in theirs.items()}


@pytest.fixture(scope="module")
def smollm2_q4_k_m(smollm2_gguf, tmp_path_factory):
    from llambda.tools.export import export
    return export(smollm2_gguf, tmp_path_factory.mktemp("mix") / "smollm2-q4_k_m.gguf", qtype="q4_k_m",
                  progress=False)


PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n <"]


@pytest.mark.slow
def test_our_q4_k_m_file_runs_natively_as_the_oracle(smollm2_q4_k_m):
    shapes, types, n_layers, gqa = _gguf_shapes(smollm2_q4_k_m)
    assert types == tensor_types(file_type("q4_k_m"), shapes, n_layers, gqa)
    assert {Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q8_0} <= set(types.values())
    with llambda.load(smollm2_q4_k_m, backend="numpy", n_ctx=64) as m:
        ids = [m.tokenize(p) for p in PROMPTS]
        want = [m.logits(i) for i in ids]
    for act, budget in (("f32", 2e-3), ("q8", 1.0)):    # exact, and the fast mode's top-20 budget
        with llambda.load(smollm2_q4_k_m, backend="native", activations=act, n_ctx=64) as m:
            for i, w in zip(ids, want):
                got = m.logits(i)
                top = np.argsort(w)[-20:]
                assert float(np.abs(got[top] - w[top]).max()) <= budget, act
                assert np.argmax(got) == np.argmax(w) or act == "q8"


@pytest.mark.slow
def test_our_q4_k_m_file_loads_in_llama_cpp(smollm2_q4_k_m):
    llama_cpp = _llama_cpp()
    llm = llama_cpp.Llama(model_path=str(smollm2_q4_k_m), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    with llambda.load(smollm2_q4_k_m, backend="numpy", n_ctx=64) as m:
        for p in PROMPTS:
            ids = m.tokenize(p)
            want = m.logits(ids)
            llm.reset()
            llm.eval(ids)
            got = np.asarray(llm.scores[len(ids) - 1], np.float32)
            top = np.argsort(want)[-20:]
            # llama.cpp computes with 8-bit activations: its own error against the FP32 oracle (measured on
            # SmolLM2: up to 1.26 here, 1.59 over every position of six prompts); a misread tensor is far worse
            assert float(np.abs(got[top] - want[top]).max()) <= 2.0, p
            assert int(np.argmax(got)) in set(np.argsort(want)[-3:].tolist())


# ---------------------------------------------------------------- DeepSeek's latent attention

# llama.cpp's mixes on DeepSeek's tensors (llama-quant.cpp's categories): the whole kv_b counts as attn_v
# (as a fused attn_qkv does); kv_a_mqa, q_a, q_b and the halves attn_k_b / attn_v_b its converter splits kv_b
# into have no role of their own (the default type); expert and shared-expert ffn_down are ffn_down.
# Per mix for the tiny models' 3 layers (use_more_bits holds for layer 2 only), one kv head per query head:
# (default, attn_v per layer, ffn_down per layer, attn_output)
DEEPSEEK_MIXES = {
    "q4_k_m": (Q.Q4_K, [Q.Q4_K, Q.Q4_K, Q.Q6_K], [Q.Q4_K, Q.Q4_K, Q.Q6_K], Q.Q4_K),
    "q5_k_m": (Q.Q5_K, [Q.Q5_K, Q.Q5_K, Q.Q6_K], [Q.Q5_K, Q.Q5_K, Q.Q6_K], Q.Q5_K),
    "q3_k_m": (Q.Q3_K, [Q.Q5_K, Q.Q5_K, Q.Q4_K], [Q.Q4_K] * 3, Q.Q4_K),
    "q2_k": (Q.Q2_K, [Q.Q3_K] * 3, [Q.Q3_K] * 3, Q.Q3_K),
}
# the tiny models are 64 wide: a 256-block type falls back to llama.cpp's 32-block one, F16 below 32
FALLBACK_32 = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def _deepseek_want(mix: str, name: str, cols: int | None = None) -> Q:
    default, attn_v, ffn_down, attn_output = DEEPSEEK_MIXES[mix]
    if name == "output.weight":
        want = Q.Q6_K if cols is None or cols % 256 == 0 else Q.Q8_0
    elif name.startswith("blk."):
        i, leaf = int(name.split(".")[1]), name.split(".")[2]
        want = {"attn_kv_b": attn_v[i], "attn_output": attn_output}.get(
            leaf, ffn_down[i] if leaf.startswith("ffn_down") else default)
    else:
        want = default
    if cols is None or cols % 256 == 0:
        return want
    want = FALLBACK_32.get(want, want)
    return want if cols % 32 == 0 else Q.F16


def _deepseek_matrices(folder: str) -> dict:
    """The tiny model's matrices (name -> shape) in both of llama.cpp's layouts: kv_b whole and split."""
    from llambda.formats.hf_dir import open_hf_dir
    src = open_hf_dir(TINY / folder)
    try:
        out = {n: t.shape for n, t in src.tensors() if len(t.shape) >= 2 and "ffn_gate_inp" not in n}
    finally:
        src.close()
    c = src.config
    for i in range(c.n_layers):
        out[f"blk.{i}.attn_k_b.weight"] = (c.n_heads, c.kv_lora_rank, c.qk_nope_dim)
        out[f"blk.{i}.attn_v_b.weight"] = (c.n_heads, c.v_head_dim, c.kv_lora_rank)
    return out


@pytest.mark.parametrize("folder", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("mix", list(DEEPSEEK_MIXES))
def test_deepseek_latent_attention_roles_in_each_mix(mix, folder):
    """Each matrix of the tiny model's names, 512 wide (no fallback hides a role): kv_b raised as attn_v,
    the other latent-attention matrices in the default type, as llama.cpp's mixes choose."""
    shapes = {n: (*s[:-1], 512) for n, s in _deepseek_matrices(folder).items()}
    leaves = {n.split(".")[2] for n in shapes if n.startswith("blk.")}
    assert {"attn_kv_a_mqa", "attn_kv_b", "attn_k_b", "attn_v_b", "attn_output", "ffn_down_exps",
            "ffn_down_shexp"} <= leaves
    assert ({"attn_q_a", "attn_q_b"} if folder == "deepseek_v3" else {"attn_q"}) <= leaves
    got = tensor_types(file_type(mix), shapes, 3, 1)
    assert {n: q.name for n, q in got.items()} == {n: _deepseek_want(mix, n).name for n in shapes}


@pytest.mark.parametrize("folder", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("mix", list(DEEPSEEK_MIXES))
def test_deepseek_quantized_file_types(tmp_path, mix, folder):
    """`llambda quantize` of the tiny model: kv_b split as llama.cpp's converter splits it, each matrix in its
    mix's type (after the fallback its 64-wide rows force), the router and the vectors in float."""
    from llambda.tools.export import export
    out = export(TINY / folder, tmp_path / "m.gguf", qtype=mix, progress=False)
    with GGUFFile(out) as f:
        got = {n: (t.qtype, t.shape) for n, t in f.tensors.items()}
    assert "blk.0.attn_kv_b.weight" not in got and "blk.2.attn_v_b.weight" in got
    for name, (qtype, shape) in got.items():
        if len(shape) < 2 or "ffn_gate_inp" in name or not name.endswith(".weight"):
            assert qtype == Q.F32, name
        else:
            assert qtype == _deepseek_want(mix, name, shape[-1]), (name, shape)
    with llambda.load(out, backend="numpy", n_ctx=32) as m:
        assert np.isfinite(m.logits([1, 5, 9, 2])).all()


def _llama_cpp_quantize(src, out, mix: str):
    import ctypes
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix.upper()}")
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out


def _expert_count(path) -> int:
    with GGUFFile(path) as f:
        return int(f.metadata.get(f"{f.metadata['general.architecture']}.expert_count", 0))


@pytest.mark.slow
@pytest.mark.parametrize("split", [True, False], ids=["kv_b split", "kv_b whole"])
@pytest.mark.parametrize("mix", list(DEEPSEEK_MIXES))
def test_deepseek_mixes_choose_what_llama_cpp_quantize_chooses(mix, split, tmp_path):
    """llama.cpp's quantizer on the tiny DeepSeek-V3 in either of its converter's layouts picks our types (its
    8 experts take llama.cpp's 8-expert rules too)."""
    from test_deepseek import converter_gguf
    src = converter_gguf("deepseek_v3", tmp_path / "f32.gguf", split)
    out = _llama_cpp_quantize(src, tmp_path / "theirs.gguf", mix)
    shapes, theirs, n_layers, gqa = _gguf_shapes(out)
    ours = tensor_types(file_type(mix), shapes, n_layers, gqa, n_experts=_expert_count(out))
    routers = {n for n in shapes if "ffn_gate_inp" in n}       # export keeps these float, as llama.cpp does
    assert {n: q.name for n, q in ours.items() if n not in routers} == \
        {n: q.name for n, q in theirs.items() if n not in routers}


@pytest.mark.parametrize("mix", ["q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m",
                                 "iq4_nl", "iq4_xs"])
def test_eight_experts_raise_attention_as_llama_cpp(mix):
    """A model of exactly 8 experts (Mixtral 8x7B): llama.cpp's mixes put attn_v and attn_k in Q8_0 and
    attn_output in Q5_K, or for Q3_K_L and Q5_K_* in the default type; any other count is a dense model's."""
    shapes_ = shapes(32, 4096, 14336, 1024, tied=False)
    dense = tensor_types(file_type(mix), shapes_, 32, 4)
    eight = tensor_types(file_type(mix), shapes_, 32, 4, n_experts=8)
    output = Q.Q5_K if mix not in ("q3_k_l", "q5_k_s", "q5_k_m") else file_type(mix).default
    for name, q in eight.items():
        leaf = name.split(".")[2] if name.startswith("blk.") else ""
        want = {"attn_v": Q.Q8_0, "attn_k": Q.Q8_0, "attn_output": output}.get(leaf, dense[name])
        assert q == want, (name, q, want)
    assert tensor_types(file_type(mix), shapes_, 32, 4, n_experts=64) == dense


@pytest.mark.slow
@pytest.mark.parametrize("mix", ["q4_k_m", "q3_k_l", "q2_k"])
def test_eight_expert_mixtral_types_as_llama_cpp_quantize(mix, tmp_path):
    """llama.cpp's quantizer on the tiny Mixtral, its 4 experts doubled to 8, picks our types."""
    import json
    import shutil
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    from llambda.tools.export import export
    d = tmp_path / "mixtral8"
    shutil.copytree(TINY / "mixtral", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_local_experts"] = 8
    (d / "config.json").write_text(json.dumps(cfg))
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    for n in list(arrays):
        if ".experts." in n:
            head, e, tail = n.split(".experts.")[0], int(n.split(".experts.")[1].split(".")[0]), n.split(".", 6)[6]
            arrays[f"{head}.experts.{e + 4}.{tail}"] = arrays[n]
        elif n.endswith("block_sparse_moe.gate.weight"):
            arrays[n] = np.concatenate([arrays[n], arrays[n]])
    write_safetensors(d / "model.safetensors", arrays)
    src = export(d, tmp_path / "f32.gguf", fmt="gguf", progress=False)
    assert _expert_count(src) == 8
    out = _llama_cpp_quantize(src, tmp_path / "theirs.gguf", mix)
    shapes_, theirs, n_layers, gqa = _gguf_shapes(out)
    ours = tensor_types(file_type(mix), shapes_, n_layers, gqa, n_experts=8)
    routers = {n for n in shapes_ if "ffn_gate_inp" in n}
    assert {n: q.name for n, q in ours.items() if n not in routers} == \
        {n: q.name for n, q in theirs.items() if n not in routers}

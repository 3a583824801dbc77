"""`llambda export`: HF directory <-> GGUF, with the layout and convention changes in between."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.tools import export as export_mod
from llambda.errors import LlambdaError, ModelFormatError
from llambda.tools.export import export
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.safetensors import SafetensorsFile
from llambda.formats.quants import QType

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
FOLDERS = sorted(p.name for p in TINY.iterdir() if (p / "config.json").is_file())
IDS = [5, 17, 300, 42, 42, 7, 511, 128, 64, 9, 250, 3, 77, 199, 18, 401, 33, 2, 90, 260, 12, 14, 350, 1, 8]


def logits(path, ids=IDS) -> np.ndarray:
    with llambda.load(path, backend="numpy", n_ctx=64) as m:
        return m.logits(ids)


def in_vocab(folder: str, ids=IDS) -> list[int]:
    """ids within a tiny folder's vocabulary (idefics3_vision's holds 450 ids, the others at least 512)."""
    cfg = json.loads((TINY / folder / "config.json").read_text(encoding="utf-8"))
    vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    return [i % vocab for i in ids]


# ---------------------------------------------------------------- a tiny random GGUF llama

def byte_level_vocab():
    from llambda.tokenizer.pieces import BYTE_CHARS
    tokens = list(BYTE_CHARS) + ["\u0120t", "he", "\u0120the", "ll", "<|endoftext|>"]
    merges = ["\u0120 t", "h e", "\u0120t he", "l l"]
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, merges, types


def tiny_llama_gguf(path: Path, qtype=QType.Q8_0, control_tokens=(), chat_template=None, width: int = 64) -> Path:
    """A 2-layer llama GGUF with random weights (q/k rows in GGUF's permuted layout by construction)
    and a small byte-level BPE tokenizer with a chat template (and any extra control tokens); `width` its
    hidden size (4 heads of width / 4)."""
    rng = np.random.default_rng(7)
    tokens, merges, types = byte_level_vocab()
    tokens, types = tokens + list(control_tokens), types + [3] * len(control_tokens)
    V, d, H, KV, hd, ff = len(tokens), width, 4, 2, width // 4, 128

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": (qtype, rng.standard_normal((V, d)).astype(np.float32)),
         "output_norm.weight": (QType.F32, norm(d)),
         "output.weight": (qtype, mat(V, d))}
    for i in range(2):
        p = f"blk.{i}."
        t.update({p + "attn_norm.weight": (QType.F32, norm(d)),
                  p + "attn_q.weight": (qtype, mat(H * hd, d, 1.5)),
                  p + "attn_k.weight": (qtype, mat(KV * hd, d, 1.5)),
                  p + "attn_v.weight": (qtype, mat(KV * hd, d)),
                  p + "attn_output.weight": (qtype, mat(d, H * hd, 4)),
                  p + "ffn_norm.weight": (QType.F32, norm(d)),
                  p + "ffn_gate.weight": (qtype, mat(ff, d)),
                  p + "ffn_up.weight": (qtype, mat(ff, d)),
                  p + "ffn_down.weight": (qtype, mat(d, ff, 4))})
    meta = {"general.architecture": "llama", "general.name": "tiny-llama",
            "llama.context_length": 64, "llama.embedding_length": d, "llama.block_count": 2,
            "llama.feed_forward_length": ff, "llama.attention.head_count": H, "llama.attention.head_count_kv": KV,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
            "llama.rope.dimension_count": hd, "llama.vocab_size": V,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": chat_template or
            "{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor %}"}
    write_gguf(path, meta, t)
    return path


TEXTS = ["hello the tell", "the the  thell\n", "x = 42 caf\u00e9 \u65e5\u672c", "<|endoftext|>the"]


def test_gguf_llama_to_hf_unpermutes_q_and_k(tmp_path, monkeypatch):
    gg = tiny_llama_gguf(tmp_path / "tiny.gguf")
    ids = [3, 100, 257, 258, 45, 12, 200, 99, 7, 1, 0, 255, 256, 30, 31, 32, 9, 150]
    want = logits(gg, ids)
    hf = export(gg, tmp_path / "hf", fmt="hf")
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is False
    with SafetensorsFile(hf / "model.safetensors") as f:
        assert {t.qtype for t in f.tensors.values()} == {QType.F32}      # Q8_0 dequantized exactly
    np.testing.assert_allclose(logits(hf, ids), want, atol=1e-4, rtol=0)

    # the control: the same export without moving q/k rows back runs a different model
    monkeypatch.setattr(export_mod, "partial_rope_permutation",
                        lambda heads, hd, rotated, to_interleaved: np.arange(heads * hd))
    bad = export(gg, tmp_path / "hf_unpermuted", fmt="hf")
    assert np.abs(logits(bad, ids) - want).max() > 0.05


def test_gguf_tokenizer_and_template_travel_to_hf_and_back(tmp_path):
    gg = tiny_llama_gguf(tmp_path / "tiny.gguf")
    hf = export(gg, tmp_path / "hf", fmt="hf")
    assert (hf / "tokenizer.json").is_file()
    back = export(hf, tmp_path / "back.gguf", fmt="gguf")
    with llambda.load(gg, backend="numpy", n_ctx=64) as a, llambda.load(hf, backend="numpy", n_ctx=64) as b, \
            llambda.load(back, backend="numpy", n_ctx=64) as c:
        for text in TEXTS:
            assert a.tokenize(text) == b.tokenize(text) == c.tokenize(text), text
        msgs = [{"role": "user", "content": "hi"}]
        assert a.render_chat(msgs) == b.render_chat(msgs) == c.render_chat(msgs)
        assert b.tokenizer.eos_id == a.tokenizer.eos_id
        np.testing.assert_allclose(c.logits([1, 2, 3, 258]), a.logits([1, 2, 3, 258]), atol=1e-4)
    with GGUFFile(back) as f:
        assert f.metadata["tokenizer.ggml.pre"] == "gpt-2"
        assert f.metadata_types["tokenizer.ggml.token_type"][1].name == "INT32"


def tied_in_config(folder: str) -> bool:
    """Whether the folder's HF config ties the head to the embeddings (read from the file, not by llambda;
    transformers' default is tied)."""
    cfg = json.loads((TINY / folder / "config.json").read_text())
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    return bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))


# GGUF cannot say everything a config.json does: FalconMamba's dt/B/C norms take the model's RMS epsilon there
# (llama.cpp has no key for mixer_rms_eps: 1e-5 for the folder's 1e-6)
GGUF_ATOL = {"falcon_mamba": 1e-3}


@pytest.mark.parametrize("folder", FOLDERS)
def test_hf_to_gguf_gives_the_same_logits(folder, tmp_path):
    gg = export(TINY / folder, tmp_path / f"{folder}.gguf", fmt="gguf")
    ids = in_vocab(folder)
    np.testing.assert_allclose(logits(gg, ids), logits(TINY / folder, ids), atol=GGUF_ATOL.get(folder, 1e-4), rtol=0)
    with llambda.load(gg, backend="numpy", n_ctx=32) as m, llambda.load(TINY / folder, backend="numpy", n_ctx=32) as h:
        for k in ("layer_sliding", "sliding_window", "qk_norm", "attn_bias", "post_norms", "attn_softcap",
                  "final_softcap", "activation", "layer_rope", "pre_norms", "qk_norm_whole", "residual_scale",
                  "logit_scale", "embed_scale"):
            want = getattr(h.config, k)     # GGUF stores float32 scalars
            assert getattr(m.config, k) == (pytest.approx(want, rel=1e-6) if isinstance(want, float) else want), k
    # an independent reader (gguf-py) accepts the file
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(gg))
    names = {t.name for t in r.tensors}
    last = h.config.n_layers - 1         # (qwen2_vl_vision's text model has one layer)
    assert "token_embd.weight" in names and ({f"blk.{last}.ffn_down.weight", f"blk.{last}.ffn_down_exps.weight",
                                             f"blk.{last}.ssm_out.weight"} & names)   # (or a state-space mixer)
    # (Falcon-H1's tied head is the embeddings times another multiplier than theirs: written apart)
    assert ("output.weight" in names) == (not tied_in_config(folder) or folder == "falcon_h1_nonorm")
    if folder == "phi3":
        assert "blk.0.attn_qkv.weight" in names and "blk.0.ffn_gate.weight" not in names


@pytest.mark.parametrize("folder", ["llama", "gemma2", "gemma3", "phi3", "qwen2", "mistral", "smollm3", "granite",
                                    "olmo2"])
def test_hf_to_gguf_to_hf(folder, tmp_path):
    gg = export(TINY / folder, tmp_path / "m.gguf", fmt="gguf")
    hf = export(gg, tmp_path / "hf", fmt="hf")
    np.testing.assert_allclose(logits(hf), logits(TINY / folder), atol=1e-4, rtol=0)
    cfg = json.loads((hf / "config.json").read_text())
    orig = json.loads((TINY / folder / "config.json").read_text())
    assert cfg["model_type"] == orig["model_type"]
    if folder == "llama":        # llama3 RoPE scaling went to rope_freqs.weight and came back
        want = {k: v for k, v in orig["rope_parameters"].items() if k != "rope_theta"}
        assert cfg["rope_scaling"] == pytest.approx(want)


@pytest.mark.parametrize("folder", ["gemma3", "phi3", "qwen2"])
def test_hf_to_hf_keeps_every_tensor_bit_for_bit(folder, tmp_path):
    hf = export(TINY / folder, tmp_path / "hf", fmt="hf")
    with SafetensorsFile(TINY / folder / "model.safetensors") as a, SafetensorsFile(hf / "model.safetensors") as b:
        assert set(a.tensors) == set(b.tensors)
        for name, t in a.tensors.items():
            assert b.tensors[name].shape == t.shape and bytes(b.tensors[name].data) == bytes(t.data), name


def test_bf16_export_equals_the_bf16_fixture(tmp_path):
    """llama-bf16 holds llama's weights rounded to bfloat16 (nearest even): so must our export."""
    hf = export(TINY / "llama", tmp_path / "hf", fmt="hf", qtype="bf16")
    assert json.loads((hf / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with SafetensorsFile(TINY / "llama-bf16" / "model.safetensors") as a, \
            SafetensorsFile(hf / "model.safetensors") as b:
        for name, t in a.tensors.items():
            assert b.tensors[name].qtype == QType.BF16 and bytes(b.tensors[name].data) == bytes(t.data), name


def test_gguf_quantized_export(tmp_path):
    gg = export(TINY / "qwen3", tmp_path / "q.gguf", fmt="gguf", qtype="q8_0")
    with GGUFFile(gg) as f:
        for name, t in f.tensors.items():
            assert t.qtype == (QType.Q8_0 if len(t.shape) == 2 else QType.F32), name
        assert f.metadata["general.quantization_version"] == 2
    err = np.abs(logits(gg) - logits(TINY / "qwen3")).max()
    assert 1e-5 < err < 1.0


def test_cli_export(tmp_path):
    from llambda.cli import main
    out = tmp_path / "cli.gguf"
    assert main(["export", "-m", str(TINY / "qwen2"), "--format", "gguf", "--out", str(out), "--type", "f16"]) == 0
    with GGUFFile(out) as f:
        assert f.tensors["blk.0.attn_q.weight"].qtype == QType.F16
        assert f.tensors["blk.0.attn_q.bias"].qtype == QType.F32
    assert np.abs(logits(out) - logits(TINY / "qwen2")).max() < 0.1
    assert main(["export", "-m", str(TINY / "qwen2"), "--format", "hf", "--out", str(tmp_path / "x"),
                 "--type", "q4_0"]) == 1


def test_export_refuses_what_the_target_cannot_express(tmp_path):
    d = tmp_path / "qwen2sw"
    shutil.copytree(TINY / "qwen2", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    del cfg["layer_types"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="layer_sliding"):
        export(d, tmp_path / "x.gguf", fmt="gguf")
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(LlambdaError, match="format"):
        export(TINY / "qwen2", tmp_path / "y", fmt="onnx")
    with pytest.raises(LlambdaError, match="q3_x"):
        export(TINY / "qwen2", tmp_path / "z.gguf", fmt="gguf", qtype="q3_x")


def test_phi3_with_separate_projections_is_fused_for_hf(tmp_path):
    """A Phi-3 GGUF may hold attn_q/k/v and ffn_gate/up separately; HF Phi-3 wants them fused."""
    fused = export(TINY / "phi3", tmp_path / "fused.gguf", fmt="gguf")
    with GGUFFile(fused) as f:
        meta, types = dict(f.metadata), dict(f.metadata_types)
        tensors = []
        for name, t in f.tensors.items():
            if name.endswith("attn_qkv.weight"):
                q, k, v = np.split(t.as_float32(), [64, 96])
                tensors += [(name.replace("qkv", x), QType.F32, a) for x, a in (("q", q), ("k", k), ("v", v))]
            elif name.endswith("ffn_up.weight"):
                gate, up = np.split(t.as_float32(), 2)
                tensors += [(name.replace("up", "gate"), QType.F32, gate), (name, QType.F32, up)]
            else:
                tensors.append((name, t.qtype, t.as_float32()))
    split = tmp_path / "split.gguf"
    write_gguf(split, meta, tensors, metadata_types=types)
    want = logits(TINY / "phi3")
    np.testing.assert_allclose(logits(split), want, atol=1e-4, rtol=0)
    hf = export(split, tmp_path / "hf", fmt="hf")
    with SafetensorsFile(hf / "model.safetensors") as f:
        assert f.tensors["model.layers.0.self_attn.qkv_proj.weight"].shape == (128, 64)
        assert f.tensors["model.layers.0.mlp.gate_up_proj.weight"].shape == (256, 64)
        assert not any("q_proj" in n or "gate_proj." in n for n in f.tensors)
    np.testing.assert_allclose(logits(hf), want, atol=1e-4, rtol=0)


def test_quantize_command_writes_a_gguf_that_runs_natively(tmp_path):
    """`llambda quantize IN OUT TYPE`: matrices in the type, norms F32; the file loads on the native
    backend without any conversion and gives the NumPy oracle's logits."""
    import warnings

    from llambda.backends import available_backends
    from llambda.cli import main
    from llambda.formats.quants import QType

    out = tmp_path / "q.gguf"
    assert main(["quantize", str(TINY / "qwen3"), str(out), "q5_1"]) == 0
    with GGUFFile(out) as f:
        types = {t.qtype for t in f.tensors.values()}
        assert QType.Q5_1 in types and types <= {QType.Q5_1, QType.F32}, types
    if "native" not in available_backends():
        return
    ids = [1, 5, 9, 2, 7]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no type conversion at load
        with llambda.load(out, backend="native", activations="f32", n_ctx=64) as m:
            got = m.logits(ids)
    with llambda.load(out, backend="numpy", n_ctx=64) as m:
        want = m.logits(ids)
    assert float(np.abs(got - want).max()) <= 1e-3


def test_quantize_command_to_a_k_type_says_its_fallbacks_once(tmp_path, capsys):
    """`llambda quantize` of the tiny model (rows 64 and 128 wide) to q4_k: every matrix takes llama.cpp's Q5_0
    (Q4_K needs 256-value rows), and one line on stderr says how many and why (it was silent)."""
    from llambda.cli import main
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(TINY / "qwen3"), str(out), "q4_k"]) == 0
    with GGUFFile(out) as f:
        mats = [t for n, t in f.tensors.items() if len(t.shape) == 2 and "ffn_gate_inp" not in n]
        assert {t.qtype for t in mats} == {QType.Q5_0}
    err = capsys.readouterr().err
    line = f"quantize to q4_k: {len(mats)} matrices whose rows do not split into their type's 256-value blocks " \
           f"took llama.cpp's fallback type: {len(mats)} Q4_K -> Q5_0"
    assert err.count(line) == 1, err


def test_an_output_that_cannot_be_written_is_refused_up_front(tmp_path, capsys):
    """quantize/export to a directory, or below a regular file: a typed error before any conversion (once a raw
    IsADirectoryError from the final rename, after all the work)."""
    from llambda.cli import main
    (tmp_path / "adir").mkdir()
    assert main(["quantize", str(TINY / "qwen3"), str(tmp_path / "adir"), "q8_0"]) == 1
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    with pytest.raises(LlambdaError, match="cannot create the directory"):
        export(TINY / "qwen3", tmp_path / "afile" / "out.gguf", fmt="gguf")
    with pytest.raises(LlambdaError, match="not a directory"):
        export(TINY / "qwen3", tmp_path / "afile", fmt="hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


def test_a_failed_write_is_a_typed_error(tmp_path, monkeypatch):
    """An OSError of the write itself (a read-only file system, a full disk) names the output."""
    import llambda.formats.gguf_writer as writer

    def refuse(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(writer, "write_gguf", refuse)
    with pytest.raises(LlambdaError, match="cannot write .*Permission denied"):
        export(TINY / "qwen3", tmp_path / "q.gguf", fmt="gguf")


@pytest.mark.parametrize("fmt, qtype", [("gguf", ""), ("hf", ""), ("hf", 5)])
def test_an_empty_or_odd_type_name_is_refused(tmp_path, fmt, qtype):
    """`llambda quantize IN OUT ""` wrote the source's own types and said it had quantized; 5 was an AttributeError."""
    with pytest.raises(LlambdaError, match="cannot quantize to ''|stores f32, f16 or bf16"):
        export(TINY / "qwen3", tmp_path / "out", fmt=fmt, qtype=qtype)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- llama.cpp loads what we write

# tiny models llama.cpp cannot hold, whatever the file says (its limits)
LLAMA_CPP_CANNOT = {
    "deepseek_v2": "llama.cpp requires deepseek2.attention.q_lora_rank but in a 26- or 27-layer model (V2-Lite)",
    "qwen3_moe": "llama.cpp's qwen3moe has no dense layer, which this tiny model has",
    "gemma3n": "llama.cpp hard-codes 256 per-layer input values a layer (this model has 4): tests/test_gemma3n.py "
               "compares llama.cpp on a variant of it with 256",
    "cohere": "llama.cpp's command-r loads q/k norms only in a model of 64 layers or more (Command R+): "
              "tests/test_cohere.py compares llama.cpp on a 64-layer variant and on this one without the norms",
}
# ones it loads but runs otherwise than the file says: loaded and run, logits not compared
LLAMA_CPP_RUNS_OTHERWISE = {
    "gemma2": "llama.cpp takes Gemma 2's attention scale from the model size, not gemma2.attention.scale",
    "exaone4": "llama.cpp slides (and leaves global layers unrotated) only in a 64-layer exaone4: tests/test_exaone4.py "
               "compares llama.cpp on 64-layer and windowless variants",
}
# ones whose quantized runs in llama.cpp part from ours by more than its 8-bit rounding of activations
# would suggest: that rounding flips close expert choices (DeepSeek-V3; OLMoE, whose k weights are not
# renormalised: our own 8-bit activations move its q4_0 logits by 1.6; LFM2-MoE, whose sigmoid choices with
# a bias are close: 1.0 on q4_k_m) and is amplified by the delta net's recurrence (Qwen3-Next). Their
# quantized files are run, and their weights as we dequantize them, written as F32, compared.
LLAMA_CPP_SENSITIVE = ("deepseek_v3", "qwen3_next", "olmoe", "jamba", "lfm2_moe")     # jamba: as OLMoE (q4_0 measured 1.7)
# what we write: `llambda export --type` of the folder, or `llambda quantize` of its f32 export; and how far
# llama.cpp's logits may be from ours on it (it rounds activations to f16 beside f16 matrices and to 8-bit
# blocks beside quantized ones, which on these random models moves logits by a few tenths)
LLAMA_CPP_FILES = {"f32": 0.05, "f16": 0.2, "q8_0": 0.75, "quantize q4_0": 0.75, "quantize q4_k_m": 0.75}


@pytest.mark.parametrize("kind", list(LLAMA_CPP_FILES))
@pytest.mark.parametrize("folder", FOLDERS)
def test_llama_cpp_loads_and_runs_what_we_write(folder, kind, tmp_path, monkeypatch):
    """Our GGUF exports and quantizations load in llama.cpp as written (it refused `tokenizer.ggml.pre`
    "gpt2" and token types not INT32, a file without tokenizer.ggml.model, `blk.N.ssm_a.weight` for its
    `ssm_a`, and aborted on a convolution kernel not in F32), and its logits match ours on them."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the bench extra)")
    if folder in LLAMA_CPP_CANNOT:
        pytest.skip(LLAMA_CPP_CANNOT[folder])
    from llamacpp_ref import llama_cpp_logits
    from llambda.cli import main
    qtype = kind.split()[-1]
    if kind.startswith("quantize"):
        src = export(TINY / folder, tmp_path / "f32.gguf", fmt="gguf", qtype="f32")
        path = tmp_path / f"{qtype}.gguf"
        assert main(["quantize", str(src), str(path), qtype]) == 0
    else:
        path = export(TINY / folder, tmp_path / f"{qtype}.gguf", fmt="gguf", qtype=qtype)
    ids = in_vocab(folder, IDS[:12])      # within the tiny models' sliding windows (llama.cpp has none for Mistral)
    theirs = llama_cpp_logits(path, ids)
    if folder in LLAMA_CPP_RUNS_OTHERWISE:
        return
    if folder == "gpt_oss":               # llama.cpp rounds the ends of the YaRN ramp
        from test_moe import round_yarn_as_llama_cpp
        round_yarn_as_llama_cpp(monkeypatch)
    tol = LLAMA_CPP_FILES[kind]
    if folder in LLAMA_CPP_SENSITIVE and kind not in ("f32", "f16"):
        path, tol = dequantized_twin(path, tmp_path / "twin.gguf"), LLAMA_CPP_FILES["f32"]
        theirs = llama_cpp_logits(path, ids)
    assert float(np.abs(logits(path, ids) - theirs).max()) <= tol


def dequantized_twin(src: Path, out: Path) -> Path:
    """The GGUF at src with every tensor as F32 holding the values our dequantizer reads from it."""
    from llambda.formats.quants import dequantize
    with GGUFFile(src) as f:
        meta, types = dict(f.metadata), f.metadata_types
        items = [(n, QType.F32, dequantize(np.array(t.data), t.qtype, t.shape).astype(np.float32))
                 for n, t in f.tensors.items()]
    meta["general.file_type"] = 0
    write_gguf(out, meta, items, metadata_types=types)
    return out


def test_quantize_rewrites_old_tokenizer_spellings_llama_cpp_refuses(tmp_path):
    """A GGUF we wrote before (pre-tokenizer "gpt2", token types as UINT32) quantized again: the output
    spells them as llama.cpp reads them ("gpt-2", INT32), whatever the source's types were."""
    from llambda.cli import main
    from llambda.formats.gguf import GGUFValueType as VT
    src = tiny_llama_gguf(tmp_path / "a.gguf", qtype=QType.F32)
    with GGUFFile(src) as f:
        meta, types = {**f.metadata, "tokenizer.ggml.pre": "gpt2"}, dict(f.metadata_types)
        items = [(n, t.qtype, np.array(t.data), t.shape) for n, t in f.tensors.items()]
    types["tokenizer.ggml.token_type"] = (VT.ARRAY, VT.UINT32)
    write_gguf(tmp_path / "old.gguf", meta, items, metadata_types=types)
    assert main(["quantize", str(tmp_path / "old.gguf"), str(tmp_path / "q.gguf"), "q8_0"]) == 0
    with GGUFFile(tmp_path / "q.gguf") as f:
        assert f.metadata["tokenizer.ggml.pre"] == "gpt-2"
        assert f.metadata_types["tokenizer.ggml.token_type"] == (VT.ARRAY, VT.INT32)

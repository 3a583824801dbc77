"""nomic-bert (nomic-embed-text v1 / v1.5): rotary positions, a fused Wqkv without biases, a SwiGLU MLP,
post-norms, mean pooling.

transformers has no nomic_bert (Nomic ships its own modelling code), so the independent reference is llama.cpp
(llama-cpp-python's libllama knows `nomic-bert`): a tiny random model written as the GGUF its converter writes
(convert_hf_to_gguf.py's NomicBertModel: `nomic-bert.*` sizes, attn_qkv, ffn_up = fc11, ffn_gate = fc12, the
WordPiece vocabulary in phantom-space form), its embeddings against llama.cpp's; the same weights under the
HF custom code's names as a directory, against the GGUF; and a float64 NumPy forward written here.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import llambda
from llambda.errors import ModelFormatError
from test_bert_gguf import _mkdir, changed_gguf, llama_cpp_style_gguf
from test_embeddings import TINY_TEXTS, _ln, _tiny_bert_dir

ROPE_BASE = 1000.0      # nomic-embed-text's rotary_emb_base (not the default 10000: a reader ignoring it fails)
CONFIG = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "n_embd": 32, "n_head": 4, "n_layer": 2,
          "n_inner": 48, "n_positions": 64, "max_trained_positions": 16, "type_vocab_size": 2,
          "layer_norm_epsilon": 1e-12, "activation_function": "swiglu", "rotary_emb_base": ROPE_BASE,
          "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_scaling_factor": None,
          "prenorm": False, "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False}
_GLOBAL = {"embeddings.word_embeddings.weight": "token_embd.weight",
           "embeddings.token_type_embeddings.weight": "token_types.weight",
           "emb_ln.weight": "token_embd_norm.weight", "emb_ln.bias": "token_embd_norm.bias"}
_LAYER = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output", "norm1": "attn_output_norm",
          "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate", "mlp.fc2": "ffn_down", "norm2": "layer_output_norm"}


def gguf_name(hf: str) -> str | None:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    parts = hf.split(".")          # encoder.layers.N.<module>.<leaf>
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{_LAYER[module]}.{parts[-1]}" if parts[:2] == ["encoder", "layers"] else None


def tiny_nomic_dir(root: Path, seed: int = 3, **changes) -> Path:
    """A random 2-layer nomic-bert as Nomic's HF directory (its custom code's tensor names), with
    test_embeddings' tiny WordPiece tokenizer."""
    folder, _, _ = _tiny_bert_dir(root)
    cfg = {**CONFIG, "vocab_size": json.loads((folder / "config.json").read_text())["vocab_size"], **changes}
    rng = np.random.default_rng(seed)
    H, F, V = cfg["n_embd"], cfg["n_inner"], cfg["vocab_size"]

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    W = {"embeddings.word_embeddings.weight": w(V, H, scale=1.0),
         "embeddings.token_type_embeddings.weight": w(2, H), "emb_ln.weight": 1 + w(H, scale=0.1),
         "emb_ln.bias": w(H, scale=0.1)}
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        W |= {p + "attn.Wqkv.weight": w(3 * H, H), p + "attn.out_proj.weight": w(H, H),
              p + "mlp.fc11.weight": w(F, H), p + "mlp.fc12.weight": w(F, H), p + "mlp.fc2.weight": w(H, F)}
        for n in ("norm1", "norm2"):
            W |= {p + n + ".weight": 1 + w(H, scale=0.1), p + n + ".bias": w(H, scale=0.1)}
    save_file(W, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def nomic_gguf(folder: Path, out: Path) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    sizes = {"context_length": cfg["max_trained_positions"], "embedding_length": cfg["n_embd"],
             "feed_forward_length": cfg["n_inner"], "block_count": cfg["n_layer"],
             "attention.head_count": cfg["n_head"], "attention.layer_norm_epsilon": cfg["layer_norm_epsilon"],
             "rope.freq_base": cfg["rotary_emb_base"]}
    gg = llama_cpp_style_gguf(folder, out.with_suffix(".tmp"), arch="nomic-bert", names=gguf_name, sizes=sizes)
    # [CLS] and [SEP] as BOS and EOS too, which llama.cpp's WordPiece adds (its defaults, 101 and 102, are
    # bert-base-uncased's ids)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    out = changed_gguf(gg, out, {"tokenizer.ggml.bos_token_id": vocab["[CLS]"],
                                 "tokenizer.ggml.eos_token_id": vocab["[SEP]"]})
    gg.unlink()
    return out


def reference_forward(W: dict, cfg: dict, ids) -> np.ndarray:
    """Hidden states (t, hidden) of one sequence in float64: rotate-half RoPE, SwiGLU, post-norms."""
    g = {k: v.astype(np.float64) for k, v in W.items()}
    t, nh, H = len(ids), cfg["n_head"], cfg["n_embd"]
    d, eps = H // nh, cfg["layer_norm_epsilon"]
    ang = np.arange(t)[:, None] * cfg["rotary_emb_base"] ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):                   # (t, heads, d): halves (j, j + d/2) rotated
        a, b = x[..., :d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    x = _ln(g["embeddings.word_embeddings.weight"][ids] + g["embeddings.token_type_embeddings.weight"][0],
            g["emb_ln.weight"], g["emb_ln.bias"], eps)
    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        q, k, v = np.split(x @ g[p + "attn.Wqkv.weight"].T, 3, axis=-1)
        q, k, v = rope(q.reshape(t, nh, d)), rope(k.reshape(t, nh, d)), v.reshape(t, nh, d)
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", a, v).reshape(t, H) @ g[p + "attn.out_proj.weight"].T
        x = _ln(x + att, g[p + "norm1.weight"], g[p + "norm1.bias"], eps)
        up, gate = x @ g[p + "mlp.fc11.weight"].T, x @ g[p + "mlp.fc12.weight"].T
        mlp = (up * gate / (1 + np.exp(-gate))) @ g[p + "mlp.fc2.weight"].T
        x = _ln(x + mlp, g[p + "norm2.weight"], g[p + "norm2.bias"], eps)
    return x


def _load(path, backend="numpy", activations=None):
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(path, backend=backend, activations=activations)


@pytest.mark.parametrize("backend,activations,tol", [("numpy", None, 1e-6), ("native", "f32", 1e-5),
                                                     ("native", None, 1e-2)])
def test_nomic_dir_matches_a_numpy_reference(tmp_path, backend, activations, tol):
    folder = tiny_nomic_dir(tmp_path)
    W, cfg = load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())
    with _load(folder, backend, activations) as m:
        assert m.is_encoder and not m.is_reranker and m.config.arch == "nomic_bert"
        assert m.config.max_tokens == 16             # max_trained_positions, not n_positions
        got = m.embed(TINY_TEXTS, batch_size=4)
        for text, v in zip(TINY_TEXTS, got):
            ids = m.tokenizer.encode_for_encoder([text], 16)[0][0]
            want = reference_forward(W, cfg, ids).mean(0)
            assert np.abs(v - want / np.linalg.norm(want)).max() <= tol, text
        alone = np.stack([m.embed([t])[0] for t in TINY_TEXTS])    # a vector does not depend on its batch
        assert np.abs(alone - got).max() <= max(tol, 1e-5)


def test_nomic_gguf_embeds_as_its_directory(tmp_path):
    folder = tiny_nomic_dir(_mkdir(tmp_path / "hf"))
    gg = nomic_gguf(folder, tmp_path / "nomic.gguf")
    with _load(folder) as hf, _load(gg) as m:
        assert m.config.arch == "nomic_bert" and m.config.rope_base == ROPE_BASE
        assert m.config.max_tokens == hf.config.max_tokens == 16
        np.testing.assert_allclose(m.embed(TINY_TEXTS), hf.embed(TINY_TEXTS), atol=2e-6, rtol=0)


def test_nomic_gguf_matches_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the independent nomic-bert reference")
    from llamacpp_ref import llama_cpp_embeddings
    gg = nomic_gguf(tiny_nomic_dir(_mkdir(tmp_path / "hf")), tmp_path / "nomic.gguf")
    texts = TINY_TEXTS[:-1]          # (the last is past the 16 tokens; llama.cpp does not truncate)
    theirs = llama_cpp_embeddings(gg, texts)
    with _load(gg) as m:
        assert [ids for ids, _ in m.tokenizer.encode_for_encoder(texts, 16)] == [t["ids"] for t in theirs]
        ours = m.embed(texts)
    # llama.cpp rounds some products' inputs to float16 on CPU (3.5e-4 here); the default rotary base 10000 in
    # place of the file's 1000 is 4.5e-2
    np.testing.assert_allclose(ours, np.array([t["embedding"] for t in theirs]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("change", [{"rotary_emb_interleaved": True}, {"prenorm": True}, {"qkv_proj_bias": True},
                                    {"rotary_scaling_factor": 2.0}, {"activation_function": "gelu"},
                                    {"rotary_emb_fraction": 0.5}, {"rotary_emb_base": -1}, {"n_head": 3},
                                    {"use_rms_norm": True}, {"moe_every_n_layers": 2}, {"causal": True}])
def test_unsupported_nomic_configs_are_model_format_errors(tmp_path, change):
    with pytest.raises(ModelFormatError):
        llambda.load(tiny_nomic_dir(tmp_path, **change), backend="numpy")


def test_nomic_gguf_with_a_product_bias_is_refused(tmp_path):
    from llambda.formats.gguf import GGUFFile
    from llambda.formats.gguf_writer import write_gguf
    gg = nomic_gguf(tiny_nomic_dir(_mkdir(tmp_path / "hf")), tmp_path / "a.gguf")
    with GGUFFile(gg) as f:
        meta = dict(f.metadata)
        tensors = {n: (t.qtype, np.frombuffer(t.data, np.float32).reshape(t.shape)) for n, t in f.tensors.items()}
    tensors["blk.0.attn_qkv.bias"] = (tensors["token_embd_norm.bias"][0], np.zeros(96, np.float32))
    write_gguf(tmp_path / "b.gguf", meta, tensors)
    with pytest.raises(ModelFormatError, match="no biases"):
        llambda.load(tmp_path / "b.gguf", backend="numpy")
    with pytest.raises(ModelFormatError, match="causal"):
        llambda.load(changed_gguf(gg, tmp_path / "c.gguf", {"nomic-bert.attention.causal": True}), backend="numpy")


def test_an_integer_rotary_fraction_is_the_same_setting(tmp_path):
    with _load(tiny_nomic_dir(_mkdir(tmp_path / "a"))) as a, \
            _load(tiny_nomic_dir(_mkdir(tmp_path / "b"), rotary_emb_fraction=1)) as b:
        np.testing.assert_array_equal(a.embed(TINY_TEXTS), b.embed(TINY_TEXTS))

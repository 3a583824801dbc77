"""EmbeddingGemma: Gemma 3's text layers with bidirectional attention (a banded window in the sliding layers), mean
pooling, sentence-transformers' Dense modules, L2 normalisation.

References: transformers' Gemma3TextModel with use_bidirectional_attention (tools/make_tiny_embeddinggemma.py wrote
tests/fixtures/encoders/embeddinggemma: the folder as sentence-transformers saves it, and reference.json: per input,
token ids longer and shorter than the sliding window, the last hidden states and the final embedding, pooling and
the Dense layers applied in torch from the saved weights); and llama.cpp (llama-cpp-python's libllama knows
`gemma-embedding`) on the same weights written as the GGUF its converter writes with
--sentence-transformers-dense-modules (norms stored as 1 + w, `dense_2` / `dense_3` and their sizes).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import llambda
from llambda.errors import ModelFormatError
from test_nomic_bert import _load

# (backend, activations, tolerance to transformers' vector): float32 sums, and the fast mode's bfloat16 products
BACKENDS = [("numpy", None, 1e-6), ("native", "f32", 1e-5), ("native", None, 1e-2)]


def reference(name: str):
    """(folder, reference.json, each case's ids, the embeddings) of tests/fixtures/encoders/`name`."""
    folder = Path(__file__).parent / "fixtures" / "encoders" / name
    ref = json.loads((folder / "reference.json").read_text())
    return folder, ref, [c["ids"] for c in ref["cases"]], np.array([c["embedding"] for c in ref["cases"]])


FIXTURE, REF, IDS, WANT = reference("embeddinggemma")


@pytest.mark.parametrize("backend,activations,tol", BACKENDS)
def test_embeddinggemma_dir_matches_transformers(backend, activations, tol):
    with _load(FIXTURE, backend, activations) as m:
        assert m.is_encoder and not m.is_reranker and m.config.arch == "gemma-embedding"
        assert m.config.dense == [(32, 80), (80, 32)] and m.config.text.sliding_window == 8
        got = m.embed(IDS, batch_size=4)
        assert np.abs(got - WANT).max() <= tol
        alone = np.stack([m.embed([ids])[0] for ids in IDS])      # a vector does not depend on its batch
        assert np.abs(alone - got).max() <= max(tol, 1e-5)
        if activations == "f32" or backend == "numpy":           # the hidden states themselves, packed
            from llambda.models.bert import pack_batch
            ids, types, starts = pack_batch([(i, [0] * len(i)) for i in IDS])
            hidden = m.encoder.forward(ids, types, starts)
            for s, case in enumerate(REF["cases"]):
                want = np.array(case["hidden"])
                rows = hidden[starts[s]:starts[s + 1]]
                assert np.abs(rows - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def assert_the_band_matters(m, widen, ids: list, want: np.ndarray, half: int) -> None:
    """The texts longer than a local layer's band embed otherwise once widen() lets it see whole texts (the
    reference tells them apart), the shorter ones the same."""
    long = [i for i, x in enumerate(ids) if len(x) - 1 > half]
    assert long and len(long) < len(ids)
    widen()
    wide = m.embed(ids)
    assert np.abs(wide[long] - want[long]).max() > 1e-3
    short = [i for i in range(len(ids)) if i not in long]
    assert np.abs(wide[short] - want[short]).max() <= 1e-5


def test_the_window_and_the_dense_layers_matter():
    """The window matters, and every text differs without the Dense layers."""
    with _load(FIXTURE) as m:
        assert_the_band_matters(m, lambda: setattr(m.encoder, "half", 10 ** 6), IDS, WANT, 4)
        m.encoder.half = 4
        m.encoder.dense, m.config.dense = [], []
        plain = m.embed(IDS)
        assert plain.shape == WANT.shape and np.abs(plain - WANT).max() > 1e-2


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "eg"
    shutil.copytree(FIXTURE, out)
    return out


def _edit(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("where,change", [
    # a causal Gemma 3 text model: a decoder, which a Gemma3TextModel checkpoint (no lm_head, no `model.`) is not
    ("config.json", {"use_bidirectional_attention": False}),
    ("2_Dense/config.json", {"bias": True}),
    ("2_Dense/config.json", {"activation_function": "torch.nn.modules.activation.Tanh"}),
    ("3_Dense/config.json", {"out_features": 40}),
    ("1_Pooling/config.json", {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}),
    ("config.json", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e3},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
])
def test_unsupported_embeddinggemma_folders_are_refused(tmp_path, where, change):
    folder = _copy(tmp_path)
    _edit(folder / where, **change)
    with pytest.raises(ModelFormatError):
        llambda.load(folder, backend="numpy")


def test_transformers_4_config_spelling_is_the_same_model(tmp_path):
    """embeddinggemma-300m's config.json (transformers 4.56): rope_theta and rope_local_base_freq, no rope_parameters."""
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["rope_parameters"]
    cfg |= {"rope_theta": 1000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None}
    (folder / "config.json").write_text(json.dumps(cfg))
    with _load(folder) as m:
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


def test_a_dense_module_without_its_weights_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "3_Dense" / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError):
        llambda.load(folder, backend="numpy")


@pytest.mark.parametrize("where", ["../elsewhere", "/tmp", ""])
def test_a_dense_module_outside_the_folder_is_refused(tmp_path, where):
    folder = _copy(tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules[2]["path"] = where
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFormatError, match="Dense module"):
        llambda.load(folder, backend="numpy")



def test_a_dense_module_symlinked_out_of_the_folder_is_refused(tmp_path):
    """A Dense folder that is a symlink to a folder outside the model's is not read (the shape check of the outside
    folder's config.json is not reached: it loaded as the model's layer before)."""
    folder = _copy(tmp_path)
    outside = tmp_path / "outside"
    shutil.move(folder / "2_Dense", outside)
    (folder / "2_Dense").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ModelFormatError, match="inside the model's folder"):
        llambda.load(folder, backend="numpy")


def test_a_symlinked_dense_file_inside_the_folder_still_loads(tmp_path):
    """A hub cache's files are links to its blobs: a Dense module's weights as a link are read."""
    folder = _copy(tmp_path)
    blob = tmp_path / "blob"
    shutil.move(folder / "2_Dense" / "model.safetensors", blob)
    (folder / "2_Dense" / "model.safetensors").symlink_to(blob)
    with _load(folder) as m:
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


@pytest.mark.parametrize("modules", [{"0": {"path": "2_Dense"}}, ["2_Dense"], [{"path": "2_Dense"}], "x"])
def test_a_modules_json_that_is_not_a_list_of_modules_is_refused(tmp_path, modules):
    """It was skipped: the model embedded without its Dense layers, not as sentence-transformers does."""
    folder = _copy(tmp_path)
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFormatError, match="modules.json"):
        llambda.load(folder, backend="numpy")


# -- the GGUF llama.cpp's converter writes (convert_hf_to_gguf.py's EmbeddingGemma) --

_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
          "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm"}


def embeddinggemma_gguf(folder: Path, out: Path, dense: bool = True, matrices=None, embd=None, **meta_changes) -> Path:
    """The folder as llama.cpp's converter writes it: Gemma 3's names, norms + 1, a SentencePiece vocabulary (the
    tiny one here: specials, the 256 byte tokens, pieces), `gemma-embedding.*` sizes, the Dense layers."""
    from llambda.formats.gguf import QType
    from llambda.formats.gguf_writer import write_gguf
    cfg = json.loads((folder / "config.json").read_text())
    tensors = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        w = w.astype(np.float32) + (1.0 if name.endswith("norm.weight") else 0.0)
        if name == "embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "norm.weight":
            g = "output_norm.weight"
        else:
            _, i, rest = name.split(".", 2)
            g = f"blk.{i}.{_LAYER[rest[:-len('.weight')]]}.weight"
        kind = embd if g == "token_embd.weight" else matrices if w.ndim == 2 else None
        kind = kind or QType.F32
        tensors[g] = (kind, np.ascontiguousarray(w, dtype=np.float32))
    a = "gemma-embedding"
    meta = {"general.architecture": a, "general.name": "tiny-embeddinggemma",
            f"{a}.context_length": cfg["max_position_embeddings"], f"{a}.embedding_length": cfg["hidden_size"],
            f"{a}.block_count": cfg["num_hidden_layers"], f"{a}.feed_forward_length": cfg["intermediate_size"],
            f"{a}.attention.head_count": cfg["num_attention_heads"],
            f"{a}.attention.head_count_kv": cfg["num_key_value_heads"],
            f"{a}.attention.key_length": cfg["head_dim"], f"{a}.attention.value_length": cfg["head_dim"],
            f"{a}.attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
            f"{a}.rope.freq_base": float(cfg["rope_parameters"]["full_attention"]["rope_theta"]),
            f"{a}.attention.sliding_window": cfg["sliding_window"], f"{a}.pooling_type": 1}
    if dense:
        for k, sub in ((2, "2_Dense"), (3, "3_Dense")):
            dc = json.loads((folder / sub / "config.json").read_text())
            meta[f"{a}.dense_{k}_feat_in"], meta[f"{a}.dense_{k}_feat_out"] = dc["in_features"], dc["out_features"]
            w = load_file(str(folder / sub / "model.safetensors"))["linear.weight"]
            tensors[f"dense_{k}.weight"] = (QType.F32, np.ascontiguousarray(w, dtype=np.float32))
    V = cfg["vocab_size"]
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581", "w", "x", "\u2581w", "\u2581x"] + list("0123456789")
    pieces += [f"\u2581w{i}" for i in range(V - len(pieces))]
    meta |= {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
             "tokenizer.ggml.scores": [0.0] * 260 + [-5.0 - i for i in range(15)] + [-1.0] * (V - 275),
             "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * 256 + [1] * (V - 260),
             "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
             "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.unknown_token_id": 3,
             "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    meta |= meta_changes
    write_gguf(out, {k: v for k, v in meta.items() if v is not None}, tensors)
    return out


def test_embeddinggemma_gguf_embeds_as_transformers(tmp_path):
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "eg.gguf")
    with _load(gg) as m:
        assert m.config.arch == "gemma-embedding" and m.config.dense == [(32, 80), (80, 32)]
        assert m.config.text.rope_theta == 1000.0 and m.config.text.rope_theta_local == 10000.0
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


def test_embeddinggemma_gguf_matches_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the second EmbeddingGemma reference")
    from llamacpp_ref import llama_cpp_embeddings
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "eg.gguf")
    theirs = np.array([t["embedding"] for t in llama_cpp_embeddings(gg, IDS)])
    with _load(gg) as m:
        ours = m.embed(IDS)
    # 2.2e-4 here (llama.cpp rounds some products' inputs to float16 on CPU); a sliding layer seeing the whole
    # text is 9e-2 to 0.34 on the longer texts
    assert np.abs(ours - theirs).max() <= 1e-3
    assert np.abs(theirs - WANT).max() <= 1e-3        # (and llama.cpp agrees with transformers)


def test_a_quantized_embeddinggemma_gguf_matches_llama_cpp(tmp_path):
    """F16 matrices and a Q8_0 embedding table (its rows dequantized per batch) read as llama.cpp reads them."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the second EmbeddingGemma reference")
    from llambda.formats.gguf import QType
    from llamacpp_ref import llama_cpp_embeddings
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "q.gguf", matrices=QType.F16, embd=QType.Q8_0)
    theirs = np.array([t["embedding"] for t in llama_cpp_embeddings(gg, IDS)])
    with _load(gg) as m:
        ours = m.embed(IDS)
    assert np.abs(ours - theirs).max() <= 1e-3
    assert np.abs(ours - WANT).max() <= 2e-2          # (4e-3: the rounding's own distance from float32)


def test_embeddinggemma_gguf_texts_as_llama_cpp(tmp_path):
    """Texts through the GGUF's SentencePiece vocabulary: <bos> ... <eos> (add_bos_token, add_eos_token), as
    llama.cpp tokenizes them, and the same vectors."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the second EmbeddingGemma reference")
    from llamacpp_ref import llama_cpp_embeddings
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "eg.gguf")
    texts = ["w1 w2 w30", "w7 x w12w5 w4 w3 w200 w3 w1", "x"]
    theirs = llama_cpp_embeddings(gg, texts)
    with _load(gg) as m:
        ids = [i for i, _ in m.tokenizer.encode_for_encoder(texts, 64)]
        assert ids == [t["ids"] for t in theirs] and all(i[0] == 2 and i[-1] == 1 for i in ids)
        assert m.tokenizer.encode_for_encoder(["w1 w2 w3 w4"], 4)[0][0] == [2, *ids[0][1:3], 1]   # cut, kept
        assert np.abs(m.embed(texts) - np.array([t["embedding"] for t in theirs])).max() <= 1e-3


def test_a_gguf_without_dense_layers_embeds_the_pooled_states(tmp_path):
    """The converter writes the Dense layers only when asked: without them the vector is the normalized mean."""
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "plain.gguf", dense=False)
    with _load(gg) as m, _load(FIXTURE) as hf:
        assert m.config.dense == []
        mean = np.stack([np.array(c["hidden"]).mean(0) for c in REF["cases"]])
        want = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
        assert np.abs(m.embed(IDS) - want).max() <= 1e-5
        assert np.abs(hf.embed(IDS) - WANT).max() <= 1e-6
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return                      # (llama.cpp's reading of such a file checked where it is installed)
    from llamacpp_ref import llama_cpp_embeddings
    theirs = np.array([t["embedding"] for t in llama_cpp_embeddings(gg, IDS)])
    assert np.abs(theirs - want).max() <= 1e-3


@pytest.mark.parametrize("change", [{"gemma-embedding.attention.causal": True},
                                    {"gemma-embedding.pooling_type": 2},
                                    {"gemma-embedding.dense_3_feat_out": 40}])
def test_unsupported_embeddinggemma_ggufs_are_refused(tmp_path, change):
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "bad.gguf", **change)
    with pytest.raises(ModelFormatError):
        llambda.load(gg, backend="numpy")


def test_ollamas_gemma3_embedding_layout_is_refused_not_run_as_a_decoder(tmp_path):
    """A `gemma3` file with a pooling type (Ollama's embeddinggemma) is an embedding model in another layout: a
    typed error, not Gemma 3's decoder generating from it."""
    gg = embeddinggemma_gguf(FIXTURE, tmp_path / "eg.gguf")
    from llambda.formats.gguf import GGUFFile
    with GGUFFile(gg) as f:
        meta = {k.replace("gemma-embedding.", "gemma3."): v for k, v in f.metadata.items()}
    meta["general.architecture"] = "gemma3"
    ollama = embeddinggemma_gguf(FIXTURE, tmp_path / "o.gguf", **{k: None for k in list(meta)
                                                                 if k.startswith("gemma-embedding.")}, **meta)
    with pytest.raises(ModelFormatError, match="pooling_type"):
        llambda.load(ollama, backend="numpy")



def _masked_softmax_attention(qkv, n_heads: int, half: int) -> np.ndarray:
    """The band's definition over a whole text: every pair of tokens scored, the far ones masked out."""
    t, d = qkv.shape[0], qkv.shape[1] // 3 // n_heads
    heads = qkv.reshape(t, 3, n_heads, d).astype(np.float64)
    far = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :]) > half
    out = np.empty((t, n_heads * d))
    for h in range(n_heads):
        sc = heads[:, 0, h] @ heads[:, 1, h].T / np.sqrt(d)
        sc[far] = -np.inf
        w = np.exp(sc - sc.max(axis=-1, keepdims=True))
        out[:, h * d:(h + 1) * d] = (w / w.sum(axis=-1, keepdims=True)) @ heads[:, 2, h]
    return out


@pytest.mark.parametrize("t,half,block", [(50, 4, 7), (300, 16, 256), (700, 100, 64), (5, 100, 2)])
def test_banded_attention_in_blocks_is_the_band(t, half, block):
    from llambda.models.banded import banded_attention
    qkv = np.random.default_rng(t).standard_normal((t + 3, 3 * 4 * 8)).astype(np.float32)
    out = np.zeros((t + 3, 32), np.float32)
    banded_attention(qkv, 2, 2 + t, 4, half, out, block=block)
    assert np.abs(out[2:2 + t] - _masked_softmax_attention(qkv[2:2 + t], 4, half)).max() <= 1e-5
    assert not out[:2].any() and not out[2 + t:].any()


def test_banded_attention_memory_grows_with_the_band_not_the_text():
    """A text of 6,000 tokens: its whole score matrix took 144 MB a head (40,000 tokens: 6 GB, a MemoryError for
    a config whose max_position_embeddings lets such a text through: EmbeddingGemma has no position table)."""
    import tracemalloc
    from llambda.models.banded import banded_attention
    t = 6000
    qkv = np.random.default_rng(0).standard_normal((t, 3 * 2 * 8)).astype(np.float32)
    out = np.zeros((t, 16), np.float32)
    tracemalloc.start()
    try:
        banded_attention(qkv, 0, t, 2, 4, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert np.isfinite(out).all()

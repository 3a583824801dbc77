"""ModernBERT: pre-norm blocks without biases, rotary positions with a global and a local base, a local band in
two of every three layers, the GeGLU MLP, mean (or CLS) pooling.

Reference: transformers' ModernBertModel (tools/make_tiny_modernbert.py wrote tests/fixtures/encoders/modernbert:
the folder as sentence-transformers saves it, and reference.json: per input, token ids shorter and longer than the
local band, the last hidden states and the mean-pooled L2-normalized embedding).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from test_embeddinggemma import BACKENDS, assert_the_band_matters, reference
from test_nomic_bert import _load

FIXTURE, REF, IDS, WANT = reference("modernbert")


@pytest.mark.parametrize("backend,activations,tol", BACKENDS)
def test_modernbert_dir_matches_transformers(backend, activations, tol):
    with _load(FIXTURE, backend, activations) as m:
        assert m.is_encoder and not m.is_reranker and m.config.arch == "modernbert"
        assert m.config.sliding == [False, True, True, False] and m.config.half == 4 and m.config.pooling == "mean"
        got = m.embed(IDS, batch_size=4)
        assert np.abs(got - WANT).max() <= tol
        alone = np.stack([m.embed([ids])[0] for ids in IDS])
        assert np.abs(alone - got).max() <= max(tol, 1e-5)
        if backend == "numpy":
            from llambda.models.bert import pack_batch
            ids, types, starts = pack_batch([(i, [0] * len(i)) for i in IDS])
            hidden = m.encoder.forward(ids, types, starts)
            for s, case in enumerate(REF["cases"]):
                assert np.abs(hidden[starts[s]:starts[s + 1]] - np.array(case["hidden"])).max() <= 1e-5


def test_the_local_band_matters():
    with _load(FIXTURE) as m:
        assert_the_band_matters(m, lambda: setattr(m.config, "half", 10 ** 6), IDS, WANT, 4)


@pytest.mark.parametrize("backend,activations,tol", BACKENDS)
def test_modernbert_reranker_matches_transformers(backend, activations, tol):
    """ModernBertForSequenceClassification (mean classifier pooling, a head bias): its logits of (query, document)
    pairs given as [CLS] q [SEP] d [SEP] ids, packed in one batch."""
    from llambda.models.bert import pack_batch
    folder = FIXTURE.parent / "modernbert_rerank"
    pairs = json.loads((folder / "reference.json").read_text())["pairs"]
    with _load(folder, backend, activations) as m:
        assert m.is_reranker and m.config.n_labels == 1 and m.config.head_pooling == "mean"
        ids, types, starts = pack_batch([(p["ids"], [0] * len(p["ids"])) for p in pairs])
        got = m.encoder.classify(m.encoder.forward(ids, types, starts), starts)[:, 0]
    want = np.array([p["logit"] for p in pairs])
    assert np.abs(got - want).max() <= 2 * tol        # (the fast mode: 9.5e-3 here)


def _copy(tmp_path: Path, **changes) -> Path:
    out = tmp_path / "mb"
    shutil.copytree(FIXTURE, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return out


def test_transformers_4_config_spelling_is_the_same_model(tmp_path):
    """Released ModernBERT configs have global_rope_theta / local_rope_theta and global_attn_every_n_layers, no
    rope_parameters nor layer_types."""
    folder = _copy(tmp_path, rope_parameters=None, layer_types=None, global_rope_theta=1000.0,
                   local_rope_theta=10000.0, global_attn_every_n_layers=3)
    with _load(folder) as m:
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


def test_without_a_pooling_module_classifier_pooling_says(tmp_path):
    folder = _copy(tmp_path)
    shutil.rmtree(folder / "1_Pooling")
    with _load(folder) as m:             # (transformers' default: cls)
        assert m.config.pooling == "cls"
        got = m.embed(IDS)
    first = np.stack([np.array(c["hidden"])[0] for c in REF["cases"]])
    assert np.abs(got - first / np.linalg.norm(first, axis=-1, keepdims=True)).max() <= 1e-5


@pytest.mark.parametrize("change", [{"norm_bias": True}, {"mlp_bias": True}, {"attention_bias": True},
                                    {"hidden_activation": "silu"}, {"num_attention_heads": 3},
                                    {"layer_types": ["full_attention"]}, {"local_attention": 0},
                                    {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                                         "sliding_attention": {"rope_type": "default"}}}])
def test_unsupported_modernbert_configs_are_refused(tmp_path, change):
    with pytest.raises(ModelFormatError):
        llambda.load(_copy(tmp_path, **change), backend="numpy")


# -- the GGUF llama.cpp's converter writes (convert_hf_to_gguf.py's ModernBertModel) --

_LAYER = {"attn_norm": "attn_norm", "attn.Wqkv": "attn_qkv", "attn.Wo": "attn_output", "mlp_norm": "ffn_norm",
          "mlp.Wi": "ffn_up", "mlp.Wo": "ffn_down"}
_GLOBAL = {"embeddings.tok_embeddings.weight": "token_embd.weight", "embeddings.norm.weight": "token_embd_norm.weight",
           "final_norm.weight": "output_norm.weight"}


def modernbert_gguf(folder: Path, out: Path, **meta_changes) -> Path:
    """The folder as llama.cpp's converter writes it: its tensor names, `modern-bert.*` sizes, the window and its
    pattern, a GPT-2 style vocabulary (the tiny one here: one token per id, no merges)."""
    from safetensors.numpy import load_file

    from llambda.formats.gguf import QType
    from llambda.formats.gguf_writer import write_gguf
    cfg = json.loads((folder / "config.json").read_text())
    tensors = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        if name in _GLOBAL:
            g = _GLOBAL[name]
        else:
            _, i, rest = name.split(".", 2)
            g = f"blk.{i}.{_LAYER[rest[:-len('.weight')]]}.weight"
        tensors[g] = (QType.F32, np.ascontiguousarray(w, dtype=np.float32))
    a = "modern-bert"
    V = cfg["vocab_size"]
    meta = {"general.architecture": a, "general.name": "tiny-modernbert",
            f"{a}.context_length": cfg["max_position_embeddings"], f"{a}.embedding_length": cfg["hidden_size"],
            f"{a}.block_count": cfg["num_hidden_layers"], f"{a}.feed_forward_length": cfg["intermediate_size"],
            f"{a}.attention.head_count": cfg["num_attention_heads"],
            f"{a}.attention.layer_norm_epsilon": float(cfg["norm_eps"]), f"{a}.attention.causal": False,
            f"{a}.rope.freq_base": float(cfg["rope_parameters"]["full_attention"]["rope_theta"]),
            f"{a}.rope.freq_base_swa": float(cfg["rope_parameters"]["sliding_attention"]["rope_theta"]),
            f"{a}.attention.sliding_window": cfg["local_attention"],
            f"{a}.attention.sliding_window_pattern": cfg["global_attn_every_n_layers"], f"{a}.pooling_type": 1,
            f"{a}.vocab_size": V,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": ["[PAD]", "[CLS]", "[SEP]"] + [f"t{i}" for i in range(3, V)],
            "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (V - 3), "tokenizer.ggml.merges": ["t 1"],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.seperator_token_id": 2,
            "tokenizer.ggml.padding_token_id": 0}
    meta |= meta_changes
    write_gguf(out, {k: v for k, v in meta.items() if v is not None}, tensors)
    return out


def test_modernbert_gguf_embeds_as_transformers(tmp_path):
    with _load(modernbert_gguf(FIXTURE, tmp_path / "mb.gguf")) as m:
        assert m.config.arch == "modernbert" and m.config.sliding == [False, True, True, False]
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


# the local base: the file's, or (a file without the key) 10000, as llama.cpp reads it; a local base of 500 in
# the file moves llama.cpp's vectors 2.5e-2
@pytest.mark.parametrize("changes", [{}, {"modern-bert.rope.freq_base_swa": None}])
def test_modernbert_gguf_matches_llama_cpp(tmp_path, changes):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the second ModernBERT reference")
    from llamacpp_ref import llama_cpp_embeddings
    gg = modernbert_gguf(FIXTURE, tmp_path / "mb.gguf", **changes)
    theirs = np.array([t["embedding"] for t in llama_cpp_embeddings(gg, IDS)])
    with _load(gg) as m:
        ours = m.embed(IDS)
    assert np.abs(ours - theirs).max() <= 1e-3            # 2.5e-4 here
    assert np.abs(ours - WANT).max() <= 1e-6


@pytest.mark.parametrize("change", [{"modern-bert.attention.causal": True}, {"modern-bert.pooling_type": 4},
                                    {"modern-bert.attention.sliding_window": None}])
def test_unsupported_modernbert_ggufs_are_refused(tmp_path, change):
    with pytest.raises(ModelFormatError):
        llambda.load(modernbert_gguf(FIXTURE, tmp_path / "bad.gguf", **change), backend="numpy")


def test_a_config_claiming_a_million_positions_reads_texts_cut_at_the_encoder_cap(tmp_path):
    """A rotary encoder has no position table, so only its config bounds a text; a million claimed positions
    would let one request run for hours (the attention's square). Texts are cut at ENCODER_MAX_TOKENS, with a
    warning at load, and the ids within it embed as before."""
    from llambda.api import ENCODER_MAX_TOKENS
    from llambda.errors import LlambdaWarning
    folder = _copy(tmp_path, max_position_embeddings=1 << 20)
    with pytest.warns(LlambdaWarning, match=f"cut at {ENCODER_MAX_TOKENS}"):
        m = _load(folder)
    with m:
        assert m.config.max_tokens == m.n_ctx == ENCODER_MAX_TOKENS
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6
        long = [[int(IDS[0][0])] * (ENCODER_MAX_TOKENS + 500)]
        assert m.embed_token_counts(long) == [ENCODER_MAX_TOKENS]
        assert m.embed_token_counts(long, truncate=False) == [ENCODER_MAX_TOKENS + 500]

"""XLM-RoBERTa encoders (bge-m3, multilingual-e5, bge-reranker-v2-m3's architecture) against transformers.

The reference is tests/fixtures/encoders/xlmr and xlmr_rerank (tools/make_tiny_xlmr.py): tiny random
XLMRobertaModel and XLMRobertaForSequenceClassification run by transformers 5.25 on one padded batch with its
attention mask, their SentencePiece-Unigram tokenizer.json made with the `tokenizers` library; the token ids
the library gave, the last hidden states, mean-pooled embeddings and the reranker's logits.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.models.bert import pack_batch

FIXTURES = Path(__file__).parent / "fixtures" / "encoders"
EMBEDDER, RERANKER = FIXTURES / "xlmr", FIXTURES / "xlmr_rerank"
# (backend, activations, max |diff| of a unit embedding): the native fast mode multiplies bfloat16
MODES = [("numpy", None, 2e-6), ("native", "f32", 2e-5), ("native", None, 1e-2)]


def reference(folder: Path) -> dict:
    return json.loads((folder / "reference.json").read_text())


def _load(folder, backend="numpy", activations=None):
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    return llambda.load(folder, backend=backend, activations=activations)


@pytest.mark.parametrize("backend,activations,tol", MODES)
def test_embeddings_match_transformers(backend, activations, tol):
    ref = reference(EMBEDDER)["inputs"]
    texts = [r["text"] for r in ref]
    with _load(EMBEDDER, backend, activations) as m:
        assert m.is_encoder and not m.is_reranker and m.config.arch == "xlm-roberta"
        got = m.embed(texts, batch_size=2)            # several batches of different lengths
        assert np.abs(got - np.array([r["embedding"] for r in ref])).max() <= tol
        alone = np.stack([m.embed([t])[0] for t in texts])       # a vector does not depend on its batch
        assert np.abs(alone - got).max() <= max(tol, 1e-5)
        assert np.abs(m.embed([ref[2]["ids"]])[0] - got[2]).max() <= 1e-5      # token ids as given


def test_tokens_and_hidden_states_match_transformers():
    ref = reference(EMBEDDER)["inputs"]
    with _load(EMBEDDER) as m:
        encoded = m.tokenizer.encode_for_encoder([r["text"] for r in ref], m.config.max_tokens)
        assert [ids for ids, _ in encoded] == [r["ids"] for r in ref]
        ids, types, starts = pack_batch(encoded)
        hidden = m.encoder.forward(ids, types, starts)
    for s, r in enumerate(ref):
        np.testing.assert_allclose(hidden[starts[s]:starts[s + 1]], np.array(r["hidden"]), atol=2e-5, rtol=0)


def test_positions_start_after_the_padding_id():
    """Read as BERT reads them (positions from 0) the same weights give other vectors: the offset is checked."""
    ref = reference(EMBEDDER)["inputs"]
    with _load(EMBEDDER) as m:
        m.encoder.cfg.pad_id = -1          # positions 0, 1, ...: BERT's
        wrong = m.embed([ref[0]["text"]])[0]
    assert np.abs(wrong - np.array(ref[0]["embedding"])).max() > 1e-2


@pytest.mark.parametrize("backend,activations,tol", [("numpy", None, 1e-5), ("native", "f32", 1e-4),
                                                     ("native", None, 2e-2)])
def test_reranker_logits_match_transformers(backend, activations, tol):
    ref = reference(RERANKER)
    with _load(RERANKER, backend, activations) as m:
        assert m.is_reranker
        pairs = m.tokenizer.encode_for_encoder([(ref["query"], p["document"]) for p in ref["pairs"]], 64)
        assert [ids for ids, _ in pairs] == [p["ids"] for p in ref["pairs"]]     # <s> q </s></s> d </s>
        got = m.score(ref["query"], [p["document"] for p in ref["pairs"]])
    assert np.abs(got - np.array([p["logits"][0] for p in ref["pairs"]])).max() <= tol


def test_a_long_text_is_cut_to_the_positions_after_the_offset():
    with _load(EMBEDDER) as m:
        assert m.config.max_tokens == 40 - 2        # max_position_embeddings - (pad_token_id + 1)
        assert m.embed_token_counts(["the cat " * 50]) == [38]
        assert np.isfinite(m.embed(["the cat " * 50])).all()


@pytest.mark.parametrize("change,message", [({"pad_token_id": 99}, "pad_token_id"),
                                             ({"pad_token_id": "1"}, "pad_token_id"),
                                             ({"max_position_embeddings": 4}, "positions after pad_token_id")])
def test_bad_config_is_a_model_format_error(tmp_path, change, message):
    d = tmp_path / "m"
    shutil.copytree(EMBEDDER, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(change)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(d, backend="numpy")

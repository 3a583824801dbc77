"""Embeddings: WordPiece tokenization, the BERT encoder, Model.embed.

The reference here is written independently of llambda: a BERT forward in float64 NumPy from the
safetensors weights (plain formulas, one sentence at a time, so no padding or mask), fed by the
`tokenizers` library's own encode of tokenizer.json. No sentence-transformers (it needs PyTorch);
bench/bench_embeddings.py compares with it where it is installed.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer

import llambda

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome",
    "The cat sits outside",
    "The new movie is so great!!!",
    "Do you like pizza?",
    "UNBELIEVABLE results in naïve café tests — résumé attached.",
    "東京は日本の首都です。",
    "Emoji are tokens too 🙂🚀 sometimes",
    "x",
    "Numbers: 3.14159, 2,718 and -42e10.",
    "def f(x): return x ** 2  # python code",
    "https://example.com/path?query=1&b=two",
    "   leading and trailing spaces   ",
    "Tabs\tand\nnewlines\r\nmixed",
    "ALL CAPS SENTENCE WITH SHOUTING",
    "Ça va? Straße, Ångström, Øresund, İstanbul.",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[CLS] written in the text [SEP] as words",
    "hyphenated-words and under_scores and slashes/between",
    "A very long sentence " + "that keeps going and going " * 60,   # past max_seq_length: truncated
    "Short.",
]


# -- the independent reference ----------------------------------------------------------------

def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.vectorize(math.erf)


def reference_forward(W: dict, cfg: dict, ids, type_ids=None) -> np.ndarray:
    """Hidden states (t, hidden) of one unpadded sequence, float64."""
    g = {k.removeprefix("bert."): v.astype(np.float64) for k, v in W.items() if v.dtype.kind == "f"}
    t, H = len(ids), cfg["num_attention_heads"]
    eps = cfg.get("layer_norm_eps", 1e-12)
    type_ids = np.zeros(t, int) if type_ids is None else np.asarray(type_ids)
    x = g["embeddings.word_embeddings.weight"][ids] + g["embeddings.position_embeddings.weight"][:t] \
        + g["embeddings.token_type_embeddings.weight"][type_ids]
    x = _ln(x, g["embeddings.LayerNorm.weight"], g["embeddings.LayerNorm.bias"], eps)
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(name, h):
            return h @ g[p + name + ".weight"].T + g[p + name + ".bias"]
        q, k, v = (lin(f"attention.self.{n}", x).reshape(t, H, -1) for n in ("query", "key", "value"))
        d = q.shape[-1]
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = np.einsum("hqk,khd->qhd", a, v).reshape(t, -1)
        x = _ln(x + lin("attention.output.dense", ctx), g[p + "attention.output.LayerNorm.weight"],
                g[p + "attention.output.LayerNorm.bias"], eps)
        u = lin("intermediate.dense", x)
        u = 0.5 * u * (1 + _erf(u / math.sqrt(2)))
        x = _ln(x + lin("output.dense", u), g[p + "output.LayerNorm.weight"], g[p + "output.LayerNorm.bias"], eps)
    return x


def reference_embedding(W, cfg, ids) -> np.ndarray:
    v = reference_forward(W, cfg, ids).mean(0)
    return v / np.linalg.norm(v)


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# -- a tiny random BERT, offline ---------------------------------------------------------------

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "run", "##s", "##ing", "a", "big", "small", ".", ",", "!"]


def _tiny_bert_dir(tmp_path, classifier: bool = False):
    """A random 2-layer BERT with a WordPiece tokenizer, as a HF directory."""
    from tokenizers import models, normalizers, pre_tokenizers, processors, decoders

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}
    tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]"}))
    hid, ffn, L = 32, 64, 2
    cfg = {"model_type": "bert", "architectures": ["BertForSequenceClassification" if classifier else "BertModel"],
           "vocab_size": len(vocab), "hidden_size": hid, "num_hidden_layers": L, "num_attention_heads": 4,
           "intermediate_size": ffn, "max_position_embeddings": 16, "type_vocab_size": 2,
           "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    if classifier:
        cfg["id2label"] = {"0": "LABEL_0"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(7)
    W = {"embeddings.word_embeddings.weight": rng.normal(0, 0.5, (len(vocab), hid)),
         "embeddings.position_embeddings.weight": rng.normal(0, 0.5, (16, hid)),
         "embeddings.token_type_embeddings.weight": rng.normal(0, 0.5, (2, hid)),
         "embeddings.LayerNorm.weight": 1 + rng.normal(0, 0.1, hid),
         "embeddings.LayerNorm.bias": rng.normal(0, 0.1, hid)}
    for i in range(L):
        p = f"encoder.layer.{i}."
        for n, shape in (("attention.self.query", (hid, hid)), ("attention.self.key", (hid, hid)),
                         ("attention.self.value", (hid, hid)), ("attention.output.dense", (hid, hid)),
                         ("intermediate.dense", (ffn, hid)), ("output.dense", (hid, ffn))):
            W[p + n + ".weight"] = rng.normal(0, 0.3, shape)
            W[p + n + ".bias"] = rng.normal(0, 0.1, shape[0])
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            W[p + n + ".weight"] = 1 + rng.normal(0, 0.1, hid)
            W[p + n + ".bias"] = rng.normal(0, 0.1, hid)
    if classifier:
        W = {"bert." + k: v for k, v in W.items()}
        W["bert.pooler.dense.weight"] = rng.normal(0, 0.3, (hid, hid))
        W["bert.pooler.dense.bias"] = rng.normal(0, 0.1, hid)
        W["classifier.weight"] = rng.normal(0, 0.3, (1, hid))
        W["classifier.bias"] = rng.normal(0, 0.1, 1)
    W = {k: v.astype(np.float32) for k, v in W.items()}
    W["embeddings.position_ids"] = np.arange(16, dtype=np.int64)[None]     # as HF saves it
    save_file(W, str(tmp_path / "model.safetensors"))
    return tmp_path, W, cfg


TINY_TEXTS = ["the cat sat on the mat", "a big dog runs", "small cats sitting!", "the", "dogs, cats. mats",
              "the cat sat on the mat the dog sat on the mat the cat"]   # the last is truncated at 16


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_tiny_bert_matches_reference(tmp_path, backend):
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip("native backend not built")
    folder, W, cfg = _tiny_bert_dir(tmp_path)
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    hf.enable_truncation(16)
    # the exact mode (float32 weights) on native: the fast mode's bfloat16 products are checked on MiniLM
    with llambda.load(folder, backend=backend, activations="f32") as m:
        assert m.is_encoder and not m.is_reranker
        got = m.embed(TINY_TEXTS, batch_size=4)       # two batches, padded to different lengths
        assert got.shape == (len(TINY_TEXTS), 32)
        for text, v in zip(TINY_TEXTS, got):
            ids = hf.encode(text).ids
            assert _cos(v, reference_embedding(W, cfg, ids)) >= 0.99999, text
        # a batch pads its rows: each alone gives the same vector
        alone = np.stack([m.embed([t])[0] for t in TINY_TEXTS])
        assert np.abs(alone - got).max() < 1e-5
        # token ids are taken as given
        ids = hf.encode("a big dog runs").ids
        assert np.abs(m.embed([ids])[0] - got[1]).max() < 1e-5


def test_tiny_cross_encoder_scores(tmp_path):
    folder, W, cfg = _tiny_bert_dir(tmp_path, classifier=True)
    hf = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    docs = ["the cat sat", "a big dog", "mats"]
    with llambda.load(folder, backend="numpy") as m:
        assert m.is_reranker
        got = m.score("the cat", docs)
    g = {k.removeprefix("bert."): v.astype(np.float64) for k, v in W.items()}
    for d, s in zip(docs, got):
        enc = hf.encode("the cat", d)
        assert enc.type_ids.count(1) > 0
        h = reference_forward(W, cfg, enc.ids, enc.type_ids)[0]
        pooled = np.tanh(g["pooler.dense.weight"] @ h + g["pooler.dense.bias"])
        want = (g["classifier.weight"] @ pooled + g["classifier.bias"])[0]
        assert abs(float(s) - want) < 1e-4


def test_embedder_is_not_a_reranker(tmp_path):
    folder, _, _ = _tiny_bert_dir(tmp_path)
    with llambda.load(folder, backend="numpy") as m:
        with pytest.raises(llambda.LlambdaError, match="not a reranker"):
            m.score("q", ["d"])


# -- all-MiniLM-L6-v2 ------------------------------------------------------------------------------

def test_minilm_wordpiece_ids_equal_the_tokenizers_library(minilm_dir):
    from llambda.tokenizer import Tokenizer

    ours = Tokenizer.from_hf_dir(minilm_dir)
    hf = HFTokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    hf.no_padding()
    hf.enable_truncation(256)          # sentence-transformers' max_seq_length for this model
    got = ours.encode_for_encoder(SENTENCES, 256)
    for text, (ids, types) in zip(SENTENCES, got):
        want = hf.encode(text)
        assert ids == want.ids, text
        assert types == want.type_ids
    assert len(got[-2][0]) == 256 and got[-2][0][0] == 101 and got[-2][0][-1] == 102
    # plain encode: no [CLS]/[SEP], no padding to tokenizer.json's fixed 128
    assert ours.encode("Hello there") == hf.encode("Hello there", add_special_tokens=False).ids
    assert ours.decode(ours.encode("Hello, unbelievable world")) == "hello, unbelievable world"


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir):
    W = load_file(str(minilm_dir / "model.safetensors"))
    cfg = json.loads((minilm_dir / "config.json").read_text())
    hf = HFTokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    hf.no_padding()
    hf.enable_truncation(256)
    return np.stack([reference_embedding(W, cfg, hf.encode(s).ids) for s in SENTENCES])


@pytest.mark.parametrize("backend,activations", [("numpy", None), ("native", "f32"), ("native", None)])
def test_minilm_matches_independent_reference(minilm_dir, minilm_reference, backend, activations):
    """Every mode within a cosine of 0.9999 (native's default, bfloat16 products: 0.99997 measured)."""
    with llambda.load(minilm_dir, backend=backend, threads=2 if backend == "native" else None,
                      activations=activations) as m:
        got = m.embed(SENTENCES)
        assert got.shape == (32, 384)
        assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
        cos = [_cos(a, b) for a, b in zip(got, minilm_reference)]
        assert min(cos) >= 0.9999, (min(cos), SENTENCES[int(np.argmin(cos))])


def test_minilm_by_catalogue_name_and_similarity_order(minilm_dir):
    with llambda.load("all-minilm-l6-v2") as m:
        v = m.embed(["A man is eating food.", "A man is eating a piece of bread.", "A monkey is playing drums."])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3


def test_cli_embed(tmp_path, capsys):
    from llambda.cli import main

    folder, _, _ = _tiny_bert_dir(tmp_path)
    assert main(["embed", "-m", str(folder), "--backend", "numpy", "the cat sat", "a big dog"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dimensions"] == 32 and [d["text"] for d in out["data"]] == ["the cat sat", "a big dog"]
    with llambda.load(folder, backend="numpy") as m:
        want = m.embed(["the cat sat", "a big dog"])
    assert np.abs(np.array([d["embedding"] for d in out["data"]]) - want).max() < 1e-6
    assert main(["embed", "-m", str(folder), "--backend", "numpy", "--format", "text", "the cat sat"]) == 0
    line = capsys.readouterr().out.strip().split()
    assert len(line) == 32 and abs(float(line[0]) - want[0, 0]) < 1e-5


def test_long_texts_get_smaller_batches(tmp_path, monkeypatch):
    import llambda.api as api

    folder, _, _ = _tiny_bert_dir(tmp_path)
    with llambda.load(folder, backend="numpy") as m:
        want = np.stack([m.embed([t])[0] for t in TINY_TEXTS])
        batches = []
        forward = m.encoder.forward
        # undone before close() empties the encoder (its attributes are gone after)
        with monkeypatch.context() as mp:
            mp.setattr(m.encoder, "forward", lambda ids, types, starts: batches.append(np.diff(starts))
                       or forward(ids, types, starts))
            mp.setattr(api, "TOKEN_BUDGET", 16)     # 16 tokens a batch; the longest text alone has 16
            got = m.embed(TINY_TEXTS, batch_size=32)
    assert np.abs(got - want).max() < 1e-5            # in the caller's order, whatever the batching
    assert all(lens.sum() <= 16 or len(lens) == 1 for lens in batches) and len(batches) > 1
    assert sum(len(lens) for lens in batches) == len(TINY_TEXTS)


def test_cli_show_an_encoder(tmp_path, capsys):
    from llambda.cli import main

    folder, _, _ = _tiny_bert_dir(tmp_path, classifier=True)
    assert main(["show", "-m", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "bert encoder, cross-encoder" in out and "2 layers, hidden 32, 4 heads" in out


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "max_position_embeddings", "type_vocab_size",
                                 "layer_norm_eps", "hidden_act", "architectures", "model_type",
                                 "position_embedding_type", "id2label"])
def test_hostile_bert_config_values_are_typed_errors(tmp_path, key):
    folder, _, cfg = _tiny_bert_dir(tmp_path)
    for value in (None, {}, [], "x", -1, 0, 3, 1e300, True, 2 ** 40, ["BertForSequenceClassification"]):
        bad = dict(cfg)
        if value is None:
            bad.pop(key, None)
        else:
            bad[key] = value
        (folder / "config.json").write_text(json.dumps(bad))
        try:
            with llambda.load(folder, backend="numpy") as m:
                m.embed(["the cat"])
        except (llambda.ModelFormatError, llambda.TokenizerError):
            pass


def test_decoder_embed_is_the_last_tokens_final_hidden_state():
    """A decoder's vector is its last token's final-normed hidden state, normalized: the LM head
    applied to it gives that position's logits up to the norm's scale."""
    from pathlib import Path

    tiny = Path(__file__).parent / "fixtures" / "reference" / "tiny" / "llama"
    with llambda.load(tiny, backend="numpy", n_ctx=64) as m:
        assert not m.is_encoder and not m.is_reranker
        ids = [5, 17, 42, 99, 7]
        v = m.embed([ids])[0]
        assert v.shape == (m.config.d_model,) and abs(np.linalg.norm(v) - 1) < 1e-5
        logits = m.logits(ids)
        w = np.asarray(m.transformer.output, dtype=np.float64)
        proj = w @ v.astype(np.float64)
        scale = float(logits @ proj / (proj @ proj))
        assert scale > 0 and np.abs(logits - scale * proj).max() < 1e-4 * np.abs(logits).max()
        # the library's generation cache is not fooled by the slot the embedding overwrote
        first = m.complete(ids, max_tokens=4, temperature=0)
        m.embed([[1, 2, 3]])
        assert m.complete(ids, max_tokens=4, temperature=0) == first
        two = m.embed([ids, [1, 2, 3]])
        assert np.abs(two[0] - v).max() < 1e-6 and abs(float(two[0] @ two[1])) < 0.9999

"""BERT-family GGUF files (arch `bert`, as llama.cpp's converter writes them) load as encoders and
embed as the Hugging Face directory they came from.

`llama_cpp_style_gguf` writes a HF BERT directory the way convert_hf_to_gguf.py does: `bert.*` sizes,
`bert.pooling_type` from 1_Pooling (1 mean, 2 CLS; 4 rank: tests/test_xlmr.py), the vocabulary in phantom-space form
(`▁word`, `##piece` -> `piece`, `[CLS]` kept) with its special ids (`seperator` as llama.cpp
spells it), and GGUF tensor names (token_embd, position_embd, token_types, blk.N.attn_q ...).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFValueType as VT
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.quants import QType
from llambda.tokenizer import Tokenizer
from test_embeddings import SENTENCES, TINY_TEXTS, _cos, _tiny_bert_dir

_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
          "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
          "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
_GLOBAL = {"embeddings.word_embeddings": "token_embd", "embeddings.position_embeddings": "position_embd",
           "embeddings.token_type_embeddings": "token_types", "embeddings.LayerNorm": "token_embd_norm"}


def _gguf_name(hf: str) -> str | None:
    base, leaf = hf.rsplit(".", 1)
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{leaf}"
    parts = base.split(".")
    if parts[:2] == ["encoder", "layer"] and ".".join(parts[3:]) in _LAYER:
        return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:])]}.{leaf}"
    return None          # position_ids, pooler: llama.cpp's converter skips them


def llama_cpp_style_gguf(folder: Path, out: Path, matrices=QType.F32, pooling: int | None = None,
                         arch: str = "bert", names=None, sizes: dict | None = None) -> Path:
    """`arch` (another of llama.cpp's WordPiece encoders, as nomic-bert) with its tensor names (`names`: HF name ->
    GGUF name or None) and its sizes (`sizes`: `{arch}.*` key -> value) in place of BERT's."""
    cfg = json.loads((folder / "config.json").read_text())
    tj = json.loads((folder / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in tj["added_tokens"] if t.get("special")}
    words = sorted(vocab, key=vocab.get)
    phantom = [w if w.startswith("[") and w.endswith("]") else w[2:] if w.startswith("##") else "\u2581" + w
               for w in words]
    pool_cfg = folder / "1_Pooling" / "config.json"
    if pooling is None:
        pooling = 2 if pool_cfg.is_file() and json.loads(pool_cfg.read_text()).get("pooling_mode_cls_token") else 1
    if sizes is None:
        sizes = {"context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
                 "feed_forward_length": cfg["intermediate_size"], "block_count": cfg["num_hidden_layers"],
                 "attention.head_count": cfg["num_attention_heads"],
                 "attention.layer_norm_epsilon": float(cfg["layer_norm_eps"])}
    meta = {"general.architecture": arch, "general.name": folder.name,
            **{f"{arch}.{k}": v for k, v in sizes.items()}, f"{arch}.attention.causal": False,
            f"{arch}.pooling_type": pooling, "tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": phantom,
            "tokenizer.ggml.token_type": [3 if w in specials else 1 for w in words],
            "tokenizer.ggml.token_type_count": cfg.get("type_vocab_size", 2)}
    for key, tok in (("unknown", "[UNK]"), ("seperator", "[SEP]"), ("padding", "[PAD]"), ("cls", "[CLS]"),
                     ("mask", "[MASK]")):
        if tok in vocab:
            meta[f"tokenizer.ggml.{key}_token_id"] = vocab[tok]
    tensors = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        g = (names or _gguf_name)(name)
        if g is not None:
            w = w.astype(np.float32)
            tensors[g] = (matrices if w.ndim == 2 and g.startswith("blk.") else QType.F32, w)
    write_gguf(out, meta, tensors)
    return out


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


def _embed(path, texts, backend="numpy"):
    with llambda.load(path, backend=backend) as m:
        assert m.is_encoder
        return m.embed(texts), m.config


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_tiny_bert_gguf_embeds_as_its_directory(tmp_path, backend):
    from llambda.backends import available_backends
    if backend not in available_backends():
        pytest.skip(f"the {backend} backend is not available here (C core not built)")
    folder, _, _ = _tiny_bert_dir(_mkdir(tmp_path / "hf"))
    gg = llama_cpp_style_gguf(folder, tmp_path / "tiny-bert.gguf")
    want, hf_cfg = _embed(folder, TINY_TEXTS, backend)
    got, gg_cfg = _embed(gg, TINY_TEXTS, backend)
    assert (gg_cfg.hidden, gg_cfg.n_layers, gg_cfg.pooling, gg_cfg.max_tokens) == \
        (hf_cfg.hidden, hf_cfg.n_layers, hf_cfg.pooling, hf_cfg.max_tokens)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_cls_pooling_from_gguf(tmp_path):
    folder, _, _ = _tiny_bert_dir(_mkdir(tmp_path / "hf"))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    gg = llama_cpp_style_gguf(folder, tmp_path / "cls.gguf")
    want, _ = _embed(folder, TINY_TEXTS)
    got, cfg = _embed(gg, TINY_TEXTS)
    assert cfg.pooling == "cls"
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("change, message", [
    ({"bert.pooling_type": 3}, "pooling_type"),                   # last token: not a BERT's
    ({"bert.pooling_type": 4}, "missing tensor 'pooler.dense"),   # rank without its head (cls, cls.output)
    ({"bert.attention.causal": True}, "causal"),
    ({"bert.block_count": None}, "block_count"),
    ({"bert.embedding_length": 30}, "multiple"),
    ({"bert.pooling_type": [1, 2]}, "pooling_type"),              # unhashable: was a TypeError
    ({"bert.attention.causal": [0.5] * 300}, "causal.*bool"),     # an array: was "truth value is ambiguous"
    ({"bert.attention.causal": 2}, "causal.*bool"),
    ({"bert.attention.layer_norm_epsilon": GGUFValue(VT.FLOAT64, 1e-320)}, "layer_norm_eps"),   # 0 in float32
])
def test_bad_bert_gguf_metadata_is_a_model_format_error(tmp_path, change, message):
    folder, _, _ = _tiny_bert_dir(_mkdir(tmp_path / "hf"))
    gg = changed_gguf(llama_cpp_style_gguf(folder, tmp_path / "a.gguf"), tmp_path / "b.gguf", change)
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(gg, backend="numpy")


def changed_gguf(src: Path, out: Path, change: dict) -> Path:
    """A copy of float32 GGUF `src` with its metadata changed (a None value: the key dropped)."""
    from llambda.formats.gguf import GGUFFile
    with GGUFFile(src) as f:
        meta = dict(f.metadata)
        tensors = {n: (t.qtype, np.frombuffer(t.data, np.float32).reshape(t.shape)) for n, t in f.tensors.items()}
    for k, v in change.items():
        if v is None:
            meta.pop(k)
        else:
            meta[k] = v
    write_gguf(out, meta, tensors)
    return out


def test_minilm_gguf_embeds_as_its_directory(minilm_dir, tmp_path):
    """all-MiniLM-L6-v2 converted as llama.cpp does: the same token ids and the same vectors (F32);
    F16 matrices, as llama.cpp's default output type, stay within cosine 0.9999. (The GGUF knows only
    the 512-position context, not sentence-transformers' max_seq_length of 256: texts below 256 tokens.)"""
    texts = [t for t in SENTENCES if len(t) < 600]
    hf_tok, gg = Tokenizer.from_hf_dir(minilm_dir), llama_cpp_style_gguf(minilm_dir, tmp_path / "minilm.gguf")
    with llambda.load(gg, backend="numpy") as m:
        assert m.config.pooling == "mean" and m.config.max_tokens == 512
        for t in SENTENCES + ["[CLS] [SEP] [MASK] x", "日本語 \u00e9\u0301 İ ß"]:
            assert m.tokenizer.encode_for_encoder([t], 512) == hf_tok.encode_for_encoder([t], 512), t
    want, _ = _embed(minilm_dir, texts, "native")
    got, _ = _embed(gg, texts, "native")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    f16 = llama_cpp_style_gguf(minilm_dir, tmp_path / "minilm-f16.gguf", matrices=QType.F16)
    half, _ = _embed(f16, texts, "native")
    assert min(_cos(a, b) for a, b in zip(half, want)) > 0.9999


def test_show_and_tensor_names_of_a_bert_gguf(tmp_path, capsys):
    """The source lists its tensors by the names its lookup serves (HF's), so `llambda show` counts them."""
    from llambda.cli import main
    from llambda.formats.open import open_model
    folder, W, _ = _tiny_bert_dir(_mkdir(tmp_path / "hf"))
    gg = llama_cpp_style_gguf(folder, tmp_path / "tiny-bert.gguf")
    src = open_model(gg)
    try:
        assert sorted(src.tensor_names) == sorted(n for n in W if n != "embeddings.position_ids")
        assert all(src.tensor(n) is not None for n in src.tensor_names)
    finally:
        src.close()
    assert main(["show", str(gg)]) == 0
    assert "bert encoder" in capsys.readouterr().out


def test_text_that_encodes_to_no_tokens_is_a_clear_error(tmp_path):
    """A bert GGUF without tokenizer.ggml.model gets a byte-level BPE over its phantom-space tokens, no [CLS]/[SEP]:
    a text of none of them encodes to nothing, once a ValueError (numpy) or an add_layernorm error (native)."""
    from llambda.backends import available_backends
    from llambda.errors import InvalidInputError
    from llambda.formats.gguf import GGUFFile
    folder, _, _ = _tiny_bert_dir(_mkdir(tmp_path / "hf"))
    gg = llama_cpp_style_gguf(folder, tmp_path / "a.gguf")
    with GGUFFile(gg) as f:
        meta = {k: v for k, v in f.metadata.items() if k != "tokenizer.ggml.model"}
        tensors = {n: (t.qtype, np.frombuffer(t.data, np.float32).reshape(t.shape)) for n, t in f.tensors.items()}
    write_gguf(tmp_path / "b.gguf", meta, tensors)
    for backend in available_backends():
        with pytest.warns(UserWarning), llambda.load(tmp_path / "b.gguf", backend=backend) as m:
            with pytest.raises(InvalidInputError, match="input 1 encodes to no tokens"):
                m.embed(["[CLS]", "hello world"])

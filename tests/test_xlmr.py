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



def test_pairs_are_cut_as_the_library_cuts_them():
    """encode_for_encoder cuts each side of a pair before the library's longest-first truncation (below): the
    same ids and type ids as the library's own truncation of the whole pair, at every length around the cut."""
    import random
    rng = random.Random(7)
    words = ["the", "cat", "über", "的", "  ", "!", "x"]
    with _load(RERANKER) as m:
        tok = m.tokenizer
        backend = tok._backend
        for _ in range(300):
            limit = rng.choice([4, 5, 6, 7, 10, 38])
            a, b = (" ".join(rng.choice(words) for _ in range(rng.randrange(30))) for _ in range(2))
            got = tok.encode_for_encoder([(a, b), (b, a), a], limit)
            backend.enable_truncation(limit)
            try:
                want = [(list(e.ids), list(e.type_ids)) for e in (
                    backend.encode(a, b, add_special_tokens=True), backend.encode(b, a, add_special_tokens=True),
                    backend.encode(a, add_special_tokens=True))]
            finally:
                backend.no_truncation()
            assert got == want, (limit, a, b)


def test_a_long_pair_is_cut_in_bounded_memory():
    """The library's truncation of a pair keeps every overflowing piece of both sides and their product: a
    query and a document of 3,600 characters each took 1.5 GB (60 KB each, an OOM kill)."""
    import subprocess
    import sys
    import resource
    code = ("import warnings, llambda; warnings.simplefilter('ignore')\n"
            f"m = llambda.load({str(RERANKER)!r}, backend='numpy')\n"
            "t = 'hello world ' * 300\n"
            "assert m.score(t, [t, t[:100]]).shape == (2,)\n"
            # VmHWM, not ru_maxrss: the child is forked from pytest (preexec_fn) and ru_maxrss keeps the peak of
            # the fork across exec (pytest's own resident set, 2.3 GB late in a whole-suite run)
            "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) // 1024)\n")
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))     # a regression fails, not swaps
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) < 500, out.stdout      # megabytes at the peak



def test_a_pair_past_a_tiny_models_positions_is_an_input_error(tmp_path):
    """max_position_embeddings 5 leaves 3 positions, fewer than a pair's four special tokens: the library cannot
    cut the pair to them, and the overlong input was a bare ValueError from the position table (a 500)."""
    from safetensors.numpy import load_file, save_file
    from llambda.errors import InvalidInputError
    folder = tmp_path / "r"
    shutil.copytree(RERANKER, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": 5}))
    weights = load_file(folder / "model.safetensors")
    name = "roberta.embeddings.position_embeddings.weight"
    weights[name] = weights[name][:5].copy()
    save_file(weights, folder / "model.safetensors")
    with _load(folder) as m:
        assert m.config.max_tokens == 3
        with pytest.raises(InvalidInputError, match="positions"):
            m.score("the cat " * 10, ["the cat " * 10])


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


# -- llama.cpp's GGUF of an XLM-RoBERTa: arch `bert`, its position table shifted, a `t5` (Unigram) vocabulary --

def xlmr_gguf(folder: Path, out: Path, charsmap: bytes | None = None) -> Path:
    """The GGUF convert_hf_to_gguf.py's XLMRobertaModel writes of `folder`: `bert.*` sizes with the context
    length less pad + 1, `position_embd` without its first pad + 1 rows, the tokenizer.json Unigram's pieces and
    scores as tokenizer model `t5` (control, unknown and normal types), add_space_prefix and
    remove_extra_whitespaces, the special ids and both add flags; a reranker's RobertaClassificationHead as
    `cls` and `cls.output` with pooling type 4 (rank)."""
    from safetensors.numpy import load_file

    from llambda.formats.gguf_writer import write_gguf
    from llambda.formats.quants import QType
    from test_bert_gguf import _gguf_name
    cfg = json.loads((folder / "config.json").read_text())
    tj = json.loads((folder / "tokenizer.json").read_text())
    pieces = tj["model"]["vocab"]
    specials = {t["id"] for t in tj["added_tokens"] if t.get("special")}
    unk = tj["model"]["unk_id"]
    offset = cfg["pad_token_id"] + 1
    rank = "XLMRobertaForSequenceClassification" in cfg["architectures"]
    meta = {"general.architecture": "bert", "general.name": folder.name,
            "bert.context_length": cfg["max_position_embeddings"] - offset, "bert.embedding_length": cfg["hidden_size"],
            "bert.feed_forward_length": cfg["intermediate_size"], "bert.block_count": cfg["num_hidden_layers"],
            "bert.attention.head_count": cfg["num_attention_heads"],
            "bert.attention.layer_norm_epsilon": float(cfg["layer_norm_eps"]), "bert.attention.causal": False,
            "bert.pooling_type": 4 if rank else 1, "tokenizer.ggml.model": "t5", "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": [p for p, _ in pieces], "tokenizer.ggml.scores": [float(s) for _, s in pieces],
            "tokenizer.ggml.token_type": [2 if i == unk else 3 if i in specials else 1 for i in range(len(pieces))],
            "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.token_type_count": 1,
            "tokenizer.ggml.remove_extra_whitespaces": True,
            "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": unk,
            "tokenizer.ggml.seperator_token_id": 2, "tokenizer.ggml.padding_token_id": 1,
            "tokenizer.ggml.cls_token_id": 0, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    if charsmap is not None:
        meta["tokenizer.ggml.precompiled_charsmap"] = list(charsmap)
    tensors = {}
    for name, w in load_file(str(folder / "model.safetensors")).items():
        name = name.removeprefix("roberta.")
        g = {"classifier.dense.weight": "cls.weight", "classifier.dense.bias": "cls.bias",
             "classifier.out_proj.weight": "cls.output.weight",
             "classifier.out_proj.bias": "cls.output.bias"}.get(name) or _gguf_name(name)
        if g is not None:
            w = w.astype(np.float32)
            tensors[g] = (QType.F32, w[offset:] if g == "position_embd.weight" else w)
    write_gguf(out, meta, tensors)
    return out


# texts on which llama.cpp's whitespace rules (remove_extra_whitespaces) and HF's Metaspace agree
GGUF_TEXTS = ["the cat sat on the mat.", "a dog!", "where is the big green house? the small blue cat runs",
              "  the   dog  sat", "xyz qj"]


def test_xlmr_gguf_embeds_as_its_directory(tmp_path):
    gg = xlmr_gguf(EMBEDDER, tmp_path / "xlmr.gguf")
    with _load(EMBEDDER) as hf, _load(gg) as m:
        assert m.is_encoder and m.tokenizer.model == "t5"
        assert m.config.max_tokens == hf.config.max_tokens == 38
        for t in GGUF_TEXTS:
            assert m.tokenizer.encode_for_encoder([t], 64) == hf.tokenizer.encode_for_encoder([t], 64), t
        np.testing.assert_allclose(m.embed(GGUF_TEXTS), hf.embed(GGUF_TEXTS), atol=2e-6, rtol=0)
        assert m.tokenizer.decode(m.tokenize("the cat sat")) == "the cat sat"


def test_unigram_gguf_whitespace_as_llama_cpp(tmp_path):
    """llama.cpp's remove_extra_whitespaces drops trailing spaces, where HF's Metaspace leaves a U+2581 token."""
    gg = xlmr_gguf(EMBEDDER, tmp_path / "xlmr.gguf")
    with _load(gg) as m:
        assert m.tokenize("  the dog  ") == m.tokenize("the dog") == [4, 6]


def test_xlmr_gguf_matches_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the independent GGUF reference")
    from llamacpp_ref import llama_cpp_embeddings
    gg = xlmr_gguf(EMBEDDER, tmp_path / "xlmr.gguf")
    texts = GGUF_TEXTS + ["  the dog  ", "café"]
    theirs = llama_cpp_embeddings(gg, texts)
    with _load(gg) as m:
        ours = m.embed(texts)
        assert [ids for ids, _ in m.tokenizer.encode_for_encoder(texts, 64)] == [t["ids"] for t in theirs]
    # llama.cpp rounds some products' inputs to float16 on CPU: 1.6e-4 here (positions read from 0 are >= 1e-2 off:
    # test_positions_start_after_the_padding_id)
    np.testing.assert_allclose(ours, np.array([t["embedding"] for t in theirs]), atol=5e-4, rtol=0)


def test_xlmr_reranker_gguf_scores_as_transformers_and_llama_cpp(tmp_path):
    ref = reference(RERANKER)
    gg = xlmr_gguf(RERANKER, tmp_path / "rerank.gguf")
    docs = [p["document"] for p in ref["pairs"]]
    with _load(gg) as m:
        assert m.is_reranker and m.config.n_labels == 1
        pairs = [ids for ids, _ in m.tokenizer.encode_for_encoder([(ref["query"], d) for d in docs], 64)]
        assert pairs == [p["ids"] for p in ref["pairs"]]           # BOS q EOS SEP d EOS: <s> q </s></s> d </s>
        got = m.score(ref["query"], docs)
    assert np.abs(got - np.array([p["logits"][0] for p in ref["pairs"]])).max() <= 1e-5
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is the independent GGUF reference")
    from llamacpp_ref import llama_cpp_embeddings
    theirs = [t["embedding"][0] for t in llama_cpp_embeddings(gg, pairs)]
    assert np.abs(got - np.array(theirs)).max() <= 5e-3


@pytest.mark.parametrize("change,message", [
    ({"tokenizer.ggml.precompiled_charsmap": "abc"}, "array of bytes"),
    ({"tokenizer.ggml.precompiled_charsmap": [1000, 2]}, "array of bytes"),
    ({"tokenizer.ggml.precompiled_charsmap": list(b"\x08\x00\x00\x00" + bytes(8) + b"a" * 100 + b"\x00")},
     "bytes per match"),
    ({"tokenizer.ggml.precompiled_charsmap": list(b"\x00\x00\x00\x00abc\x00")}, "empty trie"),
    ({"tokenizer.ggml.precompiled_charsmap": list(b"\x40\x00\x00\x00" + bytes(16))}, "past its 16"),
    ({"tokenizer.ggml.unknown_token_id": None}, "unknown token"),
    ({"tokenizer.ggml.scores": [float("nan")] * 61}, "not finite"),
])
def test_bad_unigram_gguf_vocabulary_is_a_tokenizer_error(tmp_path, change, message):
    """The model loads (token ids still embed); text is refused with the vocabulary's fault."""
    from llambda.errors import TokenizerError
    from test_bert_gguf import changed_gguf
    with _load(changed_gguf(xlmr_gguf(EMBEDDER, tmp_path / "a.gguf"), tmp_path / "b.gguf", change)) as m:
        with pytest.raises(TokenizerError, match=message):
            m.embed(["the cat"])
        assert np.isfinite(m.embed([[0, 4, 5, 2]])).all()


def _charsmap_units(blob: bytes):
    """The trie's units (a copy) and where the first value unit sits."""
    import struct
    n = struct.unpack_from("<I", blob)[0] // 4
    units = list(struct.unpack_from(f"<{n}I", blob, 4))
    return units, next(i for i, u in enumerate(units) if u >> 31)


def _with_units(blob: bytes, units) -> bytes:
    import struct
    return blob[:4] + struct.pack(f"<{len(units)}I", *units) + blob[4 + 4 * len(units):]


def _hostile_charsmaps() -> dict[str, bytes]:
    """Charsmaps the library parses whose lookups read past the trie or the pool (a Rust panic inside encode)."""
    from charsmaps import SAMPLE, build_charsmap
    good = build_charsmap(SAMPLE)
    units, leaf = _charsmap_units(good)
    pool = len(good) - 4 - 4 * len(units)
    past_pool = units.copy()
    past_pool[leaf] = (1 << 31) | (pool + 1000)
    inside_char = units.copy()                      # "A" then NUL starts the pool: byte 1 of "1\u20442" is inside
    inside_char[leaf] = (1 << 31) | next(i for i, b in enumerate(good[4 + 4 * len(units):]) if b >= 0x80) + 1
    root_far = units.copy()
    root_far[0] = (len(units) + 256) << 10            # the root's children past the trie
    value_far = units.copy()                          # a leaf whose value unit lies past the trie
    i = next(i for i, u in enumerate(units) if (u >> 8) & 1 and not u >> 31)
    value_far[i] = (units[i] & 0x3FF) | (((i ^ (len(units) + 300)) & 0x1FFFFF) << 10)
    return {"points past": _with_units(good, past_pool), "inside a character": _with_units(good, inside_char),
            "children lie past": _with_units(good, root_far), "value past": _with_units(good, value_far)}


@pytest.mark.parametrize("why", ["points past", "inside a character", "children lie past", "value past"])
def test_a_charsmap_that_reads_out_of_bounds_is_refused_at_load(tmp_path, capfd, why):
    """The library indexes the trie and slices the pool unchecked: each of these was a Rust panic (and a backtrace
    on stderr) inside every encode. Now the vocabulary is refused when it is built, with what is wrong."""
    from llambda.errors import TokenizerError
    from test_bert_gguf import changed_gguf
    blob = _hostile_charsmaps()[why]
    gg = changed_gguf(xlmr_gguf(EMBEDDER, tmp_path / "a.gguf"), tmp_path / "b.gguf",
                      {"tokenizer.ggml.precompiled_charsmap": list(blob)})
    with _load(gg) as m:
        assert why in m.source.tokenizer_error
        with pytest.raises(TokenizerError, match=why):
            m.embed(["\uff21 \u00bd \U0001d400 \ufb01 e\u0301"])
        assert np.isfinite(m.embed([[0, 4, 5, 2]])).all()
    assert "panicked" not in capfd.readouterr().err


def _reference_normalize(blob: bytes, graphemes: list[str]) -> str:
    """The Precompiled normalizer by its definition (module charsmap.py's docstring), on a text of known
    graphemes: a grapheme under 6 bytes rewritten whole by the first leaf on its path, else char by char."""
    import struct
    n = struct.unpack_from("<I", blob)[0] // 4
    units = struct.unpack_from(f"<{n}I", blob, 4)
    pool = blob[4 + 4 * n:]

    def offset(u):
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    def lookup(key: str):
        base, found = offset(units[0]), []           # the whole key is walked; its first leaf is the match
        for c in key.encode():
            u = units[base ^ c]                      # an IndexError here: the check let a bad charsmap through
            if u & ((1 << 31) | 0xFF) != c:
                break
            base ^= c ^ offset(u)
            if (u >> 8) & 1:
                found.append(units[base] & ((1 << 31) - 1))
        if not found:
            return None
        assert found[0] <= len(pool)
        return pool[found[0]:].split(b"\0")[0].decode()

    out = []
    for g in graphemes:
        whole = lookup(g) if len(g.encode()) < 6 else None
        out.append(whole if whole is not None else "".join(lookup(c) or c for c in g))
    return "".join(out)


def _wide_charsmap(blocks: int) -> bytes:
    """A valid charsmap whose nodes sit in one level: the root's children 1..blocks each own a block of 256 units
    whose 255 units are childless nodes of their own (offset 0: each its own base). No key has a value."""
    import struct
    units = [0] * (256 * (blocks + 1))                # unit 0: the root's base is 0
    for c in range(1, blocks + 1):
        units[c] = c | ((c ^ (256 * c)) << 10)        # child c's base is block c
        for lo in range(1, 256):
            units[256 * c + lo] = lo
    blob = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(blob)) + blob + b"a\0"


def test_the_charsmap_check_reads_a_wide_trie_in_bounded_memory():
    """65k nodes in one level of a 256 KB charsmap (a real NFKC one's size): the check tried each node's 255
    children as one array, 400 MB at its peak. Each unit is read once now: a few MB."""
    import tracemalloc
    from llambda.tokenizer.charsmap import check_charsmap
    blob = _wide_charsmap(255)
    tracemalloc.start()
    try:
        check_charsmap("test", blob)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak


def test_random_charsmap_corruptions_are_refused_or_run_as_defined(capfd):
    """Many random corruptions of a valid charsmap (bytes, units, bit flips, the header, truncation): each is
    refused when the vocabulary is built, or normalizes the text every key of the table walks as the format
    defines it and encodes it; never a Rust panic."""
    from tokenizers import normalizers

    from charsmaps import SAMPLE, build_charsmap
    from llambda.errors import TokenizerError
    from llambda.formats.gguf import GGUFFile
    from llambda.tokenizer import Tokenizer
    good = build_charsmap(SAMPLE)
    graphemes = []
    for g in list(SAMPLE) + ["x", "\u00e9", "\u6f22", "\U0001f600", "ab"]:
        graphemes += [g, " "]
    text = "".join(graphemes)
    assert _reference_normalize(good, graphemes) == "".join(SAMPLE.get(g, g) for g in graphemes)
    with GGUFFile(xlmr_gguf(EMBEDDER, Path(__import__("tempfile").mkdtemp()) / "a.gguf")) as f:
        meta = dict(f.metadata)
    rng = np.random.default_rng(7)
    n_units = len(_charsmap_units(good)[0])
    refused = ran = 0
    for trial in range(400):
        blob = bytearray(good)
        kind = trial % 5
        if kind == 0:                               # a random byte anywhere
            blob[rng.integers(len(blob))] = rng.integers(256)
        elif kind == 1:                             # a trie unit rewritten: random, or a plausible label/leaf/offset
            i = 4 + 4 * int(rng.integers(n_units))
            u = int(rng.integers(1 << 32)) if rng.random() < 0.5 else (
                int(rng.integers(256)) | int(rng.integers(2)) << 8 | int(rng.integers(1 << 12)) << 10)
            blob[i:i + 4] = u.to_bytes(4, "little")
        elif kind == 2:                             # one bit flipped
            i = int(rng.integers(len(blob)))
            blob[i] ^= 1 << int(rng.integers(8))
        elif kind == 3:                             # the header's trie size
            blob[:4] = int(4 * rng.integers(0, n_units + 64) + rng.integers(4)).to_bytes(4, "little")
        else:                                       # cut short
            blob = blob[:int(rng.integers(len(blob)))]
        blob = bytes(blob)
        try:
            tk = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.precompiled_charsmap": list(blob)})
        except TokenizerError:
            refused += 1
            continue
        ran += 1
        assert normalizers.Precompiled(blob).normalize_str(text) == _reference_normalize(blob, graphemes), trial
        assert tk.encode(text)
    assert "panicked" not in capfd.readouterr().err
    assert refused > 40 and ran > 40, (refused, ran)       # both outcomes exercised


def test_xlmr_reranker_and_embedder_on_a_server():
    """/v1/rerank answers transformers' logits in its order; /v1/embeddings and Ollama's /api/embed its vectors."""
    from llambda.server import ServerConfig, create_app
    from serverkit import LiveServer, post
    cfg = ServerConfig(model_id="xlmr", parallel=1, queue_size=8, max_body_bytes=64 * 1024, max_tokens_cap=64,
                       prefill_chunk=64)
    ref = reference(RERANKER)
    docs, want = [p["document"] for p in ref["pairs"]], [p["logits"][0] for p in ref["pairs"]]
    with _load(RERANKER) as m, LiveServer(create_app(m, cfg)) as srv:
        r = post(srv, "/v1/rerank", {"query": ref["query"], "documents": docs})
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert [x["index"] for x in res] == list(np.argsort(want)[::-1])
        assert all(abs(x["relevance_score"] - want[x["index"]]) < 1e-5 for x in res)
    emb = reference(EMBEDDER)["inputs"]
    with _load(EMBEDDER) as m, LiveServer(create_app(m, cfg)) as srv:
        for path, body, key in (("/v1/embeddings", {"input": emb[1]["text"]}, None),
                                ("/api/embed", {"model": "xlmr", "input": emb[1]["text"]}, "embeddings")):
            r = post(srv, path, body)
            assert r.status_code == 200, r.text
            got = r.json()[key][0] if key else r.json()["data"][0]["embedding"]
            assert np.abs(np.array(got) - np.array(emb[1]["embedding"])).max() < 1e-5

"""Tokenizer: reference ids of the real models, streaming, flags, malformed metadata, tiny vocabularies."""
from __future__ import annotations

import base64
import json
import random
import struct
import threading
import time
import tracemalloc
import warnings

import numpy as np
import pytest

from llambda.errors import TokenizerError
from llambda.formats.gguf import GGUFFile
from llambda.tokenizer import Tokenizer, TokenizerWarning, TokenType
from llambda.tokenizer.pieces import BYTE_CHARS
from llambda.tokenizer.pretokenize import SPECS
from tests.conftest import load_reference

MODELS = ("smollm2", "qwen05", "gemma3")
REFS = {m: load_reference(f"{m}_tokenizer.json") for m in MODELS}


def _metadata(path) -> dict:
    f = GGUFFile(path)
    try:
        return {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    finally:
        f.close()


@pytest.fixture(scope="module")
def smollm2_meta(smollm2_gguf):
    return _metadata(smollm2_gguf)


@pytest.fixture(scope="module")
def toks(smollm2_meta, qwen05_gguf, gemma3_gguf):
    """model name -> Tokenizer, built once per module."""
    return {
        "smollm2": Tokenizer.from_gguf_metadata(smollm2_meta),
        "qwen05": Tokenizer.from_gguf_metadata(_metadata(qwen05_gguf)),
        "gemma3": Tokenizer.from_gguf_metadata(_metadata(gemma3_gguf)),
    }


def _cases():
    for m in MODELS:
        for case in REFS[m]["cases"]:
            yield pytest.param(m, case, id=f"{m}-{case['name']}")


# ---- the reference fixtures, case by case ----------------------------------------------------

@pytest.mark.parametrize("model,case", list(_cases()))
def test_reference_case(toks, model, case):
    tk = toks[model]
    assert tk.encode(case["text"]) == case["ids"]
    assert tk.encode(case["text"], parse_special=False) == case["ids_special_as_text"]
    assert tk.decode(case["ids"]) == case["decoded"]
    assert tk.decode(case["ids_special_as_text"]) == case["decoded_special_as_text"]
    if "token_bytes_hex" in case:
        assert [tk.token_bytes(i).hex() for i in case["ids"]] == case["token_bytes_hex"]
    texts = [tk.token_text(i) for i in case["ids"]]
    if model == "gemma3":
        # The GGUF stores Gemma's user-defined space runs with real spaces (so
        # that they match raw text); HF shows them with U+2581.
        texts = [t.replace(" ", "\u2581") if tk.token_type(i) == TokenType.USER_DEFINED else t
                 for t, i in zip(texts, case["ids"])]
    assert texts == case["tokens"]
    if case["roundtrip_exact"]:
        assert tk.decode(tk.encode(case["text"])) == case["text"]


def test_reference_cover_what_the_brief_names():
    """The fixtures hold the cases the tests above rely on (guards against a silently thinned file)."""
    names = {m: {c["name"] for c in REFS[m]["cases"]} for m in MODELS}
    assert {"spaces_before_digits", "emoji", "chinese", "special_chatml"} <= names["smollm2"]
    assert {"combining_marks", "special_qwen_fim", "special_qwen_tool_call"} <= names["qwen05"]
    assert {"special_gemma_turns", "special_gemma_bos_eos_inline"} <= names["gemma3"]
    # SmolLM2's digit isolation and Qwen's NFC are what the reference checks differ on.
    assert any(c["pretokenizers_differ"] for c in REFS["smollm2"]["cases"])
    assert any(c.get("nfc_changes_text") for c in REFS["qwen05"]["cases"])


def test_qwen_nfc_and_user_defined_tokens(toks):
    tk = toks["qwen05"]
    assert tk.decode(tk.encode("e\u0301")) == "\u00e9"                # NFC before BPE
    # <tool_call> is user-defined: whole even when control tokens are spelled out.
    assert tk.encode("<tool_call>", parse_special=False) == [151657]
    assert len(tk.encode("<|im_start|>", parse_special=False)) > 1
    assert not tk.is_special(151657) and tk.is_special(151644)


@pytest.mark.parametrize("model", MODELS)
def test_prompt_ids_and_greedy_text(toks, model):
    """encode(prompt, add_bos=True) is what the model was fed; decode gives generate()'s text."""
    tk = toks[model]
    ref = load_reference(f"{model}_logits.json")
    for p in ref["prompts"]:
        assert tk.encode(p["prompt"], add_bos=True) == p["prompt_ids"], p["prompt"]
        for key in ("greedy", "greedy_ignoring_eos"):
            if key in p and "text" in p[key]:
                assert tk.decode(p[key]["ids"]) == p[key]["text"]


@pytest.mark.parametrize("model", ["smollm2", "qwen05"])
def test_chat_rendered_ids(toks, model):
    tk = toks[model]
    for conv in load_reference(f"{model}_chat_template.json")["conversations"]:
        assert tk.encode(conv["rendered"]) == conv["ids"], conv["name"]


def test_model_flags(toks):
    s, q, g = toks["smollm2"], toks["qwen05"], toks["gemma3"]
    assert (s.bos_id, s.eos_id, s.add_bos, s.add_eos, s.vocab_size) == (1, 2, False, False, 49152)
    assert (q.bos_id, q.eos_id, q.add_bos, q.vocab_size) == (151643, 151645, False, 151936)
    assert (g.bos_id, g.eos_id, g.add_bos, g.add_eos, g.vocab_size) == (2, 1, True, False, 262144)
    assert {2} <= s.eot_ids and {151645, 151643} <= q.eot_ids and {1, 106} <= g.eot_ids
    assert 151644 not in q.eot_ids and 105 not in g.eot_ids          # <|im_start|>, <start_of_turn>
    assert (s.model, s.pre, g.model) == ("gpt2", "smollm", "llama")


def test_add_bos_follows_model_flag(toks):
    g, s = toks["gemma3"], toks["smollm2"]
    plain = g.encode("Hello world")
    assert g.encode("Hello world", add_bos=True) == [2] + plain
    # A template that already wrote <bos> does not get a second one.
    assert g.encode("<bos>Hello world", add_bos=True) == [2] + plain
    assert s.encode("Hello world", add_bos=True) == s.encode("Hello world")


@pytest.mark.parametrize("model", MODELS)
def test_every_added_token_encodes_to_its_own_id(toks, model):
    tk = toks[model]
    added = [i for i in range(tk.vocab_size)
             if tk.token_type(i) in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)]
    assert len(added) >= 3
    for i in added:
        assert tk.encode(tk.token_text(i)) == [i], (i, tk.token_text(i))


def test_parse_special_switch_is_thread_safe(toks):
    tk = toks["qwen05"]
    text = "<|im_start|>user\nhi<|im_end|>"
    want = {True: tk.encode(text, parse_special=True), False: tk.encode(text, parse_special=False)}
    assert want[True] != want[False]
    errors = []

    def worker(flag):
        for _ in range(300):
            if tk.encode(text, parse_special=flag) != want[flag]:
                errors.append(flag)

    threads = [threading.Thread(target=worker, args=(flag,)) for flag in (True, False, True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_skip_special_and_is_special(toks):
    s = toks["smollm2"]
    ids = s.encode("<|im_start|>user\nHi<|im_end|>")
    assert s.decode(ids, skip_special=True) == "user\nHi"
    assert s.decode(ids) == "<|im_start|>user\nHi<|im_end|>"
    assert s.is_special(1) and not s.is_special(ids[1])
    assert s.token_bytes(1) == b"<|im_start|>"
    g = toks["gemma3"]
    assert g.decode(g.encode("<start_of_turn>model\nok<end_of_turn>"), skip_special=True) == "model\nok"


# ---- streaming -------------------------------------------------------------------------------

STREAM_TEXTS = ["I love 🦀 and 🐍! 👍🏽", "Family: 👨‍👩‍👧‍👦, flag: 🏳️‍🌈, 🇫🇷",
                "你好，世界！今天天气很好。", "日本語のテキスト 한국어 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠀋𠂤", "mixed ascii é 🤖 end"]


@pytest.mark.parametrize("model", MODELS)
def test_stream_emits_whole_characters(toks, model):
    tk = toks[model]
    held_back = 0
    for text in STREAM_TEXTS:
        ids = tk.encode(text)
        dec = tk.stream()
        out = []
        for i in ids:
            piece = dec.feed(i)
            # Only complete characters: re-encoding gives the same string, and
            # nothing was replaced by U+FFFD.
            assert "\ufffd" not in piece
            held_back += bool(dec.pending)
            out.append(piece)
        out.append(dec.flush())
        assert "".join(out) == tk.decode(ids) == text
    # The texts must actually split characters across tokens for the test to mean anything.
    assert held_back > 0


@pytest.mark.parametrize("model", MODELS)
def test_stream_equals_decode_on_random_ids(toks, model):
    """Any id sequence, including ones that make invalid UTF-8, streams to decode()'s text."""
    tk = toks[model]
    rng = random.Random(1234)
    for _ in range(200):
        ids = [rng.randrange(tk.vocab_size) for _ in range(rng.randrange(1, 12))]
        dec = tk.stream()
        assert "".join(dec.feed(i) for i in ids) + dec.flush() == tk.decode(ids)
        dec = tk.stream(skip_special=True)
        assert "".join(dec.feed(i) for i in ids) + dec.flush() == tk.decode(ids, skip_special=True)


def test_stream_byte_tokens_one_at_a_time(toks):
    """Gemma's <0xNN> byte-fallback tokens: a 4-byte character arrives in 4 feeds."""
    g = toks["gemma3"]
    byte_id = {g.token_text(i): i for i in range(g.vocab_size) if g.token_type(i) == TokenType.BYTE}
    ids = [byte_id[f"<0x{b:02X}>"] for b in "🦀".encode()]
    dec = g.stream()
    assert [dec.feed(i) for i in ids] == ["", "", "", "🦀"]
    assert dec.flush() == ""
    dec.feed(ids[0])
    assert dec.flush() == "\ufffd"          # a dangling lead byte at the end


# ---- bad input -------------------------------------------------------------------------------

def test_bad_ids_and_text(toks):
    s = toks["smollm2"]
    for bad in ([-1], [s.vocab_size], [1.5], ["a"], [None]):
        with pytest.raises(TokenizerError):
            s.decode(bad)
    with pytest.raises(TokenizerError):
        s.token_bytes(s.vocab_size)
    with pytest.raises(TokenizerError):
        s.stream().feed(-3)
    with pytest.raises(TokenizerError):
        s.encode(None)
    with pytest.raises(TokenizerError, match="surrogate"):
        s.encode("a\ud800b")
    assert s.decode(np.array([19556, 905], dtype=np.int32)) == "Hello world"
    assert s.encode("") == []


def test_bytes_missing_from_vocab_are_dropped_with_a_warning(toks):
    s = toks["smollm2"]
    missing = REFS["smollm2"]["tokenizer"]["byte_symbols_missing_from_vocab"]
    assert "0x04" in missing
    with pytest.warns(TokenizerWarning, match="0x04"):
        ids = s.encode("a\x04b")
    assert ids == s.encode("a") + s.encode("b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.encode("plain text, no warning")


# ---- malformed metadata ----------------------------------------------------------------------

def _tiny_bpe_meta(**over):
    """A byte-level vocab: the 256 byte symbols, a few merges, three control tokens."""
    tokens = list(BYTE_CHARS) + ["he", "ll", "hell", "hello", "Ġw", "Ġwor", "<s>", "</s>", "<|im_end|>"]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * 262 + [3, 3, 3],
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw or"][:4] + ["Ġ w"],
        "tokenizer.ggml.bos_token_id": 262,
        "tokenizer.ggml.eos_token_id": 263,
    }
    md.update(over)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_bpe_meta_is_valid():
    tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta())
    ids = tk.encode("hello world<|im_end|>")
    assert tk.decode(ids) == "hello world<|im_end|>"
    assert ids[0] == tk.encode("hello")[0] == 259 and ids[-1] == 264
    assert 264 in tk.eot_ids and 263 in tk.eot_ids


@pytest.mark.parametrize("change,message", [
    ({"tokenizer.ggml.tokens": None}, "no 'tokenizer.ggml.tokens'"),
    ({"tokenizer.ggml.tokens": []}, "empty"),
    ({"tokenizer.ggml.tokens": "abc"}, "array of strings"),
    ({"tokenizer.ggml.tokens": list(BYTE_CHARS) + [7]}, r"tokens'\[256\] must be a string"),
    ({"tokenizer.ggml.merges": ["h e", "q zz"]}, r"merges\[1\] = 'q zz': its right part 'zz' is not in"),
    ({"tokenizer.ggml.merges": ["h e", "he e"]}, r"merged token 'hee'"),
    ({"tokenizer.ggml.merges": ["h e", "hello"]}, "not two tokens separated by a space"),
    ({"tokenizer.ggml.token_type": [1] * 10}, "token_type' has 10 entries but tokenizer.ggml.tokens has 265"),
    ({"tokenizer.ggml.token_type": [[1, 2]] * 265}, "1-D"),
    ({"tokenizer.ggml.scores": [0.0] * 3}, "scores' has 3 entries"),
    ({"tokenizer.ggml.bos_token_id": 265}, "bos_token_id' = 265 is out of range"),
    ({"tokenizer.ggml.eos_token_id": 10**6}, "eos_token_id' = 1000000 is out of range"),
    ({"tokenizer.ggml.bos_token_id": "1"}, "must be an integer"),
    ({"tokenizer.ggml.model": "rwkv"}, "'rwkv' is not supported"),      # (t5, Unigram: tests/test_xlmr.py)
    ({"tokenizer.ggml.model": "bert"}, r"needs its \[CLS\], \[SEP\] and unknown token ids"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "must be a bool"),
])
def test_malformed_metadata_raises(change, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**change))


def test_not_a_dict_raises():
    with pytest.raises(TokenizerError):
        Tokenizer.from_gguf_metadata(["tokens"])


def test_merges_with_unknown_tokens_in_real_vocab(smollm2_meta):
    md = dict(smollm2_meta)
    md["tokenizer.ggml.merges"] = list(md["tokenizer.ggml.merges"]) + ["Ġt nosuchtoken"]
    with pytest.raises(TokenizerError, match="nosuchtoken"):
        Tokenizer.from_gguf_metadata(md)


def test_bos_out_of_range_in_real_vocab(smollm2_meta):
    md = dict(smollm2_meta, **{"tokenizer.ggml.bos_token_id": 49152})
    with pytest.raises(TokenizerError, match="bos_token_id' = 49152"):
        Tokenizer.from_gguf_metadata(md)


def test_optional_ids_out_of_range_only_warn():
    with pytest.warns(TokenizerWarning, match="padding_token_id"):
        tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.padding_token_id": 999}))
    assert tk.pad_id is None


def test_add_bos_without_bos_warns_and_adds_nothing():
    with pytest.warns(TokenizerWarning, match="no BOS"):
        tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.bos_token_id": None,
                                                              "tokenizer.ggml.add_bos_token": True}))
    assert tk.encode("hello", add_bos=True) == tk.encode("hello")


def test_add_eos_flag():
    tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.add_bos_token": True,
                                                          "tokenizer.ggml.add_eos_token": True}))
    assert tk.encode("hello", add_bos=True) == [262, 259, 263]
    assert tk.encode("hello") == [259]


# ---- pre-tokenizers --------------------------------------------------------------------------

def test_unknown_pre_warns_and_uses_gpt2():
    with pytest.warns(TokenizerWarning, match="unknown pre-tokenizer 'made-up'"):
        tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": "made-up"}))
    ref = Tokenizer.from_gguf_metadata(_tiny_bpe_meta())
    text = "hello world 123 it's"
    assert tk.encode(text) == ref.encode(text)


@pytest.mark.parametrize("pre", sorted(SPECS))
def test_every_known_pre_tokenizer_builds_and_round_trips(pre):
    tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": pre}))
    text = "Hello, world! It's 2024: x =   42\n\tnaïve 你好 🦀 <s>"
    assert tk.decode(tk.encode(text)) == text


PRE_TEXT = "x =   42 12345 it's\tTAB\r\n\n  end "
# Worked out by hand from each original tokenizer's regexes (Ġ = space, ĉ = tab, č = CR, Ċ = LF).
PRE_PIECES = {
    "gpt2": ["x", "Ġ=", "ĠĠ", "Ġ42", "Ġ12345", "Ġit", "'s", "ĉ", "TAB", "čĊĊĠ", "Ġend", "Ġ"],
    "smollm": ["x", "Ġ=", "ĠĠĠ", "4", "2", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s", "ĉ", "TAB", "čĊĊĠ",
               "Ġend", "Ġ"],
    "qwen2": ["x", "Ġ=", "ĠĠ", "Ġ", "4", "2", "Ġ", "1", "2", "3", "4", "5", "Ġit", "'s", "ĉTAB", "čĊĊ", "Ġ",
              "Ġend", "Ġ"],
    "llama-bpe": ["x", "Ġ=", "ĠĠ", "Ġ", "42", "Ġ", "123", "45", "Ġit", "'s", "ĉTAB", "čĊĊ", "Ġ", "Ġend", "Ġ"],
}


@pytest.mark.parametrize("pre", sorted(PRE_PIECES))
def test_pre_tokenizer_pieces(pre):
    tk = Tokenizer.from_gguf_metadata(_tiny_bpe_meta(**{"tokenizer.ggml.pre": pre}))
    assert [p for p, _ in tk._backend.pre_tokenizer.pre_tokenize_str(PRE_TEXT)] == PRE_PIECES[pre]


# ---- tiny vocabularies -----------------------------------------------------------------------

def test_tiny_byte_level_vocab_without_merges():
    """A test model's vocab: bytes, a few words, specials, no merges at all."""
    words = ["he", "ll", "hell", "hello", "Ġw", "Ġwo", "Ġwor", "Ġworld", "or", "ld"]
    tokens = ["<|endoftext|>"] + list(BYTE_CHARS) + words + ["<|im_start|>", "<|im_end|>"]
    types = [3] + [1] * (256 + len(words)) + [3, 3]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.eos_token_id": len(tokens) - 1}
    tk = Tokenizer.from_gguf_metadata(md)
    assert tk.vocab_size == 269 and tk.pre == "default"
    ids = tk.encode("<|im_start|>hello world!<|im_end|>")
    assert [tk.token_text(i) for i in ids] == ["<|im_start|>", "hello", "Ġworld", "!", "<|im_end|>"]
    text = "any bytes: \x00\x7f é 🦀"
    assert tk.decode(tk.encode(text)) == text
    assert len(tk.encode(text)) == len(text.encode())        # no merges apply: one token per byte


def _tiny_spm_meta(add_space_prefix: bool):
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁w", "▁wor", "▁world",
              "or", "ld", "▁h", "▁hello"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["<|user|>", "\n\n"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [3, 4]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0, 0.0]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": add_space_prefix}


def test_tiny_sentencepiece_vocab():
    tk = Tokenizer.from_gguf_metadata(_tiny_spm_meta(add_space_prefix=False))
    assert tk.add_bos and tk.bos_id == 1                     # SentencePiece default: add BOS
    ids = tk.encode("hello world")
    assert [tk.token_text(i) for i in ids] == ["hello", "▁world"]
    # 'x' and 'é' have no piece: byte fallback, and the bytes decode back.
    ids = tk.encode("hex é")
    assert [tk.token_text(i) for i in ids] == ["he", "<0x78>", "▁", "<0xC3>", "<0xA9>"]
    assert tk.decode(ids) == "hex é"
    assert tk.encode("hello", add_bos=True)[0] == 1
    ids = tk.encode("hello<|user|>\n\nworld")
    assert [tk.token_text(i) for i in ids] == ["hello", "<|user|>", "\n\n", "w", "or", "ld"]
    assert tk.encode("<|user|>", parse_special=False) != [tk.encode("<|user|>")[0]]


def test_sentencepiece_merges_follow_scores_not_ids():
    def encode(scores):
        md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", "c", "ab", "bc"],
              "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": [2, 1, 1, 1, 1, 1],
              "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": False}
        tk = Tokenizer.from_gguf_metadata(md)
        return [tk.token_text(i) for i in tk.encode("abc")]

    assert encode([0, -1, -1, -1, -5, -2]) == ["a", "bc"]          # bc scores higher, though listed later
    assert encode([0, -1, -1, -1, -2, -5]) == ["ab", "c"]


def test_tiny_sentencepiece_without_byte_tokens_warns():
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<s>", "a", "bc", "ü", ""],
          "tokenizer.ggml.scores": [0.0, -1.0, -2.5, -3.0, -4.0], "tokenizer.ggml.bos_token_id": 0}
    with pytest.warns(TokenizerWarning, match="without the 256"):
        tk = Tokenizer.from_gguf_metadata(md)
    # No token types: the BOS named in the metadata still counts as a control token.
    assert tk.is_special(0) and tk.encode("<s>a") == [0, 1]
    assert tk.encode("aü", add_bos=True) == [0, 1, 3]


def test_tiny_sentencepiece_space_prefix():
    tk = Tokenizer.from_gguf_metadata(_tiny_spm_meta(add_space_prefix=True))
    ids = tk.encode("hello world")
    assert [tk.token_text(i) for i in ids] == ["▁hello", "▁world"]
    assert tk.decode(ids) == "hello world"                   # the prepended space is dropped again
    with_bos = tk.encode("hello", add_bos=True)
    assert tk.decode(with_bos) == "<s> hello"                 # as llama.cpp: only a leading space is dropped
    assert tk.decode(with_bos, skip_special=True) == "hello"
    dec = tk.stream()                                        # streaming keeps a generated token's space
    assert dec.feed(ids[1]) == " world"


# ---- Hugging Face directories ----------------------------------------------------------------

def _write_smollm2_hf_dir(folder, meta):
    """An HF directory as SmolLM2 ships it: Digits + ByteLevel pre-tokenizer (from the reference notes)."""
    ref = REFS["smollm2"]["tokenizer"]
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = np.asarray(meta["tokenizer.ggml.token_type"])
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": int(i), "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i in np.flatnonzero(types == 3)],
        "normalizer": None,
        "pre_tokenizer": ref["smollm_pre_tokenizer"],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in meta["tokenizer.ggml.merges"]]},
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
              "chat_template": meta["tokenizer.chat_template"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}), encoding="utf-8")


def test_from_hf_dir_byte_level(tmp_path, smollm2_meta, toks):
    _write_smollm2_hf_dir(tmp_path, smollm2_meta)
    tk = Tokenizer.from_hf_dir(tmp_path)
    assert (tk.bos_id, tk.eos_id, tk.add_bos, tk.vocab_size) == (1, 2, False, 49152)
    assert {0, 2} <= tk.eot_ids
    for case in REFS["smollm2"]["cases"]:
        assert tk.encode(case["text"]) == case["ids"], case["name"]
        assert tk.encode(case["text"], parse_special=False) == case["ids_special_as_text"], case["name"]
        assert tk.decode(case["ids"]) == case["decoded"]
    assert tk.is_special(1) and tk.token_bytes(1) == b"<|im_start|>"


def test_from_hf_dir_sentencepiece_style(tmp_path):
    """A Gemma-like tokenizer.json (pipeline as the reference records it) on the tiny SentencePiece vocab."""
    spm = Tokenizer.from_gguf_metadata(_tiny_spm_meta(add_space_prefix=False))
    ref = REFS["gemma3"]["tokenizer"]
    spec = json.loads(spm._backend.to_str())
    spec["normalizer"] = ref["transformers_gguf_normalizer"]
    spec["pre_tokenizer"] = ref["transformers_gguf_pre_tokenizer"]
    spec["decoder"] = ref["transformers_gguf_decoder"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": True}), encoding="utf-8")
    tk = Tokenizer.from_hf_dir(tmp_path)
    assert (tk.bos_id, tk.eos_id, tk.add_bos, tk.model) == (1, 2, True, "llama")
    for text in ("hello world", "hex é", "hello<|user|>\n\nworld"):
        assert tk.encode(text) == spm.encode(text)
        assert tk.decode(tk.encode(text)) == text
    assert tk.encode("hello", add_bos=True)[0] == 1
    assert tk.token_type(tk.encode("x")[0]) == TokenType.BYTE


def test_from_hf_dir_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="cannot load it"):
        Tokenizer.from_hf_dir(tmp_path)
    # WordPiece is supported (BERT encoders, tests/test_embeddings.py); WordLevel is not
    wordlevel = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                 "post_processor": None, "decoder": None, "truncation": None, "padding": None,
                 "model": {"type": "WordLevel", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(wordlevel), encoding="utf-8")
    with pytest.raises(TokenizerError, match="WordLevel"):
        Tokenizer.from_hf_dir(tmp_path)


# ---- hostile vocabularies: bounded, typed -------------------------------------------------------

def test_a_vocabulary_of_empty_tokens_builds():
    """Only empty pieces: nothing to derive merges from (was an IndexError out of the GGUF loader)."""
    for model in ("gpt2", "llama"):
        md = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": ["", ""]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TokenizerWarning)      # no byte tokens: bytes are dropped
            tk = Tokenizer.from_gguf_metadata(md)
            assert tk.vocab_size == 2 and tk.encode("") == []


def test_long_tokens_split_many_ways_are_refused_fast():
    """Tokens "a" * i, i < 700 (240 kB): each splits i - 1 ways into two tokens, 240k merges of 114M chars
    handed to the library (3000 such tokens, 4.5 MB, once took 9.6 GB); refused before building."""
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>"] + ["a" * i for i in range(1, 700)],
          "tokenizer.ggml.unknown_token_id": 0}
    c0 = time.process_time()
    with pytest.raises(TokenizerError, match="merges of .* chars"):
        Tokenizer.from_gguf_metadata(md)
    assert time.process_time() - c0 < 5


def test_split_points_are_bounded(monkeypatch):
    from llambda.tokenizer import merges
    monkeypatch.setattr(merges, "MAX_SPLITS", 1000)
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a" * 1002],
          "tokenizer.ggml.unknown_token_id": 0}
    with pytest.raises(TokenizerError, match="1001 split points"):
        Tokenizer.from_gguf_metadata(md)


def _tiny_tokenizer_json(tmp_path, **changes) -> dict:
    spec = json.loads(Tokenizer.from_gguf_metadata(_tiny_bpe_meta())._backend.to_str())
    spec.update(changes)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return spec


def test_from_hf_dir_odd_but_loadable_specs(tmp_path):
    """What the library accepts must not break our own reading of tokenizer.json (once a TypeError / a bare
    Exception out of load())."""
    spec = json.loads(Tokenizer.from_gguf_metadata(_tiny_bpe_meta())._backend.to_str())
    _tiny_tokenizer_json(tmp_path, decoder=dict(spec["decoder"], decoders=5))    # a stray key the library ignores
    assert Tokenizer.from_hf_dir(tmp_path).decode(Tokenizer.from_hf_dir(tmp_path).encode("hello")) == "hello"
    unigram = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
               "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
               "truncation": None, "padding": None,
               "model": {"type": "Unigram", "unk_id": None, "vocab": [["b", -1.0]], "byte_fallback": False}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(unigram), encoding="utf-8")
    tk = Tokenizer.from_hf_dir(tmp_path)              # no unk: "a" cannot be encoded, "b" can
    assert tk.encode("b") == [0]
    with pytest.raises(TokenizerError, match="unk"):
        tk.encode("a")


@pytest.mark.parametrize("normalizer", [
    {"type": "Replace", "pattern": {"String": "a"}, "content": "b" * 100_000},
    {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "x" * 1000}]}])
def test_from_hf_dir_refuses_a_normalizer_that_multiplies_text(tmp_path, normalizer):
    """Replace("a", 100k chars): a 2000-char text became 200M chars inside the library (23 GB, OOM-killed)."""
    _tiny_tokenizer_json(tmp_path, normalizer=normalizer)
    with pytest.raises(TokenizerError, match="chars per match"):
        Tokenizer.from_hf_dir(tmp_path)


def _dense_bpe_tokenizer_json(folder, merges: int) -> int:
    """A byte-level BPE tokenizer.json of 2 * merges + 1 tokens (merge i: "a%08d" + "b"); its size in bytes."""
    vocab = {"b": 0}
    for i in range(merges):
        vocab[f"a{i:08d}"], vocab[f"a{i:08d}b"] = 1 + 2 * i, 2 + 2 * i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                      "vocab": vocab, "merges": [[f"a{i:08d}", "b"] for i in range(merges)]}}
    text = json.dumps(spec, separators=(",", ":"))
    (folder / "tokenizer.json").write_text(text, encoding="ascii")
    return len(text)


def test_a_big_tokenizer_json_is_parsed_by_the_library_alone(tmp_path):
    """tokenizer.json was also parsed whole in Python (its vocab dict, merge lists): 11.4x the file's size in
    Python objects at the peak, on top of the library's own copy (a 70 MB file: 2.0 GB resident, 1.5 GB now).
    Only the library parses it now; Python holds the token list (4.6x this file of 9-char tokens)."""
    size = _dense_bpe_tokenizer_json(tmp_path, 60_000)
    tracemalloc.start()
    try:
        tk = Tokenizer.from_hf_dir(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tk.vocab_size == 120_001 and tk.token_text(16) == "a00000007b"
    assert peak < 6 * size


def test_a_tokenizer_json_past_the_cap_is_refused_unread(tmp_path):
    """The library holds ~16x a tokenizer.json's size: past 128 MB (~4x Gemma 3's 35 MB) it is refused before
    reading (the cap was 512 MB, about 8 GB once loaded). A sparse file: nothing is written to disk."""
    with open(tmp_path / "tokenizer.json", "wb") as f:
        f.truncate((128 << 20) + 1)
    with pytest.raises(TokenizerError, match="larger than 128 MB"):
        Tokenizer.from_hf_dir(tmp_path)


def _charsmap(replacement: bytes) -> str:
    """A SentencePiece precompiled_charsmap mapping "a" to `replacement`: a 256-unit double-array trie (root
    offset 0, so byte c is looked up at unit c; unit 97 is "a" with a leaf one step away, at 97 ^ 1 = 96, whose
    value 0 points at the start of the pool), then the NUL-ended pool."""
    trie = [0] * 256
    trie[ord("a")] = ord("a") | 1 << 8 | 1 << 10      # label "a", has a leaf, child offset 1
    trie[ord("a") ^ 1] = 1 << 31                       # the leaf: pool offset 0
    blob = struct.pack("<I", 4 * len(trie)) + struct.pack(f"<{len(trie)}I", *trie) + replacement + b"\0"
    return base64.b64encode(blob).decode()


def test_from_hf_dir_refuses_a_precompiled_charsmap_that_multiplies_text(tmp_path):
    """A charsmap mapping "a" to 1000 bytes: the library made 10k chars of a 30-char text (without bound)."""
    hostile = {"type": "Precompiled", "precompiled_charsmap": _charsmap(b"b" * 1000)}
    from tokenizers import Tokenizer as Backend
    _tiny_tokenizer_json(tmp_path, normalizer=hostile)
    grown = Backend.from_file(str(tmp_path / "tokenizer.json")).normalizer.normalize_str("xax" * 10)
    assert len(grown) == 30 - 10 + 10 * 1000        # the danger is real: the library applies it as written
    with pytest.raises(TokenizerError, match="up to 1000 bytes per match, more than the 64 allowed"):
        Tokenizer.from_hf_dir(tmp_path)
    _tiny_tokenizer_json(tmp_path, normalizer={"type": "Sequence", "normalizers": [hostile]})
    with pytest.raises(TokenizerError, match="bytes per match"):
        Tokenizer.from_hf_dir(tmp_path)
    # NFKC's longest real expansion (U+FDFA, 33 bytes) is within the bound and applied
    phrase = "\u0635\u0644\u0649 \u0627\u0644\u0644\u0647 \u0639\u0644\u064a\u0647 \u0648\u0633\u0644\u0645"
    _tiny_tokenizer_json(tmp_path, normalizer={"type": "Precompiled",
                                               "precompiled_charsmap": _charsmap(phrase.encode())})
    tk = Tokenizer.from_hf_dir(tmp_path)
    assert tk.decode(tk.encode("xa")) == "x" + phrase


def test_a_library_panic_on_the_text_is_a_tokenizer_error(tmp_path):
    """A Split regex that backtracks past onig's limit on this text: the library panics, which pyo3 raises as a
    BaseException (PanicException) that `except Exception` let through untyped. The tokenizer still works after."""
    spec = json.loads(Tokenizer.from_gguf_metadata(_tiny_bpe_meta())._backend.to_str())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tk = Tokenizer.from_hf_dir(tmp_path)
    with pytest.raises(TokenizerError, match="retry-limit"):
        tk.encode("a" * 40 + "!")
    assert tk.decode(tk.encode("hello world")) == "hello world"

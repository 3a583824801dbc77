"""Every `tokenizer.ggml.pre` spec against its family's original tokenizer.json pipeline.

fixtures/reference/pre_tokenizers.json holds, per family, the original normalizer, pre_tokenizer
and `ignore_merges` (facts from the original files). The `tokenizers` library runs that original
pipeline as the reference; our tokenizer, built from GGUF-style metadata naming the pre-tokenizer,
must cut a hostile text into the same pieces and encode it to the same ids.
"""
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers

from llambda.tokenizer import Tokenizer
from llambda.tokenizer.pretokenize import SPECS, spec_from_tokenizer_json
from llambda.tools.export_tokenizer import pre_tokenizer_name

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "reference" / "pre_tokenizers.json")
                     .read_text(encoding="utf-8"))
FAMILIES = {f["names"][0]: f for f in FIXTURE["families"]}
NAMES = sorted(n for f in FIXTURE["families"] for n in f["names"])

HOSTILE = [
    "ied 4 ½ months",                                       # the issue's example: ½ is a number (No)
    "Digits: 1234567 ٣٤٥ ²³ ⅫⅣ 12,345.67 3.14159 007",       # Nd of other scripts, No, Nl, runs of all lengths
    "I'M don't WE'LL you'Re it's 'twas O'Neil's",           # contractions in every case
    "tabs\tand   runs  \t \n\n\r\n  \u00a0\u2003end   ",   # whitespace runs, CRLF, NBSP, em space, trailing
    "中文字符和日本語のかなカナ、한국어 텍스트。",              # CJK, kana, Hangul, CJK punctuation
    "emoji 🦀🦀 👩‍👩‍👧 🇫🇷 ✨x",                                 # astral, ZWJ sequences, flags
    "cafe\u0301 naïve e\u0301\u0301 \u0301lone",             # combining marks (NFC changes some)
    "Ελληνικά ώ ΐ Ί ŉ ǅungsten Ⅰ",                          # Greek extended, titlecase
    "عربي १२३ हिन्दी ไทย",                                   # Arabic, Devanagari digits, Thai
    "x=a+b<c>d^e~f|g`h$i;  ${{foo}}!!?..., --> /path/to/file.py:42",
    "CamelCaseWord HTTPServer iPhone XMLHttpRequest",       # o200k / tekken case splits
    "line1\nline2\r\n\tline3\n\n\n",
]


@pytest.fixture(scope="module")
def trained():
    """A byte-level BPE trained on the corpus: its vocab and merges serve both sides."""
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(HOSTILE * 3, trainer)
    return json.loads(tk.to_str())


def reference(trained: dict, family: dict) -> HFTokenizer:
    spec = dict(trained, normalizer=family["normalizer"], pre_tokenizer=family["pre_tokenizer"])
    spec["model"] = dict(trained["model"], ignore_merges=family["ignore_merges"])
    return HFTokenizer.from_str(json.dumps(spec))


def ours(trained: dict, pre: str) -> Tokenizer:
    vocab = trained["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in trained["model"]["merges"]]
    return Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * len(tokens), "tokenizer.ggml.merges": merges})


def pieces(tk: HFTokenizer, text: str) -> list[str]:
    norm = tk.normalizer.normalize_str(text) if tk.normalizer is not None else text
    return [p for p, _ in tk.pre_tokenizer.pre_tokenize_str(norm)]


def test_every_spec_has_its_original():
    assert sorted(SPECS) == NAMES


@pytest.mark.parametrize("pre", NAMES)
def test_pieces_and_ids_equal_the_original(pre, trained):
    family = next(f for f in FIXTURE["families"] if pre in f["names"])
    ref, tk = reference(trained, family), ours(trained, pre)
    for text in HOSTILE + ["\n".join(HOSTILE)]:
        assert pieces(tk._backend, text) == pieces(ref, text), (pre, text)
        assert tk.encode(text) == ref.encode(text, add_special_tokens=False).ids, (pre, text)
        assert tk.decode(tk.encode(text)) == (ref.normalizer.normalize_str(text) if ref.normalizer else text)


@pytest.mark.parametrize("first", sorted(FAMILIES))
def test_export_names_each_original(first):
    """HF -> GGUF export recognises each original pipeline and writes a name of the same split."""
    family = FAMILIES[first]
    spec = {"normalizer": family["normalizer"], "pre_tokenizer": family["pre_tokenizer"],
            "model": {"type": "BPE", "ignore_merges": family["ignore_merges"]}}
    name = pre_tokenizer_name(spec)
    assert name in family["names"]
    assert SPECS[name] == spec_from_tokenizer_json(spec)


def test_the_issue_example_no_longer_falls_back(recwarn):
    """qwen35 and deepseek-llm were unknown (a GPT-2 split and a warning): now their own splits."""
    from llambda.tokenizer.pretokenize import byte_level_pipeline
    want = {"deepseek-llm": ["ied", "Ġ", "4", "Ġ", "Â½", "Ġmonths"],
            "qwen35": ["ied", "Ġ", "4", "Ġ", "Â½", "Ġmonths"],
            "gpt2": ["ied", "Ġ4", "ĠÂ½", "Ġmonths"]}
    for pre, expected in want.items():
        _, pt = byte_level_pipeline(SPECS[pre])
        assert [p for p, _ in pt.pre_tokenize_str("ied 4 ½ months")] == expected, pre
    assert not [w for w in recwarn if "unknown pre-tokenizer" in str(w.message)]


@pytest.mark.parametrize("step", [
    {"type": "Metaspace", "replacement": "▁"},
    {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
    {"type": "Punctuation", "behavior": "Isolated"},
])
def test_steps_without_an_equivalent_are_not_guessed(step):
    spec = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [step, {"type": "ByteLevel"}]}}
    assert spec_from_tokenizer_json(spec) is None and pre_tokenizer_name(spec) is None

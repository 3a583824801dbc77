"""Pre-tokenizer per `tokenizer.ggml.pre`: how text is cut before byte-level BPE.

Each spec reproduces the original Hugging Face tokenizer.json of that family (its normalizer,
its pre_tokenizer Sequence and its BPE model's `ignore_merges`), not llama.cpp's adaptation of
it: the names are llama.cpp's (the GGUF key), the splitting is the original's. Every step of
an original Sequence is written as a regex split with HF's "isolated" behaviour (every match and
every gap between matches becomes a piece): `Digits(individual_digits)` is `\\p{N}` (`\\p{N}+`
without), `Punctuation(Contiguous)` is a class of Unicode punctuation plus the ASCII symbols,
`ByteLevel(use_regex)` is the GPT-2 regex. Splits in `after_bytes` run after the bytes were
mapped to GPT-2's printable characters, as in originals whose Sequence has steps after ByteLevel
(Falcon). The regexes are facts from the original tokenizer.json files (and llama.cpp's
llama-vocab.cpp, which quotes them); tests/test_pretokenize.py checks every spec against the
`tokenizers` library running the original pipeline.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from tokenizers import Regex, normalizers, pre_tokenizers

from .vocab import TokenizerWarning

# ByteLevel(use_regex=True)'s own split (GPT-2).
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5: combining marks stay with their letters.
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
          r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
# tiktoken's o200k (GPT-4o, gpt-oss, Llama 4): words split at case changes, contractions as suffixes.
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION +
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION +
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM = r" ?[^(\s|[.,!?…。，、।۔،])]+"                  # a nested class, as BLOOM's tokenizer.json has it
VIKING = r" ?[^(\s|.,!?…。，、।۔،)]+"
# In the DeepSeek and Seed-Coder originals CR and LF are the characters themselves, not regex escapes
# (the same split; the text matters when export recognises a tokenizer.json).
CRLF = "\r\n"
DEEPSEEK_V3 = ("[!\"#$%&'()*+," r"\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^" + CRLF + r"\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
               r"| ?[\p{P}\p{S}]+[" + CRLF + r"]*|\s*[" + CRLF + r"]+|\s+(?!\S)|\s+")
# DeepSeek LLM's letters: cased scripts only (no CJK, no uncased letters). Three Greek range ends are
# escaped: written as characters, text editors and llama.cpp's source NFC-normalize them into
# lookalikes that make the ranges run backwards.
DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗ"
    "ὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯ"
    "ꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+")
CJK_HANGUL = r"[一-龥ࠀ-一가-퟿]+"
# HF's Punctuation pre-tokenizer: Unicode punctuation and the ASCII symbols it also counts.
PUNCTUATION_RUN = r"[\p{P}\$\+<=>\^~\|`]+"
DIGIT, DIGITS = r"\p{N}", r"\p{N}+"           # Digits(individual_digits=True / False)
SEED_CODER = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^" + CRLF + r"\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}" + CRLF
              + r"]+|\s*[" + CRLF + r"]+|\s+(?!\S)|\s+")
BAILING = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
           r"|\s+(?!\S)|\s+")
EXAONE_MOE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
JAIS2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+" + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
         + r"|\s{1,2}(?!\S)|\s{1}")
MINICPM5 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]            # splits of the text, in order
    nfc: bool = False                   # the original normalizes to NFC first
    ignore_merges: bool = False         # BPE takes a piece whole when it is a token (Llama 3 style)
    after_bytes: tuple[str, ...] = ()   # splits of the byte-mapped pieces


_GPT2 = PreTokenizerSpec((GPT2,))
_GPT_NEOX = PreTokenizerSpec((GPT2,), nfc=True)              # GPT-NeoX's tokenizer.json normalizes to NFC
_DIGITS_THEN_GPT2 = PreTokenizerSpec((DIGIT, GPT2))
_LLAMA3 = PreTokenizerSpec((LLAMA3,), ignore_merges=True)
_QWEN2 = PreTokenizerSpec((QWEN2,), nfc=True)
_DEEPSEEK_V3 = PreTokenizerSpec((r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK_V3))

SPECS: dict[str, PreTokenizerSpec] = {
    # "default" on a BPE vocabulary: plain GPT-2 splitting, what HF does.
    **dict.fromkeys(("default", "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
                     "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "jais", "exaone4", "a.x-4.0",
                     "mellum", "modern-bert", "trillion", "granite-docling"), _GPT2),
    **dict.fromkeys(("mpt", "olmo"), _GPT_NEOX),
    # SmolLM / StarCoder: Digits(individual_digits) then ByteLevel's GPT-2 split.
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    _DIGITS_THEN_GPT2),
    "command-r": PreTokenizerSpec((DIGIT, GPT2), nfc=True),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2),
    "qwen35": PreTokenizerSpec((QWEN35,), nfc=True),
    **dict.fromkeys(("stablelm2", "megrez", "hunyuan", "solar-open", "grok-2"), PreTokenizerSpec((QWEN2,))),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe", "glm4"), PreTokenizerSpec((LLAMA3,))),
    "jais-2": PreTokenizerSpec((JAIS2,)),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "minimax-m2"), PreTokenizerSpec((GPT4O,))),
    "deepseek-llm": PreTokenizerSpec(("[" + CRLF + "]", DEEPSEEK_LLM_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$",
                                      CJK_HANGUL, DIGIT)),
    "deepseek-coder": PreTokenizerSpec(("[" + CRLF + "]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, DIGIT)),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm"), _DEEPSEEK_V3),
    # Falcon: Punctuation, ByteLevel (GPT-2 split), then Digits and a 3-digit split on the mapped bytes.
    "falcon": PreTokenizerSpec((PUNCTUATION_RUN, GPT2), after_bytes=(DIGITS, r"[0-9][0-9][0-9]")),
    "seed-coder": PreTokenizerSpec((SEED_CODER,)),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), PreTokenizerSpec((BAILING,))),
    "exaone-moe": PreTokenizerSpec((EXAONE_MOE,)),
    "minicpm5": PreTokenizerSpec((r"\p{N}{1,3}", MINICPM5), ignore_merges=True),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), PreTokenizerSpec((BLOOM,))),
    "viking": PreTokenizerSpec((VIKING, DIGIT)),
}


def spec_for(pre: str) -> PreTokenizerSpec:
    spec = SPECS.get(pre)
    if spec is None:
        warnings.warn(
            f"unknown pre-tokenizer {pre!r} (tokenizer.ggml.pre); using the GPT-2 split. "
            f"Token ids may differ from the original tokenizer's.", TokenizerWarning, stacklevel=3)
        spec = _GPT2
    return spec


def _split(regex: str):
    return pre_tokenizers.Split(Regex(regex), behavior="isolated")


def byte_level_pipeline(spec: PreTokenizerSpec):
    """(normalizer or None, pre_tokenizer) for a byte-level BPE backend."""
    # use_regex=False: the splits did the cutting; ByteLevel only maps each byte to its printable stand-in.
    steps = [_split(r) for r in spec.regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    steps += [_split(r) for r in spec.after_bytes]
    return (normalizers.NFC() if spec.nfc else None), pre_tokenizers.Sequence(steps)


def spec_from_tokenizer_json(spec: dict) -> PreTokenizerSpec | None:
    """The PreTokenizerSpec of a byte-level tokenizer.json (its normalizer, pre_tokenizer, model), or
    None when a step has no regex equivalent here."""
    def flat(node, key):
        if not isinstance(node, dict):
            return []
        if node.get("type") == "Sequence":
            return [c for inner in node.get(key) or [] for c in flat(inner, key)]
        return [node]

    before, after, mapped = [], [], False
    for c in flat(spec.get("pre_tokenizer"), "pretokenizers"):
        kind, out = c.get("type"), (after if mapped else before)
        if kind == "ByteLevel":
            if c.get("use_regex", True):
                out.append(GPT2)
            mapped = True
        elif kind == "Split" and isinstance(c.get("pattern"), dict) and "Regex" in c["pattern"] \
                and str(c.get("behavior", "")).lower() == "isolated" and not c.get("invert"):
            out.append(c["pattern"]["Regex"])
        elif kind == "Digits":
            out.append(DIGIT if c.get("individual_digits") else DIGITS)
        elif kind == "Punctuation" and str(c.get("behavior", "")).lower() == "contiguous":
            out.append(PUNCTUATION_RUN)
        else:
            return None
    norms = flat(spec.get("normalizer"), "normalizers")
    if any(n.get("type") != "NFC" for n in norms):
        return None
    return PreTokenizerSpec(tuple(before), nfc=bool(norms),
                            ignore_merges=bool((spec.get("model") or {}).get("ignore_merges")),
                            after_bytes=tuple(after))

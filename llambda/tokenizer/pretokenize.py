"""Pre-tokenizer per `tokenizer.ggml.pre`: how text is cut before byte-level BPE.

Each entry lists split regexes applied in order (every match and every gap
between matches becomes its own piece, as llama.cpp and HF `Split(...,
"isolated")` do), whether the original tokenizer normalized to NFC, and
whether BPE should take a piece whole when it is already a token
(`ignore_merges`, Llama 3 style).  The regexes are the ones of the original
Hugging Face tokenizer.json files (facts, not code).  Only `gpt2`, `smollm`,
`qwen2` and `llama-bpe` are checked against reference token ids in the tests;
the rest come from llama.cpp's table and are checked only to compile and run.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from tokenizers import Regex, normalizers, pre_tokenizers

from .vocab import TokenizerWarning

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
DEEPSEEK_V3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
               r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizerSpec:
    regexes: tuple[str, ...]
    nfc: bool = False
    ignore_merges: bool = False


_GPT2 = PreTokenizerSpec((GPT2,))
_DIGITS_THEN_GPT2 = PreTokenizerSpec((r"\p{N}", GPT2))
_LLAMA3 = PreTokenizerSpec((LLAMA3,), ignore_merges=True)

SPECS: dict[str, PreTokenizerSpec] = {
    # "default" on a BPE vocabulary: plain GPT-2 splitting, what HF does.
    **dict.fromkeys(("default", "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                     "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe",
                     "mpt", "olmo", "jais"), _GPT2),
    # SmolLM / StarCoder: every digit on its own first, then GPT-2.
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), _DIGITS_THEN_GPT2),
    # Qwen2's tokenizer.json normalizes to NFC before splitting.
    "qwen2": PreTokenizerSpec((QWEN2,), nfc=True),
    **dict.fromkeys(("stablelm2", "megrez"), PreTokenizerSpec((QWEN2,))),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3"), _LLAMA3),
    **dict.fromkeys(("dbrx", "smaug-bpe", "chatglm-bpe"), PreTokenizerSpec((LLAMA3,))),
    "tekken": PreTokenizerSpec((TEKKEN,), ignore_merges=True),
    "deepseek-coder": PreTokenizerSpec((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+",
                                        r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")),
    "deepseek-v3": PreTokenizerSpec((r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK_V3)),
    "falcon": PreTokenizerSpec((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), PreTokenizerSpec((BLOOM,))),
    "viking": PreTokenizerSpec((BLOOM, r"\p{N}")),
}


def spec_for(pre: str) -> PreTokenizerSpec:
    spec = SPECS.get(pre)
    if spec is None:
        warnings.warn(
            f"unknown pre-tokenizer {pre!r} (tokenizer.ggml.pre); using the GPT-2 split. "
            f"Token ids may differ from the original tokenizer's.", TokenizerWarning, stacklevel=3)
        spec = _GPT2
    return spec


def byte_level_pipeline(spec: PreTokenizerSpec):
    """(normalizer or None, pre_tokenizer) for a byte-level BPE backend."""
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
    # use_regex=False: the splits above did the cutting; ByteLevel only maps
    # each byte to its printable stand-in character.
    pre = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                      use_regex=False)])
    return (normalizers.NFC() if spec.nfc else None), pre

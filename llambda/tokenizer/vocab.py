"""The tokenizer's vocabulary as read from GGUF metadata, validated.

`Vocab` holds what every later stage needs: token strings, token types,
scores, special ids and flags.  Everything malformed ends here in a
TokenizerError naming the metadata key, so the builders can trust it.
"""
from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import TokenizerError
from .wordpiece import from_phantom_space

KEY = "tokenizer.ggml."


class TokenizerWarning(UserWarning):
    """Something odd but survivable about a tokenizer or its input."""


class TokenType(enum.IntEnum):
    """GGUF `tokenizer.ggml.token_type` values (SentencePiece's piece types)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token texts that end a turn although the metadata names only one EOS.
# llama.cpp keeps the same list; the ids they stand for stop generation.
END_OF_TURN_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                     "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|return|>", "<|call|>")
# Harmony (gpt-oss) ends its answer with <|return|> or a tool call with <|call|>; its <|end|> only closes
# one message (the analysis before the final answer), so there it must not stop generation.
HARMONY_ENDS = ("<|return|>", "<|call|>")

# An out-of-range id among these makes the model unusable: raise.  Others
# (unknown, padding) are bookkeeping: warn and drop them, as llama.cpp does.
_REQUIRED_RANGE_IDS = ("bos", "eos", "eot", "eom")


@dataclass
class Vocab:
    model: str                       # "gpt2" (byte-level BPE), "llama" (SentencePiece), "bert", "t5" (Unigram)
    pre: str                         # tokenizer.ggml.pre, "default" when absent
    tokens: list[str]
    types: np.ndarray                # int32 TokenType per id
    scores: np.ndarray | None        # float32 per id (SentencePiece)
    merges: list[str] | None         # "left right" strings (BPE)
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    eom_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def ids_of_type(self, *kinds: TokenType) -> np.ndarray:
        return np.flatnonzero(np.isin(self.types, [int(k) for k in kinds]))

    def end_of_generation_ids(self) -> frozenset[int]:
        ids = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        wanted = set(END_OF_TURN_TEXTS)
        # The texts are all control-looking; search only non-normal tokens
        # (a few thousand at most) instead of the whole vocabulary.
        for i in self.ids_of_type(TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN,
                                  TokenType.UNDEFINED):
            if self.tokens[i] in wanted:
                ids.add(int(i))
        by_text = {self.tokens[i]: i for i in ids}
        if all(t in by_text for t in HARMONY_ENDS) and "<|end|>" in by_text:
            ids.discard(by_text["<|end|>"])
        return frozenset(ids)


def _string_list(value, key: str) -> list[str]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TokenizerError(f"metadata {key!r} must be an array of strings, got {type(value).__name__}")
    out = list(value)
    if set(map(type, out)) - {str}:            # C-speed check; slow path only to explain
        for i, t in enumerate(out):
            if isinstance(t, bytes):
                try:
                    out[i] = t.decode("utf-8")
                except UnicodeDecodeError:
                    raise TokenizerError(f"metadata {key!r}[{i}] is not valid UTF-8") from None
            elif not isinstance(t, str):
                raise TokenizerError(
                    f"metadata {key!r}[{i}] must be a string, got {type(t).__name__}")
    return out


def _number_array(md: dict, key: str, n: int, dtype) -> np.ndarray | None:
    if key not in md or md[key] is None:
        return None
    try:
        arr = np.asarray(md[key], dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise TokenizerError(f"metadata {key!r} must be a numeric array: {e}") from None
    if arr.ndim != 1:
        raise TokenizerError(f"metadata {key!r} must be a 1-D array, got shape {arr.shape}")
    if len(arr) != n:
        raise TokenizerError(
            f"metadata {key!r} has {len(arr)} entries but tokenizer.ggml.tokens has {n}")
    return arr


def _token_id(md: dict, name: str, n: int) -> int | None:
    key = f"{KEY}{name}_token_id"
    v = md.get(key)
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TokenizerError(f"metadata {key!r} must be an integer token id, got {v!r}")
    v = int(v)
    if 0 <= v < n:
        return v
    msg = f"metadata {key!r} = {v} is out of range for a vocabulary of {n} tokens"
    if name in _REQUIRED_RANGE_IDS:
        raise TokenizerError(msg)
    warnings.warn(msg + "; ignoring it", TokenizerWarning, stacklevel=4)
    return None


def _flag(md: dict, name: str, default: bool) -> bool:
    key = KEY + name
    v = md.get(key)
    if v is None:
        return default
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise TokenizerError(f"metadata {key!r} must be a bool, got {v!r}")


def _charsmap_bytes(value) -> bytes | None:
    """The raw precompiled charsmap of GGUF metadata (an array of bytes), None when absent."""
    if value is None:
        return None
    try:
        arr = np.asarray(value)
        if arr.ndim != 1 or arr.dtype.kind not in "iu" or (arr.size and (arr.min() < -128 or arr.max() > 255)):
            raise ValueError
        return arr.astype(np.int64).astype(np.uint8).tobytes()
    except (TypeError, ValueError, OverflowError):
        raise TokenizerError("metadata 'tokenizer.ggml.precompiled_charsmap' must be an array of bytes") from None


def vocab_from_gguf_metadata(md: dict) -> Vocab:
    if not isinstance(md, dict):
        raise TokenizerError(f"tokenizer metadata must be a dict, got {type(md).__name__}")
    if KEY + "tokens" not in md:
        raise TokenizerError("metadata has no 'tokenizer.ggml.tokens' array: the model carries no vocabulary")
    tokens = _string_list(md[KEY + "tokens"], KEY + "tokens")
    n = len(tokens)
    if n == 0:
        raise TokenizerError("metadata 'tokenizer.ggml.tokens' is empty")

    model = md.get(KEY + "model")
    merges = md.get(KEY + "merges")
    if model is None:
        # Old or hand-written files: merges mean BPE, scores mean SentencePiece.
        model = "gpt2" if merges is not None or KEY + "scores" not in md else "llama"
        warnings.warn(f"metadata has no 'tokenizer.ggml.model'; assuming {model!r}",
                      TokenizerWarning, stacklevel=3)
    if not isinstance(model, str):
        raise TokenizerError(f"metadata 'tokenizer.ggml.model' must be a string, got {model!r}")
    if model not in ("gpt2", "llama", "bert", "t5"):
        raise TokenizerError(
            f"tokenizer model {model!r} is not supported (supported: 'gpt2' byte-level BPE, "
            f"'llama' SentencePiece, 'bert' WordPiece, 't5' SentencePiece Unigram)")
    if model == "bert":
        tokens = from_phantom_space(tokens)
    pre = md.get(KEY + "pre", "default")
    if not isinstance(pre, str):
        raise TokenizerError(f"metadata 'tokenizer.ggml.pre' must be a string, got {pre!r}")

    types = _number_array(md, KEY + "token_type", n, np.int64)
    typeless = types is None
    if typeless:
        types = np.full(n, TokenType.NORMAL, dtype=np.int32)
    else:
        types = types.astype(np.int32)
        types[(types < 0) | (types > TokenType.BYTE)] = TokenType.UNDEFINED
    scores = _number_array(md, KEY + "scores", n, np.float32)
    if merges is not None:
        merges = _string_list(merges, KEY + "merges")

    v = Vocab(model=model, pre=pre, tokens=tokens, types=types, scores=scores, merges=merges)
    v.bos_id = _token_id(md, "bos", n)
    v.eos_id = _token_id(md, "eos", n)
    v.eot_id = _token_id(md, "eot", n)
    v.eom_id = _token_id(md, "eom", n)
    v.unk_id = _token_id(md, "unknown", n)
    v.pad_id = _token_id(md, "padding", n)
    if model == "bert":       # llama.cpp's key spells "seperator"; [CLS] defaults to BOS, [SEP] to EOS
        v.extra["cls"] = _token_id(md, "cls", n) if KEY + "cls_token_id" in md else v.bos_id
        v.extra["sep"] = _token_id(md, "seperator", n) if KEY + "seperator_token_id" in md else v.eos_id
    if model == "t5":         # llama.cpp's UGM: a pair is BOS a EOS SEP b EOS
        v.extra["sep"] = _token_id(md, "seperator", n)
        v.extra["remove_extra_whitespaces"] = _flag(md, "remove_extra_whitespaces", False)
        v.extra["charsmap"] = _charsmap_bytes(md.get(KEY + "precompiled_charsmap"))
    if typeless:
        # Without token types the named special ids are the only control
        # tokens we know of; mark them so that they are matched and skipped.
        for i in (v.bos_id, v.eos_id, v.eot_id, v.eom_id, v.unk_id, v.pad_id):
            if i is not None:
                types[i] = TokenType.CONTROL
    spm = model == "llama"
    # Defaults follow llama.cpp: SentencePiece adds BOS and a space prefix
    # unless told otherwise; byte-level BPE adds BOS only for llama3-style pre.
    ugm = model == "t5"       # llama.cpp's UGM defaults: EOS added, no BOS, a space prefix
    v.add_bos = _flag(md, "add_bos_token", spm or pre in ("llama3", "llama-v3", "llama-bpe", "falcon3",
                                                        "tekken", "chameleon"))
    if pre in ("glm4", "chatglm-bpe"):
        v.add_bos = False       # llama.cpp drops GLM's BOS whatever the flag: its templates write [gMASK]<sop>
    v.add_eos = _flag(md, "add_eos_token", ugm)
    v.add_space_prefix = _flag(md, "add_space_prefix", True) if spm or ugm else False
    if ugm and v.extra["remove_extra_whitespaces"]:
        v.add_space_prefix = True         # llama.cpp writes U+2581 before every word then, the first too
    if v.add_bos and v.bos_id is None:
        if KEY + "add_bos_token" in md:         # only an explicit flag is worth a warning
            warnings.warn("add_bos_token is set but the model has no BOS token id; no BOS will be added",
                          TokenizerWarning, stacklevel=3)
        v.add_bos = False
    if v.add_eos and v.eos_id is None:
        warnings.warn("add_eos_token is set but the model has no EOS token id; no EOS will be added",
                      TokenizerWarning, stacklevel=3)
        v.add_eos = False
    return v

"""Build a HF `tokenizers.Tokenizer` that encodes exactly like the GGUF's tokenizer.

- gpt2 (byte-level BPE): the file's vocab and merges, the pre-tokenizer of
  `tokenizer.ggml.pre`, no unknown token (a byte with no token is dropped,
  as the original tokenizers do; `core` warns about it).
- llama (SentencePiece BPE): spaces become U+2581, optionally one is
  prepended, the whole text is one word, merges are derived from the scores,
  and characters with no token fall back to <0xNN> byte tokens.
- bert (WordPiece, wordpiece.py) and t5 (SentencePiece Unigram, unigram.py).

Added tokens (matched whole in the text before BPE): CONTROL and UNKNOWN
tokens as special ones (skipped when parse_special=False), USER_DEFINED as
non-special ones (always matched), as llama.cpp and HF do.
"""
from __future__ import annotations

import warnings

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from ..errors import TokenizerError
from .merges import merges_from_ranks, parse_merges
from .pretokenize import byte_level_pipeline, spec_for
from .vocab import TokenizerWarning, TokenType, Vocab
from .unigram import build_unigram
from .wordpiece import build_wordpiece

SPACE_MARK = "\u2581"   # SentencePiece's visible space


def token_to_id_map(vocab: Vocab) -> dict[str, int]:
    # Later duplicates win, as in llama.cpp's token_to_id.
    return dict(zip(vocab.tokens, range(vocab.size)))


def _new_bpe(ids: dict[str, int], merges, **options) -> models.BPE:
    try:
        return models.BPE(ids, merges, **options)
    except Exception as e:                       # the library's own validation
        raise TokenizerError(f"cannot build the BPE model: {e}") from None


def _add_special_and_user_tokens(tk: Tokenizer, vocab: Vocab) -> None:
    special = vocab.ids_of_type(TokenType.CONTROL, TokenType.UNKNOWN)
    user = vocab.ids_of_type(TokenType.USER_DEFINED)
    toks = vocab.tokens
    # normalized=False: match the raw text.  (llama.cpp stores user-defined
    # space runs with real spaces, which normalization would hide.)
    tk.add_special_tokens([AddedToken(toks[i], special=True, normalized=False)
                           for i in special if toks[i]])
    tk.add_tokens([AddedToken(toks[i], special=False, normalized=False)
                   for i in user if toks[i]])


def build_byte_level_bpe(vocab: Vocab) -> Tokenizer:
    spec = spec_for(vocab.pre)
    ids = token_to_id_map(vocab)
    if vocab.merges is not None and len(vocab.merges) > 0:
        merges = parse_merges(vocab.merges, ids)
    else:
        # Tiny test vocabularies come without merges: derive them, earlier
        # ids first (BPE vocabularies list tokens in merge order).
        merges = merges_from_ranks(vocab.tokens, vocab.ids_of_type(TokenType.NORMAL),
                                   np.arange(vocab.size))
    tk = Tokenizer(_new_bpe(ids, merges, ignore_merges=spec.ignore_merges))
    normalizer, pre = byte_level_pipeline(spec)
    if normalizer is not None:
        tk.normalizer = normalizer
    tk.pre_tokenizer = pre
    tk.decoder = decoders.ByteLevel()
    _add_special_and_user_tokens(tk, vocab)
    return tk


def build_sentencepiece_bpe(vocab: Vocab) -> Tokenizer:
    ids = token_to_id_map(vocab)
    # Only NORMAL pieces merge: control, user-defined, byte and unused
    # pieces are never the result of a SentencePiece merge.
    normal = vocab.ids_of_type(TokenType.NORMAL, TokenType.UNDEFINED)
    scores = vocab.scores if vocab.scores is not None else -np.arange(vocab.size, dtype=np.float32)
    merges = merges_from_ranks(vocab.tokens, normal, -scores.astype(np.float64))
    has_bytes = len(vocab.ids_of_type(TokenType.BYTE)) == 256
    unk = vocab.tokens[vocab.unk_id] if vocab.unk_id is not None else None
    if not has_bytes and unk is None:
        warnings.warn("SentencePiece vocabulary without the 256 <0xNN> byte tokens and without an "
                      "unknown token: characters that have no piece will be dropped", TokenizerWarning,
                      stacklevel=4)
    tk = Tokenizer(_new_bpe(ids, merges, unk_token=unk, fuse_unk=True, byte_fallback=has_bytes))
    steps = [normalizers.Replace(" ", SPACE_MARK)]
    if vocab.add_space_prefix:
        # Each stretch of text between added tokens gets one leading space,
        # which is where llama.cpp prepends one too.
        steps.insert(0, normalizers.Prepend(SPACE_MARK))
    tk.normalizer = normalizers.Sequence(steps)
    tk.decoder = decoders.Sequence([decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(),
                                    decoders.Fuse()])
    _add_special_and_user_tokens(tk, vocab)
    return tk


def build_backend(vocab: Vocab) -> Tokenizer:
    if vocab.model == "gpt2":
        return build_byte_level_bpe(vocab)
    if vocab.model in ("bert", "t5"):
        tk = build_wordpiece(vocab) if vocab.model == "bert" else build_unigram(vocab)
        _add_special_and_user_tokens(tk, vocab)
        return tk
    return build_sentencepiece_bpe(vocab)

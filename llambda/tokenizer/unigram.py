"""SentencePiece-Unigram vocabularies from GGUF (`tokenizer.ggml.model` "t5": T5, and the XLM-RoBERTa
encoders llama.cpp's converter writes), run as llama.cpp's UGM tokenizer runs them.

llama.cpp normalizes a stretch of text with the file's precompiled charsmap (SentencePiece's NFKC table,
`tokenizer.ggml.precompiled_charsmap`), then with `remove_extra_whitespaces` drops leading and trailing
spaces and writes each run of spaces as one U+2581 (a U+2581 also goes before the first word), else writes
every space as U+2581 and, with `add_space_prefix`, one before the text; then it takes the Viterbi best
split of the whole stretch by the pieces' scores (no split at spaces), an unknown character costing 10 less
than the lowest score. That is the `tokenizers` library's Unigram model behind these normalizers, without a
pre-tokenizer. An encoder's input gets BOS ... EOS as the flags say, and a pair BOS a EOS SEP b EOS (llama.cpp's
rerank prompt), every token type 0.
"""
from __future__ import annotations

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, processors

from ..errors import TokenizerError
from .charsmap import check_charsmap

SPACE_MARK = "\u2581"


def build_unigram(vocab) -> Tokenizer:
    """The library's tokenizer of a `t5` Vocab (vocab.py: its scores, flags and charsmap in `extra`)."""
    scores = vocab.scores if vocab.scores is not None else np.zeros(vocab.size, np.float32)
    if not np.isfinite(scores).all():
        raise TokenizerError("metadata 'tokenizer.ggml.scores' holds a value that is not finite")
    if vocab.unk_id is None:
        raise TokenizerError("a Unigram vocabulary needs its unknown token (tokenizer.ggml.unknown_token_id)")
    try:
        model = models.Unigram([(t, float(s)) for t, s in zip(vocab.tokens, scores)], vocab.unk_id, False)
    except Exception as e:                       # the library's own validation
        raise TokenizerError(f"cannot build the Unigram model: {e}") from None
    tk = Tokenizer(model)
    steps = []
    charsmap = vocab.extra.get("charsmap")
    if charsmap:
        check_charsmap("metadata 'tokenizer.ggml.precompiled_charsmap'", charsmap)
        try:
            steps.append(normalizers.Precompiled(charsmap))
        except Exception as e:                   # the library's own parse of the table
            raise TokenizerError(f"metadata 'tokenizer.ggml.precompiled_charsmap' is not a charsmap: {e}") from None
    merge = vocab.extra.get("remove_extra_whitespaces", False)
    if merge:
        steps += [normalizers.Replace(Regex("^ +| +$"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    steps.append(normalizers.Replace(" ", SPACE_MARK))
    if vocab.add_space_prefix:
        steps.append(normalizers.Prepend(SPACE_MARK))
    tk.normalizer = normalizers.Sequence(steps)
    tk.decoder = decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="always" if vocab.add_space_prefix
                                    else "never")
    _post_processor(tk, vocab)
    return tk


def _post_processor(tk: Tokenizer, vocab) -> None:
    bos = vocab.bos_id if vocab.add_bos else None
    eos = vocab.eos_id if vocab.add_eos else None
    sep = vocab.extra.get("sep")
    ids = {i for i in (bos, eos, sep) if i is not None}
    if not ids:
        return
    name = {i: vocab.tokens[i] for i in ids}
    first = ([name[bos]] if bos is not None else []) + ["$A"] + ([name[eos]] if eos is not None else [])
    second = ([name[sep]] if sep is not None else []) + ["$B"] + ([name[eos]] if eos is not None else [])
    try:
        tk.post_processor = processors.TemplateProcessing(
            single=first, pair=first + second, special_tokens=[(name[i], i) for i in ids])
    except Exception as e:
        raise TokenizerError(f"cannot build the Unigram vocabulary's special tokens: {e}") from None

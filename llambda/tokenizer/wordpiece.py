"""WordPiece (BERT) vocabularies from GGUF.

llama.cpp's converter writes a BERT vocabulary in "phantom space" form: a word-initial piece gets
a leading U+2581 (`hello` -> `▁hello`), a continuation loses its `##` (`##ing` -> `ing`), and
bracketed specials stay (`[CLS]`). We turn it back into WordPiece's own form and run it as the HF
tokenizer.json of an uncased BERT does: BertNormalizer (lowercase, accents stripped, Chinese
characters isolated), the BERT pre-tokenizer, WordPiece, `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]`.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..errors import TokenizerError

PHANTOM_SPACE = "\u2581"


def from_phantom_space(tokens: list[str]) -> list[str]:
    out = []
    for t in tokens:
        if t.startswith("[") and t.endswith("]"):
            out.append(t)
        elif t.startswith(PHANTOM_SPACE):
            out.append(t[len(PHANTOM_SPACE):])
        else:
            out.append("##" + t)
    return out


def build_wordpiece(vocab) -> Tokenizer:
    ids = dict(zip(vocab.tokens, range(vocab.size)))
    cls, sep, unk = vocab.extra.get("cls"), vocab.extra.get("sep"), vocab.unk_id
    if cls is None or sep is None or unk is None:
        raise TokenizerError("a BERT vocabulary needs its [CLS], [SEP] and unknown token ids "
                             "(tokenizer.ggml.cls_token_id, seperator_token_id, unknown_token_id)")
    tk = Tokenizer(models.WordPiece(ids, unk_token=vocab.tokens[unk], max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    c, s = vocab.tokens[cls], vocab.tokens[sep]
    tk.post_processor = processors.TemplateProcessing(single=f"{c} $A {s}", pair=f"{c} $A {s} $B:1 {s}:1",
                                                      special_tokens=[(c, cls), (s, sep)])
    tk.decoder = decoders.WordPiece()
    return tk

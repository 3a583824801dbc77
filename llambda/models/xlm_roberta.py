"""XLM-RoBERTa and RoBERTa encoders (bge-m3, multilingual-e5, bge-reranker-v2-m3): BERT's block
(models/bert.py) with RoBERTa's embeddings and head.

What differs from BERT: a token's position is counted from the padding id (transformers'
create_position_ids_from_input_ids: position = pad + the count of non-pad tokens up to it, so a text's
first token sits at pad + 1 and the table's first pad + 1 rows are never read by text); one token type
(the tokenizer's type ids are not model inputs: every token adds row 0); the cross-encoder's
RobertaClassificationHead (`classifier.dense` + tanh on the <s> token, then `classifier.out_proj`: the
math of BERT's pooler and classifier under other names). llama.cpp's GGUF of these is arch `bert` with
the position table already shifted (models/bert.py reads it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from . import bert

_CLASSIFIERS = ("XLMRobertaForSequenceClassification", "RobertaForSequenceClassification")


@dataclass
class XLMRobertaConfig(bert.BertConfig):
    pad_id: int = 1                # positions count from it: the first token's is pad_id + 1


def config_from_hf(cfg: dict, pooling: dict | None = None, st_config: dict | None = None) -> XLMRobertaConfig:
    base = bert.config_from_hf(cfg, pooling, st_config)
    pad = cfg.get("pad_token_id", 1)
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < base.vocab_size:
        raise ModelFormatError(f"config.json: pad_token_id must be a token id below {base.vocab_size}, got {pad!r}")
    usable = base.max_positions - pad - 1      # positions pad + 1 .. max_positions - 1
    if usable < 3:
        raise ModelFormatError(f"config.json: max_position_embeddings {base.max_positions} leaves {usable} "
                               f"positions after pad_token_id {pad} (positions start at pad + 1)")
    c = XLMRobertaConfig(**asdict(base), pad_id=pad)
    c.max_tokens = min(c.max_tokens, usable)
    classes = cfg.get("architectures")
    if isinstance(classes, list) and any(k in classes for k in _CLASSIFIERS):
        labels = cfg.get("id2label")
        c.n_labels = len(labels) if isinstance(labels, dict) and labels else 1
    c.arch = "roberta" if cfg.get("model_type") == "roberta" else "xlm-roberta"
    return c


class XLMRobertaEncoder(bert.BertEncoder):
    """BertEncoder with RoBERTa's positions, its single token type and its classification head's names."""

    PREFIXES = ("", "roberta.")
    HEAD = ("classifier.dense", "classifier.out_proj")

    def _embed(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        pad = self.cfg.pad_id
        real = (ids != pad).astype(np.int64)
        count = np.cumsum(real)
        before = np.concatenate([[0], count])[starts[:-1]]        # real tokens before each sequence
        pos = (count - np.repeat(before, np.diff(starts))) * real + pad
        if pos.max() >= self.pos.shape[0]:
            raise InvalidInputError(f"{pos.max() - pad} tokens is beyond the {self.pos.shape[0] - pad - 1} positions "
                             f"of this model")
        x = self.word[ids]
        x += self.pos[pos]
        x += self.types[0]
        return x


ENCODER = XLMRobertaEncoder

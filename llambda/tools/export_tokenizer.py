"""Tokenizers across formats, for `llambda export`.

GGUF -> HF: the tokenizer package builds a HF `tokenizers` backend that encodes
like the GGUF's tokenizer; its JSON is the tokenizer.json we write.
HF -> GGUF: the `tokenizer.ggml.*` keys llama.cpp reads, from tokenizer.json:
byte-level BPE becomes model "gpt2" with its merges and the llama.cpp name of
its pre-tokenizer (found by comparing the split regexes with the ones our
tokenizer knows); SentencePiece-style vocabularies become model "llama" with
scores that rank pieces in merge order.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError

# llama.cpp's names first where several names share one pre-tokenizer.
_PREFERRED_PRE = ("gpt-2", "smollm", "qwen2", "qwen35", "llama-bpe", "tekken", "gpt-4o", "stablelm2", "dbrx",
                  "deepseek-llm", "deepseek-coder", "deepseek-v3", "command-r", "mpt", "falcon", "bloom", "viking")


def hf_backend(tok):
    """The HF `tokenizers.Tokenizer` behind our Tokenizer, or None."""
    for attr in ("backend", "_backend"):
        b = getattr(tok, attr, None)
        if b is not None and hasattr(b, "to_str"):
            return b
    return None


def hf_tokenizer_json(tok) -> str | None:
    """tokenizer.json text for our Tokenizer, or None when it has no HF backend."""
    backend = hf_backend(tok)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if getattr(tok, "model", None) == "llama" and getattr(_vocab(tok), "add_space_prefix", False):
        # decode drops the space encode prepends, as HF's own SentencePiece tokenizer.json files say
        dec = spec.get("decoder") or {"type": "Sequence", "decoders": []}
        if dec.get("type") != "Sequence":
            dec = {"type": "Sequence", "decoders": [dec]}
        dec["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        spec["decoder"] = dec
    return json.dumps(spec, ensure_ascii=False)


def _vocab(tok):
    v = getattr(tok, "vocab", None) or getattr(tok, "_vocab", None)
    if v is None or not hasattr(v, "tokens"):
        raise ModelFormatError("this tokenizer does not expose its vocabulary")
    return v


def pre_tokenizer_name(spec: dict) -> str | None:
    """The `tokenizer.ggml.pre` whose splitting equals this tokenizer.json's, or None."""
    from ..tokenizer.pretokenize import SPECS, spec_from_tokenizer_json
    want = spec_from_tokenizer_json(spec)
    names = list(_PREFERRED_PRE) + [n for n in SPECS if n not in _PREFERRED_PRE]
    return next((n for n in names if SPECS.get(n) == want), None) if want is not None else None


def _merge_strings(merges) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def gguf_tokenizer_metadata(folder: Path, tok, chat_template: str | None) -> dict:
    """`tokenizer.ggml.*` metadata for the HF directory `folder` (whose tokenizer `tok` we loaded)."""
    spec = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    vocab = _vocab(tok)
    n = len(vocab.tokens)
    meta = {"tokenizer.ggml.tokens": list(vocab.tokens),
            "tokenizer.ggml.token_type": np.asarray(vocab.types, dtype=np.int32)}
    if tok.model == "gpt2":
        if model.get("type") != "BPE":
            raise ModelFormatError(f"a byte-level {model.get('type')} tokenizer cannot be written to GGUF")
        meta["tokenizer.ggml.model"] = "gpt2"
        pre = pre_tokenizer_name(spec)
        if pre is None:
            warnings.warn("the tokenizer's pre-tokenizer matches none llama.cpp names; writing 'default' "
                          "(GPT-2 splitting), so some texts will tokenize differently", UserWarning, stacklevel=3)
        meta["tokenizer.ggml.pre"] = pre or "default"
        meta["tokenizer.ggml.merges"] = _merge_strings(model.get("merges") or [])
    else:
        meta["tokenizer.ggml.model"] = "llama"
        meta["tokenizer.ggml.scores"] = _spm_scores(model, vocab.tokens, n)
        meta["tokenizer.ggml.add_space_prefix"] = bool(vocab.add_space_prefix)
    for key, value in (("bos", vocab.bos_id), ("eos", vocab.eos_id), ("unknown", vocab.unk_id),
                       ("padding", vocab.pad_id)):
        if value is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = int(value)
    meta["tokenizer.ggml.add_bos_token"] = bool(vocab.add_bos)
    meta["tokenizer.ggml.add_eos_token"] = bool(vocab.add_eos)
    if chat_template:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def _spm_scores(model: dict, tokens: list[str], n: int) -> np.ndarray:
    """SentencePiece scores: a Unigram's own; for BPE, minus the rank of the merge making each piece
    (pieces no merge makes rank after all merges, in id order), which is how SentencePiece BPE orders them."""
    scores = -np.arange(n, dtype=np.float32) - np.float32(1e6)
    if model.get("type") == "Unigram":
        for i, item in enumerate(model.get("vocab") or []):
            if i < n and isinstance(item, list) and len(item) == 2:
                scores[i] = float(item[1])
        return scores
    ids = {t: i for i, t in enumerate(tokens)}
    made = np.zeros(n, dtype=bool)
    for rank, m in enumerate(_merge_strings(model.get("merges") or [])):
        left, _, right = m.partition(" ")
        i = ids.get(left + right)
        if i is not None and not made[i]:
            scores[i], made[i] = -float(rank), True
    return scores

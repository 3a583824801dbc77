"""Tiny random XLM-RoBERTa encoders with transformers reference outputs: an XLMRobertaModel (an embedder)
and an XLMRobertaForSequenceClassification (a reranker), each a HF directory with a SentencePiece-Unigram
tokenizer.json built with the `tokenizers` library, and reference.json.

    python tools/make_tiny_xlmr.py [--out tests/fixtures/encoders]

Needs torch and transformers (never a runtime dependency of llambda). Everything is seeded. reference.json holds,
per input (texts of different lengths, run as one padded batch with its attention mask): the token ids and type
ids the tokenizers library gives, the last hidden states, the mean-pooled L2-normalized embedding, and for the
reranker the classification logits of (query, document) pairs.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
PIECES = ["\u2581the", "\u2581cat", "\u2581dog", "\u2581sat", "\u2581on", "\u2581mat", "\u2581a", "\u2581big",
          "\u2581small", "\u2581run", "s", "ing", "ed", ".", ",", "!", "\u2581", "t", "h", "e", "c", "a", "d", "o",
          "g", "m", "n", "r", "u", "i", "b", "l", "\u2581is", "\u2581what", "?", "\u2581where", "\u2581house",
          "\u2581green", "\u2581blue", "\u2581é", "\u2581caf", "\u00e9", "w", "y", "k", "p", "\u2581sm", "all",
          "\u2581ru", "\u2581ho", "use", "x", "z", "q", "v", "f", "j"]
TEXTS = ["the cat sat on the mat.", "a dog!", "where is the big green house? the small blue cat runs",
         "café", "  the   dog  sat  "]
QUERY = "where is the cat?"
DOCS = ["the cat sat on the mat.", "a big dog runs", "blue house"]
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
             layer_norm_eps=1e-5, hidden_act="gelu")


def make_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    rng = np.random.default_rng(11)
    vocab = [(t, 0.0) for t in SPECIALS] + [(p, float(-2 - rng.random() * 8)) for p in PIECES]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    tok.add_special_tokens(SPECIALS)
    return tok


def run(model, tok, batch):
    import torch
    encs = [tok.encode(*b) if isinstance(b, tuple) else tok.encode(b) for b in batch]
    n = max(len(e.ids) for e in encs)
    ids = torch.full((len(encs), n), SHAPE["pad_token_id"], dtype=torch.long)
    mask = torch.zeros((len(encs), n), dtype=torch.long)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        mask[i, :len(e.ids)] = 1
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return encs, mask, out


def main() -> None:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaModel
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "encoders")
    out = ap.parse_args().out
    tok = make_tokenizer()
    vocab_size = tok.get_vocab_size()
    for name, cls, seed in (("xlmr", XLMRobertaModel, 1), ("xlmr_rerank", XLMRobertaForSequenceClassification, 2)):
        torch.manual_seed(seed)
        extra = {"num_labels": 1} if cls is XLMRobertaForSequenceClassification else {}
        cfg = XLMRobertaConfig(vocab_size=vocab_size, **SHAPE, **extra)
        model = cls(cfg).eval()
        with torch.no_grad():       # random LayerNorm and bias values too, not HF's ones and zeros, and
            for pname, p in model.named_parameters():       # weights 10x HF's init (std 0.2: attention not flat)
                if "LayerNorm" in pname or pname.endswith("bias"):
                    p.add_(0.1 * torch.randn_like(p))
                else:
                    p.mul_(10.0)
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
             "cls_token": "<s>", "sep_token": "</s>", "model_max_length": 38}, indent=1) + "\n")
        ref = {"notes": "transformers " + __import__("transformers").__version__ + ", one padded batch with its "
               "attention mask; positions are cumsum(ids != pad) + pad (create_position_ids_from_input_ids)"}
        if cls is XLMRobertaModel:
            encs, mask, o = run(model, tok, TEXTS)
            h = o.last_hidden_state
            m = mask.unsqueeze(-1).float()
            emb = (h * m).sum(1) / m.sum(1)
            emb = emb / emb.norm(dim=-1, keepdim=True)
            ref["inputs"] = [{"text": t, "ids": e.ids, "type_ids": e.type_ids,
                              "hidden": h[i, :len(e.ids)].tolist(), "embedding": emb[i].tolist()}
                             for i, (t, e) in enumerate(zip(TEXTS, encs))]
        else:
            pairs = [(QUERY, doc) for doc in DOCS]
            encs, _, o = run(model, tok, pairs)
            ref["query"], ref["pairs"] = QUERY, [{"document": doc, "ids": e.ids, "type_ids": e.type_ids,
                                                   "logits": o.logits[i].tolist()}
                                                  for i, (doc, e) in enumerate(zip(DOCS, encs))]
        (d / "reference.json").write_text(json.dumps(ref) + "\n")
        print(f"wrote {d}")


if __name__ == "__main__":
    main()

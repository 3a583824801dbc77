"""A tiny random ModernBERT embedder (transformers' ModernBertModel) with transformers reference outputs.

    python tools/make_tiny_modernbert.py [--out tests/fixtures/encoders]

Needs torch and transformers 5 (never a runtime dependency of llambda). The folder is laid out as
sentence-transformers saves a ModernBERT embedder: config.json, model.safetensors, modules.json, 1_Pooling/ (mean).
Four layers, global attention every third (layers 0 and 3), a local window of 8 (a token sees those at most 4 away
in a local layer), distinct global and local RoPE bases, random LayerNorm weights (no biases, as ModernBERT has
none), and inputs longer than the window. Everything is seeded. reference.json holds per input (token ids, each run
alone, no padding) the last hidden states and the mean-pooled L2-normalized embedding (pooled here in torch).
modernbert_rerank/: a ModernBertForSequenceClassification (one label, mean classifier pooling, a head bias) and
its logits for (query, document) pairs given as token ids.
"""
from __future__ import annotations

import json

import numpy as np
from make_tiny_embeddinggemma import random_model, st_modules, start, write_reference

SHAPE = dict(vocab_size=120, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
             max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3, norm_eps=1e-5,
             hidden_activation="gelu", pad_token_id=0, cls_token_id=1, sep_token_id=2, bos_token_id=1,
             eos_token_id=2, global_rope_theta=1000.0, local_rope_theta=10000.0)
LENGTHS = [3, 6, 13, 30]


def main() -> None:
    import torch
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel

    out = start("modernbert")
    model = random_model(ModernBertConfig, ModernBertModel, SHAPE, lambda name, p: (
        1 + torch.randn_like(p) * 0.2 if "norm" in name else torch.randn_like(p) * 0.2))
    model.save_pretrained(out)
    st_modules(out, SHAPE["hidden_size"], [])
    write_reference(out, model, LENGTHS, SHAPE["vocab_size"], SHAPE["cls_token_id"], SHAPE["sep_token_id"])
    rerank = out.parent / "modernbert_rerank"
    rerank.mkdir(exist_ok=True)
    model = random_model(ModernBertConfig, ModernBertForSequenceClassification,
                         {**SHAPE, "num_labels": 1, "classifier_pooling": "mean", "classifier_bias": True},
                         lambda name, p: 1 + torch.randn_like(p) * 0.2 if "norm" in name else torch.randn_like(p) * 0.2)
    model.save_pretrained(rerank)
    rng = np.random.default_rng(7)
    pairs = []
    for q, d in ((4, 5), (3, 20), (9, 14)):            # [CLS] query [SEP] document [SEP]
        ids = ([SHAPE["cls_token_id"]] + rng.integers(3, SHAPE["vocab_size"], q).tolist() + [SHAPE["sep_token_id"]]
               + rng.integers(3, SHAPE["vocab_size"], d).tolist() + [SHAPE["sep_token_id"]])
        with torch.no_grad():
            logit = model(input_ids=torch.tensor([ids])).logits[0, 0]
        pairs.append({"ids": ids, "logit": float(logit)})
    (rerank / "reference.json").write_text(json.dumps({"pairs": pairs}))
    print(f"wrote {rerank}")


if __name__ == "__main__":
    main()

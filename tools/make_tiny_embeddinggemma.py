"""A tiny random EmbeddingGemma (google/embeddinggemma-300m's shape, shrunk) with transformers reference outputs.

    python tools/make_tiny_embeddinggemma.py [--out tests/fixtures/encoders]

Needs torch and transformers 5 (never a runtime dependency of llambda); sentence-transformers is not needed: its
modules after the transformer (1_Pooling's mean, 2_Dense and 3_Dense: bias-free linear layers with the Identity
activation, then Normalize) are applied here in torch from the weights this script saves in their folders, as
sentence-transformers would load them (`linear.weight` in each Dense folder's model.safetensors, its config.json's
in_features / out_features / bias / activation_function). The folder is laid out as sentence-transformers saves
EmbeddingGemma: config.json and model.safetensors of a Gemma3TextModel with use_bidirectional_attention true,
modules.json, 1_Pooling/, 2_Dense/, 3_Dense/, 4_Normalize/. Six layers, the sixth global (Gemma 3's pattern, which
llama.cpp assumes), distinct local and global RoPE bases (10000, as llama.cpp assumes for the local one, and 1000),
grouped-query attention (2 query heads, 1 key/value head), a sliding window of 8 (a token sees those at most 4
away in a local layer: transformers halves the window of a bidirectional model) and inputs longer than it.
Everything is seeded. reference.json holds per input (token ids, each run alone, no padding) the last hidden states
and the final embedding (mean pooled, both Dense layers, L2-normalized).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SHAPE = dict(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=8, rms_norm_eps=1e-6,
             max_position_embeddings=64, use_bidirectional_attention=True, hidden_activation="gelu_pytorch_tanh",
             pad_token_id=0, eos_token_id=1, bos_token_id=2,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
DENSE = [(32, 80), (80, 32)]           # 2_Dense: hidden -> 80, 3_Dense: 80 -> hidden (the 300m: 768 -> 3072 -> 768)
LENGTHS = [3, 9, 17, 30]


def start(name: str) -> Path:
    """The output folder (--out's `name`), torch seeded."""
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/encoders")
    out = Path(ap.parse_args().out) / name
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    return out


def st_modules(out: Path, hidden: int, after: list[str]) -> None:
    """modules.json (the transformer, mean pooling, then the `after` modules' folders) and 1_Pooling."""
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}))
    kinds = {"Dense": "sentence_transformers.models.Dense", "Normalize": "sentence_transformers.models.Normalize"}
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    for i, folder in enumerate(after, 2):
        (out / folder).mkdir(exist_ok=True)
        modules.append({"idx": i, "name": str(i), "path": folder, "type": kinds[folder.split("_", 1)[1]]})
    (out / "modules.json").write_text(json.dumps(modules, indent=2))


def write_reference(out: Path, model, lengths: list[int], vocab: int, first: int, last: int, dense=()) -> None:
    """reference.json: per length, random ids between `first` and `last`, run alone, their last hidden states and
    the embedding (mean, the `dense` matrices, L2 norm)."""
    import torch
    import transformers
    rng = np.random.default_rng(5)
    cases = []
    for n in lengths:
        ids = [first] + rng.integers(3, vocab, n - 2).tolist() + [last]
        with torch.no_grad():
            h = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            v = h.mean(0)
            for w in dense:
                v = v @ w.T
            v = v / v.norm()
        cases.append({"ids": ids, "hidden": h.tolist(), "embedding": v.tolist()})
    (out / "reference.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                    "torch": torch.__version__, "cases": cases}))
    print(f"wrote {out}")


def random_model(config_class, model_class, shape: dict, draw):
    """model_class(config_class(**shape)) in eval mode, each parameter set to draw(name, parameter)."""
    import torch
    cfg = config_class(**shape)
    cfg.architectures = [model_class.__name__]
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(draw(name, p))
    return model


def main() -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig, Gemma3TextModel

    out = start("embeddinggemma")
    # random norms too (HF stores w - 1: a 0 would hide 1 + w)
    model = random_model(Gemma3TextConfig, Gemma3TextModel, SHAPE, lambda name, p: torch.randn_like(p) * (
        0.3 if "norm" in name else 0.2 if "embed" not in name else 1.0))
    model.save_pretrained(out)
    st_modules(out, SHAPE["hidden_size"], ["2_Dense", "3_Dense", "4_Normalize"])
    dense_w = []
    g = torch.Generator().manual_seed(1)
    for i, (fin, fout) in enumerate(DENSE):
        d = out / f"{i + 2}_Dense"
        w = torch.randn(fout, fin, generator=g) * fin ** -0.5
        save_file({"linear.weight": w.contiguous()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps({"in_features": fin, "out_features": fout, "bias": False,
                                                   "activation_function": "torch.nn.modules.linear.Identity"}))
        dense_w.append(w)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": SHAPE["max_position_embeddings"],
                                                               "do_lower_case": False}))
    write_reference(out, model, LENGTHS, SHAPE["vocab_size"], SHAPE["bos_token_id"], SHAPE["eos_token_id"], dense_w)


if __name__ == "__main__":
    main()

"""A randomly initialised MoE GGUF for speed tests: Qwen3-30B-A3B's routing (128 experts, top 8,
q/k norms, renormalised top-k) at a smaller width and depth, quantized as a Q4_K_M file mostly is
(Q4_K matrices, a Q6_K output head, float norms and routers), with a real tokenizer copied from
another GGUF so that llama.cpp loads it too.

    python bench/make_moe_model.py moe-bench.gguf                 # tokenizer of smollm2-135m
    python bench/make_moe_model.py q30b.gguf --qwen3-30b --layers 24   # Qwen3-30B-A3B's shapes, half its depth
    llambda bench moe-bench.gguf -p 512 -n 64 --vs llama-cpp

Random weights give meaningless text but the same bytes, routing spread and arithmetic as a
trained model of these shapes: speed is all it is for.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from llambda.formats.gguf_writer import write_gguf
from llambda.formats.open import open_model
from llambda.formats.quants import TRAITS, QType, quantize
from llambda.hub import resolve
from llambda.models.config import TransformerConfig
from llambda.tools.export import _gguf_metadata_types, _gguf_tokenizer_metadata, gguf_metadata


def build(out: Path, tokenizer_from: str, layers: int, d: int, heads: int, kv_heads: int, head_dim: int,
          experts: int, used: int, expert_ff: int, seed: int = 0, fast: bool = False) -> Path:
    tok_src = open_model(Path(resolve(tokenizer_from)))
    try:
        vocab = tok_src.config.vocab_size
        cfg = TransformerConfig(arch="qwen3moe", vocab_size=vocab, n_layers=layers, d_model=d, n_heads=heads,
                                n_kv_heads=kv_heads, head_dim=head_dim, ffn_dim=expert_ff, norm_eps=1e-6,
                                n_ctx_train=32768, rope_theta=1e6, qk_norm=True, n_experts=experts,
                                n_experts_used=used, expert_ffn_dim=expert_ff, tie_embeddings=False)
        meta = gguf_metadata(cfg, "qwen3moe", f"random qwen3moe {experts}x{expert_ff} top{used}")
        meta.update(_gguf_tokenizer_metadata(tok_src))
        types = _gguf_metadata_types(tok_src)
    finally:
        tok_src.close()
    meta["general.quantization_version"] = 2
    rng = np.random.default_rng(seed)

    def mat(*shape, qtype=QType.Q4_K, scale=1.0):
        """Random N(0, scale^2 / cols) values of `shape` (2-D, or 3-D experts) as `qtype` bytes."""
        pieces = []
        for _ in range(shape[0] if len(shape) == 3 else 1):   # an expert at a time: a layer's floats take GBs
            vals = rng.standard_normal(shape[-2:], dtype=np.float32) * np.float32(scale / np.sqrt(shape[-1]))
            pieces.append(quantize(vals, qtype).reshape(-1))
        return qtype, np.concatenate(pieces), shape

    templates: dict = {}

    def fast_mat(*shape, qtype=QType.Q4_K, scale=1.0):
        """Random bytes of `qtype` with small valid block scales, one array per (shape, type) reused by every
        layer: no quantizer run and one layer's memory, to write a file of tens of GB for load tests."""
        if qtype not in (QType.Q4_K, QType.Q6_K):
            return quantized(*shape, qtype=qtype, scale=scale)
        key = (shape, qtype)
        if key not in templates:
            tr = TRAITS[qtype]
            n_blocks = int(np.prod(shape)) // tr.block_size
            raw = rng.integers(0, 256, (n_blocks, tr.type_size), dtype=np.uint8)
            d = np.full((n_blocks, 1), 0.002, np.float16).view(np.uint8)
            if qtype == QType.Q4_K:
                raw[:, 0:2], raw[:, 2:4] = d, np.full((n_blocks, 1), 0.001, np.float16).view(np.uint8)
            else:
                raw[:, -2:] = d
            templates[key] = raw.reshape(-1)
        return qtype, templates[key], shape

    quantized = mat
    if fast:
        mat = fast_mat  # noqa: F811

    def vec(n, mean=1.0):
        return QType.F32, (mean + 0.1 * rng.standard_normal(n, dtype=np.float32)).view(np.uint8), (n,)

    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    items = [("token_embd.weight", *mat(vocab, d, scale=np.sqrt(d)))]
    for i in range(layers):
        p = f"blk.{i}."
        items += [
            (p + "attn_norm.weight", *vec(d)),
            (p + "attn_q.weight", *mat(q_dim, d)), (p + "attn_k.weight", *mat(kv_dim, d)),
            (p + "attn_v.weight", *mat(kv_dim, d, qtype=QType.Q6_K)), (p + "attn_output.weight", *mat(d, q_dim)),
            (p + "attn_q_norm.weight", *vec(head_dim)), (p + "attn_k_norm.weight", *vec(head_dim)),
            (p + "ffn_norm.weight", *vec(d)),
            (p + "ffn_gate_inp.weight", *mat(experts, d, qtype=QType.F32, scale=2.0)),
            (p + "ffn_gate_exps.weight", *mat(experts, expert_ff, d)),
            (p + "ffn_up_exps.weight", *mat(experts, expert_ff, d)),
            (p + "ffn_down_exps.weight", *mat(experts, d, expert_ff, qtype=QType.Q6_K)),
        ]
    items += [("output_norm.weight", *vec(d)), ("output.weight", *mat(vocab, d, qtype=QType.Q6_K))]
    items = [(name, q, raw.view(np.uint8), shape) for name, q, raw, shape in items]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(out, meta, items, metadata_types=types)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer-from", default="smollm2-135m", help="a catalogued name or GGUF path")
    ap.add_argument("--layers", type=int, help="(default 8; 48 with --qwen3-30b)")
    ap.add_argument("--d", type=int, default=1024, help="model width (Qwen3-30B-A3B: 2048)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--expert-ff", type=int, default=512, help="each expert's width (Qwen3-30B-A3B: 768)")
    ap.add_argument("--qwen3-30b", action="store_true",
                    help="Qwen3-30B-A3B's shapes (48 layers unless --layers, d 2048, 32/4 heads of 128, 128 experts "
                         "of 768, top 8, its vocabulary of 151936 from qwen2.5-coder-0.5b), written with --fast: "
                         "~20 GB at 48 layers, ~0.4 GB a layer")
    ap.add_argument("--fast", action="store_true",
                    help="random quant bytes reused across layers instead of quantized random values (for "
                         "load and memory tests of big files: seconds per GB, not minutes)")
    a = ap.parse_args()
    if a.qwen3_30b:
        a.layers, a.d, a.heads, a.kv_heads, a.head_dim, a.experts, a.used, a.expert_ff, a.fast = (
            a.layers or 48, 2048, 32, 4, 128, 128, 8, 768, True)
        if a.tokenizer_from == "smollm2-135m":
            a.tokenizer_from = "qwen2.5-coder-0.5b"
    a.layers = a.layers or 8
    path = build(a.out, a.tokenizer_from, a.layers, a.d, a.heads, a.kv_heads, a.head_dim, a.experts, a.used,
                 a.expert_ff, fast=a.fast)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()

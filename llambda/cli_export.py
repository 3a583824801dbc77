"""`llambda export -m MODEL --format hf|gguf --out PATH [--type TYPE]`."""
from __future__ import annotations

import sys


def cmd_export(a) -> int:
    from .export import export
    out = export(a.model, a.out, fmt=a.format, qtype=a.type)
    print(f"[llambda] wrote {out}", file=sys.stderr)
    return 0


def register(subparsers, add_model_args) -> None:
    p = subparsers.add_parser("export", help="write a model as a Hugging Face directory or a GGUF file")
    add_model_args(p)
    p.add_argument("--format", choices=["hf", "gguf"], required=True,
                   help="hf: a directory (model.safetensors, config.json, tokenizer); gguf: one file")
    p.add_argument("--out", required=True, help="output directory (hf) or file (gguf)")
    p.add_argument("--type", default=None,
                   help="tensor type: f32, f16, bf16 (both formats) or q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, "
                        "q6_k (gguf; norms stay f32). Default: keep the source's (hf: quantized ones become f32)")
    p.set_defaults(fn=cmd_export)

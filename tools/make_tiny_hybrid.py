"""Tiny random hybrid models (layers that are not all attention) with transformers reference outputs.

Writes tests/fixtures/reference/tiny/<folder>/ in the format of the other tiny folders (see the
README there): config.json, generation_config.json, model.safetensors (float32) and reference.json.

Run with a Python that has torch and transformers (never a runtime dependency of llambda):

    python tools/make_tiny_hybrid.py [--out tests/fixtures/reference/tiny] [lfm2 ...]

Everything is seeded: the same torch and transformers versions write the same files.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

LENGTHS = (7, 40, 100)
INPUT_SEED = 1234
VOCAB = 512
N_NEW = 16

COMMON_NOTES = [
    "input_ids are the same three random sequences as in every tiny folder (numpy default_rng(1234), ids in "
    "[0, 512)); nothing is prepended (no BOS), positions start at 0, batch of one, no padding.",
    "greedy continuations ignore EOS: generate ran with eos_token_id unset, so it always makes 16 tokens; "
    "they were also checked against a recompute without cache (greedy_matches_recompute).",
    "RoPE uses the Hugging Face half-split layout (rotate_half): dimension i pairs with i + head_dim/2.",
]

LFM2_NOTES = [
    "layer_types [conv, conv, full_attention, conv]: layer i is a gated short convolution unless its type is "
    "full_attention. Every layer: h = x + op(operator_norm(x)); out = h + w2(silu(w1(f)) * w3(f)), "
    "f = ffn_norm(h).",
    "Short conv (conv_L_cache L = 3, no biases): BCx = in_proj(h) (3*hidden rows: B = rows [0:64], "
    "C = [64:128], x = [128:192]); u = B * x; y[t] = sum_{j<L} conv.weight[c, 0, j] * u[t - (L-1) + j] "
    "(a causal depthwise conv, u = 0 before position 0); out = out_proj(C * y). The recurrent state of a "
    "sequence is the last L-1 values of u per channel.",
    "Attention layers: q_layernorm / k_layernorm are RMSNorms over head_dim of each head (before RoPE); "
    "the output projection is self_attn.out_proj; scale head_dim^-0.5.",
    "model.embedding_norm is the FINAL norm (applied after the last layer, before the tied lm_head), "
    "despite its name; llama.cpp calls it token_embd_norm.",
    "intermediate_size 192 with block_auto_adjust_ff_dim: the MLP is int(2 * 192 / 3) = 128 wide, times "
    "block_ffn_dim_multiplier 1.0, rounded up to block_multiple_of 32: 128.",
    "Tied embeddings (no lm_head.weight in the file).",
]


def lfm2_config():
    from transformers import Lfm2Config
    return Lfm2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, conv_bias=False, conv_L_cache=3,
        block_multiple_of=32, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True,
        layer_types=["conv", "conv", "full_attention", "conv"], bos_token_id=1, eos_token_id=2, pad_token_id=0)


QWEN3NEXT_NOTES = [
    "layer_types [linear_attention x3, full_attention]; every layer x += mixer(input_layernorm(x)); "
    "x += moe(post_attention_layernorm(x)). Every Qwen3NextRMSNorm computes x * (1 + w) (stored w = g - 1), "
    "the final norm too; the gated norm inside the delta-net (linear_attn.norm) computes plain w.",
    "Full attention: q_proj is 2 * heads * head_dim tall: per head, 16 query rows then 16 gate rows; "
    "q_norm/k_norm ((1 + w) RMSNorms over head_dim) before RoPE; RoPE on the first 4 dims of each head "
    "(partial_rotary_factor 0.25, half-split pairs i, i + 2); the attention output (heads concatenated) is "
    "multiplied by sigmoid(gate) before o_proj.",
    "Gated delta-net (linear_num_key_heads 2, linear_num_value_heads 4, key/value head dims 16, conv 4): "
    "in_proj_qkvz rows are grouped per key head g: q_g (16), k_g (16), v of value heads 2g, 2g+1 (32), z of "
    "those (32); in_proj_ba rows per key head: b of its 2 value heads, then a of them. mixed = [q(all heads), "
    "k, v] (128 channels) goes through a causal depthwise conv of width 4 (no bias) and SiLU. q and k are "
    "L2-normalised per head (eps 1e-6 inside the rsqrt of the sum of squares), q scaled by 16^-0.5; key head "
    "h // 2 serves value head h. beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias). Per token and "
    "value head: S *= exp(g); delta = beta * (v - S^T k); S += k delta^T; o = S^T q (S is dk x dv, zero at "
    "position 0). out = out_proj(rmsnorm(o) * w * silu(z)) per value head.",
    "MoE on every layer: 4 experts, top-2, softmax over all then renormalised (norm_topk_prob); shared expert "
    "(SiLU MLP, 32 wide) times sigmoid(shared_expert_gate . h). Experts as transformers 5 saves them.",
    "Untied lm_head.",
]


def qwen3next_config():
    from transformers import Qwen3NextConfig
    return Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=4, norm_topk_prob=True,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


SPECS = {
    "lfm2": {"class": "Lfm2ForCausalLM", "config": lfm2_config, "seed": 109, "notes": LFM2_NOTES,
             "legacy_rope_keys": {"rope_theta": 1000000.0}},
    "qwen3_next": {"class": "Qwen3NextForCausalLM", "config": qwen3next_config, "seed": 201, "notes": QWEN3NEXT_NOTES,
                   "legacy_rope_keys": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25}},
}


def redraw(model, seed: int) -> None:
    """Every parameter from a seeded generator, in named_parameters() order (the README's scheme)."""
    g = torch.Generator().manual_seed(seed)
    tied = model.config.tie_word_embeddings
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 2)
        with torch.no_grad():
            if name.endswith("A_log"):                 # decay rates exp(A_log) in [0.1, 1.5]
                p.copy_(torch.log(0.1 + 1.4 * torch.rand(p.shape, generator=g)))
            elif name.endswith(".D"):                    # Mamba2's skip, per head
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(-1.0 + 0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("linear_attn.norm.weight"):    # the gated norm: plain w
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "qwen3_next" in type(model).__module__ and ("norm.weight" in name or "layernorm" in name):
                base = 2.5 if name == "model.norm.weight" else 1.5 if ("q_norm" in name or "k_norm" in name) else 1.0
                p.copy_(base - 1.0 + 0.1 * torch.randn(p.shape, generator=g))     # stored w; computes 1 + w
            elif name.endswith("experts.gate_up_proj"):      # (E, 2I, H)
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("experts.down_proj"):         # (E, H, I)
                p.copy_(4.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("mlp.gate.weight"):           # the router
                p.copy_(2.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("conv1d.weight"):             # depthwise (channels, 1, L): fan-in L
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.2 if tied else 1.0))
            elif name.endswith("norm.weight") or "layernorm" in name or name.endswith("norm_f.weight"):
                base = 2.5 if "embedding_norm" in name or name in ("model.norm.weight", "model.norm_f.weight") else \
                    1.5 if ("q_layernorm" in name or "k_layernorm" in name or "q_norm" in name or "k_norm" in name) \
                    else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv.conv.weight"):      # depthwise (channels, 1, L): fan-in L
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                w = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])
                if leaf[-2] in ("q_proj", "k_proj"):
                    w *= 1.5
                if leaf[-2] in ("out_proj", "o_proj", "w2", "down_proj") and "shared_expert_gate" not in name:
                    w *= 4.0
                p.copy_(w)
            else:
                raise SystemExit(f"no initialisation rule for {name} {tuple(p.shape)}")


def shortest(x: float) -> float:
    """The shortest decimal that reads back as the same float32."""
    f = np.float32(x)
    for digits in range(1, 10):
        v = float(f"{float(f):.{digits}g}")
        if np.float32(v) == f:
            return v
    return float(f)


def reference_inputs(model) -> list[dict]:
    """The three inputs' entries of reference.json: last-3 logits, argmax per position, 16 greedy tokens
    (checked against a recompute of every step without cache) and their margins."""
    rng = np.random.default_rng(INPUT_SEED)
    inputs = []
    for length in LENGTHS:
        ids = rng.integers(0, VOCAB, size=length).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            gen = model.generate(torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False, use_cache=True,
                                 eos_token_id=None, pad_token_id=0)[0, length:].tolist()
            seq, recompute, margins = list(ids), [], []
            for _ in range(N_NEW):                 # greedy again, every step recomputed from scratch
                row = model(torch.tensor([seq])).logits[0, -1].float().numpy()
                top = np.sort(row)[-2:]
                margins.append(float(top[1] - top[0]))
                recompute.append(int(row.argmax()))
                seq.append(recompute[-1])
        last = list(range(length - 3, length))
        inputs.append({
            "input_ids": ids, "length": length, "last_positions": last,
            "logits_last3": [[shortest(v) for v in logits[p]] for p in last],
            "logits_last3_std": [float(logits[p].std()) for p in last],
            "argmax_per_position": logits.argmax(-1).tolist(),
            "greedy_new_tokens": gen,
            "greedy_matches_recompute": gen == recompute,
            "greedy_top1_minus_top2_per_step": margins,
        })
    return inputs


def make(folder: str, out: Path) -> None:
    import transformers
    spec = SPECS[folder]
    torch.manual_seed(0)
    cfg = spec["config"]()
    cls = getattr(transformers, spec["class"])
    model = cls(cfg).float().eval()
    model.config._attn_implementation = "eager"
    redraw(model, spec["seed"])
    if "post" in spec:          # what the scheme does not cover (buffers, such as a router's bias)
        spec["post"](model, spec["seed"])
    dest = out / folder
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    cfg_json = json.loads((dest / "config.json").read_text())

    inputs = reference_inputs(model)
    # None: no RoPE anywhere (Granite 4's "nope"); a spec's "base" names a decoder not at .model (GPT-NeoX's)
    rotary = getattr(getattr(model, spec.get("base", "model")), "rotary_emb", None)
    ref = {
        "folder": folder, "model_class": spec["class"], "transformers_version": transformers.__version__,
        "torch_version": torch.__version__, "weights_dtype": "float32", "compute_dtype": "float32",
        "attn_implementation": "eager",
        "init": {"torch_manual_seed": 0, "weight_generator_seed": spec["seed"], "input_seed": INPUT_SEED,
                 "scheme": "tools/make_tiny_hybrid.py: redraw()"},
        "notes": spec["notes"] + COMMON_NOTES,
        "legacy_rope_keys": spec["legacy_rope_keys"],
        "rope_inv_freq": {} if rotary is None else {"all_layers": [shortest(v) for v in rotary.inv_freq.float().tolist()]},
        "config": cfg_json,
        "inputs": inputs,
    }
    (dest / "reference.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
    print(folder, "greedy matches recompute:", [i["greedy_matches_recompute"] for i in inputs],
          "min margin", min(min(i["greedy_top1_minus_top2_per_step"]) for i in inputs))


def main(specs: dict | None = None, doc: str = __doc__) -> None:
    """Write the folders named on the command line (all of `specs`, added to SPECS, by default)."""
    SPECS.update(specs or {})
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/reference/tiny")
    ap.add_argument("folders", nargs="*", default=list(specs or SPECS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for folder in args.folders:
        make(folder, args.out)


def main_one(make_one, doc: str) -> None:
    """The command line of a maker that writes one folder: `make_one(out)` under --out."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/reference/tiny")
    args = ap.parse_args()
    torch.set_num_threads(1)
    make_one(args.out)


if __name__ == "__main__":
    main()

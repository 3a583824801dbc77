"""Which GGUF type each tensor gets when a model is quantized to a file type.

A file type names either one tensor type (q8_0, q4_0, q4_k, ...: every matrix in it, "pure") or a
mix users know from llama.cpp (Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, ...): a default type, raised for the
tensors quantization hurts most. The rules are the facts of llama.cpp's `llama_tensor_get_type`
for models without an importance matrix:
- the output head (and a tied token embedding, which is the head) takes Q6_K, or Q8_0 when its
  rows do not split into the default type's blocks;
- attn_v and ffn_down take more bits in some layers: the first and last eighth and every third
  layer between (`_more_bits`) for the _M mixes, fixed layer ranges for the others (IQ4_NL and IQ4_XS:
  ffn_down in the first eighth and attn_v when 4+ query heads share a KV head take Q5_K); a fused
  attn_qkv and DeepSeek's attn_kv_b are attn_v, an MoE's expert and shared-expert ffn_down are ffn_down;
  DeepSeek's other latent-attention matrices (attn_kv_a_mqa, attn_q_a, attn_q_b, and the attn_k_b /
  attn_v_b halves llama.cpp's converter and ours split kv_b into) keep the default type;
- a model of exactly 8 experts (Mixtral) has attn_v and attn_k in Q8_0 and attn_output in Q5_K
  (Q2_K to Q4_K_M, IQ4) or the default (Q3_K_L, Q5_K_*);
- a matrix whose rows do not split into 256-value blocks falls back to a 32-block type
  (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL: llama-quant.cpp's
  tensor_type_fallback; older llama.cpp gave Q2_K/Q3_K IQ4_NL), and to F16 when not even those fit;
  `fallback_note` says how many took which, once.
Norms, biases and other 1-D tensors stay F32.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ..errors import LlambdaError
from ..formats.quants import QType, TRAITS

Q = QType

# llama.cpp's file type ids (general.file_type), for the types and mixes we write.
FILE_TYPE_IDS = {
    "f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
    "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17,
    "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "bf16": 32,
}

# A mix: its default type and the rule that raises some tensors. Rules get (kind, layer, n_layers,
# n_gqa) and return a type or None (keep the default).
Rule = Callable[[str, int, int, int], "QType | None"]


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _q2_k(kind, i, n, gqa):
    return {"attn_v": Q.Q4_K if gqa >= 4 else Q.Q3_K, "ffn_down": Q.Q3_K, "attn_output": Q.Q3_K}.get(kind)


def _q3_k_m(kind, i, n, gqa):
    if kind == "attn_v":
        return Q.Q5_K if i < 2 else Q.Q4_K
    if kind == "ffn_down":
        return Q.Q5_K if i < n // 16 else Q.Q4_K
    return Q.Q4_K if kind == "attn_output" else None


def _q3_k_l(kind, i, n, gqa):
    return Q.Q5_K if kind in ("attn_v", "ffn_down", "attn_output") else None


def _q4_k_s(kind, i, n, gqa):
    if kind == "attn_v" and i < 4:
        return Q.Q5_K
    return Q.Q5_K if kind == "ffn_down" and i < n // 8 else None


def _k_m(kind, i, n, gqa):   # Q4_K_M and Q5_K_M
    return Q.Q6_K if kind in ("attn_v", "ffn_down") and _more_bits(i, n) else None


def _iq4(kind, i, n, gqa):   # IQ4_NL and IQ4_XS (no importance matrix)
    if kind == "attn_v":
        return Q.Q5_K if gqa >= 4 else None
    return Q.Q5_K if kind == "ffn_down" and i < n // 8 else None


def _none(kind, i, n, gqa):
    return None


# llama.cpp's mixes for a model of exactly 8 experts (Mixtral 8x7B): attn_v and attn_k take Q8_0 (the
# attention is a small share of its bytes), attn_output Q5_K in these mixes and the default in the others.
_EIGHT_EXPERTS_OUTPUT_Q5_K = ("q2_k", "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m", "iq4_nl", "iq4_xs")


def _eight_experts(ftype: "FileType", kind: str, want: QType) -> QType:
    if kind in ("attn_v", "attn_k"):
        return Q.Q8_0
    if kind == "attn_output":
        return Q.Q5_K if ftype.name in _EIGHT_EXPERTS_OUTPUT_Q5_K else ftype.default
    return want


@dataclass(frozen=True)
class FileType:
    name: str
    default: QType
    rule: Rule | None       # None: pure, every matrix in `default`


MIXES = {
    "q2_k": FileType("q2_k", Q.Q2_K, _q2_k),
    "q3_k_s": FileType("q3_k_s", Q.Q3_K, _none),
    "q3_k_m": FileType("q3_k_m", Q.Q3_K, _q3_k_m),
    "q3_k_l": FileType("q3_k_l", Q.Q3_K, _q3_k_l),
    "q4_k_s": FileType("q4_k_s", Q.Q4_K, _q4_k_s),
    "q4_k_m": FileType("q4_k_m", Q.Q4_K, _k_m),
    "q5_k_s": FileType("q5_k_s", Q.Q5_K, _none),
    "q5_k_m": FileType("q5_k_m", Q.Q5_K, _k_m),
    "iq4_nl": FileType("iq4_nl", Q.IQ4_NL, _iq4),
    "iq4_xs": FileType("iq4_xs", Q.IQ4_XS, _iq4),
}
PURE_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K,
              Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4)
FLOATS = (Q.F32, Q.F16, Q.BF16)

# A 256-block type on rows that do not split into 256 values: llama.cpp's 32-block stand-in (llama-quant.cpp's
# tensor_type_fallback).
FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0,
            Q.IQ4_XS: Q.IQ4_NL}


def file_type(name: str, pure: bool = False) -> FileType:
    """A file type by name (case-insensitive): a mix, or one tensor type for every matrix.
    `q2_k`, `iq4_nl` and `iq4_xs` are mixes, as in llama.cpp; `pure` turns a mix into its default type everywhere."""
    key = str(name).lower()
    if key in MIXES:
        mix = MIXES[key]
        return FileType(key, mix.default, None) if pure else mix
    by_name = {q.name.lower(): q for q in PURE_TYPES}
    if key in by_name:
        return FileType(key, by_name[key], None)
    known = sorted(set(by_name) | set(MIXES))
    raise LlambdaError(f"cannot quantize to {name!r}; choose one of {', '.join(known)}")


_LAYER = re.compile(r"^blk\.(\d+)\.")
# in llama.cpp's order of matching; DeepSeek's whole kv_b counts as attn_v, as a fused attn_qkv does
_KINDS = ("attn_qkv", "attn_kv_b", "attn_v", "attn_k", "attn_q", "attn_output", "ffn_up", "ffn_gate", "ffn_down")


def tensor_kind(name: str) -> str:
    """The role the rules look at: output, token_embd, attn_v (a fused attn_qkv and DeepSeek's attn_kv_b
    count as attn_v, as in llama.cpp), ffn_down, ...; "other" for the rest (DeepSeek's attn_kv_a_mqa,
    attn_q_a, attn_q_b and the split attn_k_b / attn_v_b: llama.cpp's mixes keep them in the default type)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for kind in _KINDS:
        if f"{kind}." in name or (kind.startswith("ffn_") and kind in name):
            return "attn_v" if kind in ("attn_qkv", "attn_kv_b") else kind
    return "other"


def fits(qtype: QType, cols: int) -> bool:
    return cols % TRAITS[qtype].block_size == 0


def _fall_back(qtype: QType, cols: int) -> QType:
    if fits(qtype, cols):
        return qtype
    qtype = FALLBACK.get(qtype, qtype)
    return qtype if fits(qtype, cols) else Q.F16


def fallback_note(fallbacks: dict[str, tuple], what: str) -> str | None:
    """One line saying which matrices did not get the type asked for (name -> (wanted, got), got None: left in
    its own type) and why, by count; None when every matrix got its type."""
    if not fallbacks:
        return None
    counts: dict[tuple, int] = {}
    for wanted, got in fallbacks.values():
        counts[(wanted, got)] = counts.get((wanted, got), 0) + 1
    blocks = "/".join(str(b) for b in sorted({TRAITS[w].block_size for w, _ in counts}))
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0].name, kv[0][1].name if kv[0][1] else ""))
    parts = [f"{n} {w.name} -> {g.name if g is not None else 'left as they are'}" for (w, g), n in order]
    return (f"{what}: {len(fallbacks)} matrices whose rows do not split into their type's {blocks}-value blocks "
            f"took llama.cpp's fallback type: {', '.join(parts)}")


def tensor_types(ftype: FileType, shapes: dict[str, tuple], n_layers: int, n_gqa: int,
                 n_experts: int = 0, fallbacks: dict | None = None) -> dict[str, QType]:
    """The type of each tensor in `shapes` (name -> shape, rows first as in WeightTensor) under `ftype`, for
    a model of `n_experts` experts (0: dense). 1-D tensors and norms stay F32. `fallbacks` (a dict) is given
    name -> (wanted, got) of each matrix whose rows took a fallback type."""
    tied = "output.weight" not in shapes
    out = {}
    for name, shape in shapes.items():
        cols = shape[-1]
        if len(shape) < 2 or name.endswith("norm.weight") or not name.endswith(".weight"):
            out[name] = Q.F32
            continue
        want = ftype.default
        kind = tensor_kind(name)
        if ftype.rule is not None and want not in FLOATS:
            if kind == "output" or (tied and kind == "token_embd"):
                if want != Q.Q8_0:
                    want = Q.Q6_K if fits(ftype.default, cols) else Q.Q8_0
            else:
                m = _LAYER.match(name)
                raised = ftype.rule(kind, int(m.group(1)), n_layers, n_gqa) if m else None
                want = raised or want
                if n_experts == 8:
                    want = _eight_experts(ftype, kind, want)
        out[name] = _fall_back(want, cols)
        if fallbacks is not None and out[name] != want:
            fallbacks[name] = (want, out[name])
    return out

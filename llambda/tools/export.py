"""Write a model as a Hugging Face directory or as a GGUF file.

    export("smollm2-135m", "out_dir", fmt="hf")            # model.safetensors + config.json + tokenizer
    export("tests/.../tiny/qwen3", "q.gguf", fmt="gguf", qtype="q8_0")

Tensors keep their canonical (GGUF) names inside the engine; here they are
renamed for the target and brought to its conventions:
- RoPE layout: GGUF `llama` files hold q/k rows permuted for adjacent-pair
  rotation (rope_neox=False); HF files and every other GGUF architecture hold
  the half-split layout. Rows are permuted as raw bytes (rows are independent in
  every block format), so a quantized tensor is never re-quantized for this.
- Norm weights: HF Gemma stores w and computes (1 + w); GGUF stores 1 + w.
- Llama 3 RoPE scaling: config.json spells its parameters; GGUF stores the
  per-frequency divisors as a `rope_freqs.weight` tensor.
After writing the configuration we read it back with the architecture's own
reader and refuse to export when any setting did not survive.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import LlambdaError, LlambdaWarning, ModelFormatError
from ..finite import negated_exp
from ..formats.gguf_model import biases_from_tensors
from ..formats.hf_dir import GLOBAL_NAMES, layer_names
from ..formats.open import open_named
from ..formats.quants import QType, TRAITS, quantize
from ..formats.rope_rows import PERMUTED_GGUF_ARCHS, partial_rope_permutation
from ..formats.source import ModelSource
from ..formats.weights import WeightTensor
from ..models import arch_module
from ..models.config import MAMBA2_KINDS, TransformerConfig
from .quant_mix import FILE_TYPE_IDS, fallback_note, file_type, tensor_types


@dataclass(frozen=True)
class Family:
    hf_model_type: str
    hf_class: str
    gguf_arch: str
    hf_norm_offset: float = 0.0      # what HF adds to stored norm weights (Gemma: 1)
    hf_fused: bool = False           # HF stores qkv_proj / gate_up_proj (Phi-3)


FAMILIES = {
    "llama": Family("llama", "LlamaForCausalLM", "llama"),
    "mistral": Family("mistral", "MistralForCausalLM", "llama"),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", "qwen2"),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "qwen3"),
    # Qwen2.5-VL's text model (M-RoPE): its vision tower is llambda.vision's (an mmproj)
    "qwen2vl": Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2vl"),
    # Qwen3-VL's text model (interleaved M-RoPE, DeepStack levels): GGUF only (a qwen3_vl config.json nests its
    # text config beside a vision config the export does not have)
    "qwen3vl": Family("qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen3vl"),
    "qwen3vlmoe": Family("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", "qwen3vlmoe"),
    "gemma2": Family("gemma2", "Gemma2ForCausalLM", "gemma2", hf_norm_offset=1.0),
    "gemma3": Family("gemma3_text", "Gemma3ForCausalLM", "gemma3", hf_norm_offset=1.0),
    "phi3": Family("phi3", "Phi3ForCausalLM", "phi3", hf_fused=True),
    "qwen3moe": Family("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe"),
    "qwen2moe": Family("qwen2_moe", "Qwen2MoeForCausalLM", "qwen2moe"),
    "mixtral": Family("mixtral", "MixtralForCausalLM", "llama"),      # llama.cpp writes Mixtral as `llama`
    "gpt_oss": Family("gpt_oss", "GptOssForCausalLM", "gpt-oss"),
    "smollm3": Family("smollm3", "SmolLM3ForCausalLM", "smollm3"),
    "granite": Family("granite", "GraniteForCausalLM", "granite"),
    "granitemoe": Family("granitemoe", "GraniteMoeForCausalLM", "granitemoe"),
    "olmo2": Family("olmo2", "Olmo2ForCausalLM", "olmo2"),
    # hybrids: GGUF only (write_hf refuses them)
    "lfm2": Family("lfm2", "Lfm2ForCausalLM", "lfm2"),
    "lfm2moe": Family("lfm2_moe", "Lfm2MoeForCausalLM", "lfm2moe"),
    "qwen3next": Family("qwen3_next", "Qwen3NextForCausalLM", "qwen3next"),
    "granitehybrid": Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", "granitehybrid"),
    "falcon_h1": Family("falcon_h1", "FalconH1ForCausalLM", "falcon-h1"),     # its multipliers folded in
    # latent attention: GGUF only too
    "deepseek2": Family("deepseek_v2", "DeepseekV2ForCausalLM", "deepseek2"),
    # GLM: GGUF only (write_hf refuses them: HF's own norm names and fused gate_up are not written)
    "glm4": Family("glm4", "Glm4ForCausalLM", "glm4"),
    "glm4moe": Family("glm4_moe", "Glm4MoeForCausalLM", "glm4moe"),
    # GLM-4.1V / GLM-4.6V's text model: llama.cpp's glm4 with rope.dimension_sections, q/k rows half-split
    "glm4v": Family("glm4v", "Glm4vForConditionalGeneration", "glm4"),
    # Gemma 3n's text decoder: GGUF only as well (models/gemma3n.py)
    "gemma3n": Family("gemma3n_text", "Gemma3nForCausalLM", "gemma3n"),
    # ERNIE 4.5: GGUF only (its HF files keep q/k rows in adjacent pairs; the MoE's names and keys are its own)
    "ernie4_5": Family("ernie4_5", "Ernie4_5ForCausalLM", "ernie4_5"),
    "ernie4_5_moe": Family("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "ernie4_5-moe"),
    "olmoe": Family("olmoe", "OlmoeForCausalLM", "olmoe"),       # MoE: GGUF only
    "seed_oss": Family("seed_oss", "SeedOssForCausalLM", "seed_oss"),
    "arcee": Family("arcee", "ArceeForCausalLM", "arcee"),
    "apertus": Family("apertus", "ApertusForCausalLM", "apertus"),     # GGUF only (its own HF norm names)
    # LayerNorm families: GGUF only too (config.json's own keys and HF names are not written)
    "cohere": Family("cohere", "CohereForCausalLM", "command-r"),
    "cohere2": Family("cohere2", "Cohere2ForCausalLM", "cohere2"),
    "starcoder2": Family("starcoder2", "Starcoder2ForCausalLM", "starcoder2"),
    "exaone4": Family("exaone4", "Exaone4ForCausalLM", "exaone4"),
    # Hunyuan dense: GGUF only (HF's own q/k norm names and its alpha RoPE scaling are not written)
    "hunyuan": Family("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", "hunyuan-dense"),
    # Ministral 3 (query temperature): GGUF only (write_hf does not write llama_4_scaling_beta)
    "ministral3": Family("ministral3", "Ministral3ForCausalLM", "mistral3"),
    "gemma": Family("gemma", "GemmaForCausalLM", "gemma", hf_norm_offset=1.0),
    # LayerNorm families as well: GGUF only
    "phi": Family("phi", "PhiForCausalLM", "phi2"),
    "stablelm": Family("stablelm", "StableLmForCausalLM", "stablelm"),
    "gpt_neox": Family("gpt_neox", "GPTNeoXForCausalLM", "gptneox"),
    "nemotron": Family("nemotron", "NemotronForCausalLM", "nemotron"),
    "nemotron_h": Family("nemotron_h", "NemotronHForCausalLM", "nemotron_h"),     # a hybrid: GGUF only
    "olmo": Family("olmo", "OlmoForCausalLM", "olmo"),      # LayerNorms without parameters: GGUF only
    "internlm3": Family("internlm3", "LlamaForCausalLM", "llama"),     # as llama.cpp's converter writes it
    "mamba2": Family("mamba2", "Mamba2ForCausalLM", "mamba2"),     # state-space models: GGUF only
    "mamba": Family("mamba", "MambaForCausalLM", "mamba"),         # FalconMamba too (its GGUF is llama.cpp's mamba)
    "jamba": Family("jamba", "JambaForCausalLM", "jamba"),         # a hybrid: GGUF only
    "bamba": Family("bamba", "BambaForCausalLM", "granitehybrid"),  # as llama.cpp's converter writes it
    # learned position tables (GPT-2, StarCoder 1) and Falcon's fused qkv: LayerNorms, GGUF only
    "gpt2": Family("gpt2", "GPT2LMHeadModel", "gpt2"),
    "gpt_bigcode": Family("gpt_bigcode", "GPTBigCodeForCausalLM", "starcoder"),
    "falcon": Family("falcon", "FalconForCausalLM", "falcon"),
}
# GGUF architectures whose q/k rows keep the same RoPE layout as their HF files (DeepSeek's adjacent pairs)
SAME_ROPE_LAYOUT_ARCHS = {"deepseek2", "glm4", "ernie4_5", "ernie4_5-moe", "command-r", "cohere2"}
FLOAT_TYPES = {"f32": QType.F32, "f16": QType.F16, "bf16": QType.BF16}
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "chat_template.json", "generation_config.json", "tokenizer.model")
_LAYER_LEAVES = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_q_norm",
                 "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
                 "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_inp_shexp",
                 "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "attn_sinks",
                 # hybrid layers' (LFM2's short convolution, Qwen3-Next's delta net)
                 "shortconv.in_proj", "shortconv.conv", "shortconv.out_proj", "ssm_in", "attn_gate", "ssm_ba",
                 "ssm_conv1d", "ssm_a", "ssm_a_log", "ssm_dt", "ssm_d", "ssm_norm", "ssm_out", "ssm_x",
                 "ssm_dt_norm", "ssm_b_norm", "ssm_c_norm",      # Jamba's weighted dt/B/C norms
                 # latent attention's (DeepSeek), and its router's choice bias
                 "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_kv_b", "exp_probs_b",
                 # Gemma 3n's per-layer input, AltUp and LAuReL
                 "inp_gate", "proj", "post_norm", "altup_correct_coef", "altup_correct_scale", "altup_predict_coef",
                 "altup_router", "altup_router_norm", "laurel_l", "laurel_r", "laurel_post_norm",
                 # Apertus' xIELU scalars (llama.cpp keeps them as keys: models/apertus.py)
                 "xielu_alpha_p", "xielu_alpha_n", "xielu_beta", "xielu_eps")
# leaves that may also have a `.bias`
_BIASED = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",  # attn_qkv: GPT-NeoX's fused bias
           "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
           "ssm_dt", "ssm_conv1d", "exp_probs_b", "attn_norm", "ffn_norm", "ffn_up", "ffn_down")
# Tensors kept in float whatever the export type: an MoE router's logits pick the experts, and a
# quantized router flips choices that are close (llama.cpp's quantizer also leaves them alone).
# A learned position table (GPT-2's) too, as llama.cpp's quantizer leaves it.
_FLOAT_ONLY = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "position_embd.weight")
# Tensors llama.cpp computes on only in float32 (its ssm_conv op asserts an F32 kernel; its converter
# writes them F32 and its quantizer leaves them): a convolution kernel of another type fails its run.
# Mamba2's A, D and gated norm weights too (small; its ssm_scan and norm ops read them as F32).
_F32_ONLY = ("ssm_conv1d.weight", "shortconv.conv.weight", "ssm_a", "ssm_d", "ssm_norm.weight")


def family_of(cfg: TransformerConfig) -> Family:
    arch = cfg.arch
    if arch == "llama" and cfg.n_experts:
        arch = "mixtral"      # a `llama` GGUF with experts is Mixtral
    elif arch == "llama" and any(cfg.layer_sliding):
        arch = "mistral"      # config.json spells a Llama with a window as Mistral
    if arch not in FAMILIES:          # a GGUF's spelling (gpt-oss) where ours differs (gpt_oss)
        arch = next((k for k, f in FAMILIES.items() if f.gguf_arch == arch), arch)
    if arch not in FAMILIES:
        raise ModelFormatError(f"export does not know the architecture {cfg.arch!r}")
    return FAMILIES[arch]


# ---------------------------------------------------------------- tensors

@dataclass
class OutTensor:
    name: str
    qtype: QType
    shape: tuple
    raw: np.ndarray          # uint8, the bytes as stored


def source_tensors(src: ModelSource) -> dict[str, WeightTensor]:
    """Every canonical tensor the source has, in file-like order."""
    names = ["token_embd.weight", "position_embd.weight", "rope_freqs.weight"]
    for i in range(src.config.n_layers):
        for leaf in _LAYER_LEAVES:
            names.append(f"blk.{i}.{leaf}.weight")
            if leaf in _BIASED:
                names.append(f"blk.{i}.{leaf}.bias")
    names += ["output_norm.weight", "output_norm.bias", "output.weight", "output.bias"]
    if getattr(src.config, "altup_inputs", 0):
        from ..models.gemma3n import global_names
        names += global_names(src.config)
    out = {n: src.tensor(n) for n in names}
    return {n: t for n, t in out.items() if t is not None}


def _permute_rows(t: WeightTensor, order: np.ndarray) -> WeightTensor:
    if len(t.shape) == 1:
        vals = t.to_float32().reshape(-1)[order]
        return WeightTensor.from_float(t.name, vals)
    rows = t.rows2d()[order]
    return WeightTensor(t.name, t.qtype, t.shape, np.ascontiguousarray(rows).reshape(-1))


def _convert(name: str, t: WeightTensor, qtype: QType, shift: float = 0.0) -> OutTensor:
    """`t` as `qtype` bytes, with `shift` added to every value (norm conventions)."""
    if t.qtype == qtype and not shift:
        return OutTensor(name, qtype, t.shape, t.data.reshape(-1))
    vals = t.to_float32().reshape(t.shape)
    if shift:
        vals = vals + np.float32(shift)
    return OutTensor(name, qtype, t.shape, quantize(vals, qtype).reshape(-1))


def _target_type(t: WeightTensor, want: QType | None, fmt: str, name: str = "") -> QType:
    if fmt == "gguf" and name.endswith(_F32_ONLY):
        return QType.F32
    if fmt == "gguf" and name.endswith(_FLOAT_ONLY):
        return t.qtype if t.qtype in FLOAT_TYPES.values() else QType.F32
    if fmt == "hf":
        if want is not None:
            return want
        return t.qtype if t.qtype in FLOAT_TYPES.values() else QType.F32
    # an MoE layer's expert biases are 2-D: floats too; so are per-head q/k norm weights (Cohere's (heads, head_dim))
    if len(t.shape) == 1 or name.endswith((".bias", "norm.weight")):
        return QType.F32 if want is not None or t.qtype not in FLOAT_TYPES.values() else t.qtype
    if want is None:
        return t.qtype
    if t.cols % TRAITS[want].block_size == 0:
        return want
    return t.qtype if t.qtype in FLOAT_TYPES.values() else QType.F16


def _layout_tensors(src: ModelSource, to_interleaved: bool | None) -> dict[str, WeightTensor]:
    """Source tensors with q/k rows moved to the target's RoPE layout (None: leave them)."""
    cfg = src.config
    tensors = source_tensors(src)
    if to_interleaved is None or to_interleaved == (not cfg.rope_neox):
        return tensors
    if cfg.qk_norm:
        raise ModelFormatError("cannot convert the q/k RoPE layout of a q/k-norm model")
    if any(n.endswith("attn_qkv.weight") for n in tensors):
        raise ModelFormatError("cannot convert the RoPE layout of fused qkv tensors")
    # only the rotated rows move (all of them but in Bamba's half-rotary heads)
    perm = {"attn_q": partial_rope_permutation(cfg.n_heads, cfg.head_dim, cfg.rope_dim, to_interleaved),
            "attn_k": partial_rope_permutation(cfg.n_kv_heads, cfg.head_dim, cfg.rope_dim, to_interleaved)}
    for name, t in tensors.items():
        leaf = name.split(".")[2] if name.startswith("blk.") else ""
        if leaf in perm:
            tensors[name] = _permute_rows(t, perm[leaf])
    return tensors


def _is_norm(name: str) -> bool:
    """A norm weight stored as applied in GGUF (a family's norm_offset added); a delta net's gated
    norm (ssm_norm) is plain w in every format."""
    return name.endswith("norm.weight") and not name.endswith("ssm_norm.weight")


# ---------------------------------------------------------------- RoPE scaling <-> rope_freqs

def _llama3_factors(cfg: TransformerConfig) -> np.ndarray:
    plain = TransformerConfig(**{**_cfg_dict(cfg), "rope_scaling": None}).inv_freq()
    return (plain.astype(np.float64) / cfg.inv_freq().astype(np.float64)).astype(np.float32)


def _fit_llama3(cfg: TransformerConfig, factors: np.ndarray) -> dict:
    """Llama 3 scaling parameters that reproduce a GGUF's rope_freqs, or an error.

    In the middle band a divisor r fixes smooth = (1/r - 1/factor) / (1 - 1/factor), and
    smooth = (orig / wavelen - low) / (high - low) then gives the original context length.
    """
    factor = float(factors.max())
    wavelen = 2 * np.pi / TransformerConfig(**{**_cfg_dict(cfg), "rope_scaling": None}).inv_freq().astype(np.float64)
    origs = {2 ** k for k in range(4, 21)}
    for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0)):
        for r, w in zip(factors.astype(np.float64), wavelen):
            if 1.0 + 1e-6 < r < factor * (1 - 1e-6):
                smooth = (1 / r - 1 / factor) / (1 - 1 / factor)
                origs.add(round(w * (smooth * (high - low) + low)))
    for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0)):
        for orig in sorted(origs):
            sc = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                  "original_max_position_embeddings": orig}
            trial = TransformerConfig(**{**_cfg_dict(cfg), "rope_scaling": sc})
            if np.allclose(_llama3_factors(trial), factors, rtol=1e-4):
                return sc
    raise ModelFormatError("the GGUF's rope_freqs.weight matches no Llama 3 RoPE scaling that config.json can express")


def _cfg_dict(cfg: TransformerConfig) -> dict:
    return {f.name: getattr(cfg, f.name) for f in fields(TransformerConfig)}    # a family's own fields left out


# ---------------------------------------------------------------- configuration round-trip check

_CHECKED = ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "rope_dim",
            "activation", "attn_bias", "qk_norm", "post_norms", "embed_scale", "attn_softcap", "final_softcap",
            "layer_sliding", "layer_rope", "pre_norms", "qk_norm_whole", "qk_norm_after_rope", "residual_scale",
            "logit_scale",
            "n_experts", "n_experts_used", "expert_ffn_dim", "moe_routing", "moe_norm_topk", "shared_ffn_dim",
            "shared_expert_gate", "moe_router_bias",
            "moe_activation", "moe_swiglu_alpha", "moe_swiglu_limit", "moe_bias", "attn_out_bias", "attn_sinks",
            "layer_kinds", "conv_kernel", "ssm_k_heads", "ssm_v_heads", "ssm_k_dim", "ssm_v_dim", "attn_out_gate",
            "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim", "moe_groups", "moe_groups_used", "moe_group_top",
            "moe_scale", "moe_layers", "rope_sections", "rope_interleaved", "deepstack_levels", "norm_kind", "norm_bias",
            "qk_norm_heads", "parallel_block", "ffn_gated", "ffn_bias", "parallel_ffn_norm", "output_bias",
            "attn_temp_scale", "attn_temp_length", "mamba_norm",
            "mamba_conv_bias", "ssm_inner", "ssm_dt_rank", "ssm_dt_b_c_norms")


def _check_same(a: TransformerConfig, b: TransformerConfig, what: str, a_factors=None, b_factors=None) -> None:
    """Raise unless config `b` (read back from what we wrote) runs the same model as `a`;
    `*_factors` are rope_freqs divisors that go with each side."""
    bad = [k for k in _CHECKED if getattr(a, k) != getattr(b, k)
           and not (isinstance(getattr(a, k), float) and math.isclose(getattr(a, k) or 0, getattr(b, k) or 0,
                                                                     rel_tol=1e-6))]
    if any(a.layer_sliding) and a.sliding_window != b.sliding_window:
        bad.append("sliding_window")
    if not math.isclose(a.scale(), b.scale(), rel_tol=1e-6):
        bad.append("attention scale")
    if not math.isclose(a.norm_eps, b.norm_eps, rel_tol=1e-6):
        bad.append("norm_eps")
    for sliding in set(a.layer_sliding):
        fa = a.inv_freq(sliding) / (1.0 if a_factors is None else a_factors)
        fb = b.inv_freq(sliding) / (1.0 if b_factors is None else b_factors)
        if not np.allclose(fa, fb, rtol=1e-5):
            bad.append("RoPE frequencies")
    if bad:
        raise ModelFormatError(f"{what} cannot express this model's {', '.join(sorted(set(bad)))}")


# ---------------------------------------------------------------- HF directory

def hf_config(cfg: TransformerConfig, fam: Family, dtype: str) -> dict:
    sliding = any(cfg.layer_sliding)
    out = {
        "architectures": [fam.hf_class],
        "model_type": fam.hf_model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.n_ctx_train,
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attn_bias,
        "torch_dtype": dtype,
        "sliding_window": cfg.sliding_window if sliding else None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in cfg.layer_sliding],
    }
    if cfg.rope_scaling:
        out["rope_scaling"] = {k: v for k, v in cfg.rope_scaling.items() if k not in ("rope_theta", "type")}
    if cfg.rope_sections:       # transformers 4's spelling, which 5 reads too
        out["rope_scaling"] = {**out.get("rope_scaling", {}), "type": "mrope", "mrope_section": list(cfg.rope_sections)}
    if cfg.activation == "gelu_tanh":
        out["hidden_activation"] = out["hidden_act"] = "gelu_pytorch_tanh"
    elif cfg.activation == "relu2":
        out["hidden_act"] = "relu2"
    else:
        out["hidden_act"] = "silu"
    if fam.hf_model_type in ("qwen2", "qwen3", "qwen2_5_vl"):
        first = cfg.layer_sliding.index(True) if sliding else cfg.n_layers
        out["use_sliding_window"] = sliding
        out["max_window_layers"] = first
    if cfg.rope_dim != cfg.head_dim:
        out["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim
    if fam.hf_norm_offset and fam.hf_model_type != "gemma":        # Gemma 2 and 3 (Gemma 1 has no such keys)
        qpas = cfg.scale() ** -2
        out["query_pre_attn_scalar"] = round(qpas) if abs(qpas - round(qpas)) < 1e-3 else qpas
        out["attn_logit_softcapping"] = cfg.attn_softcap or None
        out["final_logit_softcapping"] = cfg.final_softcap or None
        if cfg.rope_theta_local:
            out["rope_local_base_freq"] = cfg.rope_theta_local
        period = _global_layer_period(cfg.layer_sliding)
        if fam.hf_model_type == "gemma3_text" and period:
            out["sliding_window_pattern"] = period      # what transformers < 4.53 reads instead of layer_types
    if fam.hf_model_type == "smollm3":
        out["no_rope_layers"] = [int(r) for r in cfg.layer_rope]
    if fam.hf_model_type == "seed_oss":
        out["attention_out_bias"] = cfg.attn_out_bias
    if fam.hf_model_type == "granite":
        out.update(embedding_multiplier=cfg.embed_scale or 1.0, residual_multiplier=cfg.residual_scale,
                   attention_multiplier=cfg.scale(), logits_scaling=cfg.logit_scale)
    return out


def _global_layer_period(sliding: list[bool]) -> int | None:
    """p when exactly the layers i with (i + 1) % p == 0 are global, else None."""
    for p in range(1, len(sliding) + 2):
        if all(s == ((i + 1) % p != 0) for i, s in enumerate(sliding)):
            return p
    return None


def _hf_layer_names(post_norms: bool) -> dict[str, str]:
    """Canonical per-layer suffix -> HF suffix (fused Phi-3 names are chosen in _fuse_phi3)."""
    inverse = {canon: hf for hf, canon in reversed(layer_names(post_norms).items())}
    inverse["ffn_up.weight"] = "mlp.up_proj.weight"
    return inverse


def _fuse(parts: list[OutTensor], name: str) -> OutTensor:
    q = parts[0].qtype
    if any(p.qtype != q or p.shape[1:] != parts[0].shape[1:] for p in parts):
        raise ModelFormatError(f"cannot fuse {[p.name for p in parts]} into {name!r}: their types or widths differ")
    shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
    return OutTensor(name, q, shape, np.concatenate([p.raw for p in parts]))


def write_hf(src: ModelSource, out: Path, qtype: str | None = None) -> Path:
    from ..formats.safetensors import write_safetensors
    cfg = src.config
    fam = family_of(cfg)
    if cfg.n_experts or cfg.recurrent or cfg.mla or getattr(cfg, "altup_inputs", 0):
        raise LlambdaError("a mixture-of-experts, hybrid, latent-attention or Gemma 3n model exports as GGUF only "
                           "(fmt='gguf')")
    gguf_only = {"glm4": "GLM-4", "qwen3vl": "Qwen3-VL", "ernie4_5": "ERNIE 4.5", "apertus": "Apertus",
                 "hunyuan-dense": "Hunyuan", "mistral3": "Ministral 3"}
    if fam.gguf_arch in gguf_only:
        raise LlambdaError(f"a {gguf_only[fam.gguf_arch]} model exports as GGUF only (fmt='gguf')")
    if cfg.norm_kind != "rms":
        raise LlambdaError(f"a {fam.hf_class} model (LayerNorm) exports as GGUF only (fmt='gguf')")
    want = None
    if qtype is not None:      # "" is no type either (it once meant "keep the source's")
        if str(qtype).lower() not in FLOAT_TYPES:
            raise LlambdaError(f"a Hugging Face export stores f32, f16 or bf16, not {qtype!r}")
        want = FLOAT_TYPES[str(qtype).lower()]
    tensors = _layout_tensors(src, to_interleaved=False)
    rope_factors = tensors.pop("rope_freqs.weight", None)
    hf_cfg_cfg = cfg
    if rope_factors is not None:
        factors = rope_factors.to_float32().reshape(-1)
        if not np.allclose(factors, 1.0):
            hf_cfg_cfg = TransformerConfig(**{**_cfg_dict(cfg), "rope_scaling": _fit_llama3(cfg, factors)})
    # Whether the head is tied is what the file holds (a GGUF config says "tie if absent").
    hf_cfg_cfg = TransformerConfig(**{**_cfg_dict(hf_cfg_cfg), "tie_embeddings": "output.weight" not in tensors})
    shift_by = cfg.norm_offset - fam.hf_norm_offset
    canon_to_hf = {v: k for k, v in GLOBAL_NAMES.items()}
    layer_to_hf = _hf_layer_names(cfg.post_norms)
    written: dict[str, OutTensor] = {}
    dtypes = set()
    for name, t in tensors.items():
        qt = _target_type(t, want, "hf")
        dtypes.add(qt)
        o = _convert(name, t, qt, shift_by if _is_norm(name) else 0.0)
        if name.startswith("blk."):
            _, i, leaf = name.split(".", 2)
            o.name = f"model.layers.{i}.{layer_to_hf[leaf]}"
        else:
            o.name = canon_to_hf[name]
        written[name] = o
    if fam.hf_fused:
        _fuse_phi3(written, cfg)
    dtype = {QType.F32: "float32", QType.F16: "float16", QType.BF16: "bfloat16"}[
        want or (dtypes.pop() if len(dtypes) == 1 else QType.F32)]
    config = hf_config(hf_cfg_cfg, fam, dtype)
    tok, src_cfg = src.tokenizer, src.metadata.get("hf.config") or {}
    for key, attr in (("bos_token_id", "bos_id"), ("eos_token_id", "eos_id"), ("pad_token_id", "pad_id")):
        if key in src_cfg:
            config[key] = src_cfg[key]
        elif tok is not None and getattr(tok, attr, None) is not None:
            config[key] = int(getattr(tok, attr))
    check = arch_module(fam.hf_model_type).config_from_hf(config)
    _check_same(cfg, check, "config.json",
                a_factors=None if rope_factors is None else rope_factors.to_float32().reshape(-1))

    out.mkdir(parents=True, exist_ok=True)
    weights = {o.name: WeightTensor(o.name, o.qtype, tuple(o.shape), o.raw) for o in written.values()}
    write_safetensors(out / "model.safetensors", weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    _write_hf_tokenizer(src, out)
    return out


def _fuse_phi3(written: dict, cfg: TransformerConfig) -> None:
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        if p + "attn_q.weight" in written:
            parts = [written.pop(p + k) for k in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
            written[p + "attn_qkv.weight"] = _fuse(parts, f"model.layers.{i}.self_attn.qkv_proj.weight")
        up = written.get(p + "ffn_up.weight")
        if p + "ffn_gate.weight" in written:
            parts = [written.pop(p + "ffn_gate.weight"), written.pop(p + "ffn_up.weight")]
            written[p + "ffn_up.weight"] = _fuse(parts, f"model.layers.{i}.mlp.gate_up_proj.weight")
        elif up is not None:
            up.name = f"model.layers.{i}.mlp.gate_up_proj.weight"


def _write_hf_tokenizer(src: ModelSource, out: Path) -> None:
    if src.format == "hf":
        for f in HF_FILES:
            if (src.path / f).is_file() and src.path.resolve() != out.resolve():
                shutil.copyfile(src.path / f, out / f)
        return
    from .export_tokenizer import hf_tokenizer_json
    tok = src.tokenizer
    text = hf_tokenizer_json(tok) if tok is not None else None
    if text is None:
        return                      # nothing we can write; the directory still loads (ids only)
    (out / "tokenizer.json").write_text(text, encoding="utf-8")
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
          "add_bos_token": bool(getattr(tok, "add_bos", False))}
    for key, attr in (("bos_token", "bos_id"), ("eos_token", "eos_id")):
        tid = getattr(tok, attr, None)
        if tid is not None:
            tc[key] = tok.token_text(tid)
    if src.chat_template:
        tc["chat_template"] = src.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- GGUF

def gguf_metadata(cfg: TransformerConfig, arch: str, name: str) -> dict:
    a = arch
    sliding = any(cfg.layer_sliding)
    meta = {
        "general.architecture": a,
        "general.name": name,
        f"{a}.vocab_size": cfg.vocab_size,
        f"{a}.context_length": cfg.n_ctx_train,
        f"{a}.embedding_length": cfg.d_model,
        f"{a}.block_count": cfg.n_layers,
        f"{a}.feed_forward_length": cfg.ffn_dim,
        f"{a}.attention.head_count": cfg.n_heads,
        f"{a}.attention.head_count_kv": cfg.n_kv_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": cfg.norm_eps,
        f"{a}.rope.freq_base": cfg.rope_theta,
        f"{a}.rope.dimension_count": cfg.rope_dim,
    }
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type")
    if kind in ("linear", "yarn"):
        meta[f"{a}.rope.scaling.type"] = kind
        meta[f"{a}.rope.scaling.factor"] = float(sc["factor"])
    if kind == "yarn":
        meta[f"{a}.rope.scaling.original_context_length"] = int(sc["original_max_position_embeddings"])
        meta[f"{a}.rope.scaling.yarn_beta_fast"] = float(sc.get("beta_fast", 32.0))
        meta[f"{a}.rope.scaling.yarn_beta_slow"] = float(sc.get("beta_slow", 1.0))
    if sliding:
        meta[f"{a}.attention.sliding_window"] = cfg.sliding_window
        if not all(cfg.layer_sliding):
            meta[f"{a}.attention.sliding_window_pattern"] = list(cfg.layer_sliding)
    if cfg.rope_theta_local:
        meta[f"{a}.rope.freq_base_swa"] = cfg.rope_theta_local
    if cfg.attn_scale is not None:
        meta[f"{a}.attention.scale"] = float(cfg.attn_scale)
    if cfg.attn_softcap:
        meta[f"{a}.attn_logit_softcapping"] = cfg.attn_softcap
    if cfg.final_softcap:
        meta[f"{a}.final_logit_softcapping"] = cfg.final_softcap
    if cfg.n_experts:
        meta.update({f"{a}.expert_count": cfg.n_experts, f"{a}.expert_used_count": cfg.n_experts_used,
                     f"{a}.expert_feed_forward_length": cfg.expert_ffn_dim,
                     f"{a}.expert_weights_norm": bool(cfg.moe_norm_topk)})
        if cfg.shared_ffn_dim:
            meta[f"{a}.expert_shared_feed_forward_length"] = cfg.shared_ffn_dim
        lead = cfg.moe_layers.index(True) if any(cfg.moe_layers) else cfg.n_layers
        if lead and all(cfg.moe_layers[lead:]):
            meta[f"{a}.leading_dense_block_count"] = lead
    if a in ("granite", "granitemoe", "granitehybrid"):      # llama.cpp's keys for Granite's multipliers
        meta.update({f"{a}.embedding_scale": float(cfg.embed_scale or 1.0), f"{a}.residual_scale": cfg.residual_scale,
                     f"{a}.logit_scale": cfg.logit_scale})
    meta.update(_hybrid_metadata(cfg, a))
    meta.update(_mla_metadata(cfg, a))
    meta.update(getattr(arch_module(a), "gguf_metadata", lambda c: {})(cfg))    # a family's own keys (glm4moe)
    return meta


def _mla_metadata(cfg: TransformerConfig, a: str) -> dict:
    """llama.cpp's deepseek2 keys as its converter writes them now (its MLA layout: one kv head of the
    compressed kv and the rope key, the expanded heads' sizes under *_mla); the softmax scale's YaRN mscale
    as yarn_log_multiplier; the routing (gating function, groups, scale, shared experts as a count)."""
    if not cfg.mla:
        return {}
    meta = {f"{a}.attention.head_count_kv": 1, f"{a}.attention.key_length": cfg.kv_lora_rank + cfg.rope_dim,
            f"{a}.attention.value_length": cfg.kv_lora_rank, f"{a}.attention.key_length_mla": cfg.head_dim,
            f"{a}.attention.value_length_mla": cfg.v_head_dim, f"{a}.attention.kv_lora_rank": cfg.kv_lora_rank}
    if cfg.q_lora_rank:
        meta[f"{a}.attention.q_lora_rank"] = cfg.q_lora_rank
    sc = cfg.rope_scaling or {}
    if sc and float(sc["factor"]) > 1:
        mscale = math.sqrt(cfg.attn_scale * math.sqrt(cfg.head_dim))
        meta[f"{a}.rope.scaling.yarn_log_multiplier"] = (mscale - 1.0) / math.log(float(sc["factor"]))
    if cfg.n_experts:
        if cfg.shared_ffn_dim % cfg.expert_ffn_dim:
            raise ModelFormatError("GGUF 'deepseek2' counts shared experts: a shared expert of "
                                   f"{cfg.shared_ffn_dim} is not a multiple of the experts' {cfg.expert_ffn_dim}")
        meta.update({f"{a}.expert_shared_count": cfg.shared_ffn_dim // cfg.expert_ffn_dim,
                     f"{a}.expert_weights_scale": float(cfg.moe_scale),
                     f"{a}.expert_gating_func": 2 if cfg.moe_routing == "sigmoid_topk" else 1})
        if cfg.moe_groups > 1:
            meta.update({f"{a}.expert_group_count": cfg.moe_groups, f"{a}.expert_group_used_count": cfg.moe_groups_used})
    return meta


def _hybrid_metadata(cfg: TransformerConfig, a: str) -> dict:
    """llama.cpp's keys for a hybrid model's layers: LFM2's per-layer kv head counts (0: a conv layer)
    and conv width; Qwen3-Next's delta-net sizes and attention interval."""
    per_layer_kv = {f"{a}.attention.head_count_kv": [cfg.n_kv_heads if k == "attention" else 0 for k in cfg.layer_kinds]}
    if "shortconv" in cfg.layer_kinds:
        return {**per_layer_kv, f"{a}.shortconv.l_cache": cfg.conv_kernel}
    ssm = {f"{a}.ssm.conv_kernel": cfg.conv_kernel, f"{a}.ssm.state_size": cfg.ssm_k_dim,
           f"{a}.ssm.group_count": cfg.ssm_k_heads, f"{a}.ssm.time_step_rank": cfg.ssm_v_heads,
           f"{a}.ssm.inner_size": cfg.ssm_v_heads * cfg.ssm_v_dim}
    if a == "granitehybrid":       # RoPE on or off for every attention layer (llama.cpp's switch for Granite)
        if len(set(cfg.layer_rope)) > 1:
            raise ModelFormatError("GGUF 'granitehybrid' turns RoPE on or off for every layer at once")
        dense = {} if cfg.n_experts else {f"{a}.expert_shared_feed_forward_length": cfg.ffn_dim}
        return {**per_layer_kv, **ssm, **dense, f"{a}.rope.scaling.finetuned": bool(cfg.layer_rope[0])}
    if "deltanet" not in cfg.layer_kinds:
        return {}
    every = cfg.layer_kinds.index("attention") + 1 if "attention" in cfg.layer_kinds else cfg.n_layers + 1
    if cfg.layer_kinds != ["attention" if (i + 1) % every == 0 else "deltanet" for i in range(cfg.n_layers)]:
        raise ModelFormatError("GGUF cannot express these layer kinds (every n-th layer attention only)")
    return {**ssm, f"{a}.full_attention_interval": every}


def _hybrid_tensors(cfg: TransformerConfig, tensors: dict) -> dict:
    """A delta net's tensors as llama.cpp's converter writes them: in_proj_qkvz regrouped into attn_qkv
    (q, k, v heads) and attn_gate (z), ssm_a = -exp(A_log) (named without `.weight`), convolution kernels
    as (channels, L); Mamba2's ssm_a and ssm_d as (H, 1) columns, its norm as (groups, H P / groups) rows."""
    from ..models.row_groups import grouped_rows
    hk, hv, dk, dv = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim
    out = {}
    for name, t in tensors.items():
        leaf = name.split(".", 2)[2] if name.startswith("blk.") else ""
        p = name[:-len(leaf)]
        mamba = any(k in cfg.layer_kinds for k in MAMBA2_KINDS)
        if mamba and leaf in ("ssm_a_log.weight", "ssm_a.weight", "ssm_d.weight"):
            v = t.to_float32().reshape(-1, 1)
            out[p + leaf.split(".")[0].replace("_log", "")] = WeightTensor.from_float(
                p + leaf, negated_exp(v, repr(t.name)) if leaf == "ssm_a_log.weight" else v)
        elif mamba and leaf == "ssm_norm.weight":
            out[name] = WeightTensor.from_float(name, t.to_float32().reshape(hk, -1))
        elif leaf == "ssm_in.weight" and "deltanet" in cfg.layer_kinds:   # Mamba's in_proj is written as read
            q, k, v, z = grouped_rows(hk, [dk, dk, hv // hk * dv, hv // hk * dv])
            out[p + "attn_qkv.weight"] = t.take_rows(np.concatenate([q, k, v]))
            out[p + "attn_gate.weight"] = t.take_rows(z)
        elif leaf == "ssm_a_log.weight":      # (Mamba 1's is (d_inner, d_state): its shape kept)
            out[p + "ssm_a"] = WeightTensor.from_float(p + "ssm_a", negated_exp(t.to_float32().reshape(t.shape),
                                                                                  repr(t.name)))
        elif leaf == "ssm_a.weight" or (leaf == "ssm_d.weight" and "mamba" in cfg.layer_kinds):
            out[p + leaf.split(".")[0]] = t       # llama.cpp names them without the suffix (Mamba 1's D too)
        elif leaf in ("ssm_conv1d.weight", "shortconv.conv.weight") and len(t.shape) == 3:
            out[name] = WeightTensor(t.name, t.qtype, (t.shape[0], t.shape[-1]), t.data)
        else:
            out[name] = t
    return out


def _mla_tensors(cfg: TransformerConfig, tensors: dict) -> dict:
    """Latent attention's kv_b as llama.cpp's converter splits it: per head attn_k_b (kv_lora x qk_nope, the
    k rows transposed) and attn_v_b (v x kv_lora), from float32 (a transposed block cannot keep its type)."""
    if not cfg.mla:
        return tensors
    H, nope, vd, r = cfg.n_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    out = {}
    for name, t in tensors.items():
        if not name.endswith(".attn_kv_b.weight"):
            out[name] = t
            continue
        p = name[:-len("attn_kv_b.weight")]
        kv = t.to_float32().reshape(H, nope + vd, r)
        out[p + "attn_k_b.weight"] = WeightTensor.from_float(p + "attn_k_b.weight", kv[:, :nope].transpose(0, 2, 1))
        out[p + "attn_v_b.weight"] = WeightTensor.from_float(p + "attn_v_b.weight", kv[:, nope:])
    return out


def write_gguf_file(src: ModelSource, out: Path, qtype: str | None = None, pure: bool = False,
                    progress: bool | None = None) -> Path:
    """`qtype` is a file type (quant_mix.file_type: one type, or a mix such as q4_k_m); `progress`
    shows a bar on stderr (default: when stderr is a terminal)."""
    from ..formats.gguf_writer import write_gguf
    cfg = src.config
    fam = family_of(cfg)
    arch = fam.gguf_arch
    # `quantize IN OUT ""` once wrote the source's types and reported success: "" is no type
    ftype = file_type(qtype, pure) if qtype is not None else None
    # (glm4 with M-RoPE sections, GLM-4.1V's: llama.cpp's M-RoPE turns half-split rows, its converter permutes them)
    same_layout = arch in SAME_ROPE_LAYOUT_ARCHS and not cfg.rope_sections
    tensors = _mla_tensors(cfg, _hybrid_tensors(cfg, _layout_tensors(src, to_interleaved=None if same_layout else
                                                                     arch in PERMUTED_GGUF_ARCHS)))
    meta = gguf_metadata(cfg, arch, src.name or src.path.stem)
    as_keys = getattr(arch_module(arch), "gguf_export_tensors", None)    # tensors llama.cpp keeps as keys (Apertus')
    if as_keys is not None:
        tensors, keys = as_keys(cfg, tensors)
        meta.update(keys)
    if getattr(cfg, "altup_inputs", 0):     # (its keys came with gguf_metadata's family hook)
        from ..models.gemma3n import gguf_tensors
        tensors = gguf_tensors(cfg, tensors)
    kind = (cfg.rope_scaling or {}).get("rope_type") or (cfg.rope_scaling or {}).get("type")
    if kind == "llama3":
        tensors["rope_freqs.weight"] = WeightTensor.from_float("rope_freqs.weight", _llama3_factors(cfg))
    meta.update(_gguf_tokenizer_metadata(src))
    types = _gguf_metadata_types(src)

    check = arch_module(arch).config_from_gguf(meta)
    biases_from_tensors(check, tensors)
    src_rf = src.tensor("rope_freqs.weight")
    out_rf = tensors.get("rope_freqs.weight")
    _check_same(cfg, check, f"GGUF {arch!r}",
                a_factors=None if src_rf is None else src_rf.to_float32().reshape(-1),
                b_factors=None if out_rf is None else out_rf.to_float32().reshape(-1))
    if check.rope_neox != (cfg.rope_neox if same_layout else arch not in PERMUTED_GGUF_ARCHS):
        raise ModelFormatError(f"GGUF {arch!r}: RoPE layout mismatch")

    shift_by = cfg.norm_offset          # GGUF norms hold the weights as applied
    renamed = getattr(arch_module(arch), "GGUF_NAMES", {})
    chosen, fallbacks, targets = {}, {}, {}
    if ftype is not None:
        chosen = tensor_types(ftype, {n: t.shape for n, t in tensors.items()}, cfg.n_layers,
                              cfg.n_heads // max(1, cfg.n_kv_heads), n_experts=cfg.n_experts, fallbacks=fallbacks)
        if ftype.name in FILE_TYPE_IDS:       # llama.cpp's id; a pure K-quant file has none of its own
            meta["general.file_type"] = FILE_TYPE_IDS[ftype.name]
    items = []
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=sum(t.data.size for t in tensors.values()), desc="quantize" if ftype else "convert", unit="B",
              unit_scale=True, unit_divisor=1024, disable=not show, file=sys.stderr, leave=True) as bar:
        for name, t in tensors.items():
            target = targets[name] = _target_type(t, chosen.get(name), "gguf", name)
            bar.set_postfix_str(f"{name} -> {target.name}", refresh=False)
            o = _convert(name, t, target, shift_by if _is_norm(name) else 0.0)
            if name.startswith("blk.") and name.split(".", 2)[2] in renamed:
                i, leaf = name.split(".", 2)[1:]
                o.name = name = f"blk.{i}.{renamed[leaf]}"
            elif name in renamed:        # a global name of its own (LFM2's final norm: token_embd_norm)
                o.name = name = renamed[name]
            if name.endswith("ffn_gate_inp_shexp.weight"):
                o.shape = (t.rows * t.cols,)      # llama.cpp's shape: one vector of d_model
            items.append((name, o.qtype, o.raw, tuple(o.shape)))
            bar.update(t.data.size)
    note = fallback_note({n: fb for n, fb in fallbacks.items() if targets.get(n) == fb[1]}, f"quantize to {ftype.name}"
                         if ftype is not None else "")
    if note:
        warnings.warn(note, LlambdaWarning, stacklevel=3)
    if any(q not in (QType.F32, QType.F16, QType.BF16) for _, q, _, _ in items):
        meta["general.quantization_version"] = 2
    out.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(out, meta, items, metadata_types=types)
    return out


def _gguf_tokenizer_metadata(src: ModelSource) -> dict:
    """The tokenizer.* keys to write; a model without a vocabulary says so as llama.cpp's converter does
    (tokenizer.ggml.model "none"), as llama.cpp will not load a file without that key."""
    if src.format == "gguf":
        meta = {k: v for k, v in src.metadata.items() if k.startswith("tokenizer.")}
        if meta.get("tokenizer.ggml.pre") == "gpt2":      # our older exports' name, unknown to llama.cpp
            meta["tokenizer.ggml.pre"] = "gpt-2"
    elif src.tokenizer is None:
        meta = {}
    else:
        from .export_tokenizer import gguf_tokenizer_metadata
        meta = gguf_tokenizer_metadata(src.path, src.tokenizer, src.chat_template)
    if "tokenizer.ggml.model" not in meta and "tokenizer.ggml.tokens" not in meta:
        meta["tokenizer.ggml.model"] = "none"
    return meta


def _gguf_metadata_types(src: ModelSource) -> dict:
    """The source GGUF's value types for the keys we copy (ids UINT32), but for those llama.cpp reads in
    one type only (gguf_writer.LLAMA_CPP_TYPES), which get that type whatever the source had."""
    if src.format != "gguf":
        return {}
    from ..formats.gguf import GGUFFile
    from ..formats.gguf_writer import LLAMA_CPP_TYPES
    with GGUFFile(src.path) as f:
        return {k: v for k, v in f.metadata_types.items() if k.startswith("tokenizer.") and k not in LLAMA_CPP_TYPES}


# ---------------------------------------------------------------- entry point

def _check_output(out: Path, fmt: str, source: Path | None = None) -> None:
    """Refuse an output that cannot be written before converting (minutes for a large model): the write
    comes last, and once failed there with a raw IsADirectoryError after all the work."""
    try:
        same = source is not None and out.exists() and os.path.samefile(out, source)
    except OSError:
        same = False
    if same:
        # `quantize m.gguf m.gguf q4_0` replaced the model it read (a catalogued file too, which then
        # failed its hash and was fetched again)
        raise LlambdaError(f"{out} is the model being read: write the output to another "
                           f"{'file' if fmt == 'gguf' else 'directory'}")
    if fmt == "gguf" and out.is_dir():
        raise LlambdaError(f"{out} is a directory: a GGUF export writes one file")
    # the file is renamed into place: `--out /dev/null` (or /dev/stdout) as root replaced the device
    # (or the system's link to it) with a regular file
    if fmt == "gguf" and out.exists() and not out.is_file():
        raise LlambdaError(f"{out} is not a regular file (a device, FIFO or socket): a GGUF export writes "
                           "a file of its own, it cannot stream into one")
    if fmt == "hf" and out.exists() and not out.is_dir():
        raise LlambdaError(f"{out} exists and is not a directory: a Hugging Face export writes a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LlambdaError(f"cannot create the directory of {out}: {e.strerror or e}") from None
    if not os.access(out.parent, os.W_OK):
        raise LlambdaError(f"cannot write {out}: its directory is not writable")


def export(model, out: str | os.PathLike, fmt: str = "gguf", qtype: str | None = None, pure: bool = False,
           progress: bool | None = None) -> Path:
    """Write `model` (a catalogued name, a path, an opened ModelSource or a loaded llambda Model)
    to `out` as `fmt` "hf" (a directory) or "gguf" (a file); `qtype` picks the tensor type (for
    GGUF also a mix such as q4_k_m; `pure` puts every matrix in the mix's default type)."""
    out = Path(out)
    own = False
    if isinstance(model, ModelSource):
        src = model
    elif hasattr(model, "source") and isinstance(model.source, ModelSource):
        src = model.source
    else:
        src, own = open_named(model)[1], True
    try:
        _check_output(out, fmt, getattr(src, "path", None))
        if fmt == "hf":
            return write_hf(src, out, qtype)
        if fmt == "gguf":
            return write_gguf_file(src, out, qtype, pure=pure, progress=progress)
        raise LlambdaError(f"unknown export format {fmt!r} (hf or gguf)")
    except OSError as e:       # the source is open: this is the write (e.g. a read-only file system)
        raise LlambdaError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        if own:
            src.close()

"""GPT-OSS (gpt-oss-20b, -120b): every MLP an MoE whose router has a bias and takes the softmax of
its top-k logits, experts with biases and a clamped SwiGLU ((up + 1) * gate * sigmoid(1.702 gate));
attention with q/k/v/o biases, a learned sink logit per head, sliding and full layers alternating,
YaRN RoPE. The Hub's fused, interleaved expert tensors are split at load (formats/experts.py), and
the Hub's MXFP4 expert blocks repacked into ggml's MXFP4 blocks, not dequantized."""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .gemma2 import _gguf_layer_sliding
from .hparams import GGUFHParams, HFConfig
from .mistral import hf_layer_sliding
from .moe import gguf_moe, hf_moe

# llama.cpp's GPT-OSS files call the norm before the MLP `post_attention_norm` (canonical -> file name)
GGUF_NAMES = {"ffn_norm.weight": "post_attention_norm.weight"}

# llama.cpp keeps these fixed for GPT-OSS (no GGUF keys): the clamped SwiGLU's
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "gpt-oss")
    c = hp.common()
    if c["rope_scaling"] and c["rope_scaling"]["rope_type"] == "yarn":
        # GPT-OSS's own config sets truncate false (no rounding of the ramp's ends); llama.cpp rounds,
        # which moves logits of the tiny reference by up to 3: we follow the model, not llama.cpp
        c["rope_scaling"]["truncate"] = False
    n = c["n_layers"]
    window = hp.int("attention.sliding_window", 0, "sliding_window")
    # a bool per layer (a list of another length, or of strings, fell back to alternating unsaid), or
    # sliding, full, sliding, ... as the released models
    flags = _gguf_layer_sliding(hp, n)
    return TransformerConfig(**c, rope_neox=True, attn_bias=True, attn_out_bias=True, attn_sinks=True,
                             sliding_window=window, layer_sliding=flags if window else [False] * n,
                             moe_routing="topk_softmax", moe_activation="swiglu_oai", moe_swiglu_alpha=SWIGLU_ALPHA,
                             moe_swiglu_limit=SWIGLU_LIMIT, moe_bias=True, moe_router_bias=True,
                             **gguf_moe(hp, norm_default=True))


def config_from_hf(cfg: dict) -> TransformerConfig:
    hf = HFConfig(cfg)
    quant = cfg.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if quant and method != "mxfp4":
        raise ModelFormatError(f"GPT-OSS quantization_config {method!r} is not supported (the Hub's mxfp4 experts "
                               "are, and float checkpoints)")
    c = hf.common("gpt_oss")
    window, flags = hf_layer_sliding(cfg, c["n_layers"], default_sliding=False)
    moe = hf_moe({**cfg, "mlp_only_layers": [], "decoder_sparse_step": 1}, c["n_layers"], norm_default=True,
                 count_keys=("num_local_experts",), expert_ffn_key="intermediate_size")
    return TransformerConfig(**c, attn_bias=True, attn_out_bias=True, attn_sinks=True, sliding_window=window,
                             layer_sliding=flags, moe_routing="topk_softmax", moe_activation="swiglu_oai",
                             moe_swiglu_alpha=hf.get("swiglu_alpha", SWIGLU_ALPHA, float, "positive"),
                             moe_swiglu_limit=hf.get("swiglu_limit", SWIGLU_LIMIT, float, "positive"), moe_bias=True,
                             moe_router_bias=True,
                             **moe)

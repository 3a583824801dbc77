"""OLMoE (HF OlmoeForCausalLM; llama.cpp's `olmoe`): pre-norm attention with q/k RMSNorms over the WHOLE q and
k projections (OLMo 2's kind, before RoPE, half-split in both formats), and an MoE MLP on every layer: SiLU-gated
experts of `intermediate_size`, the top k of a softmax over all router logits, renormalised only when
`norm_topk_prob` (false by default; llama.cpp never renormalises an olmoe file, and reads no key for it).

`clip_qkv` (q, k and v clamped to +-clip) is refused when set: no released OLMoE sets it.
GGUF: `olmoe.feed_forward_length` is the experts' width (llama.cpp's converter writes no
expert_feed_forward_length); our export writes `olmoe.expert_weights_norm` when it is true, which llama.cpp ignores.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .moe import gguf_moe, hf_moe

_SHAPE = dict(qk_norm=True, qk_norm_whole=True, moe_routing="softmax_topk")


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "olmoe")
    moe = gguf_moe(hp, norm_default=False)
    if not moe:
        raise ModelFormatError("GGUF metadata 'olmoe.expert_count' is missing or 0: every OLMoE layer is MoE")
    return TransformerConfig(**hp.common(), rope_neox=True, **_SHAPE, **moe)


def config_from_hf(cfg: dict) -> TransformerConfig:
    hf = HFConfig(cfg)
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ModelFormatError(f"config.json hidden_act {act!r} is not supported for OLMoE (silu)")
    if cfg.get("clip_qkv") is not None:
        raise ModelFormatError(f"config.json 'clip_qkv' = {cfg['clip_qkv']!r}: clamping q, k and v is not supported")
    c = hf.common("olmoe")
    moe = hf_moe(cfg, c["n_layers"], norm_default=False, expert_ffn_key="intermediate_size")
    if not moe["n_experts"]:
        raise ModelFormatError("config.json 'num_experts' is 0: every OLMoE layer is MoE")
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False), **_SHAPE, **moe)

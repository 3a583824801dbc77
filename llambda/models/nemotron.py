"""Nemotron (HF NemotronForCausalLM: Nemotron-3/4, Minitron, Nemotron-Mini; llama.cpp `nemotron`): Llama's
sequential pre-norm block with LayerNorm1P norms, (x - mean) / std * (1 + w) + b (HF stores w, GGUF 1 + w as
llama.cpp's converter writes it), RoPE on the first `partial_rotary_factor` (default 0.5) of each head
(half-split pairs within them), an MLP without a gate, down(relu(up(x))^2), and an untied head. Biases where
config.json says so (`attention_bias`: q/k/v/o; `mlp_bias`: up/down) or a GGUF holds them.

The norm epsilon is `norm_eps` / `nemotron.attention.layer_norm_epsilon`; head_dim may be explicit.
"""
from __future__ import annotations

from .config import TransformerConfig
from .hparams import HFConfig, refuse_quantized
from .layernorm_models import FINAL_NORM_BIAS, NORM_BIAS_NAMES, bias_flags, eps_metadata, gguf_config, hf_activation
from .qwen3next import partial_rope_dim

HF_LAYER_NAMES = {**NORM_BIAS_NAMES, "mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias"}
HF_GLOBAL_NAMES = FINAL_NORM_BIAS
SHAPE = dict(norm_kind="layer", norm_bias=True, activation="relu2", rope_neox=True)


gguf_flags = bias_flags        # the biases a GGUF holds (llama.cpp: optional)


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, "nemotron")


def config_from_gguf(meta: dict) -> TransformerConfig:     # GGUF norms hold 1 + w
    return gguf_config(meta, "nemotron", **SHAPE, tie_embeddings=False)


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Nemotron")
    hf_activation(cfg, ("relu2",), "Nemotron")
    hf = HFConfig(cfg)
    c = hf.common("nemotron")
    bias = hf.flag("attention_bias", False)
    c.update(norm_eps=hf.get("norm_eps", 1e-5, float, "norm_eps"), tie_embeddings=hf.flag("tie_word_embeddings", False),
             rope_dim=partial_rope_dim(cfg, c["head_dim"], 0.5))
    return TransformerConfig(**c, **{k: v for k, v in SHAPE.items() if k != "rope_neox"}, norm_offset=1.0,
                             attn_bias=bias, attn_out_bias=bias, ffn_bias=hf.flag("mlp_bias", False))

"""StarCoder2 (HF Starcoder2ForCausalLM; llama.cpp `starcoder2`): pre-norm blocks with LayerNorms WITH bias
(the final norm too), biases on q/k/v and o_proj and on the MLP, an MLP without a gate (c_fc -> GELU (tanh
approximation) -> c_proj), half-split RoPE, a sliding window on every layer.

Biases: config.json's `use_bias` (default true) puts them on every projection; a GGUF is read by its tensors
(llama.cpp requires them). The norm epsilon is `norm_epsilon` / `{arch}.attention.layer_norm_epsilon`.
Window: transformers applies `sliding_window` to every layer; llama.cpp's starcoder2 has none and its
converter writes none. Our exports write `{arch}.attention.sliding_window` and we read it where a file has it
(llama.cpp then runs such a file without the window: the same logits up to that length only).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized

HF_LAYER_NAMES = {
    "input_layernorm.bias": "attn_norm.bias",
    "post_attention_layernorm.bias": "ffn_norm.bias",
    "mlp.c_fc.weight": "ffn_up.weight",
    "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight",
    "mlp.c_proj.bias": "ffn_down.bias",
}
HF_GLOBAL_NAMES = {"model.norm.bias": "output_norm.bias"}
# transformers' activations that are GELU's tanh approximation
TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new")
SHAPE = dict(norm_kind="layer", norm_bias=True, ffn_gated=False, activation="gelu_tanh", rope_neox=True)


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """The biases a GGUF holds (no key says so)."""
    if any(n.endswith("attn_output.bias") for n in names):
        cfg.attn_out_bias = True
    if any(n.endswith("ffn_up.bias") for n in names):
        cfg.ffn_bias = True


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return {"starcoder2.attention.layer_norm_epsilon": cfg.norm_eps}


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "starcoder2")
    c = hp.common()
    c.update(SHAPE, norm_eps=hp.float("attention.layer_norm_epsilon", limit="norm_eps"))
    return TransformerConfig(**c, sliding_window=hp.int("attention.sliding_window", 0, "sliding_window"))


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "StarCoder2")
    act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in TANH_GELUS:
        raise ModelFormatError(f"config.json hidden_act {act!r} is not supported for StarCoder2 "
                               f"({', '.join(TANH_GELUS)})"[:200])
    hf = HFConfig(cfg)
    c = hf.common("starcoder2")
    bias = hf.flag("use_bias", True)
    c.update(SHAPE, norm_eps=hf.get("norm_epsilon", 1e-5, float, "norm_eps"),
             tie_embeddings=hf.flag("tie_word_embeddings", True))
    return TransformerConfig(**c, attn_bias=bias, attn_out_bias=bias, ffn_bias=bias,
                             sliding_window=hf.window())

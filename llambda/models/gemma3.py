"""Gemma 3 (text): q/k norms, post-attention and post-FFN norms, GELU-tanh,
embeddings scaled by sqrt(d_model), sliding-window layers with their own RoPE base."""
from __future__ import annotations

import math

from .config import TransformerConfig
from .gemma2 import _gguf_attn_scale, _gguf_layer_sliding, check_hf_activation
from .hparams import GGUFHParams, HFConfig, hf_sliding_flags

# llama.cpp stores neither of these for Gemma 3: every 6th layer is global, local layers use base 10000.
# (Files we write carry them, under the keys llama.cpp uses for other architectures.)
_GGUF_PATTERN = 6
_LOCAL_THETA = 10000.0
_GGUF_27B_LAYERS = 62


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "gemma3")
    c = hp.common()
    n = c["n_layers"]
    meta = dict(meta)
    meta.setdefault("gemma3.attention.sliding_window_pattern", _GGUF_PATTERN)
    return TransformerConfig(
        **c, rope_neox=True, activation="gelu_tanh", qk_norm=True, post_norms=True,
        embed_scale=math.sqrt(c["d_model"]),
        sliding_window=hp.int("attention.sliding_window", 512, "sliding_window"),
        layer_sliding=_gguf_layer_sliding(GGUFHParams(meta, "gemma3"), n),
        rope_theta_local=hp.float("rope.freq_base_swa", _LOCAL_THETA, "rope_theta_local"),
        attn_scale=_gguf_attn_scale(hp, c, _GGUF_27B_LAYERS),
        attn_softcap=hp.float("attn_logit_softcapping", 0.0, "attn_softcap"),
        final_softcap=hp.float("final_logit_softcapping", 0.0, "final_softcap"),
    )


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_activation(cfg)
    hf = HFConfig(cfg)
    c = hf.common("gemma3")
    n = c["n_layers"]
    flags = hf_sliding_flags(cfg.get("layer_types"), n)
    if flags is None:
        key = "sliding_window_pattern" if cfg.get("sliding_window_pattern") is not None else "_sliding_window_pattern"
        pattern = hf.get(key, _GGUF_PATTERN, int, "window_pattern")
        flags = [(i + 1) % pattern != 0 for i in range(n)]       # every pattern-th layer is global
    c["rope_theta"], c["rope_scaling"] = hf.rope("full_attention")
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        local_theta, _ = hf.rope("sliding_attention")          # transformers 5
    else:
        local_theta = hf.get("rope_local_base_freq", _LOCAL_THETA, float, "rope_theta_local")   # transformers 4
    c["tie_embeddings"] = hf.flag("tie_word_embeddings", True)
    return TransformerConfig(
        **c, activation="gelu_tanh", qk_norm=True, post_norms=True, norm_offset=1.0,
        embed_scale=math.sqrt(c["d_model"]),
        sliding_window=hf.window(),
        layer_sliding=flags,
        rope_theta_local=local_theta,
        attn_scale=hf.get("query_pre_attn_scalar", c["head_dim"], float, "positive") ** -0.5,
        attn_softcap=hf.get("attn_logit_softcapping", 0.0, float, "attn_softcap"),
        final_softcap=hf.get("final_logit_softcapping", 0.0, float, "final_softcap"),
    )

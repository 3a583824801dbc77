"""Tencent Hunyuan dense (HF HunYuanDenseV1ForCausalLM, 0.5B-7B; llama.cpp's `hunyuan-dense`): Llama's
pre-norm layout with per-head q/k RMSNorms (`query_layernorm`, `key_layernorm`) applied AFTER RoPE, and NTK-aware
RoPE scaling with a fixed `alpha`: config.json says rope_type "dynamic" with an `alpha`, and transformers then
rotates with the base theta * alpha^(d / (d - 2)), d = head_dim, whatever the sequence length (its ntk_alpha).
That is a plain RoPE base, and llama.cpp's converter writes it so (rope.freq_base already scaled, no scaling
type): this reader folds the alpha into rope_theta, and both formats hold one model. A GGUF that carries
`hunyuan-dense.rope.scaling.alpha` beside an unscaled base has it applied at load, as llama.cpp applies it. A "dynamic" scaling without
an alpha (one that changes with the sequence length) is refused. Attention biases (q/k/v and o_proj) where
`attention_bias` says so. The q/k rows stay in HF's half-split order (llama.cpp's NEOX rope).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig, check_number
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp

ARCH = "hunyuan-dense"
_SHAPE = dict(qk_norm=True, qk_norm_after_rope=True, rope_neox=True)
HF_LAYER_NAMES = {
    "self_attn.query_layernorm.weight": "attn_q_norm.weight",
    "self_attn.key_layernorm.weight": "attn_k_norm.weight",
}


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, ARCH)
    c = hp.common()
    key = f"{ARCH}.rope.scaling.alpha"
    if key in meta and hp.float("rope.scaling.alpha", limit="any") != 0:     # 0: none, as llama.cpp reads it
        c["rope_theta"] = folded_theta(c["rope_theta"], meta[key], c["head_dim"], f"GGUF metadata {key!r}")
    return TransformerConfig(**c, **_SHAPE)


def folded_theta(theta: float, alpha, head_dim: int, what: str = "config.json rope alpha") -> float:
    """NTK-aware alpha scaling's RoPE base: theta * alpha^(d / (d - 2))."""
    alpha = check_number(what, alpha, "positive")
    if head_dim <= 2:
        raise ModelFormatError(f"NTK alpha RoPE scaling needs heads wider than 2 dims, got head_dim {head_dim}")
    try:
        base = theta * alpha ** (head_dim / (head_dim - 2))
    except OverflowError:
        base = float("inf")
    return check_number(f"the RoPE base theta * alpha^(d/(d-2)) (alpha {alpha})", base, "rope_theta")


def _rope_settings(cfg: dict) -> tuple[dict | None, object]:
    """(the scaling dict of config.json, its alpha or None) in either spelling: transformers 5's
    `rope_parameters`, or 4's `rope_scaling` (with `rope_theta` beside it)."""
    for key in ("rope_parameters", "rope_scaling"):
        sc = cfg.get(key)
        if isinstance(sc, dict) and (sc.get("rope_type") or sc.get("type")) == "dynamic":
            return sc, sc.get("alpha")
    return None, None


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    sc, alpha = _rope_settings(cfg)
    plain = dict(cfg)
    if sc is not None:
        if alpha is None:
            raise ModelFormatError("config.json RoPE scaling 'dynamic' without an 'alpha' (NTK scaling that changes "
                                   "with the sequence length) is not supported")
        theta = HFConfig(cfg).check("config.json rope_theta", sc.get("rope_theta", cfg.get("rope_theta", 10000.0)),
                                    float, "rope_theta")
        plain.pop("rope_scaling", None)
        plain["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    hf = HFConfig(plain)
    c = hf.common(ARCH)
    if sc is not None:
        c["rope_theta"] = folded_theta(c["rope_theta"], alpha, c["head_dim"])
    c["norm_eps"] = hf.get("rms_norm_eps", 1e-5, float, "norm_eps")
    bias = hf.flag("attention_bias", False)
    return TransformerConfig(**c, attn_bias=bias, attn_out_bias=bias, **{k: v for k, v in _SHAPE.items()
                                                                         if k != "rope_neox"})

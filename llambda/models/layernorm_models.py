"""What the LayerNorm families' readers share (Phi-2, StableLM, GPT-NeoX, Nemotron): llama.cpp's LayerNorm epsilon
key, the biases a GGUF says by its tensors only, HF's names of the norms' biases and its activation check."""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig

# HF's LayerNorm biases of the decoder layers (nn.LayerNorm's) and of the final norm `model.norm`
NORM_BIAS_NAMES = {"input_layernorm.bias": "attn_norm.bias", "post_attention_layernorm.bias": "ffn_norm.bias"}
FINAL_NORM_BIAS = {"model.norm.bias": "output_norm.bias"}


def gguf_config(meta: dict, arch: str, **fields) -> TransformerConfig:
    """llama.cpp's keys every llama-like file has, the LayerNorm epsilon (`{arch}.attention.layer_norm_epsilon`,
    which llama.cpp requires) and the family's own `fields`."""
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    c["norm_eps"] = hp.float("attention.layer_norm_epsilon", limit="norm_eps")
    return TransformerConfig(**{**c, **fields})


def hf_activation(cfg: dict, allowed: tuple, family: str, key: str = "hidden_act") -> str:
    """config.json's hidden_act (or the family's `key`; allowed[0] where absent), refused unless one of `allowed`."""
    act = cfg.get(key, allowed[0])
    if act not in allowed:
        raise ModelFormatError(f"config.json {key} {act!r} is not supported for {family} "
                               f"({', '.join(allowed)})"[:200])
    return act


def eps_metadata(cfg: TransformerConfig, arch: str) -> dict:
    return {f"{arch}.attention.layer_norm_epsilon": cfg.norm_eps}


def bias_flags(cfg: TransformerConfig, names) -> None:
    """The output projection's and the MLP's biases where a GGUF holds them (no key says so)."""
    names = list(names)
    if any(n.endswith("attn_output.bias") for n in names):
        cfg.attn_out_bias = True
    if any(n.endswith("ffn_up.bias") for n in names):
        cfg.ffn_bias = True


def first_int(hf: HFConfig, keys: tuple, limit: str, default: int | None = None) -> int:
    """The first of `keys` config.json has (a field's spellings: transformers' attribute_map names, old checkpoints'
    own), as an integer in SIZE_LIMITS[limit]; `default` where none is there, else a ModelFormatError naming keys[0]."""
    for key in keys:
        if hf.cfg.get(key) is not None:
            return hf.get(key, kind=int, limit=limit)
    if default is not None:
        return default
    raise ModelFormatError(f"config.json lacks {keys[0]!r}")


def hf_sizes(hf: HFConfig, embd: tuple, heads: tuple, layers: tuple) -> tuple[int, int, int]:
    """(d_model, n_heads, n_layers) from the first of each field's spellings (first_int), the width a multiple of
    the heads."""
    d, h = first_int(hf, embd, "d_model"), first_int(hf, heads, "n_heads")
    if d % h:
        raise ModelFormatError(f"config.json {embd[0]} {d} is not a multiple of {heads[0]} {h}")
    return d, h, first_int(hf, layers, "n_layers")

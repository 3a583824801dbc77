"""Falcon (HF FalconForCausalLM: falcon-7b/40b/180b, Falcon 2 11B; llama.cpp `falcon`): RoPE over every head dim
(half-split pairs), LayerNorms WITH bias, no linear biases, an MLP without a gate (dense_h_to_4h -> GELU ->
dense_4h_to_h), one fused `query_key_value` projection, and three block shapes:
- 7B (multi_query, parallel_attn): one input_layernorm feeds attention and the MLP, x += attn(h) + mlp(h)
  (TransformerConfig.parallel_block); ONE key/value head.
- new_decoder_architecture (40B, 180B) with num_ln_in_parallel_attn 2 (its default): ln_attn feeds attention and
  ln_mlp the MLP, both reading the same x (parallel_ffn_norm); num_kv_heads key/value heads.
- new_decoder_architecture with num_ln_in_parallel_attn 1 (Falcon 2 11B): one input_layernorm, as 7B.

query_key_value's rows come in kv groups: group g holds its n_heads / n_kv query heads, then its key head, then its
value head (7B's multi-query form is one group; a model with a kv head per query head, per-head q, k, v). They are
regrouped at load into q of every head, then k, then v: what llama.cpp's converter writes (`attn_qkv`), so both
formats hold one layout. llama.cpp's converter names the two-norm form's attention norm (ln_attn) `attn_norm_2` and its
MLP norm (ln_mlp) `attn_norm`, and its falcon reads a file with `attn_norm_2` as that form.

Activation: config.json's `activation` "gelu" (the default) is the exact erf GELU; the tanh approximations are
read too. A GGUF says neither: read as the exact GELU (llama.cpp runs its tanh approximation on every falcon file),
and a tanh-GELU model is not exported. Refused: alibi (ALiBi position biases: falcon-rw; the attention here takes
no position bias), bias=true (linear biases, which llama.cpp's falcon does not have either), parallel_attn false (a
sequential block: falcon-rw's again; llama.cpp's falcon has none).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .gpt_neox import ERF_GELUS, TANH_GELUS
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .layernorm_models import NORM_BIAS_NAMES, eps_metadata, first_int, hf_activation, hf_sizes

HF_PREFIXES = (("transformer.h.", "model.layers."),)
# the two-norm form's norms (weight and bias), the projections (no biases; the fused qkv read by hf_splitter)
HF_LAYER_NAMES = {**NORM_BIAS_NAMES,
                  **{f"{hf}.{kind}": f"{canon}.{kind}" for hf, canon in (("ln_attn", "attn_norm"), ("ln_mlp", "ffn_norm"))
                     for kind in ("weight", "bias")},
                  **{f"{hf}.weight": f"{canon}.weight" for hf, canon in (
                      ("self_attention.dense", "attn_output"), ("mlp.dense_h_to_4h", "ffn_up"),
                      ("mlp.dense_4h_to_h", "ffn_down"), ("self_attention.query_key_value", "attn_qkv"))}}
HF_GLOBAL_NAMES = {"transformer.word_embeddings.weight": "token_embd.weight",
                   "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}
# llama.cpp's names of the two-norm form's norms (its converter's): ln_attn is `attn_norm_2`, ln_mlp `attn_norm`
TWO_NORM_NAMES = {"attn_norm": "attn_norm_2", "ffn_norm": "attn_norm"}
SHAPE = dict(norm_kind="layer", norm_bias=True, ffn_gated=False, rope_neox=True)


def qkv_order(n_heads: int, n_kv: int, head_dim: int) -> np.ndarray:
    """HF's fused row of each llama.cpp row (q of every head, then k, then v), from HF's kv groups of
    (n_heads / n_kv query heads, one key head, one value head)."""
    per = n_heads // n_kv
    rows = np.arange((n_heads + 2 * n_kv) * head_dim).reshape(n_kv, per + 2, head_dim)
    return np.concatenate([rows[:, :per].reshape(-1), rows[:, per].reshape(-1), rows[:, per + 1].reshape(-1)])


def hf_splitter(config: TransformerConfig):
    order = qkv_order(config.n_heads, config.n_kv_heads, config.head_dim)

    def split(suffix: str, t, name: str):
        if suffix != "self_attention.query_key_value.weight":
            return None
        if tuple(t.shape) != (len(order), config.d_model):
            raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected {(len(order), config.d_model)}")
        return [("attn_qkv.weight", None, t.take_rows(order))]
    return split


def _two_norm_name(name: str) -> str:
    """A canonical layer norm's name in a two-norm falcon GGUF (TWO_NORM_NAMES); other names as they are."""
    if not name.startswith("blk.") or name.count(".") < 3:
        return name
    _, i, leaf = name.split(".", 2)
    base, _, kind = leaf.rpartition(".")
    return f"blk.{i}.{TWO_NORM_NAMES[base]}.{kind}" if base in TWO_NORM_NAMES else name


def lora_regrouped(cfg: TransformerConfig) -> tuple:
    """The weights regrouped at load (a PEFT adapter's rows are in the checkpoint's order): the fused qkv, unless
    it is one group (7B's multi-query rows are q|k|v already)."""
    return ("attn_qkv.weight",) if cfg.n_kv_heads > 1 else ()


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """The two-norm form where the file has a second norm per layer (llama.cpp's attn_norm_2: ln_attn)."""
    if any(n.endswith("attn_norm_2.weight") for n in names):
        cfg.parallel_block, cfg.parallel_ffn_norm = False, True


def gguf_lookup(get, cfg: TransformerConfig):
    """The two-norm form's norms by llama.cpp's names (the attention's is `attn_norm_2`, the MLP's `attn_norm`);
    (lookup, holders: canonical name -> the file's tensors it reads)."""
    rename = _two_norm_name if cfg.parallel_ffn_norm else (lambda name: name)
    return (lambda name: get(rename(name))), (lambda name: [rename(name)])


def gguf_export_tensors(cfg: TransformerConfig, tensors: dict) -> tuple[dict, dict]:
    """The two-norm form's norms under llama.cpp's names (gguf_lookup reads them back); no keys."""
    if not cfg.parallel_ffn_norm:
        return tensors, {}
    return {_two_norm_name(n): t for n, t in tensors.items()}, {}


def gguf_metadata(cfg: TransformerConfig) -> dict:
    if cfg.attn_bias or cfg.attn_out_bias or cfg.ffn_bias:
        raise ModelFormatError("GGUF 'falcon' has no linear biases")
    return eps_metadata(cfg, "falcon")


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp = GGUFHParams(meta, "falcon")
    c = hp.common()
    c.update(SHAPE, norm_eps=hp.float("attention.layer_norm_epsilon", limit="norm_eps"))
    return TransformerConfig(**c, activation="gelu_erf", parallel_block=True, tie_embeddings=True)


def config_from_hf(cfg: dict) -> TransformerConfig:
    refuse_quantized(cfg, "Falcon")
    hf = HFConfig(cfg)
    if hf.flag("alibi", False):
        raise ModelFormatError("config.json alibi=true (ALiBi position biases, falcon-rw) is not supported: the "
                               "attention here takes no position bias")
    if hf.flag("bias", False):
        raise ModelFormatError("config.json bias=true (Falcon's linear biases) is not supported")
    act = hf_activation(cfg, ERF_GELUS + TANH_GELUS, "Falcon", "activation")
    d, heads, layers = hf_sizes(hf, ("hidden_size", "n_embed"), ("num_attention_heads", "n_head"),
                                ("num_hidden_layers", "n_layer"))
    new = hf.flag("new_decoder_architecture", False)
    kv = first_int(hf, ("num_kv_heads", "n_head_kv"), "n_kv_heads", heads)
    if not new and hf.flag("multi_query", True):
        kv = 1
    if heads % kv:
        raise ModelFormatError(f"config.json num_kv_heads {kv} does not divide num_attention_heads {heads}")
    if not hf.flag("parallel_attn", True):
        raise ModelFormatError("config.json parallel_attn=false (a sequential Falcon block: falcon-rw's, which has "
                               "ALiBi too) is not supported; llama.cpp's falcon has none either")
    norms = hf.get("num_ln_in_parallel_attn", 2 if new else 1, int)
    if new and norms not in (1, 2):
        raise ModelFormatError(f"config.json num_ln_in_parallel_attn {norms}: a parallel block of 1 or 2 norms is "
                               "expected")
    two_norms = new and norms == 2
    theta, scaling = hf.rope()
    return TransformerConfig(
        arch="falcon", vocab_size=hf.get("vocab_size", kind=int, limit="vocab_size"), n_layers=layers, d_model=d,
        n_heads=heads, n_kv_heads=kv, head_dim=d // heads, ffn_dim=first_int(hf, ("ffn_hidden_size",), "ffn_dim", 4 * d),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5, float, "norm_eps"),
        n_ctx_train=hf.get("max_position_embeddings", 2048, int, "n_ctx_train"), rope_theta=theta,
        rope_scaling=scaling, tie_embeddings=hf.flag("tie_word_embeddings", True), **SHAPE,
        activation="gelu_erf" if act in ERF_GELUS else "gelu_tanh",
        parallel_block=not two_norms, parallel_ffn_norm=two_norms)

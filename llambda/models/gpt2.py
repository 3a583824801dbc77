"""GPT-2 (HF GPT2LMHeadModel: gpt2, distilgpt2, gpt2-medium/large/xl, DialoGPT; llama.cpp `gpt2`): learned absolute
position embeddings (`wpe`, n_positions rows) added to the token embeddings and no RoPE, pre-norm blocks with
LayerNorms WITH bias (the final `ln_f` too), one fused `c_attn` projection (q, then k, then v columns) with a bias,
biases on the output projection and on the MLP, an MLP without a gate (c_fc -> GELU, tanh approximation -> c_proj),
a tied head.

HF stores c_attn, c_proj and the MLP as Conv1D, weight (in, out) with y = x W + b: transposed at load into the
engine's (out, in) (kept in the file's float type), which is what llama.cpp's converter writes; the fused qkv is
then llama.cpp's `attn_qkv` as is (q|k|v blocks), split at load (models/base.py: unfused_lookup). The original
checkpoints name their tensors without the `transformer.` prefix (`h.0.attn.c_attn.weight`, `wte.weight`) and hold
causal-mask buffers (`attn.bias`, `attn.masked_bias`), skipped.

Context: the position table has n_positions rows, so no context past them (config.ctx_limit = n_ctx_train; a
longer one is refused at load, a longer prompt does not fit the context). Refused: add_cross_attention (an
encoder-decoder), activations other than GELU's tanh approximation. reorder_and_upcast_attn only changes the precision of a float16 run (ours is float32): accepted.
scale_attn_by_inverse_layer_idx (Stanford CRFM's GPT-2s: layer i's scores divided by i + 1) is folded into layer i's
query rows at load (hf_tensors), which a GGUF export then holds.
GGUF: llama.cpp's keys (`gpt2.context_length`, `gpt2.attention.layer_norm_epsilon`) and names (`position_embd`).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..formats.quants import QType
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .layernorm_models import eps_metadata, first_int, hf_activation, hf_sizes
from .gpt_neox import TANH_GELUS

HF_PREFIXES = (("transformer.h.", "model.layers."), ("h.", "model.layers."))
HF_LAYER_NAMES = {
    "ln_1.weight": "attn_norm.weight",
    "ln_1.bias": "attn_norm.bias",
    "ln_2.weight": "ffn_norm.weight",
    "ln_2.bias": "ffn_norm.bias",
    "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.bias": "attn_output.bias",
    "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.bias": "ffn_down.bias",
}
HF_GLOBAL_NAMES = {prefix + hf: canon for prefix in ("transformer.", "") for hf, canon in {
    "wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}.items()}
# the Conv1D weights, (in, out) in the checkpoint: read by hf_splitter (transposed), named here for errors
CONV1D = {"attn.c_attn.weight": "attn_qkv.weight", "attn.c_proj.weight": "attn_output.weight",
          "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_proj.weight": "ffn_down.weight"}
HF_LAYER_NAMES.update(CONV1D)
# old checkpoints' causal-mask buffers (transformers ignores them too)
BUFFERS = ("attn.bias", "attn.masked_bias")
SHAPE = dict(norm_kind="layer", norm_bias=True, ffn_gated=False, activation="gelu_tanh", attn_bias=True,
             attn_out_bias=True, ffn_bias=True, pos_embd=True)
# the float types whose elements a transpose moves as they are
_ELEMENT = {QType.F32: np.uint32, QType.F16: np.uint16, QType.BF16: np.uint16}


def transposed(t: WeightTensor, name: str) -> WeightTensor:
    """A Conv1D weight (in, out) as the engine's (out, in) matrix, in its own float type where it has one."""
    if len(t.shape) != 2:
        raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected a matrix (in, out)")
    rows, cols = t.shape
    elem = _ELEMENT.get(t.qtype)
    if elem is None:
        return WeightTensor.from_float(t.name, t.to_float32().reshape(rows, cols).T)
    data = np.ascontiguousarray(t.data.view(elem).reshape(rows, cols).T)
    return WeightTensor(t.name, t.qtype, (cols, rows), data.reshape(-1).view(np.uint8))


def hf_splitter(config: TransformerConfig):
    def split(suffix: str, t, name: str):
        if suffix in BUFFERS:
            return []
        if suffix not in CONV1D:
            return None
        return [(CONV1D[suffix], None, transposed(t, name))]
    return split


def hf_tensors(cfg: dict, config: TransformerConfig, tensors: dict) -> dict:
    """scale_attn_by_inverse_layer_idx: layer i's attention scores divided by i + 1, folded into its query rows (the
    fused qkv's first n_embd rows and biases, as float32), so that one scale serves every layer, in a GGUF too."""
    if not HFConfig(cfg).flag("scale_attn_by_inverse_layer_idx", False):
        return tensors
    for i in range(1, config.n_layers):
        for name in (f"blk.{i}.attn_qkv.weight", f"blk.{i}.attn_qkv.bias"):
            t = tensors.get(name)
            if t is None or len(t.shape) > 2 or t.shape[0] < config.q_dim:
                continue            # missing or misshapen: the loader names it
            v = t.to_float32().reshape(t.shape).copy()
            v[:config.q_dim] /= np.float32(i + 1)
            tensors[name] = WeightTensor.from_float(t.name, v)
    return tensors


def hf_common(cfg: dict, arch: str, family: str) -> dict:
    """What GPT-2 and GPT-BigCode spell alike: sizes (n_embd, n_head, n_layer, n_positions, n_inner), the LayerNorm
    epsilon, the activation, the attention scale, the refused options; n_kv_heads is every head's (MHA)."""
    refuse_quantized(cfg, family)
    hf = HFConfig(cfg)
    if hf.flag("add_cross_attention", False):
        raise ModelFormatError(f"config.json add_cross_attention=true (cross-attention to an encoder's states: an "
                               f"encoder-decoder) is not supported for {family}")
    hf_activation(cfg, TANH_GELUS, family, "activation_function")
    d, heads, layers = hf_sizes(hf, ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
                                ("n_layer", "num_hidden_layers"))
    positions = first_int(hf, ("n_positions", "max_position_embeddings"), "n_ctx_train")
    return dict(arch=arch, vocab_size=hf.get("vocab_size", kind=int, limit="vocab_size"), n_layers=layers,
                d_model=d, n_heads=heads, n_kv_heads=heads, head_dim=d // heads,
                ffn_dim=first_int(hf, ("n_inner",), "ffn_dim", 4 * d),
                norm_eps=hf.get("layer_norm_epsilon", 1e-5, float, "norm_eps"), n_ctx_train=positions,
                ctx_limit=positions, attn_scale=None if hf.flag("scale_attn_weights", True) else 1.0,
                tie_embeddings=hf.flag("tie_word_embeddings", True), layer_rope=[False] * layers)


def gguf_common(meta: dict, arch: str) -> dict:
    """llama.cpp's keys of its gpt2 and starcoder files: the context its position table holds (required), the
    LayerNorm epsilon; no RoPE."""
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    positions = hp.int("context_length", limit="n_ctx_train")
    c.update(SHAPE, norm_eps=hp.float("attention.layer_norm_epsilon", limit="norm_eps"), n_ctx_train=positions,
             ctx_limit=positions, layer_rope=[False] * c["n_layers"])
    return c


def gguf_metadata(cfg: TransformerConfig) -> dict:
    return eps_metadata(cfg, "gpt2")


def config_from_gguf(meta: dict) -> TransformerConfig:
    return TransformerConfig(**gguf_common(meta, "gpt2"))


def config_from_hf(cfg: dict) -> TransformerConfig:
    return TransformerConfig(**hf_common(cfg, "gpt2", "GPT-2"), **SHAPE)

"""Gemma 3n (text decoder): Gemma 3's attention layers (q/k norms, sandwich norms, sliding/full layers with
their own RoPE bases, GELU-tanh, embeddings scaled by sqrt(d_model), final logit soft-capping) plus what
the "matformer" decoder adds. Its forward is models/gemma3n_net.py; this file reads the hyper-parameters.

- AltUp: the hidden state is `altup_inputs` streams; each layer predicts every stream from all of them
  (per-token coefficients from a router), runs its sublayers on the active one and corrects the others.
- LAuReL: a low-rank residual branch beside attention, with its own post norm.
- Per-layer inputs: a second embedding table (hidden_size_per_layer_input per layer), combined with a
  projection of the embeddings, feeds each layer a small gated input.
- Activation sparsity: on the first layers, the MLP's gate keeps only values above mean + std * icdf(p).
- KV sharing: the last `kv_shared_layers` layers compute no keys/values; they attend over those of the last
  earlier layer of their type (sliding or full). They write no cache (TransformerConfig.kv_source).
- A value norm without weight; attention scale 1; Gemma 3n's RMSNorms multiply by the stored w (not 1 + w).

A checkpoint of Gemma3nForConditionalGeneration also holds vision and audio towers (model.vision_tower.*,
model.audio_tower.*, model.embed_vision.*, model.embed_audio.*): they are skipped knowingly, only the text
decoder runs; so do ids past vocab_size_per_layer_input (those towers' soft tokens), which take the
per-layer table's row 0 as transformers does.

Known differences from the others: transformers clamps the AltUp coefficients to altup_coef_clip only
when training (Ollama's converter clamps them in the file); llama.cpp takes the sparsity's std over n - 1
(transformers and we: over n) and hard-codes 4 AltUp streams, LAuReL rank 64, sparsity on 10 layers and
K/V sharing from layer 20.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from ..formats.quants import QType
from ..formats.weights import WeightTensor
from .config import TransformerConfig, check_int, check_number
from .gemma2 import check_hf_activation
from .hparams import GGUFHParams, HFConfig, hf_sliding_flags, is_flag

_PATTERN = 5                 # transformers' default: every 5th layer is full
_LOCAL_THETA = 10000.0
_ALTUP_LIMIT = 16            # streams; the models have 4

# config.json names (under model. / model.language_model.) -> canonical (llama.cpp's GGUF) names
HF_GLOBAL_NAMES = {
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
    **{f"model.altup_projections.{k}.weight": f"altup_proj.{k}.weight" for k in range(_ALTUP_LIMIT - 1)},
    **{f"model.altup_unembed_projections.{k}.weight": f"altup_unembd_proj.{k}.weight" for k in range(_ALTUP_LIMIT - 1)},
}
HF_LAYER_NAMES = {
    "altup.correct_output_scale": "altup_correct_scale.weight",
    "altup.correction_coefs.weight": "altup_correct_coef.weight",
    "altup.prediction_coefs.weight": "altup_predict_coef.weight",
    "altup.modality_router.weight": "altup_router.weight",
    "altup.router_norm.weight": "altup_router_norm.weight",
    "laurel.linear_left.weight": "laurel_l.weight",
    "laurel.linear_right.weight": "laurel_r.weight",
    "laurel.post_laurel_norm.weight": "laurel_post_norm.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
}


@dataclass
class Gemma3nConfig(TransformerConfig):
    altup_inputs: int = 4                  # AltUp streams
    altup_active: int = 0                  # the stream the sublayers run on
    altup_correct_scale: bool = True       # the corrected active stream times correct_output_scale before the gate
    per_layer_dim: int = 256               # hidden_size_per_layer_input
    per_layer_vocab: int = 0               # vocab_size_per_layer_input (ids past it take row 0)
    laurel_rank: int = 64
    sparsity: list = field(default_factory=list)   # per layer: the std multiplier icdf(p), or None (no sparsity)

    def validate(self) -> None:
        super().validate()
        check_int("config altup_num_inputs", self.altup_inputs, "n_kv_heads")
        if isinstance(self.altup_active, bool) or not isinstance(self.altup_active, int):
            raise ModelFormatError(f"config altup_active_idx should be an integer, got {self.altup_active!r:.40}")
        if not 2 <= self.altup_inputs <= _ALTUP_LIMIT or not 0 <= self.altup_active < self.altup_inputs:
            raise ModelFormatError(f"AltUp: {self.altup_inputs} streams (2..{_ALTUP_LIMIT}) with the active one "
                                   f"{self.altup_active} among them")
        check_int("config hidden_size_per_layer_input", self.per_layer_dim, "head_dim")
        check_int("config laurel_rank", self.laurel_rank, "ffn_dim")
        check_int("config vocab_size_per_layer_input", self.per_layer_vocab, "vocab_size")
        if self.per_layer_vocab > self.vocab_size:
            raise ModelFormatError(f"vocab_size_per_layer_input {self.per_layer_vocab} exceeds vocab_size "
                                   f"{self.vocab_size}")
        if not isinstance(self.sparsity, list) or len(self.sparsity) != self.n_layers:
            raise ModelFormatError("activation sparsity must list every layer")
        for s in self.sparsity:
            if s is not None:
                check_number("activation sparsity multiplier", s, "any")


def sparsity_multiplier(p) -> float | None:
    """The std multiplier of a target sparsity p: the standard normal's icdf(p); None for p = 0 (off)."""
    p = check_number("activation_sparsity_pattern value", p, "any")
    if p == 0:
        return None
    if not 0 < p < 1:
        raise ModelFormatError(f"activation_sparsity_pattern value {p} is not in [0, 1)")
    return statistics.NormalDist().inv_cdf(p)


def kv_shared_count(n_layers: int, shared, flags: list[bool]) -> int:
    """num_kv_shared_layers, checked: each shared layer's type must have an earlier layer that keeps K/V."""
    shared = check_int("config num_kv_shared_layers", shared, "n_layers") if shared else 0
    if shared >= n_layers:
        raise ModelFormatError(f"num_kv_shared_layers {shared} leaves no layer of the {n_layers} with keys and values")
    first = n_layers - shared
    for i in range(first, n_layers):
        if flags[i] not in flags[:first]:
            raise ModelFormatError(f"layer {i} shares the keys and values of an earlier "
                                   f"{'sliding' if flags[i] else 'full'} layer, and there is none")
    return shared


def config_from_hf(cfg: dict) -> Gemma3nConfig:
    check_hf_activation(cfg)
    cfg = dict(cfg)
    ffn = cfg.get("intermediate_size")
    if isinstance(ffn, list):
        if not ffn or any(v != ffn[0] for v in ffn):
            raise ModelFormatError(f"config.json intermediate_size {ffn!r:.80}: MLPs of different sizes per layer are "
                                   "not supported")
        cfg["intermediate_size"] = ffn[0]
    hf = HFConfig(cfg)
    c = hf.common("gemma3n")
    n = c["n_layers"]
    flags = hf_sliding_flags(cfg.get("layer_types"), n)
    if flags is None:
        flags = [(i + 1) % _PATTERN != 0 for i in range(n)]
    c["rope_theta"], c["rope_scaling"] = hf.rope("full_attention")
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
        local_theta, _ = hf.rope("sliding_attention")
    else:
        local_theta = hf.get("rope_local_base_freq", _LOCAL_THETA, float, "rope_theta_local")
    c["tie_embeddings"] = hf.flag("tie_word_embeddings", True)
    pattern = cfg.get("activation_sparsity_pattern")
    if pattern is None:
        pattern = [0.95] * 10 + [0.0] * (n - 10) if n > 10 else [0.0] * n
    if not isinstance(pattern, list) or len(pattern) != n:
        raise ModelFormatError(f"config.json activation_sparsity_pattern should list one value per layer ({n})")
    return Gemma3nConfig(
        **c, activation="gelu_tanh", qk_norm=True, post_norms=True,
        embed_scale=math.sqrt(c["d_model"]), sliding_window=hf.window(), layer_sliding=flags,
        rope_theta_local=local_theta, attn_scale=1.0,
        final_softcap=hf.get("final_logit_softcapping", 0.0, float, "final_softcap") or 0.0,
        kv_shared_layers=kv_shared_count(n, cfg.get("num_kv_shared_layers", 0), flags),
        altup_inputs=hf.get("altup_num_inputs", 4, int, "n_kv_heads"),
        altup_active=cfg.get("altup_active_idx", 0),
        altup_correct_scale=hf.flag("altup_correct_scale", True),
        per_layer_dim=hf.get("hidden_size_per_layer_input", kind=int, limit="head_dim"),
        per_layer_vocab=hf.get("vocab_size_per_layer_input", c["vocab_size"], int, "vocab_size"),
        laurel_rank=hf.get("laurel_rank", 64, int, "ffn_dim"),
        sparsity=[sparsity_multiplier(p) for p in pattern])


def config_from_gguf(meta: dict) -> Gemma3nConfig:
    """llama.cpp's converter's keys, or Ollama's (`rope.freq_base_local`, `head_dim`, no soft cap: 30); the
    ones neither writes take llama.cpp's hard-coded values (LAuReL rank 64; 4 streams, active 0, sparsity
    0.95 on 10 layers, K/V shared from layer 20 where absent)."""
    meta = dict(meta)
    if "gemma3n.attention.key_length" not in meta and "gemma3n.head_dim" in meta:     # Ollama's spelling
        meta["gemma3n.attention.key_length"] = meta["gemma3n.head_dim"]
    hp = GGUFHParams(meta, "gemma3n")
    c = hp.common()
    n = c["n_layers"]
    key = "gemma3n.attention.sliding_window_pattern"
    pat = meta.get(key)
    if isinstance(pat, (list, tuple)):
        if len(pat) != n or not all(is_flag(x) for x in pat):
            raise ModelFormatError(f"{key!r} must hold a bool per layer ({n})")
        flags = [bool(x) for x in pat]
    else:
        period = hp.int("attention.sliding_window_pattern", _PATTERN, "window_pattern")
        flags = [(i + 1) % period != 0 for i in range(n)]
    local = hp.float("rope.freq_base_swa", None, "rope_theta_local") if f"gemma3n.rope.freq_base_swa" in meta else \
        hp.float("rope.freq_base_local", _LOCAL_THETA, "rope_theta_local")
    scales = meta.get("gemma3n.activation_sparsity_scale")
    if scales is None:
        sparsity = [statistics.NormalDist().inv_cdf(0.95) if i < 10 else None for i in range(n)]
    elif isinstance(scales, (list, tuple)) and len(scales) == n:
        sparsity = [None if _is_minus_inf(s) else check_number("GGUF activation_sparsity_scale value", s, "any")
                    for s in scales]
    else:
        raise ModelFormatError(f"GGUF metadata 'gemma3n.activation_sparsity_scale' should list one float per layer ({n})")
    shared = meta.get("gemma3n.attention.shared_kv_layers")
    shared = hp.int("attention.shared_kv_layers", limit="n_layers") if shared is not None else max(0, n - 20)
    return Gemma3nConfig(
        **c, rope_neox=True, activation="gelu_tanh", qk_norm=True, post_norms=True,
        embed_scale=math.sqrt(c["d_model"]),
        sliding_window=hp.int("attention.sliding_window", 512, "sliding_window"), layer_sliding=flags,
        rope_theta_local=local, attn_scale=1.0,
        # Ollama's converter writes none: 30, as transformers' and llama.cpp's defaults
        final_softcap=hp.float("final_logit_softcapping", 30.0, "final_softcap"),
        kv_shared_layers=kv_shared_count(n, shared, flags),
        altup_inputs=hp.int("altup.num_inputs", 4, "n_kv_heads"),
        altup_active=meta.get("gemma3n.altup.active_idx", 0),
        altup_correct_scale=hp.flag("altup.correct_scale", True),
        per_layer_dim=hp.int("embedding_length_per_layer_input", 256, "head_dim"),
        per_layer_vocab=c["vocab_size"], laurel_rank=64, sparsity=sparsity)


def _is_minus_inf(v) -> bool:
    """icdf(0), what the converter writes for a layer without sparsity."""
    return isinstance(v, (float, np.floating)) and math.isinf(v) and v < 0


def gguf_lookup(get, cfg: Gemma3nConfig):
    """Serve the per-stream AltUp projections (`altup_proj.K.weight`, `altup_unembd_proj.K.weight`, HF's
    layout) from the file's one 3-D tensor of them; the tensors' own names otherwise."""
    def split(name: str):
        for base in ("altup_proj", "altup_unembd_proj"):
            if name.startswith(base + ".") and name.count(".") == 2:
                return base, int(name.split(".")[1])
        return None

    def lookup(name: str):
        s = split(name)
        if s is None:
            return get(name)
        t = get(f"{s[0]}.weight")
        d = cfg.d_model
        if t is None or len(t.shape) != 3 or tuple(t.shape[1:]) != (d, d) or s[1] >= t.shape[0]:
            return None
        flat = type(t)(t.name, t.qtype, (t.shape[0] * d, d), t.data)
        return flat.split_rows([d] * t.shape[0])[s[1]]

    def holders(name: str) -> list[str]:
        s = split(name)
        return [f"{s[0]}.weight"] if s else [name]

    return lookup, holders


# -- export (tools/export.py) -------------------------------------------------
def global_names(cfg: Gemma3nConfig) -> list[str]:
    """The canonical names of the tensors outside the layers that only Gemma 3n has."""
    k = range(cfg.altup_inputs - 1)
    return (["per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"]
            + [f"altup_proj.{i}.weight" for i in k] + [f"altup_unembd_proj.{i}.weight" for i in k])


def gguf_metadata(cfg: Gemma3nConfig) -> dict:
    """The keys llama.cpp's converter writes for gemma3n (and Ollama's altup.correct_scale)."""
    a = "gemma3n"
    return {f"{a}.embedding_length_per_layer_input": cfg.per_layer_dim, f"{a}.altup.active_idx": cfg.altup_active,
            f"{a}.altup.num_inputs": cfg.altup_inputs, f"{a}.altup.correct_scale": bool(cfg.altup_correct_scale),
            f"{a}.attention.shared_kv_layers": cfg.kv_shared_layers,
            f"{a}.attention.sliding_window_pattern": [bool(f) for f in cfg.layer_sliding],
            f"{a}.activation_sparsity_scale": [-math.inf if s is None else float(s) for s in cfg.sparsity]}


def gguf_tensors(cfg: Gemma3nConfig, tensors: dict) -> dict:
    """The file's layout: vectors in F32, the AltUp projections stacked into one 3-D tensor each, the per-layer table
    vocab_size tall (ids past vocab_size_per_layer_input: copies of row 0, the rule the model runs by;
    llama.cpp's converter pads zeros, the same where row 0 is zero)."""
    out, d = {}, cfg.d_model
    for name, t in tensors.items():
        base = name.split(".")[0]
        if base in ("altup_proj", "altup_unembd_proj"):
            if name.endswith(".0.weight"):
                parts = [tensors[f"{base}.{k}.weight"] for k in range(cfg.altup_inputs - 1)]
                if len({p.qtype for p in parts}) != 1:
                    parts = [WeightTensor.from_float(p.name, p.to_float32().reshape(d, d)) for p in parts]
                raw = np.concatenate([p.data.reshape(-1) for p in parts])
                out[f"{base}.weight"] = WeightTensor(f"{base}.weight", parts[0].qtype, (len(parts), d, d), raw)
            continue
        if name == "per_layer_token_embd.weight" and t.rows < cfg.vocab_size:
            rows = t.rows2d()
            extra = np.repeat(rows[:1], cfg.vocab_size - t.rows, axis=0)
            t = WeightTensor(t.name, t.qtype, (cfg.vocab_size, t.cols), np.concatenate([rows, extra]).reshape(-1))
        if len(t.shape) == 1 and t.qtype != QType.F32:      # llama.cpp multiplies by vectors in F32 only
            t = WeightTensor.from_float(t.name, t.to_float32().reshape(-1))
        out[name] = t
    for i in range(cfg.n_layers - cfg.kv_shared_layers, cfg.n_layers):
        # llama.cpp requires every layer's k/v (real checkpoints hold them; transformers 5 saves none for a
        # shared layer): never read by either, written as zeros where the source has none
        b = f"blk.{i}."
        for leaf, shape in (("attn_k.weight", (cfg.kv_dim, d)), ("attn_v.weight", (cfg.kv_dim, d)),
                            ("attn_k_norm.weight", (cfg.head_dim,))):
            out.setdefault(b + leaf, WeightTensor.from_float(b + leaf, np.zeros(shape, np.float32)))
    return out

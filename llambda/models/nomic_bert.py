"""nomic-bert encoders (nomic-embed-text v1 / v1.5): HF `model_type: nomic_bert` (Nomic's own modelling code,
not in transformers) and llama.cpp's `nomic-bert` GGUF.

BERT's post-norm block (models/bert.py) with: no position table but rotary positions on every head's whole
width (pairs (j, j + d/2), theta_j = base^(-2j/d), positions from 0 in each text), Q, K and V from one fused
`attn.Wqkv` without biases, a SwiGLU MLP (fc2(fc11(x) * silu(fc12(x))): fc11 is llama.cpp's ffn_up, fc12 its
ffn_gate), the embeddings' LayerNorm named `emb_ln`; mean pooling. llama.cpp's converter asserts what this
reads: no biases, post-norm, rotary on the whole head, not interleaved, no scaling; nomic-embed-text's config
says n_positions 8192 but the model is trained for max_trained_positions 2048, which is its length here
(as in llama.cpp's GGUF).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError
from . import bert
from .hparams import is_flag


@dataclass
class NomicBertConfig(bert.BertConfig):
    rope_base: float = 10000.0

    @property
    def ffn_matrices(self) -> int:
        return 3

    @property
    def position_rows(self) -> int:
        return 0


def _require(cfg: dict, key: str, want, default) -> None:
    v = cfg.get(key, default)
    number = isinstance(want, float) and isinstance(v, (int, float)) and not isinstance(v, bool)
    if v != want or not (number or type(v) is type(want)):
        raise ModelFormatError(f"config.json: {key} {v!r} is not supported for nomic_bert (only {want!r})")


def _base(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 < v < 1e12:
        raise ModelFormatError(f"{where}: the rotary base must be a number in (1, 1e12), got {v!r}")
    return float(v)


def config_from_hf(cfg: dict, pooling: dict | None = None, st_config: dict | None = None) -> NomicBertConfig:
    for key, want, default in (("activation_function", "swiglu", None), ("prenorm", False, False),
                               ("causal", False, False), ("rotary_emb_fraction", 1.0, 1.0),
                               ("rotary_emb_interleaved", False, False), ("rotary_scaling_factor", None, None),
                               ("rotary_emb_scale_base", None, None), ("use_rms_norm", False, False),
                               ("parallel_block", False, False), ("moe_every_n_layers", None, None),
                               ("qkv_proj_bias", False, False), ("mlp_fc1_bias", False, False),
                               ("mlp_fc2_bias", False, False)):
        _require(cfg, key, want, default)
    H = bert._int(cfg, "n_embd", 1, 1 << 16)
    c = NomicBertConfig(
        vocab_size=bert._int(cfg, "vocab_size", 1, 1 << 22), hidden=H, n_layers=bert._int(cfg, "n_layer", 1, 1024),
        n_heads=bert._int(cfg, "n_head", 1, 1024),
        ffn=bert._int({"n_inner": cfg.get("n_inner") or 4 * H}, "n_inner", 1, 1 << 18),
        max_positions=bert._int(cfg, "n_positions", 3, 1 << 20),
        type_vocab=bert._int({"type_vocab_size": cfg.get("type_vocab_size", 2)}, "type_vocab_size", 1, 1 << 10),
        eps=bert._eps(cfg.get("layer_norm_epsilon", 1e-12)), arch="nomic_bert",
        rope_base=_base(cfg.get("rotary_emb_base", 10000.0), "config.json: rotary_emb_base"))
    if c.hidden % c.n_heads or (c.hidden // c.n_heads) % 2:
        raise ModelFormatError(f"config.json: n_embd {c.hidden} is not {c.n_heads} heads of an even width")
    if pooling and pooling.get("pooling_mode_cls_token"):
        c.pooling = "cls"
    trained = cfg.get("max_trained_positions")
    c.max_tokens = c.max_positions
    for limit in (trained, (st_config or {}).get("max_seq_length")):
        if isinstance(limit, int) and not isinstance(limit, bool) and 3 <= limit < c.max_tokens:
            c.max_tokens = limit
    return c


_GGUF_GLOBAL = {"token_embd.weight": "embeddings.word_embeddings.weight",
                "token_types.weight": "embeddings.token_type_embeddings.weight",
                "token_embd_norm.weight": "emb_ln.weight", "token_embd_norm.bias": "emb_ln.bias"}
_GGUF_LAYER = {"attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "attn_output_norm": "norm1",
               "ffn_up": "mlp.fc11", "ffn_gate": "mlp.fc12", "ffn_down": "mlp.fc2", "layer_output_norm": "norm2"}
_NORMS = ("attn_output_norm", "layer_output_norm")


def gguf_tensors(get, names: list[str]):
    """(lookup by HF name, HF names) over a `nomic-bert` GGUF's tensors; a bias on a product is refused
    (llama.cpp's converter writes none for nomic-bert: this forward has no place for one)."""
    by_hf = {}
    for n in names:
        if n in _GGUF_GLOBAL:
            by_hf[_GGUF_GLOBAL[n]] = n
            continue
        parts = n.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _GGUF_LAYER:
            if parts[3] == "bias" and parts[2] not in _NORMS:
                raise ModelFormatError(f"GGUF tensor {n!r}: nomic-bert's products have no biases here")
            by_hf[f"encoder.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}.{parts[3]}"] = n
    return (lambda name: get(by_hf[name]) if name in by_hf else None), list(by_hf)


def config_from_gguf(meta: dict) -> NomicBertConfig:
    """llama.cpp's `nomic-bert` metadata: sizes under `nomic-bert.*`, its rotary base, pooling 1 mean or 2 CLS."""
    def key(name: str, default=None):
        v = meta.get("nomic-bert." + name, default)
        if v is None:
            raise ModelFormatError(f"GGUF metadata lacks 'nomic-bert.{name}'")
        return v
    causal = meta.get("nomic-bert.attention.causal", False)
    if not is_flag(causal) or causal:
        raise ModelFormatError("GGUF 'nomic-bert.attention.causal' must be false (a bidirectional encoder)")
    kind = meta.get("nomic-bert.pooling_type", 1)
    if isinstance(kind, bool) or not isinstance(kind, int) or kind not in (1, 2):
        shown = repr(kind) if isinstance(kind, (int, float, str)) else type(kind).__name__
        raise ModelFormatError(f"GGUF 'nomic-bert.pooling_type' {shown[:40]} is not supported (1 mean, 2 CLS)")
    tokens = meta.get("tokenizer.ggml.tokens")
    cfg = {"vocab_size": len(tokens) if isinstance(tokens, list) else key("vocab_size"),
           "n_embd": key("embedding_length"), "n_layer": key("block_count"), "n_head": key("attention.head_count"),
           "n_inner": key("feed_forward_length"), "n_positions": key("context_length"),
           "type_vocab_size": meta.get("tokenizer.ggml.token_type_count", 2),
           "layer_norm_epsilon": key("attention.layer_norm_epsilon", 1e-12), "activation_function": "swiglu",
           "rotary_emb_base": key("rope.freq_base", 10000.0)}
    try:
        return config_from_hf(cfg, pooling={"pooling_mode_cls_token": kind == 2})
    except ModelFormatError as e:      # name the format; the field names are the HF config's spelling
        raise ModelFormatError(str(e).replace("config.json:", "GGUF metadata (nomic-bert.*):")) from None


class NomicBertEncoder(bert.BertEncoder):
    """The weights of one nomic-bert on a backend, and its batched forward pass (rotary, SwiGLU)."""

    PREFIXES = ("", "bert.")      # (llama.cpp's converter strips a `bert.` some checkpoints carry)

    def _load(self) -> None:
        cfg, dense = self.cfg, self._prepare
        H, F = cfg.hidden, cfg.ffn
        self.word = self._f32("embeddings.word_embeddings.weight", cfg.vocab_size)
        self.types = self._f32("embeddings.token_type_embeddings.weight", cfg.type_vocab)
        self.emb_ln = self._ln("emb_ln")
        d = cfg.head_dim
        self.inv_freq = 1.0 / cfg.rope_base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"encoder.layers.{i}."
            self.layers.append({
                "qkv": dense(p + "attn.Wqkv", rows=3 * H, bias=False),
                "o": dense(p + "attn.out_proj", bias=False),
                "ln1": self._ln(p + "norm1"),
                "up": dense(p + "mlp.fc11", rows=F, bias=False),
                "gate": dense(p + "mlp.fc12", rows=F, bias=False),
                "down": dense(p + "mlp.fc2", cols=F, bias=False),
                "ln2": self._ln(p + "norm2"),
            })
        self.head = None

    def _forward(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        cfg, be = self.cfg, self.backend
        H, F = cfg.hidden, cfg.ffn
        n = ids.shape[0]
        lens = np.diff(starts)
        pos = np.arange(n) - np.repeat(starts[:-1], lens)
        angles = pos[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        x = self.word[ids]
        x += self.types[type_ids]
        be.add_layernorm(x, None, *self.emb_ln, cfg.eps, x)
        ctx = np.empty((n, H), np.float32)
        up, gate = np.empty((n, F), np.float32), np.empty((n, F), np.float32)
        for L in self.layers:
            qkv = self._dense(x, L["qkv"], 3 * H)
            be.encoder_rotate(qkv, cos, sin, cfg.n_heads)
            be.encoder_attention(qkv, starts, cfg.n_heads, ctx)
            att = self._dense(ctx, L["o"], H)
            be.add_layernorm(att, x, *L["ln1"], cfg.eps, x)          # x = LN(x + attention)
            be.dense(x, L["up"], up)
            be.dense(x, L["gate"], gate)
            be.silu_mul(gate, up, gate)                               # gate = silu(gate) * up
            be.dense(gate, L["down"], att)
            be.add_layernorm(att, x, *L["ln2"], cfg.eps, x)          # x = LN(x + MLP)
        return x


ENCODER = NomicBertEncoder

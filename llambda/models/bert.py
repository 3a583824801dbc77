"""BERT-family encoders (all-MiniLM, BGE, cross-encoder rerankers): config.json or GGUF metadata
-> BertConfig, and their forward pass.

An encoder shares nothing with the decoder's forward (models/base.py): absolute position and
token-type embeddings, LayerNorm with bias after the embeddings and after each block (post-norm),
bidirectional attention over the padded batch (a key mask, no causal mask, no KV cache), an erf
GELU MLP. The matrix products go through the Backend (`matmul`, so the native backend's
kernels run them on F32/F16 weights); the rest is a few NumPy lines per layer, which cost little
next to the products at these sizes (the GELU is a backend op: erf is costly in NumPy).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError


@dataclass
class BertConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    ffn: int
    max_positions: int
    type_vocab: int
    eps: float
    pooling: str = "mean"          # "mean" or "cls" (sentence-transformers' 1_Pooling/config.json)
    max_tokens: int = 0            # truncation length: the sentence-transformers max_seq_length, else max_positions
    n_labels: int = 0              # > 0: BertForSequenceClassification (a cross-encoder)
    arch: str = "bert"
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


def _int(cfg: dict, key: str, lo: int, hi: int) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ModelFormatError(f"config.json: {key} must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _eps(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ModelFormatError(f"config.json: layer_norm_eps must be a number in (0, 1), got {v!r}")
    return float(v)


def config_from_hf(cfg: dict, pooling: dict | None = None, st_config: dict | None = None) -> BertConfig:
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise ModelFormatError(f"config.json: hidden_act {act!r} is not supported for BERT (gelu only)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ModelFormatError("config.json: only absolute position embeddings are supported for BERT")
    c = BertConfig(
        vocab_size=_int(cfg, "vocab_size", 1, 1 << 22), hidden=_int(cfg, "hidden_size", 1, 1 << 16),
        n_layers=_int(cfg, "num_hidden_layers", 1, 1024), n_heads=_int(cfg, "num_attention_heads", 1, 1024),
        ffn=_int(cfg, "intermediate_size", 1, 1 << 18), max_positions=_int(cfg, "max_position_embeddings", 3, 1 << 20),
        type_vocab=_int({"type_vocab_size": cfg.get("type_vocab_size", 2)}, "type_vocab_size", 1, 1 << 10),
        eps=_eps(cfg.get("layer_norm_eps", 1e-12)))
    if c.hidden % c.n_heads:
        raise ModelFormatError(f"config.json: hidden_size {c.hidden} is not a multiple of {c.n_heads} heads")
    if pooling and pooling.get("pooling_mode_cls_token"):
        c.pooling = "cls"
    c.max_tokens = c.max_positions
    seq = (st_config or {}).get("max_seq_length")
    if isinstance(seq, int) and not isinstance(seq, bool) and 3 <= seq < c.max_positions:
        c.max_tokens = seq
    classes = cfg.get("architectures")
    if isinstance(classes, list) and "BertForSequenceClassification" in classes:
        labels = cfg.get("id2label")
        c.n_labels = len(labels) if isinstance(labels, dict) and labels else 1
    return c


# llama.cpp's `bert` GGUF: its pooling types, and its tensor names for the HF ones the encoder reads
GGUF_POOLING = {1: "mean", 2: "cls"}
_GGUF_GLOBAL = {"embeddings.word_embeddings.weight": "token_embd.weight",
                "embeddings.position_embeddings.weight": "position_embd.weight",
                "embeddings.token_type_embeddings.weight": "token_types.weight",
                "embeddings.LayerNorm.weight": "token_embd_norm.weight",
                "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
_GGUF_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
               "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
               "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}


_HF_GLOBAL = {g: h for h, g in _GGUF_GLOBAL.items()}
_HF_LAYER = {g: h for h, g in _GGUF_LAYER.items()}


def hf_name(gguf_name: str) -> str | None:
    """The HF BertModel name of a GGUF tensor name, None for a tensor the encoder does not read."""
    if gguf_name in _HF_GLOBAL:
        return _HF_GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _HF_LAYER:
        return f"encoder.layer.{parts[1]}.{_HF_LAYER[parts[2]]}.{parts[3]}"
    return None


def gguf_tensors(get, names: list[str]):
    """(lookup by HF name, HF names) over a GGUF file's tensors: what BertEncoder reads."""
    by_hf = {h: n for n in names if (h := hf_name(n)) is not None}
    return (lambda name: get(by_hf[name]) if name in by_hf else None), list(by_hf)


def config_from_gguf(meta: dict) -> BertConfig:
    """llama.cpp's `bert` metadata: sizes under `bert.*`, `bert.pooling_type` (1 mean, 2 CLS), the
    token-type count under `tokenizer.ggml.token_type_count`; texts truncate at the context length."""
    def key(name: str, default=None):
        v = meta.get(name, default)
        if v is None:
            raise ModelFormatError(f"GGUF metadata lacks {name!r}")
        return v
    cfg = {"vocab_size": len(key("tokenizer.ggml.tokens")) if isinstance(meta.get("tokenizer.ggml.tokens"), list)
           else key("bert.vocab_size"),
           "hidden_size": key("bert.embedding_length"), "num_hidden_layers": key("bert.block_count"),
           "num_attention_heads": key("bert.attention.head_count"), "intermediate_size": key("bert.feed_forward_length"),
           "max_position_embeddings": key("bert.context_length"),
           "type_vocab_size": meta.get("tokenizer.ggml.token_type_count", 2),
           "layer_norm_eps": key("bert.attention.layer_norm_epsilon", 1e-12)}
    if meta.get("bert.attention.causal", False):
        raise ModelFormatError("GGUF 'bert.attention.causal' is true: a causal BERT is not supported")
    kind = meta.get("bert.pooling_type", 1)
    if kind not in GGUF_POOLING:
        raise ModelFormatError(f"GGUF 'bert.pooling_type' {kind!r} is not supported (1 mean, 2 CLS)")
    try:
        return config_from_hf(cfg, pooling={"pooling_mode_cls_token": GGUF_POOLING[kind] == "cls"})
    except ModelFormatError as e:      # name the format; the field names are HF's spelling of bert.*
        raise ModelFormatError(str(e).replace("config.json:", "GGUF metadata (bert.*):")) from None


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = np.mean(d * d, axis=-1, keepdims=True)
    return d * (1.0 / np.sqrt(var + np.float32(eps))) * w + b


class BertEncoder:
    """The weights of one BERT on a backend, and its batched forward pass."""

    def __init__(self, cfg: BertConfig, lookup, backend):
        self.cfg, self.backend = cfg, backend
        H, F = cfg.hidden, cfg.ffn

        def get(name: str, shape: tuple):
            # HF BertModel names, or under `bert.` in the task-head classes
            for n in (name, "bert." + name):
                t = lookup(n)
                if t is not None:
                    if tuple(t.shape) != shape:
                        raise ModelFormatError(f"tensor {n!r} has shape {list(t.shape)}, the config says {list(shape)}")
                    return t
            raise ModelFormatError(f"missing tensor {name!r}")

        def vec(name, n=H):
            return backend.prepare_vector(get(name, (n,)))

        def mat(name, rows=H, cols=H):
            return backend.prepare_matrix(get(name, (rows, cols)))

        def f32(name, rows):
            return np.ascontiguousarray(get(name, (rows, H)).to_float32(), dtype=np.float32).reshape(rows, H)

        self.word = f32("embeddings.word_embeddings.weight", cfg.vocab_size)
        self.pos = f32("embeddings.position_embeddings.weight", cfg.max_positions)
        self.types = f32("embeddings.token_type_embeddings.weight", cfg.type_vocab)
        self.emb_ln = (vec("embeddings.LayerNorm.weight"), vec("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"encoder.layer.{i}."
            self.layers.append({
                "q": (mat(p + "attention.self.query.weight"), vec(p + "attention.self.query.bias")),
                "k": (mat(p + "attention.self.key.weight"), vec(p + "attention.self.key.bias")),
                "v": (mat(p + "attention.self.value.weight"), vec(p + "attention.self.value.bias")),
                "o": (mat(p + "attention.output.dense.weight"), vec(p + "attention.output.dense.bias")),
                "ln1": (vec(p + "attention.output.LayerNorm.weight"), vec(p + "attention.output.LayerNorm.bias")),
                "up": (mat(p + "intermediate.dense.weight", F, H), vec(p + "intermediate.dense.bias", F)),
                "down": (mat(p + "output.dense.weight", H, F), vec(p + "output.dense.bias")),
                "ln2": (vec(p + "output.LayerNorm.weight"), vec(p + "output.LayerNorm.bias")),
            })
        self.head = None
        if cfg.n_labels:
            self.head = {"pool": (mat("pooler.dense.weight"), vec("pooler.dense.bias")),
                         "cls": (mat("classifier.weight", cfg.n_labels, H), vec("classifier.bias", cfg.n_labels))}
        backend.end_load()

    def _linear(self, x: np.ndarray, wb) -> np.ndarray:
        w, b = wb
        out = np.empty((x.shape[0], b.shape[0]), np.float32)
        self.backend.matmul(x, w, out)
        out += b
        return out

    def forward(self, ids: np.ndarray, type_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Hidden states (b, t, hidden) of a right-padded batch; mask (b, t) is 1 on real tokens."""
        cfg = self.cfg
        b, t = ids.shape
        if t > self.pos.shape[0]:
            raise ValueError(f"{t} tokens is beyond the {self.pos.shape[0]} positions of this model")
        self.backend.begin_forward()
        x = self.word[ids] + self.pos[:t][None] + self.types[type_ids]
        x = _layernorm(x, *self.emb_ln, cfg.eps).reshape(b * t, cfg.hidden).astype(np.float32)
        # padded keys get -inf-like scores: exp() of them is exactly 0, as in transformers
        key_bias = np.where(mask[:, None, None, :] > 0, np.float32(0), np.float32(-1e30))
        h, hd = cfg.n_heads, cfg.head_dim
        scale = np.float32(1 / math.sqrt(hd))
        for L in self.layers:
            q = self._linear(x, L["q"]).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
            k = self._linear(x, L["k"]).reshape(b, t, h, hd).transpose(0, 2, 3, 1)
            v = self._linear(x, L["v"]).reshape(b, t, h, hd).transpose(0, 2, 1, 3)
            s = np.matmul(q, k) * scale + key_bias                 # (b, h, t, t), bidirectional
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            ctx = np.ascontiguousarray(np.matmul(s, v).transpose(0, 2, 1, 3)).reshape(b * t, cfg.hidden)
            x = _layernorm(x + self._linear(ctx, L["o"]), *L["ln1"], cfg.eps)
            up = self._linear(x, L["up"])
            self.backend.gelu_erf(up)
            x = _layernorm(x + self._linear(up, L["down"]), *L["ln2"], cfg.eps)
            x = np.ascontiguousarray(x, dtype=np.float32)
        return x.reshape(b, t, cfg.hidden)

    def pool(self, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One L2-normalized vector per row: the mean over real tokens, or [CLS]'s state."""
        if self.cfg.pooling == "cls":
            v = hidden[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            v = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)
        norm = np.linalg.norm(v, axis=-1, keepdims=True)
        return (v / np.maximum(norm, 1e-12)).astype(np.float32)

    def classify(self, hidden: np.ndarray) -> np.ndarray:
        """The sequence-classification logits (b, n_labels): tanh pooler on [CLS], then the head."""
        if self.head is None:
            raise ValueError("this model has no classification head")
        pooled = np.tanh(self._linear(np.ascontiguousarray(hidden[:, 0]), self.head["pool"]))
        return self._linear(np.ascontiguousarray(pooled, dtype=np.float32), self.head["cls"])


def pad_batch(encoded: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[np.ndarray, ...]:
    """Right-padded (ids, type_ids, mask) arrays of one batch, as long as its longest row."""
    t = max(len(ids) for ids, _ in encoded)
    ids = np.full((len(encoded), t), pad_id, np.int64)
    types = np.zeros((len(encoded), t), np.int64)
    mask = np.zeros((len(encoded), t), np.int32)
    for r, (i, ty) in enumerate(encoded):
        ids[r, :len(i)], types[r, :len(ty)], mask[r, :len(i)] = i, ty, 1
    return ids, types, mask

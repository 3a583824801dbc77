"""BERT-family encoders (all-MiniLM, BGE, cross-encoder rerankers): config.json or GGUF metadata
-> BertConfig, and their forward pass.

An encoder shares nothing with the decoder's forward (models/base.py): absolute position and
token-type embeddings, LayerNorm with bias after the embeddings and after each block (post-norm),
bidirectional attention within each sequence (no causal mask, no KV cache), an erf GELU MLP.
A batch's sequences are packed back to back, no padding: every linear layer runs once over all
the batch's real tokens, and attention runs per sequence on its own length. Everything runs
through the Backend's encoder ops (dense products with their bias, the residual layernorm, the
packed attention, the GELU), so the native backend does a layer in a few C calls.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError, ModelFormatError
from .closable import Closable
from .hparams import is_flag


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

    @property
    def ffn_matrices(self) -> int:
        """The MLP's weight matrices per layer (memory.encoder_plan): up and down."""
        return 2

    @property
    def position_rows(self) -> int:
        """Rows of the position table the encoder keeps (memory.encoder_plan)."""
        return self.max_positions


def _int(cfg: dict, key: str, lo: int, hi: int) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ModelFormatError(f"config.json: {key} must be an integer in {lo}..{hi}, got {v!r}")
    return v


def _eps(v) -> float:
    # from 1e-30: float32 rounds 1e-320 to 0, which the native layer norm refused untyped
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1e-30 <= v < 1:
        raise ModelFormatError(f"config.json: layer_norm_eps must be a number in [1e-30, 1), got {v!r}")
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


# llama.cpp's `bert` GGUF: its pooling types (4, rank: a cross-encoder, its head as `cls` and `cls.output`),
# and its tensor names for the HF ones the encoder reads
GGUF_POOLING = {1: "mean", 2: "cls", 4: "rank"}
_GGUF_GLOBAL = {"pooler.dense.weight": "cls.weight", "pooler.dense.bias": "cls.bias",
                "classifier.weight": "cls.output.weight", "classifier.bias": "cls.output.bias",
                "embeddings.word_embeddings.weight": "token_embd.weight",
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
    causal = meta.get("bert.attention.causal", False)
    if not is_flag(causal):    # (an array has no truth value)
        raise ModelFormatError(f"GGUF 'bert.attention.causal' must be a bool, got {type(causal).__name__}")
    if causal:
        raise ModelFormatError("GGUF 'bert.attention.causal' is true: a causal BERT is not supported")
    kind = meta.get("bert.pooling_type", 1)
    if isinstance(kind, bool) or not isinstance(kind, int) or kind not in GGUF_POOLING:   # (a list: unhashable)
        shown = repr(kind) if isinstance(kind, (int, float, str)) else type(kind).__name__
        raise ModelFormatError(f"GGUF 'bert.pooling_type' {shown[:40]} is not supported (1 mean, 2 CLS, 4 rank)")
    if GGUF_POOLING[kind] == "rank":         # the classifier's outputs, one per label (llama.cpp: one without labels)
        labels = meta.get("bert.classifier.output_labels")
        cfg["architectures"] = ["BertForSequenceClassification"]
        cfg["id2label"] = {str(i): str(v) for i, v in enumerate(labels)} if isinstance(labels, list) else None
    try:
        return config_from_hf(cfg, pooling={"pooling_mode_cls_token": GGUF_POOLING[kind] != "mean"})
    except ModelFormatError as e:      # name the format; the field names are HF's spelling of bert.*
        raise ModelFormatError(str(e).replace("config.json:", "GGUF metadata (bert.*):")) from None


class BertEncoder(Closable):
    """The weights of one BERT on a backend, and its batched forward pass."""

    # where the task-head classes keep the encoder's tensors, and their classification head's two layers
    PREFIXES = ("", "bert.")
    HEAD = ("pooler.dense", "classifier")

    def __init__(self, cfg: BertConfig, lookup, backend):
        self.cfg, self.backend, self._lookup = cfg, backend, lookup
        try:
            self._load()
        finally:
            del self._lookup        # (the file's tensors: what is kept was converted)
        backend.end_load()

    # -- reading the weights (HF names, under one of PREFIXES) --
    def _get(self, name: str, shape: tuple):
        # HF names, or under a PREFIXES one (`bert.` in BERT's task-head classes)
        for n in (p + name for p in self.PREFIXES):
            t = self._lookup(n)
            if t is not None:
                if tuple(t.shape) != shape:
                    raise ModelFormatError(f"tensor {n!r} has shape {list(t.shape)}, the config says {list(shape)}")
                return t
        raise ModelFormatError(f"missing tensor {name!r}")

    def _vec(self, name: str, n: int | None = None):
        return self.backend.prepare_vector(self._get(name, (n or self.cfg.hidden,)))

    def _f32(self, name: str, rows: int, cols: int | None = None) -> np.ndarray:
        cols = cols or self.cfg.hidden
        return np.ascontiguousarray(self._get(name, (rows, cols)).to_float32(), dtype=np.float32).reshape(rows, cols)

    def _prepare(self, *names: str, rows: int | None = None, cols: int | None = None, bias: bool = True):
        """One product for the named linear layers (Q, K and V as one), their biases concatenated."""
        rows, cols = rows or self.cfg.hidden, cols or self.cfg.hidden
        w = np.concatenate([self._f32(n + ".weight", rows, cols) for n in names])
        b = np.concatenate([self._get(n + ".bias", (rows,)).to_float32().astype(np.float32).reshape(rows)
                            for n in names]) if bias else None
        return self.backend.prepare_dense(w, b)

    def _ln(self, name: str) -> tuple:
        return self._vec(name + ".weight"), self._vec(name + ".bias")

    def _load(self) -> None:
        cfg, dense = self.cfg, self._prepare
        H, F = cfg.hidden, cfg.ffn
        self.word = self._f32("embeddings.word_embeddings.weight", cfg.vocab_size)
        self.pos = self._f32("embeddings.position_embeddings.weight", cfg.max_positions)
        self.types = self._f32("embeddings.token_type_embeddings.weight", cfg.type_vocab)
        self.emb_ln = self._ln("embeddings.LayerNorm")
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"encoder.layer.{i}."
            self.layers.append({
                "qkv": dense(p + "attention.self.query", p + "attention.self.key", p + "attention.self.value"),
                "o": dense(p + "attention.output.dense"),
                "ln1": self._ln(p + "attention.output.LayerNorm"),
                "up": dense(p + "intermediate.dense", rows=F, cols=H),
                "down": dense(p + "output.dense", rows=H, cols=F),
                "ln2": self._ln(p + "output.LayerNorm"),
            })
        self.head = None
        if cfg.n_labels:
            self.head = {"pool": dense(self.HEAD[0]), "cls": dense(self.HEAD[1], rows=cfg.n_labels)}

    def _dense(self, x: np.ndarray, d, rows: int) -> np.ndarray:
        out = np.empty((x.shape[0], rows), np.float32)
        self.backend.dense(x, d, out)
        return out

    def forward(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Hidden states (n, hidden) of sequences packed back to back: sequence s is rows
        [starts[s], starts[s + 1]) of ids and type_ids (n,); starts is int32, from 0 to n."""
        be = self.backend
        be.enter_forward()
        try:
            return self._forward(ids, type_ids, starts)
        finally:
            be.exit_forward()

    def _forward(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        cfg, be = self.cfg, self.backend
        H, F = cfg.hidden, cfg.ffn
        n = ids.shape[0]
        x = self._embed(ids, type_ids, starts)
        be.add_layernorm(x, None, *self.emb_ln, cfg.eps, x)
        ctx, up = np.empty((n, H), np.float32), np.empty((n, F), np.float32)
        for L in self.layers:
            qkv = self._dense(x, L["qkv"], 3 * H)
            be.encoder_attention(qkv, starts, cfg.n_heads, ctx)
            att = self._dense(ctx, L["o"], H)
            be.add_layernorm(att, x, *L["ln1"], cfg.eps, x)          # x = LN(x + attention)
            be.dense(x, L["up"], up)
            be.gelu_erf(up)
            be.dense(up, L["down"], att)
            be.add_layernorm(att, x, *L["ln2"], cfg.eps, x)          # x = LN(x + MLP)
        return x

    def _embed(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Word + absolute position (from 0 in each sequence) + token-type embeddings, before their LayerNorm."""
        lens = np.diff(starts)
        if lens.max() > self.pos.shape[0]:
            raise InvalidInputError(f"{lens.max()} tokens is beyond the {self.pos.shape[0]} positions of this model")
        x = self.word[ids]
        x += self.pos[np.arange(ids.shape[0]) - np.repeat(starts[:-1], lens)]
        x += self.types[type_ids]
        return x

    def pool(self, hidden: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """One L2-normalized vector per sequence: the mean over its tokens, or [CLS]'s state."""
        if self.cfg.pooling == "cls":
            v = hidden[starts[:-1]]
        else:
            v = np.add.reduceat(hidden, starts[:-1], axis=0) / np.diff(starts)[:, None].astype(np.float32)
        norm = np.linalg.norm(v, axis=-1, keepdims=True)
        return (v / np.maximum(norm, 1e-12)).astype(np.float32)

    def classify(self, hidden: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The sequence-classification logits (b, n_labels): tanh pooler on [CLS], then the head."""
        if self.head is None:
            raise ValueError("this model has no classification head")
        cls = np.ascontiguousarray(hidden[starts[:-1]])
        pooled = np.tanh(self._dense(cls, self.head["pool"], self.cfg.hidden))
        return self._dense(np.ascontiguousarray(pooled, dtype=np.float32), self.head["cls"], self.cfg.n_labels)


ENCODER = BertEncoder      # the class models/__init__.encoder_module's users build


def bias_free_gguf_tensors(get, names: list[str], global_names: dict, layer_names: dict, family: str):
    """(lookup by HF name, HF names) over the GGUF tensors of an encoder without biases: `global_names` maps
    GGUF names to HF ones, and `blk.N.X.weight` is `layers.N.{layer_names[X]}.weight`; a layer's bias is refused."""
    by_hf = {}
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", n)
        if n in global_names:
            by_hf[global_names[n]] = n
        elif m is not None and m[2] in layer_names:
            if m[3] == "bias":
                raise ModelFormatError(f"GGUF tensor {n!r}: {family} has no biases")
            by_hf[f"layers.{m[1]}.{layer_names[m[2]]}.weight"] = n
    return (lambda name: get(by_hf[name]) if name in by_hf else None), list(by_hf)


def packed_rotary(starts: np.ndarray, inv_freq: dict) -> dict:
    """{key: (cos, sin)} (n x len(inv_freq[key]), float32) of packed texts' rotary angles, positions from 0 in each
    text (rows [starts[s], starts[s + 1])), for encoder_rotate; one pair per base in `inv_freq`."""
    lens = np.diff(starts)
    pos = np.arange(int(starts[-1])) - np.repeat(starts[:-1], lens)
    out = {}
    for key, inv in inv_freq.items():
        ang = pos[:, None] * inv[None, :]
        out[key] = (np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32))
    return out


def pack_batch(encoded: list[tuple[list[int], list[int]]]) -> tuple[np.ndarray, ...]:
    """(ids, type_ids, starts) of one batch packed back to back: sequence s is rows [starts[s], starts[s + 1])."""
    lens = [len(ids) for ids, _ in encoded]
    starts = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(lens, out=starts[1:])
    ids = np.fromiter((t for i, _ in encoded for t in i), np.int64, count=int(starts[-1]))
    types = np.fromiter((t for _, ty in encoded for t in ty), np.int64, count=int(starts[-1]))
    return ids, types, starts

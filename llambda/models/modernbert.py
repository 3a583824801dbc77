"""ModernBERT encoders (answerdotai/ModernBERT-base and -large, and the embedders built on them, e.g.
nomic-embed-text-v2's ModernBERT siblings, gte-modernbert): HF `model_type: modernbert`, ModernBertModel's weights
(a `model.` prefix too, as the task-head classes keep them).

Pre-norm blocks: x += Wo(attention(attn_norm(x))), x += mlp(mlp_norm(x)), the first layer without attn_norm (an
identity, as transformers has it), a final norm; every LayerNorm without a bias, and no biases anywhere (the
options that add them are refused). The embeddings are the token table and a LayerNorm (no positions, no types).
Attention: a fused Wqkv, NEOX rotary positions on the whole head (the global base on global layers, the local one
on the others), bidirectional; a global layer every `global_attn_every_n_layers` (layer i when i % n == 0, or
`layer_types`), the others see tokens at most local_attention // 2 away on either side (models/banded.py for a
text longer than that). MLP: Wi gives [input | gate], Wo(GELU(input) * gate) with the exact GELU. Pooling as
sentence-transformers' 1_Pooling says (mean, or CLS), else ModernBERT's `classifier_pooling`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from ..formats.weights import WeightTensor
from . import bert
from .hparams import is_flag
from .banded import banded_attention, long_texts


@dataclass
class ModernBertConfig(bert.BertConfig):
    sliding: list = field(default_factory=list)      # per layer: True for a local (banded) layer
    half: int = 64                                    # a local layer's reach: local_attention // 2
    rope_global: float = 160000.0
    rope_local: float = 10000.0
    head_pooling: str = "cls"                         # a classifier's: classifier_pooling, cls or mean
    head_bias: bool = False                           # its head.dense has a bias (classifier_bias)
    # memory.encoder_plan: Wi (two matrices' worth) and Wo; no position table
    ffn_matrices = 3
    position_rows = 0


def _theta(cfg: dict, kind: str, old_key: str, default: float) -> float:
    params = cfg.get("rope_parameters")
    sub = params.get(kind) if isinstance(params, dict) else None
    if isinstance(sub, dict):
        if sub.get("rope_type", "default") != "default":
            raise ModelFormatError(f"config.json: rope_parameters.{kind} type {sub.get('rope_type')!r} is not "
                                   f"supported for ModernBERT (default only)")
        v = sub.get("rope_theta", default)
    else:
        v = cfg.get(old_key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1 < v < 1e12:
        raise ModelFormatError(f"config.json: the {kind} rotary base must be a number in (1, 1e12), got {v!r}")
    return float(v)


def config_from_hf(cfg: dict, pooling: dict | None = None, st_config: dict | None = None) -> ModernBertConfig:
    for key in ("norm_bias", "attention_bias", "mlp_bias"):
        if cfg.get(key, False) is not False:
            raise ModelFormatError(f"config.json: {key} {cfg.get(key)!r} is not supported for ModernBERT (false only)")
    act = cfg.get("hidden_activation", "gelu")
    if act != "gelu":
        raise ModelFormatError(f"config.json: hidden_activation {act!r} is not supported for ModernBERT (gelu only)")
    if cfg.get("rope_scaling") is not None:
        raise ModelFormatError("config.json: rope_scaling is not supported for ModernBERT")
    n = bert._int(cfg, "num_hidden_layers", 1, 1024)
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n or any(
                t not in ("full_attention", "sliding_attention") for t in types):
            raise ModelFormatError(f"config.json: layer_types must list {n} of full_attention / sliding_attention")
        sliding = [t == "sliding_attention" for t in types]
    else:
        every = bert._int({"g": cfg.get("global_attn_every_n_layers", 3)}, "g", 1, 1024)
        sliding = [i % every != 0 for i in range(n)]
    local = bert._int({"local_attention": cfg.get("local_attention", 128)}, "local_attention", 2, 1 << 20)
    c = ModernBertConfig(
        vocab_size=bert._int(cfg, "vocab_size", 1, 1 << 22), hidden=bert._int(cfg, "hidden_size", 1, 1 << 16),
        n_layers=n, n_heads=bert._int(cfg, "num_attention_heads", 1, 1024),
        ffn=bert._int(cfg, "intermediate_size", 1, 1 << 18),
        max_positions=bert._int(cfg, "max_position_embeddings", 3, 1 << 20), type_vocab=0,
        eps=bert._eps(cfg.get("norm_eps", 1e-5)), arch="modernbert", sliding=sliding, half=local // 2,
        rope_global=_theta(cfg, "full_attention", "global_rope_theta", 160000.0),
        rope_local=_theta(cfg, "sliding_attention", "local_rope_theta", 10000.0))
    if c.hidden % c.n_heads or (c.hidden // c.n_heads) % 2:
        raise ModelFormatError(f"config.json: hidden_size {c.hidden} is not {c.n_heads} heads of an even width")
    if pooling:
        c.pooling = "cls" if pooling.get("pooling_mode_cls_token") else "mean"
    else:
        c.pooling = "mean" if cfg.get("classifier_pooling", "cls") == "mean" else "cls"
    classes = cfg.get("architectures")
    if isinstance(classes, list) and "ModernBertForSequenceClassification" in classes:
        labels = cfg.get("id2label")
        c.n_labels = len(labels) if isinstance(labels, dict) and labels else 1
        c.head_pooling = cfg.get("classifier_pooling", "cls")
        c.head_bias = cfg.get("classifier_bias", False)
        if c.head_pooling not in ("cls", "mean") or cfg.get("classifier_activation", "gelu") != "gelu" or \
                not isinstance(c.head_bias, bool):
            raise ModelFormatError("config.json: ModernBERT's classifier is supported with classifier_pooling cls or "
                                   "mean, classifier_activation gelu and a bool classifier_bias")
    c.max_tokens = c.max_positions
    seq = (st_config or {}).get("max_seq_length")
    if isinstance(seq, int) and not isinstance(seq, bool) and 3 <= seq < c.max_positions:
        c.max_tokens = seq
    return c


# llama.cpp's `modern-bert` GGUF: its names of the tensors this encoder reads (ffn_up is the fused Wi)
_GGUF_GLOBAL = {"token_embd.weight": "embeddings.tok_embeddings.weight",
                "token_embd_norm.weight": "embeddings.norm.weight",
                "output_norm.weight": "final_norm.weight"}
_GGUF_LAYER = {"attn_norm": "attn_norm", "attn_qkv": "attn.Wqkv", "attn_output": "attn.Wo", "ffn_norm": "mlp_norm",
               "ffn_up": "mlp.Wi", "ffn_down": "mlp.Wo"}


def gguf_tensors(get, names: list[str]):
    """(lookup by HF name, HF names) over a `modern-bert` GGUF's tensors."""
    return bert.bias_free_gguf_tensors(get, names, _GGUF_GLOBAL, _GGUF_LAYER, "ModernBERT")


def config_from_gguf(meta: dict) -> ModernBertConfig:
    """llama.cpp's `modern-bert` metadata: sizes, the window (local_attention) and its layer pattern, the global
    base as rope.freq_base and the local one as rope.freq_base_swa (10000 where absent), pooling 1 mean, 2 CLS."""
    pre = "modern-bert."

    def key(name: str, default=None):
        v = meta.get(pre + name, default)
        if v is None:
            raise ModelFormatError(f"GGUF metadata lacks '{pre}{name}'")
        return v
    causal = meta.get(pre + "attention.causal", False)
    if not is_flag(causal) or causal:
        raise ModelFormatError(f"GGUF '{pre}attention.causal' must be false (a bidirectional encoder)")
    kind = meta.get(pre + "pooling_type", 1)
    if isinstance(kind, bool) or kind not in (1, 2):
        shown = repr(kind) if isinstance(kind, (int, float, str)) else type(kind).__name__
        raise ModelFormatError(f"GGUF '{pre}pooling_type' {shown[:40]} is not supported (1 mean, 2 CLS)")
    tokens = meta.get("tokenizer.ggml.tokens")
    cfg = {"vocab_size": len(tokens) if isinstance(tokens, list) else key("vocab_size"),
           "hidden_size": key("embedding_length"), "num_hidden_layers": key("block_count"),
           "num_attention_heads": key("attention.head_count"), "intermediate_size": key("feed_forward_length"),
           "max_position_embeddings": key("context_length"), "norm_eps": key("attention.layer_norm_epsilon", 1e-5),
           "local_attention": key("attention.sliding_window"),
           "global_attn_every_n_layers": key("attention.sliding_window_pattern", 3),
           "global_rope_theta": key("rope.freq_base", 160000.0),
           "local_rope_theta": key("rope.freq_base_swa", 10000.0)}
    try:
        return config_from_hf(cfg, pooling={"pooling_mode_cls_token": kind == 2})
    except ModelFormatError as e:      # name the format; the field names are the HF config's spelling
        raise ModelFormatError(str(e).replace("config.json:", f"GGUF metadata ({pre}*):")) from None


class ModernBertEncoder(bert.BertEncoder):
    """The weights of one ModernBERT on a backend, and its batched forward pass."""

    PREFIXES = ("", "model.")

    def _ln_nobias(self, name: str) -> tuple:
        return self._vec(name + ".weight"), self.zeros

    def _load(self) -> None:
        cfg, dense, be = self.cfg, self._prepare, self.backend
        H, F = cfg.hidden, cfg.ffn
        self.zeros = be.prepare_vector(WeightTensor.from_float("zero LayerNorm bias", np.zeros(H, np.float32)))
        self.word = self._f32("embeddings.tok_embeddings.weight", cfg.vocab_size)
        self.emb_ln = self._ln_nobias("embeddings.norm")
        d = cfg.head_dim
        self.inv_freq = {s: 1.0 / (cfg.rope_local if s else cfg.rope_global) ** (np.arange(0, d, 2) / d)
                         for s in (False, True)}
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            self.layers.append({
                "ln1": self._ln_nobias(p + "attn_norm") if i else None,
                "qkv": dense(p + "attn.Wqkv", rows=3 * H, bias=False),
                "o": dense(p + "attn.Wo", bias=False),
                "ln2": self._ln_nobias(p + "mlp_norm"),
                "wi": dense(p + "mlp.Wi", rows=2 * F, bias=False),
                "wo": dense(p + "mlp.Wo", cols=F, bias=False),
                "sliding": cfg.sliding[i],
            })
        self.final_ln = self._ln_nobias("final_norm")
        self.head = None
        if cfg.n_labels:       # ModernBertForSequenceClassification: norm(gelu(dense(pooled))), then the classifier
            self.head = {"dense": dense("head.dense", bias=cfg.head_bias), "norm": self._ln_nobias("head.norm"),
                         "cls": dense("classifier", rows=cfg.n_labels)}

    def _forward(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        cfg, be = self.cfg, self.backend
        H, F = cfg.hidden, cfg.ffn
        rot = bert.packed_rotary(starts, self.inv_freq)
        banded = long_texts(starts, cfg.half)         # texts a local layer must mask
        n = ids.shape[0]
        x = self.word[ids]
        be.add_layernorm(x, None, *self.emb_ln, cfg.eps, x)
        h, ctx = np.empty((n, H), np.float32), np.empty((n, H), np.float32)
        wi = np.empty((n, 2 * F), np.float32)
        for L in self.layers:
            if L["ln1"] is None:
                h[...] = x
            else:
                be.add_layernorm(x, None, *L["ln1"], cfg.eps, h)
            qkv = self._dense(h, L["qkv"], 3 * H)
            be.encoder_rotate(qkv, *rot[L["sliding"]], cfg.n_heads)
            be.encoder_attention(qkv, starts, cfg.n_heads, ctx)
            if L["sliding"]:
                for s in banded:
                    banded_attention(qkv, int(starts[s]), int(starts[s + 1]), cfg.n_heads, cfg.half, ctx)
            x += self._dense(ctx, L["o"], H)
            be.add_layernorm(x, None, *L["ln2"], cfg.eps, h)
            be.dense(h, L["wi"], wi)
            act = np.ascontiguousarray(wi[:, :F])
            be.gelu_erf(act)
            act *= wi[:, F:]
            x += self._dense(act, L["wo"], H)
        be.add_layernorm(x, None, *self.final_ln, cfg.eps, x)
        return x


    def classify(self, hidden: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The sequence-classification logits (b, n_labels): the head on the first token's state or the mean."""
        if self.head is None:
            raise ValueError("this model has no classification head")
        if self.cfg.head_pooling == "cls":
            pooled = np.ascontiguousarray(hidden[starts[:-1]])
        else:
            pooled = np.add.reduceat(hidden, starts[:-1], axis=0) / np.diff(starts)[:, None].astype(np.float32)
            pooled = np.ascontiguousarray(pooled, dtype=np.float32)
        h = self._dense(pooled, self.head["dense"], self.cfg.hidden)
        self.backend.gelu_erf(h)
        self.backend.add_layernorm(h, None, *self.head["norm"], self.cfg.eps, h)
        return self._dense(h, self.head["cls"], self.cfg.n_labels)


ENCODER = ModernBertEncoder

"""EmbeddingGemma (google/embeddinggemma-300m; Ollama's `embeddinggemma`): HF `gemma3_text` with
`use_bidirectional_attention` true, as sentence-transformers saves it, and llama.cpp's `gemma-embedding` GGUF.

Gemma 3's text layers (models/gemma3.py reads their config: q/k RMSNorms, (1 + w) RMSNorms before and after
attention and the MLP, GELU(tanh) gated MLP, embeddings times sqrt(hidden), NEOX RoPE with the local base on
sliding layers and the global one on the others, grouped-query attention) without the causal mask: a token sees
every token of its text in a global layer, and in a sliding layer those at most window // 2 positions away on
either side (transformers sets a bidirectional model's window to window // 2 + 1, exclusive; llama.cpp's
symmetric window is the same), `window` as config.json and the GGUF store it. Then sentence-transformers'
modules: mean pooling, its Dense modules (2_Dense, 3_Dense: bias-free linear layers, Identity activation; the
GGUF's `dense_2` and `dense_3`, written by llama.cpp's converter with --sentence-transformers-dense-modules), and
the L2 normalisation. The last Dense must give back the hidden width (llama.cpp asserts the same).

Attention runs through the packed bidirectional op (encoder_attention) with the key/value heads repeated for their
query groups; it takes no window, so a sliding layer's texts longer than window // 2 + 1 tokens are computed
again with a banded mask in NumPy (a text within that length sees all of itself, as the op computes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from . import bert, gemma3
from .banded import banded_attention, long_texts
from .config import TransformerConfig
from .hparams import is_flag

ST_DENSE = True             # formats/hf_dir.py: pass sentence-transformers' Dense modules to config_from_hf
ARCH = "gemma-embedding"
_IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity", None)


@dataclass
class EmbeddingGemmaConfig(bert.BertConfig):
    """The encoder plumbing's fields (a BertConfig: api.py loads it as an encoder), Gemma 3's text config in
    `text`, and the Dense modules after pooling."""
    text: TransformerConfig | None = None
    dense: list = field(default_factory=list)     # (in, out) of each Dense module after pooling, in order

    # memory.encoder_plan: gate, up and down per layer; no position table
    ffn_matrices = 3
    position_rows = 0
    table_resident = False        # the token table stays in the file's type, its rows read per batch


def _wrap(text: TransformerConfig, dense: list, max_tokens: int, where: str) -> EmbeddingGemmaConfig:
    text.arch = ARCH
    if text.rope_scaling:
        raise ModelFormatError(f"{where}: rope scaling is not supported for EmbeddingGemma")
    if text.attn_softcap:
        raise ModelFormatError(f"{where}: attention logit soft-capping is not supported for EmbeddingGemma")
    if text.n_heads % text.n_kv_heads or text.head_dim % 2:
        raise ModelFormatError(f"{where}: {text.n_heads} query heads of width {text.head_dim} do not take "
                               f"{text.n_kv_heads} key/value heads")
    width = text.d_model
    for i, (fin, fout) in enumerate(dense):
        if fin != width:
            raise ModelFormatError(f"{where}: Dense module {i} takes {fin} features, the one before gives {width}")
        width = fout
    if width != text.d_model:
        raise ModelFormatError(f"{where}: the last Dense module gives {width} features, not the hidden width "
                               f"{text.d_model}")
    return EmbeddingGemmaConfig(vocab_size=text.vocab_size, hidden=text.d_model, n_layers=text.n_layers,
                                n_heads=text.n_heads, ffn=text.ffn_dim, max_positions=text.n_ctx_train, type_vocab=0,
                                eps=text.norm_eps, max_tokens=max_tokens, arch=ARCH, text=text, dense=dense)


def _dense_dims(modules: list | None) -> list:
    out = []
    for i, m in enumerate(modules or []):
        cfg = m if isinstance(m, dict) else {}
        fin, fout = cfg.get("in_features"), cfg.get("out_features")
        if any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 18 for v in (fin, fout)):
            raise ModelFormatError(f"Dense module {i}: in_features / out_features must be integers, got {fin!r}, "
                                   f"{fout!r}")
        if cfg.get("bias", True) is not False:
            raise ModelFormatError(f"Dense module {i}: a bias is not supported (EmbeddingGemma's have none)")
        if cfg.get("activation_function") not in _IDENTITY:
            raise ModelFormatError(f"Dense module {i}: activation {cfg.get('activation_function')!r} is not "
                                   f"supported (Identity only)")
        out.append((fin, fout))
    return out


def config_from_hf(cfg: dict, pooling: dict | None = None, st_config: dict | None = None,
                   dense: list | None = None) -> EmbeddingGemmaConfig:
    if cfg.get("use_bidirectional_attention") is not True:
        raise ModelFormatError("config.json: EmbeddingGemma needs use_bidirectional_attention true")
    if pooling and any(pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                                "pooling_mode_mean_sqrt_len_tokens",
                                                "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")):
        raise ModelFormatError("1_Pooling/config.json: only mean pooling is supported for EmbeddingGemma")
    text = gemma3.config_from_hf(cfg)
    max_tokens = text.n_ctx_train
    seq = (st_config or {}).get("max_seq_length")
    if isinstance(seq, int) and not isinstance(seq, bool) and 1 <= seq < max_tokens:
        max_tokens = seq
    return _wrap(text, _dense_dims(dense), max_tokens, "config.json")


def config_from_gguf(meta: dict) -> EmbeddingGemmaConfig:
    """llama.cpp's `gemma-embedding` metadata: Gemma 3's keys under its name (the GGUF's norms hold 1 + w), its
    pooling type (1, mean), `dense_2_feat_in/out` and `dense_3_feat_in/out` where the Dense layers are kept."""
    pre = ARCH + "."
    causal = meta.get(pre + "attention.causal", False)
    if not is_flag(causal) or causal:
        raise ModelFormatError(f"GGUF '{pre}attention.causal' must be false (a bidirectional encoder)")
    kind = meta.get(pre + "pooling_type", 1)
    if isinstance(kind, bool) or kind != 1:
        shown = repr(kind) if isinstance(kind, (int, float, str)) else type(kind).__name__
        raise ModelFormatError(f"GGUF '{pre}pooling_type' {shown[:40]} is not supported (1, mean)")
    renamed = {("gemma3." + k[len(pre):] if k.startswith(pre) else k): v for k, v in meta.items()}
    renamed["general.architecture"] = "gemma3"
    try:
        text = gemma3.config_from_gguf(renamed)
    except ModelFormatError as e:
        raise ModelFormatError(str(e).replace("gemma3.", pre)) from None
    dense = []
    for name in ("dense_2", "dense_3"):
        dims = [meta.get(f"{pre}{name}_feat_{k}") for k in ("in", "out")]
        if dims == [None, None]:
            continue
        dense.append({"in_features": dims[0], "out_features": dims[1], "bias": False})
    return _wrap(text, _dense_dims(dense), text.n_ctx_train, f"GGUF metadata ({pre}*)")


_GGUF_GLOBAL = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
                "dense_2.weight": "st_dense.0.weight", "dense_3.weight": "st_dense.1.weight"}
_GGUF_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
               "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm"}


def gguf_tensors(get, names: list[str]):
    """(lookup by HF name, HF names) over a `gemma-embedding` GGUF's tensors (Dense layers as `st_dense.K`)."""
    return bert.bias_free_gguf_tensors(get, names, _GGUF_GLOBAL, _GGUF_LAYER, "EmbeddingGemma")


class EmbeddingGemmaEncoder(bert.BertEncoder):
    """The weights of one EmbeddingGemma on a backend, and its batched forward pass and pooling (BertEncoder's
    loading helpers, forward entry and batch packing)."""

    PREFIXES = ("", "model.")

    def _norm(self, name: str, n: int) -> np.ndarray:
        w = self._get(name, (n,)).to_float32().astype(np.float32).reshape(n)
        return (w + np.float32(self.cfg.text.norm_offset)).astype(np.float32)

    def _load(self) -> None:
        t, be = self.cfg.text, self.backend
        H, F, hd = t.d_model, t.ffn_dim, t.head_dim
        qd, kd = t.n_heads * hd, t.n_kv_heads * hd
        # the table stays in the file's type (262144 x 768 in float32 would be 805 MB): a batch dequantizes its rows
        self.word = self._get("embed_tokens.weight", (t.vocab_size, H))
        self.word.take_rows([0]).to_float32()           # (a type no dequantizer reads: refused at load)
        self.layers = []
        for i in range(t.n_layers):
            p = f"layers.{i}."
            w = np.concatenate([self._f32(p + f"self_attn.{k}_proj.weight", r, H)
                                for k, r in (("q", qd), ("k", kd), ("v", kd))])
            self.layers.append({
                "qkv": be.prepare_dense(w, None),
                "o": be.prepare_dense(self._f32(p + "self_attn.o_proj.weight", H, qd), None),
                "q_norm": self._norm(p + "self_attn.q_norm.weight", hd),
                "k_norm": self._norm(p + "self_attn.k_norm.weight", hd),
                "ln_in": self._norm(p + "input_layernorm.weight", H),
                "ln_post_attn": self._norm(p + "post_attention_layernorm.weight", H),
                "ln_pre_ffn": self._norm(p + "pre_feedforward_layernorm.weight", H),
                "ln_post_ffn": self._norm(p + "post_feedforward_layernorm.weight", H),
                "gate": be.prepare_dense(self._f32(p + "mlp.gate_proj.weight", F, H), None),
                "up": be.prepare_dense(self._f32(p + "mlp.up_proj.weight", F, H), None),
                "down": be.prepare_dense(self._f32(p + "mlp.down_proj.weight", H, F), None),
                "sliding": bool(t.layer_sliding[i]) if t.layer_sliding else False,
            })
        self.final_norm = self._norm("norm.weight", H)
        self.dense = [be.prepare_dense(self._f32(f"st_dense.{k}.weight", fout, fin), None)
                      for k, (fin, fout) in enumerate(self.cfg.dense)]
        self.inv_freq = {s: t.inv_freq(sliding=s).astype(np.float64) for s in (False, True)}
        # encoder_attention scales by 1/sqrt(head_dim): q carries the rest of the model's scale
        self.q_scale = np.float32(t.scale() * math.sqrt(hd))
        self.half = t.sliding_window // 2
        self.head = None            # (no classification head)

    def _forward(self, ids: np.ndarray, type_ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Final-normed hidden states (n, hidden) of texts packed back to back (no token types)."""
        t, be = self.cfg.text, self.backend
        H, F, hd, nh, nkv = t.d_model, t.ffn_dim, t.head_dim, t.n_heads, t.n_kv_heads
        qd, kd, groups = nh * hd, nkv * hd, nh // nkv
        rot = bert.packed_rotary(starts, self.inv_freq)
        banded = long_texts(starts, self.half)         # texts a local layer must mask
        n = ids.shape[0]
        u, inv = np.unique(ids, return_inverse=True)
        x = self.word.take_rows(u).to_float32().reshape(len(u), H)[inv.reshape(-1)] * np.float32(t.embed_scale)
        x = np.ascontiguousarray(x, dtype=np.float32)
        h = np.empty((n, H), np.float32)
        qkv = np.empty((n, 3 * qd), np.float32)
        ctx = np.empty((n, qd), np.float32)
        gate, up = np.empty((n, F), np.float32), np.empty((n, F), np.float32)
        for L in self.layers:
            be.rmsnorm(x, L["ln_in"], t.norm_eps, h)
            raw = self._dense(h, L["qkv"], qd + 2 * kd)
            q = np.ascontiguousarray(raw[:, :qd]).reshape(n * nh, hd)
            k = np.ascontiguousarray(raw[:, qd:qd + kd]).reshape(n * nkv, hd)
            be.rmsnorm(q, L["q_norm"], t.norm_eps, q)
            be.rmsnorm(k, L["k_norm"], t.norm_eps, k)
            qkv[:, :qd] = q.reshape(n, qd) * self.q_scale
            qkv[:, qd:2 * qd] = np.repeat(k.reshape(n, nkv, hd), groups, axis=1).reshape(n, qd)
            qkv[:, 2 * qd:] = np.repeat(raw[:, qd + kd:].reshape(n, nkv, hd), groups, axis=1).reshape(n, qd)
            be.encoder_rotate(qkv, *rot[L["sliding"]], nh)
            be.encoder_attention(qkv, starts, nh, ctx)
            if L["sliding"]:
                for s in banded:
                    banded_attention(qkv, int(starts[s]), int(starts[s + 1]), nh, self.half, ctx)
            att = self._dense(ctx, L["o"], H)
            be.rmsnorm(att, L["ln_post_attn"], t.norm_eps, att)
            x += att
            be.rmsnorm(x, L["ln_pre_ffn"], t.norm_eps, h)
            be.dense(h, L["gate"], gate)
            be.dense(h, L["up"], up)
            be.gelu_mul(gate, up, gate)
            be.dense(gate, L["down"], att)
            be.rmsnorm(att, L["ln_post_ffn"], t.norm_eps, att)
            x += att
        be.rmsnorm(x, self.final_norm, t.norm_eps, x)
        return x

    def pool(self, hidden: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """One L2-normalized vector per text: the mean over its tokens, through the Dense modules."""
        v = np.add.reduceat(hidden, starts[:-1], axis=0) / np.diff(starts)[:, None].astype(np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        for d, (_, fout) in zip(self.dense, self.cfg.dense):
            v = self._dense(v, d, fout)
        norm = np.linalg.norm(v, axis=-1, keepdims=True)
        return (v / np.maximum(norm, 1e-12)).astype(np.float32)

ENCODER = EmbeddingGemmaEncoder

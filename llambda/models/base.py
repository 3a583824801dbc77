"""The decoder-only transformer, written once against the Backend interface.

Architectures differ by configuration (norm placement, biases, q/k norms,
activation, windows, soft-capping) and by how their files name tensors; the
per-architecture files in this package only translate those. Tensor names
here are GGUF's (`blk.{i}.attn_q.weight`), the canonical names of this engine.

One forward call evaluates a batch of tokens, each tagged with the KV-cache
slot (sequence) it belongs to and its position, and returns logits for the
rows asked for. Every buffer it writes was allocated in `Workspace` at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .. import switches
from ..finite import negated_exp
from ..errors import ContextOverflowError, InvalidInputError, ModelFormatError
from ..formats.weights import WeightTensor
from .closable import Closable
from .config import (ATTENTION_KINDS, MAMBA2_KINDS, RELU2_SCALARS, UNGATED_ACTIVATIONS, TransformerConfig,
                     xielu_scalars)
from .mla import LatentAttention, MLAWeights, add_workspace_specs, mla_compressed
from .row_groups import grouped_rows

TensorLookup = Callable[[str], Optional[WeightTensor]]


@dataclass
class LayerWeights:
    attn_norm: np.ndarray | None          # None without pre-norms (OLMo 2)
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: np.ndarray | None
    w_gate: object = None           # the dense MLP (None in an MoE layer)
    w_up: object = None
    w_down: object = None
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    moe: "MoEWeights | None" = None   # set in an MoE layer instead of w_gate/w_up/w_down
    bo: np.ndarray | None = None      # attention output bias (GPT-OSS)
    sinks: np.ndarray | None = None   # a sink logit per head (GPT-OSS)
    conv: "ShortConvWeights | None" = None   # a short-conv layer (LFM2): set instead of wq/wk/wv/wo
    delta: "DeltaNetWeights | None" = None   # a gated delta-net layer (Qwen3-Next): the same
    mamba: "Mamba2Weights | None" = None     # a Mamba2 layer (Granite 4): the same; beside wq/wk/wv/wo in a
                                             # Falcon-H1 layer (attn_mamba2), both reading the same normed input
    mamba1: "MambaWeights | None" = None     # a Mamba 1 layer (models/mamba.py): the same
    wq_gate: object = None            # attention output gate rows (Qwen3-Next): out *= sigmoid(h . wq_gate)
    mla: "MLAWeights | None" = None   # latent attention (DeepSeek): set instead of wq/wk/wv (wo stays)
    act: tuple | None = None          # an MLP without a gate (w_gate None): the xielu op's scalars (config.py)
    attn_norm_b: np.ndarray | None = None   # layer norms' biases (StarCoder2)
    ffn_norm_b: np.ndarray | None = None
    b_up: np.ndarray | None = None    # the dense MLP's biases (StarCoder2)
    b_down: np.ndarray | None = None


@dataclass
class ShortConvWeights:
    """LFM2's gated short convolution: in_proj -> B, C, x; out_proj(C * conv(B * x))."""
    in_proj: object                 # (3 d_model, d_model): B rows, then C rows, then x rows
    kernel: np.ndarray              # (d_model, L) float32: channel c's weights, oldest input first
    out_proj: object                # (d_model, d_model)


@dataclass
class DeltaNetWeights:
    """Qwen3-Next's gated delta net, its projections regrouped at load (see grouped_rows)."""
    in_qkv: object                  # (2 k_heads dk + v_heads dv, d_model): q heads, k heads, v heads
    in_z: object                    # (v_heads dv, d_model): the output gate
    in_ba: object                   # (2 v_heads, d_model): b (beta) then a (decay) per value head
    kernel: np.ndarray              # (2 k_heads dk + v_heads dv, L) float32: the convolution
    a_neg: np.ndarray               # (v_heads,): -exp(A_log)
    dt_bias: np.ndarray             # (v_heads,)
    norm: np.ndarray                # (dv,): the gated RMSNorm's weight (plain w)
    out_proj: object                # (d_model, v_heads dv)


@dataclass
class Mamba2Weights:
    """A Mamba2 layer (Granite 4), in_proj split at load into its z, xBC and dt rows."""
    in_z: object                    # (H P, d_model): the output gate
    in_xbc: object                  # (H P + 2 G N, d_model): x, then B and C of every group
    in_dt: object                   # (H, d_model)
    kernel: np.ndarray              # (H P + 2 G N, L) float32: the convolution
    conv_bias: np.ndarray | None    # (H P + 2 G N,); None without (Falcon-H1's mamba_conv_bias false)
    a_neg: np.ndarray               # (H,): -exp(A_log)
    dt_bias: np.ndarray             # (H,)
    d_skip: np.ndarray              # (H,): D
    norm: np.ndarray | None         # (H P,): the gated group norm's weight; None: no norm (cfg.mamba_norm)
    out_proj: object                # (d_model, H P)


@dataclass
class MambaWeights:
    """A Mamba 1 layer (models/mamba.py), in_proj and x_proj split at load into their parts' rows."""
    in_x: object                    # (D, d_model): the convolution's input
    in_z: object                    # (D, d_model): the output gate
    kernel: np.ndarray              # (D, L) float32: the convolution
    conv_bias: np.ndarray           # (D,)
    x_dt: object                    # (R, D): dt's low-rank input
    x_b: object                     # (N, D)
    x_c: object                     # (N, D)
    dt_proj: object                 # (D, R)
    dt_bias: np.ndarray             # (D,): dt_proj's bias
    a_neg: np.ndarray               # (D, N): -exp(A_log), never positive
    d_skip: np.ndarray              # (D,): D
    out_proj: object                # (d_model, D)
    dt_norm: np.ndarray | None = None   # (R,), (N,), (N,): the RMS norms over dt_low, B and C (Jamba's weights;
                                        # FalconMamba's weightless ones as ones)
    b_norm: np.ndarray | None = None
    c_norm: np.ndarray | None = None


@dataclass
class MoEWeights:
    router: object                  # (n_experts, d_model): one logit per expert
    experts: object                 # the backend's handle of the gate/up/down expert tensors
    shared_gate: object = None      # the shared expert (Qwen2-MoE), a dense MLP every token goes through
    shared_up: object = None
    shared_down: object = None
    shared_gate_inp: object = None  # (1, d_model): its output is scaled by sigmoid(h . w)
    router_bias: np.ndarray | None = None
    choice_bias: np.ndarray | None = None   # (n_experts,) added to the scores for the choice only (DeepSeek-V3)


def kv_rows(cfg: TransformerConfig, compressed: bool) -> tuple[int, int]:
    """(kv heads, head size) of a cache row: latent attention's compressed one, one head [R k_pe, normed kv]
    whose values are the same rows (their kv part), or n_kv_heads keys and values of head_dim."""
    return (1, cfg.rope_dim + cfg.kv_lora_rank) if compressed else (cfg.n_kv_heads, cfg.head_dim)


class Workspace:
    """Every activation buffer of a forward pass, sized for `max_tokens` per call.

    All buffers come from one backend allocation made at load (`backend.allocate`),
    together with the KV cache, so a forward pass allocates nothing.
    """

    def __init__(self, cfg: TransformerConfig, max_tokens: int, max_logit_rows: int, extra: dict | None = None,
                 mlp_width: int | None = None, mla_compressed: bool = False):
        """`mlp_width`: the dense MLP's hidden size its gate and up buffers hold (mlp_width(); default
        cfg.ffn_dim); 0 in a model whose every layer is MoE: no such buffers. `mla_compressed`: latent
        attention's buffers for its compressed cache (mla_compressed()), else for the expanded heads."""
        t = max_tokens
        mlp = cfg.ffn_dim if mlp_width is None else mlp_width
        self.max_tokens, self.max_logit_rows = t, max_logit_rows
        f32, i32 = np.float32, np.int32
        self.specs = {
            "x": ((t, cfg.d_model), f32),
            "h": ((t, cfg.d_model), f32),
            "proj": ((t, cfg.d_model), f32),
            "q": ((t, cfg.n_heads, cfg.head_dim), f32),
            "k": ((t, cfg.n_kv_heads, cfg.head_dim), f32),
            "v": ((t, cfg.n_kv_heads, cfg.head_dim), f32),
            "attn": ((t, cfg.n_heads, cfg.head_dim), f32),
            "last": ((max_logit_rows, cfg.d_model), f32),
            "logits": ((max_logit_rows, cfg.vocab_size), f32),
            "tokens": ((t,), i32),
            "slots": ((t,), i32),
            "pos": ((t,), i32),
        }
        if cfg.rope_sections:       # M-RoPE: each row's position per section, a section's rows contiguous
            self.specs["rope_pos"] = ((len(cfg.rope_sections), t), i32)
        if mlp:
            self.specs.update({"gate": ((t, mlp), f32), "up": ((t, mlp), f32)})
        if "shortconv" in cfg.layer_kinds:
            self.specs["bcx"] = ((t, 3 * cfg.d_model), f32)
        if "deltanet" in cfg.layer_kinds:
            c, vd = 2 * cfg.ssm_k_heads * cfg.ssm_k_dim + cfg.ssm_v_heads * cfg.ssm_v_dim, cfg.ssm_v_heads * cfg.ssm_v_dim
            self.specs.update({"dqkv": ((t, c), f32), "dconv": ((t, c), f32), "dz": ((t, vd), f32),
                               "dba": ((t, 2 * cfg.ssm_v_heads), f32), "dout": ((t, vd), f32)})
        if any(k in cfg.layer_kinds for k in MAMBA2_KINDS):
            c, xd = cfg.ssm_v_heads * cfg.ssm_v_dim + 2 * cfg.ssm_k_heads * cfg.ssm_k_dim, cfg.ssm_v_heads * cfg.ssm_v_dim
            self.specs.update({"mxbc": ((t, c), f32), "mconv": ((t, c), f32), "mz": ((t, xd), f32),
                               "mdt": ((t, cfg.ssm_v_heads), f32), "mout": ((t, xd), f32)})
        if "mamba" in cfg.layer_kinds:         # Mamba 1: x (later dt), z, the convolution, dt_low, B, C, the scan
            D, N = cfg.ssm_inner, cfg.ssm_k_dim
            self.specs.update({"sx": ((t, D), f32), "sz": ((t, D), f32), "sconv": ((t, D), f32),
                               "sdt": ((t, cfg.ssm_dt_rank), f32), "sb": ((t, N), f32), "sc": ((t, N), f32),
                               "sout": ((t, D), f32)})
        if "attn_mamba2" in cfg.layer_kinds or cfg.parallel_ffn_norm:   # the attention's output, held while the
            self.specs["par"] = ((t, cfg.d_model), f32)                   # mixer (or GPT-NeoX's parallel MLP) runs
        if cfg.attn_out_gate:
            self.specs["qgate"] = ((t, cfg.q_dim), f32)
        if cfg.mla:
            add_workspace_specs(self.specs, cfg, t, mla_compressed)
        if cfg.n_experts:
            self.specs["router"] = ((t, cfg.n_experts), f32)
        if cfg.shared_ffn_dim:
            self.specs.update({"sh_gate": ((t, cfg.shared_ffn_dim), f32), "sh_up": ((t, cfg.shared_ffn_dim), f32),
                               "sh_out": ((t, cfg.d_model), f32), "sh_logit": ((t, 1), f32)})
        if getattr(cfg, "altup_inputs", 0):      # Gemma 3n's streams and per-layer inputs
            from .gemma3n_net import workspace_specs
            self.specs.update(workspace_specs(cfg, t))
        self.specs.update(extra or {})     # the backend's own scratch (its MoE layers')

    def bind(self, arrays: dict) -> None:
        for name in self.specs:
            setattr(self, name, arrays[name])

    def nbytes(self) -> int:
        return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in self.specs.values())


def layer_is_moe(cfg: TransformerConfig, get: TensorLookup, i: int) -> bool:
    """Whether layer i runs experts. The config says which layers are MoE; a GGUF file cannot, so a layer
    that holds a dense MLP and no router is dense (a leading dense layer, as Qwen3-MoE may have)."""
    p = f"blk.{i}."
    return bool(cfg.moe_layers[i]) and (get(p + "ffn_gate_inp.weight") is not None or get(p + "ffn_gate.weight") is None)


def mlp_width(cfg: TransformerConfig, get: TensorLookup) -> int:
    """The hidden size of the model's dense MLPs, what the workspace's gate and up buffers hold: cfg.ffn_dim,
    or 0 where every layer is MoE (their experts and shared expert have buffers of their own)."""
    get = unfused_lookup(get, cfg)
    return cfg.ffn_dim if not all(layer_is_moe(cfg, get, i) for i in range(cfg.n_layers)) else 0


def unfused_lookup(get: TensorLookup, cfg: TransformerConfig) -> TensorLookup:
    """Serve separate q/k/v and gate/up from fused tensors when a file has only those
    (Phi-3: `attn_qkv` holds q, k, v rows; `ffn_up`, 2*ffn_dim tall, holds gate rows then up rows)."""
    def lookup(name: str) -> WeightTensor | None:
        t = get(name)
        if t is None and name.endswith((".attn_q.bias", ".attn_k.bias", ".attn_v.bias")):
            return _fused_bias(get, cfg, name)
        if not name.endswith(".weight"):
            return t
        layer, _, leaf = name[:-len(".weight")].rpartition(".")
        if t is None and leaf in ("attn_q", "attn_k", "attn_v"):
            qkv = get(f"{layer}.attn_qkv.weight")
            if qkv is not None:
                parts = qkv.split_rows([cfg.q_dim, cfg.kv_dim, cfg.kv_dim])
                return parts[("attn_q", "attn_k", "attn_v").index(leaf)]
        if leaf in ("ffn_gate", "ffn_up"):
            up = get(f"{layer}.ffn_up.weight")
            if up is not None and up.rows == 2 * cfg.ffn_dim and get(f"{layer}.ffn_gate.weight") is None:
                return up.split_rows([cfg.ffn_dim, cfg.ffn_dim])[leaf == "ffn_up"]
        return t

    return lookup


def _fused_bias(get: TensorLookup, cfg: TransformerConfig, name: str) -> WeightTensor | None:
    """q, k or v's part of a fused `attn_qkv.bias` (GPT-NeoX's GGUF: q, k, v in that order), or None without one."""
    layer, _, leaf = name[:-len(".bias")].rpartition(".")
    fused = get(f"{layer}.attn_qkv.bias")
    if fused is None:
        return None
    v = fused.to_float32().reshape(-1)
    if v.size != cfg.q_dim + 2 * cfg.kv_dim:
        raise ModelFormatError(f"tensor {fused.name!r} has {v.size} values, expected {cfg.q_dim + 2 * cfg.kv_dim} "
                               "(q, k and v biases)")
    start = {"attn_q": 0, "attn_k": cfg.q_dim, "attn_v": cfg.q_dim + cfg.kv_dim}[leaf]
    return WeightTensor.from_float(fused.name, v[start:start + (cfg.q_dim if leaf == "attn_q" else cfg.kv_dim)])


def recurrent_state_specs(cfg: TransformerConfig, n_slots: int) -> tuple[list[int], list[int], dict]:
    """A hybrid model's recurrent state, carved with the KV cache: the short-conv, delta-net and Mamba2 layers
    (the layers with a convolution window; those with a per-head matrix, (heads, dk, dv) for a delta net,
    (heads, N, P) for Mamba2) and the arrays' (shape, dtype) by name."""
    kinds = cfg.layer_kinds
    conv = [i for i, kind in enumerate(kinds) if kind not in ("attention", "mlp")]
    delta = [i for i, kind in enumerate(kinds) if kind in ("deltanet", "mamba") or kind in MAMBA2_KINDS]
    width = {i: cfg.d_model if kinds[i] == "shortconv" else cfg.ssm_inner if kinds[i] == "mamba" else
             2 * cfg.ssm_k_heads * cfg.ssm_k_dim + cfg.ssm_v_heads * cfg.ssm_v_dim for i in conv}
    state = {f"conv_state{i}": ((n_slots, cfg.conv_kernel - 1, width[i]), np.float32) for i in conv}
    state.update({f"delta_state{i}": ((n_slots, cfg.ssm_inner, cfg.ssm_k_dim) if kinds[i] == "mamba" else
                                      (n_slots, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim), np.float32)
                  for i in delta})
    if conv:
        state["state_pos"] = ((len(conv) + len(delta), n_slots), np.int32)
    return conv, delta, state


def live_server(model):
    """The server scheduler's thread running `model`'s forwards now (its `served_by`, while alive), or None."""
    thread = getattr(model, "served_by", None)
    return thread if thread is not None and thread.is_alive() else None


class Transformer(Closable, LatentAttention):
    def __init__(self, cfg: TransformerConfig, tensors: TensorLookup, backend, n_ctx: int, n_slots: int = 1,
                 max_tokens: int = 512, max_logit_rows: int | None = None, release=None, file_names=None):
        """`release(data)`, when given, is told each matrix's file bytes once the backend has its own copy
        (`ModelSource.release`): the file's pages then leave memory tensor by tensor as they are packed.
        `file_names(name)`, when given, are the file's own names for a canonical one (`ModelSource.file_names`):
        a missing tensor is named by them."""
        cfg.validate()
        if cfg.ctx_limit and n_ctx > cfg.ctx_limit:
            why = (f"its learned position table has {cfg.ctx_limit} rows" if cfg.pos_embd else
                   "its Dynamic NTK RoPE changes past that, which is not computed here")
            raise InvalidInputError(f"a context of {n_ctx} tokens is past the {cfg.ctx_limit} this {cfg.arch} model "
                                    f"runs exactly ({why})")
        self.cfg, self.backend = cfg, backend
        self._release = release or (lambda data: 0)   # harmless where a backend kept a view: it faults back
        self.n_ctx, self.n_slots = n_ctx, n_slots
        # the thread of the server scheduler that runs (or last ran) this model, its buffers and slots
        self.served_by = None
        self.mla_compressed = mla_compressed(cfg, backend)
        self.g3n = None           # Gemma 3n's own layers (models/gemma3n_net.py)
        try:
            self._load(tensors, file_names)
        except ModelFormatError as e:
            if not cfg.source or cfg.source in str(e):
                raise
            # name the file, as opening does; of the same type (a LoRA merge's AdapterError stays one)
            raise type(e)(f"{cfg.source}: {e}") from None
        width = cfg.ffn_dim if any(L.moe is None for L in self.layers) else 0     # no dense MLP: no gate/up buffers
        self.ws = Workspace(cfg, max_tokens, max_logit_rows or max(n_slots, 16), backend.workspace_specs(cfg, max_tokens),
                            mlp_width=width, mla_compressed=self.mla_compressed)
        # Only attention layers have keys and values: layer i's are the cache's layer kv_layer[i]; a layer
        # sharing another's (Gemma 3n) reads that one's and has none of its own.
        self.kv_layer = {i: j for j, i in enumerate(cfg.cache_layers())}
        self.kv_layer.update({i: self.kv_layer[cfg.kv_source(i)] for i in range(cfg.n_layers)
                              if cfg.kv_source(i) != i})
        # A short-conv layer's state per slot: its last L - 1 inputs, and how many tokens it has taken
        # in (state_pos): allocated here with the cache, reset by a token at position 0.
        # A delta-net layer's: its convolution's window and its (v_heads, dk, dv) matrix, each counted.
        conv, delta, state = recurrent_state_specs(cfg, n_slots)
        self.cache = backend.create_kv_cache(max(1, len(cfg.cache_layers())), n_slots, n_ctx, *kv_rows(cfg, self.mla_compressed),
                                             extra={**self.ws.specs, **state}, values_are_keys=self.mla_compressed)
        self.conv_state = {i: self.cache.extra.pop(f"conv_state{i}") for i in conv}
        self.delta_state = {i: self.cache.extra.pop(f"delta_state{i}") for i in delta}
        pos = self.cache.extra.pop("state_pos") if conv else None
        self.state_pos = {i: pos[k] for k, i in enumerate(conv)}                 # each op keeps its own count
        self.delta_pos = {i: pos[len(conv) + k] for k, i in enumerate(delta)}
        self._state_rows = pos
        self.cache.state = list(self.conv_state.values()) + list(self.delta_state.values()) + ([pos] if conv else [])
        self.ws.bind(self.cache.extra)
        self._fill_ones()
        self._plans: dict[int, object] = {}
        self._input_views = (memoryview(self.ws.tokens), memoryview(self.ws.slots), memoryview(self.ws.pos))
        self._rope_views = tuple(memoryview(r) for r in self.ws.rope_pos) if cfg.rope_sections else ()
        self._images = self._kend = None     # the current forward's image rows (forward's images) and kend
        # DeepStack levels an image's rows carry (Qwen3-VL: the attached tower's; models/image_input.py sets it)
        self.deepstack = cfg.deepstack_levels

    def _fill_ones(self) -> None:
        """An ungated MLP's activation runs as act_mul(u, ones): ws.up, which only a gated MLP writes, holds
        the ones (set once here; no op writes it in such a model)."""
        self._ones = None
        if self.cfg.activation != "gelu_erf" and any(       # (gelu_erf runs in place: no ones)
                getattr(L, "w_gate", 0) is None and getattr(L, "moe", 0) is None
                and getattr(L, "w_up", None) is not None and getattr(L, "act", None) is None for L in self.layers):
            self.ws.up[...] = 1.0
            self._ones = self.ws.up

    # -- loading -----------------------------------------------------------
    def _load(self, get: TensorLookup, file_names=None) -> None:
        cfg, B = self.cfg, self.backend
        get = unfused_lookup(get, cfg)

        def need(name: str) -> WeightTensor:
            t = get(name)
            if t is None:
                known = file_names(name) if file_names else []
                what = f"{' or '.join(map(repr, known))} ({name})" if known else repr(name)
                raise ModelFormatError(f"missing tensor {what}, which a {cfg.arch} model of this config has")
            return t

        def matrix(name: str, rows: int, cols: int, parts=None):
            """The matrix, or with parts (row indices per part, grouped_rows) one matrix per part."""
            t = need(name)
            if t.shape != (rows, cols):
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected {(rows, cols)}")
            m = B.prepare_matrix(t) if parts is None else [B.prepare_matrix(t.take_rows(ix)) for ix in parts]
            self._release(t.data)
            return m

        def vector(name: str, n: int, offset: float = 0.0, required: bool = True):
            t = get(name) if not required else need(name)
            if t is None:
                return None
            if t.cols != n or t.rows != 1:     # (1, n) as llama.cpp takes too; an (8, 8) norm is no (64,) one
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected ({n},)")
            v = B.prepare_vector(t, offset)
            finite(name, t, v)
            self._release(t.data)
            return v

        def shown(name: str, t: WeightTensor) -> str:
            """Canonical `name` as errors show it: by the file's own name where it differs (a HF checkpoint's)."""
            return repr(name) if t.name == name else f"{t.name!r} ({name})"

        def finite(name: str, t: WeightTensor, v: np.ndarray) -> None:
            # A NaN in a norm weight or bias silently poisons every logit; vectors are small, so
            # they are all checked (matrices are not: that would cost a pass over the whole model).
            bad = np.flatnonzero(~np.isfinite(v))
            if len(bad):
                raise ModelFormatError(f"tensor {shown(name, t)} holds {v[bad[0]]} at index {int(bad[0])} "
                                       f"({len(bad)} non-finite values): the model file is corrupt")

        d, off = cfg.d_model, cfg.norm_offset
        self.tok_embd = matrix("token_embd.weight", cfg.vocab_size, d)
        # GPT-2's learned absolute positions: a row per position, added to the token's embedding
        self.pos_embd = matrix("position_embd.weight", cfg.n_ctx_train, d) if cfg.pos_embd else None
        out = get("output.weight")
        self.output = self.tok_embd if (out is None and cfg.tie_embeddings) else matrix("output.weight", cfg.vocab_size, d)
        self.output_norm = vector("output_norm.weight", d, off)
        self.output_norm_b = vector("output_norm.bias", d) if cfg.norm_bias else None
        self.output_b = vector("output.bias", cfg.vocab_size) if cfg.output_bias else None    # Phi-2's lm_head bias
        # LayerNorm without a bias adds these zeros; per-head q/k norm weights (Cohere) multiply the heads
        # normed with unit weights
        self._zeros = {n: np.zeros(n, np.float32) for n in {d, cfg.head_dim, cfg.q_dim, cfg.kv_dim}}
        self._unit = np.ones(cfg.head_dim, np.float32)
        rf = get("rope_freqs.weight")
        if rf is not None and (rf.cols != cfg.rope_dim // 2 or rf.rows != 1):
            raise ModelFormatError(f"tensor {shown('rope_freqs.weight', rf)} has shape {rf.shape}, expected ({cfg.rope_dim // 2},): "
                                   "one factor per pair of rotated dimensions")
        self.rope_factors = None if rf is None else rf.to_float32().reshape(-1)
        if rf is not None:
            finite("rope_freqs.weight", rf, self.rope_factors)
        self.inv_freq = {s: cfg.inv_freq(sliding=s) for s in set(cfg.layer_sliding)}
        if self.rope_factors is not None:
            with np.errstate(all="ignore"):
                self.inv_freq = {s: (f / self.rope_factors).astype(np.float32) for s, f in self.inv_freq.items()}
            if not all(np.isfinite(f).all() for f in self.inv_freq.values()):
                # a 0 (or a denormal) divisor: every logit was NaN, refused only at the first forward step
                raise ModelFormatError("tensor 'rope_freqs.weight' holds a factor (0 or near it) that makes the "
                                       "RoPE frequencies divided by it infinite")
        def experts(name: str, rows: int, cols: int | None) -> WeightTensor:
            """A 3-D expert tensor, or with cols None a 2-D one of per-expert biases."""
            t = need(name)
            want = (cfg.n_experts, rows) if cols is None else (cfg.n_experts, rows, cols)
            if t.shape != want:
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected {want}")
            if cols is None:
                finite(name, t, t.to_float32())
            return t

        def moe_weights(p: str) -> MoEWeights:
            e, sh = cfg.expert_ffn_dim, cfg.shared_ffn_dim
            # read only where the architecture has one (a stray one is refused as unread: check_all_read)
            gate_inp = need(p + "ffn_gate_inp_shexp.weight") if sh and cfg.shared_expert_gate else None
            biases = None
            if cfg.moe_bias:
                biases = tuple(experts(p + f"ffn_{w}_exps.bias", rows, None)
                               for w, rows in (("gate", e), ("up", e), ("down", d)))
            if gate_inp is not None and (gate_inp.cols != d or gate_inp.rows != 1):
                raise ModelFormatError(f"tensor {gate_inp.name!r} has shape {gate_inp.shape}, expected (1, {d})")
            router = matrix(p + "ffn_gate_inp.weight", cfg.n_experts, d)    # packed in execution order
            mats = [experts(p + f"ffn_{w}_exps.weight", *shape) for w, shape in (("gate", (e, d)), ("up", (e, d)),
                                                                                   ("down", (d, e)))]
            packed = B.prepare_experts(*mats, biases)
            for t in mats:      # a stack of per-expert tensors (HF, old Mixtral GGUFs): each part's bytes
                for part in getattr(t, "parts", None) or [t]:
                    self._release(part.data)
            return MoEWeights(
                router=router,
                experts=packed,
                router_bias=vector(p + "ffn_gate_inp.bias", cfg.n_experts) if cfg.moe_router_bias else None,
                choice_bias=vector(p + "exp_probs_b.bias", cfg.n_experts) if cfg.moe_choice_bias else None,
                shared_gate=matrix(p + "ffn_gate_shexp.weight", sh, d) if sh else None,
                shared_up=matrix(p + "ffn_up_shexp.weight", sh, d) if sh else None,
                shared_down=matrix(p + "ffn_down_shexp.weight", d, sh) if sh else None,
                shared_gate_inp=None if gate_inp is None else B.prepare_matrix(
                    WeightTensor(gate_inp.name, gate_inp.qtype, (1, d), gate_inp.data)))

        def is_moe(i: int) -> bool:
            return layer_is_moe(cfg, get, i)

        def conv_kernel(name: str, channels: int) -> np.ndarray:
            """A depthwise convolution's weights as float32 (channels, L): GGUF's (c, L) or HF's (c, 1, L)."""
            t = need(name)
            if t.rows * t.cols != channels * cfg.conv_kernel or t.shape[0] != channels:
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected ({channels}, "
                                       f"{cfg.conv_kernel})")
            kernel = np.ascontiguousarray(t.to_float32().reshape(channels, cfg.conv_kernel), dtype=np.float32)
            finite(name, t, kernel.reshape(-1))
            return kernel

        def short_conv(p: str) -> ShortConvWeights:
            return ShortConvWeights(in_proj=matrix(p + "shortconv.in_proj.weight", 3 * d, d),
                                    kernel=conv_kernel(p + "shortconv.conv.weight", d),
                                    out_proj=matrix(p + "shortconv.out_proj.weight", d, d))

        def delta_net(p: str) -> DeltaNetWeights:
            hk, hv, dk, dv = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim
            r, c = hv // hk, 2 * hk * dk + hv * dv
            if get(p + "ssm_in.weight") is not None:     # the checkpoint's in_proj_qkvz, grouped per key head
                q, k, v, z = grouped_rows(hk, [dk, dk, r * dv, r * dv])
                in_qkv, in_z = matrix(p + "ssm_in.weight", c + hv * dv, d, [np.concatenate([q, k, v]), z])
            else:                                         # llama.cpp's: regrouped into q, k, v heads and z
                in_qkv, in_z = matrix(p + "attn_qkv.weight", c, d), matrix(p + "attn_gate.weight", hv * dv, d)
            in_ba = matrix(p + "ssm_ba.weight", 2 * hv, d, [np.concatenate(grouped_rows(hk, [r, r]))])[0]
            a_neg = vector(p + "ssm_a.weight", hv, required=False)     # llama.cpp stores -exp(A_log)
            if a_neg is None:
                a_neg = negated_exp(vector(p + "ssm_a_log.weight", hv), repr(p + "ssm_a_log.weight"))
            return DeltaNetWeights(in_qkv=in_qkv, in_z=in_z, in_ba=in_ba, kernel=conv_kernel(p + "ssm_conv1d.weight", c),
                                   a_neg=a_neg,
                                   dt_bias=vector(p + "ssm_dt.bias", hv), norm=vector(p + "ssm_norm.weight", dv),
                                   out_proj=matrix(p + "ssm_out.weight", d, hv * dv))

        def flat(name: str, n: int) -> np.ndarray:
            """A vector llama.cpp may store as a column or in groups ((n, 1) ssm_a / ssm_d, (G, n / G) ssm_norm)."""
            t = need(name)
            if t.rows * t.cols != n:
                raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, expected {n} values")
            v = B.prepare_vector(t)
            finite(name, t, v)
            self._release(t.data)
            return v

        def group_norm(name: str, groups: int, n: int):
            """A group norm's n weights: (n,), (1, n) or llama.cpp's (groups, n / groups); its transpose holds them
            in another order."""
            t = need(name)
            if tuple(t.shape) not in ((n,), (1, n), (groups, n // groups)):
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected {(groups, n // groups)} "
                                       f"or ({n},)")
            return flat(name, n)

        def mamba2(p: str) -> Mamba2Weights:
            G, H, N, P = cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim
            xd, c = H * P, H * P + 2 * G * N
            z, xbc, dt = matrix(p + "ssm_in.weight", xd + c + H, d,
                                [np.arange(xd), xd + np.arange(c), xd + c + np.arange(H)])
            if get(p + "ssm_a.weight") is not None:      # llama.cpp stores -exp(A_log)
                a_neg = flat(p + "ssm_a.weight", H)
            else:
                a_neg = negated_exp(vector(p + "ssm_a_log.weight", H), repr(p + "ssm_a_log.weight"))
            return Mamba2Weights(in_z=z, in_xbc=xbc, in_dt=dt, kernel=conv_kernel(p + "ssm_conv1d.weight", c),
                                 conv_bias=vector(p + "ssm_conv1d.bias", c) if cfg.mamba_conv_bias else None,
                                 a_neg=a_neg, dt_bias=vector(p + "ssm_dt.bias", H), d_skip=flat(p + "ssm_d.weight", H),
                                 norm=group_norm(p + "ssm_norm.weight", G, xd) if cfg.mamba_norm else None,
                                 out_proj=matrix(p + "ssm_out.weight", d, xd))

        def mamba1(p: str) -> MambaWeights:
            D, N, R = cfg.ssm_inner, cfg.ssm_k_dim, cfg.ssm_dt_rank
            in_x, in_z = matrix(p + "ssm_in.weight", 2 * D, d, [np.arange(D), D + np.arange(D)])
            x_dt, x_b, x_c = matrix(p + "ssm_x.weight", R + 2 * N, D,
                                    [np.arange(R), R + np.arange(N), R + N + np.arange(N)])
            name = p + ("ssm_a.weight" if get(p + "ssm_a.weight") is not None else "ssm_a_log.weight")
            t = need(name)          # (D, N) exactly: its transpose holds as many values, another model's
            if tuple(t.shape) != (D, N):
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected {(D, N)}")
            a_neg = flat(name, D * N)
            if name.endswith("a_log.weight"):           # llama.cpp stores -exp(A_log)
                a_neg = negated_exp(a_neg, shown(name, t))
            a_neg = np.ascontiguousarray(a_neg, dtype=np.float32).reshape(D, N)
            if (a_neg > 0).any():
                raise ModelFormatError(f"layer {p.split('.')[1]}'s A (-exp(A_log), llama.cpp's ssm_a) holds a positive "
                                       "value: its state would grow without bound")
            return MambaWeights(in_x=in_x, in_z=in_z, kernel=conv_kernel(p + "ssm_conv1d.weight", D),
                                conv_bias=vector(p + "ssm_conv1d.bias", D), x_dt=x_dt, x_b=x_b, x_c=x_c,
                                dt_proj=matrix(p + "ssm_dt.weight", D, R), dt_bias=vector(p + "ssm_dt.bias", D),
                                a_neg=a_neg, d_skip=flat(p + "ssm_d.weight", D),
                                out_proj=matrix(p + "ssm_out.weight", d, D),
                                **norms(p, R, N))

        def norms(p: str, R: int, N: int) -> dict:
            """The dt/B/C RMS norms' weights: Jamba's tensors, FalconMamba's weightless norms as ones, else none."""
            if cfg.ssm_dt_b_c_norms:
                return {f"{k}_norm": vector(p + f"ssm_{k}_norm.weight", n) for k, n in (("dt", R), ("b", N), ("c", N))}
            if cfg.ssm_dt_b_c_eps:
                ones = {n: np.ones(n, np.float32) for n in (R, N)}
                return {"dt_norm": ones[R], "b_norm": ones[N], "c_norm": ones[N]}
            return {}

        def act_scalars(p: str) -> tuple | None:
            """An ungated MLP's activation as the xielu op's scalars: ReLU^2's, or the layer's xIELU tensors'."""
            if cfg.activation == "relu2":
                return RELU2_SCALARS
            if cfg.activation != "xielu":
                return None
            keys = ("alpha_p", "alpha_n", "beta", "eps")
            names = [p + f"xielu_{k}.weight" for k in keys]
            raw = [float(vector(name, 1)[0]) for name in names]
            # errors name the layer and where its scalars are: a HF checkpoint's tensors, a GGUF's xielu.* keys
            held = [get(name) for name in names]
            where = ", ".join(shown(n, t) for n, t in zip(names, held)) if any(t.name != n for n, t in zip(names, held)) \
                else "GGUF keys " + ", ".join(f"xielu.{k}" for k in keys)
            return xielu_scalars(*raw, where=f"layer {p.split('.')[1]}'s xIELU scalars ({where})")

        def head_norms(name: str, heads: int) -> np.ndarray:
            """A q/k norm weight per head (Cohere's (heads, head_dim)), as one vector of heads * head_dim."""
            t = need(name)
            if t.shape[-1] != cfg.head_dim or t.rows * t.cols != heads * cfg.head_dim:
                raise ModelFormatError(f"tensor {shown(name, t)} has shape {t.shape}, expected ({heads}, {cfg.head_dim})")
            v = B.prepare_vector(WeightTensor(t.name, t.qtype, (heads * cfg.head_dim,), t.data), off)
            finite(name, t, v)
            self._release(t.data)
            return v

        if getattr(cfg, "altup_inputs", 0):      # Gemma 3n: its layers are its own (models/gemma3n_net.py)
            from .gemma3n_net import Gemma3nNet
            self.g3n = Gemma3nNet(cfg, get, matrix, vector)
            self.layers = self.g3n.layers
            B.end_load()
            return
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            post, pre = cfg.post_norms, cfg.pre_norms
            if cfg.mla:
                moe = is_moe(i)
                self.layers.append(LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight", d, off), wq=None, wk=None, wv=None,
                    mla=self._mla_weights(p, get, need, matrix, vector),
                    wo=matrix(p + "attn_output.weight", d, cfg.n_heads * cfg.v_head_dim),
                    ffn_norm=vector(p + "ffn_norm.weight", d, off),
                    w_gate=None if moe else matrix(p + "ffn_gate.weight", cfg.ffn_dim, d),
                    w_up=None if moe else matrix(p + "ffn_up.weight", cfg.ffn_dim, d),
                    w_down=None if moe else matrix(p + "ffn_down.weight", d, cfg.ffn_dim),
                    moe=moe_weights(p) if moe else None))
                continue
            if cfg.layer_kinds[i] == "mlp":        # Nemotron-H's '-': the layer's one norm, then the MLP alone
                self.layers.append(LayerWeights(
                    attn_norm=None, wq=None, wk=None, wv=None, wo=None, ffn_norm=vector(p + "attn_norm.weight", d, off),
                    **self._dense_mlp(p, matrix, vector, act_scalars)))
                continue
            own = cfg.ffn_own_layers       # the token-mixer layers have no MLP: it is a layer of its own
            if cfg.layer_kinds[i] not in ATTENTION_KINDS:
                kind = cfg.layer_kinds[i]
                moe = is_moe(i)
                self.layers.append(LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight", d, off), wq=None, wk=None, wv=None, wo=None,
                    ffn_norm=None if own else vector(p + "ffn_norm.weight", d, off),
                    conv=short_conv(p) if kind == "shortconv" else None,
                    delta=delta_net(p) if kind == "deltanet" else None,
                    mamba=mamba2(p) if kind == "mamba2" else None,
                    mamba1=mamba1(p) if kind == "mamba" else None,
                    w_gate=None if moe or own else matrix(p + "ffn_gate.weight", cfg.ffn_dim, d),
                    w_up=None if moe or own else matrix(p + "ffn_up.weight", cfg.ffn_dim, d),
                    w_down=None if moe or own else matrix(p + "ffn_down.weight", d, cfg.ffn_dim),
                    moe=moe_weights(p) if moe else None))
                continue
            qn, kn = (cfg.q_dim, cfg.kv_dim) if cfg.qk_norm_whole else (cfg.head_dim, cfg.head_dim)
            moe = is_moe(i)
            ffn_pre = pre and not cfg.parallel_block and not own   # a parallel block's MLP reads the attention's norm
            dense = not moe and not own
            if cfg.attn_out_gate:          # per head: its query rows, then its gate rows
                wq, wq_gate = matrix(p + "attn_q.weight", 2 * cfg.q_dim, d,
                                     grouped_rows(cfg.n_heads, [cfg.head_dim, cfg.head_dim]))
            else:
                wq, wq_gate = matrix(p + "attn_q.weight", cfg.q_dim, d), None
            self.layers.append(LayerWeights(
                attn_norm=vector(p + "attn_norm.weight", d, off) if pre else None,
                wq=wq, wq_gate=wq_gate,
                wk=matrix(p + "attn_k.weight", cfg.kv_dim, d),
                wv=matrix(p + "attn_v.weight", cfg.kv_dim, d),
                wo=matrix(p + "attn_output.weight", d, cfg.q_dim),
                ffn_norm=vector(p + "ffn_norm.weight", d, off) if ffn_pre else None,
                attn_norm_b=vector(p + "attn_norm.bias", d) if pre and cfg.norm_bias else None,
                ffn_norm_b=vector(p + "ffn_norm.bias", d) if ffn_pre and cfg.norm_bias else None,
                **(self._dense_mlp(p, matrix, vector, act_scalars) if dense else {}),
                moe=moe_weights(p) if moe else None,
                bo=vector(p + "attn_output.bias", d, required=cfg.attn_out_bias),   # used wherever present
                sinks=vector(p + "attn_sinks.weight", cfg.n_heads, required=cfg.attn_sinks),
                bq=vector(p + "attn_q.bias", cfg.q_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                bk=vector(p + "attn_k.bias", cfg.kv_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                bv=vector(p + "attn_v.bias", cfg.kv_dim, required=cfg.attn_bias) if cfg.attn_bias else None,
                q_norm=(head_norms(p + "attn_q_norm.weight", cfg.n_heads) if cfg.qk_norm_heads else
                        vector(p + "attn_q_norm.weight", qn, off)) if cfg.qk_norm else None,
                k_norm=(head_norms(p + "attn_k_norm.weight", cfg.n_kv_heads) if cfg.qk_norm_heads else
                        vector(p + "attn_k_norm.weight", kn, off)) if cfg.qk_norm else None,
                post_attn_norm=vector(p + "post_attention_norm.weight", d, off) if post else None,
                post_ffn_norm=vector(p + "post_ffw_norm.weight", d, off) if post else None,
                mamba=mamba2(p) if cfg.layer_kinds[i] == "attn_mamba2" else None,
            ))
        B.end_load()

    def _dense_mlp(self, p: str, matrix, vector, act_scalars) -> dict:
        """A layer's dense MLP (a gate where the config has one; Nemotron-H's mlp layers' ReLU^2 has none), its
        ungated activation's scalars and its biases, as LayerWeights fields."""
        cfg, d = self.cfg, self.cfg.d_model
        gated = cfg.ffn_gated and cfg.activation not in UNGATED_ACTIVATIONS
        return dict(w_gate=matrix(p + "ffn_gate.weight", cfg.ffn_dim, d) if gated else None,
                    w_up=matrix(p + "ffn_up.weight", cfg.ffn_dim, d),
                    w_down=matrix(p + "ffn_down.weight", d, cfg.ffn_dim), act=act_scalars(p),
                    b_up=vector(p + "ffn_up.bias", cfg.ffn_dim) if cfg.ffn_bias else None,
                    b_down=vector(p + "ffn_down.bias", d) if cfg.ffn_bias else None)

    # -- the forward pass ----------------------------------------------------
    #: decode batches up to this many tokens replay a recorded op list (see forward)
    PLAN_MAX_TOKENS = 64

    def forward(self, tokens, slots, pos, logit_rows, out: np.ndarray | None = None, images=None,
                rope=None) -> np.ndarray:
        """images: a models.images.BatchImages (the batch's soft tokens: their rows, their blocks' ends), or None.
        rope: the rows' RoPE positions where they are not their cache positions (M-RoPE after an image,
        models/images.rope_rows): int (n,) (every section alike) or (n, sections); None: `pos`. Only a model
        with rope sections takes them (another's rope position is its cache position)."""
        B = self.backend
        B.enter_forward()
        try:
            if images:
                self._check_images(images, len(tokens))
                self._images = images
            return self._forward(tokens, slots, pos, logit_rows, out, rope)
        finally:
            self._images = None
            B.exit_forward()

    @property
    def takes_image_rows(self) -> bool:
        """Whether a forward may write image rows over embeddings: plain attention layers (kend is attention's; no
        MLA, other recurrent layers, sinks or Gemma 3n's own layers), and LFM2's short convolutions beside them (a
        causal block's rows only: ImageInput.attach refuses a block-attending tower there)."""
        cfg = self.cfg
        return not (self.g3n is not None or cfg.mla or any(k not in ("attention", "shortconv") for k in cfg.layer_kinds)
                    or any(L.sinks is not None for L in self.layers))

    @property
    def image_width(self) -> int:
        """The width of an image's rows: d_model, times 1 + the DeepStack levels (Qwen3-VL's rows carry each
        level's d_model columns after the embeddings')."""
        return self.cfg.d_model * (1 + self.deepstack)

    def set_deepstack(self, levels: int) -> None:
        """The DeepStack levels of the image rows this model takes (the attached tower's): at most one a decoder
        layer, and the config's own count where it names one (a text file and a tower of another model disagree)."""
        cfg = self.cfg
        if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or not 0 <= levels <= cfg.n_layers:
            raise InvalidInputError(f"{levels!r} DeepStack levels: at most one after each of this model's "
                                    f"{cfg.n_layers} decoder layers"[:200])
        if cfg.deepstack_levels and levels != cfg.deepstack_levels:
            raise InvalidInputError(f"the vision tower gives {levels} DeepStack levels; this {cfg.arch} model takes "
                                    f"{cfg.deepstack_levels}")
        if levels != self.deepstack and live_server(self) is not None:
            # the sequences its scheduler holds carry rows of the old width
            raise InvalidInputError(f"a server runs this model: its image rows' DeepStack levels ({self.deepstack}) "
                                    f"cannot become {levels} under it")
        self.deepstack = int(levels)

    def _check_images(self, images, n: int) -> None:
        cfg = self.cfg
        if not self.takes_image_rows:
            raise InvalidInputError(f"a {cfg.arch} model takes no image rows")
        if "shortconv" in cfg.layer_kinds and any(end >= 0 for _, _, end in images.spans):
            raise InvalidInputError(f"a {cfg.arch} model takes causal image blocks only (its short convolutions)")
        width = self.image_width
        for r0, rows, _ in images.spans:
            if r0 < 0 or r0 + len(rows) > n or rows.ndim != 2 or rows.shape[1] != width:
                raise InvalidInputError(f"image rows of shape {rows.shape} at batch row {r0} do not fit a batch of "
                                        f"{n} tokens of width {width}")

    def _forward(self, tokens, slots, pos, logit_rows, out: np.ndarray | None = None, rope=None) -> np.ndarray:
        """Evaluate tokens (each with its slot and position), return logits of `logit_rows`.

        Returns a view into the workspace when the rows fit in it (valid until the
        next call), else fills and returns `out` (shape (len(logit_rows), vocab)).

        A decode step (logits for every row, few tokens) depends only on the batch
        size: every buffer is fixed in the arena and tokens/slots/positions are read
        from it. Backends that can (native) record that step's op list once per batch
        size and replay it, skipping this Python code on every later token.
        """
        n = len(tokens)
        ws = self.ws
        if n == 0 or n > ws.max_tokens:
            raise ValueError(f"batch of {n} tokens; this model takes 1..{ws.max_tokens} per call")
        plan = self._plans.get(n) if out is None and type(logit_rows) is range and logit_rows == range(n) \
            and len(slots) == n and len(pos) == n and self._images is None else None
        if plan is not None:
            # A recorded step (engine.decode): inputs checked and stored as Python ints, no NumPy call.
            # After a replay has streamed the weights through the caches, each NumPy call here ran
            # cold: ~120 us of a 5.7 ms SmolLM2-135M step went to the checks and stores below.
            vals = [int(v) for v in tokens], [int(v) for v in slots], [int(v) for v in pos]
            self._check_values(*vals)      # all in range of int32 before any store
            if self._rope_views:
                self._store_rope(vals[2], rope, n)
            elif rope is not None:
                self._set_rope(rope, n)      # refused: a model without M-RoPE takes no RoPE positions
            for view, v in zip(self._input_views, vals):
                for i in range(n):
                    view[i] = v[i]
            self.backend.replay(plan)
            return ws.logits[:n]
        ws.tokens[:n] = tokens
        ws.slots[:n] = slots
        ws.pos[:n] = pos
        self._check_batch(ws.tokens[:n], ws.slots[:n], ws.pos[:n])
        self._set_rope(rope, n)
        rows = np.asarray(logit_rows, dtype=np.intp).reshape(-1)
        m = len(rows)
        if m and (rows.min() < 0 or rows.max() >= n):
            raise ValueError(f"logit_rows must index the batch of {n} tokens, got {rows.min()}..{rows.max()}")
        whole = out is None and m == n and n <= min(ws.max_logit_rows, self.PLAN_MAX_TOKENS) \
            and bool(np.all(rows == np.arange(n))) and self._images is None
        if whole and getattr(self.backend, "supports_plans", False):
            plan = self._plans.get(n)
            if plan is not None:
                self.backend.replay(plan)
            else:
                self.backend.begin_recording()
                try:
                    self._layers(n)
                    self._head(ws.x[:n], ws.logits[:n])
                except BaseException:
                    self.backend.end_recording()
                    raise
                self._plans[n] = self.backend.end_recording()
            return ws.logits[:n]
        x = self._layers(n)
        return self._logits(x, rows, out)

    def final_hidden(self, tokens, slots, pos, rows) -> np.ndarray:
        """The final-normed hidden states of `rows` (a copy), for decoder models used as embedders.
        The same blocks as forward(), without the head."""
        B = self.backend
        B.enter_forward()
        try:
            return self._final_hidden(tokens, slots, pos, rows)
        finally:
            B.exit_forward()

    def _final_hidden(self, tokens, slots, pos, rows) -> np.ndarray:
        n, ws = len(tokens), self.ws
        if n == 0 or n > ws.max_tokens:
            raise ValueError(f"batch of {n} tokens; this model takes 1..{ws.max_tokens} per call")
        ws.tokens[:n], ws.slots[:n], ws.pos[:n] = tokens, slots, pos
        self._check_batch(ws.tokens[:n], ws.slots[:n], ws.pos[:n])
        self._set_rope(None, n)
        x = self._layers(n)
        h = np.ascontiguousarray(x[np.asarray(rows, dtype=np.intp)])
        out = np.empty_like(h)
        self._norm(h, self.output_norm, self.output_norm_b, out)
        return out

    def _layers(self, n: int) -> np.ndarray:
        """Embed the batch in ws.tokens[:n] and run every block; returns the hidden states."""
        ws = self.ws
        tok, slot, p = ws.tokens[:n], ws.slots[:n], ws.pos[:n]
        x = ws.x[:n]
        self.backend.embed(self.tok_embd, tok, x)
        if self.cfg.embed_scale:
            self.backend.scale(x, self.cfg.embed_scale)
        if self.pos_embd is not None:          # x += the position table's row of each token (ws.h is free here)
            self.backend.embed(self.pos_embd, p, ws.h[:n])
            self.backend.add(x, ws.h[:n], x)
        self._kend = None
        d = self.cfg.d_model
        deep = 0
        if self._images is not None:       # an image's soft tokens: the tower's rows (their first d columns), unscaled
            for r0, rows, _ in self._images.spans:
                x[r0:r0 + len(rows)] = rows[:, :d]
                # the DeepStack levels these rows carry (image_width's when forward checked them), not
                # self.deepstack: a tower attached since, from another thread, may have changed that
                deep = rows.shape[1] // d - 1
            self._kend = self._images.kend(p)
        if self.g3n is not None:
            return self.g3n.forward(self, x, slot, p)
        for i, layer in enumerate(self.layers):
            if layer.conv is not None:
                self._short_conv_block(i, layer, x, slot, p)
            elif layer.mamba is not None and layer.wq is not None:
                self._attn_mamba_block(i, layer, x, slot, p)
            elif layer.delta is not None or layer.mamba is not None:
                self._ssm_block(i, layer, x, slot, p)
            elif layer.mamba1 is not None:
                self._mamba_block(i, layer, x, slot, p)
            elif layer.mla is not None:
                self._mla_attention(i, layer, x, slot, p)
            elif layer.wq is not None:      # GPT-NeoX's parallel residual: the MLP reads x too, before the attention
                self._attention_block(i, layer, x, slot, p, out=self.ws.par[:n] if self.cfg.parallel_ffn_norm else None)
            # else an mlp layer (no token mixer); a token mixer's layer without an MLP (ffn_own_layers) has none
            if layer.w_down is not None or layer.moe is not None:
                self._ffn_block(layer, x)
            if self.cfg.parallel_ffn_norm:
                self._residual_add(x, self.ws.par[:n])
            if i < deep:                   # DeepStack: level i's columns added to the image rows' hidden states
                for r0, rows, _ in self._images.spans:
                    x[r0:r0 + len(rows)] += rows[:, d * (i + 1):d * (i + 2)]
        return x

    def _set_rope(self, rope, n: int) -> None:
        """ws.rope_pos[:, :n] from `rope` (forward's), or the cache positions where None."""
        if not self.cfg.rope_sections:
            if rope is not None:
                raise InvalidInputError(f"a {self.cfg.arch} model takes no RoPE positions of their own (no M-RoPE)")
            return
        out = self.ws.rope_pos[:, :n]
        if rope is None:
            out[:] = self.ws.pos[:n]
            return
        r = np.asarray(rope)
        if r.dtype.kind not in "iu" or r.shape not in ((n,), (n, len(out))):
            raise InvalidInputError(f"RoPE positions must be integers of shape ({n},) or ({n}, {len(out)}), got "
                                    f"{r.dtype} {r.shape}")
        if r.size and (r.min() < 0 or r.max() >= self.n_ctx):
            raise InvalidInputError(f"RoPE positions must lie in [0, {self.n_ctx}), got {r.min()}..{r.max()}")
        out[:] = r.T if r.ndim == 2 else r

    def _store_rope(self, pos: list, rope, n: int) -> None:
        """A recorded step's RoPE positions (forward's `rope`: None or one per row, every section alike)."""
        if rope is None:
            vals = pos
        else:
            if np.ndim(rope) != 1 or len(rope) != n:
                self._set_rope(rope, n)          # (n, sections) or a bad shape: the general path
                return
            vals = [int(v) for v in rope]
            if min(vals) < 0 or max(vals) >= self.n_ctx:
                raise InvalidInputError(f"RoPE positions must lie in [0, {self.n_ctx}), got {min(vals)}..{max(vals)}")
        for view in self._rope_views:
            for i in range(n):
                view[i] = vals[i]

    def _check_batch(self, tok, slot, p) -> None:
        self._check_values(tok.tolist(), slot.tolist(), p.tolist())

    def _check_values(self, tok: list, slot: list, p: list) -> None:
        # typed: ids from a tokenizer larger than the embedding table reach here from text
        if min(tok) < 0 or max(tok) >= self.cfg.vocab_size:
            raise InvalidInputError(f"token id out of range [0, {self.cfg.vocab_size})")
        if min(slot) < 0 or max(slot) >= self.n_slots:
            raise InvalidInputError(f"slot out of range [0, {self.n_slots})")
        if min(p) < 0 or max(p) >= self.n_ctx:
            raise ContextOverflowError(f"position {max(p)} does not fit the context of {self.n_ctx} tokens")
        if self.state_pos:
            self._check_state(slot, p)

    # -- the recurrent state (hybrid models) -----------------------------------
    def _check_state(self, slot, p) -> None:
        """Each token must continue its slot's recurrent state (or start it again at position 0): the
        state holds only the last inputs, so it can neither be rewound nor skip ahead."""
        nxt: dict[int, int] = {}
        for s, q in zip(slot, p):
            want = nxt.get(s)
            if want is None:
                want = self.state_position(s)
            if q != 0 and q != want:
                raise InvalidInputError(
                    f"slot {s}: position {q} does not continue the recurrent state of this hybrid model's "
                    f"sequence, which has taken in {want} tokens (the state cannot be rewound: start again at 0)")
            nxt[s] = q + 1

    def state_position(self, slot: int) -> int | None:
        """How many tokens slot's recurrent state has taken in; None in a model without one. -1 when its
        layers disagree (a forward pass that stopped part-way): only a new sequence can use it then."""
        if not self.state_pos:
            return None
        counts = self._state_rows[:, slot]
        return int(counts[0]) if counts.min() == counts.max() else -1

    def resume_point(self, slot: int, common: int) -> int:
        """Where a sequence whose first `common` tokens the slot already holds must start computing.
        Attention-only: at `common` (the keys and values are kept). A hybrid model can resume only
        where its recurrent state is, and only if every token the state took in is shared; else 0."""
        at = self.state_position(slot)
        if at is None:
            return common
        return at if 0 <= at <= common else 0

    def _attention_block(self, i: int, L: LayerWeights, x, slot, p, out=None) -> None:
        """x += attention(norm(x)); with `out`, the attention's output is left there instead, x unchanged."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        n = len(x)
        h, q, k, v, attn = ws.h[:n], ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n]
        proj = ws.proj[:n] if out is None else out
        h = self._pre_norm(x, L.attn_norm, h, L.attn_norm_b)
        q2, k2, v2 = q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)
        B.matmul_many(h, (L.wq, L.wk, L.wv), (q2, k2, v2))
        if L.bq is not None:
            B.add_rows(q2, L.bq, q2)
            B.add_rows(k2, L.bk, k2)
            B.add_rows(v2, L.bv, v2)
        if L.q_norm is not None and not cfg.qk_norm_after_rope:
            self._qk_norm(L, q, k)
        sliding = cfg.layer_sliding[i]
        inv_freq = self.inv_freq[sliding]
        if cfg.rope_sections:          # M-RoPE: each section's own positions (a text token's all equal p)
            rp = ws.rope_pos[:, :n]
            B.rope_sections(q, rp, inv_freq, cfg.rope_neox, cfg.rope_sections, cfg.rope_interleaved)
            B.rope_sections(k, rp, inv_freq, cfg.rope_neox, cfg.rope_sections, cfg.rope_interleaved)
        elif cfg.layer_rope[i]:         # SmolLM3's NoPE layers take positions from the causal mask only
            B.rope(q, p, inv_freq, cfg.rope_neox)
            B.rope(k, p, inv_freq, cfg.rope_neox)
        if L.q_norm is not None and cfg.qk_norm_after_rope:      # Hunyuan norms the rotated q and k
            self._qk_norm(L, q, k)
        if cfg.attn_temp_scale:      # each row's own factor, read from p by the op itself (a plan replays it)
            B.pos_scale(q, p, cfg.attn_temp_scale, cfg.attn_temp_length)
        kv = self.kv_layer[i]
        B.kv_store(self.cache, kv, k, v, slot, p)
        if self._kend is None:
            B.attention(q, self.cache, kv, slot, p, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap)
        else:
            B.attention(q, self.cache, kv, slot, p, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap,
                        self._kend)
        if L.sinks is not None:
            B.attention_sinks(q, self.cache, kv, slot, p, attn, cfg.scale(), cfg.layer_window(i), cfg.attn_softcap,
                              L.sinks)
        if L.wq_gate is not None:
            gate = ws.qgate[:n]
            B.matmul(h, L.wq_gate, gate)
            B.sigmoid_mul(attn.reshape(n, -1), gate, attn.reshape(n, -1))
        B.matmul(attn.reshape(n, -1), L.wo, proj)
        if L.bo is not None:
            B.add_rows(proj, L.bo, proj)
        if L.post_attn_norm is not None:
            self._norm(proj, L.post_attn_norm, None, proj)
        if out is None:
            self._residual_add(x, proj)

    def _attn_mamba_block(self, i: int, L: LayerWeights, x, slot, p) -> None:
        """Falcon-H1: attention and the Mamba2 mixer both read norm(x) (the same x), x += both outputs."""
        par = self.ws.par[:len(x)]
        self._attention_block(i, L, x, slot, p, out=par)
        self._ssm_block(i, L, x, slot, p)
        self._residual_add(x, par)

    def _qk_norm(self, L: LayerWeights, q, k) -> None:
        """q and k normed in place: per head, (OLMo 2) over all heads at once, or (Cohere) per head with each
        head's own weights."""
        cfg, B, n = self.cfg, self.backend, len(q)
        q2, k2 = q.reshape(n, -1), k.reshape(n, -1)
        if cfg.qk_norm_heads:
            hd = cfg.head_dim
            self._norm(q.reshape(-1, hd), self._unit, None, q.reshape(-1, hd))
            self._norm(k.reshape(-1, hd), self._unit, None, k.reshape(-1, hd))
            B.mul_rows(q2, L.q_norm, q2)
            B.mul_rows(k2, L.k_norm, k2)
            return
        qn, kn = (q2, k2) if cfg.qk_norm_whole else (q, k)
        self._norm(qn, L.q_norm, None, qn)
        self._norm(kn, L.k_norm, None, kn)

    def _short_conv_block(self, i: int, L: LayerWeights, x, slot, p) -> None:
        """x += out_proj(C * conv(B * x')), x' the normed input: LFM2's token mixer."""
        B, ws = self.backend, self.ws
        n = len(x)
        y, bcx, proj = ws.h[:n], ws.bcx[:n], ws.proj[:n]
        B.matmul(self._pre_norm(x, L.attn_norm, y), L.conv.in_proj, bcx)
        B.short_conv(bcx, self.conv_state[i], self.state_pos[i], L.conv.kernel, slot, p, y)   # the normed input is spent
        B.matmul(y, L.conv.out_proj, proj)
        self._residual_add(x, proj)

    def _ssm_block(self, i: int, L: LayerWeights, x, slot, p) -> None:
        """Qwen3-Next's gated delta net, x += out_proj(gated_norm(delta_rule(silu(conv(q, k, v))), z)), or Granite
        4's Mamba2, x += out_proj(group_norm(scan(silu(conv(xBC) + bias), dt) * silu(z))): three projections of
        the normed input, the first through the slot's convolution, then the recurrent update."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        n, D, M = len(x), L.delta, L.mamba
        if D is not None:
            mats, outs, conv, out = (D.in_qkv, D.in_z, D.in_ba), (ws.dqkv, ws.dz, ws.dba), ws.dconv[:n], ws.dout[:n]
            kernel, bias, out_proj = D.kernel, None, D.out_proj
        else:
            mats, outs, conv, out = (M.in_xbc, M.in_z, M.in_dt), (ws.mxbc, ws.mz, ws.mdt), ws.mconv[:n], ws.mout[:n]
            kernel, bias, out_proj = M.kernel, M.conv_bias, M.out_proj
        first, z, third = (o[:n] for o in outs)
        B.matmul_many(self._pre_norm(x, L.attn_norm, ws.h[:n]), mats, (first, z, third))
        B.conv_silu(first, self.conv_state[i], self.state_pos[i], kernel, slot, p, conv, bias=bias)
        if D is not None:
            B.gated_delta(conv, third, z, self.delta_state[i], self.delta_pos[i], D.a_neg, D.dt_bias, D.norm,
                          cfg.norm_eps, slot, p, out, cfg.ssm_k_heads)
        else:
            B.ssm_scan(conv, third, z, self.delta_state[i], self.delta_pos[i], M.a_neg, M.dt_bias, M.d_skip, M.norm,
                       cfg.norm_eps, slot, p, out, cfg.ssm_k_heads)
        B.matmul(out, out_proj, ws.proj[:n])
        self._residual_add(x, ws.proj[:n])

    def _mamba_block(self, i: int, L: LayerWeights, x, slot, p) -> None:
        """Mamba 1: x += out_proj(scan(u, dt, B, C) * silu(z)), u = silu(conv(x') + bias) of in_proj's x rows x' of
        the normed input; dt_low, B and C = x_proj(u) (FalconMamba: each RMS-normed without a weight; Jamba: with one); dt =
        dt_proj(dt_low), its bias and softplus in the scan."""
        cfg, B, ws, M = self.cfg, self.backend, self.ws, L.mamba1
        n = len(x)
        sx, sz, conv, dt_low, b, c, out = (a[:n] for a in (ws.sx, ws.sz, ws.sconv, ws.sdt, ws.sb, ws.sc, ws.sout))
        B.matmul_many(self._pre_norm(x, L.attn_norm, ws.h[:n]), (M.in_x, M.in_z), (sx, sz))
        B.conv_silu(sx, self.conv_state[i], self.state_pos[i], M.kernel, slot, p, conv, bias=M.conv_bias)
        B.matmul_many(conv, (M.x_dt, M.x_b, M.x_c), (dt_low, b, c))
        if M.dt_norm is not None:       # Jamba's with weights and the model's epsilon; FalconMamba's ones, its own
            for v, w in ((dt_low, M.dt_norm), (b, M.b_norm), (c, M.c_norm)):
                B.rmsnorm(v, w, cfg.ssm_dt_b_c_eps or cfg.norm_eps, v)
        B.matmul(dt_low, M.dt_proj, sx)          # the convolution's input is spent: sx holds dt
        B.ssm_scan1(conv, sx, b, c, sz, self.delta_state[i], self.delta_pos[i], M.a_neg, M.dt_bias, M.d_skip, slot, p,
                    out)
        B.matmul(out, M.out_proj, ws.proj[:n])
        self._residual_add(x, ws.proj[:n])

    def _ffn_block(self, L: LayerWeights, x) -> None:
        cfg, B, ws = self.cfg, self.backend, self.ws
        n = len(x)
        h, proj = ws.h[:n], ws.proj[:n]
        if not cfg.parallel_block:
            h = self._pre_norm(x, L.ffn_norm, h, L.ffn_norm_b)
        # else h (ws.h) still holds the attention's normed input: Cohere's MLP reads the same one
        if L.moe is not None:
            self._moe(L.moe, h, proj)
        else:
            self._mlp(h, L.w_gate, L.w_up, L.w_down, ws.gate[:n], ws.up[:n], proj, L.act, L.b_up, L.b_down)
        if L.post_ffn_norm is not None:
            self._norm(proj, L.post_ffn_norm, None, proj)
        self._residual_add(x, proj)

    def _mlp(self, h, w_gate, w_up, w_down, gate, up, out, act: tuple | None = None, b_up=None, b_down=None) -> None:
        """out = down(act(gate(h)) * up(h)): the dense MLP (also an MoE layer's shared expert); without a gate,
        down(act(up(h))): Arcee's ReLU^2 and Apertus' xIELU through the xielu op with scalars `act`, StarCoder2's
        GELU as act_mul(u, 1), GPT-NeoX's exact GELU by the gelu_erf op; with the up/down biases where the model
        has them."""
        cfg, B = self.cfg, self.backend
        if w_gate is not None:
            B.matmul_many(h, (w_gate, w_up), (gate, up))
        else:
            B.matmul(h, w_up, gate)
            if b_up is not None:
                B.add_rows(gate, b_up, gate)
            up = None
            if act is not None:
                B.xielu(gate, *act)
            elif cfg.activation == "gelu_erf":      # GPT-NeoX's exact GELU, in place
                B.gelu_erf(gate)
            else:
                up = self._ones[:len(h)]            # act(u) as act_mul(u, 1) (see _fill_ones)
        if up is not None:
            (B.silu_mul if cfg.activation == "silu" else B.gelu_mul)(gate, up, gate)
        B.matmul(gate, w_down, out)
        if b_down is not None:
            B.add_rows(out, b_down, out)

    def _moe(self, M: MoEWeights, h, out) -> None:
        """out = the weighted sum of the k routed experts' MLPs (+ the shared expert): the router's
        logits go to the backend's moe op, which picks each token's experts and runs them."""
        cfg, B, ws = self.cfg, self.backend, self.ws
        n = len(h)
        logits = ws.router[:n]
        B.matmul(h, M.router, logits)
        if M.router_bias is not None:
            B.add_rows(logits, M.router_bias, logits)
        shared = shared_logit = None
        if M.shared_gate is not None:
            shared = ws.sh_out[:n]
            self._mlp(h, M.shared_gate, M.shared_up, M.shared_down, ws.sh_gate[:n], ws.sh_up[:n], shared)
            if M.shared_gate_inp is not None:
                shared_logit = ws.sh_logit[:n]
                B.matmul(h, M.shared_gate_inp, shared_logit)
        B.moe(h, logits, M.experts, cfg.n_experts_used, cfg.moe_routing, cfg.moe_norm_topk, out,
              shared=shared, shared_logit=shared_logit, scratch=ws,
              act=(cfg.moe_activation, cfg.moe_swiglu_alpha, cfg.moe_swiglu_limit),
              groups=(cfg.moe_groups, cfg.moe_groups_used, cfg.moe_group_top), scale=cfg.moe_scale,
              choice_bias=M.choice_bias)

    def _pre_norm(self, x, w, h, b=None):
        """The sublayer's input: x normed into h, or x itself in a model without pre-norms."""
        if w is None:
            return x
        self._norm(x, w, b, h)
        return h

    def _norm(self, x, w, b, out) -> None:
        """out = the model's norm of each row of x (RMSNorm, or LayerNorm with bias b or none)."""
        if self.cfg.norm_kind == "layer":
            d = x.shape[-1]
            self.backend.add_layernorm(x.reshape(-1, d), None, w, self._zeros[d] if b is None else b,
                                       self.cfg.norm_eps, out.reshape(-1, d))
        else:
            self.backend.rmsnorm(x, w, self.cfg.norm_eps, out)

    def _residual_add(self, x, proj) -> None:
        if self.cfg.residual_scale != 1.0:       # Granite
            self.backend.scale(proj, self.cfg.residual_scale)
        self.backend.add(x, proj, x)

    def _logits(self, x, rows: np.ndarray, out) -> np.ndarray:
        cfg, ws = self.cfg, self.ws
        m, cap = len(rows), ws.max_logit_rows
        if m == 0:              # e.g. a prefill chunk that only fills the cache
            return ws.logits[:0] if out is None else out
        if out is None and m <= cap:
            self._head(self._gather(x, rows), ws.logits[:m])
            return ws.logits[:m]
        if out is None:
            out = np.empty((m, cfg.vocab_size), np.float32)
        for s in range(0, m, cap):
            part = rows[s:s + cap]
            self._head(self._gather(x, part), ws.logits[:len(part)])
            out[s:s + len(part)] = ws.logits[:len(part)]
        return out

    def _gather(self, x, rows: np.ndarray) -> np.ndarray:
        """The hidden states of `rows`: a view when they are consecutive, else copied into ws.last."""
        m = len(rows)
        if m and rows[-1] - rows[0] == m - 1 and bool(np.all(np.diff(rows) == 1)):
            return x[rows[0]:rows[0] + m]
        last = self.ws.last[:m]
        np.take(x, rows, axis=0, out=last)
        return last

    def _head(self, h, logits) -> None:
        cfg, B = self.cfg, self.backend
        last = self.ws.last[:len(h)]
        self._norm(h, self.output_norm, self.output_norm_b, last)
        B.matmul(last, self.output, logits)
        if self.output_b is not None:
            B.add_rows(logits, self.output_b, logits)
        if cfg.logit_scale != 1.0:               # Granite divides its logits
            B.scale(logits, 1.0 / cfg.logit_scale)
        if cfg.final_softcap:
            B.softcap(logits, cfg.final_softcap)

    def memory_report(self) -> dict[str, int]:
        recurrent = sum(a.nbytes for a in self.cache.state)     # carved with the cache, counted apart
        r = {"kv_cache": self.cache.nbytes - recurrent, "activations": self.ws.nbytes(), "recurrent": recurrent}
        r.update(self.backend.memory_report())
        return r

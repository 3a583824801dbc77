"""The configuration every decoder-only transformer here is described by.

Each architecture file builds one of these (its own dataclass subclass when it
needs more fields) from GGUF metadata or from a Hugging Face config.json.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from ..finite import finite_as_float

# (low, high) of the size fields: far above any real model, low enough that nothing sized from them
# (per-layer lists, the workspace, the KV cache) can exhaust memory before the tensors are checked
# against the file. 4096 heads and 512-wide heads are also the C core's limits (see native.py).
SIZE_LIMITS = {
    "vocab_size": (1, 1 << 24), "n_layers": (1, 4096), "d_model": (1, 1 << 18), "n_heads": (1, 4096),
    "n_kv_heads": (1, 4096), "head_dim": (1, 1 << 14), "ffn_dim": (1, 1 << 20),
    "n_ctx_train": (2, 1 << 40), "ctx_limit": (0, 1 << 40), "sliding_window": (0, 1 << 40), "rope_dim": (0, 1 << 14),
    "window_pattern": (1, 4096),
    "n_experts": (0, 1 << 12), "n_experts_used": (0, 1 << 10), "expert_ffn_dim": (0, 1 << 20),
    "shared_ffn_dim": (0, 1 << 20), "conv_kernel": (0, 64),
    "ssm_k_heads": (0, 4096), "ssm_v_heads": (0, 4096), "ssm_k_dim": (0, 1024), "ssm_v_dim": (0, 1024),
    "ssm_inner": (0, 1 << 18), "ssm_dt_rank": (0, 1 << 14),
    "q_lora_rank": (0, 1 << 16), "kv_lora_rank": (0, 1 << 16), "qk_nope_dim": (0, 1 << 14), "v_head_dim": (0, 1 << 14),
    "moe_groups": (1, 1 << 12), "moe_groups_used": (1, 1 << 12), "moe_group_top": (1, 1 << 12),
    "attn_temp_length": (0, 1 << 40),
}
# What a layer's token mixer is: attention over the KV cache, LFM2's gated short convolution (a causal
# depthwise convolution whose last conv_kernel - 1 inputs are a per-sequence state), or Qwen3-Next's
# gated delta net (a convolution, then linear attention whose per-head dk x dv matrix is the state), or
# Mamba2 (Granite 4: a convolution with a bias, then a selective scan whose per-head N x P matrix is the
# state; ssm_k_heads / ssm_k_dim are its groups and state size, ssm_v_heads / ssm_v_dim its heads and head size),
# or attention and Mamba2 side by side on the same normed input, their outputs summed (Falcon-H1: attn_mamba2),
# or no token mixer at all: a layer that is its norm and the MLP alone (Nemotron-H's '-' layers: mlp, with
# ffn_own_layers, where the other layers have no MLP), or Mamba 1 (mamba: a convolution with a bias, then a
# selective scan whose per-channel state is ssm_inner x ssm_k_dim: models/mamba.py).
LAYER_KINDS = ("attention", "shortconv", "deltanet", "mamba2", "attn_mamba2", "mlp", "mamba")
# The kinds that run a Mamba2 mixer, and those that keep keys and values
MAMBA2_KINDS = ("mamba2", "attn_mamba2")
ATTENTION_KINDS = ("attention", "attn_mamba2")
# How a mixture-of-experts router turns logits into the k weights: a softmax over every expert,
# then the k largest (Qwen-MoE, Mixtral, DeepSeek-V2), the k largest logits, then a softmax over those
# (GPT-OSS), or a sigmoid per expert, then the k largest (DeepSeek-V3). The first and the last may choose
# within the best groups of experts only (moe_groups), by scores plus a per-expert bias (a router's
# `exp_probs_b`), and scale the weights (moe_scale).
MOE_ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
# The experts' gated activation: SiLU(gate) * up, or GPT-OSS's clamped (up + 1) * gate * sigmoid(alpha gate).
MOE_ACTIVATIONS = ("silu", "swiglu_oai")
# Activations of an MLP without a gate, down(act(up(x))): Arcee's ReLU^2, Apertus' xIELU (its per-layer scalars
# are tensors: models/apertus.py) and GPT-NeoX's exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (`gelu_erf`; StarCoder2's
# and Phi-2's tanh GELU is `gelu_tanh` with ffn_gated False). A gated MLP's, act(gate(x)) * up(x), are SiLU and
# tanh-GELU.
UNGATED_ACTIVATIONS = ("relu2", "xielu", "gelu_erf")
# The backend's xielu op's scalars (alpha_p, alpha_n, beta, eps) that make it ReLU^2
RELU2_SCALARS = (1.0, 0.0, 0.0, 0.0)


def xielu_scalars(alpha_p: float, alpha_n: float, beta: float, eps: float, where: str = "xIELU scalars") -> tuple:
    """xIELU's stored scalars (transformers' parameters alpha_p, alpha_n and buffers beta, eps; llama.cpp's
    xielu.* keys) as the xielu op takes them: softplus(alpha_p), beta + softplus(alpha_n), beta, eps. A ModelFormatError
    naming `where` (the layer's tensors) and the scalars past float32's range (the op would refuse them at the first
    forward step)."""
    def softplus(v: float) -> float:
        return max(v, 0.0) + math.log1p(math.exp(-abs(v)))
    out = (softplus(alpha_p), beta + softplus(alpha_n), beta, eps)
    bad = [k for k, v in zip(("alpha_p", "alpha_n", "beta", "eps"), out) if not (math.isfinite(v) and abs(v) <= 1e30)]
    if bad:
        raise ModelFormatError(f"{where}: the op's {' and '.join(bad)} past float32's range (alpha_p, alpha_n, beta, "
                               f"eps = {(alpha_p, alpha_n, beta, eps)!r} give {out!r})"[:500])
    return out
# The model norms: RMSNorm x / rms(x) * w, or LayerNorm (x - mean(x)) / std(x) * w (+ b with norm_bias)
NORM_KINDS = ("rms", "layer")
# Sections of M-RoPE (temporal, height, width; llama.cpp's files hold a fourth, 0)
MAX_ROPE_SECTIONS = 4
# Positions the engine can address (the C core's limit): a window at least this long is no window.
MAX_POSITIONS = 1 << 24
# RoPE scaling types inv_freq implements, and the numeric fields each needs (with defaults).
ROPE_SCALING_FIELDS = {
    "default": {}, "none": {},
    "linear": {"factor": None},
    "llama3": {"factor": None, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
    "yarn": {"factor": None, "original_max_position_embeddings": None, "beta_fast": 32.0, "beta_slow": 1.0},
}


# (low, high, low excluded) of the float fields: finite, and where a zero or negative value would
# divide by zero, take a root of a negative number or give non-finite RoPE frequencies, positive.
FLOAT_LIMITS = {
    "norm_eps": (0.0, 1.0, True), "rope_theta": (1.0, 1e30, True), "rope_theta_local": (1.0, 1e30, True),
    "attn_scale": (0.0, 1e4, True), "embed_scale": (0.0, 1e6, True), "attn_softcap": (0.0, 1e30, False),
    "final_softcap": (0.0, 1e30, False), "norm_offset": (-1e3, 1e3, False), "rope_factor": (0.0, 1e30, True),
    "positive": (0.0, 1e30, True), "any": (-1e30, 1e30, False),
    # logits are multiplied by 1 / logit_scale: below 1e-30 that overflows float32 (1e-45 once reached the
    # native scale op as 7e44 and failed there untyped)
    "residual_scale": (0.0, 1e6, True), "logit_scale": (1e-30, 1e30, True),
    # the query temperature's slope: its factor at the last position (2^24) stays below ~1700
    "attn_temp_scale": (0.0, 100.0, False),
}


def check_int(what: str, v, name: str) -> int:
    """`v` if it is an integer within SIZE_LIMITS[name]; else a ModelFormatError naming `what`."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ModelFormatError(f"{what} should be an integer, got {v!r}")
    lo, hi = SIZE_LIMITS[name]
    if not lo <= v <= hi:
        raise ModelFormatError(f"{what} = {v} is out of range [{lo}, {hi}]")
    return int(v)


def check_number(what: str, v, name: str) -> float:
    """`v` as a float if it is a finite number within FLOAT_LIMITS[name]; else a ModelFormatError naming `what`."""
    lo, hi, open_lo = FLOAT_LIMITS[name]
    ok = not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating)) \
        and finite_as_float(v)
    if not ok or not lo <= v <= hi or (open_lo and v == lo):
        raise ModelFormatError(f"{what} = {v!r} is not a finite number in {'(' if open_lo else '['}{lo}, {hi}]")
    return float(v)


def check_rope_scaling(sc) -> None:
    """ModelFormatError unless `sc` is a RoPE scaling inv_freq implements, with its numbers in range."""
    if not isinstance(sc, dict):
        raise ModelFormatError(f"rope scaling {sc!r} is not an object")
    kind = sc.get("rope_type") or sc.get("type") or "default"
    if not isinstance(kind, str) or kind not in ROPE_SCALING_FIELDS:
        raise ModelFormatError(f"unsupported rope scaling type {kind!r}")
    for key, default in ROPE_SCALING_FIELDS[kind].items():
        v = sc.get(key, default)
        if v is None:
            raise ModelFormatError(f"rope scaling {kind!r} lacks {key!r}")
        check_number(f"rope scaling {key!r}", v, "rope_factor")
    if kind == "llama3" and not sc.get("high_freq_factor", 4.0) > sc.get("low_freq_factor", 1.0):
        raise ModelFormatError("rope scaling high_freq_factor must exceed low_freq_factor")
    if kind == "yarn":      # its optional fields: a string here was a raw ValueError from float()
        if sc.get("attention_factor") is not None:
            check_number("rope scaling 'attention_factor'", sc["attention_factor"], "rope_factor")
        if not isinstance(sc.get("truncate", True), bool):
            raise ModelFormatError(f"rope scaling 'truncate' should be true or false, got {sc['truncate']!r}"[:200])


@dataclass
class TransformerConfig:
    arch: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float = 1e-5
    n_ctx_train: int = 4096
    # positions a context may hold at most (0: no limit): InternLM3's Dynamic NTK RoPE is plain RoPE up to
    # n_ctx_train and other frequencies past it, which this engine does not compute (Transformer refuses more)
    ctx_limit: int = 0
    # RoPE
    rope_theta: float = 10000.0
    rope_dim: int = 0                       # rotated dims per head (0: all of head_dim)
    rope_neox: bool = True                  # pairs (i, i+d/2); False: adjacent pairs (GGUF llama)
    rope_scaling: dict | None = None        # {"rope_type": "linear"|"llama3"|..., ...} HF-style
    rope_theta_local: float | None = None   # sliding layers' base (Gemma 3)
    # M-RoPE (Qwen2-VL, Qwen2.5-VL): the rotated pairs cut into sections, pair counts in order, summing to
    # rope_dim / 2; section s turns by the row's s-th position (temporal, height, width). Empty: one position.
    rope_sections: list[int] = field(default_factory=list)
    # Qwen3-VL's interleaved M-RoPE: three sections whose pairs alternate (pair i turns by the height position
    # when i % 3 == 1 and i < 3 * sections[1], the width one when i % 3 == 2 and i < 3 * sections[2], else the
    # temporal one: transformers' Qwen3VLTextRotaryEmbedding) instead of lying in contiguous runs
    rope_interleaved: bool = False
    # DeepStack (Qwen3-VL): an image's rows carry 1 + deepstack_levels blocks of d_model columns; the first is
    # written over the image tokens' embeddings, block j + 1 added to their hidden states after decoder layer j
    deepstack_levels: int = 0
    # block shape
    activation: str = "silu"                # "silu" or "gelu_tanh" (gated FFN), or one of UNGATED_ACTIVATIONS
    attn_bias: bool = False                 # q/k/v biases (Qwen2)
    qk_norm: bool = False                   # RMSNorm on q and k per head (Qwen3, Gemma 3)
    qk_norm_whole: bool = False             # ... over the whole q / k projection instead (OLMo 2)
    qk_norm_after_rope: bool = False        # ... applied to the rotated q and k, not before RoPE (Hunyuan)
    pre_norms: bool = True                  # False: sublayers read the raw residual (OLMo 2)
    post_norms: bool = False                # norms after attention and FFN outputs (Gemma 2/3)
    norm_kind: str = "rms"                  # every model norm an RMSNorm, or "layer": (x - mean) / std * w (+ b)
                                            # (Cohere, StarCoder2), see NORM_KINDS
    norm_bias: bool = False                 # the layer norms have biases, always in the checkpoint (StarCoder2)
    qk_norm_heads: bool = False             # the q/k norms have a weight per head, (heads, head_dim) (Cohere)
    parallel_block: bool = False            # attention and MLP both read the layer's one norm of x, and
                                            # x += attn + mlp (Cohere): no ffn_norm
    ffn_gated: bool = True                  # False: the dense MLP is down(act(up(h))), no gate (StarCoder2)
    ffn_bias: bool = False                  # biases on the dense MLP's up and down, always in the checkpoint
    parallel_ffn_norm: bool = False         # attention and MLP both read x, each through its own norm, and
                                            # x += attn + mlp (GPT-NeoX's parallel residual): two norms, unlike
                                            # parallel_block's one
    output_bias: bool = False               # the head (lm_head) has a bias, always in the checkpoint (Phi-2)
    pos_embd: bool = False                  # a learned absolute position table (`position_embd`, n_ctx_train rows)
                                            # added to the embeddings (GPT-2, StarCoder 1): no context past it
    norm_offset: float = 0.0                # added to stored norm weights at load (HF Gemma stores w-1)
    embed_scale: float | None = None        # embeddings multiplied by this (Gemma: sqrt(d_model))
    attn_scale: float | None = None         # default 1/sqrt(head_dim)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    sliding_window: int = 0                 # 0: none
    layer_sliding: list[bool] = field(default_factory=list)   # per layer; empty: all layers alike
    layer_rope: list[bool] = field(default_factory=list)      # per layer, False: NoPE (SmolLM3); empty: all
    residual_scale: float = 1.0             # sublayer outputs scaled before the residual add (Granite)
    logit_scale: float = 1.0                # logits divided by this (Granite)
    tie_embeddings: bool = True
    # mixture of experts (n_experts 0: every layer dense)
    n_experts: int = 0
    n_experts_used: int = 0                 # k experts per token
    expert_ffn_dim: int = 0                 # each expert's hidden size
    moe_routing: str = "softmax_topk"       # see MOE_ROUTINGS
    moe_norm_topk: bool = True              # softmax_topk: rescale the k weights to sum to 1
    shared_ffn_dim: int = 0                 # an always-on shared expert (Qwen2-MoE); 0: none
    shared_expert_gate: bool = False        # its output times sigmoid(h . a gate vector): the checkpoint always
                                            # holds that vector (Qwen2-MoE, Qwen3-Next), a load without it refused
    moe_layers: list[bool] = field(default_factory=list)      # per layer; empty: all MoE when n_experts
    moe_activation: str = "silu"            # the experts' gated activation, see MOE_ACTIVATIONS
    moe_swiglu_alpha: float = 1.702         # swiglu_oai: up+1 times gate * sigmoid(alpha * gate) ...
    moe_swiglu_limit: float = 7.0           # ... with gate <= limit and |up| <= limit
    moe_bias: bool = False                  # the experts' projections have biases (GPT-OSS)
    moe_router_bias: bool = False           # the router has a bias, always in the checkpoint (GPT-OSS)
    moe_choice_bias: bool = False           # a bias added to the scores for the choice only, always in the
                                            # checkpoint (DeepSeek-V3's noaux_tc routing)
    moe_groups: int = 1                     # experts in this many equal groups; a token chooses within ...
    moe_groups_used: int = 1                # ... this many of them, those whose ...
    moe_group_top: int = 1                  # ... this many best choice scores sum highest (DeepSeek)
    moe_scale: float = 1.0                  # the routed experts' weights times this (routed_scaling_factor)
    # multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none). Expanded into ordinary attention:
    # each head's key is [k_rope (shared), k_nope] (head_dim = rope_dim + qk_nope_dim), its value v_head_dim
    # wide, stored zero-padded to head_dim in the KV cache.
    q_lora_rank: int = 0                    # q through a low-rank projection and its norm (0: one projection)
    kv_lora_rank: int = 0                   # the compressed kv a norm sits on, expanded per head
    qk_nope_dim: int = 0                    # each head's key/query dims without RoPE
    v_head_dim: int = 0                     # each head's value dims
    # hybrid models: layers whose token mixer is not attention (LFM2), see LAYER_KINDS
    layer_kinds: list[str] = field(default_factory=list)     # per layer; empty: all attention
    conv_kernel: int = 0                    # short convolutions' width L (the state keeps L - 1 inputs)
    ssm_k_heads: int = 0                    # gated delta net: query/key heads,
    ssm_v_heads: int = 0                    # value heads (a multiple: key head h // (v / k) serves value head h),
    ssm_k_dim: int = 0                      # and their sizes
    ssm_v_dim: int = 0
    attn_out_gate: bool = False             # attention output times sigmoid(a gate projection) (Qwen3-Next)
    mamba_norm: bool = True                 # Mamba2's gated group norm (False: its output is y * silu(z), Falcon-H1)
    mamba_conv_bias: bool = True            # Mamba2's convolution has a bias
    # Mamba 1 (layer kind mamba): the inner size (channels), the rank of dt's projection, and > 0 the epsilon of
    # the RMS norms without weights over dt, B and C (FalconMamba; 0: none); its state size is ssm_k_dim
    ssm_inner: int = 0
    ssm_dt_rank: int = 0
    ssm_dt_b_c_eps: float = 0.0
    # Jamba: those RMS norms over dt, B and C have weights (ssm_dt_norm, ssm_b_norm, ssm_c_norm), epsilon norm_eps
    ssm_dt_b_c_norms: bool = False
    # Nemotron-H: the MLP is a layer of its own (kind "mlp": one norm, then the MLP, read from the layer's
    # attn_norm), and the token-mixer layers (attention, mamba2) have no MLP
    ffn_own_layers: bool = False
    # GPT-OSS attention
    attn_out_bias: bool = False             # a bias on the attention output projection
    attn_sinks: bool = False                # a learned logit per head joins each softmax (no value)
    # KV sharing (Gemma 3n): the last kv_shared_layers layers compute no keys/values and keep no cache; each
    # attends over those of the last earlier layer of its type (sliding or full), see kv_source
    kv_shared_layers: int = 0
    # attention temperature (Ministral 3's llama_4_scaling_beta; llama.cpp's attention.temperature_scale): after
    # RoPE, the queries of a row at position p are multiplied by 1 + attn_temp_scale * ln(1 + floor(p /
    # attn_temp_length)), exactly 1 below attn_temp_length; 0: none
    attn_temp_scale: float = 0.0
    attn_temp_length: int = 0
    source: str = field(default="", compare=False, repr=False)   # the file or directory, for error messages

    def __post_init__(self):
        self._check_sizes()       # before anything is sized from n_layers
        if not self.rope_dim:
            self.rope_dim = self.head_dim
        if not self.layer_sliding:
            self.layer_sliding = [self.sliding_window > 0] * self.n_layers
        if not self.moe_layers:
            self.moe_layers = [self.n_experts > 0] * self.n_layers
        if not self.layer_rope:
            self.layer_rope = [True] * self.n_layers
        if not self.layer_kinds:
            self.layer_kinds = ["attention"] * self.n_layers
        self.validate()

    @property
    def recurrent(self) -> bool:
        """Some layer keeps a per-sequence state beside the KV cache (it cannot be rolled back)."""
        return any(k not in ("attention", "mlp") for k in self.layer_kinds)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def cache_layers(self) -> list[int]:
        """The layers that keep keys and values of their own: attention layers not sharing another's."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind in ATTENTION_KINDS and self.kv_source(i) == i]

    def kv_source(self, i: int) -> int:
        """The layer whose keys and values layer i attends over: i itself, or for one of the last
        kv_shared_layers layers the last earlier layer of its type that keeps its own."""
        first = self.n_layers - self.kv_shared_layers
        if i < first:
            return i
        return max(j for j in range(first) if self.layer_sliding[j] == self.layer_sliding[i])

    def layer_window(self, i: int) -> int:
        # a window longer than any context is no limit; clamped so the kernels' int32 positions hold it
        return min(self.sliding_window, MAX_POSITIONS) if self.layer_sliding[i] else 0

    def scale(self) -> float:
        s = self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5
        # YaRN multiplies cos and sin by its attention factor: q.k grows by its square
        return s * _yarn_attention_factor(self.rope_scaling) ** 2

    def inv_freq(self, sliding: bool = False) -> np.ndarray:
        """RoPE inverse frequencies for a layer, with the configured scaling applied."""
        theta = self.rope_theta_local if (sliding and self.rope_theta_local) else self.rope_theta
        d = self.rope_dim
        inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        sc = self.rope_scaling or {}
        kind = sc.get("rope_type") or sc.get("type") or "default"
        if sliding and self.rope_theta_local:
            kind = "default"   # Gemma 3 scales only its global layers
        if kind not in ROPE_SCALING_FIELDS:
            raise ModelFormatError(f"unsupported rope scaling type {kind!r}")
        if kind == "linear":
            inv = inv / float(sc["factor"])
        elif kind == "llama3":
            inv = _llama3_scale(inv, sc)
        elif kind == "yarn":
            inv = _yarn_scale(inv, sc, theta, d)
        return inv.astype(np.float32)

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                     "n_ctx_train", "ctx_limit", "sliding_window", "n_experts", "n_experts_used", "expert_ffn_dim",
                     "shared_ffn_dim", "conv_kernel", "ssm_k_heads", "ssm_v_heads", "ssm_k_dim", "ssm_v_dim",
                     "ssm_inner", "ssm_dt_rank",
                     "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim", "moe_groups", "moe_groups_used",
                     "moe_group_top", "attn_temp_length"):
            check_int(f"config {name}", getattr(self, name), name)

    def validate(self) -> None:
        """Every hyper-parameter in range, so no later step sizes from, divides by or produces NaN from one."""
        self._check_sizes()
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if not isinstance(self.rope_dim, int) or self.rope_dim % 2 or not 2 <= self.rope_dim <= self.head_dim:
            raise ModelFormatError(f"rope dimension {self.rope_dim} invalid for head_dim {self.head_dim}")
        if not isinstance(self.layer_sliding, list) or len(self.layer_sliding) != self.n_layers:
            raise ModelFormatError("layer_sliding must list every layer")
        if not isinstance(self.layer_rope, list) or len(self.layer_rope) != self.n_layers:
            raise ModelFormatError("layer_rope must list every layer")
        if not isinstance(self.kv_shared_layers, int) or not 0 <= self.kv_shared_layers < self.n_layers or (
                self.kv_shared_layers and not all(self.layer_sliding[i] in self.layer_sliding[:self.n_layers -
                                                  self.kv_shared_layers] for i in range(self.n_layers))):
            raise ModelFormatError(f"kv_shared_layers {self.kv_shared_layers!r}: each shared layer needs an earlier "
                                   "layer of its type with keys and values")
        if self.activation in UNGATED_ACTIVATIONS and (self.mla or (self.recurrent and not self.ffn_own_layers)
                                                       or getattr(self, "altup_inputs", 0)):
            raise ModelFormatError(f"an MLP without a gate ({self.activation}) runs in plain attention layers only")
        if self.qk_norm_whole and not self.qk_norm:
            raise ModelFormatError("qk_norm_whole needs qk_norm")
        if self.qk_norm_after_rope and not self.qk_norm:
            raise ModelFormatError("qk_norm_after_rope needs qk_norm")
        if self.activation not in ("silu", "gelu_tanh") + UNGATED_ACTIVATIONS:
            raise ModelFormatError(f"unsupported activation {self.activation!r}")
        self._check_block()
        self._check_moe()
        self._check_mla()
        self._check_kinds()
        for name in ("norm_eps", "rope_theta", "attn_softcap", "final_softcap", "norm_offset", "residual_scale",
                     "logit_scale", "attn_temp_scale"):
            check_number(f"config {name}", getattr(self, name), name)
        for name in ("rope_theta_local", "embed_scale", "attn_scale"):
            if getattr(self, name) is not None:
                check_number(f"config {name}", getattr(self, name), name)
        for name in ("attn_softcap", "final_softcap"):     # 0: no cap
            if 0 < getattr(self, name) < 1e-30:        # 1e-320 is 0 in float32: the native op refused it untyped
                raise ModelFormatError(f"config {name} = {getattr(self, name)!r} is neither 0 (off) nor >= 1e-30")
        if self.attn_temp_scale and (self.attn_temp_length < 1 or self.mla):
            raise ModelFormatError(f"an attention temperature ({self.attn_temp_scale}) needs the positions it steps "
                                   f"by (got {self.attn_temp_length}) and plain attention (not latent)")
        self._check_rope()
        self._check_sections()
        scale = self.scale()
        if not (math.isfinite(scale) and 0 < np.float32(scale) < np.inf):
            # YaRN's attention factor squared times attn_scale: 0 made attention uniform, 1e30 overflowed
            # float32 and the native attention op refused it untyped at the first forward step
            raise ModelFormatError(f"the attention scale {scale!r} (attn_scale times YaRN's attention factor squared) "
                                   "is not a positive float32")

    def _check_block(self) -> None:
        """The norm kind and the block's shape flags (Cohere's parallel block, StarCoder2's ungated MLP)."""
        if self.norm_kind not in NORM_KINDS:
            raise ModelFormatError(f"unsupported norm kind {self.norm_kind!r} (supported: {', '.join(NORM_KINDS)})"[:200])
        for name in ("norm_bias", "qk_norm_heads", "parallel_block", "ffn_gated", "ffn_bias", "parallel_ffn_norm",
                     "output_bias", "ffn_own_layers", "pos_embd"):
            if not isinstance(getattr(self, name), bool):
                raise ModelFormatError(f"config {name} should be true or false, got {getattr(self, name)!r}"[:200])
        if self.norm_bias and self.norm_kind != "layer":
            raise ModelFormatError("norm biases need layer norms (norm_kind 'layer')")
        if self.qk_norm_heads and (not self.qk_norm or self.qk_norm_whole):
            raise ModelFormatError("per-head q/k norm weights need per-head q/k norms")
        if self.parallel_block and (not self.pre_norms or self.post_norms or self.mla or self.recurrent):
            raise ModelFormatError("a parallel block (attention and MLP on one norm) takes pre-norms only, on "
                                   "attention layers")
        if self.parallel_ffn_norm and (self.parallel_block or not self.pre_norms or self.post_norms or self.mla
                                       or self.recurrent):
            raise ModelFormatError("a parallel residual with two norms (GPT-NeoX) takes pre-norms only, on attention "
                                   "layers, and is not also a one-norm parallel block")
        if self.pos_embd and (self.ctx_limit != self.n_ctx_train or self.mla or self.recurrent
                              or getattr(self, "altup_inputs", 0)):
            raise ModelFormatError(f"a learned position table of {self.n_ctx_train} rows limits the context to them "
                                   f"(ctx_limit {self.ctx_limit}), on plain attention layers")
        own = self.ffn_own_layers       # its MLPs are read in the mlp layers, which take biases and no gate
        if (self.norm_bias or ((self.ffn_bias or not self.ffn_gated) and not own)) and (self.mla or self.recurrent):
            raise ModelFormatError("norm biases and an ungated or biased MLP are read on plain attention layers only")
        if own and (self.mla or self.n_experts or self.parallel_block or self.parallel_ffn_norm or self.post_norms
                    or self.norm_bias or getattr(self, "altup_inputs", 0)):
            raise ModelFormatError("MLP layers of their own (ffn_own_layers) take dense MLPs, pre-norms without "
                                   "biases and no latent attention, parallel block or post-norms")

    def _check_sections(self) -> None:
        sec = self.rope_sections
        if not isinstance(sec, list) or len(sec) > MAX_ROPE_SECTIONS or not all(
                type(v) is int and v >= 0 for v in sec):
            raise ModelFormatError(f"rope sections {sec!r}: at most {MAX_ROPE_SECTIONS} pair counts expected"[:200])
        if sec and sum(sec) != self.rope_dim // 2:
            raise ModelFormatError(f"rope sections {sec!r} sum to {sum(sec)} pairs; the heads rotate "
                                   f"{self.rope_dim // 2} (rope_dim / 2)")
        if not isinstance(self.rope_interleaved, bool) or (self.rope_interleaved and len(sec) != 3):
            raise ModelFormatError(f"interleaved M-RoPE takes three sections (temporal, height, width), got "
                                   f"{sec!r}"[:200])
        lv = self.deepstack_levels
        if isinstance(lv, bool) or not isinstance(lv, int) or not 0 <= lv <= self.n_layers:
            raise ModelFormatError(f"{lv!r} DeepStack levels: each is added after a decoder layer of its own, "
                                   f"and this model has {self.n_layers}"[:200])

    def _check_moe(self) -> None:
        if not isinstance(self.moe_layers, list) or len(self.moe_layers) != self.n_layers:
            raise ModelFormatError("moe_layers must list every layer")
        if not self.n_experts:
            if any(self.moe_layers):
                raise ModelFormatError("moe_layers marks a layer MoE but the config has no experts")
            return
        if not 1 <= self.n_experts_used <= self.n_experts:
            raise ModelFormatError(f"experts used per token ({self.n_experts_used}) must be in 1..{self.n_experts}")
        if self.expert_ffn_dim < 1:
            raise ModelFormatError("an MoE config needs the experts' feed-forward size")
        if self.moe_routing not in MOE_ROUTINGS:
            raise ModelFormatError(f"unsupported MoE routing {self.moe_routing!r}")
        if self.moe_activation not in MOE_ACTIVATIONS:
            raise ModelFormatError(f"unsupported MoE activation {self.moe_activation!r}")
        check_number("config swiglu alpha", self.moe_swiglu_alpha, "positive")
        check_number("config swiglu limit", self.moe_swiglu_limit, "positive")
        check_number("config routed experts' scale", self.moe_scale, "positive")
        g, used = self.moe_groups, self.moe_groups_used
        if self.n_experts % g or used > g or self.moe_group_top > self.n_experts // g:
            raise ModelFormatError(f"{self.n_experts} experts do not split into {g} groups of which {used} are used, "
                                   f"each ranked by its {self.moe_group_top} best")
        if g > 1 and self.n_experts_used > used * (self.n_experts // g):
            raise ModelFormatError(f"{self.n_experts_used} experts per token are more than {used} of {g} groups hold")
        if g > 1 and self.moe_routing == "topk_softmax":
            raise ModelFormatError("topk_softmax routing takes no expert groups")

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): see the MLA fields."""
        return self.kv_lora_rank > 0

    def _check_mla(self) -> None:
        if not self.mla:
            if self.q_lora_rank or self.qk_nope_dim or self.v_head_dim:
                raise ModelFormatError("latent attention sizes without a kv_lora_rank")
            return
        if min(self.qk_nope_dim, self.v_head_dim) < 1 or self.head_dim != self.qk_nope_dim + self.rope_dim:
            raise ModelFormatError(f"latent attention: head_dim {self.head_dim} must be qk_nope_dim {self.qk_nope_dim} "
                                   f"+ rope_dim {self.rope_dim}, and the value heads ({self.v_head_dim}) not empty")
        if self.v_head_dim > self.head_dim:
            raise ModelFormatError(f"latent attention: value heads of {self.v_head_dim} wider than the key heads' "
                                   f"{self.head_dim} are not supported")
        if self.n_kv_heads != self.n_heads or self.recurrent:
            raise ModelFormatError("latent attention expands to one key/value head per query head, on every layer")

    def _check_kinds(self) -> None:
        if not isinstance(self.layer_kinds, list) or len(self.layer_kinds) != self.n_layers:
            raise ModelFormatError("layer_kinds must list every layer")
        bad = [k for k in self.layer_kinds if k not in LAYER_KINDS]
        if bad:
            raise ModelFormatError(f"unsupported layer kind {bad[0]!r} (supported: {', '.join(LAYER_KINDS)})")
        if "mlp" in self.layer_kinds and not self.ffn_own_layers:
            raise ModelFormatError("layers of kind 'mlp' need ffn_own_layers (the other layers then have no MLP)")
        conv = [k for k in self.layer_kinds if k not in ("attention", "mlp")]
        if conv and self.conv_kernel < 2:
            raise ModelFormatError(f"{conv[0]} layers need a convolution kernel of at least 2, got {self.conv_kernel}")
        for kinds, what, parts in ((("deltanet",), "delta-net", ("value heads", "key heads")),
                                   (MAMBA2_KINDS, "Mamba2", ("heads", "groups"))):
            if not any(k in self.layer_kinds for k in kinds):
                continue
            if min(self.ssm_k_heads, self.ssm_v_heads, self.ssm_k_dim, self.ssm_v_dim) < 1:
                raise ModelFormatError(f"{what} layers need their head counts and sizes")
            if self.ssm_v_heads % self.ssm_k_heads:
                raise ModelFormatError(f"{what} {parts[0]} ({self.ssm_v_heads}) must be a multiple of its {parts[1]} "
                                       f"({self.ssm_k_heads})")
        if "mamba" in self.layer_kinds and min(self.ssm_inner, self.ssm_dt_rank, self.ssm_k_dim) < 1:
            raise ModelFormatError("Mamba layers need their inner size, dt rank and state size")
        if self.ssm_dt_b_c_eps:
            check_number("config ssm_dt_b_c_eps", self.ssm_dt_b_c_eps, "norm_eps")
        if not isinstance(self.ssm_dt_b_c_norms, bool) or (self.ssm_dt_b_c_norms and self.ssm_dt_b_c_eps):
            raise ModelFormatError("the Mamba dt/B/C norms are either weighted (ssm_dt_b_c_norms) or weightless "
                                   "(ssm_dt_b_c_eps), not both")

    def _check_rope(self) -> None:
        if self.rope_scaling is not None:
            check_rope_scaling(self.rope_scaling)
        with np.errstate(all="ignore"):
            for sliding in set(self.layer_sliding):
                if not np.isfinite(self.inv_freq(sliding)).all():
                    raise ModelFormatError(f"rope_theta {self.rope_theta} gives non-finite RoPE frequencies")


def _yarn_attention_factor(sc: dict | None) -> float:
    if not sc or (sc.get("rope_type") or sc.get("type")) != "yarn":
        return 1.0
    if sc.get("attention_factor") is not None:
        return float(sc["attention_factor"])
    factor = float(sc["factor"])
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def _yarn_scale(inv: np.ndarray, sc: dict, theta: float, d: int) -> np.ndarray:
    """YaRN: high frequencies kept, low ones divided by `factor`, a linear ramp between the
    dimensions whose wavelengths fit beta_fast and beta_slow times in the original context
    (rounded outwards unless `truncate` is false, as gpt-oss sets it)."""
    factor, orig = float(sc["factor"]), float(sc["original_max_position_embeddings"])

    def dim_of(rotations: float) -> float:
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(float(sc.get("beta_fast", 32.0))), dim_of(float(sc.get("beta_slow", 1.0)))
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0.0), min(high, d - 1.0)
    if high == low:
        high += 0.001
    ramp = np.clip((np.arange(len(inv), dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    return inv / factor * ramp + inv * (1.0 - ramp)


def _llama3_scale(inv: np.ndarray, sc: dict) -> np.ndarray:
    factor = float(sc["factor"])
    low = float(sc.get("low_freq_factor", 1.0))
    high = float(sc.get("high_freq_factor", 4.0))
    old_ctx = float(sc.get("original_max_position_embeddings", 8192))
    wavelen = 2 * np.pi / inv
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return np.where(is_mid, mid, scaled)

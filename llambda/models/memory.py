"""The memory plan of a load, made from the file's header before any weight is read.

Weights: the file is mapped read-only and each matrix is packed into the backend's arena, its file pages
released once packed (formats/files.release_pages), so what stays resident is the packed copy (the native
core's layouts are the file's bytes regrouped: the same size) and, while loading, one tensor's file pages
at a time. The KV cache: 2 x attention layers x kv_dim x bytes per value, per token of each slot (latent
attention's compressed cache: its one row of kv_lora_rank + qk_rope values a layer, base.kv_rows). A hybrid
model's recurrent state (base.recurrent_state_specs: a short convolution's window, a delta net's matrix per
head), per slot whatever the context. Activations: the
forward pass's buffers at the batch size (`Workspace`). A vision tower (add_vision): its weights and one
image's activations, from its VisionConfig. Available: the kernel's MemAvailable (free memory plus what it
can reclaim, the page cache included).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InsufficientMemoryError
from ..formats.quants import tensor_nbytes
from ..formats import staging
from ..formats.pagecache import mem_available, should_drop
from ..formats.readahead import CHUNK as READ_CHUNK
from ..formats.source import ModelSource
from .base import Workspace, kv_rows, mlp_width, recurrent_state_specs
from .mla import mla_compressed
from .deepseek2 import absorbed_key_growth, split_part_at_load


@dataclass
class MemoryPlan:
    weights: int               # resident after load (the packed copy)
    mapped: int                # the file's tensor bytes (mapped, not resident once packed)
    largest_tensor: int        # the file pages resident at once while loading (a tensor, or an MoE layer's experts)
    kv_per_token: int          # all layers, keys and values, of one slot's token
    kv_cache: int              # at the context, every slot
    activations: int
    n_ctx: int
    n_slots: int
    kv_type: str
    available: int | None      # MemAvailable, None where the kernel does not say
    recurrent: int = 0         # a hybrid model's recurrent state, every slot
    logit_row: int = 0         # activations a slot past 16 adds (its logits row: Workspace's max_logit_rows)
    merge_peak: int = 0        # lora=: what merging the adapters holds at once while loading (lora_merge.merge_peak)
    vision: int = 0            # the vision tower's weights (add_vision), 0 without one
    vision_workspace: int = 0  # ... and one image's activations, allocated with it at load
    vision_source: str = ""    # where the tower is read from, for messages

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.recurrent + self.activations + self.vision + self.vision_workspace

    @property
    def vision_total(self) -> int:
        return self.vision + self.vision_workspace

    @property
    def peak_load(self) -> int:
        return self.total + self.largest_tensor

    def lines(self) -> list[str]:
        g = _gib
        out = [f"weights {g(self.weights)} packed (file mapped {g(self.mapped)}, paged in as it is packed: "
               f"at most {g(self.largest_tensor)} more while loading)",
               f"KV cache {g(self.kv_cache)} ({self.kv_type}, {self.kv_per_token / 1024:.1f} KiB per token x "
               f"{self.n_ctx} tokens x {self.n_slots} slot{'s' if self.n_slots > 1 else ''})",
               *([f"recurrent state {g(self.recurrent)} ({g(self.recurrent // self.n_slots)} per slot)"]
                 if self.recurrent else []),
               f"activations {g(self.activations)}",
               *([f"vision tower {g(self.vision_total)} (weights {g(self.vision)}, one image's activations "
                  f"{g(self.vision_workspace)})"] if self.vision_total else []),
               f"total {g(self.total)}" + (f" of {g(self.available)} available" if self.available else "")]
        return out


def add_vision(p: MemoryPlan, cfg, dense_bytes: int, source: str = "") -> None:
    """Count a vision tower in plan `p`: its weights (cfg.params() at `dense_bytes` each: 2 where the native
    fast mode packs its dense layers in bfloat16, the few float32 vectors and position embeddings beside them
    a small share of a real tower; 4 in float32) and one image's activations (cfg.workspace_bytes(n_ctx): a
    Qwen2-VL tower's of the largest image the context holds, ImageInput._encode_grids refusing a larger one), both
    allocated when it loads. `cfg`: the tower's VisionConfig."""
    p.vision = int(cfg.params()) * dense_bytes
    p.vision_workspace = int(cfg.workspace_bytes(p.n_ctx))
    p.vision_source = source


def without_vision(p: MemoryPlan) -> None:
    """The plan of the same load with no tower attached (the one planned could not be read: text only)."""
    p.vision = p.vision_workspace = 0
    p.vision_source = ""


@dataclass
class EncoderPlan:
    """An encoder's (BERT) memory: its weights as the backend keeps them, no KV cache, and the activations
    of one batch of `tokens` (api.TOKEN_BUDGET)."""
    weights: int
    mapped: int
    activations: int
    tokens: int
    dense_format: str
    available: int | None

    @property
    def total(self) -> int:
        return self.weights + self.activations

    def lines(self) -> list[str]:
        g = _gib
        return [f"weights {g(self.weights)} (embeddings float32, dense layers {self.dense_format}; "
                f"file {g(self.mapped)}, converted at load)",
                "no KV cache (an encoder keeps nothing between calls)",
                f"activations {g(self.activations)} at most (a batch of {self.tokens} tokens)",
                f"total {g(self.total)}" + (f" of {g(self.available)} available" if self.available else "")]


def encoder_plan(src: ModelSource, tokens: int, dense_bytes: int = 2) -> EncoderPlan:
    """The plan of loading encoder `src` (models/bert.py: embeddings in float32, every dense layer at
    `dense_bytes` per weight: 2 for the native fast mode's bfloat16, 4 for float32) with batches of `tokens`."""
    c = src.config
    H, F = c.hidden, c.ffn
    mapped = sum(tensor_nbytes(t.qtype, t.shape) for t in map(src.tensor, src.tensor_names) if t is not None)
    # (an encoder whose token table stays in the file, read per batch, says so: embeddinggemma.py)
    emb = (c.vocab_size * getattr(c, "table_resident", True) + c.position_rows + c.type_vocab) * H * 4
    dense = c.n_layers * (4 * H * H + c.ffn_matrices * H * F) + (H * H + c.n_labels * H if c.n_labels else 0)
    biases = c.n_layers * (6 * H + F) * 4
    # per token: x, ctx, the attention output and qkv (6 H), the MLP's up (F; and a gated MLP's gate, F), the
    # embeddings' gathers (H)
    acts = tokens * (7 * H + (c.ffn_matrices - 1) * F) * 4
    fmt = "bfloat16" if dense_bytes == 2 else "float32"
    return EncoderPlan(emb + dense * dense_bytes + biases, mapped, acts, tokens, fmt, mem_available())


def _tower_from(p: MemoryPlan) -> str:
    return f" (read from {p.vision_source})" if p.vision_source else ""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def kv_value_bytes(kv_type: str, values: int) -> float:
    """Bytes one token's `values` keys (or values) take in a cache of kv_type (q8_0: ggml's blocks
    of 32 values in 34 bytes)."""
    if kv_type == "q8_0":
        return values * 34 / 32
    return values * np.dtype(np.float16 if kv_type == "f16" else np.float32).itemsize


def plan(src: ModelSource, n_ctx: int, n_slots: int = 1, kv_type: str = "f32", max_tokens: int = 512,
         backend=None, float_weights: bool = False, qtype_at_load=None) -> MemoryPlan:
    """The plan of loading `src` at `n_ctx` tokens x `n_slots` (float_weights: a backend that dequantizes
    every matrix to float32, as the NumPy reference does; qtype_at_load(name, tensor): a tensor's type
    once looked up, where the lookup converts it, as quantize= does; the backend's packed_type then says
    what it keeps that type in: the native one converts the types it does not run)."""
    cfg = src.config
    compressed = mla_compressed(cfg, backend)
    mapped, largest, params, packed = 0, 0, 0, 0
    experts: dict[str, int] = {}    # an MoE layer's gate, up and down experts are let go of together, once all packed
    for name, t in src.tensors():
        n = tensor_nbytes(t.qtype, t.shape)
        mapped += n
        largest = max(largest, n)
        if "_exps." in name:
            layer = name.split("ffn_")[0]
            experts[layer] = experts.get(layer, 0) + n
        params += int(np.prod(t.shape))
        # DeepSeek's split kv_b halves: rejoined (Q8_0 or float32) for the expanded heads, kept for the compressed
        kept = t if compressed else split_part_at_load(src, name, t)
        q = qtype_at_load(name, kept) if qtype_at_load is not None else kept.qtype
        if backend is not None:
            q = backend.packed_type(q, kept.shape[-1])
        size = n if q == t.qtype and kept is t else tensor_nbytes(q, kept.shape)
        if compressed and name.endswith("attn_kv_b.weight"):     # its key half transposed (absorbed_key_heads)
            size += absorbed_key_growth(q, size, cfg)
        packed += size
    weights = params * 4 if float_weights else packed
    largest = max([largest, *experts.values()]) + READ_CHUNK     # + the read-ahead's chunk, mapped while it reads
    available = mem_available()
    if src.format == "gguf" and staging.enabled() and should_drop(mapped, available):
        largest += staging.WINDOW + staging.ROUND       # staging buffers: the window ahead + the tensor packed
    # a hybrid model's other layers keep no KV, nor do layers sharing another's (Gemma 3n)
    kv_layers = max(1, len(cfg.cache_layers()))
    n_kv, head_dim = kv_rows(cfg, compressed)
    arrays = 1 if compressed else 2         # the compressed cache's values are its keys' rows
    kv_per_token = int(arrays * kv_layers * kv_value_bytes(kv_type, n_kv * head_dim))
    based = kv_type == "q8_0" and not compressed
    kv_base = 4 * kv_layers * n_kv * head_dim * n_slots if based else 0     # a float key base per slot
    extra = backend.workspace_specs(cfg, max_tokens) if backend is not None else None
    acts = Workspace(cfg, max_tokens, max(n_slots, 16), extra, mlp_width(cfg, src.tensor), compressed).nbytes()
    state = recurrent_state_specs(cfg, n_slots)[2]
    recurrent = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in state.values())
    return MemoryPlan(weights, mapped, largest, kv_per_token, kv_per_token * n_ctx * n_slots + kv_base, acts, n_ctx,
                      n_slots, kv_type, available, recurrent, 4 * (cfg.d_model + cfg.vocab_size))


def check(p: MemoryPlan) -> None:
    """Refuse a load whose weights, KV cache, recurrent state and activations (and, with lora=, the merge's
    buffers while it loads: merge_peak) exceed the memory available now (the activations too: max_batch=10**7 asked for 236 GiB of them, a raw MemoryError)."""
    if p.available is None or p.total + p.merge_peak <= p.available:
        return
    if p.vision_total and p.total - p.vision_total + p.merge_peak <= p.available:
        # the text model fits: the tower is what does not
        raise InsufficientMemoryError(
            f"this load needs {_gib(p.total - p.vision_total + p.merge_peak)} for the text model + "
            f"{_gib(p.vision_total)} for its vision tower{_tower_from(p)} (weights {_gib(p.vision)}, one image's "
            f"activations {_gib(p.vision_workspace)}) but only {_gib(p.available)} is available: load it without "
            "the tower (vision=False; --no-mmproj on the command line: it then takes no images), or free memory")
    # the tower's share counts as weights: no context or slot count makes room for it
    weights = p.weights + p.merge_peak + p.vision_total     # the merge's buffers are let go of once loaded, but must fit first
    # the logits rows are max(n_slots, 16): past 16 slots, each slot also costs a row of activations
    acts_floor = p.activations - p.logit_row * max(0, p.n_slots - 16)
    spare = p.available - weights - acts_floor        # for the KV cache, recurrent state and rows past 16
    room = p.available - weights - p.activations
    fit = (room - p.recurrent) // max(p.kv_per_token * p.n_slots, 1)
    per_slot = max(1, -(-(p.kv_cache + p.recurrent) // p.n_slots))     # a slot's KV cache and recurrent state
    slots_fit = spare // per_slot
    if slots_fit > 16:
        slots_fit = (spare + 16 * p.logit_row) // (per_slot + p.logit_row)
    if spare <= 0:
        hint = "the weights and activations alone do not fit: use a smaller quantization or free memory"
    elif fit >= 2:        # a context of one token holds no prompt
        hint = f"a context of at most {fit} tokens (-c/n_ctx) would fit"
        if p.kv_type == "f32":
            hint += ", or twice that with an f16 KV cache (--kv-type f16), nearly four times with q8_0"
        elif p.kv_type == "f16":
            hint += ", or nearly twice that with a q8_0 KV cache (--kv-type q8_0)"
    else:
        hint = f"no context fits with {p.n_slots} slots"
    if spare > 0 and p.n_slots > 1:      # the slots are the other knob (`llambda serve --parallel` sets them)
        hint += (f"; at {p.n_ctx} tokens, at most {slots_fit} slots (n_slots) would fit" if slots_fit >= 1
                 else f"; not even one slot of {p.n_ctx} tokens fits")
    if p.vision_total:
        hint += (f"; without its vision tower (vision=False; --no-mmproj: no images) {_gib(p.vision_total)} less "
                 "is needed")
    error = InsufficientMemoryError(
        f"this load needs {_gib(p.weights)} of weights"
        + (f" + {_gib(p.vision_total)} for its vision tower{_tower_from(p)}" if p.vision_total else "")
        + (f" + {_gib(p.merge_peak)} while merging its LoRA adapters (lora=)" if p.merge_peak else "") +
        f" + {_gib(p.kv_cache)} of KV cache "
        f"({p.n_ctx} tokens x {p.n_slots} slots, {p.kv_type})"
        + (f" + {_gib(p.recurrent)} of recurrent state" if p.recurrent else "") +
        f" + {_gib(p.activations)} of activations (max_batch tokens per forward)" +
        f" but only {_gib(p.available)} is available: {hint}")
    error.slots_fit = slots_fit if spare > 0 and p.n_slots > 1 else None   # for a caller naming slots otherwise
    raise error

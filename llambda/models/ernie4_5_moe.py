"""ERNIE 4.5 MoE (HF Ernie4_5_MoeForCausalLM, ERNIE-4.5-21B-A3B and -300B-A47B; llama.cpp's `ernie4_5-moe`):
the dense model's attention and adjacent-pair RoPE (models/ernie4_5.py), with mixture-of-experts MLPs.

Which layers: layer i is MoE when moe_layer_start_index <= i <= moe_layer_end_index (-1: the last layer) and
(i + 1) % moe_layer_interval == 0; the others keep the dense MLP (intermediate_size). llama.cpp's keys:
leading_dense_block_count and interleave_moe_layer_step (its graph's rule, i >= lead and (i + 1) % step == 0;
it has no end index, and its loader wants expert tensors in every layer past the lead, so an interleave other
than 1 is a file it cannot load though we can).

Routing (config.MOE_ROUTINGS "softmax_topk" with a choice bias): p = softmax(router logits) over every expert;
the k = moe_k experts chosen by p + e_score_correction_bias (the checkpoint's mlp.moe_statics, shape (1, E));
their p (no bias) are the weights, divided by their sum (transformers: by max(sum, moe_norm_min), which only
differs for sums below moe_norm_min, 1e-12: such values are refused above 1e-6). Plus moe_num_shared_experts
always-on experts, one SiLU MLP of moe_num_shared_experts x moe_intermediate_size, added unscaled. llama.cpp
runs the same (softmax gating, exp_probs_b, renormalised weights) and reads the shared MLP's width from
expert_shared_feed_forward_length (none without it); a file without exp_probs_b routes without a bias. Its
graph renormalises the top-k weights whatever `expert_weights_norm` says (a file saying false is refused here:
neither reference runs it so) and does not read `expert_shared_count` (its converter's moe_num_shared_experts:
held to agree with the width here).

The multi-token-prediction tensors of the Hub checkpoints (model.mtp_block.N..., mtp_emb_norm, mtp_hidden_norm,
mtp_linear_proj: outside model.layers) are not run; formats/hf_dir.py passes over such top-level tensors.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from .config import TransformerConfig
from .ernie4_5 import HF_ROPE_NEOX, gguf_common, hf_common  # noqa: F401  (HF_ROPE_NEOX: read by formats/hf_dir.py)
from .hparams import HFConfig

ARCH = "ernie4_5-moe"       # llama.cpp's name; ours (config.arch, the export's family) is ernie4_5_moe
_NORM_MIN_LIMIT = 1e-6

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py); transformers 5 holds the
# bias as mlp.gate.moe_statics.* in memory and writes the Hub's name, both read
HF_LAYER_NAMES = {
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.gate.moe_statics.e_score_correction_bias": "exp_probs_b.bias",
}


def moe_layer_flags(n_layers: int, start: int, end: int, interval: int) -> list[bool]:
    return [start <= i <= end and (i + 1) % interval == 0 for i in range(n_layers)]


def config_from_hf(cfg: dict) -> TransformerConfig:
    c = hf_common(cfg, "ernie4_5_moe")
    hf = HFConfig(cfg)
    n = c["n_layers"]
    gate = cfg.get("moe_gate_act", "softmax")
    if gate != "softmax":
        raise ModelFormatError(f"config.json moe_gate_act {gate!r} is not supported (softmax)"[:200])
    start = hf.get("moe_layer_start_index", 1, int, "n_experts")      # 0..4096, like the layer count
    end = hf.get("moe_layer_end_index", -1, int)
    interval = hf.get("moe_layer_interval", 1, int, "n_layers")
    if end == -1:
        end = n - 1
    if not 0 <= end < n:
        raise ModelFormatError(f"config.json 'moe_layer_end_index' = {end} is neither -1 nor a layer of the {n}")
    norm_min = hf.get("moe_norm_min", 1e-12, float)
    if not 0.0 <= norm_min <= _NORM_MIN_LIMIT:
        raise ModelFormatError(f"config.json 'moe_norm_min' = {norm_min!r} is not supported (at most "
                               f"{_NORM_MIN_LIMIT}: the weights are divided by their sum)")
    ffe = hf.get("moe_intermediate_size", kind=int, limit="expert_ffn_dim")
    shared = hf.get("moe_num_shared_experts", 2, int, "n_experts")      # transformers' default: 2
    n_experts, k = hf.get("moe_num_experts", kind=int, limit="n_experts"), hf.get("moe_k", kind=int,
                                                                                  limit="n_experts_used")
    _check_used(k, n_experts, "config.json 'moe_k'", "moe_num_experts")
    return TransformerConfig(
        **c, n_experts=n_experts, n_experts_used=k, expert_ffn_dim=ffe,
        shared_ffn_dim=HFConfig.check("config.json moe_num_shared_experts * moe_intermediate_size", shared * ffe,
                                      int, "shared_ffn_dim"),
        moe_layers=moe_layer_flags(n, start, end, interval), moe_routing="softmax_topk", moe_norm_topk=True,
        moe_choice_bias=True)


def config_from_gguf(meta: dict) -> TransformerConfig:
    hp, c = gguf_common(meta, ARCH)
    c["arch"] = "ernie4_5_moe"
    scale = hp.float("expert_weights_scale", 1.0)
    if scale not in (0.0, 1.0):           # llama.cpp passes it (0: none) to its MoE; the converter writes none
        raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_weights_scale' = {scale} is not supported (1)")
    lead = hp.int("leading_dense_block_count", limit="n_experts")     # 0..4096, like the layer count
    step = hp.int("interleave_moe_layer_step", limit="n_layers")
    n = c["n_layers"]
    n_experts, k = hp.int("expert_count", limit="n_experts"), hp.int("expert_used_count", limit="n_experts_used")
    _check_used(k, n_experts, f"GGUF metadata '{ARCH}.expert_used_count'", "expert_count")
    if not hp.flag("expert_weights_norm", True):
        raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_weights_norm' = false is not supported: ERNIE 4.5 MoE "
                               "renormalises its top-k weights (transformers always; llama.cpp's graph too, "
                               "whatever the key says)")
    ffe = hp.int("expert_feed_forward_length", limit="expert_ffn_dim")
    # exp_probs_b (the choice bias) where the file holds it: gguf_flags
    return TransformerConfig(
        **c, n_experts=n_experts, n_experts_used=k, expert_ffn_dim=ffe, shared_ffn_dim=_shared_width(hp, ffe),
        moe_layers=moe_layer_flags(n, lead, n - 1, step), moe_routing="softmax_topk", moe_norm_topk=True)


def _shared_width(hp, ffe: int) -> int:
    """The shared experts' MLP width: expert_shared_feed_forward_length, which llama.cpp's graph runs (0 or
    absent: none); expert_shared_count, which its converter writes beside it (HF moe_num_shared_experts) and
    llama.cpp does not read, must agree with it as count x expert_feed_forward_length (a file saying both ways
    and differing is refused, not run one way)."""
    width = hp.int("expert_shared_feed_forward_length", 0, "shared_ffn_dim")
    if f"{ARCH}.expert_shared_count" not in hp.meta:
        return width
    count = hp.int("expert_shared_count", limit="n_experts")
    if count * ffe != width:
        raise ModelFormatError(f"GGUF metadata '{ARCH}.expert_shared_count' = {count} shared experts of "
                               f"{ffe} (expert_feed_forward_length) disagrees with "
                               f"'{ARCH}.expert_shared_feed_forward_length' = {width}")
    return width


def _check_used(k: int, n_experts: int, what: str, of: str) -> None:
    if not 1 <= k <= n_experts:
        raise ModelFormatError(f"{what} = {k}: not 1 to the {n_experts} experts ({of})")


def gguf_flags(cfg: TransformerConfig, names) -> None:
    """What an ernie4_5-moe file says by its tensors only: the routing's choice bias (llama.cpp's optional
    exp_probs_b)."""
    if any(n.endswith("exp_probs_b.bias") for n in names):
        cfg.moe_choice_bias = True


def gguf_metadata(cfg: TransformerConfig) -> dict:
    """llama.cpp's ernie4_5-moe keys beyond the shared MoE ones (tools/export.py): the MoE layers as a lead and
    an interleave step, the shared experts as a count too (as its converter writes them)."""
    n, flags = cfg.n_layers, cfg.moe_layers
    lead = flags.index(True) if any(flags) else n
    step = next((s for s in range(1, n + 1) if flags == moe_layer_flags(n, lead, n - 1, s)), None)
    if step is None or not any(flags):
        raise ModelFormatError("GGUF 'ernie4_5-moe' says its MoE layers by a first layer and an interleave step to "
                               f"the last layer: the layers {[i for i in range(n) if flags[i]]} cannot be written")
    meta = {f"{ARCH}.leading_dense_block_count": lead, f"{ARCH}.interleave_moe_layer_step": step}
    if cfg.shared_ffn_dim and cfg.shared_ffn_dim % cfg.expert_ffn_dim == 0:
        meta[f"{ARCH}.expert_shared_count"] = cfg.shared_ffn_dim // cfg.expert_ffn_dim
    return meta

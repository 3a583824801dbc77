"""Granite MoE (Granite 3.x MoE; HF GraniteMoeForCausalLM and GraniteMoeSharedForCausalLM; GGUF
`granitemoe`): dense Granite (granite.py: its four multipliers) with every MLP a mixture of experts.

The router takes the k largest logits, then a softmax over those (topk_softmax); each expert is a
SiLU-gated MLP of `intermediate_size`; GraniteMoeShared adds a shared MLP of
`shared_intermediate_size` on every token, unscaled. The Hub stores each layer's experts fused:
`block_sparse_moe.input_linear.weight` (E, 2I, d), gate rows then up rows per expert, and
`output_linear.weight` (E, d, I) (transformers 5 calls them `experts.gate_up_proj` / `down_proj`);
the shared MLP as `shared_mlp.input_linear.weight` (2S, d: gate then up) and `output_linear`.
llama.cpp splits them into `ffn_{gate,up,down}_exps` and `ffn_{gate,up,down}_shexp` (`hf_splitter`
does the same here, without copying); its keys are granite's plus the expert counts and
`expert_shared_feed_forward_length`; q/k rows permuted as in `llama` files.
"""
from __future__ import annotations

from ..errors import ModelFormatError
from ..formats.experts import expert_matrix
from .config import TransformerConfig
from .granite import gguf_scales, hf_scales
from .hparams import GGUFHParams, HFConfig
from .llama import check_hf_mlp
from .moe import gguf_moe, hf_moe

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py); the fused
# expert and shared-MLP tensors are split by hf_splitter
HF_LAYER_NAMES = {
    "block_sparse_moe.router.layer.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.router.weight": "ffn_gate_inp.weight",        # transformers 5's name
}
FUSED_EXPERTS = ("block_sparse_moe.input_linear.weight", "block_sparse_moe.experts.gate_up_proj")
EXPERTS_DOWN = ("block_sparse_moe.output_linear.weight", "block_sparse_moe.experts.down_proj")


def config_from_gguf(meta: dict, arch: str = "granitemoe") -> TransformerConfig:
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    return TransformerConfig(**c, rope_neox=False, **gguf_scales(hp, c["head_dim"]), moe_routing="topk_softmax",
                             **gguf_moe(hp, norm_default=True))


def hf_experts(cfg: dict, n_layers: int) -> dict:
    """The MoE fields of a Granite config.json: `num_local_experts` experts of `intermediate_size` on every
    layer, `num_experts_per_tok` of them a token, a shared MLP of `shared_intermediate_size` (0: none)."""
    moe = hf_moe({**cfg, "mlp_only_layers": [], "decoder_sparse_step": 1}, n_layers, norm_default=True,
                 count_keys=("num_local_experts",), expert_ffn_key="intermediate_size")
    moe["shared_ffn_dim"] = HFConfig(cfg).get("shared_intermediate_size", 0, int, "shared_ffn_dim")
    return dict(moe, moe_routing="topk_softmax")


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    c = hf.common("granitemoe")
    return TransformerConfig(**c, attn_bias=hf.flag("attention_bias", False), **hf_scales(hf, c["head_dim"]),
                             **hf_experts(cfg, c["n_layers"]))


def hf_splitter(config: TransformerConfig):
    """split(suffix, t, name) -> [(canonical leaf, expert or None, tensor)] for the fused tensors of a Granite
    layer (views of the file's rows), None for any other; the shared MLP is the dense MLP of a model
    without experts (a dense Granite 4 hybrid), as llama.cpp names it."""
    shared = "shexp" if config.n_experts else None

    def halves(t, name: str):
        if len(t.shape) != 2 or t.shape[0] % 2:
            raise ModelFormatError(f"tensor {name!r} has shape {t.shape}: not gate and up rows of one MLP")
        return t.split_rows([t.shape[0] // 2] * 2)

    def split(suffix: str, t, name: str):
        if suffix in FUSED_EXPERTS or suffix in EXPERTS_DOWN:
            if len(t.shape) != 3:
                raise ModelFormatError(f"tensor {name!r} has shape {t.shape}: not one matrix per expert")
            if suffix in EXPERTS_DOWN:
                return [("ffn_down_exps.weight", None, t)]
            out = []
            for e in range(t.shape[0]):
                gate, up = halves(expert_matrix(t, e), name)
                out += [("ffn_gate_exps.weight", e, gate), ("ffn_up_exps.weight", e, up)]
            return out
        if suffix == "shared_mlp.input_linear.weight":
            gate, up = halves(t, name)
            return [(f"ffn_gate{'_' + shared if shared else ''}.weight", None, gate),
                    (f"ffn_up{'_' + shared if shared else ''}.weight", None, up)]
        if suffix == "shared_mlp.output_linear.weight":
            return [(f"ffn_down{'_' + shared if shared else ''}.weight", None, t)]
        return None

    return split

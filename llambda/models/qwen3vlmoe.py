"""Qwen3-VL-MoE's text model (Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B): Qwen3-MoE (q/k norms; a softmax router over
all experts, top-k, always renormalised: transformers' Qwen3VLMoeTextTopKRouter) with Qwen3-VL's interleaved
M-RoPE and DeepStack levels (qwen3vl.py's fields).

Files: a HF directory (model_type qwen3_vl_moe; each layer's experts fused, `mlp.experts.gate_up_proj` with gate
then up per expert and `mlp.experts.down_proj`, either as the Hub's checkpoints store them, input-major: (E, d, 2I)
and (E, I, d), or output-major as transformers 5 saves them: (E, 2I, d) and (E, d, I); transformers tells them
apart by shape, the output-major reading first where both fit, and so do we: `hf_splitter`); llama.cpp's text GGUF
(architecture qwen3vlmoe: qwen3moe's keys, rope.dimension_sections, n_deepstack_layers) and Ollama's
qwen3vlmoe model file."""
from __future__ import annotations

from ..errors import ModelFormatError
from ..formats.experts import TransposedExpert, expert_matrix
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig
from .mistral import hf_common_sliding
from .moe import gguf_moe, hf_moe
from .qwen3vl import gguf_metadata, gguf_vl, hf_vl  # noqa: F401 (gguf_metadata: the exporter's hook)

ARCH = "qwen3vlmoe"
GATE_UP, DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"


def config_from_gguf(meta: dict) -> TransformerConfig:
    arch = meta.get("general.architecture")
    hp = GGUFHParams(meta, arch)
    c = hp.common()
    c["arch"] = ARCH
    return TransformerConfig(**c, **gguf_vl(meta, arch), **gguf_moe(hp, norm_default=True))


def config_from_hf(cfg: dict) -> TransformerConfig:
    cfg = dict(cfg)
    vl = hf_vl(cfg)
    c = hf_common_sliding(cfg, ARCH, default_sliding=False)
    moe = dict(hf_moe(cfg, c["n_layers"], norm_default=True), moe_norm_topk=True)
    out = TransformerConfig(**c, qk_norm=True, attn_bias=HFConfig(cfg).flag("attention_bias", False), **vl, **moe)
    out.validate()
    return out


def hf_splitter(config: TransformerConfig):
    """split(suffix, t, name) -> [(canonical leaf, expert, matrix)] for a layer's fused experts, None for any
    other tensor: output-major tensors as views of the file's rows, input-major ones as each expert's transposed
    copy, made when the backend packs it (TransposedExpert)."""
    d, inner = config.d_model, config.expert_ffn_dim

    def split(suffix: str, t, name: str):
        if suffix not in (GATE_UP, DOWN):
            return None
        rows, cols = (2 * inner, d) if suffix == GATE_UP else (d, inner)
        n = config.n_experts
        if t.shape == (n, rows, cols):                  # output-major: transformers 5's
            mats = [expert_matrix(t, e) for e in range(n)]
            if suffix == DOWN:
                return [("ffn_down_exps.weight", e, m) for e, m in enumerate(mats)]
            out = []
            for e, m in enumerate(mats):
                gate, up = m.split_rows([inner, inner])
                out += [("ffn_gate_exps.weight", e, gate), ("ffn_up_exps.weight", e, up)]
            return out
        if t.shape == (n, cols, rows):                  # input-major: the Hub's
            if suffix == DOWN:
                return [("ffn_down_exps.weight", e, TransposedExpert(f"{name}[{e}]", t, e, 0, d)) for e in range(n)]
            return [(leaf, e, TransposedExpert(f"{name}[{e}]", t, e, lo, lo + inner))
                    for e in range(n) for leaf, lo in (("ffn_gate_exps.weight", 0), ("ffn_up_exps.weight", inner))]
        raise ModelFormatError(f"tensor {name!r} has shape {t.shape}, not {n} experts' {(rows, cols)} matrices "
                               f"(or their transposes)")

    return split

"""DeepSeek-V2/V3 (DeepSeek-V2-Lite, Moonlight, ...; llama.cpp's `deepseek2`): multi-head latent attention
and mixture-of-experts MLPs with shared experts.

Attention (MLA): q = q_b(rmsnorm(q_a(h))) (or q_proj(h) without q_lora_rank), per head [q_nope, q_pe];
kv_a_proj_with_mqa(h) = [c (kv_lora_rank), k_pe (qk_rope_head_dim, one for every head)]; kv_b(rmsnorm(c))
per head [k_nope, v]. RoPE on q_pe and k_pe only, in DeepSeek's adjacent-pair layout (HF's complex
rotation, or V3's `rope_interleave`; llama.cpp's NORM rope); scores q_nope.k_nope + q_pe.k_pe times
(qk_nope + qk_rope)^-0.5, and with YaRN times mscale(factor, mscale_all_dim)^2 (cos and sin left unscaled:
a model whose `mscale` differs from `mscale_all_dim` scales only its rope dims, which is refused).
models/mla.py runs MLA over its compressed cache (_mla_compressed_block): kv_lora_rank + qk_rope values per
token and layer, kv_b absorbed into each head's query and output; LLAMBDA_MLA_EXPANDED=1 expands it into
ordinary attention instead (_mla_block: every head's full key and its value padded to the key's width,
2 n_heads (qk_nope + qk_rope) values per token and layer).

MLP: the first `first_k_dense_replace` layers dense, then MoE: V2 a softmax over the experts, the top k
(`greedy`, or `group_limited_greedy`: only within the `topk_group` of `n_group` groups whose best expert
scores highest), weights times `routed_scaling_factor`; V3 a sigmoid per expert, chosen by score +
`e_score_correction_bias` within the `topk_group` groups whose two best choices sum highest (`noaux_tc`),
the chosen scores renormalised if `norm_topk_prob`, then scaled. Plus n_shared_experts always-on experts
(one SiLU MLP of n_shared * moe_intermediate_size).

GGUF (`deepseek2`): older files hold attn_kv_b with key_length qk_nope + qk_rope and value_length
v_head_dim; newer ones (MLA in llama.cpp) key_length_mla / value_length_mla and kv_b split into attn_k_b
(per head kv_lora x qk_nope, transposed) and attn_v_b: both read (the split one rejoined at load,
formats/gguf_model.py through `gguf_lookup`). Exports write the newer layout, as llama.cpp's converter
does now (tools/export.py).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFormatError
from ..formats.quants import TRAITS, QType, quantize, tensor_nbytes
from ..formats.weights import WeightTensor
from .config import TransformerConfig
from .hparams import GGUFHParams, HFConfig, refuse_quantized
from .llama import check_hf_mlp

# HF per-layer names of this family (merged over the shared ones by formats/hf_dir.py)
HF_LAYER_NAMES = {
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
}
# The rope layout is DeepSeek's own in both formats (adjacent pairs), not HF's usual half-split one
HF_ROPE_NEOX = False

# llama.cpp's expert_gating_func values
GATING = {1: "softmax_topk", 2: "sigmoid_topk"}


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _attn_scale(qk_dim: int, scaling: dict | None, where: str) -> float:
    """The softmax scale, with `scaling` (a yarn dict) made to leave cos and sin alone (attention_factor 1)."""
    scale = qk_dim ** -0.5
    if not scaling:
        return scale
    if scaling.get("rope_type") != "yarn":
        raise ModelFormatError(f"{where}: DeepSeek RoPE scaling {scaling.get('rope_type')!r} is not supported (yarn is)")
    factor = float(scaling["factor"])
    all_dim = scaling.get("mscale_all_dim")
    af = scaling.get("attention_factor")
    if af is None:
        mscale = scaling.get("mscale")
        af = yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim) if mscale and all_dim else yarn_mscale(factor)
    if not math.isclose(float(af), 1.0, rel_tol=1e-6):
        raise ModelFormatError(f"{where}: a YaRN attention factor of {af:.6g} on the rotary dims alone (mscale "
                               f"{scaling.get('mscale')!r} vs mscale_all_dim {all_dim!r}) is not supported")
    scaling["attention_factor"] = 1.0
    if all_dim:
        scale *= yarn_mscale(factor, float(all_dim)) ** 2
    return scale


def hf_extra_layers(cfg: dict) -> int:
    """The multi-token-prediction layers a checkpoint holds past the decoder's (V3: one), not run here."""
    return HFConfig(cfg).get("num_nextn_predict_layers", 0, int, "n_layers")


def config_from_hf(cfg: dict) -> TransformerConfig:
    check_hf_mlp(cfg)
    hf = HFConfig(cfg)
    refuse_quantized(cfg, "DeepSeek")
    if hf.flag("attention_bias", False) or hf.flag("mlp_bias", False):
        raise ModelFormatError("config.json attention_bias / mlp_bias true is not supported for DeepSeek")
    v3 = cfg.get("model_type") == "deepseek_v3"
    c = hf.common("deepseek2")
    rope = hf.get("qk_rope_head_dim", 64, int, "rope_dim")
    nope = hf.get("qk_nope_head_dim", 128, int, "qk_nope_dim")
    vd = hf.get("v_head_dim", 128, int, "v_head_dim")
    scaling = c["rope_scaling"]
    if scaling is not None:
        scaling = dict(scaling)
        if scaling.get("factor") is None and scaling.get("rope_type") == "yarn":     # V3: the context ratio
            orig = hf.get("original_max_position_embeddings", None, int, "n_ctx_train") or \
                scaling.get("original_max_position_embeddings")
            scaling["factor"] = c["n_ctx_train"] / float(orig)
    n = c["n_layers"]
    c.update(head_dim=nope + rope, n_kv_heads=c["n_heads"], rope_dim=rope, rope_scaling=scaling)
    attn_scale = _attn_scale(nope + rope, scaling, "config.json")
    moe = _hf_moe(cfg, hf, n, v3)
    out = TransformerConfig(**c, q_lora_rank=hf.get("q_lora_rank", 0, int, "q_lora_rank"),
                            kv_lora_rank=hf.get("kv_lora_rank", kind=int, limit="kv_lora_rank"), qk_nope_dim=nope,
                            v_head_dim=vd, attn_scale=attn_scale, **moe)
    out.rope_neox = v3 and not hf.flag("rope_interleave", True)
    if not out.kv_lora_rank:
        raise ModelFormatError("config.json kv_lora_rank must be positive")
    return out


def _hf_moe(cfg: dict, hf: HFConfig, n_layers: int, v3: bool) -> dict:
    E = hf.get("n_routed_experts", None, int, "n_experts")
    if E is None:
        E = hf.get("num_local_experts", None, int, "n_experts") or hf.get("num_experts", 0, int, "n_experts")
    if not E:
        return {}
    lead = hf.get("first_k_dense_replace", 0, int, "n_layers")
    freq = hf.get("moe_layer_freq", 1, int)
    if freq != 1:
        raise ModelFormatError(f"config.json moe_layer_freq {freq} is not supported (1 is)")
    ffe = hf.get("moe_intermediate_size", kind=int, limit="expert_ffn_dim")
    shared = hf.get("n_shared_experts", 0, int, "n_experts")
    scoring = cfg.get("scoring_func", "sigmoid" if v3 else "softmax")
    method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
    if scoring not in ("softmax", "sigmoid") or method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise ModelFormatError(f"config.json scoring_func {scoring!r} with topk_method {method!r} is not supported")
    norm = hf.flag("norm_topk_prob", False)
    if not v3 and norm:
        # DeepSeek's V2 code renormalises instead of scaling, transformers ignores it, llama.cpp does both
        raise ModelFormatError("config.json norm_topk_prob true in a deepseek_v2 model is not supported (its "
                               "implementations disagree on what it means)")
    groups = used = 1
    if method != "greedy":
        groups = hf.get("n_group", 1, int, "moe_groups")
        used = hf.get("topk_group", groups, int, "moe_groups_used")
    return dict(n_experts=E, n_experts_used=hf.get("num_experts_per_tok", kind=int, limit="n_experts_used"),
                expert_ffn_dim=ffe, shared_ffn_dim=HFConfig.check("config.json n_shared_experts * moe_intermediate_size",
                                                                  shared * ffe, int, "shared_ffn_dim"),
                moe_layers=[i >= lead for i in range(n_layers)], moe_norm_topk=norm,
                moe_routing="sigmoid_topk" if scoring == "sigmoid" else "softmax_topk",
                moe_groups=groups, moe_groups_used=used,
                moe_group_top=2 if method == "noaux_tc" else 1, moe_choice_bias=method == "noaux_tc",
                moe_scale=hf.get("routed_scaling_factor", 1.0, float, "positive"))


def config_from_gguf(meta: dict) -> TransformerConfig:
    a = "deepseek2"
    hp = GGUFHParams(meta, a)
    if f"{a}.attention.key_length_mla" in meta:     # a newer file: the expanded heads' sizes under their own keys
        qk, vd = hp.int("attention.key_length_mla", limit="head_dim"), hp.int("attention.value_length_mla", limit="head_dim")
    else:
        qk, vd = hp.int("attention.key_length", limit="head_dim"), hp.int("attention.value_length", limit="head_dim")
    plain = {k: v for k, v in meta.items() if k not in (f"{a}.attention.key_length", f"{a}.attention.value_length",
                                                         f"{a}.attention.head_count_kv")}
    c = GGUFHParams(plain, a).common()
    rope = c["rope_dim"]
    if qk <= rope:
        raise ModelFormatError(f"GGUF metadata: key heads of {qk} leave no dims beside the {rope} rotated ones")
    scaling = c["rope_scaling"]
    attn_scale = (qk ** -0.5)
    if scaling:
        if scaling["rope_type"] != "yarn":
            raise ModelFormatError(f"GGUF metadata: DeepSeek RoPE scaling {scaling['rope_type']!r} is not supported")
        scaling["attention_factor"] = 1.0        # llama.cpp leaves cos and sin unscaled for deepseek2
        ylm = hp.float("rope.scaling.yarn_log_multiplier", 0.0)
        factor = scaling["factor"]
        attn_scale *= (1.0 + ylm * math.log(factor)) ** 2 if factor > 1 else 1.0
    c.update(head_dim=qk, n_kv_heads=c["n_heads"])
    E = hp.int("expert_count", 0, "n_experts")
    moe = {}
    if E:
        gating = hp.int("expert_gating_func", 1)
        if gating not in GATING:
            raise ModelFormatError(f"GGUF metadata '{a}.expert_gating_func' = {gating} is not supported (1 softmax, "
                                   "2 sigmoid)")
        ffe = hp.int("expert_feed_forward_length", limit="expert_ffn_dim")
        shared = hp.int("expert_shared_count", 0, "n_experts")
        lead = hp.int("leading_dense_block_count", 0, "n_layers")
        groups = hp.int("expert_group_count", 1, "moe_groups") or 1
        moe = dict(n_experts=E, n_experts_used=hp.int("expert_used_count", limit="n_experts_used"), expert_ffn_dim=ffe,
                   shared_ffn_dim=HFConfig.check(f"GGUF metadata '{a}.expert_shared_count' times the experts' size",
                                                 shared * ffe, int, "shared_ffn_dim"),
                   moe_layers=[i >= lead for i in range(c["n_layers"])], moe_routing=GATING[gating],
                   moe_norm_topk=hp.flag("expert_weights_norm", False),
                   moe_scale=hp.float("expert_weights_scale", 1.0, "positive"), moe_groups=groups,
                   moe_groups_used=hp.int("expert_group_used_count", groups, "moe_groups_used") if groups > 1 else 1,
                   moe_group_top=2 if gating == 2 else 1, moe_choice_bias=gating == 2)
    return TransformerConfig(**c, rope_neox=False, attn_scale=attn_scale,
                             q_lora_rank=hp.int("attention.q_lora_rank", 0, "q_lora_rank"),
                             kv_lora_rank=hp.int("attention.kv_lora_rank", limit="kv_lora_rank"),
                             qk_nope_dim=qk - rope, v_head_dim=vd, **moe)


def gguf_lookup(get, cfg: TransformerConfig):
    """Serve `attn_kv_b.weight` from a newer file's attn_k_b (heads x kv_lora x qk_nope: each head's k rows
    transposed) and attn_v_b (heads x v x kv_lora); the tensors' own names otherwise. Returns (lookup,
    holders: canonical name -> the file's tensors it reads)."""
    def lookup(name: str):
        t = get(name)
        if t is not None or not name.endswith("attn_kv_b.weight"):
            return t
        p = name[:-len("attn_kv_b.weight")]
        kb, vb = get(p + "attn_k_b.weight"), get(p + "attn_v_b.weight")
        if kb is None or vb is None:
            return None
        return join_kv_b(kb, vb, cfg, name)

    def holders(name: str) -> list[str]:
        if name.endswith("attn_kv_b.weight") and get(name) is None:
            p = name[:-len("attn_kv_b.weight")]
            return [p + "attn_k_b.weight", p + "attn_v_b.weight"]
        return [name]

    return lookup, holders


def _joined_qtype(kb_type: QType, vb_type: QType, r: int) -> QType:
    floats = (QType.F32, QType.F16, QType.BF16)
    if (kb_type not in floats or vb_type not in floats) and r % TRAITS[QType.Q8_0].block_size == 0:
        return QType.Q8_0
    return QType.F32


def split_part_at_load(src, name: str, t: WeightTensor) -> WeightTensor:
    """For the memory plan: a newer file's attn_k_b / attn_v_b as the part of the rejoined attn_kv_b the load
    keeps (join_kv_b: its rows of kv_lora columns, Q8_0 or float32); any other tensor as it is."""
    for half, other in (("attn_k_b.weight", "attn_v_b.weight"), ("attn_v_b.weight", "attn_k_b.weight")):
        if name.endswith(half) and len(t.shape) == 3:
            o = src.tensor(name[:-len(half)] + other)
            if o is None:
                return t
            kb, vb = (t, o) if half == "attn_k_b.weight" else (o, t)
            r = int(vb.shape[-1])
            return WeightTensor(name, _joined_qtype(kb.qtype, vb.qtype, r), (int(np.prod(t.shape)) // r, r), t.data)
    return t


def join_kv_b(kb: WeightTensor, vb: WeightTensor, cfg: TransformerConfig, name: str) -> WeightTensor:
    """kv_b_proj (heads (qk_nope + v), kv_lora) from its split halves: a transposed quantized block cannot
    stay in its type, so Q8_0 when either half is quantized (and kv_lora_rank splits into its blocks), else
    float32. These matrices are small beside the experts."""
    H, nope, vd, r = cfg.n_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if tuple(kb.shape) != (H, r, nope) or tuple(vb.shape) != (H, vd, r):
        raise ModelFormatError(f"tensors {kb.name!r} {tuple(kb.shape)} and {vb.name!r} {tuple(vb.shape)} do not hold "
                               f"{H} heads of ({r}, {nope}) and ({vd}, {r})")
    k = kb.to_float32().reshape(H, r, nope).transpose(0, 2, 1)          # (H, nope, r)
    v = vb.to_float32().reshape(H, vd, r)
    joined = np.concatenate([k, v], axis=1).reshape(H * (nope + vd), r)
    if _joined_qtype(kb.qtype, vb.qtype, r) == QType.Q8_0:
        return WeightTensor(name, QType.Q8_0, joined.shape, quantize(joined, QType.Q8_0).reshape(-1))
    return WeightTensor.from_float(name, joined)


def absorbed_key_heads(kv_b: WeightTensor, cfg: TransformerConfig) -> list[WeightTensor]:
    """Per head the transpose of kv_b's key rows, (kv_lora, qk_nope): it takes a head's q_nope to the query
    of the compressed cache's latent part (q_nope . (W_uk c) = (q_nope W_uk) . c). A transposed quantized
    block cannot keep its type: Q8_0 from a quantized kv_b (when qk_nope splits into its blocks), else
    float32, as join_kv_b."""
    H, nope, vd, r = cfg.n_heads, cfg.qk_nope_dim, cfg.v_head_dim, cfg.kv_lora_rank
    k = kv_b.to_float32().reshape(H, nope + vd, r)[:, :nope].transpose(0, 2, 1)     # (H, r, nope)
    q8 = absorbed_key_type(kv_b.qtype, cfg) == QType.Q8_0
    return [WeightTensor(f"{kv_b.name}[{h}]", QType.Q8_0, (r, nope), quantize(np.ascontiguousarray(k[h]), QType.Q8_0)
                         .reshape(-1)) if q8 else WeightTensor.from_float(f"{kv_b.name}[{h}]", np.ascontiguousarray(k[h]))
            for h in range(H)]


def absorbed_key_type(kv_b_type: QType, cfg: TransformerConfig) -> QType:
    """The type absorbed_key_heads keeps kv_b's transposed key half in."""
    return _joined_qtype(kv_b_type, kv_b_type, cfg.qk_nope_dim)


def absorbed_key_growth(kv_b_type: QType, kv_b_bytes: int, cfg: TransformerConfig) -> int:
    """For the memory plan: what the compressed path's copy of kv_b's key half (absorbed_key_heads) takes
    beyond that half's `kv_b_bytes` share."""
    nope, vd = cfg.qk_nope_dim, cfg.v_head_dim
    keys = (cfg.n_heads * cfg.kv_lora_rank, nope)
    return tensor_nbytes(absorbed_key_type(kv_b_type, cfg), keys) - kv_b_bytes * nope // (nope + vd)

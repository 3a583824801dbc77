"""Tensors an architecture always has, by its config's own rule: a checkpoint without one is refused by name,
never loaded as another model (a shared expert without its gate, a router without its bias). And the same
tensors where the architecture has none are refused, not run.

Each case deletes one tensor from a tiny fixture (fixtures/reference/tiny), as a HF directory and as a GGUF
file llambda's exporter writes from it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.safetensors import SafetensorsFile, write_safetensors
from llambda.tools.export import export

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"

# (folder, the HF tensor, the GGUF tensor): what each architecture's config says it has
REQUIRED = [
    # MoE: the shared expert's gate (shared_expert_intermediate_size > 0), GPT-OSS's router bias
    ("qwen2_moe", "model.layers.1.mlp.shared_expert_gate.weight", "blk.1.ffn_gate_inp_shexp.weight"),
    ("qwen3_next", "model.layers.0.mlp.shared_expert_gate.weight", "blk.0.ffn_gate_inp_shexp.weight"),
    ("gpt_oss", "model.layers.1.mlp.router.bias", "blk.1.ffn_gate_inp.bias"),
    ("gpt_oss", "model.layers.0.mlp.experts.down_proj_bias", "blk.0.ffn_down_exps.bias"),
    # attention biases, sinks
    ("qwen2", "model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"),
    ("qwen2", "model.layers.1.self_attn.v_proj.bias", "blk.1.attn_v.bias"),
    ("qwen2_moe", "model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias"),
    ("gpt_oss", "model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias"),
    ("gpt_oss", "model.layers.1.self_attn.o_proj.bias", "blk.1.attn_output.bias"),
    ("gpt_oss", "model.layers.0.self_attn.sinks", "blk.0.attn_sinks.weight"),
    # q/k norms, per head or over the whole projection
    ("qwen3", "model.layers.0.self_attn.q_norm.weight", "blk.0.attn_q_norm.weight"),
    ("qwen3_moe", "model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
    ("qwen3_next", "model.layers.3.self_attn.q_norm.weight", "blk.3.attn_q_norm.weight"),
    ("olmo2", "model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
    ("gemma3", "model.layers.1.self_attn.q_norm.weight", "blk.1.attn_q_norm.weight"),
    # sandwich norms
    ("olmo2", "model.layers.1.post_feedforward_layernorm.weight", "blk.1.post_ffw_norm.weight"),
    ("gemma2", "model.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight"),
    ("gemma3", "model.layers.0.post_feedforward_layernorm.weight", "blk.0.post_ffw_norm.weight"),
    # delta-net and latent attention
    ("qwen3_next", "model.layers.0.linear_attn.dt_bias", "blk.0.ssm_dt.bias"),
    ("qwen3_next", "model.layers.1.linear_attn.norm.weight", "blk.1.ssm_norm.weight"),
    ("deepseek_v2", "model.layers.0.self_attn.kv_a_layernorm.weight", "blk.0.attn_kv_a_norm.weight"),
    ("deepseek_v3", "model.layers.1.self_attn.q_a_layernorm.weight", "blk.1.attn_q_a_norm.weight"),
    ("deepseek_v3", "model.layers.1.mlp.gate.e_score_correction_bias", "blk.1.exp_probs_b.bias"),
    # GLM-4's biases and sandwich norms (under GLM's names), GLM-4.5's router bias, shared expert, q/k norms
    ("glm4", "model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias"),
    ("glm4", "model.layers.1.post_mlp_layernorm.weight", "blk.1.post_ffw_norm.weight"),
    ("glm4", "model.layers.2.post_self_attn_layernorm.weight", "blk.2.post_attention_norm.weight"),
    ("glm4_moe", "model.layers.1.mlp.gate.e_score_correction_bias", "blk.1.exp_probs_b.bias"),
    ("glm4_moe", "model.layers.2.mlp.shared_experts.up_proj.weight", "blk.2.ffn_up_shexp.weight"),
    ("glm4_moe", "model.layers.0.self_attn.k_norm.weight", "blk.0.attn_k_norm.weight"),
    ("glm4_moe", "model.layers.2.self_attn.v_proj.bias", "blk.2.attn_v.bias"),
    # Command-R's per-head q/k norms; StarCoder2's LayerNorm biases (the final norm's too), MLP and output biases
    ("cohere", "model.layers.2.self_attn.q_norm.weight", "blk.2.attn_q_norm.weight"),
    ("starcoder2", "model.norm.bias", "output_norm.bias"),
    ("starcoder2", "model.layers.1.post_attention_layernorm.bias", "blk.1.ffn_norm.bias"),
    ("starcoder2", "model.layers.0.mlp.c_proj.bias", "blk.0.ffn_down.bias"),
    ("starcoder2", "model.layers.2.self_attn.o_proj.bias", "blk.2.attn_output.bias"),
]


def _hf_without(tmp_path: Path, folder: str, name: str) -> Path:
    d = tmp_path / folder
    shutil.copytree(TINY / folder, d)
    with SafetensorsFile(d / "model.safetensors") as st:
        assert name in st.tensors, sorted(st.tensors)
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items() if n != name}
    write_safetensors(d / "model.safetensors", arrays)
    return d


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """folder -> its GGUF export, each written once."""
    done = {}

    def get(folder: str) -> Path:
        if folder not in done:
            done[folder] = export(TINY / folder, tmp_path_factory.mktemp(folder) / "x.gguf", fmt="gguf")
        return done[folder]
    return get


def _gguf_without(src: Path, dest: Path, name: str) -> Path:
    with GGUFFile(src) as f:
        assert name in f.tensors, sorted(f.tensors)
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values() if t.name != name]
    write_gguf(dest, meta, items)
    return dest


def _refused(path: Path, name: str) -> str:
    with pytest.raises(ModelFormatError) as e:
        llambda.load(path, backend="numpy", n_ctx=32)
    assert "missing tensor" in str(e.value) and str(path) in str(e.value), str(e.value)
    return str(e.value)


@pytest.mark.parametrize("folder, hf_name, gguf_name", REQUIRED)
def test_a_tensor_the_architecture_always_has_is_required(tmp_path, exported, folder, hf_name, gguf_name):
    # a HF directory's by the checkpoint's name, the canonical one after it; a GGUF file's by its own
    msg = _refused(_hf_without(tmp_path, folder, hf_name), gguf_name)
    assert f"'{hf_name}'" in msg and f"({gguf_name})" in msg, msg
    msg = _refused(_gguf_without(exported(folder), tmp_path / "without.gguf", gguf_name), gguf_name)
    assert f"missing tensor '{gguf_name}'," in msg, msg


def test_each_hf_name_of_a_canonical_one_is_listed():
    """Several HF names map to one canonical name (the router's): each is one a checkpoint could have used."""
    from llambda.formats.hf_dir import canonical_name, hf_names
    names = hf_names("blk.2.ffn_gate_inp.weight", False, "qwen2_moe")
    assert {"model.layers.2.mlp.gate.weight", "model.layers.2.block_sparse_moe.gate.weight",
            "model.layers.2.mlp.router.weight"} <= set(names), names
    assert all(canonical_name(n, 3, False, "qwen2_moe") == "blk.2.ffn_gate_inp.weight" for n in names)
    assert hf_names("blk.0.ffn_up_exps.weight", False, "mixtral") == [
        "model.layers.0.mlp.experts.N.up_proj.weight", "model.layers.0.block_sparse_moe.experts.N.w3.weight"]
    assert hf_names("blk.0.attn_kv_b.weight", False, "deepseek2") == ["model.layers.0.self_attn.kv_b_proj.weight"]
    assert hf_names("output.weight", False) == ["lm_head.weight"] and hf_names("blk.0.nonesuch", False) == []


@pytest.mark.parametrize("folder, hf_name, rows", [
    ("deepseek_v2", "model.layers.1.mlp.shared_expert_gate.weight", 1),     # a shared expert without a gate
    ("qwen3_moe", "model.layers.1.mlp.router.bias", None),                 # a router without a bias
])
def test_a_tensor_the_architecture_lacks_is_refused(tmp_path, folder, hf_name, rows):
    """Read wherever present, these ran another model than the architecture's; now they are left unread."""
    d = tmp_path / folder
    shutil.copytree(TINY / folder, d)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    width = arrays["model.embed_tokens.weight"].shape[1]
    n_experts = next(a.shape[0] for n, a in arrays.items() if n.endswith(".mlp.gate.weight"))
    arrays[hf_name] = np.full((rows, width) if rows else (n_experts,), 0.5, np.float32)
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=f"not part of the model.*'{hf_name}'"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_an_untied_head_the_checkpoint_lacks_is_refused(tmp_path):
    """config.json's tie_word_embeddings false and no lm_head: the model ran on the embedding as its head."""
    d = _hf_without(tmp_path, "gpt_oss", "lm_head.weight")
    with pytest.raises(ModelFormatError, match="tie_word_embeddings false.*no lm_head.weight"):
        llambda.load(d, backend="numpy", n_ctx=32)


def test_no_head_and_no_word_on_tying_is_tied(tmp_path):
    """Without the key (config classes differ on its default) a checkpoint without lm_head stays tied."""
    import json
    d = _hf_without(tmp_path, "gpt_oss", "lm_head.weight")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["tie_word_embeddings"]
    (d / "config.json").write_text(json.dumps(cfg))
    with llambda.load(d, backend="numpy", n_ctx=32) as m:
        assert m.config.tie_embeddings and np.isfinite(m.logits([1, 5, 9, 2])).all()

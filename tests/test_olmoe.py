"""OLMoE (`olmoe`, HF OlmoeForCausalLM).

The tiny reference (fixtures/reference/tiny/olmoe, tools/make_tiny_morearch.py, README_morearch.md there) runs from
its HF directory in test_tiny_models.py and, exported, in llama.cpp in test_export.py. Here: our GGUF export on
every backend against transformers, the settings each format gives, decode steps against full forwards, the
routing's (un)renormalised weights, and the configs refused.
"""
from __future__ import annotations

import numpy as np
import pytest

from archkit import MODES, TINY, decode_vs_full, edited_copy, greedy_matches, load, max_err, reference
from llambda.errors import ModelFormatError
from llambda.formats.gguf import GGUFFile
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.tools.export import export


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return export(TINY / "olmoe", tmp_path_factory.mktemp("olmoe") / "f32.gguf", fmt="gguf", qtype="f32")


@pytest.mark.parametrize("mode", list(MODES))
def test_our_gguf_matches_transformers(gguf, mode):
    with load(gguf, mode) as m:
        assert m.config.arch == "olmoe"
        assert max_err(m, "olmoe") <= MODES[mode][2]
        assert greedy_matches(m, "olmoe")


def test_settings_from_each_format(gguf):
    with GGUFFile(gguf) as f:
        meta, names = f.metadata, set(f.tensors)
    assert meta["general.architecture"] == "olmoe"
    assert (meta["olmoe.expert_count"], meta["olmoe.expert_used_count"], meta["olmoe.feed_forward_length"]) == (8, 2, 32)
    assert meta["olmoe.expert_weights_norm"] is False
    # q/k norms over the whole projections, MoE tensors as llama.cpp names them
    with GGUFFile(gguf) as f:
        assert f.tensors["blk.0.attn_q_norm.weight"].shape == (64,) and f.tensors["blk.0.attn_k_norm.weight"].shape == (64,)
    assert {"output.weight", "blk.2.ffn_gate_inp.weight", "blk.2.ffn_gate_exps.weight", "blk.2.ffn_down_exps.weight"} <= names
    for path in (TINY / "olmoe", gguf):
        with load(path, n_ctx=32) as m:
            c = m.config
        assert (c.qk_norm, c.qk_norm_whole, c.rope_neox, c.attn_bias) == (True, True, True, False)
        assert (c.n_experts, c.n_experts_used, c.expert_ffn_dim, c.moe_routing, c.moe_norm_topk) == \
            (8, 2, 32, "softmax_topk", False)
        assert c.moe_layers == [True] * 3 and c.shared_ffn_dim == 0


@pytest.mark.parametrize("mode", ["numpy", "native-exact"])
def test_decode_steps_equal_a_full_forward(mode):
    ids = reference("olmoe")["inputs"][1]["input_ids"]
    with load(TINY / "olmoe", mode) as m:
        assert decode_vs_full(m, ids, prefill=30) <= 1e-4


def test_renormalising_the_top_k_is_another_model(tmp_path):
    """norm_topk_prob false is what the reference ran: the same weights with it true are off (the control)."""
    with load(edited_copy("olmoe", tmp_path / "n", norm_topk_prob=True)) as m:
        assert m.config.moe_norm_topk and max_err(m, "olmoe") > 0.05


@pytest.mark.parametrize("changes, field", [
    ({"clip_qkv": 8.0}, "clip_qkv"),
    ({"num_experts": 0}, "num_experts"),
    ({"num_experts": None}, "num_experts"),
    ({"num_experts_per_tok": 9}, "experts used per token"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"norm_topk_prob": "no"}, "norm_topk_prob"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"num_attention_heads": 3}, "num_key_value_heads|n_heads"),
])
def test_malformed_configs_are_refused_by_name(tmp_path, changes, field):
    with pytest.raises(ModelFormatError, match=field):
        load(edited_copy("olmoe", tmp_path / "m", **changes), n_ctx=32)


def test_a_gguf_without_experts_is_refused(gguf, tmp_path):
    with GGUFFile(gguf) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items() if k != "olmoe.expert_count"}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    write_gguf(tmp_path / "bad.gguf", meta, items)
    with pytest.raises(ModelFormatError, match="expert_count"):
        load(tmp_path / "bad.gguf", n_ctx=32)

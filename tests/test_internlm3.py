"""InternLM3 beyond the shared tiny-model tests (test_tiny_models.py, test_export.py run its folder against
transformers and llama.cpp): Dynamic NTK RoPE run as the plain RoPE it is within max_position_embeddings and a
context past that refused, its GGUF (llama.cpp's `llama`) on every backend, and malformed configs refused."""
import pytest

import llambda
from archkit import MODES, TINY, edited_copy, exported, load, max_err  # noqa: F401 (a fixture)
from llambda.errors import InvalidInputError, ModelFormatError


def test_dynamic_ntk_runs_within_its_context_and_refuses_past_it(tmp_path):
    with llambda.load(TINY / "internlm3", backend="numpy", n_ctx=256) as m:
        assert m.config.ctx_limit == 256 and m.config.rope_scaling is None and m.config.head_dim == 24
        assert max_err(m, "internlm3") <= 1e-3
    with pytest.warns(Warning), pytest.raises(InvalidInputError, match="Dynamic NTK"):
        llambda.load(TINY / "internlm3", backend="numpy", n_ctx=257)
    plain = edited_copy("internlm3", tmp_path / "plain", rope_parameters={"rope_type": "default", "rope_theta": 5e4})
    with pytest.warns(Warning), llambda.load(plain, backend="numpy", n_ctx=300) as m:    # no dynamic scaling: no limit
        assert m.config.ctx_limit == 0


@pytest.mark.parametrize("mode", list(MODES))
def test_gguf_export_is_llama_and_matches_transformers(mode, exported):
    with load(exported("internlm3"), mode) as m:
        assert m.config.arch == "llama" and max_err(m, "internlm3") <= MODES[mode][2]


@pytest.mark.parametrize("changes, message", [
    ({"qkv_bias": True}, "qkv_bias"),
    ({"bias": True}, "json bias=true"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 0.5, "rope_theta": 5e4}}, "factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": "6", "rope_theta": 5e4}}, "factor"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 6.0, "rope_theta": 5e4,
                          "original_max_position_embeddings": 128}}, "original_max_position_embeddings"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_bad_configs_are_model_format_errors(tmp_path, changes, message):
    with pytest.raises(ModelFormatError, match=message):
        llambda.load(edited_copy("internlm3", tmp_path / "m", **changes), backend="numpy", n_ctx=16)

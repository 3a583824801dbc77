"""ModernBERT: pre-norm blocks without biases, rotary positions with a global and a local base, a local band in
two of every three layers, the GeGLU MLP, mean (or CLS) pooling.

Reference: transformers' ModernBertModel (tools/make_tiny_modernbert.py wrote tests/fixtures/encoders/modernbert:
the folder as sentence-transformers saves it, and reference.json: per input, token ids shorter and longer than the
local band, the last hidden states and the mean-pooled L2-normalized embedding).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import ModelFormatError
from test_embeddinggemma import BACKENDS, assert_the_band_matters, reference
from test_nomic_bert import _load

FIXTURE, REF, IDS, WANT = reference("modernbert")


@pytest.mark.parametrize("backend,activations,tol", BACKENDS)
def test_modernbert_dir_matches_transformers(backend, activations, tol):
    with _load(FIXTURE, backend, activations) as m:
        assert m.is_encoder and not m.is_reranker and m.config.arch == "modernbert"
        assert m.config.sliding == [False, True, True, False] and m.config.half == 4 and m.config.pooling == "mean"
        got = m.embed(IDS, batch_size=4)
        assert np.abs(got - WANT).max() <= tol
        alone = np.stack([m.embed([ids])[0] for ids in IDS])
        assert np.abs(alone - got).max() <= max(tol, 1e-5)
        if backend == "numpy":
            from llambda.models.bert import pack_batch
            ids, types, starts = pack_batch([(i, [0] * len(i)) for i in IDS])
            hidden = m.encoder.forward(ids, types, starts)
            for s, case in enumerate(REF["cases"]):
                assert np.abs(hidden[starts[s]:starts[s + 1]] - np.array(case["hidden"])).max() <= 1e-5


def test_the_local_band_matters():
    with _load(FIXTURE) as m:
        assert_the_band_matters(m, lambda: setattr(m.config, "half", 10 ** 6), IDS, WANT, 4)


def _copy(tmp_path: Path, **changes) -> Path:
    out = tmp_path / "mb"
    shutil.copytree(FIXTURE, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return out


def test_transformers_4_config_spelling_is_the_same_model(tmp_path):
    """Released ModernBERT configs have global_rope_theta / local_rope_theta and global_attn_every_n_layers, no
    rope_parameters nor layer_types."""
    folder = _copy(tmp_path, rope_parameters=None, layer_types=None, global_rope_theta=1000.0,
                   local_rope_theta=10000.0, global_attn_every_n_layers=3)
    with _load(folder) as m:
        assert np.abs(m.embed(IDS) - WANT).max() <= 1e-6


def test_without_a_pooling_module_classifier_pooling_says(tmp_path):
    folder = _copy(tmp_path)
    shutil.rmtree(folder / "1_Pooling")
    with _load(folder) as m:             # (transformers' default: cls)
        assert m.config.pooling == "cls"
        got = m.embed(IDS)
    first = np.stack([np.array(c["hidden"])[0] for c in REF["cases"]])
    assert np.abs(got - first / np.linalg.norm(first, axis=-1, keepdims=True)).max() <= 1e-5


@pytest.mark.parametrize("change", [{"norm_bias": True}, {"mlp_bias": True}, {"attention_bias": True},
                                    {"hidden_activation": "silu"}, {"num_attention_heads": 3},
                                    {"layer_types": ["full_attention"]}, {"local_attention": 0},
                                    {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                                         "sliding_attention": {"rope_type": "default"}}}])
def test_unsupported_modernbert_configs_are_refused(tmp_path, change):
    with pytest.raises(ModelFormatError):
        llambda.load(_copy(tmp_path, **change), backend="numpy")

"""Well-formed model files whose *meaning* is hostile: hyper-parameters, config.json values and tensors that
parse but contradict each other or the engine's limits. Each must end in a typed llambda error naming what is
wrong, or load and run as the file says; never a silently different model (a head the file does not have,
layers it holds left out) or an untyped error at the first forward step.

The files are the tiny fixtures of fixtures/reference/tiny (HF directories) and GGUF files written from them
by llambda's own exporter, changed one field at a time.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import InvalidInputError, LlambdaError, ModelFormatError

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
BACKENDS = available_backends()
PROMPT = [1, 5, 9, 2]


def _hf(tmp_path: Path, folder: str, **changes) -> Path:
    """A copy of tiny `folder` with config.json's keys set to `changes` (raw JSON values)."""
    d = tmp_path / folder
    if not d.exists():
        shutil.copytree(TINY / folder, d)
    cfg = json.loads((TINY / folder / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _logits(path: Path, backend: str, **kw) -> np.ndarray:
    with llambda.load(path, backend=backend, threads=1, n_ctx=32, **kw) as m:
        return m.logits(PROMPT)


# ---------------------------------------------------------------- config.json booleans

# bool() of each of these was True (or False for "" and 0.0): a string "false" tied the head to the embeddings
NOT_BOOLS = ["false", "abc", 2, 0.0, float("nan"), [1], {}]


@pytest.mark.parametrize("folder, key", [
    ("mixtral", "tie_word_embeddings"), ("qwen3", "tie_word_embeddings"), ("gemma3", "tie_word_embeddings"),
    ("lfm2", "tie_word_embeddings"), ("qwen3_moe", "norm_topk_prob"), ("qwen2_moe", "norm_topk_prob"),
    ("llama", "attention_bias"), ("olmo2", "attention_bias"), ("mistral", "use_sliding_window"),
    ("llama", "mlp_bias"), ("lfm2", "conv_bias"), ("lfm2", "block_auto_adjust_ff_dim"),
])
@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_config_booleans_must_be_booleans(tmp_path, folder, key, value):
    with pytest.raises(ModelFormatError, match=f"config.json '{key}' should be true or false"):
        llambda.load(_hf(tmp_path, folder, **{key: value}), backend="numpy", n_ctx=32)


@pytest.mark.parametrize("folder, key", [("mixtral", "tie_word_embeddings"), ("qwen3_moe", "norm_topk_prob")])
def test_config_booleans_as_written(tmp_path, folder, key):
    """true/false, 1/0 and null (absent) still read as they did."""
    base = _logits(_hf(tmp_path / "a", folder), "numpy")
    stored = json.loads((TINY / folder / "config.json").read_text()).get(key)
    for same in ([stored, int(stored)] if stored is not None else [None, False, 0]):
        assert np.array_equal(_logits(_hf(tmp_path / "b", folder, **{key: same}), "numpy"), base)
    flipped = not stored
    assert not np.array_equal(_logits(_hf(tmp_path / "c", folder, **{key: flipped}), "numpy"), base)

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


# ---------------------------------------------------------------- load() limits

def _write_tiny_kv_llama(path: Path) -> Path:
    """A one-layer llama whose KV cache is 16 bytes a token (one KV head of 2 dims): a cache of 2^24
    tokens is 256 MiB, so a context past the engine's limit fits the memory plan."""
    from llambda.formats.gguf_writer import write_gguf
    from llambda.formats.quants import QType
    rng = np.random.default_rng(0)
    d, vocab = 4, 32

    def w(*shape):
        return QType.F32, (rng.standard_normal(shape) * 0.1).astype(np.float32)

    ones = (QType.F32, np.ones(d, np.float32))
    meta = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": d,
            "llama.feed_forward_length": d, "llama.attention.head_count": 2, "llama.attention.head_count_kv": 1,
            "llama.context_length": 64, "llama.vocab_size": vocab}
    tensors = {"token_embd.weight": w(vocab, d), "output_norm.weight": ones, "blk.0.attn_norm.weight": ones,
               "blk.0.ffn_norm.weight": ones, "blk.0.attn_q.weight": w(4, d), "blk.0.attn_k.weight": w(2, d),
               "blk.0.attn_v.weight": w(2, d), "blk.0.attn_output.weight": w(d, 4), "blk.0.ffn_gate.weight": w(d, d),
               "blk.0.ffn_up.weight": w(d, d), "blk.0.ffn_down.weight": w(d, d)}
    write_gguf(path, meta, tensors)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_context_past_the_positions_the_engine_addresses(tmp_path, backend):
    """n_ctx = 2^24 + 1 fit the plan and loaded; the native core then refused its cache at the first forward
    step with a raw ValueError (and float32 RoPE positions are not exact past 2^24)."""
    from llambda.models.config import MAX_POSITIONS
    path = _write_tiny_kv_llama(tmp_path / "kv.gguf")
    with pytest.raises(InvalidInputError, match="n_ctx"):
        llambda.load(path, backend=backend, n_ctx=MAX_POSITIONS + 1)
    assert np.isfinite(_logits(path, backend)).all()

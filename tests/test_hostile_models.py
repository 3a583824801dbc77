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


def _logits(path: Path, backend: str, prompt=PROMPT, **kw) -> np.ndarray:
    with llambda.load(path, backend=backend, threads=1, n_ctx=64, **kw) as m:
        return m.logits(prompt)


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


# ---------------------------------------------------------------- GGUF: metadata against tensors

def _gguf(tmp_path: Path, folder: str, meta_over=None, tensors=None) -> Path:
    """A GGUF of tiny `folder` (llambda's exporter), rewritten with metadata keys set (None: removed) and
    `tensors(list of (name, qtype, raw, shape)) -> list` applied to its tensors."""
    from llambda.formats.gguf import GGUFFile
    from llambda.formats.gguf_writer import GGUFValue, write_gguf
    from llambda.tools.export import export
    exported = export(TINY / folder, tmp_path / f"{folder}-exported.gguf", fmt="gguf")
    with GGUFFile(exported) as f:
        meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
        items = [(t.name, t.qtype, np.array(t.data), t.shape) for t in f.tensors.values()]
    for k, v in (meta_over or {}).items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    path = tmp_path / f"{folder}-changed.gguf"
    write_gguf(path, meta, tensors(items) if tensors else items)
    return path


def _next_layer(items, n: int):
    """`items` and a copy of layer 0's tensors named as layer n."""
    return items + [(name.replace("blk.0.", f"blk.{n}.", 1), *rest) for name, *rest in items if name.startswith("blk.0.")]


@pytest.mark.parametrize("folder, arch", [("llama", "llama"), ("qwen3_moe", "qwen3moe"), ("qwen3_next", "qwen3next")])
def test_gguf_layers_past_block_count_are_refused(tmp_path, folder, arch):
    """A file holding more layers than its block_count loaded as the shorter model, the rest ignored."""
    from llambda.formats.gguf_writer import GGUFValue
    from llambda.formats.gguf import GGUFValueType as VT
    n = json.loads((TINY / folder / "config.json").read_text())["num_hidden_layers"]
    extra = _gguf(tmp_path, folder, tensors=lambda items: _next_layer(items, n))
    fewer = _gguf(tmp_path / "b", folder, meta_over={f"{arch}.block_count": GGUFValue(VT.UINT32, n - 1)}) \
        if folder == "llama" else None
    for path, what in ((extra, f"blk.{n}."), (fewer, f"blk.{n - 1}.")):
        if path is None:
            continue
        for backend in BACKENDS:
            with pytest.raises(ModelFormatError, match=f"not part of the model.*'{what}"):
                _logits(path, backend)


def test_gguf_shared_expert_the_metadata_leaves_out_is_refused(tmp_path):
    """qwen2moe without expert_shared_feed_forward_length: its shared expert's tensors were skipped."""
    path = _gguf(tmp_path, "qwen2_moe", meta_over={"qwen2moe.expert_shared_feed_forward_length": None})
    with pytest.raises(ModelFormatError, match="not part of the model.*shexp"):
        _logits(path, BACKENDS[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gguf_llama_with_qkv_biases_uses_them(tmp_path, backend):
    """llama.cpp's llama reads q/k/v biases where a file has them; we dropped them (no attention_bias key)."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = _hf(tmp_path, "llama", attention_bias=True)
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape) for n, t in st.tensors.items()}
    rng = np.random.default_rng(1)
    for i in range(2):
        for w in "qkv":
            rows = arrays[f"model.layers.{i}.self_attn.{w}_proj.weight"].shape[0]
            arrays[f"model.layers.{i}.self_attn.{w}_proj.bias"] = rng.standard_normal(rows).astype(np.float32)
    write_safetensors(d / "model.safetensors", arrays)
    from llambda.tools.export import export
    gguf = export(d, tmp_path / "biased.gguf", fmt="gguf")
    ref = _logits(d, backend)
    got = _logits(gguf, backend)
    assert np.abs(got - ref).max() < 1e-3 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("factor", [0.0, 1e-45])
def test_rope_factors_that_make_frequencies_infinite(tmp_path, backend, factor):
    """rope_freqs.weight divides the RoPE frequencies: a 0 or a denormal made them infinite, and the model loaded
    to give NaN logits at its first step (refused then, without naming the tensor)."""
    from llambda.formats.quants import QType

    def zeroed(items):
        return [(n, QType.F32, np.full(s, factor, np.float32).view(np.uint8), s) if n == "rope_freqs.weight"
                else (n, q, r, s) for n, q, r, s in items]

    path = _gguf(tmp_path, "llama", tensors=zeroed)
    with pytest.raises(ModelFormatError, match="rope_freqs.weight.*infinite"):
        llambda.load(path, backend=backend, n_ctx=32)


def _scaled_llama(tmp_path: Path, scales: dict) -> Path:
    """A copy of the tiny llama with some tensors multiplied (float32 kept)."""
    from safetensors.numpy import load_file

    from llambda.formats.safetensors import write_safetensors
    d = _hf(tmp_path, "llama")
    arrays = load_file(str(TINY / "llama" / "model.safetensors"))
    for name, scale in scales.items():
        arrays[name] = (arrays[name].astype(np.float64) * scale).astype(np.float32)
    write_safetensors(d / "model.safetensors", arrays)
    return d


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_residual_stream_past_1e20_gives_the_scale_free_logits(tmp_path, backend):
    """Embeddings scaled to ~1e20: each RMSNorm's float32 sum of squares overflows (x^2 past 3.4e38), and the model
    silently gave all-zero logits (x / sqrt(inf)). RMSNorm is scale-invariant, so the answer exists: the layers'
    O(1) outputs vanish against the 1e20 stream, whose last row, normed in float64 and through lm_head, are the
    logits."""
    from safetensors.numpy import load_file
    d = _scaled_llama(tmp_path, {"model.embed_tokens.weight": 1e20})
    got = _logits(d, backend)
    w = load_file(str(d / "model.safetensors"))
    h = w["model.embed_tokens.weight"][PROMPT[-1]].astype(np.float64)
    assert np.abs(h).max() > 1e19
    want = w["lm_head.weight"].astype(np.float64) @ (h / np.sqrt(np.mean(h * h) + 1e-5) * w["model.norm.weight"])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=(1e-4 if backend == "numpy" else 3e-2) * np.abs(want).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_activations_past_float32_stop_generation_with_a_typed_error(tmp_path, backend):
    """A down projection scaled to 1e38 takes the stream to inf: the norms keep it non-finite (NaN), never a
    silent 0, so the first step is refused as non-finite logits rather than garbage tokens."""
    d = _scaled_llama(tmp_path, {"model.embed_tokens.weight": 1e20, "model.layers.0.mlp.down_proj.weight": 1e38})
    with llambda.load(d, backend=backend, threads=1, n_ctx=64) as m:
        with pytest.raises(ModelFormatError, match="non-finite logits"):
            m.logits(PROMPT)
        with pytest.raises(ModelFormatError, match="non-finite logits"):
            list(m.generate(PROMPT, max_tokens=4))


@pytest.mark.parametrize("pattern", [[True, False, True], [True], ["true", "false"], [1, 2]], ids=repr)
def test_gpt_oss_layer_pattern_must_list_a_bool_per_layer(tmp_path, pattern):
    """gpt-oss.attention.sliding_window_pattern of the wrong length or type was silently replaced by the
    alternation (as gemma2's is not)."""
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    kind = VT.STRING if isinstance(pattern[0], str) else VT.BOOL if isinstance(pattern[0], bool) else VT.INT32
    path = _gguf(tmp_path, "gpt_oss", meta_over={"gpt-oss.attention.sliding_window_pattern":
                                                 GGUFValue((VT.ARRAY, kind), pattern)})
    with pytest.raises(ModelFormatError, match="sliding_window_pattern"):
        llambda.load(path, backend=BACKENDS[0], n_ctx=32)


def test_gpt_oss_layer_pattern_as_written(tmp_path):
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    key = "gpt-oss.attention.sliding_window_pattern"
    long = list(range(1, 41))          # past the window of 16
    base = _logits(_gguf(tmp_path, "gpt_oss"), "numpy", long)
    same = _gguf(tmp_path / "a", "gpt_oss", meta_over={key: None})          # absent: the alternation
    assert np.array_equal(_logits(same, "numpy", long), base)
    other = _gguf(tmp_path / "b", "gpt_oss", meta_over={key: GGUFValue((VT.ARRAY, VT.BOOL), [False, True])})
    assert not np.array_equal(_logits(other, "numpy", long), base)


def test_a_path_under_the_home_of_no_user():
    """~nosuchuser/m.gguf: expanduser raised a raw RuntimeError (could not determine home directory)."""
    with pytest.raises(llambda.errors.ModelNotFoundError, match="nosuchuser"):
        llambda.load("~llambda-nosuchuser/m.gguf", backend="numpy")


# ---------------------------------------------------------------- HF directories: the shard index

def test_a_shard_name_longer_than_the_file_system_takes(tmp_path):
    """A weight_map naming a shard of 5000 characters: is_file() raised a raw OSError (ENAMETOOLONG)."""
    d = _hf(tmp_path, "llama")
    (d / "model.safetensors").rename(d / "shard-1.safetensors")
    from llambda.formats.safetensors import SafetensorsFile
    with SafetensorsFile(d / "shard-1.safetensors") as st:
        names = list(st.tensors)
    long = "a" * 5000 + ".safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: long for n in names}}))
    with pytest.raises(ModelFormatError, match="is missing"):
        llambda.load(d, backend="numpy", n_ctx=32)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: "shard-1.safetensors" for n in names}}))
    assert np.isfinite(_logits(d, "numpy")).all()


@pytest.mark.parametrize("folder", ["qwen2_moe", "qwen3_next"])
def test_hf_shared_expert_the_config_leaves_out_is_refused(tmp_path, folder):
    """config.json without shared_expert_intermediate_size: the checkpoint's shared expert was skipped."""
    d = _hf(tmp_path, folder)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["shared_expert_intermediate_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="not part of the model its config.json describes.*shared_expert"):
        _logits(d, BACKENDS[0])


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("value", [4294967295, "default", [1, 2], False], ids=repr)
def test_rope_settings_that_are_not_objects(tmp_path, key, value):
    """A rope_parameters (or rope_scaling) that is no object was skipped: mixtral's theta of 1e6 silently
    became the default 10000."""
    with pytest.raises(ModelFormatError, match=f"config.json '{key}' should be an object"):
        _logits(_hf(tmp_path, "mixtral", **{key: value}), "numpy")


def test_rope_settings_null_means_absent(tmp_path):
    base = _logits(_hf(tmp_path / "a", "llama"), "numpy")
    assert np.array_equal(_logits(_hf(tmp_path / "b", "llama", rope_scaling=None), "numpy"), base)


# ---------------------------------------------------------------- config.json layer_types

@pytest.mark.parametrize("folder", ["gemma2", "gemma3", "gpt_oss", "qwen3"])
@pytest.mark.parametrize("change", ["chunked", "short", "not a list", "nested"])
def test_layer_types_of_an_attention_model(tmp_path, folder, change):
    """An unknown type counted as full attention, and a list of another length or type was passed over for the
    family's pattern, both silently (transformers refuses them)."""
    n = json.loads((TINY / folder / "config.json").read_text())["num_hidden_layers"]
    types = {"chunked": ["chunked_attention"] * n, "short": ["full_attention"] * (n - 1),
             "not a list": "sliding_attention", "nested": [["full_attention"]] * n}[change]
    with pytest.raises(ModelFormatError, match="layer_types"):
        _logits(_hf(tmp_path, folder, layer_types=types), "numpy")


@pytest.mark.parametrize("folder", ["lfm2", "qwen3_next"])
def test_hybrid_layer_types_holding_lists(tmp_path, folder):
    """A list among a hybrid's layer_types was an unhashable TypeError."""
    n = json.loads((TINY / folder / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(ModelFormatError, match="layer_types"):
        _logits(_hf(tmp_path, folder, layer_types=[["full_attention"]] * n), "numpy")


def test_layer_types_as_written_and_absent(tmp_path):
    """gemma2's own list, null (its alternation) and the same flags spelled out all run alike."""
    long = list(range(1, 41))          # past the window of 16
    base = _logits(_hf(tmp_path / "a", "gemma2"), "numpy", long)
    assert np.array_equal(_logits(_hf(tmp_path / "b", "gemma2", layer_types=None), "numpy", long), base)
    full = _logits(_hf(tmp_path / "c", "gemma2", layer_types=["full_attention"] * 4), "numpy", long)
    assert not np.array_equal(full, base)


# ---------------------------------------------------------------- RoPE scaling

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("extra, field", [
    ({"attention_factor": "abc"}, "attention_factor"),      # a raw ValueError from float()
    ({"attention_factor": [1]}, "attention_factor"),        # a raw TypeError
    ({"attention_factor": 0.0}, "attention_factor"),        # uniform attention, loaded
    ({"attention_factor": -1.0}, "attention_factor"),       # squared: the same as 1, loaded
    ({"attention_factor": 1e30}, "attention scale"),        # NaN logits / the native op's raw ValueError
    ({"attention_factor": 1e-30}, "attention scale"),       # 0 in float32: uniform attention, loaded
    ({"truncate": "no"}, "truncate"),                       # a string counted as true
], ids=repr)
def test_yarn_optional_fields_are_checked(tmp_path, backend, extra, field):
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64, **extra}
    with pytest.raises(ModelFormatError, match=field):
        _logits(_hf(tmp_path, "llama", rope_parameters=rope), backend)


def test_yarn_attention_factor_in_range_applies(tmp_path):
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    base = _logits(_hf(tmp_path / "a", "llama", rope_parameters=rope), "numpy")
    other = _logits(_hf(tmp_path / "b", "llama", rope_parameters=dict(rope, attention_factor=1.5)), "numpy")
    assert np.isfinite(other).all() and not np.array_equal(other, base)


@pytest.mark.parametrize("key, value, field", [
    ("llama.attention.value_length", 32, "value_length"),       # ran as 16-dim value heads
    ("llama.attention.value_length", 8, "value_length"),
    ("llama.rope.dimension_count", 0, "dimension_count"),       # ran with every dim rotated
])
def test_gguf_head_sizes_the_engine_would_not_honour(tmp_path, key, value, field):
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    path = _gguf(tmp_path, "llama", meta_over={key: GGUFValue(VT.UINT32, value)})
    with pytest.raises(ModelFormatError, match=field):
        llambda.load(path, backend="numpy", n_ctx=32)
    assert np.isfinite(_logits(_gguf(tmp_path / "same", "llama", meta_over={key: GGUFValue(VT.UINT32, 16)}),
                               "numpy")).all()


# ---------------------------------------------------------------- GGUF: tensor types a weight cannot have

def _retyped(changes: dict):
    """A `tensors` rewrite for _gguf: each named F32 tensor stored as its qtype (integer types: the values x 100,
    rounded, as a converter writing ints would)."""
    from llambda.formats.quants import QType, quantize

    def rewrite(items):
        out = []
        for n, q, r, s in items:
            if n in changes:
                qt = QType[changes[n]]
                a = r.view(np.float32).reshape(-1, s[-1])
                r, q = quantize(np.round(a * 100) if qt.name.startswith("I") and qt.name[1:].isdigit() else a,
                                qt).reshape(-1), qt
            out.append((n, q, r, s))
        return out
    return rewrite


@pytest.mark.parametrize("folder, name, qtype", [
    ("llama", "token_embd.weight", "I8"), ("llama", "blk.0.attn_q.weight", "I16"),
    ("llama", "blk.1.ffn_norm.weight", "I32"), ("llama", "output_norm.weight", "I64"),
    ("qwen2", "blk.0.attn_k.bias", "I8"), ("qwen2_moe", "blk.0.ffn_gate_inp.weight", "I16"),
    ("qwen3_moe", "blk.1.ffn_up_exps.weight", "I8"), ("gpt_oss", "blk.0.ffn_down_exps.bias", "I32"),
    ("llama", "blk.0.ffn_up.weight", "Q8_1"), ("llama", "output_norm.weight", "Q8_1"),
])
def test_gguf_weights_of_a_type_no_weight_has_are_refused(tmp_path, folder, name, qtype):
    """ggml's I8..I64, Q8_1 and Q8_K are no weight's type (llama.cpp can neither multiply nor dequantize one): a
    matrix of one was converted to Q8_0 with a warning, a norm, bias or router used as its values (an integer
    one's as integers), the file never questioned."""
    path = _gguf(tmp_path, folder, tensors=_retyped({name: qtype}))
    for backend in BACKENDS:
        with pytest.raises(ModelFormatError, match=rf"'{name}' is {qtype}, .*: no weight, norm or bias is stored"):
            _logits(path, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_k_matrices_and_vectors_are_refused(backend):
    """Q8_K (the K-quants' activation blocks; rows of 256, which no tiny model has) as a matrix or a vector."""
    from llambda.backends import create_backend
    from llambda.formats.quants import QType, quantize
    from llambda.formats.weights import WeightTensor
    raw = quantize(np.ones((2, 256), np.float32), QType.Q8_K).reshape(-1)
    B = create_backend(backend, threads=1)
    try:
        for prepare, shape in ((B.prepare_matrix, (2, 256)), (B.prepare_vector, (1, 512))):
            with pytest.raises(ModelFormatError, match="'w' is Q8_K, .*: no weight, norm or bias is stored"):
                prepare(WeightTensor("w", QType.Q8_K, shape, raw))
    finally:
        B.close()


def test_gguf_f64_tensors_load_as_float32_and_other_types_vectors_as_their_values(tmp_path):
    """F64 (which ggml defines and no converter writes) is rounded to float32 on both backends: the native one
    quantized an F64 matrix to Q8_0 and warned. A norm or bias of a quantized type loads as its decoded values.
    Each file's logits equal those of the F32 file holding the values the loader reads."""
    from llambda.formats.gguf import GGUFFile
    from llambda.formats.quants import QType, dequantize
    from llambda.formats.gguf_writer import write_gguf
    cases = [("llama", {"blk.0.attn_q.weight": "F64", "token_embd.weight": "F64", "blk.0.attn_norm.weight": "F64"}),
             ("llama", {"output_norm.weight": "Q8_0", "blk.1.attn_norm.weight": "IQ4_NL"}),
             ("qwen2", {"blk.0.attn_q.bias": "Q4_0", "blk.1.attn_v.bias": "MXFP4"})]
    for i, (folder, changes) in enumerate(cases):
        path = _gguf(tmp_path / str(i), folder, tensors=_retyped(changes))
        with GGUFFile(path) as f:      # the same file with every changed tensor back in F32, as read
            items = [(t.name, t.qtype, np.array(t.data)) if t.name not in changes else
                     (t.name, QType.F32, dequantize(t.data, t.qtype, t.shape).astype(np.float32))
                     for t in f.tensors.values()]
            assert {f.tensors[n].qtype.name for n in changes} == set(changes.values())
            meta = _meta(f)
        plain = tmp_path / f"{i}-plain.gguf"
        write_gguf(plain, meta, [(n, q, r, tuple(reversed(f.tensors[n].ne))) for n, q, r in items])
        for backend in BACKENDS:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("error")      # no conversion warning
                got = _logits(path, backend)
            assert np.array_equal(got, _logits(plain, backend)), (folder, changes, backend)


def _meta(f) -> dict:
    from llambda.formats.gguf_writer import GGUFValue
    return {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}


@pytest.mark.parametrize("bad", [1e300, float("inf")])
def test_gguf_f64_values_float32_cannot_hold_are_refused(tmp_path, bad):
    def huge(items):
        items = _retyped({"blk.0.attn_q.weight": "F64"})(items)
        out = []
        for n, q, r, s in items:
            if n == "blk.0.attn_q.weight":
                r = r.copy()
                r.view("<f8")[7] = bad
            out.append((n, q, r, s))
        return out
    path = _gguf(tmp_path, "llama", tensors=huge)
    for backend in BACKENDS:
        with pytest.raises(ModelFormatError, match=r"'blk.0.attn_q.weight' \(F64\) holds .* at index 7"):
            _logits(path, backend)


@pytest.mark.parametrize("extra, canonical", [
    ("model.language_model.norm.weight", "output_norm.weight"),          # the multimodal prefix and the plain name
    ("language_model.lm_head.weight", "output.weight"),
    ("model.language_model.embed_tokens.weight", "token_embd.weight"),
])
def test_hf_two_tensors_under_one_global_name_are_refused(tmp_path, extra, canonical):
    """A checkpoint holding a top-level tensor under two spellings loaded whichever came last in the header (a layer
    tensor's second copy was already refused)."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = _hf(tmp_path, "llama")
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    plain = extra.replace("model.language_model.", "model.").replace("language_model.lm_head.", "lm_head.")
    arrays[extra] = arrays.get(plain, arrays["model.embed_tokens.weight"]) * 2
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=f"a second tensor maps to '{canonical}'"):
        llambda.load(d, backend="numpy", n_ctx=32)


def _reshaped(name: str, shape: tuple):
    return lambda items: [(n, q, r, shape if n == name else s) for n, q, r, s in items]


@pytest.mark.parametrize("folder, name, shape", [
    ("llama", "blk.0.attn_norm.weight", (8, 8)), ("llama", "output_norm.weight", (64, 1)),
    ("llama", "blk.1.ffn_norm.weight", (2, 1, 32)), ("llama", "rope_freqs.weight", (2, 4)),
    ("qwen2_moe", "blk.0.ffn_gate_inp_shexp.weight", (8, 8)),
])
def test_gguf_vectors_of_another_shape_are_refused(tmp_path, folder, name, shape):
    """A norm (or the RoPE factors, a shared expert's gate) was read as its element count, whatever its shape: an
    (8, 8) norm loaded as a (64,) one. llama.cpp takes (n,) and (1, n) only; so do we."""
    path = _gguf(tmp_path, folder, tensors=_reshaped(name, shape))
    for backend in BACKENDS:
        with pytest.raises(ModelFormatError, match=rf"'{name}' has shape \({shape[0]}, .*expected \((1, )?\d+,?\)"):
            _logits(path, backend)
    same = _gguf(tmp_path / "same", folder, tensors=_reshaped(name, (1, int(np.prod(shape)))))
    assert np.array_equal(_logits(same, "numpy"), _logits(_gguf(tmp_path / "plain", folder), "numpy"))


@pytest.mark.parametrize("key, values", [("llama.attention.head_count_kv", [2]),
                                         ("llama.feed_forward_length", [128, 128, 128]),
                                         ("llama.attention.head_count", [4])])
def test_gguf_per_layer_arrays_of_another_length_are_refused(tmp_path, key, values):
    """A per-layer array needs one value per layer (llama.cpp: "wrong array length"); one of 1 or 3 values for 2
    layers loaded as its first value."""
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    path = _gguf(tmp_path, "llama", meta_over={key: GGUFValue((VT.ARRAY, VT.UINT32), values)})
    with pytest.raises(ModelFormatError, match=f"'{key}': {len(values)} per-layer values for the 2 layers"):
        llambda.load(path, backend="numpy", n_ctx=32)
    fine = _gguf(tmp_path / "b", "llama", meta_over={key: GGUFValue((VT.ARRAY, VT.UINT32), values[:1] * 2)})
    assert np.isfinite(_logits(fine, "numpy")).all()


@pytest.mark.parametrize("folder, key, values", [
    ("llama", "llama.block_count", [2, 2]), ("llama", "llama.embedding_length", [64, 64]),
    ("llama", "llama.vocab_size", [512, 512]), ("qwen3_moe", "qwen3moe.expert_count", [8, 8, 8]),
    ("gemma2", "gemma2.attention.sliding_window", [4, 4, 4, 4]),
])
def test_gguf_arrays_where_one_value_belongs_are_refused(tmp_path, folder, key, values):
    """Any integer key was taken from an array of equal values (a block_count of [2, 2] loaded a 2-layer model);
    llama.cpp reads only the MLP width and the head counts per layer, and refuses an array elsewhere."""
    from llambda.formats.gguf import GGUFValueType as VT
    from llambda.formats.gguf_writer import GGUFValue
    path = _gguf(tmp_path, folder, meta_over={key: GGUFValue((VT.ARRAY, VT.UINT32), values)})
    with pytest.raises(ModelFormatError, match=f"'{key}' should be an integer, got an array of {len(values)} values"):
        llambda.load(path, backend="numpy", n_ctx=32)


@pytest.mark.parametrize("expert, shape", [(0, (2048,)), (3, (1, 32, 64))])
def test_hf_expert_tensors_that_are_not_matrices(tmp_path, expert, shape):
    """An expert's weight of another rank was refused as "unlike expert 0's" shape, expert 0's own included."""
    from llambda.formats.safetensors import SafetensorsFile, write_safetensors
    d = _hf(tmp_path, "qwen2_moe")
    with SafetensorsFile(d / "model.safetensors") as st:
        arrays = {n: t.to_float32().reshape(t.shape).copy() for n, t in st.tensors.items()}
    name = f"model.layers.0.mlp.experts.{expert}.up_proj.weight"
    arrays[name] = arrays[name].reshape(shape)
    write_safetensors(d / "model.safetensors", arrays)
    with pytest.raises(ModelFormatError, match=rf"'{name}' has shape \(.*\): an expert's weight is a matrix"):
        llambda.load(d, backend="numpy", n_ctx=32)

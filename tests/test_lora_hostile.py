"""Hostile LoRA adapters (formats/lora.py, lora_merge.py, pattern_keys.py): what each lying or absurd adapter
file or argument gets is an AdapterError / InvalidInputError naming the problem, in bounded time and memory,
never a raw Python exception, a hang or a silently broken model. Adapters are written with test_lora's
builders."""
import contextlib
import os
import random
import re
import signal
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.errors import AdapterError, InvalidInputError, ModelFormatError
from llambda.formats.gguf_writer import write_gguf
from llambda.formats.quants import QType
from llambda.formats.safetensors import write_safetensors
from test_lora import TINY, random_adapter, write_peft

MD = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora"}
V_PROJ = "model.layers.0.self_attn.v_proj"


@contextlib.contextmanager
def deadline(seconds: int):
    """A TimeoutError if the block runs past `seconds` (SIGALRM: Python's regex engine checks for signals,
    so a catastrophic match is interrupted rather than hanging the test run)."""
    def expired(*_):
        raise TimeoutError(f"took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def v_pair():
    return random_adapter("llama", modules=("v_proj",), layers=[0])


def load(lora, folder="llama", path=None, **kw):
    return llambda.load(path or TINY / folder, backend="numpy", n_ctx=64, lora=lora, **kw)


def refuse(lora, match, error=AdapterError, **kw):
    with deadline(20), pytest.raises(error, match=match):
        load(lora, **kw).close()


# ---------------------------------------------------------------- numbers and types

def test_alpha_and_scale_past_float_range_are_refused(tmp_path):
    """JSON holds integers of hundreds of digits: float() of one was a raw OverflowError."""
    big = 10 ** 400
    refuse(str(write_peft(tmp_path / "a", v_pair(), big)), r"lora alpha must be a finite number >= 0, got 1000")
    refuse(str(write_peft(tmp_path / "p", v_pair(), 8, alpha_pattern={"v_proj": big})), r"lora alpha must be a finite")
    refuse([(str(tmp_path / "a"), big)], r"must be a finite number of magnitude at most 1024", InvalidInputError)


def test_numpy_scale_is_a_number(tmp_path):
    peft = write_peft(tmp_path / "p", v_pair(), 8)
    with load([(str(peft), np.float32(0.5))]) as m:
        assert m.adapters[0]["scale"] == 0.5


@pytest.mark.parametrize("kind", [["LORA"], {"a": 1}])
def test_peft_type_not_a_string(tmp_path, kind):
    """A list or object as peft_type was an unhashable TypeError."""
    refuse(str(write_peft(tmp_path / "p", v_pair(), 8, peft_type=kind)), r"PEFT type .* is not supported")


def test_gguf_pair_of_rank_zero_is_refused(tmp_path):
    """Without adapter.lora.alpha the rank was never looked at: a (0, in) x (out, 0) pair loaded."""
    write_gguf(tmp_path / "a.gguf", MD, [("blk.0.attn_v.weight.lora_a", QType.F32, np.zeros((0, 64), np.float32)),
                                         ("blk.0.attn_v.weight.lora_b", QType.F32, np.zeros((32, 0), np.float32))])
    refuse(str(tmp_path / "a.gguf"), r"rank 0 \(a LoRA pair needs rank >= 1\)")


def test_u8_factor_is_refused_up_front(tmp_path):
    """safetensors U8 (bytes, read for MXFP4 experts) passed as a factor of the right shape and failed only
    while merging."""
    a, b = v_pair()[V_PROJ]
    peft = write_peft(tmp_path / "p", v_pair(), 8)
    write_safetensors(peft / "adapter_model.safetensors", {
        f"base_model.model.{V_PROJ}.lora_A.weight": np.zeros(a.shape, np.uint8),
        f"base_model.model.{V_PROJ}.lora_B.weight": b})
    refuse(str(peft), r"lora_A.weight' is U8 bytes, not a float LoRA factor")


# ---------------------------------------------------------------- paths and names

def test_adapter_path_too_long_for_the_file_system(tmp_path):
    """ENAMETOOLONG from is_dir() was a raw OSError."""
    refuse(str(tmp_path / ("x" * 5000)), r"cannot be read \(File name too long\)")


def test_non_regular_files_in_a_peft_directory_are_named(tmp_path):
    """A FIFO as adapter_config.json or the safetensors file was reported as missing."""
    cfg = write_peft(tmp_path / "c", v_pair(), 8)
    (cfg / "adapter_config.json").unlink()
    os.mkfifo(cfg / "adapter_config.json")
    refuse(str(cfg), r"adapter_config.json is a FIFO, not a regular file")
    st = write_peft(tmp_path / "s", v_pair(), 8)
    (st / "adapter_model.safetensors").unlink()
    os.symlink("/dev/zero", st / "adapter_model.safetensors")
    refuse(str(st), r"adapter_model.safetensors: the safetensors file is a device")


def test_layer_number_of_thousands_of_digits(tmp_path):
    """int() of a layer number past Python's 4300 digits was a raw ValueError, in an adapter's module names
    and in a base model's tensor names alike."""
    a, b = v_pair()[V_PROJ]
    peft = write_peft(tmp_path / "p", {f"model.layers.{'1' * 5000}.self_attn.v_proj": (a, b)}, 8)
    refuse(str(peft), r"is no weight of the base model")
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text((TINY / "llama" / "config.json").read_text())
    from test_lora import base_tensors
    write_safetensors(base / "model.safetensors",
                      {**base_tensors("llama"), f"model.layers.{'1' * 5000}.mlp.up_proj.weight": b})
    with pytest.raises(ModelFormatError, match=r"a layer number of 5000 digits"):
        llambda.load(base, backend="numpy", n_ctx=64)


def test_expert_weights_are_named_as_such(tmp_path):
    pairs = {"model.layers.0.mlp.experts.0.up_proj": (np.zeros((2, 64), np.float32), np.zeros((32, 2), np.float32))}
    refuse(str(write_peft(tmp_path / "p", pairs, 2)), r"is a mixture-of-experts expert's weight: a LoRA of experts is not supported",
           folder="qwen2_moe")


# ---------------------------------------------------------------- merged values

@pytest.mark.parametrize("qtype", ["f16", "q8_0", "f32", "bf16"])
@pytest.mark.parametrize("factor", [3e3, 1e18])
def test_merge_past_the_weight_type_range_is_refused(tmp_path, qtype, factor):
    """A merged weight finite in float32 but past F16's range (or a block's F16 scale) was stored as inf:
    the model loaded and every forward failed. In an F32 or BF16 weight it loaded too, and the forwards
    saturated every norm (all-zero logits once the sums of squares overflowed)."""
    from llambda.tools.export import export
    base = export(TINY / "llama", tmp_path / "base.gguf", fmt="gguf", qtype=qtype)
    big = {k: (a * factor, b * factor) for k, (a, b) in v_pair().items()}
    adapter = write_peft(tmp_path / "p", big, 4)
    refuse(str(adapter), rf"LoRA adapter {re.escape(str(adapter))} \('{V_PROJ}'\): "
           r"merging it into 'blk.0.attn_v.weight' gave weights up to .* in magnitude, past 6.55e\+04", path=base)


def test_merge_memory_is_a_block_of_rows_not_the_matrix(monkeypatch):
    """A weight is merged a block of rows at a time: the float32 copies of a whole matrix (an output head's:
    GBs) are never made."""
    from types import SimpleNamespace
    from llambda.formats import lora_merge
    from llambda.formats.lora import LoraAdapter, LoraPair
    from llambda.formats.quants import quantize
    from llambda.formats.weights import WeightTensor
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2048, 1024), dtype=np.float32)       # 8 MB as float32
    base = WeightTensor("output.weight", QType.Q8_0, w.shape, quantize(w, QType.Q8_0).reshape(-1))
    pair = LoraPair(WeightTensor.from_float("a", rng.standard_normal((4, 1024), dtype=np.float32)),
                    WeightTensor.from_float("b", rng.standard_normal((2048, 4), dtype=np.float32)), 1.0, "head")
    ad = LoraAdapter(Path("x"), "peft", 0.01, {base.name: pair})
    monkeypatch.setattr(lora_merge, "MERGE_CHUNK_BYTES", 256 << 10)
    merge = lora_merge.LoraMerge(lambda n: base, [ad], SimpleNamespace(rope_neox=True))
    tracemalloc.start()
    try:
        got = merge.lookup(base.name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < w.nbytes / 2, peak      # the Q8_0 result (2.2 MB) and a few 256 KB blocks
    from llambda.formats.quants import dequantize
    exact = dequantize(base.data, QType.Q8_0, w.shape) + 0.01 * pair.b.to_float32().reshape(2048, 4) @ \
        pair.a.to_float32().reshape(4, 1024)
    assert np.array_equal(got.data, quantize(exact, QType.Q8_0).reshape(-1))


def test_a_load_that_fits_only_without_the_merge_is_refused(tmp_path, monkeypatch):
    """The merge's buffers (a merged copy of its largest weight, the factors, blocks of rows) count in the
    memory check: a load that fits without the adapter but not while merging it is refused, naming the merge."""
    from llambda.errors import InsufficientMemoryError
    from llambda.models import memory
    lora = str(write_peft(tmp_path / "p", random_adapter("llama"), 8))
    with llambda.load(TINY / "llama", backend="numpy", n_ctx=64, lora=lora) as m:
        p = m.memory_plan
    assert p.merge_peak > 4 * 4 * 64 * 64, p.merge_peak    # at least a float32 block of a 64-wide weight's rows
    monkeypatch.setattr(memory, "mem_available", lambda: p.total + p.merge_peak - 1)
    llambda.load(TINY / "llama", backend="numpy", n_ctx=64).close()       # fits without the adapter
    with pytest.raises(InsufficientMemoryError, match=r"while merging its LoRA adapters \(lora=\)"):
        llambda.load(TINY / "llama", backend="numpy", n_ctx=64, lora=lora)


# ---------------------------------------------------------------- rank_pattern / alpha_pattern keys

@pytest.mark.parametrize("key", ["(.*)*(.*)*(.*)*Z", ".*" * 14 + "Z", r"(\w+)+Z", r"(\d+)+Z"])
def test_pattern_keys_take_no_catastrophic_time(tmp_path, key):
    """PEFT's keys are regular expressions; Python's backtracking re spent exponential time on these against a
    module name (minutes, then hours, for a longer layer number)."""
    a, b = v_pair()[V_PROJ]
    name = "model.layers." + "0" * 60 + ".self_attn.v_proj"         # layer 0, its number written long
    peft = write_peft(tmp_path / "p", {name: (a, b)}, 8, rank_pattern={key: 8}, alpha_pattern={key: 1})
    t0 = time.perf_counter()
    with deadline(20), load(str(peft)) as m:
        assert m.adapters[0]["rank"] == 4
    assert time.perf_counter() - t0 < 10


def test_pattern_keys_of_unbounded_total_cost_are_refused(tmp_path):
    many = write_peft(tmp_path / "m", v_pair(), 8, rank_pattern={f"k{i}(x|y)*z": 2 for i in range(20000)})
    refuse(str(many), r"rank_pattern has 20000 keys, more than 10000")
    refuse(str(write_peft(tmp_path / "r", v_pair(), 8, alpha_pattern={"(?:x{100}){100}": 2})),
           r"alpha_pattern key .* compiles to more than 1000 states")


@pytest.mark.parametrize("key,why", [(r"(v)\1", "back-references"), ("(?=v)v_proj", "look-arounds"),
                                     (r"\bv_proj", "word boundaries"), ("(?i)V_PROJ", "case-insensitive")])
def test_pattern_keys_a_state_set_cannot_run_are_refused(tmp_path, key, why):
    refuse(str(write_peft(tmp_path / "p", v_pair(), 8, rank_pattern={key: 4})), re.escape(why))


def test_pattern_keys_match_as_pythons_re():
    """The matcher against `re.match(rf"(.*\\.)?({key})$", name)` (PEFT's rule) on random keys built from
    the pieces real keys use."""
    from llambda.formats.pattern_keys import KeyMatcher, PatternError
    names = ["model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "lm_head", "a.b", "aXb", "x.aXb",
             "layers-1", "model.layers.10.mlp.gate_proj", "."]
    atoms = ["a.b", "b", "a", "-", "q_proj", "layers", r"\.", ".", r"\d", r"\w", r"\s", "[0-9]", "[^.]", "mlp", "0",
             "1", "_", "(", ")", "|", "*", "+", "?", "{1,3}", "{2}", "*?", "^", "$", "[a-z_]", "(?:", "proj", ".*"]
    rng, checked = random.Random(0), 0
    for _ in range(6000):
        key = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 7)))
        try:
            want = re.compile(rf"(.*\.)?({key})$")
            matcher = KeyMatcher(key)
        except (re.error, PatternError):
            continue
        for name in names:
            assert matcher.matches(name) == bool(want.match(name)), (key, name)
            checked += 1
    assert checked > 10000


def test_integer_factor_types_are_refused(tmp_path):
    """A GGUF factor of an integer type (I8..I64, dequantizable as numbers) was merged as if it were one."""
    _, b = v_pair()[V_PROJ]
    write_gguf(tmp_path / "a.gguf", MD, [("blk.0.attn_v.weight.lora_a", QType.I32, np.zeros(2 * 64 * 4, np.uint8), (2, 64)),
                                         ("blk.0.attn_v.weight.lora_b", QType.F32, b[:, :2].copy())])
    refuse(str(tmp_path / "a.gguf"), r"lora_a' has integer type I32: a LoRA factor is float or quantized")


@pytest.mark.parametrize("tail", ["", "x", "0,5"])
def test_cli_scale_that_is_not_a_number(tmp_path, tail):
    """`--lora a.gguf:` (an empty or unparsable scale after an existing path) was reported as the missing
    file `a.gguf:`."""
    from llambda.formats.lora import parse_lora_arg
    (tmp_path / "a.gguf").write_bytes(b"")
    with pytest.raises(InvalidInputError, match=rf"after the last ':' is not a scale"):
        parse_lora_arg(f"{tmp_path / 'a.gguf'}:{tail}")
    assert parse_lora_arg(f"{tmp_path / 'b.gguf'}:{tail}") == (f"{tmp_path / 'b.gguf'}:{tail}", 1.0)


def test_peft_adapter_on_deepseek_v2_query_rows(tmp_path):
    """DeepSeek-V2's q rows are interleaved in its own checkpoint (rope_neox False, as a GGUF llama's): a PEFT
    adapter of q_proj, in that same order, was refused as needing a RoPE row permutation it does not need."""
    from test_lora import diff, logits, merged_copy
    pairs = random_adapter("deepseek_v2", rank=2, modules=("q_proj",))
    peft = write_peft(tmp_path / "p", pairs, 4)
    want = logits(merged_copy("deepseek_v2", tmp_path / "ref", [(pairs, 2.0)]), "numpy")
    assert diff(want, logits(TINY / "deepseek_v2", "numpy")) > 0.1
    assert diff(logits(TINY / "deepseek_v2", "numpy", lora=str(peft)), want) <= 1e-4


def test_adapter_count_and_descriptors_are_bounded(tmp_path):
    """Each adapter holds its file mapped while the model loads: 2000 of them ran the process out of file
    descriptors, a raw OSError (EMFILE)."""
    import resource
    gg = tmp_path / "a.gguf"
    a, b = v_pair()[V_PROJ]
    write_gguf(gg, MD, [("blk.0.attn_v.weight.lora_a", QType.F32, a), ("blk.0.attn_v.weight.lora_b", QType.F32, b)])
    refuse([(str(gg), 0.001)] * 2000, r"lora= lists 2000 adapters, more than 64", InvalidInputError)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else 64
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 20, hard))     # fewer descriptors left than 64 adapters take
    try:
        refuse([(str(gg), 0.001)] * 64, r"cannot be read \(Too many open files\)")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_adapter_config_whose_read_fails(tmp_path):
    """/proc/self/mem is a regular file whose read fails (EIO): as adapter_config.json, a raw OSError."""
    peft = write_peft(tmp_path / "p", v_pair(), 8)
    (peft / "adapter_config.json").unlink()
    os.symlink("/proc/self/mem", peft / "adapter_config.json")
    refuse(str(peft), r"cannot be read \(Input/output error\)")

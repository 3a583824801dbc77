"""Mutated model files and directories through the whole `llambda.load` path, both backends,
through the first forward step.

What must hold for every case: only LlambdaError subclasses escape; each load (plus one
forward) finishes within CASE_SECONDS; traced memory stays under PEAK_BYTES; a model that
loads gives finite logits. The seeds are fixed and the case counts bounded (the whole file
runs in well under a minute on 2 cores); other seeds are run outside the repository.

Sources: the tiny HF models of fixtures/reference/tiny (with a small byte-level
tokenizer.json added), and GGUF files written from them by llambda's own exporter (with a
small SentencePiece-style vocabulary added), F32 and Q8_0.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

import llambda
from llambda.backends import available_backends
from llambda.errors import LlambdaError, ModelFormatError
from llambda.formats.gguf import GGUFFile, GGUFValueType as VT
from llambda.formats.gguf_writer import GGUFValue, write_gguf
from llambda.formats.quants import QType
from llambda.tools.export import export
from test_gguf_fuzz import Fields, put_u32, put_u64

TINY = Path(__file__).parent / "fixtures" / "reference" / "tiny"
BACKENDS = available_backends()
CASE_SECONDS = 2.0        # a correctness bound (no hang, no unbounded work); a case takes milliseconds
REFUSE_SECONDS = 1.0      # a file refused (a header or config problem) is refused within this
PEAK_BYTES = 96 << 20     # traced allocations per case; the tiny models need a few MB
PROMPT = [1, 5, 9, 2]
# Outside runs change the seed (and scale the case counts up); the defaults keep this file near 30 s.
SEED = int(os.environ.get("LLAMBDA_FUZZ_SEED", "0"))
SCALE = float(os.environ.get("LLAMBDA_FUZZ_SCALE", "1"))


def rng_for(n: int) -> np.random.Generator:
    return np.random.default_rng(SEED * 1000 + n)


def count(n: int) -> int:
    return max(1, round(n * SCALE))


# ---------------------------------------------------------------- the harness

class Outcome:
    def __init__(self):
        self.cases = self.loaded = 0
        self.errors: list[str] = []


def _load_and_step(path: Path, backend: str) -> bool:
    """True if the model loads and gives finite logits; False on a typed error."""
    try:
        with llambda.load(path, backend=backend, threads=1, n_ctx=32) as m:
            logits = m.logits(PROMPT)
            if not np.isfinite(logits).all():
                raise AssertionError("loaded, but the first forward step gave non-finite logits")
            return True
    except LlambdaError as e:
        assert str(e)
        return False


def run_case(path: Path, label: str, out: Outcome, must_fail: bool = False) -> None:
    """Every backend on `path`, each in a worker thread (a hang fails the case instead of the run)."""
    for backend in BACKENDS:
        out.cases += 1
        box: dict = {}

        def work():
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            try:
                box["ok"] = _load_and_step(path, backend)
            except BaseException as e:       # noqa: BLE001 - reported below, with the case
                box["error"] = f"{type(e).__name__}: {e}"[:300]
            box["peak"] = tracemalloc.get_traced_memory()[1] - base

        # CPU time of this process: the bound is on work done, which other processes on a
        # busy machine do not change; a hang is the join's wall-clock limit below.
        start, cpu0 = time.perf_counter(), time.process_time()
        t = threading.Thread(target=work, daemon=True)
        t.start()
        t.join(CASE_SECONDS * 5)
        elapsed = time.process_time() - cpu0
        where = f"{label} [{backend}]"
        if t.is_alive():
            out.errors.append(f"{where}: still running after {time.perf_counter() - start:.1f}s (hang)")
            continue
        if "error" in box:
            out.errors.append(f"{where}: untyped {box['error']}")
        elif elapsed > (CASE_SECONDS if box["ok"] else REFUSE_SECONDS):
            out.errors.append(f"{where}: took {elapsed:.2f}s of CPU")
        elif box["peak"] > PEAK_BYTES:
            out.errors.append(f"{where}: traced memory peak {box['peak'] >> 20} MB")
        elif must_fail and box["ok"]:
            out.errors.append(f"{where}: loaded but must fail")
        else:
            out.loaded += box["ok"]


def check(out: Outcome, min_cases: int) -> None:
    assert out.cases >= min_cases, out.cases
    assert not out.errors, f"{len(out.errors)} of {out.cases} cases failed:\n" + "\n".join(out.errors[:40])


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return None


@pytest.fixture(scope="module", autouse=True)
def _traced():
    """tracemalloc for the per-case peak; and an address-space cap a few GB above what the process maps
    now, so that a regression allocating gigabytes fails its case with a MemoryError (untyped, so
    reported) instead of the machine's OOM killer ending the whole run."""
    import resource
    tracemalloc.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = _vm_bytes()
    if vm is not None:
        cap = vm + (3 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        tracemalloc.stop()


# ---------------------------------------------------------------- valid inputs

def tiny_tokenizer_json() -> str:
    """A byte-level BPE over the 256 byte symbols plus a few merges and two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return tok.to_str()


def gguf_vocab(n: int) -> dict:
    """A SentencePiece-style vocabulary of n tokens: specials, the 256 byte tokens, word pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"▁w{i}" for i in range(n - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": GGUFValue((VT.ARRAY, VT.FLOAT32), [-float(i) for i in range(n)]),
        "tokenizer.ggml.token_type": GGUFValue((VT.ARRAY, VT.INT32), types),
        "tokenizer.ggml.bos_token_id": GGUFValue(VT.UINT32, 1),
        "tokenizer.ggml.eos_token_id": GGUFValue(VT.UINT32, 2),
    }


def hf_copy(folder: str, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(TINY / folder / name, dst / name)
    (dst / "tokenizer.json").write_text(tiny_tokenizer_json(), encoding="utf-8")
    (dst / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return dst


class GGUFSource:
    """A valid GGUF's pieces, to rewrite with one field changed."""

    def __init__(self, path: Path):
        self.path = path
        with GGUFFile(path) as f:
            self.meta = {k: GGUFValue(f.metadata_types[k], v) for k, v in f.metadata.items()}
            self.tensors = [(t.name, t.qtype, bytes(t.data), t.shape) for t in f.tensors.values()]
            self.arch = f.metadata["general.architecture"]
        self.data = path.read_bytes()

    def write(self, path: Path, meta: dict) -> Path:
        write_gguf(path, meta, [(n, q, np.frombuffer(r, np.uint8), s) for n, q, r, s in self.tensors])
        return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    hf = {name: hf_copy(name, root / f"hf-{name}") for name in ("llama", "gemma3", "qwen2", "phi3")}
    ggufs = {}
    for name, qtype in (("llama", None), ("gemma3", None), ("qwen2", "q8_0")):
        exported = export(TINY / name, root / f"exported-{name}.gguf", fmt="gguf", qtype=qtype)
        src = GGUFSource(exported)
        meta = dict(src.meta)
        vocab = meta[f"{src.arch}.vocab_size"].value if f"{src.arch}.vocab_size" in meta else 512
        meta.update(gguf_vocab(vocab))
        ggufs[name] = GGUFSource(src.write(root / f"{name}.gguf", meta))
    for path in [*hf.values(), *(g.path for g in ggufs.values())]:
        for backend in BACKENDS:          # the harness's premise: every source is valid
            assert _load_and_step(path, backend), path
    return hf, ggufs


# ---------------------------------------------------------------- hostile values

I64_MIN, U64_MAX = -(1 << 63), (1 << 64) - 1
# (value type, value) tried for each GGUF key: wrong types, zero, negative, huge, non-finite
GGUF_VALUES = [
    (VT.UINT32, 0), (VT.UINT32, 1), (VT.UINT32, 3), (VT.INT32, -1), (VT.UINT32, 0xFFFFFFFF),
    (VT.INT32, -(1 << 31)), (VT.UINT64, U64_MAX), (VT.INT64, I64_MIN), (VT.UINT64, 1 << 40),
    (VT.FLOAT32, float("nan")), (VT.FLOAT32, float("inf")), (VT.FLOAT32, -float("inf")),
    (VT.FLOAT32, 0.0), (VT.FLOAT32, -1.0), (VT.FLOAT64, 1e300), (VT.FLOAT32, 1e-45), (VT.FLOAT32, 3e38),
    (VT.FLOAT64, -1e-300), (VT.BOOL, True), (VT.STRING, ""), (VT.STRING, "mistral"), (VT.STRING, "12"),
    (VT.STRING, "linear"), (VT.STRING, "x" * 5000),
    ((VT.ARRAY, VT.INT32), []), ((VT.ARRAY, VT.INT32), [1, 2, 3]), ((VT.ARRAY, VT.UINT32), [0xFFFFFFFF] * 4),
    ((VT.ARRAY, VT.FLOAT32), [float("nan")] * 300), ((VT.ARRAY, VT.STRING), ["a", "b"]),
    ((VT.ARRAY, (VT.ARRAY, VT.INT32)), [[1], [2]]), ((VT.ARRAY, VT.BOOL), [True] * 2),
]
# Keys the readers look for that the valid files do not all hold.
EXTRA_GGUF_KEYS = [
    "attention.sliding_window", "attention.sliding_window_pattern", "attention.key_length",
    "attention.value_length", "rope.scaling.type", "rope.scaling.factor", "rope.dimension_count",
    "rope.freq_base_swa", "attention.scale", "attn_logit_softcapping", "final_logit_softcapping", "vocab_size",
    "context_length", "rope.scaling.attn_factor",
]
GENERAL_KEYS = ["general.architecture", "general.name",
                "tokenizer.chat_template", "tokenizer.ggml.add_bos_token"]


def test_gguf_metadata_values(sources, tmp_path):
    """Every metadata key (and the optional ones the readers know) set to each hostile value, or removed."""
    _, ggufs = sources
    out, rng, n = Outcome(), rng_for(12), 0
    for name, src in ggufs.items():
        keys = sorted(set(src.meta) | {f"{src.arch}.{k}" for k in EXTRA_GGUF_KEYS} | set(GENERAL_KEYS)
                      - {"general.alignment"})    # the writer refuses bad ones; test_gguf_fuzz covers it
        for key in keys:
            # A fixed-seed sample of the values for each key (more on the first file), to bound the run time.
            k = min(len(GGUF_VALUES), count(6 if name == "llama" else 3))
            for i in [None, *rng.choice(len(GGUF_VALUES), k, replace=False)]:
                meta = dict(src.meta)
                if i is None:
                    if meta.pop(key, None) is None:
                        continue
                else:
                    meta[key] = GGUFValue(*GGUF_VALUES[int(i)])
                n += 1
                path = src.write(tmp_path / f"m{n}.gguf", meta)
                shown = "removed" if i is None else repr(GGUF_VALUES[int(i)])[:60]
                run_case(path, f"{name}: {key} = {shown}", out)
                path.unlink()
    check(out, 600)
    assert out.loaded > 50       # the harness must also see files that load


def test_gguf_header_and_tensor_infos(sources, tmp_path):
    """Counts, lengths, dims, tensor types and offsets of the header overwritten; random header bytes."""
    _, ggufs = sources
    out, rng, n = Outcome(), rng_for(34), 0

    def case(data: bytes, label: str, **kw):
        nonlocal n
        n += 1
        path = tmp_path / f"h{n}.gguf"
        path.write_bytes(data)
        run_case(path, label, out, **kw)
        path.unlink()

    for name, src in ggufs.items():
        data, fields = src.data, Fields(src.data)
        def some(positions, k):
            return rng.choice(positions, min(len(positions), count(k)), replace=False).tolist()

        for at in some(fields.lengths, 6):
            for v in (0, 1, 1 << 32, (1 << 63) + 5, U64_MAX):
                case(put_u64(data, at, v), f"{name}: length at {at} = {v}")
        for at in some(fields.dims, 10):
            for v in (0, 1, 3, 1 << 31, 1 << 62):
                case(put_u64(data, at, v), f"{name}: dim at {at} = {v}")
        for at in some(fields.tensor_types, 12):
            for q in rng.choice([int(q) for q in QType], 3, replace=False).tolist():
                case(put_u32(data, at, q), f"{name}: tensor type at {at} = {QType(q).name}")
        for at in some(fields.tensor_offsets, 5):
            for v in (0, 32, 1 << 40):
                case(put_u64(data, at, v), f"{name}: tensor offset at {at} = {v}")
        for at in some(fields.n_dims, 5):
            for v in (1, 3, 4):
                case(put_u32(data, at, v), f"{name}: n_dims at {at} = {v}")
        for i in range(count(40)):
            mutated = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                mutated[int(rng.integers(0, fields.header_end))] = int(rng.integers(0, 256))
            case(bytes(mutated), f"{name}: header flip case {i}")
    check(out, 600)


# ---------------------------------------------------------------- HF directories

BIG_INT = "1" + "0" * 400
DEEP = "[" * 100_000 + "]" * 100_000
# JSON texts tried for each config value (raw text, so 1e400, big integers and NaN go in as written)
JSON_VALUES = ["null", "0", "1", "-1", "3", "4294967295", "18446744073709551617", BIG_INT, "-" + BIG_INT,
               "1e400", "-1e400", "NaN", "Infinity", "0.0", "-0.5", "1e-320", "0.5", "true", "false",
               '""', '"16"', '"abc"', "[]", "[1, 2]", "{}", '{"factor": "x"}', "[[[[1]]]]"]
EXTRA_HF_KEYS = ["head_dim", "sliding_window", "rope_theta", "rope_scaling", "rope_parameters", "layer_types",
                 "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                 "partial_rotary_factor", "use_sliding_window", "max_window_layers", "sliding_window_pattern",
                 "rope_local_base_freq", "text_config", "torch_dtype", "dtype", "tie_word_embeddings",
                 "hidden_act", "hidden_activation", "attention_bias", "mlp_bias", "model_type", "architectures"]
ROPE_SCALINGS = [
    {"rope_type": "linear"}, {"rope_type": "linear", "factor": 0}, {"rope_type": "linear", "factor": -2.0},
    {"type": "linear", "factor": "2"}, {"rope_type": "llama3", "factor": 8.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 0},
    {"rope_type": "yarn", "factor": 4.0}, {"rope_type": None}, {"rope_type": 7, "factor": 2.0},
]


def set_raw(obj_text: str, key: str, raw: str | None) -> str:
    """config.json text with `key` set to the JSON text `raw` (None: removed)."""
    cfg = json.loads(obj_text)
    cfg.pop(key, None)
    body = json.dumps(cfg)
    if raw is None:
        return body
    return body[:-1] + (", " if cfg else "") + json.dumps(key) + ": " + raw + "}"


def test_hf_config_values(sources, tmp_path):
    """Every config.json key (and the optional ones the readers know) set to each hostile JSON value."""
    hf, _ = sources
    out, rng = Outcome(), rng_for(56)
    for name, folder in hf.items():
        work = tmp_path / name
        shutil.copytree(folder, work)
        original = (folder / "config.json").read_text()
        keys = sorted(set(json.loads(original)) | set(EXTRA_HF_KEYS))
        for key in keys:
            k = min(len(JSON_VALUES), count(5 if name == "llama" else 2))
            picks = [JSON_VALUES[i] for i in rng.choice(len(JSON_VALUES), k, replace=False)]
            for raw in [None, *picks] + ([DEEP] if rng.random() < 0.1 else []):
                (work / "config.json").write_text(set_raw(original, key, raw))
                run_case(work, f"{name}: config.json {key} = {(raw or 'removed')[:40]}", out)
        for sc in ROPE_SCALINGS if name in ("llama", "qwen2") else ():
            for key in ("rope_scaling", "rope_parameters"):
                value = dict(sc, rope_theta=10000.0) if key == "rope_parameters" else sc
                (work / "config.json").write_text(set_raw(original, key, json.dumps(value)))
                run_case(work, f"{name}: config.json {key} = {value}", out)
        (work / "config.json").write_text(original)
    check(out, 600)


def _st_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    return json.loads(data[8:8 + n]), data[8 + n:]


def _st_write(path: Path, header_text: str, body: bytes) -> None:
    raw = header_text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def test_hf_safetensors_and_side_files(sources, tmp_path):
    """safetensors header entries, tokenizer.json ids and the side JSON files mutated."""
    hf, _ = sources
    out, rng = Outcome(), rng_for(78)
    folder = tmp_path / "llama"
    shutil.copytree(hf["llama"], folder)
    st = folder / "model.safetensors"
    header, body = _st_header(hf["llama"] / "model.safetensors")
    names = sorted(k for k in header if k != "__metadata__")
    entry_values = {
        "dtype": ['"F64"', '"I8"', '"Q4"', "7", "null", '"BF16"', '"F16"'],
        "shape": ["[]", "[0]", "[-1, 64]", "[4294967296, 64]", "[1e400]", '["64"]', "[[64]]", "[64, 64, 1, 1, 1, 1, 1, 1, 1]"],
        "data_offsets": ["[0, 0]", "[-8, 0]", f"[0, {BIG_INT}]", "[1, 0]", "[0, 1e400]", "[0]", "null"],
    }
    for name in rng.choice(names, 6, replace=False).tolist():
        for field, values in entry_values.items():
            for raw in values:
                h = json.loads(json.dumps(header))
                text = json.dumps(h)
                marker = json.dumps(h[name][field])
                entry = json.dumps(h[name])
                text = text.replace(entry, entry.replace(f'"{field}": {marker}', f'"{field}": {raw}'), 1)
                _st_write(st, text, body)
                run_case(folder, f"safetensors {name}.{field} = {raw}", out)
    for raw in (DEEP, '{"__metadata__": {"a": ' + DEEP + "}}", '{"__metadata__": []}', "[]", '"x"', "{"):
        _st_write(st, raw, body)
        run_case(folder, f"safetensors header = {raw[:30]}", out, must_fail=True)
    for n in (0, 1 << 40, U64_MAX):
        raw = json.dumps(header).encode()
        st.write_bytes(struct.pack("<Q", n) + raw + body)
        run_case(folder, f"safetensors header length = {n}", out, must_fail=True)
    shutil.copy(hf["llama"] / "model.safetensors", st)

    # tokenizer.json: ids, added tokens, model type, depth; and the small JSON files around it
    tok = json.loads((hf["llama"] / "tokenizer.json").read_text())
    tok_cases = []
    for bad in (10**9, -1, 1 << 31, 1 << 64, 1.5, "3", None):
        t = json.loads(json.dumps(tok))
        t["model"]["vocab"]["Ġthe"] = bad
        tok_cases.append((f"vocab id {bad}", json.dumps(t)))
        t = json.loads(json.dumps(tok))
        t["added_tokens"][0]["id"] = bad
        tok_cases.append((f"added token id {bad}", json.dumps(t)))
    for kind in ("WordPiece", None, 5):
        t = json.loads(json.dumps(tok))
        t["model"]["type"] = kind
        tok_cases.append((f"model type {kind}", json.dumps(t)))
    tok_cases += [("deep", '{"model": ' + DEEP + "}"), ("list", "[]"), ("NaN", "NaN")]
    for label, text in tok_cases:
        (folder / "tokenizer.json").write_text(text)
        run_case(folder, f"tokenizer.json {label}", out)
    shutil.copy(hf["llama"] / "tokenizer.json", folder / "tokenizer.json")
    for side in ("tokenizer_config.json", "generation_config.json", "chat_template.json",
                 "model.safetensors.index.json", "special_tokens_map.json"):
        for raw in (DEEP, "[]", '{"bos_token": 5, "eos_token": {"content": 7}, "chat_template": [1]}',
                    '{"eos_token_id": [1e400, "x", 99999999999]}', '{"weight_map": {"a": "../x"}}',
                    '{"weight_map": ' + DEEP + "}", '{"chat_template": {"x": 1}}', "\xff"):
            (folder / side).write_text(raw, encoding="utf-8", errors="surrogateescape")
            run_case(folder, f"{side} = {raw[:30]}", out)
        (folder / side).unlink()
    check(out, 250)


# ---------------------------------------------------------------- targeted regressions

def _tiny_llama_meta(**over) -> dict:
    meta = {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": 256,
            "llama.feed_forward_length": 256, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 4,
            "llama.context_length": 64, "llama.rope.freq_base": 10000.0, "llama.vocab_size": 32,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    meta.update(over)
    return {k: v for k, v in meta.items() if v is not None}


def _write_tiny_llama(path: Path, matrix_type: QType = QType.F32, **over) -> Path:
    """A one-layer random llama with 256-wide rows, so every block type fits."""
    from llambda.formats.quants import TRAITS
    rng = np.random.default_rng(0)
    d, ff, vocab = 256, 256, 32

    def matrix(rows, cols):
        if matrix_type == QType.F32:
            return (QType.F32, (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32))
        tr = TRAITS[matrix_type]
        raw = rng.integers(0, 256, (rows * cols // tr.block_size, tr.type_size), dtype=np.uint8)
        if matrix_type == QType.Q3_K:      # its f16 scale (the last 2 bytes of a block) small and finite
            raw[:, -2:] = np.array([0.002], np.float16).view(np.uint8)
        return (matrix_type, raw.reshape(-1), (rows, cols))

    def one(n):
        return (QType.F32, np.ones(n, np.float32))

    tensors = {"token_embd.weight": (QType.F32, rng.standard_normal((vocab, d)).astype(np.float32)),
               "output_norm.weight": one(d), "blk.0.attn_norm.weight": one(d), "blk.0.ffn_norm.weight": one(d)}
    for name, (r, c) in {"attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_output": (d, d),
                         "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}.items():
        tensors[f"blk.0.{name}.weight"] = matrix(r, c)
    write_gguf(path, _tiny_llama_meta(**over), [(n, *spec) for n, spec in tensors.items()])
    return path


def _refused(path: Path, backend: str) -> str:
    """The typed error loading `path` raises (fails the test if it loads or raises anything else)."""
    try:
        with llambda.load(path, backend=backend, threads=1, n_ctx=32) as m:
            m.logits(PROMPT)
    except LlambdaError as e:
        return str(e)
    raise AssertionError(f"{path} loaded")


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_quant_files_run_on_both_backends(tmp_path, backend):
    """Q3_K matrices (once a type the native core lacked): both backends run them as stored, with no
    conversion warning, and agree. (Types still converted at load are tested in test_native_matmul.)"""
    path = _write_tiny_llama(tmp_path / "q3k.gguf", QType.Q3_K)
    with llambda.load(path, backend="numpy", n_ctx=32) as m:
        ref = m.logits(PROMPT)
    if backend == "native":
        with warnings.catch_warnings():
            warnings.simplefilter("error", llambda.LlambdaWarning)
            with llambda.load(path, backend="native", activations="f32", threads=1, n_ctx=32) as m:
                got = m.logits(PROMPT)
        assert np.abs(got - ref).max() < 1e-2 * max(1.0, np.abs(ref).max())
    assert np.isfinite(ref).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_types_no_backend_runs_are_refused_by_name(tmp_path, backend):
    path = _write_tiny_llama(tmp_path / "iq.gguf", QType.IQ2_XXS)
    msg = _refused(path, backend)
    assert "IQ2_XXS" in msg and "blk.0" in msg


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("over, field", [
    ({"llama.block_count": 0xFFFFFFFF}, "block_count"),
    ({"llama.block_count": GGUFValue(VT.UINT64, U64_MAX)}, "block_count"),
    ({"llama.vocab_size": GGUFValue(VT.UINT64, 1 << 62)}, "vocab_size"),
    ({"llama.attention.head_count": GGUFValue(VT.INT32, -4)}, "head_count"),
    ({"llama.rope.freq_base": 0.0}, "freq_base"),
    ({"llama.rope.freq_base": -10000.0}, "freq_base"),
    ({"llama.rope.freq_base": 1e-30}, "freq_base"),
    ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "epsilon"),
    ({"llama.context_length": GGUFValue(VT.INT32, -1)}, "context_length"),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 0.0}, "factor"),
    ({"llama.rope.scaling.type": "yarn"}, "yarn"),
    ({"general.architecture": "mistral"}, "mistral"),
    ({"llama.block_count": GGUFValue((VT.ARRAY, (VT.ARRAY, VT.INT32)), [[1]])}, "block_count"),
])
def test_gguf_hyperparameters_are_range_checked(tmp_path, backend, over, field):
    path = _write_tiny_llama(tmp_path / "m.gguf", **over)
    msg = _refused(path, backend)
    assert field in msg and str(path) in msg, msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_sliding_window_means_no_window(tmp_path, backend):
    """sliding_window = 0xFFFFFFFF: longer than any context, so the same logits as no window."""
    plain = _write_tiny_llama(tmp_path / "plain.gguf")
    wide = _write_tiny_llama(tmp_path / "wide.gguf", **{"llama.attention.sliding_window": 0xFFFFFFFF})
    with llambda.load(plain, backend=backend, threads=1, n_ctx=32) as a, \
            llambda.load(wide, backend=backend, threads=1, n_ctx=32) as b:
        assert np.array_equal(a.logits(PROMPT), b.logits(PROMPT))


def _hf_with(tmp_path: Path, folder: str, text: str | None = None, **changes) -> Path:
    d = tmp_path / folder
    if not d.exists():
        hf_copy(folder, d)
    cfg = json.loads((TINY / folder / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(text if text is not None else json.dumps(cfg))
    return d


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("changes, field", [
    ({"rope_parameters": None, "rope_scaling": {"rope_type": "linear"}}, "factor"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}}, "factor"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 4.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, "freq_factor"),
    ({"head_dim": "16"}, "head_dim"),
    ({"head_dim": [16]}, "head_dim"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": [1]}}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta"),
    ({"rope_parameters": None, "rope_theta": -1.0}, "rope_theta"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10 ** 400}}, "rope_theta"),
    ({"rms_norm_eps": 10 ** 400}, "rms_norm_eps"),
    ({"num_hidden_layers": 0xFFFFFFFF}, "num_hidden_layers"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"dtype": ["float32"]}, None),
    ({"torch_dtype": {"x": 1}}, None),
])
def test_hf_hyperparameters_are_checked(tmp_path, backend, changes, field):
    folder = _hf_with(tmp_path, "llama", **changes)
    try:
        with llambda.load(folder, backend=backend, threads=1, n_ctx=32) as m:
            assert np.isfinite(m.logits(PROMPT)).all()
        assert field is None, "loaded"
    except LlambdaError as e:
        assert field is not None and field in str(e) and "config.json" in str(e), str(e)


def test_config_numbers_ask_the_shared_finite_check(monkeypatch):
    """A config's floats are checked by llambda.finite's one check (sampling's and LoRA's too), not a copy of it."""
    from llambda.models import config
    assert config.check_number("x", 2.5, "any") == 2.5
    monkeypatch.setattr(config, "finite_as_float", lambda v: False)
    with pytest.raises(ModelFormatError, match="x = 2.5 is not a finite number"):
        config.check_number("x", 2.5, "any")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json",
                                  "model.safetensors.index.json"])
def test_deeply_nested_json_is_a_format_error(tmp_path, backend, name):
    folder = _hf_with(tmp_path, "llama")
    text = '{"a": ' + DEEP + "}"
    (folder / name).write_text(text)
    msg = _refused(folder, backend)
    assert name in msg, msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_hf_sliding_window(tmp_path, backend):
    assert "sliding_window" in _refused(_hf_with(tmp_path, "mistral", sliding_window=-5), backend)
    for window in (0xFFFFFFFF, 1 << 40):      # longer than any context: loads, and runs as no window
        with llambda.load(_hf_with(tmp_path, "mistral", sliding_window=window), backend=backend, n_ctx=32) as m:
            assert np.isfinite(m.logits(PROMPT)).all()


def test_gemma_query_pre_attn_scalar_zero(tmp_path):
    folder = _hf_with(tmp_path, "gemma3", query_pre_attn_scalar=0)
    assert "query_pre_attn_scalar" in _refused(folder, "numpy")


def test_tokenizer_id_of_a_billion_is_bounded(tmp_path):
    """tokenizer.json naming id 1e9: a typed error or no tokenizer, never a billion-entry table."""
    folder = _hf_with(tmp_path, "llama")
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["model"]["vocab"]["Ġthe"] = 10 ** 9
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    out = Outcome()
    run_case(folder, "tokenizer id 1e9", out)
    check(out, 1)


# ---------------------------------------------------------------- non-regular files

_CHILD = textwrap.dedent("""
    import sys, llambda
    try:
        llambda.load(sys.argv[1], backend="numpy")
    except llambda.LlambdaError as e:
        print("TYPED", type(e).__name__, e)
    else:
        print("LOADED")
""")


def _load_in_child(path: Path, timeout: float = 30.0) -> str:
    """Load in a subprocess, so a regression hangs the child (killed at the timeout), not the test run;
    returns what the child printed: "TYPED <class> <message>" or "LOADED"."""
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True,
                           timeout=timeout, cwd=Path(llambda.__file__).resolve().parents[1])   # this llambda
    except subprocess.TimeoutExpired:
        raise AssertionError(f"loading {path} did not finish within {timeout}s") from None
    assert r.returncode == 0 and r.stdout.startswith(("TYPED ModelFormatError", "LOADED")), (r.stdout, r.stderr[-2000:])
    return r.stdout


def _refused_in_child(path: Path) -> str:
    got = _load_in_child(path)
    assert got.startswith("TYPED ModelFormatError"), got
    return got


def test_fifo_as_the_model_path(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert str(fifo) in _refused_in_child(fifo)


# FIFOs the loader must refuse; a FIFO side file (tokenizer, template) may instead be skipped, but never waited on
@pytest.mark.parametrize("name, refused", [
    ("model.safetensors", True), ("other.safetensors", True), ("config.json", True),
    ("model.safetensors.index.json", True), ("tokenizer.json", False), ("tokenizer_config.json", False),
    ("generation_config.json", False), ("chat_template.jinja", False)])
def test_fifo_inside_a_model_directory(tmp_path, name, refused):
    folder = hf_copy("llama", tmp_path / "m")
    if name == "other.safetensors":     # no model.safetensors: every *.safetensors is read
        (folder / "model.safetensors").rename(folder / "a.safetensors")
    if (folder / name).exists():
        (folder / name).unlink()
    os.mkfifo(folder / name)
    got = _load_in_child(folder)
    assert got.startswith("TYPED ModelFormatError") if refused else True, got
    if refused:
        assert name in got, got


def test_other_non_regular_paths(tmp_path):
    (tmp_path / "x.gguf").mkdir()
    assert "config.json" in _refused_in_child(tmp_path / "x.gguf")
    assert "/dev/zero" in _refused_in_child(Path("/dev/zero"))
    sock_path = tmp_path / "s.gguf"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        assert str(sock_path) in _refused_in_child(sock_path)
    finally:
        s.close()


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_a_regular_file_that_cannot_be_read(tmp_path):
    """/proc/self/mem is a regular file whose read fails (EIO): once a raw OSError."""
    assert "cannot read" in _refused_in_child(Path("/proc/self/mem"))


# load() arguments of a wrong type or range: each an InvalidInputError before the model is read (once TypeErrors,
# ValueErrors from deep inside, a ValueError at the first forward step, or a workspace of petabytes)
BAD_LOAD_ARGS = [dict(name_or_path=None), dict(name_or_path=5), dict(name_or_path=b"tiny"),
                 dict(n_ctx="64"), dict(n_ctx=-5), dict(n_ctx=1.5), dict(n_ctx=True), dict(n_slots=0),
                 dict(n_slots="2"), dict(threads=-1), dict(threads="2"), dict(max_batch=0), dict(max_batch=-1),
                 dict(max_batch="x")]
NATIVE_BAD_ARGS = [dict(activations="f8"), dict(kv_type="q4"), dict(kv_type=["f16"]), dict(threads=10**6)]


@pytest.mark.parametrize("kw", BAD_LOAD_ARGS + [dict(kw, backend="native") for kw in NATIVE_BAD_ARGS],
                         ids=lambda kw: ",".join(f"{k}={v!r}"[:30] for k, v in kw.items()))
def test_load_arguments_of_a_wrong_type_or_range(kw):
    if kw.get("backend") == "native" and "native" not in BACKENDS:
        pytest.skip("the native C core is not built")
    args = {"name_or_path": TINY / "llama", "backend": "numpy", **kw}
    with pytest.raises(llambda.errors.InvalidInputError):
        llambda.load(args.pop("name_or_path"), **args)


def test_a_tokenizer_larger_than_the_embedding_table(tmp_path):
    """A GGUF whose vocabulary has ids past the model's token_embd rows: text that encodes to such an id is a
    typed error (once a ValueError from the forward step), on every backend and every entry point."""
    src = GGUFSource(export(TINY / "llama", tmp_path / "e.gguf", fmt="gguf"))
    meta = dict(src.meta)
    n = meta[f"{src.arch}.vocab_size"].value
    vocab = gguf_vocab(n + 8)
    vocab["tokenizer.ggml.tokens"][-1] = "<|past|>"
    vocab["tokenizer.ggml.token_type"].value[-1] = 3       # a control token: matched whole in the text
    meta.update(vocab)
    path = src.write(tmp_path / "big-vocab.gguf", meta)
    for backend in BACKENDS:
        with llambda.load(path, backend=backend, n_ctx=32) as m:
            assert m.tokenize("<|past|>") == [n + 7]
            with pytest.raises(llambda.errors.ModelFormatError, match="tokenizer and weights differ"):
                list(m.generate("a <|past|>", max_tokens=2))
            with pytest.raises(llambda.errors.InvalidInputError, match="out of range"):
                m.transformer.forward(np.array([n + 7], np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), [0])


def test_chat_template_file_that_is_not_utf8(tmp_path):
    """chat_template.jinja with an invalid byte: a ModelFormatError naming it (was a raw UnicodeDecodeError)."""
    folder = hf_copy("llama", tmp_path / "m")
    (folder / "chat_template.jinja").write_bytes(b"{{ messages[0].content }}\xff")
    with pytest.raises(llambda.errors.ModelFormatError, match="chat_template.jinja.*UTF-8"):
        llambda.load(folder, backend="numpy", n_ctx=32)
    (folder / "chat_template.jinja").write_bytes("{{ messages[0].content }}☃".encode())
    with llambda.load(folder, backend="numpy", n_ctx=32) as m:
        assert m.chat_template().render([{"role": "user", "content": "hi"}]) == "hi☃"


@pytest.mark.parametrize("backend", BACKENDS)
def test_granite_logit_scale_whose_inverse_overflows(tmp_path, backend):
    """granite.logit_scale = 1e-45 (a float32 denormal): logits times 1/1e-45 overflow float32."""
    src = GGUFSource(export(TINY / "granite", tmp_path / "g.gguf", fmt="gguf"))
    meta = dict(src.meta, **{"granite.logit_scale": GGUFValue(VT.FLOAT32, 1e-45)})
    assert "logit_scale" in _refused(src.write(tmp_path / "tiny-scale.gguf", meta), backend)


@pytest.mark.parametrize("value", [GGUFValue((VT.ARRAY, VT.FLOAT32), [0.5] * 300), GGUFValue(VT.STRING, "false"),
                                   GGUFValue(VT.UINT32, 7)])
def test_moe_expert_weights_norm_must_be_a_bool(tmp_path, value):
    """An array was "truth value ambiguous" (a ValueError); the string "false" silently meant True."""
    src = GGUFSource(export(TINY / "mixtral", tmp_path / "x.gguf", fmt="gguf"))
    meta = dict(src.meta, **{"llama.expert_weights_norm": value})
    assert "expert_weights_norm" in _refused(src.write(tmp_path / "x2.gguf", meta), BACKENDS[0])


def test_lfm2_per_layer_kv_heads_of_nested_arrays(tmp_path):
    """lfm2.attention.head_count_kv as an array of arrays: was a TypeError (unhashable) building the head set."""
    src = GGUFSource(export(TINY / "lfm2", tmp_path / "l.gguf", fmt="gguf"))
    meta = dict(src.meta, **{"lfm2.attention.head_count_kv": GGUFValue((VT.ARRAY, (VT.ARRAY, VT.INT32)), [[1], [2]])})
    assert "head_count_kv" in _refused(src.write(tmp_path / "l2.gguf", meta), BACKENDS[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("key", ["final_logit_softcapping", "attn_logit_softcapping"])
def test_a_softcap_that_float32_rounds_to_zero(tmp_path, backend, key):
    """gemma2's softcaps at 1e-320: positive as a float64, 0 in float32, which the native softcap op refused untyped."""
    assert "softcap" in _refused(_hf_with(tmp_path, "gemma2", **{key: 1e-320}), backend)


def test_model_methods_with_arguments_of_a_wrong_type(tmp_path):
    """Each once an AttributeError, TypeError or ValueError from inside: now an InvalidInputError or TokenizerError."""
    with llambda.load(hf_copy("llama", tmp_path / "m"), backend=BACKENDS[0], n_ctx=32) as m:
        for call in (lambda: m.set_draft(str(TINY / "llama")), lambda: m.compile_grammar('root ::= "a"'),
                     lambda: m.embed(None), lambda: m.embed(["the"], slot="0"), lambda: m.embed(["the"], slot=0.5)):
            with pytest.raises(llambda.errors.InvalidInputError):
                call()
        with pytest.raises(llambda.errors.TokenizerError):
            m.detokenize(None)
        assert m.detokenize(iter(m.tokenize("the"))) == "the"


def test_gemma2_layer_pattern_must_hold_bools():
    """Per-layer sliding flags read as bool(x): the strings "false"/"true" both counted as sliding."""
    from llambda.errors import ModelFormatError
    from llambda.models.gemma2 import _gguf_layer_sliding
    from llambda.models.hparams import GGUFHParams
    key = "gemma2.attention.sliding_window_pattern"
    assert _gguf_layer_sliding(GGUFHParams({key: [True, False, 1, 0]}, "gemma2"), 4) == [True, False, True, False]
    for bad in (["false", "true"], [2, 0], [0.5, 1]):
        with pytest.raises(ModelFormatError, match="a bool per layer"):
            _gguf_layer_sliding(GGUFHParams({key: bad}, "gemma2"), 2)

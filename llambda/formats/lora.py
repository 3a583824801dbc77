"""LoRA adapters read from their files: a GGUF adapter as llama.cpp's converter writes it, or a Hugging
Face PEFT directory. Merging them into a base model's weights is lora_merge.py's job.

Facts of the two formats (all shapes in NumPy order, rows first):
- A pair adapts one weight W (out, in) by W + s B @ A with A (r, in) and B (out, r): PEFT's
  `lora_A.weight` / `lora_B.weight` as nn.Linear stores them, and GGUF's `<W's name>.lora_a` / `.lora_b`
  (llama.cpp writes PEFT's arrays as they are; ggml's ne is the reverse: a.ne = [in, r], b.ne = [r, out]).
- The factor s: PEFT lora_alpha / r (rsLoRA: lora_alpha / sqrt(r)), with `alpha_pattern` /
  `rank_pattern` overriding them per module; GGUF adapter.lora.alpha / r, where r is the pair's own rank,
  and a missing or zero alpha means s = 1 (llama.cpp's rule; its converter writes lora_alpha whether or
  not the adapter used rsLoRA).
- GGUF adapter files carry `general.type = "adapter"`, `adapter.type = "lora"` and the base model's
  `general.architecture`, and use the GGUF tensor names of that architecture; their q/k B rows are in
  that architecture's GGUF row order (permuted for llama.cpp's llama-style RoPE: rope_rows.py).
"""
from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import AdapterError, InvalidInputError, ModelFormatError
from ..finite import finite_as_float
from .files import read_json
from .pattern_keys import Budget, KeyMatcher, PatternError
from .quants import DEQUANTIZABLE, QType
from .rope_rows import PERMUTED_GGUF_ARCHS
from .weights import ByteTensor, WeightTensor

MAX_FACTOR = 1024.0         # |alpha / r| (or alpha / sqrt(r)) beyond this is no adapter anyone trained
MAX_SCALE = 1024.0          # a user's scale beyond this is a typo
MAX_ADAPTERS = 64           # adapters merged by one load
MAX_PATTERN_KEYS = 10_000   # rank_pattern / alpha_pattern keys: a key per module of the largest models, 10 times
_INTEGER_TYPES = {QType.I8, QType.I16, QType.I32, QType.I64}
# PEFT types that are not LoRA (what adapter_config.json's peft_type says), refused by name
_PEFT_TYPES = {"LORA"}


@dataclass
class LoraPair:
    """One adapted weight: A (r, in), B (out, r) as stored, and the factor alpha / r."""
    a: WeightTensor
    b: WeightTensor
    factor: float
    source_name: str            # the adapter file's name of the pair (for messages)

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class LoraAdapter:
    path: Path
    format: str                 # "gguf" | "peft"
    scale: float                # the user's scale, times every pair's own factor
    pairs: dict[str, LoraPair]  # canonical base tensor name -> pair
    arch: str | None = None     # GGUF: general.architecture (PEFT files do not say)
    interleaved: bool = False   # q/k B rows in GGUF-llama's permuted order
    permute_qk: bool = False    # its q/k B rows in another order than the base file's (set by check_adapters)
    closers: list = field(default_factory=list)

    def describe(self) -> dict:
        ranks = sorted({p.rank for p in self.pairs.values()})
        return {"path": str(self.path), "format": self.format, "scale": self.scale,
                "tensors": len(self.pairs), "rank": ranks[0] if len(ranks) == 1 else ranks}

    def close(self) -> None:
        for c in self.closers:
            c()
        self.closers.clear()


def parse_lora_arg(text: str) -> tuple[str, float]:
    """`PATH[:SCALE]` (the command line's --lora) -> (path, scale). A path that exists as given wins
    over reading its last colon as a scale."""
    if not isinstance(text, str) or not text:
        raise InvalidInputError(f"--lora takes PATH[:SCALE], got {text!r}")
    path, sep, tail = text.rpartition(":")
    if sep and path and not os.path.exists(text):
        try:
            return path, float(tail)
        except ValueError:
            if os.path.exists(path):    # `a.gguf:` or `a.gguf:x`: a scale that is not one, not a missing file
                raise InvalidInputError(f"--lora {text}: {tail!r} after the last ':' is not a scale "
                                        "(a number)") from None
    return text, 1.0


def adapter_specs(lora) -> list[tuple[str, float]]:
    """load()'s `lora=`: a path, a (path, scale) pair, or a list of either -> [(path, scale)]. A tuple of
    paths only, ("a.gguf", "b.gguf"), is several adapters as a list of them is (no scale in it)."""
    if lora is None:
        return []
    several = isinstance(lora, tuple) and lora and all(isinstance(x, (str, os.PathLike)) for x in lora)
    items = [lora] if isinstance(lora, (str, os.PathLike)) or (isinstance(lora, tuple) and not several) else lora
    if not isinstance(items, (list, tuple)):
        raise InvalidInputError(f"lora= takes a path, a (path, scale) pair or a list of them, "
                                f"got {type(lora).__name__}")
    if len(items) > MAX_ADAPTERS:       # (each holds its file open while the model loads)
        raise InvalidInputError(f"lora= lists {len(items)} adapters, more than {MAX_ADAPTERS}")
    out = []
    for item in items:
        if isinstance(item, (str, os.PathLike)):
            path, scale = item, 1.0
        else:       # a (path, scale) pair; a list from a config file alike
            path, scale = tuple(item) if isinstance(item, (tuple, list)) and len(item) == 2 else (None, None)
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidInputError(f"lora= items are paths or (path, scale) pairs, got {item!r}")
        if not _finite_number(scale) or abs(float(scale)) > MAX_SCALE:
            raise InvalidInputError(f"the scale of LoRA adapter {os.fspath(path)} must be a finite number of magnitude "
                                    f"at most {MAX_SCALE:g}, got {_short(scale)}"
                                    # ("a.gguf", "b.gguf") inside a list: two paths, not a pair
                                    + ("; several adapters are a list: lora=[path, path, (path, scale), ...]"
                                       if isinstance(scale, (str, os.PathLike)) else ""))
        out.append((os.fspath(path), float(scale)))
    return out


def _finite_number(v) -> bool:
    """A real number (not a bool) that is finite as a float: an int past float's range (JSON allows
    10**400) is not, rather than an OverflowError."""
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, numbers.Real) and finite_as_float(v)


def _short(v, limit: int = 80) -> str:
    """repr(v) cut to `limit` characters (an int of 400 digits, a long string in a message)."""
    try:
        text = repr(v)
    except ValueError:      # an int past the interpreter's digit limit
        text = f"<{type(v).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit] + "..."


def open_adapter(path, scale: float = 1.0, n_layers: int = 0, post_norms: bool = False,
                 arch: str = "") -> LoraAdapter:
    """The adapter at `path` (a GGUF file or a PEFT directory), its pairs named as the base model's
    canonical tensors. `n_layers`, `post_norms`, `arch`: the base's, to map a PEFT directory's HF names."""
    path = Path(path)
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except (OSError, ValueError) as e:      # a name too long for the file system (ENAMETOOLONG), EACCES
        raise AdapterError(f"LoRA adapter {_short(str(path))}: cannot be read "
                           f"({getattr(e, 'strerror', None) or e})") from None
    if not exists:
        raise AdapterError(f"LoRA adapter {path}: no such file or directory")
    try:
        return _open_peft(path, scale, n_layers, post_norms, arch) if is_dir else _open_gguf(path, scale)
    except OSError as e:        # mapping a file past the process's descriptors (EMFILE), a read error (EIO)
        raise AdapterError(f"LoRA adapter {path}: cannot be read ({e.strerror or e})") from None


def _check_factor(where: str, alpha, r: int, rslora: bool = False) -> float:
    if not _finite_number(alpha) or alpha < 0:
        raise AdapterError(f"{where}: lora alpha must be a finite number >= 0, got {_short(alpha)}")
    alpha = float(alpha)
    if r < 1:
        raise AdapterError(f"{where}: rank {r} (a LoRA pair needs rank >= 1)")
    factor = alpha / math.sqrt(r) if rslora else alpha / r
    if factor > MAX_FACTOR:
        raise AdapterError(f"{where}: alpha {alpha:g} over {'sqrt(r)' if rslora else 'r'} = {factor:g} with "
                           f"rank {r}: past {MAX_FACTOR:g}, not an adapter's scaling (a wrong alpha?)")
    return factor


def _pair(where: str, got: dict[str, WeightTensor], a_key: str, b_key: str) -> tuple[WeightTensor, WeightTensor]:
    """The (A, B) of one adapted weight from its factors found in the file, checked (_check_pair)."""
    if set(got) != {a_key, b_key}:
        have = next(iter(got.values())).name
        raise AdapterError(f"{where}: {have!r} has no {b_key if a_key in got else a_key} partner")
    a, b = got[a_key], got[b_key]
    _check_pair(where, a, b)
    return a, b


def _check_pair(where: str, a: WeightTensor, b: WeightTensor) -> None:
    for t in (a, b):
        if len(t.shape) != 2:
            raise AdapterError(f"{where}: {t.name!r} is {len(t.shape)}-D {t.shape}, a LoRA factor is a matrix")
        if isinstance(t, ByteTensor):       # safetensors U8: raw bytes (its qtype says I8), no factor's type
            raise AdapterError(f"{where}: {t.name!r} is U8 bytes, not a float LoRA factor")
        if t.qtype in _INTEGER_TYPES:       # (dequantizable as numbers, but no converter writes a factor so)
            raise AdapterError(f"{where}: {t.name!r} has integer type {t.qtype.name}: a LoRA factor is float "
                               "or quantized")
        if t.qtype not in DEQUANTIZABLE:
            raise AdapterError(f"{where}: {t.name!r} has type {t.qtype.name}, which cannot be read here")
    if a.shape[0] != b.shape[1]:
        raise AdapterError(f"{where}: rank mismatch: A {a.name!r} is {a.shape} (rank {a.shape[0]}) but B "
                           f"{b.name!r} is {b.shape} (rank {b.shape[1]}); A must be (rank, in), B (out, rank)")


# ---------------------------------------------------------------- GGUF

def _open_gguf(path: Path, scale: float) -> LoraAdapter:
    from ..models import ARCHITECTURES, arch_module
    from .gguf import GGUFFile
    try:
        f = GGUFFile(path)
    except AdapterError:
        raise
    except ModelFormatError as e:
        raise AdapterError(f"LoRA adapter {path}: {e}") from None
    try:
        meta = f.metadata
        where = f"LoRA adapter {path}"
        if meta.get("general.type") != "adapter":
            raise AdapterError(f"{where}: general.type is {meta.get('general.type')!r}, not 'adapter': this is "
                               "a model, not an adapter")
        kind = meta.get("adapter.type")
        if kind != "lora":
            raise AdapterError(f"{where}: adapter.type {kind!r} is not supported (only 'lora')")
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or arch not in ARCHITECTURES:
            raise AdapterError(f"{where}: general.architecture {arch!r} is not an architecture llambda runs")
        alpha = meta.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise AdapterError(f"{where}: adapter.lora.alpha must be a number, got {alpha!r}")
        # the file's leaf names -> canonical (a family whose GGUF names differ lists them canonical -> file)
        renamed = {v: k for k, v in getattr(arch_module(arch), "GGUF_NAMES", {}).items()}
        halves: dict[str, dict[str, WeightTensor]] = {}
        for name, info in f.tensors.items():
            base, dot, part = name.rpartition(".")
            if not dot or part not in ("lora_a", "lora_b"):
                raise AdapterError(f"{where}: tensor {name!r} is not a LoRA factor (.lora_a / .lora_b); only "
                                   "LoRA pairs are applied (no replaced norms or other tensors)")
            if base.startswith("token_embd."):
                raise AdapterError(f"{where}: a LoRA of the token embedding ({name!r}) is not supported")
            t = WeightTensor(name, info.qtype, tuple(int(s) for s in info.shape), f.view(info.data))
            halves.setdefault(_canonical_gguf(base, renamed), {})[part] = t
        pairs = {}
        for canon, got in halves.items():
            a, b = _pair(where, got, "lora_a", "lora_b")
            r = int(a.shape[0])
            if r < 1:       # (with no alpha, the rank was never looked at: a rank-0 pair merged nothing)
                raise AdapterError(f"{where}, {a.name!r}: rank {r} (a LoRA pair needs rank >= 1)")
            factor = _check_factor(f"{where}, {a.name!r}", alpha, r) if alpha else 1.0
            pairs[canon] = LoraPair(a, b, factor, a.name[:-len(".lora_a")])
        if not pairs:
            raise AdapterError(f"{where}: the file holds no LoRA pairs")
        return LoraAdapter(path, "gguf", scale, pairs, arch, arch in PERMUTED_GGUF_ARCHS, [f.close])
    except BaseException:
        f.close()
        raise


def _canonical_gguf(name: str, renamed: dict[str, str]) -> str:
    if name.startswith("blk."):
        parts = name.split(".", 2)
        if len(parts) == 3:
            return f"blk.{parts[1]}.{renamed.get(parts[2], parts[2])}"
    return renamed.get(name, name)


# ---------------------------------------------------------------- PEFT

# `base_model.model.<module>.lora_A[.<adapter name>].weight`
_PEFT_NAME = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight")


_EXPERT = re.compile(r"\.experts\.\d+\.")     # a Hub MoE's per-expert modules (mlp.experts.3.up_proj)


def _pattern_value(patterns, module: str, default, where: str, key: str, compiled: dict):
    """PEFT's alpha_pattern / rank_pattern: the value of the first key matching the module name's tail
    (matched in linear time: pattern_keys.py; `compiled` caches each key's matcher)."""
    if not patterns:
        return default
    if not isinstance(patterns, dict):
        raise AdapterError(f"{where}: {key} must be an object, got {type(patterns).__name__}")
    if len(patterns) > MAX_PATTERN_KEYS:
        raise AdapterError(f"{where}: {key} has {len(patterns)} keys, more than {MAX_PATTERN_KEYS}")
    budget = compiled.setdefault("budget", Budget())
    for pattern, value in patterns.items():
        try:
            matcher = compiled.get((key, pattern))
            if matcher is None:
                matcher = compiled[(key, pattern)] = KeyMatcher(pattern)
                budget.spend(matcher.cost)
            if matcher.matches(module, budget):
                return value
        except PatternError as e:
            raise AdapterError(f"{where}: {key} key {_short(pattern)} {e}") from None
    return default


def _open_peft(path: Path, scale: float, n_layers: int, post_norms: bool, arch: str) -> LoraAdapter:
    from .hf_dir import canonical_name
    from .safetensors import SafetensorsFile
    where = f"LoRA adapter {path}"
    cfg_path = path / "adapter_config.json"
    if not cfg_path.exists():      # (a FIFO or device there is refused by name by read_json)
        raise AdapterError(f"{where}: a PEFT adapter directory needs adapter_config.json")
    cfg = read_json(cfg_path, "adapter_config.json", AdapterError)
    if not isinstance(cfg, dict):
        raise AdapterError(f"{cfg_path}: must hold a JSON object")
    kind = cfg.get("peft_type", "LORA")
    if not isinstance(kind, str) or kind not in _PEFT_TYPES:     # (a list here was unhashable: a TypeError)
        raise AdapterError(f"{where}: PEFT type {_short(kind)} is not supported (only LORA)")
    for key, what in (("use_dora", "DoRA (weight-decomposed LoRA)"), ("fan_in_fan_out", "fan_in_fan_out (Conv1D) "
                      "weights"), ("lora_bias", "LoRA biases"), ("layer_replication", "layer_replication"),
                      ("use_qalora", "QALoRA"), ("trainable_token_indices", "trainable tokens")):
        if cfg.get(key):
            raise AdapterError(f"{where}: {what} is not supported ({key} is set in adapter_config.json)")
    if cfg.get("bias", "none") not in (None, "none"):
        raise AdapterError(f"{where}: bias {cfg.get('bias')!r} is not supported (trained biases; only 'none')")
    r_cfg, alpha_cfg, rslora = cfg.get("r", 8), cfg.get("lora_alpha", 8), cfg.get("use_rslora", False)
    if isinstance(r_cfg, bool) or not isinstance(r_cfg, int) or r_cfg < 1:
        raise AdapterError(f"{where}: r must be an integer >= 1, got {_short(r_cfg)}")
    if not isinstance(rslora, bool):
        raise AdapterError(f"{where}: use_rslora must be true or false, got {rslora!r}")
    st_path = path / "adapter_model.safetensors"
    if not st_path.exists():       # (a FIFO or device there is refused by name by SafetensorsFile)
        extra = " (adapter_model.bin is a pickle, which llambda does not read: save it with safetensors)" \
            if (path / "adapter_model.bin").exists() else ""
        raise AdapterError(f"{where}: no adapter_model.safetensors{extra}")
    try:
        st = SafetensorsFile(st_path)
    except ModelFormatError as e:
        raise AdapterError(f"{where}: {e}") from None
    try:
        halves: dict[str, dict[str, WeightTensor]] = {}
        for name, t in st.tensors.items():
            m = _PEFT_NAME.fullmatch(name)
            if m is None:
                what = ("a LoRA of the token embedding (lora_embedding_A/B)" if "lora_embedding_" in name
                        else "a whole module's weights (modules_to_save)" if "modules_to_save" in name
                        else "not a LoRA factor (lora_A / lora_B)")
                raise AdapterError(f"{where}: tensor {name!r} is {what}: not supported")
            halves.setdefault(m.group("module"), {})[f"lora_{m.group('part')}"] = t
        pairs, compiled = {}, {}
        for module, got in halves.items():
            a, b = _pair(where, got, "lora_A", "lora_B")
            canon = canonical_name(f"{module}.weight", n_layers, post_norms, arch)
            if canon is None:
                if _EXPERT.search(module):
                    raise AdapterError(f"{where}: {_short(module, 120)} is a mixture-of-experts expert's weight: a "
                                       "LoRA of experts is not supported (only attention, dense MLP and router "
                                       "matrices)")
                raise AdapterError(f"{where}: {_short(module, 120)} is no weight of the base model ({arch}, "
                                   f"{n_layers} layers): an adapter for another model?")
            if canon in pairs:
                raise AdapterError(f"{where}: {module!r} and {pairs[canon].source_name!r} adapt the same weight")
            r = int(a.shape[0])
            want_r = _pattern_value(cfg.get("rank_pattern"), module, r_cfg, where, "rank_pattern", compiled)
            if want_r != r:
                raise AdapterError(f"{where}: {a.name!r} has rank {r} but adapter_config.json says r = {_short(want_r)}")
            alpha = _pattern_value(cfg.get("alpha_pattern"), module, alpha_cfg, where, "alpha_pattern", compiled)
            pairs[canon] = LoraPair(a, b, _check_factor(f"{where}, {module!r}", alpha, r, rslora), module)
        if not pairs:
            raise AdapterError(f"{where}: adapter_model.safetensors holds no LoRA pairs")
        return LoraAdapter(path, "peft", scale, pairs, None, False, [st.close])
    except BaseException:
        st.close()
        raise

"""Typed, range-checked reads of architecture hyper-parameters from GGUF metadata or config.json.

Every integer that sizes something and every float the math depends on is checked here, as it
is read, against the limits in config.py, so errors name the file's own key, and nothing is
sized from a value before it is checked (an architecture builds per-layer lists from n_layers
before its TransformerConfig exists).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from .config import check_int, check_number, check_rope_scaling

_MISSING = object()


def is_flag(v) -> bool:
    """A bool or 0/1 (bool() of a string was True, of an array "truth value ambiguous")."""
    return isinstance(v, (bool, int)) and v in (0, 1)


def _integer(what: str, v, limit: str | None):
    """v as an integer (a bool is not one), within its SIZE_LIMITS row when `limit` names one."""
    if limit is not None:
        return check_int(what, v, limit)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFormatError(f"{what} should be an integer, got {v!r}")
    return v


# The keys a GGUF file may hold as one value per layer (llama.cpp reads only these with get_key_or_arr; an
# array anywhere else, block_count say, is a type error there and here).
PER_LAYER_KEYS = frozenset({"feed_forward_length", "attention.head_count", "attention.head_count_kv"})


class GGUFHParams:
    """Reads `{arch}.{key}` from GGUF metadata with type and range checks."""

    def __init__(self, metadata: dict, arch: str):
        self.meta, self.arch = metadata, arch

    def _raw(self, key: str, default):
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return f"GGUF metadata {full!r}", self.meta[full]
        if default is _MISSING:
            raise ModelFormatError(f"GGUF metadata lacks {full!r}")
        return f"GGUF metadata {full!r}", default

    def int(self, key: str, default=_MISSING, limit: str | None = None) -> int:
        """An integer; `limit` names its SIZE_LIMITS row. Per-layer arrays must hold one common value."""
        what, v = self._raw(key, default)
        if isinstance(v, np.ndarray):
            v = v.tolist()
        if isinstance(v, (list, tuple)):
            if key not in PER_LAYER_KEYS:
                raise ModelFormatError(f"{what} should be an integer, got an array of {len(v)} values "
                                       "(only the MLP width and head counts are given per layer)")
            if not v or not all(type(x) is int for x in v) or any(x != v[0] for x in v):
                raise ModelFormatError(f"{what}: per-layer values {v[:8]!r} are not one common integer")
            layers = self.meta.get(f"{self.arch}.block_count")
            if type(layers) is int and len(v) != layers:
                # one value per layer, as llama.cpp reads such an array (it refuses another length too)
                raise ModelFormatError(f"{what}: {len(v)} per-layer values for the {layers} layers of "
                                       f"'{self.arch}.block_count'")
            v = v[0]
        return _integer(what, v, limit)

    def float(self, key: str, default=_MISSING, limit: str | None = None) -> float:
        """A finite number; `limit` names its FLOAT_LIMITS row."""
        what, v = self._raw(key, default)
        return check_number(what, v, limit or "any")

    def flag(self, key: str, default=_MISSING) -> bool:
        """A bool (or 0/1): bool() of an array raised "truth value ambiguous", of a string was True."""
        what, v = self._raw(key, default)
        if not is_flag(v):
            raise ModelFormatError(f"{what} should be a bool, got {v!r}"[:200])
        return bool(v)

    def str(self, key: str, default=_MISSING) -> str:
        what, v = self._raw(key, default)
        if v is not None and not isinstance(v, str):
            raise ModelFormatError(f"{what} should be a string, got {v!r}")
        return v

    def vocab_size(self) -> int:
        if f"{self.arch}.vocab_size" in self.meta:
            return self.int("vocab_size", limit="vocab_size")
        toks = self.meta.get("tokenizer.ggml.tokens")
        if isinstance(toks, list):
            return check_int("GGUF metadata 'tokenizer.ggml.tokens' (its length)", len(toks), "vocab_size")
        raise ModelFormatError("cannot tell the vocabulary size: GGUF metadata has neither "
                               f"'{self.arch}.vocab_size' nor a 'tokenizer.ggml.tokens' list")

    def common(self) -> dict:
        """The fields every llama-like GGUF architecture stores the same way."""
        n_heads = self.int("attention.head_count", limit="n_heads")
        d_model = self.int("embedding_length", limit="d_model")
        head_dim = self.int("attention.key_length", max(1, d_model // n_heads), limit="head_dim")
        # both were read as head_dim whatever the file said: value heads of another size (the attention
        # here has one), and 0 rotated dims as every dim rotated
        value_dim = self.int("attention.value_length", head_dim, limit="head_dim")
        if value_dim != head_dim:
            raise ModelFormatError(f"GGUF metadata '{self.arch}.attention.value_length' = {value_dim} differs from the "
                                   f"key heads' {head_dim}: value heads of another size are not supported")
        rope_dim = self.int("rope.dimension_count", head_dim, limit="rope_dim")
        if rope_dim == 0:
            raise ModelFormatError(f"GGUF metadata '{self.arch}.rope.dimension_count' = 0: no rotated dimensions")
        scaling = None
        kind = self.str("rope.scaling.type", None)
        if kind and kind != "none":
            scaling = {"rope_type": kind, "factor": self.float("rope.scaling.factor", 1.0, "rope_factor")}
        if kind == "yarn":
            if f"{self.arch}.rope.scaling.original_context_length" not in self.meta:
                raise ModelFormatError(f"yarn RoPE scaling needs GGUF metadata "
                                       f"'{self.arch}.rope.scaling.original_context_length'")
            scaling["original_max_position_embeddings"] = self.int("rope.scaling.original_context_length",
                                                                   limit="n_ctx_train")
            for ours, key in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
                if f"{self.arch}.rope.scaling.{key}" in self.meta:
                    scaling[ours] = self.float(f"rope.scaling.{key}", limit="rope_factor")
        return dict(
            arch=self.arch,
            vocab_size=self.vocab_size(),
            n_layers=self.int("block_count", limit="n_layers"),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=self.int("attention.head_count_kv", n_heads, limit="n_kv_heads"),
            head_dim=head_dim,
            ffn_dim=self.int("feed_forward_length", limit="ffn_dim"),
            norm_eps=self.float("attention.layer_norm_rms_epsilon", 1e-5, "norm_eps"),
            n_ctx_train=self.int("context_length", 4096, limit="n_ctx_train"),
            rope_theta=self.float("rope.freq_base", 10000.0, "rope_theta"),
            rope_dim=rope_dim,
            rope_scaling=scaling,
        )


class HFConfig:
    """Reads a Hugging Face config.json dict, both transformers 4 and 5 spellings."""

    def __init__(self, cfg: dict):
        if not isinstance(cfg, dict):
            raise ModelFormatError("config.json must hold a JSON object")
        self.cfg = cfg

    def get(self, key: str, default=_MISSING, kind=None, limit: str | None = None):
        """cfg[key] (None counts as absent); kind int or float checks the type, `limit` names the
        SIZE_LIMITS (int) or FLOAT_LIMITS (float) row it must be in. Defaults are not checked."""
        if key in self.cfg and self.cfg[key] is not None:
            v = self.cfg[key]
        elif default is _MISSING:
            raise ModelFormatError(f"config.json lacks {key!r}")
        else:
            return default
        return self.check(f"config.json {key!r}", v, kind, limit)

    def flag(self, key: str, default: bool) -> bool:
        """cfg[key] as a bool (None counts as absent): true/false or 0/1. bool() of "false", of NaN or
        of a list was True: a tied head where the file has its own, top-k weights renormalised or not."""
        v = self.cfg.get(key)
        if v is None:
            return default
        if not is_flag(v):
            raise ModelFormatError(f"config.json {key!r} should be true or false, got {v!r}"[:200])
        return bool(v)

    @staticmethod
    def check(what: str, v, kind=None, limit: str | None = None):
        if kind is int:
            return _integer(what, v, limit)
        if kind is float:
            return check_number(what, v, limit or "any")
        return v

    def rope(self, layer_type: str | None = None) -> tuple[float, dict | None]:
        """(theta, scaling dict) from `rope_parameters` (v5) or `rope_theta`/`rope_scaling` (v4)."""
        for key in ("rope_parameters", "rope_scaling"):
            v = self.cfg.get(key)
            if v is not None and not isinstance(v, dict):
                # was skipped: the other spelling's theta (or 10000) and no scaling, another model's RoPE
                raise ModelFormatError(f"config.json {key!r} should be an object, got {v!r}"[:200])
        params = self.cfg.get("rope_parameters")
        where = "config.json 'rope_parameters'"
        if isinstance(params, dict) and layer_type and isinstance(params.get(layer_type), dict):
            params, where = params[layer_type], f"config.json 'rope_parameters.{layer_type}'"
        if isinstance(params, dict) and "rope_theta" in params:
            theta = self.check(f"{where} rope_theta", params["rope_theta"], float, "rope_theta")
            kind = params.get("rope_type", "default")
            return theta, (None if kind == "default" else _scaling(dict(params), where))
        theta = self.get("rope_theta", 10000.0, float, "rope_theta")
        scaling = self.cfg.get("rope_scaling")
        if isinstance(scaling, dict):
            kind = scaling.get("rope_type") or scaling.get("type") or "default"
            if kind != "default":
                return theta, _scaling(dict(scaling, rope_type=kind), "config.json 'rope_scaling'")
        return theta, None

    def window(self) -> int:
        """`sliding_window`: absent, null or 0 for none."""
        w = self.cfg.get("sliding_window")
        return 0 if w is None or w == 0 else self.get("sliding_window", 0, int, "sliding_window")

    def common(self, arch: str) -> dict:
        n_heads = self.get("num_attention_heads", kind=int, limit="n_heads")
        d_model = self.get("hidden_size", kind=int, limit="d_model")
        head_dim = self.get("head_dim", max(1, d_model // n_heads), int, "head_dim")
        theta, scaling = self.rope()
        return dict(
            arch=arch,
            vocab_size=self.get("vocab_size", kind=int, limit="vocab_size"),
            n_layers=self.get("num_hidden_layers", kind=int, limit="n_layers"),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=self.get("num_key_value_heads", n_heads, int, "n_kv_heads"),
            head_dim=head_dim,
            ffn_dim=self.get("intermediate_size", kind=int, limit="ffn_dim"),
            norm_eps=self.get("rms_norm_eps", 1e-6, float, "norm_eps"),
            n_ctx_train=self.get("max_position_embeddings", 4096, int, "n_ctx_train"),
            rope_theta=theta,
            rope_scaling=scaling,
            rope_neox=True,
            tie_embeddings=self.flag("tie_word_embeddings", False),
        )


def gguf_layer_kinds(meta: dict, arch: str, recurrent: str) -> tuple[dict, list | None]:
    """A hybrid's `{arch}.attention.head_count_kv` as llama.cpp writes it, one value per layer (0: a layer of
    kind `recurrent`): (the metadata with the one common head count in its place, the layer kinds), or
    (meta, None) where the key holds one number."""
    key = f"{arch}.attention.head_count_kv"
    kv = meta.get(key)
    kv = kv.tolist() if isinstance(kv, np.ndarray) else kv
    if not isinstance(kv, (list, tuple)):
        return meta, None
    # the types first: a nested list in a set was an untyped TypeError (unhashable)
    heads = sorted({v for v in kv if v != 0}) if all(type(v) is int and v >= 0 for v in kv) else None
    if not kv or heads is None or len(heads) > 1:
        raise ModelFormatError(f"GGUF metadata {key!r}: per-layer values {list(kv)[:8]!r} are not 0 "
                               f"(a {recurrent} layer) or one common head count")
    n_layers = meta.get(f"{arch}.block_count")
    if isinstance(n_layers, int) and len(kv) != n_layers:
        raise ModelFormatError(f"GGUF metadata {key!r} has {len(kv)} values for {n_layers} layers")
    kinds = ["attention" if v else recurrent for v in kv]
    return dict(meta, **{key: heads[0] if heads else meta.get(f"{arch}.attention.head_count", 1)}), kinds


def hf_layer_kinds(types, n_layers: int, kinds: dict) -> list:
    """config.json's `layer_types` (a hybrid model's token mixer per layer) as LAYER_KINDS names
    through `kinds` ({"conv": "shortconv", "full_attention": "attention"}, say)."""
    # (a list among them was an unhashable TypeError)
    if not isinstance(types, list) or len(types) != n_layers or not all(isinstance(t, str) and t in kinds for t in types):
        raise ModelFormatError(f"config.json 'layer_types' should list one of {', '.join(map(repr, kinds))} for each "
                               f"of the {n_layers} layers, got {types!r}")
    return [kinds[t] for t in types]


def _scaling(sc: dict, where: str) -> dict:
    """A RoPE scaling dict, with the file's key in any error TransformerConfig raises about it."""
    try:
        check_rope_scaling(sc)
    except ModelFormatError as e:
        raise ModelFormatError(f"{where}: {e}") from None
    return sc


def hf_sliding_flags(types, n_layers: int) -> list[bool] | None:
    """config.json's `layer_types` of an attention model as per-layer sliding flags; None where absent. An
    unknown type (a chunked attention, say) counted as full attention, and a list of another length or
    type was passed over for the family's own pattern, both unsaid."""
    if types is None:
        return None
    return [k == "sliding" for k in hf_layer_kinds(types, n_layers, {"sliding_attention": "sliding",
                                                                   "full_attention": "full"})]


def refuse_quantized(cfg: dict, family: str) -> None:
    """A checkpoint quantized by its own scheme (config.json's quantization_config: the Hub's FP8 releases of
    DeepSeek-V3 and GLM-4.5) is refused by name: its scales are tensors no loader here reads."""
    quant = cfg.get("quantization_config")
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise ModelFormatError(f"a {family} checkpoint quantized as {method!r} (quantization_config) is not supported: "
                               "use its GGUF or a float (bf16) conversion")

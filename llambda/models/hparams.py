"""Typed reads of architecture hyper-parameters from GGUF metadata or config.json."""
from __future__ import annotations

import math

from ..errors import ModelFormatError

_MISSING = object()


class GGUFHParams:
    """Reads `{arch}.{key}` from GGUF metadata with type checks."""

    def __init__(self, metadata: dict, arch: str):
        self.meta, self.arch = metadata, arch

    def _raw(self, key: str, default):
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return full, self.meta[full]
        if default is _MISSING:
            raise ModelFormatError(f"GGUF metadata lacks {full!r}")
        return full, default

    def int(self, key: str, default=_MISSING) -> int:
        full, v = self._raw(key, default)
        if isinstance(v, (list, tuple)):   # per-layer arrays: take the common value
            vals = set(v)
            if len(vals) != 1:
                raise ModelFormatError(f"{full!r}: per-layer values {sorted(vals)} are not supported")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) and not (hasattr(v, "__index__")):
            raise ModelFormatError(f"{full!r} should be an integer, got {v!r}")
        return int(v)

    def float(self, key: str, default=_MISSING) -> float:
        full, v = self._raw(key, default)
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ModelFormatError(f"{full!r} should be a number, got {v!r}") from None
        if not math.isfinite(f):
            raise ModelFormatError(f"{full!r} is not finite")
        return f

    def str(self, key: str, default=_MISSING) -> str:
        full, v = self._raw(key, default)
        if v is not None and not isinstance(v, str):
            raise ModelFormatError(f"{full!r} should be a string, got {v!r}")
        return v

    def vocab_size(self, embd_rows: int | None = None) -> int:
        if f"{self.arch}.vocab_size" in self.meta:
            return self.int("vocab_size")
        toks = self.meta.get("tokenizer.ggml.tokens")
        if toks is not None:
            return len(toks)
        if embd_rows is not None:
            return embd_rows
        raise ModelFormatError("cannot tell the vocabulary size")

    def common(self) -> dict:
        """The fields every llama-like GGUF architecture stores the same way."""
        n_heads = self.int("attention.head_count")
        d_model = self.int("embedding_length")
        if n_heads <= 0 or d_model <= 0:
            raise ModelFormatError("head count and embedding length must be positive")
        head_dim = self.int("attention.key_length", d_model // n_heads)
        scaling = None
        kind = self.str("rope.scaling.type", None)
        if kind and kind != "none":
            scaling = {"rope_type": kind, "factor": self.float("rope.scaling.factor", 1.0)}
        return dict(
            arch=self.arch,
            vocab_size=self.vocab_size(),
            n_layers=self.int("block_count"),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=self.int("attention.head_count_kv", n_heads),
            head_dim=head_dim,
            ffn_dim=self.int("feed_forward_length"),
            norm_eps=self.float("attention.layer_norm_rms_epsilon", 1e-5),
            n_ctx_train=self.int("context_length", 4096),
            rope_theta=self.float("rope.freq_base", 10000.0),
            rope_dim=self.int("rope.dimension_count", head_dim),
            rope_scaling=scaling,
        )


class HFConfig:
    """Reads a Hugging Face config.json dict, both transformers 4 and 5 spellings."""

    def __init__(self, cfg: dict):
        if not isinstance(cfg, dict):
            raise ModelFormatError("config.json must hold a JSON object")
        self.cfg = cfg

    def get(self, key: str, default=_MISSING, kind=None):
        if key in self.cfg and self.cfg[key] is not None:
            v = self.cfg[key]
        elif default is _MISSING:
            raise ModelFormatError(f"config.json lacks {key!r}")
        else:
            return default
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ModelFormatError(f"config.json {key!r} should be an integer, got {v!r}")
        if kind is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ModelFormatError(f"config.json {key!r} should be a number, got {v!r}")
            v = float(v)
        return v

    def rope(self, layer_type: str | None = None) -> tuple[float, dict | None]:
        """(theta, scaling dict) from `rope_parameters` (v5) or `rope_theta`/`rope_scaling` (v4)."""
        params = self.cfg.get("rope_parameters")
        if isinstance(params, dict) and layer_type and isinstance(params.get(layer_type), dict):
            params = params[layer_type]
        if isinstance(params, dict) and "rope_theta" in params:
            theta = float(params["rope_theta"])
            kind = params.get("rope_type", "default")
            return theta, (None if kind == "default" else dict(params))
        theta = float(self.get("rope_theta", 10000.0, float))
        scaling = self.cfg.get("rope_scaling")
        if isinstance(scaling, dict):
            kind = scaling.get("rope_type") or scaling.get("type") or "default"
            if kind != "default":
                return theta, dict(scaling, rope_type=kind)
        return theta, None

    def common(self, arch: str) -> dict:
        n_heads = self.get("num_attention_heads", kind=int)
        d_model = self.get("hidden_size", kind=int)
        head_dim = self.get("head_dim", None) or d_model // n_heads
        theta, scaling = self.rope()
        return dict(
            arch=arch,
            vocab_size=self.get("vocab_size", kind=int),
            n_layers=self.get("num_hidden_layers", kind=int),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=self.get("num_key_value_heads", n_heads, kind=int),
            head_dim=int(head_dim),
            ffn_dim=self.get("intermediate_size", kind=int),
            norm_eps=self.get("rms_norm_eps", 1e-6, float),
            n_ctx_train=self.get("max_position_embeddings", 4096, kind=int),
            rope_theta=theta,
            rope_scaling=scaling,
            rope_neox=True,
            tie_embeddings=bool(self.get("tie_word_embeddings", False)),
        )

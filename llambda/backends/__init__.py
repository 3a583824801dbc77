"""Backends run the model's ops: `numpy` (the FP32 reference) and `native` (the C core)."""
from __future__ import annotations

from ..errors import LlambdaError


def available_backends() -> list[str]:
    out = ["numpy"]
    try:
        from . import native  # noqa: F401
        if native.native_available():
            out.insert(0, "native")
    except ImportError:
        pass
    return out


def create_backend(name: str | None = None, threads: int | None = None, activations: str | None = None,
                   kv_type: str = "f32"):
    """The named backend; None picks native where it built, else numpy."""
    if name is None:
        name = available_backends()[0]
    if name == "numpy":
        from .numpy_ref import NumpyBackend
        if activations not in (None, "f32"):
            raise LlambdaError("the numpy backend computes in float32 only (activations='f32')")
        return NumpyBackend()
    if name == "native":
        from .native import NativeBackend
        return NativeBackend(threads=threads, activations=activations or "q8", kv_type=kv_type)
    raise LlambdaError(f"unknown backend {name!r}; available: {', '.join(available_backends())}")

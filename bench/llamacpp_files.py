"""GGUF files made by llama.cpp's own quantizer (through llama-cpp-python's llama_model_quantize), for the
benchmarks that compare types: an F16 copy of a catalogued model (re-quantized from its cached file with
allow_requantize), then any llama.cpp file type from that F16. Files are cached in a work directory and
made once. Not a test, not part of the package."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

DEFAULT_WORKDIR = Path(os.environ.get("LLAMBDA_HOME", Path.home() / ".cache" / "llambda")) / "bench_types"

# llama.cpp's file types (llama_ftype names, lower case) with the tensor type each puts in most matrices.
FILE_TYPES = {
    "q2_k": "Q2_K", "q3_k_s": "Q3_K", "q3_k_m": "Q3_K", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0",
    "q5_1": "Q5_1", "q4_k_s": "Q4_K", "q4_k_m": "Q4_K", "q5_k_s": "Q5_K", "q5_k_m": "Q5_K", "q6_k": "Q6_K",
    "q8_0": "Q8_0", "iq4_nl": "IQ4_NL", "iq4_xs": "IQ4_XS", "mxfp4_moe": "MXFP4", "f16": "F16",
}


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit("this benchmark needs llama-cpp-python: pip install '.[bench]'") from None
    from llambda.tools.bench import _silence_llama_cpp
    _silence_llama_cpp(llama_cpp)
    return llama_cpp


def llama_quantize(src: Path, dst: Path, ftype: str, pure: bool = False, threads: int = 2) -> Path:
    """dst = llama.cpp's quantizer run on src with its file type `ftype` (made once; `pure`: every matrix in
    the type, as llama-quantize --pure)."""
    if dst.exists():
        return dst
    L = _llama_cpp()
    p = L.llama_model_quantize_default_params()
    p.ftype = getattr(L, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
    p.allow_requantize = True
    p.pure = pure
    p.nthread = threads
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".part")
    if L.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(p)) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src} to {ftype}")
    tmp.rename(dst)
    return dst


def f16_source(model: str, workdir: Path = DEFAULT_WORKDIR) -> Path:
    """An F16 copy of a catalogued model (or of a GGUF path), made by llama.cpp's quantizer."""
    from llambda.hub import resolve
    src = resolve(model)
    return llama_quantize(src, workdir / f"{Path(src).stem}.F16.gguf", "f16")


def llama_file(f16: Path, ftype: str, pure: bool = False) -> Path:
    """llama.cpp's `ftype` file made from the F16 source, beside it."""
    stem = f16.name.removesuffix(".F16.gguf")
    return llama_quantize(f16, f16.parent / f"{stem}.{ftype.upper()}{'-pure' if pure else ''}.llama.gguf", ftype, pure)

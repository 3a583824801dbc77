"""What the `tokenizers` library raises (core.py and hf_dir.py both catch it)."""
from __future__ import annotations


def library_error(e: BaseException) -> bool:
    """An error of the `tokenizers` library: an Exception, or a Rust panic (a Split regex over its backtracking
    limit on the text, say), which pyo3 raises as PanicException, a BaseException that `except Exception` misses."""
    return isinstance(e, Exception) or type(e).__name__ == "PanicException"

"""Whether a number given as input is finite as a float, asked by every check of a user's numbers
(sampling's fields, a LoRA adapter's scale and alpha) and of a model file's (its config's floats); a state-space
layer's decay rates -exp(A_log), checked to stay finite."""
from __future__ import annotations

import math

import numpy as np

from .errors import ModelFormatError


def finite_as_float(v) -> bool:
    """float(v) is finite. An int past float's range (JSON allows 10**400) is not, rather than an
    OverflowError; nor is a value float() refuses. The caller checks the type first (bools, strings)."""
    try:
        return math.isfinite(float(v))
    except (OverflowError, ValueError, TypeError):
        return False


def negated_exp(a_log, name: str) -> np.ndarray:
    """-exp(A_log) in float32 (Mamba's and the delta nets' A, llama.cpp's ssm_a), ModelFormatError naming `name`
    where a finite A_log overflows it (past ~88.7: A = -inf, which a GGUF's ssm_a may not hold, and 0 x -inf in a
    step whose dt underflows)."""
    with np.errstate(over="ignore"):
        a = -np.exp(np.asarray(a_log, dtype=np.float32))
    bad = np.flatnonzero(~np.isfinite(a))
    if len(bad):
        raise ModelFormatError(f"tensor {name} holds A_log {float(np.asarray(a_log).reshape(-1)[bad[0]])} at index "
                               f"{int(bad[0])}: -exp of it overflows float32 ({len(bad)} such values)")
    return a

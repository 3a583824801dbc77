"""Whether a number given as input is finite as a float, asked by every check of a user's numbers
(sampling's fields, a LoRA adapter's scale and alpha) and of a model file's (its config's floats)."""
from __future__ import annotations

import math


def finite_as_float(v) -> bool:
    """float(v) is finite. An int past float's range (JSON allows 10**400) is not, rather than an
    OverflowError; nor is a value float() refuses. The caller checks the type first (bools, strings)."""
    try:
        return math.isfinite(float(v))
    except (OverflowError, ValueError, TypeError):
        return False

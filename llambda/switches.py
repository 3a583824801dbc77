"""The LLAMBDA_* environment switches the Python side reads, parsed in one place (the C core reads its own
with the same vocabulary: csrc/core/env.c). README's "Environment switches" lists them all.

Unset or empty means the default. A value that is not one the switch takes is never guessed at: one
LlambdaWarning names the switch, the value, what it takes and the default that applies instead (the
CLI prints it as one line), so a typo neither stops a run nor silently picks another path."""
from __future__ import annotations

import os
import warnings

from .errors import LlambdaWarning

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip(" \t\n\r\f\v")      # ASCII spaces only, as C's isspace


def _bad(name: str, raw: str, takes: str, default) -> None:
    shown = "automatic" if default is None else "on" if default else "off"
    warnings.warn(f"{name}={raw!r} is not {takes}; using the default ({shown})", LlambdaWarning, stacklevel=3)


def flag(name: str, default: bool | None) -> bool | None:
    """A yes/no switch: 1/true/yes/on or 0/false/no/off, any case; `default` (None: automatic) otherwise."""
    raw = _raw(name)
    if not raw:
        return default
    v = raw.lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    _bad(name, raw, "one of 1/true/yes/on or 0/false/no/off", default)
    return default


"""/metrics of a whole deployment: the replicas' Prometheus texts summed sample by sample.

Every llambda metric is a counter, a histogram or a gauge of things that add up across replicas
(slots, queue depth, tokens/s), so the sum is the service's figure."""
from __future__ import annotations

from typing import Iterable


def merge(texts: Iterable[str]) -> str:
    """One exposition: each HELP/TYPE line once (first seen), each sample the sum over the texts."""
    header: dict[str, list[str]] = {}       # metric family -> its comment lines
    samples: dict[str, dict[str, float]] = {}   # family -> sample (name and labels) -> summed value
    for text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith("# "):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    lines = header.setdefault(family, [])
                    if len(lines) < 2 and line not in lines:
                        lines.append(line)
                    samples.setdefault(family, {})
                continue
            name, _, value = line.rpartition(" ")
            if not name:
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            bucket = samples.setdefault(family, {})
            bucket[name] = bucket.get(name, 0.0) + number
    out: list[str] = []
    for family, bucket in samples.items():
        out += header.get(family, [])
        out += [f"{name} {_num(value)}" for name, value in bucket.items()]
    return "\n".join(out) + "\n"


def samples(text: str) -> dict[str, float]:
    """Sample (name with labels) -> value, of one exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def _num(v: float) -> str:
    return str(int(v)) if v.is_integer() else repr(round(v, 6))

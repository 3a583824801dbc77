"""Comparisons against the independent reference (HF transformers outputs)."""
from __future__ import annotations

import numpy as np


def check_top20(logits: np.ndarray, prompt_ref: dict, tol: float) -> float:
    """Every reference top-20 logit within `tol` of ours; returns the worst difference."""
    worst = 0.0
    for e in prompt_ref["top20"]:
        d = abs(float(logits[e["id"]]) - e["logit"])
        worst = max(worst, d)
    assert worst <= tol, f"top-20 logits differ by up to {worst:.4f} (budget {tol}) for {prompt_ref['prompt']!r}"
    return worst


def greedy_reference(prompt_ref: dict) -> tuple[list[int], list[float]]:
    g = prompt_ref["greedy"]
    ids = g["ids"]
    if prompt_ref.get("greedy_ignoring_eos"):
        ids = prompt_ref["greedy_ignoring_eos"]["ids"]
    return ids, g["top1_minus_top2_logit_per_step"]


def comparable_steps(margins: list[float], gap: float) -> int:
    """Steps before the first whose top-2 margin is below `gap` (that step itself may legitimately differ)."""
    for i, m in enumerate(margins):
        if m < gap:
            return i
    return len(margins)


def check_greedy(ours: list[int], prompt_ref: dict, gap: float) -> int:
    ref, margins = greedy_reference(prompt_ref)
    k = comparable_steps(margins, gap)
    assert ours[:k] == ref[:k], (
        f"greedy ids differ before step {k} for {prompt_ref['prompt']!r}:\n ours {ours[:k]}\n  ref {ref[:k]}")
    return k

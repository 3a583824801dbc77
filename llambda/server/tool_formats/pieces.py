"""What every answer parser (blocks.BlockParser, harmony's, think's) shares: a call's id, where
content lies (spans joined as they continue), a marker that may still be arriving at the end of a
piece, and a piece's tool-call deltas merged to one per call."""
from __future__ import annotations

import secrets


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def add_span(spans: list[tuple[int, int]], at: int, n: int) -> None:
    """Note n characters of content at `at`, joined to the last span where they continue it."""
    if spans and spans[-1][1] == at:
        spans[-1] = (spans[-1][0], at + n)
    else:
        spans.append((at, at + n))


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (held back: the tag may be arriving)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def merge_call_deltas(deltas: list[dict]) -> list[dict]:
    """One delta per call index (arguments concatenated), in index order."""
    by_index: dict[int, dict] = {}
    for d in deltas:
        have = by_index.get(d["index"])
        if have is None:
            by_index[d["index"]] = {**d, "function": dict(d["function"])}
        else:
            have["function"]["arguments"] += d["function"].get("arguments", "")
            for key in ("id", "type"):
                if key in d:
                    have[key] = d[key]
            if "name" in d["function"]:
                have["function"]["name"] = d["function"]["name"]
    return [by_index[k] for k in sorted(by_index)]

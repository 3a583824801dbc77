"""SentencePiece's precompiled charsmap (a Unigram vocabulary's normalizer: GGUF `tokenizer.ggml.precompiled_charsmap`,
tokenizer.json's Precompiled normalizer), checked whole before the `tokenizers` library runs it.

The layout: a little-endian u32 byte size of the trie, the trie (darts-clone's double array of u32 units), then a
pool of NUL-ended UTF-8 replacements. A lookup starts at the base the unit at 0 gives (base = 0 ^ offset(unit));
for each byte c of the text the unit at base ^ c is that child when its label (bits 0-7, and bit 31 clear) is c,
and base ^ offset(child) is the child's base; when the child has a leaf (bit 8) the unit at that base holds the
replacement's start in the pool (bits 0-30). offset(u) is u >> 10, shifted left by 8 more when bit 9 is set.

The library indexes the array and slices the pool without bounds checks: a unit past the array, or a value past
the pool or inside a UTF-8 character, is a Rust panic inside every encode that meets it. So every node any text
can reach is visited once here, breadth-first, and a charsmap with one bad reach is refused at load with what is
wrong. A unit j whose label c is a byte (1-255) can only be the child c of the node whose base is j ^ c, so the
children of every node are found by one sort of the units by that parent base: each unit is read once whatever
the trie's shape (a node's 255 tries each, kept as arrays, took a 256 KB charsmap whose nodes sit in one level to
400 MB).
"""
from __future__ import annotations

import numpy as np

from ..errors import TokenizerError

# UTF-8 bytes one match writes: the longest in SentencePiece's NFKC maps is 33 (U+FDFA, an 18-char Arabic phrase);
# a hostile charsmap can map "a" to megabytes.
MAX_CHARSMAP_REPLACEMENT = 64
# Bytes of one key (trie levels): SentencePiece's keys are a few characters; the library looks up 5 bytes at most.
MAX_CHARSMAP_DEPTH = 256
_LABEL_MASK = (1 << 31) | 0xFF


def _offset(units: np.ndarray) -> np.ndarray:
    return (units >> 10) << ((units & (1 << 9)) >> 6)


def check_charsmap(where, blob: bytes) -> None:
    """Refuse (TokenizerError) a charsmap the library cannot read, or that can read past its trie or pool, or
    that writes more per match than SentencePiece's own do."""
    def bad(why: str):
        return TokenizerError(f"{where}: precompiled charsmap {why}")

    if len(blob) < 4:
        raise bad("is shorter than its 4-byte header")
    n = int.from_bytes(blob[:4], "little") // 4
    if n == 0:
        raise bad("has an empty trie")
    if 4 + 4 * n > len(blob):
        raise bad(f"says its trie is {4 * n} bytes, past its {len(blob) - 4}")
    pool = blob[4 + 4 * n:]
    try:
        pool.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("holds replacements that are not UTF-8") from None
    longest = max(map(len, pool.split(b"\0")))
    if longest > MAX_CHARSMAP_REPLACEMENT:
        raise bad(f"writes up to {longest} bytes per match, more than the {MAX_CHARSMAP_REPLACEMENT} allowed "
                  "(a text would grow without bound)")
    units = np.frombuffer(blob, "<u4", count=n, offset=4).astype(np.int64)
    # a value may point at the pool's end (an empty replacement), never past it nor inside a character
    starts = np.frombuffer(pool, np.uint8)
    starts = np.append((starts < 0x80) | (starts >= 0xC0), True)
    # each unit that can be a child (its label a byte, bit 31 clear), sorted by the base of its one parent
    label = units & _LABEL_MASK
    child = np.flatnonzero((label >= 1) & (label <= 0xFF))
    parent = child ^ label[child]
    order = np.argsort(parent, kind="stable")
    child, parent = child[order], parent[order]
    visited = np.zeros(n, bool)
    frontier = np.array([int(_offset(units[:1])[0])], np.int64)
    for _ in range(MAX_CHARSMAP_DEPTH + 1):
        if not frontier.size:
            return
        # the node at base b reads units b ^ c for c in 1..255: the largest is b | 0xFF (b ^ 0xFE when b ends in 0xFF)
        if (((frontier | 0xFF) ^ ((frontier & 0xFF) == 0xFF)) >= n).any():
            raise bad(f"has a node whose children lie past its {n} units")
        visited[frontier] = True
        lo = np.searchsorted(parent, frontier, "left")
        counts = np.searchsorted(parent, frontier, "right") - lo
        kids = child[np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())]
        unit = units[kids]
        bases = kids ^ _offset(unit)
        leaves = bases[(unit >> 8) & 1 == 1]
        if (leaves >= n).any():
            raise bad(f"has a value past its {n} units")
        values = units[leaves] & ((1 << 31) - 1)
        if (values > len(pool)).any():
            raise bad(f"points past its {len(pool)}-byte pool of replacements")
        if not starts[values].all():
            raise bad("points inside a character of its replacements")
        bases = np.unique(bases)
        inside = bases < n
        frontier = np.concatenate([bases[inside][~visited[bases[inside]]], bases[~inside]])
    raise bad(f"has keys longer than {MAX_CHARSMAP_DEPTH} bytes")

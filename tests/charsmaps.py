"""SentencePiece precompiled charsmaps made for tests: a little-endian u32 byte size of the trie, the trie (a
double array of u32 units: label in bits 0-7, has-leaf in bit 8, an offset in bits 10-31 shifted by 8 when bit 9
is set; a value unit has bit 31 set and its value in bits 0-30), then the pool of NUL-ended replacements that
the leaves' values point into. A child of the node at `base` with label c sits at base ^ c, and its unit's offset
takes it to its own base (base ^ 0 holds its value when it has one), as darts-clone lays them out in blocks of
256 units."""
from __future__ import annotations

import struct

BLOCK = 256


def build_charsmap(mapping: dict[str, str]) -> bytes:
    """The charsmap that rewrites each key (UTF-8) to its value."""
    pool, at = bytearray(), {}
    for key, value in mapping.items():
        at[key.encode()] = len(pool)
        pool += value.encode() + b"\0"
    trie: dict = {}
    for key in at:
        node = trie
        for b in key:
            node = node.setdefault(b, {})
        node[None] = at[key]
    units = [0] * BLOCK
    used = {0}

    def place(node) -> int:
        """A free base for the node's children (and its value at base ^ 0), the slots marked used."""
        labels = [c for c in node if c is not None] + [0]
        base = 1
        while base in used or any(base ^ c in used for c in labels):
            base += 1
        for c in labels:
            used.add(base ^ c)
        while len(units) <= max(base ^ c for c in labels):
            units.extend([0] * BLOCK)
        return base

    def fill(node, base: int) -> None:
        if None in node:
            units[base] = node[None] | (1 << 31)
        for c, child in node.items():
            if c is None:
                continue
            child_base = place(child)
            pos = base ^ c
            offset = pos ^ child_base
            assert offset < (1 << 21), "a test charsmap this large needs the shifted offsets"
            units[pos] = c | (offset << 10) | ((1 << 8) if None in child else 0)
            fill(child, child_base)

    root = place(trie)
    units[0] = (root ^ 0) << 10
    fill(trie, root)
    blob = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(blob)) + blob + bytes(pool)


def charsmap_keys(mapping: dict[str, str]) -> str:
    """Every key once, each after a space (a text that walks the whole trie)."""
    return " ".join(mapping)


# an NFKC-like table: full-width letters, ligatures, circled digits, a no-break space, a two-char key
SAMPLE = {"\uff21": "A", "\uff42": "b", "\ufb01": "fi", "\u2460": "1", "\u00a0": " ", "\u2122": "TM",
          "\u3000": " ", "\u00bd": "1\u20442", "e\u0301": "\u00e9", "\u212b": "\u00c5", "\u1100": "\u1100",
          "\U0001d400": "A", "\u00c5": "\u00c5"}

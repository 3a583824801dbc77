"""Which replica a request should go to: the one that last served its prompt's prefix, unless busy.

A prompt's text (UTF-8) is cut into fixed-size blocks of bytes, and each block's key hashes it together with
every block before it, so a key names a whole prefix. A conversation's turn n+1 starts with turn n's
text, so its first keys are turn n's keys. The table remembers, per key, the replica that was last
sent that prefix (a bounded LRU: at capacity the least recently routed prefixes are forgotten).

The router ranks replicas: the prefix's owner first when it has a free slot, then everyone by load.
A stale table costs a cache miss, never a wrong answer: any replica can serve any request.
"""
from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from typing import Hashable, Iterable, Mapping, Sequence

BLOCK_BYTES = 64          # ~16 tokens of English: the replica's prefix cache reuses from 4 tokens on
TABLE_CAPACITY = 200_000  # prefix keys remembered (8-byte keys: a few tens of MB at most)


def block_keys(text: str, block_bytes: int = BLOCK_BYTES) -> list[bytes]:
    """Chained hashes of the text's full blocks (a trailing partial block is not a shared prefix yet)."""
    data = text.encode("utf-8", "surrogatepass")
    keys: list[bytes] = []
    h = b""
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h = hashlib.blake2b(h + data[start:start + block_bytes], digest_size=8).digest()
        keys.append(h)
    return keys


class PrefixTable:
    def __init__(self, capacity: int = TABLE_CAPACITY):
        self.capacity = capacity
        self._owner: OrderedDict[bytes, Hashable] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def owner(self, keys: Sequence[bytes], alive: Iterable[Hashable]) -> tuple[Hashable | None, int]:
        """The live replica holding the longest of these prefixes, and how many blocks it holds."""
        alive = set(alive)
        best, depth = None, 0
        for i, key in enumerate(keys):
            who = self._owner.get(key)
            if who is None:
                break             # keys chain: nobody can hold a longer prefix
            if who in alive:
                best, depth = who, i + 1
        return best, depth

    def record(self, keys: Sequence[bytes], replica: Hashable) -> None:
        for key in keys:
            self._owner[key] = replica
            self._owner.move_to_end(key)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, replica: Hashable) -> None:
        """A replica died: its cache died with it."""
        for key in [k for k, who in self._owner.items() if who == replica]:
            del self._owner[key]


def by_load(loads: Mapping[Hashable, int | None]) -> list[Hashable]:
    """Replicas least loaded first (unknown load counts as idle); ties in random order, so idle
    replicas share new conversations."""
    replicas = list(loads)
    random.shuffle(replicas)
    return sorted(replicas, key=lambda r: loads[r] or 0)


def rank(table: PrefixTable, keys: Sequence[bytes], loads: Mapping[Hashable, int | None],
         slots: int) -> tuple[list[list[Hashable]], str]:
    """Ranked replica groups for a request, and why: "prefix" (the owner, which has a free slot),
    "busy" (the owner is full: least loaded instead), or "load" (no replica holds the prefix)."""
    owner, _ = table.owner(keys, loads.keys())
    ordered = by_load(loads)
    if owner is None:
        return [ordered], "load"
    if (loads[owner] or 0) < slots:
        return [[owner], [r for r in ordered if r != owner]], "prefix"
    return [ordered], "busy"

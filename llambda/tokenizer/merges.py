"""BPE merge lists: validated from metadata, or derived from a vocabulary.

SentencePiece BPE files carry no merges, only token scores: at each step the
adjacent pair whose concatenation is the highest-scoring token merges.  That
is plain BPE with one merge rule per way of splitting a token in two, ranked
by the token's score, which is what `merges_from_ranks` builds so that the
`tokenizers` BPE model can run it.  A 262k vocabulary has ~2M split points;
a Python loop over them takes ~1.6 s, so the splits are found with
polynomial hashes of every prefix and suffix in NumPy (~0.3 s).
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from ..errors import TokenizerError

_BASE = 0x9E3779B97F4A7C15 | 1          # odd, so invertible mod 2**64
# Bounds on derived merges (Gemma 3's 262k vocabulary: 1.1M split points, 514k merges of 3.1M chars). A token
# of n chars has n - 1 splits, each a merge of n chars: 3000 tokens "a" * i (4.5 MB) once made 4.5M merges of
# 13.5G chars, 9.6 GB to build.
MAX_SPLITS = 8 << 20
MAX_MERGED_CHARS = 64 << 20
_BASE_INV = pow(_BASE, -1, 1 << 64)


def parse_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """'left right' strings -> (left, right) pairs, each part and their join in vocab."""
    pairs = list(map(str.split, merges, repeat(" "), repeat(1)))    # a C loop: 3x a listcomp
    bad = next((i for i, p in enumerate(pairs) if len(p) != 2), None)
    if bad is not None:
        raise TokenizerError(
            f"tokenizer.ggml.merges[{bad}] = {merges[bad]!r} is not two tokens separated by a space")
    if not pairs:
        return []
    lefts, rights = zip(*pairs)
    # Set operations keep the check in C: ~50 ms for 150k merges.  The
    # tokenizers library would panic (not raise) on an unknown merge result.
    for what, parts in (("left part", lefts), ("right part", rights),
                        ("merged token", map(str.__add__, lefts, rights))):
        missing = set(parts).difference(vocab)
        if missing:
            example = min(missing)
            i = next(i for i, (l, r) in enumerate(pairs)
                     if example in (l, r, l + r))
            raise TokenizerError(
                f"tokenizer.ggml.merges[{i}] = {merges[i]!r}: its {what} {example!r} is not in "
                f"tokenizer.ggml.tokens ({len(missing)} merges reference unknown tokens)")
    return list(map(tuple, pairs))


def _hash_table(codes: np.ndarray):
    """Prefix sums G with hash(codes[a:b]) = (G[b] - G[a]) * BASE^-a (mod 2**64)."""
    n = len(codes)
    with np.errstate(over="ignore"):
        pw = np.full(n, _BASE, dtype=np.uint64)
        pw[0] = 1
        pw = np.cumprod(pw, dtype=np.uint64)               # BASE^i, wrapping
        ipw = np.full(n + 1, _BASE_INV, dtype=np.uint64)
        ipw[0] = 1
        ipw = np.cumprod(ipw, dtype=np.uint64)             # BASE^-i
        g = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(codes * pw, dtype=np.uint64, out=g[1:])
    return g, ipw


def _substring_hash(g, ipw, a, b):
    with np.errstate(over="ignore"):
        return (g[b] - g[a]) * ipw[a]


class _HashIndex:
    """Position of each 64-bit key, for millions of queries at once.

    A direct-mapped table on the low bits answers almost every query with one
    gather; keys that share a slot go to a small sorted spill array.
    (Sorting the queries for searchsorted instead costs ~3x more.)
    """

    def __init__(self, keys: np.ndarray):
        self.keys = keys
        bits = max(10, int(len(keys) * 8).bit_length())
        self.mask = np.uint64((1 << bits) - 1)
        slot = (keys & self.mask).astype(np.int64)
        self.table = np.full(1 << bits, -1, dtype=np.int32)      # int32: half the cache misses
        self.table[slot] = np.arange(len(keys), dtype=np.int32)
        counts = np.bincount(slot, minlength=1 << bits)
        self.shared = counts > 1
        spill = np.flatnonzero(self.shared[slot])
        self.spill_order = spill[np.argsort(keys[spill], kind="stable")]
        self.spill_keys = keys[self.spill_order]

    def __call__(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index of each query among the keys, found mask); whole-array ops, no masked gathers."""
        slot = (queries & self.mask).astype(np.int64)
        found = self.table[slot]
        index = np.maximum(found, 0).astype(np.int64)
        hit = (found >= 0) & (self.keys[index] == queries)
        if len(self.spill_keys):
            retry = np.flatnonzero(~hit & self.shared[slot])
            if len(retry):
                j = np.minimum(np.searchsorted(self.spill_keys, queries[retry]), len(self.spill_keys) - 1)
                same = self.spill_keys[j] == queries[retry]
                index[retry[same]] = self.spill_order[j[same]]
                hit[retry[same]] = True
        return index, hit


def merges_from_ranks(tokens: list[str], eligible: np.ndarray, rank: np.ndarray) -> list[tuple[str, str]]:
    """All (left, right) with left, right, left+right eligible tokens, best rank first.

    `eligible`: token ids that may take part; `rank`: per token id, lower
    merges earlier (ties by id).  The splits of one token are ordered by
    the left part's id, as the HF converters order them.
    """
    ids = np.asarray(eligible, dtype=np.int64)
    if len(ids) == 0:
        return []
    table = np.empty(len(tokens), dtype=object)    # an object array gathers 2x faster than a list
    table[:] = tokens
    texts = table[ids].tolist()
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    if not lens.any():
        return []               # only empty tokens: nothing to split (and no chars to hash)
    if int(np.maximum(lens - 1, 0).sum()) > MAX_SPLITS:
        raise TokenizerError(f"the vocabulary's tokens have {int(np.maximum(lens - 1, 0).sum())} split points, "
                             f"more than the {MAX_SPLITS} a merge table is derived from")
    # +1 so that U+0000 still changes a hash.
    codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64) + 1
    starts = np.zeros(len(texts), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    ends = starts + lens
    g, ipw = _hash_table(codes)
    find = _HashIndex(_substring_hash(g, ipw, starts, ends))

    n_splits = np.maximum(lens - 1, 0)
    owner = np.repeat(np.arange(len(texts)), n_splits)            # which token each split belongs to
    first = np.zeros(len(texts), dtype=np.int64)
    np.cumsum(n_splits[:-1], out=first[1:])
    cut = np.arange(len(owner)) - first[owner] + 1                # left length, 1..len-1
    split_at = starts[owner] + cut

    def lookup(h, want_len):
        local, ok = find(h)
        # Equal hash and equal length: a false match needs a 64-bit collision.
        ok &= lens[local] == want_len
        return local, ok

    left, ok = lookup(_substring_hash(g, ipw, starts[owner], split_at), cut)
    owner, split_at, cut, left = owner[ok], split_at[ok], cut[ok], left[ok]
    right, ok = lookup(_substring_hash(g, ipw, split_at, ends[owner]), lens[owner] - cut)
    target, left, right = ids[owner[ok]], ids[left[ok]], ids[right[ok]]
    merged_chars = int(lens[owner[ok]].sum())
    if merged_chars > MAX_MERGED_CHARS:
        raise TokenizerError(f"the vocabulary derives {len(target)} merges of {merged_chars} chars, more than "
                             f"the {MAX_MERGED_CHARS} a tokenizer is built with (long tokens split many ways)")
    # One int64 key instead of a lexsort: the target's place in rank order
    # (ties by id), then the left part's id; the right part follows from both.
    n = len(tokens)
    place = np.empty(n, dtype=np.int64)
    place[np.argsort(np.asarray(rank), kind="stable")] = np.arange(n)
    by_rank = np.argsort(place[target] * n + left, kind="stable")
    return list(zip(table[left[by_rank]].tolist(), table[right[by_rank]].tolist()))

"""Which tokens each KV-cache slot holds, so a new request can start from a shared prefix.

A slot's keys/values stay valid after its sequence ends. When a request arrives
we look for the slot (free or busy) whose cached tokens share the longest
prefix with the new prompt:
  - a free slot: take it and keep its cache in place (nothing to copy);
  - a busy slot: take a free slot and copy the shared prefix's KV into it.
Otherwise the least recently used free slot is overwritten. A system prompt
used by many requests is therefore computed once and then copied.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models.images import image_keys, images_agree


@dataclass
class Placement:
    slot: int          # the slot the new sequence will use
    reuse: int         # prompt tokens whose KV is already (or will be copied) in that slot
    copy_from: int     # slot to copy the first `reuse` positions from, or -1 (in place / nothing)


class SlotTable:
    def __init__(self, n_slots: int, min_reuse: int = 4):
        self.n_slots = n_slots
        self.min_reuse = min_reuse           # shorter shared prefixes are not worth a copy
        # tokens[s][:valid[s]] are the tokens whose KV slot s holds at positions 0..valid-1.
        # For a busy slot the list is the running sequence's own token list (it grows).
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        # the image blocks among them (models/images.py): ids alone do not tell two images apart
        self.images: list[tuple] = [() for _ in range(n_slots)]
        self.valid = [0] * n_slots
        self.busy = [False] * n_slots
        self._last_used = [0] * n_slots
        self._clock = 0

    def n_free(self) -> int:
        return self.busy.count(False)

    def _shared(self, s: int, prompt: list[int], limit: int, images: tuple = ()) -> int:
        held = self.tokens[s]
        n = min(self.valid[s], limit)
        i = 0
        while i < n and held[i] == prompt[i]:
            i += 1
        return images_agree(i, self.images[s], images)

    def place(self, prompt: list[int], reuse: bool = True, images: tuple = ()) -> Placement | None:
        """Choose a free slot for `prompt` (None when all are busy). Does not mark it busy.

        reuse=False: evaluate the whole prompt (its logits at every position are wanted).
        images: the prompt's image blocks: a slot's prefix is shared only up to where its images differ.
        """
        free = [s for s in range(self.n_slots) if not self.busy[s]]
        if not free:
            return None
        # The last prompt token is always evaluated (its logits start generation).
        limit = len(prompt) - 1 if reuse else 0
        best, best_len = -1, 0
        for s in range(self.n_slots):
            n = self._shared(s, prompt, limit, images)
            # on a tie prefer a free slot: reuse in place beats a copy
            if n > best_len or (n == best_len and n > 0 and self.busy[best] and not self.busy[s]):
                best, best_len = s, n
        if best_len >= self.min_reuse and not self.busy[best]:
            return Placement(best, best_len, -1)
        # Evict: an empty slot first, else the least recently used one.
        victim = min(free, key=lambda s: (self.valid[s] > 0, self._last_used[s]))
        if best_len >= self.min_reuse:
            return Placement(victim, best_len, best)
        return Placement(victim, 0, -1)

    def acquire(self, slot: int, tokens: list[int], valid: int, images: tuple = ()) -> None:
        """Mark the slot busy; `tokens` is the sequence's (growing) token list, `images` its image blocks."""
        self.busy[slot] = True
        self.tokens[slot] = tokens
        self.images[slot] = image_keys(images)
        self.valid[slot] = valid

    def set_valid(self, slot: int, valid: int) -> None:
        self.valid[slot] = valid

    def release(self, slot: int) -> None:
        """The sequence left; its KV stays cached under a snapshot of its tokens."""
        self.busy[slot] = False
        self.tokens[slot] = list(self.tokens[slot][:self.valid[slot]])
        self._clock += 1
        self._last_used[slot] = self._clock

    def forget(self, slot: int) -> None:
        """The slot's content is unknown (e.g. a failed step): cache nothing."""
        self.busy[slot] = False
        self.tokens[slot] = []
        self.images[slot] = ()
        self.valid[slot] = 0

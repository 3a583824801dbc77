"""What a model's close() leaves of its network: a few facts about it, and a typed error for the rest."""
from __future__ import annotations

from ..errors import ModelClosedError


class Closable:
    """A network (a decoder's Transformer, an encoder) whose close() drops its arrays (weights, KV cache,
    workspace, recorded plans) at once, while references to it may live on: a generator suspended
    mid-stream, a target model's drafter, a caller's own. Reading a dropped attribute afterwards raises
    ModelClosedError: nothing computes on a closed network, and no freed memory is reachable from it."""

    KEPT_BY_CLOSE = ("cfg", "backend", "n_ctx", "n_slots")     # small, and asked of a closed model
    closed = False

    def close(self) -> None:
        kept = {k: v for k, v in vars(self).items() if k in self.KEPT_BY_CLOSE}
        vars(self).clear()          # the last references to the arrays: CPython frees them now
        vars(self).update(kept, closed=True)

    def __getattr__(self, name: str):
        # reached only when the usual lookup fails: an attribute close() dropped, or a real typo
        if vars(self).get("closed"):
            raise ModelClosedError(f"the model was closed: its {name} was freed")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

"""The request routers living in this process (the ingress), for its /metrics: which replicas they
route to, what each last reported, and how requests were placed."""
from __future__ import annotations

import weakref
from collections import Counter

_LIVE: "weakref.WeakSet" = weakref.WeakSet()


def register(router) -> None:
    _LIVE.add(router)


def live_replicas() -> dict[str, dict]:
    """Replica id -> the routing stats it last reported."""
    out: dict[str, dict] = {}
    for router in list(_LIVE):
        for replica in router.curr_replicas.values():
            out[replica.replica_id.unique_id] = dict(replica.routing_stats or {})
    return out


def decisions() -> Counter:
    total: Counter = Counter()
    for router in list(_LIVE):
        total.update(router.decisions)
    return total

"""Ray Serve request routers for the engine deployment (Ray's RequestRouter API): prefix-aware, and
round-robin as the baseline it is measured against. They run in the process holding the handle (the
ingress) and register there (router_state), so the ingress reads the replicas' stats for /metrics.
Ray pickles this module by value into that process: state shared with others lives elsewhere."""
from __future__ import annotations

from collections import Counter
from typing import Any, List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import router_state
from .forwarding import ForwardedRequest, stored_on
from .prefix_policy import TABLE_CAPACITY, PrefixTable, by_load, rank


def _forwarded(pending: Optional[PendingRequest]) -> ForwardedRequest | None:
    if pending is None or not pending.args or not isinstance(pending.args[0], ForwardedRequest):
        return None
    return pending.args[0]


def _keys(pending: Optional[PendingRequest]) -> list[bytes]:
    req = _forwarded(pending)
    return req.prefix if req is not None else []


def _pinned(candidates: List[RunningReplica], pending: Optional[PendingRequest]) -> RunningReplica | None:
    """The replica holding the stored response the request names (only it can answer), if it runs."""
    req = _forwarded(pending)
    if req is None or req.replica_tag is None:
        return None
    by_unique = {r.replica_id.unique_id: r for r in candidates}
    found = stored_on(req.replica_tag, by_unique)
    return by_unique[found] if found is not None else None


class _LlambdaRouter(RequestRouter):
    def initialize_state(self, slots: int = 1, **_: Any) -> None:
        self.slots = slots
        self.decisions: Counter[str] = Counter()   # how requests were placed, for /metrics
        router_state.register(self)

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        """A request naming a stored response goes to its replica (a gone one's id: anywhere, which
        answers 404 saying so); the others as the policy ranks them. Every rank full: back off, retry."""
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        pinned = _pinned(candidate_replicas, pending_request)
        if pinned is not None:
            return [[pinned]]
        return self.ranked(candidate_replicas, pending_request)

    def ranked(self, candidate_replicas: List[RunningReplica],
             pending_request: Optional[PendingRequest]) -> List[List[RunningReplica]]:
        raise NotImplementedError

    def _loads(self, candidates: List[RunningReplica]) -> dict[ReplicaID, int | None]:
        cache = self.replica_queue_len_cache
        return {r.replica_id: cache.get(r.replica_id) for r in candidates}


class PrefixAwareRouter(_LlambdaRouter):
    """The replica that last got this prompt's prefix while it has a free slot; else the least loaded."""

    def initialize_state(self, slots: int = 1, capacity: int = TABLE_CAPACITY, **kw: Any) -> None:
        super().initialize_state(slots=slots, **kw)
        self.table = PrefixTable(capacity)

    def ranked(self, candidate_replicas: List[RunningReplica],
             pending_request: Optional[PendingRequest]) -> List[List[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        groups, _ = rank(self.table, _keys(pending_request), self._loads(candidate_replicas), self.slots)
        return [[by_id[i] for i in group] for group in groups if group]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        keys = _keys(pending_request)
        if not keys:
            self.decisions["no_prefix"] += 1
            return
        owner, _ = self.table.owner(keys, self.curr_replicas.keys())
        self.decisions["prefix_owner" if owner == replica_id else "new_prefix" if owner is None
                       else "owner_busy"] += 1
        self.table.record(keys, replica_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id)


class RoundRobinRouter(_LlambdaRouter):
    """Each request to the next replica in turn (the next one with room when that one is full)."""

    def initialize_state(self, slots: int = 1, **kw: Any) -> None:
        super().initialize_state(slots=slots, **kw)
        self._turn = 0

    def ranked(self, candidate_replicas: List[RunningReplica],
             pending_request: Optional[PendingRequest]) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        nxt = ordered[self._turn % len(ordered)]
        self._turn += 1
        by_id = {r.replica_id: r for r in candidate_replicas}
        return [[nxt], [by_id[i] for i in by_load(self._loads(candidate_replicas))]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        self.decisions["round_robin"] += 1


# Ray takes a router by import path (a class it would turn into one)
ROUTERS = {"prefix": f"{__name__}:PrefixAwareRouter", "round_robin": f"{__name__}:RoundRobinRouter"}

"""One Ray Serve replica: a llambda engine (model, scheduler) serving the app `llambda serve` runs,
called in-process with what the ingress forwards. Ray restarts it when it dies or fails check_health."""
from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator

from .asgi_call import call_asgi
from .forwarding import ForwardedRequest, replica_tag
from .options import ScaleoutOptions


class EngineReplica:
    async def __init__(self, options: dict):
        from ray import serve

        from ..api import load
        from ..server.app import create_app

        opts = ScaleoutOptions.from_dict(options)
        self.cfg = opts.server_config()
        # the router holds what no slot takes; a small queue here keeps the next request ready
        self.cfg.queue_size = self.cfg.parallel
        # its stored responses' ids carry its tag: the ingress's router sends requests naming them here
        self.cfg.replica_tag = replica_tag(serve.get_replica_context().replica_id.unique_id)
        self.model = load(opts.model, threads=opts.threads_per_replica, n_slots=self.cfg.parallel + 1,
                          **opts.load)
        self.cfg.aliases |= {self.model.name, Path(opts.model).name, Path(opts.model).stem, opts.model}
        self.cfg.aliases.discard(self.cfg.model_id)
        self.app = create_app(self.model, self.cfg)
        self.scheduler = self.app.state.scheduler     # None for an encoder (embeddings: no generation)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()     # starts the scheduler thread

    async def handle(self, req: ForwardedRequest) -> AsyncIterator[dict | bytes]:
        """The response head ({"status", "headers"}), then body chunks (SSE events as generated)."""
        async for item in call_asgi(self.app, req):
            yield item

    def record_routing_stats(self) -> dict:
        """Called by Ray Serve every request_routing_stats_period_s; the ingress sums `metrics`."""
        render = getattr(self.app.state, "render_metrics", None)
        text = render() if render is not None else self.app.state.metrics.render({})
        return {"metrics": text, "pid": os.getpid()}

    def check_health(self) -> None:
        """Ray Serve's health check: raising marks the replica unhealthy, and Ray replaces it."""
        if self.scheduler is None:
            return
        reason = self.scheduler.health(self.cfg.stall_timeout)
        if reason is not None and not self.scheduler.draining:
            raise RuntimeError(reason)

    async def __del__(self):
        await self._lifespan.__aexit__(None, None, None)
        self.model.close()

"""What a Ray Serve deployment of llambda is made of: plain data, from `llambda serve --ray` flags or
from the `args` of a Serve config file, checked before anything starts."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInputError
from ..server.config import ServerConfig

ROUTINGS = ("prefix", "round_robin")


@dataclass
class ScaleoutOptions:
    model: str                                   # catalogued name (pulled on each node) or a path every node has
    replicas: int = 2                            # fixed replica count (without min/max)
    min_replicas: int | None = None              # with max_replicas: Ray Serve autoscales between them
    max_replicas: int | None = None
    threads_per_replica: int = 1                 # each replica's compute threads (and the CPUs Ray reserves)
    routing: str = "prefix"                      # "prefix": prefix-aware; "round_robin": the baseline
    queue_size: int = 64                         # requests held while every replica is full; beyond: 429
    health_check_period_s: float = 5.0
    autoscaling_config: dict[str, Any] = field(default_factory=dict)   # Ray Serve's, over our defaults
    load: dict[str, Any] = field(default_factory=dict)     # llambda.load keyword arguments
    server: dict[str, Any] = field(default_factory=dict)   # ServerConfig fields of every replica's app

    @classmethod
    def from_dict(cls, args: dict[str, Any]) -> "ScaleoutOptions":
        if not isinstance(args, dict):
            raise InvalidInputError("the application's args must be a mapping")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise InvalidInputError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "model" not in args:
            raise InvalidInputError("the option 'model' is required (a catalogued name or a model path)")
        opts = cls(**args)
        opts.check()
        return opts

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def slots(self) -> int:
        return self.server_config().parallel

    def server_config(self) -> ServerConfig:
        fields = dict(self.server)
        fields["aliases"] = set(fields.get("aliases") or ())
        return ServerConfig(**fields)

    def check(self) -> None:
        def positive(name, value):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1, not {value!r}")

        if not isinstance(self.model, str) or not self.model:
            raise InvalidInputError("model must be a non-empty string")
        positive("replicas", self.replicas)
        positive("threads_per_replica", self.threads_per_replica)
        if not isinstance(self.queue_size, int) or self.queue_size < 0:
            raise InvalidInputError(f"queue_size must be an integer >= 0, not {self.queue_size!r}")
        if self.autoscaling:
            lo, hi = self.min_replicas, self.max_replicas
            if lo is None or hi is None:
                raise InvalidInputError("autoscaling needs both min_replicas and max_replicas")
            if not isinstance(lo, int) or not isinstance(hi, int) or lo < 1 or hi < lo:
                raise InvalidInputError(f"need 1 <= min_replicas <= max_replicas, not {lo!r} and {hi!r}")
        if self.routing not in ROUTINGS:
            raise InvalidInputError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        if not all(isinstance(m, dict) for m in (self.load, self.server, self.autoscaling_config)):
            raise InvalidInputError("load, server and autoscaling_config must be mappings")
        try:
            cfg = self.server_config()
        except (TypeError, InvalidInputError) as e:     # an unknown field; template_kwargs it refuses
            raise InvalidInputError(f"server: {e}") from None
        positive("server.parallel", cfg.parallel)
        if not self.health_check_period_s > 0:
            raise InvalidInputError("health_check_period_s must be > 0")

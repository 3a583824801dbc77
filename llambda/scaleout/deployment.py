"""The Ray Serve application: an ingress deployment in front of N engine replicas.

`build(opts)` is what `llambda serve --ray` runs; `app_builder` is the import path a Serve config
file names (`import_path: llambda.scaleout.deployment:app_builder`, the options under `args`)."""
from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from .ingress import IngressServer
from .options import ScaleoutOptions
from .replica import EngineReplica
from .routers import ROUTERS

APP_NAME = "llambda"
ROUTING_STATS_PERIOD_S = 1.0     # how fresh /metrics is (each replica reports this often)
INGRESS_MAX_ONGOING = 1024       # streams one ingress replica relays at once


def engine_deployment_options(opts: ScaleoutOptions) -> dict[str, Any]:
    slots = opts.slots
    options: dict[str, Any] = dict(
        name="LlambdaEngine",
        ray_actor_options={"num_cpus": opts.threads_per_replica},
        # a replica takes its slots and as many queued; the router holds the rest, up to queue_size
        max_ongoing_requests=2 * slots,
        max_queued_requests=opts.queue_size,
        health_check_period_s=opts.health_check_period_s,
        health_check_timeout_s=max(30.0, opts.health_check_period_s),
        graceful_shutdown_timeout_s=opts.server_config().shutdown_grace,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTERS[opts.routing], request_router_kwargs={"slots": slots},
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S),
    )
    if opts.autoscaling:
        # Ray Serve's autoscaler, on ongoing requests (running + queued) per replica: more than its
        # slots means requests wait, so it adds replicas. Serve's defaults (30 s of look-back and of
        # delay before adding one) are slow for waiting prompts; a replica is given back after 5 idle minutes.
        options["autoscaling_config"] = {"min_replicas": opts.min_replicas, "max_replicas": opts.max_replicas,
                                         "initial_replicas": opts.min_replicas, "target_ongoing_requests": slots,
                                         "upscale_delay_s": 10.0, "look_back_period_s": 10.0,
                                         "downscale_delay_s": 300.0, **opts.autoscaling_config}
    else:
        options["num_replicas"] = opts.replicas
    return options


def build(opts: ScaleoutOptions):
    engine = serve.deployment(EngineReplica, **engine_deployment_options(opts)).bind(opts.to_dict())
    ingress = serve.deployment(IngressServer, name="LlambdaIngress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING)
    return ingress.bind(engine, opts.to_dict())


def app_builder(args: dict[str, Any]):
    """For `serve run` / `serve deploy` config files."""
    return build(ScaleoutOptions.from_dict(dict(args)))

"""`llambda serve --ray ...`: the flags, and turning them (with the flags `serve` already has) into
ScaleoutOptions. Imports nothing of Ray until the command runs."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .options import ROUTINGS, ScaleoutOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale-out under Ray Serve (needs the [ray] extra)")
    g.add_argument("--ray", action="store_true",
                   help="run replicas under Ray Serve with prefix-aware routing (a local Ray on 127.0.0.1, "
                        "or the cluster at --ray-address)")
    g.add_argument("--replicas", type=int, default=2, help="engine replicas (default 2)")
    g.add_argument("--threads-per-replica", type=int, default=None,
                   help="compute threads of each replica (default: -t, else 1)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscale from this many replicas ...")
    g.add_argument("--max-replicas", type=int, default=None, help="... to this many, on queue depth")
    g.add_argument("--ray-address", default=None, help="connect to this Ray cluster instead of starting one")
    g.add_argument("--ray-routing", choices=ROUTINGS, default="prefix",
                   help="prefix (default): a prompt's prefix goes where it is cached; round_robin: the baseline")
    g.add_argument("--write-ray-config", metavar="FILE", default=None,
                   help="write a Serve config file (for `serve deploy`) from these flags and exit")


def options_from_args(a: argparse.Namespace, cfg, load_kw: dict) -> ScaleoutOptions:
    server = dataclasses.asdict(cfg)
    server["aliases"] = sorted(server["aliases"])
    opts = ScaleoutOptions(model=a.model, replicas=a.replicas, min_replicas=a.min_replicas,
                           max_replicas=a.max_replicas, threads_per_replica=a.threads_per_replica or a.threads or 1,
                           routing=a.ray_routing, queue_size=cfg.queue_size,
                           load={k: v for k, v in load_kw.items() if v is not None}, server=server)
    opts.check()
    return opts


def run(a: argparse.Namespace, cfg, load_kw: dict) -> int:
    opts = options_from_args(a, cfg, load_kw)
    from . import launch

    if a.write_ray_config:
        Path(a.write_ray_config).write_text(launch.config_yaml(opts, a.host, a.port), encoding="utf-8")
        print(f"[llambda] wrote {a.write_ray_config}; run it with `serve run {a.write_ray_config}` or "
              f"`serve deploy {a.write_ray_config}`")
        return 0
    return launch.serve_until_signal(opts, a.host, a.port, a.ray_address)

"""Starting Ray and the application: a local Ray bound to loopback with the dashboard off, or an
existing cluster (`--ray-address`); and the Serve config file for `serve deploy`."""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from ..errors import LlambdaError
from .options import ScaleoutOptions

# Ray reports usage to its authors unless told not to; nothing here may talk to another address.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def worker_env() -> dict:
    """Ray's runtime_env: workers import the llambda this process imported (a source checkout too),
    and keep BLAS to one thread beside our own pool."""
    import llambda

    root = str(Path(llambda.__file__).resolve().parent.parent)
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "OPENBLAS_NUM_THREADS": "1",
                         "RAY_USAGE_STATS_ENABLED": "0"}}


def start_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to the cluster at `address`, or start a one-node Ray on loopback."""
    host = (address or "127.0.0.1").rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        # Ray's single-node mode (named for Windows and macOS, where it is the default): this node's
        # address is 127.0.0.1, so its servers listen on loopback only (else Ray swaps in the host's
        # external address, even for a cluster at 127.0.0.1)
        os.environ[LOOPBACK_SWITCH] = "0"          # for the processes Ray starts
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False     # read at import: this process may have imported ray already
    import ray

    if address:
        try:
            ray.init(address=address, runtime_env=worker_env(), log_to_driver=False)
        except (ConnectionError, RuntimeError) as e:
            raise LlambdaError(f"cannot connect to the Ray cluster at {address}: {e} (a cluster with token "
                               "authentication, Ray's default, also needs RAY_AUTH_MODE=token and its token)") from None
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=worker_env(), log_to_driver=False)


def deploy(opts: ScaleoutOptions, host: str = "127.0.0.1", port: int = 8000, name: str | None = None,
           route_prefix: str = "/"):
    """Start Serve's HTTP proxy on host:port (if not yet) and run the application under route_prefix;
    returns once its replicas are up."""
    from ray import serve

    from .deployment import APP_NAME, build

    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
    return serve.run(build(opts), name=name or APP_NAME, route_prefix=route_prefix)


def stop(app_only: str | None = None) -> None:
    """Shut Serve and the local Ray down; on a shared cluster (app_only), remove only that application
    and disconnect, leaving Serve and the other applications running."""
    import ray
    from ray import serve

    try:
        if app_only:
            serve.delete(app_only)
        else:
            serve.shutdown()
    finally:
        ray.shutdown()


def cpus_needed(opts: ScaleoutOptions) -> int:
    most = opts.max_replicas if opts.autoscaling else opts.replicas
    return max(os.cpu_count() or 1, most * opts.threads_per_replica)


def serve_until_signal(opts: ScaleoutOptions, host: str, port: int, address: str | None) -> int:
    print(f"[llambda] {'connecting to Ray at ' + address if address else 'starting Ray on 127.0.0.1'}, then "
          f"loading {opts.model} in each replica", file=sys.stderr, flush=True)
    start_ray(address, None if address else cpus_needed(opts))
    try:
        deploy(opts, host, port)        # Ctrl-C meanwhile: KeyboardInterrupt, and Ray stops below
        scaling = (f"{opts.min_replicas}-{opts.max_replicas} replicas (autoscaled)" if opts.autoscaling
                   else f"{opts.replicas} replicas")
        print(f"[llambda] serving {opts.model} under Ray Serve on http://{host}:{port}/v1: {scaling} of "
              f"{opts.threads_per_replica} thread(s) and {opts.slots} slots, {opts.routing} routing",
              file=sys.stderr, flush=True)
        stop_now = threading.Event()
        previous = {s: signal.signal(s, lambda *_: stop_now.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            stop_now.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return 0
    finally:
        from .deployment import APP_NAME

        stop(app_only=APP_NAME if address else None)


def config_yaml(opts: ScaleoutOptions, host: str, port: int) -> str:
    """A Serve config file (`serve deploy FILE` on a cluster, `serve run FILE` on one machine)."""
    import yaml

    args = opts.to_dict()
    args["server"] = {k: v for k, v in args["server"].items() if k not in ("host", "port", "api_key")}
    doc = {"proxy_location": "EveryNode", "http_options": {"host": host, "port": port},
           "applications": [{"name": "llambda", "route_prefix": "/",
                             "import_path": "llambda.scaleout.deployment:app_builder", "args": args}]}
    return ("# llambda under Ray Serve: `serve deploy` this file to a cluster whose nodes have llambda\n"
            "# installed (pip install \"llambda-engine[ray]\"); see docs/SCALEOUT.md. An API key goes in\n"
            "# args.server.api_key, or better in the runtime_env of the cluster, not in this file.\n"
            + yaml.safe_dump(doc, sort_keys=False))

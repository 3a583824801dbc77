"""Run the app under uvicorn, with a graceful SIGTERM/SIGINT.

On the first signal uvicorn stops accepting connections and waits for in-flight
requests; we also tell the scheduler to drain: queued and running sequences may
finish within `shutdown_grace` seconds, after which they are cancelled and their
streams end with an error event and `data: [DONE]` (non-streaming requests get
a 503). A second SIGINT (Ctrl-C again) during that wait ends the process at once: one line on stderr
and status 130, as a program interrupted by SIGINT ends (uvicorn's own forced exit re-raised both
signals into asyncio, which cancelled the app's tasks mid-await and printed their tracebacks).

The listening socket and uvicorn's HTTP protocol come from guard.py (the connection
cap, the request-head deadline, shedding when out of descriptors), and the server's
loggers are rate-limited for the process's lifetime.
"""
from __future__ import annotations

import os
import signal
import sys

import uvicorn

from . import guard
from .accesslog import log_config
from .app import create_app
from .config import ServerConfig, url_host

EXIT_SIGINT = 128 + signal.SIGINT       # the shell's status of a program ended by SIGINT


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, scheduler, grace: float):
        super().__init__(config)
        self._scheduler = scheduler
        self._grace = grace

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGINT and self.should_exit:
            running = len(self.server_state.connections)
            print(f"llambda serve: interrupted again: exiting now, without waiting for {running} open "
                  "connection(s)", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_SIGINT)
        if self._scheduler is not None:     # an encoder's app has no scheduler
            self._scheduler.drain(self._grace)
        super().handle_exit(sig, frame)


def serve(model, cfg: ServerConfig, log_level: str = "info") -> int:
    app = create_app(model, cfg)
    scheduler = app.state.scheduler
    max_conn = cfg.max_connections or guard.default_max_connections(cfg.parallel, cfg.queue_size)
    if max_conn > guard.fd_limit() - guard.FD_RESERVE:
        print(f"llambda serve: warning: --max-connections {max_conn} is near or over the open-file limit "
              f"({guard.fd_limit()}); out of descriptors, new connections get 503", file=sys.stderr)
    try:
        sock = guard.listening_socket(cfg.host, cfg.port, app.state.metrics)
    except OSError as e:
        print(f"llambda serve: could not start on {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 1
    if cfg.port == 0:       # the kernel picked the port: say which (the URLs printed so far say :0)
        print(f"[llambda] --port 0: listening on http://{url_host(cfg.host)}:{sock.getsockname()[1]}/",
              file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=cfg.shutdown_grace + 5.0, access_log=False,
                            timeout_keep_alive=5, log_config=log_config(cfg.log_format, log_level),
                            http=guard.protocol_class(max_conn, cfg.header_timeout, app.state.metrics,
                                                      cfg.send_timeout))
    server = _Server(config, scheduler, cfg.shutdown_grace)
    limiter = guard.limit_logs()
    # uvicorn re-raises the signal it caught once it has shut down; with a no-op handler
    # for SIGTERM in place that re-raise is harmless and we exit with status 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        guard.unlimit_logs(limiter)
        sock.close()
    if not server.started:
        print(f"llambda serve: could not start on {cfg.host}:{cfg.port}", file=sys.stderr)
        return 1
    return 0

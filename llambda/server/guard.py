"""What keeps slow, idle or too many clients from exhausting `llambda serve`.

- A cap on open connections: one over the cap is answered 503 at once and never reaches the app.
  (uvicorn's `limit_concurrency` answers 503 only once a request head has arrived, so connections
  that send nothing would still pile up.) It is not closed on the request its client sent meanwhile:
  closing on unread bytes resets the connection, and the client loses the 503 (a busy server's
  refusals all came out as resets). Its side is shut after the 503, what the client sends is read
  and dropped, and it closes when the client does, or after LINGER_SECONDS; as many linger at once as
  the descriptors above the cap allow, and one more is closed at once.
- A deadline for a client that reads nothing of its response: once the connection's write buffer is full
  (the transport has paused writing), the client has `send_timeout` seconds to read enough of it to let
  writing resume, or the connection is aborted. A client that never read a long stream held its
  connection and every answer event waiting to be sent (an n=4 stream with top_logprobs: ~17 MB) for as
  long as it kept the socket open; many such filled the connection cap and the memory.
- A deadline for each request head, from the connection's start or the previous response's end.
  (uvicorn's `timeout_keep_alive` starts only after a response and any byte received cancels it, so a
  client dribbling a header a byte at a time, or never sending one, would be held forever.) The body's
  deadline is the app's (`read_json`); h11 already refuses heads over 16 KiB.
- When descriptors run out, the listening socket keeps one in reserve to take the waiting connection,
  answer it 503 and close it. Without that, asyncio (3.11) retries a failing accept up to `backlog`
  times per wake-up, logging a traceback for each: megabytes of log per second.
- Warnings and errors are logged once per kind per minute, with a count of those left out.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import threading
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError
from .metrics import Metrics

log = logging.getLogger("llambda.server")

LINGER_SECONDS = 5.0      # a refused connection waits this long at most for its client (nginx lingers 5 s too)
FD_RESERVE = 32           # descriptors left for everything but client connections (model, logs, pipes)
RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
LOGGERS = ("llambda.server", "uvicorn.error", "asyncio")


def default_max_connections(parallel: int, queue_size: int) -> int:
    """Every running or queued sequence may hold a connection (a stream), twice over for clients
    waiting on a 429 or keeping idle connections, plus room for /health and /metrics; and never more
    than the open-file limit allows."""
    want = 2 * (parallel + queue_size) + 16
    return max(1, min(want, fd_limit() - FD_RESERVE))


def fd_limit() -> int:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    except (ImportError, OSError, ValueError):
        return 1024


def _canned(status: int, message: str, code: str) -> bytes:
    """A whole HTTP response, written without a request (the connection closes after it)."""
    body = APIError(status, message, code=code).json_bytes()
    phrase = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
    head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\nretry-after: 1\r\n\r\n" % (status, phrase, len(body)))
    return head + body


class RateLimitFilter(logging.Filter):
    """The first record of a kind goes through; then one per `interval` seconds at most, saying how many
    like it were left out. A kind: logger, the message's first line, the exception's type and errno.
    Only WARNING and above are limited."""

    def __init__(self, interval: float = 60.0, max_kinds: int = 256):
        super().__init__()
        self.interval = interval
        self.max_kinds = max_kinds
        self._kinds: dict[tuple, list] = {}     # kind -> [time last let through, left out since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        first_line = str(record.msg).split("\n", 1)[0][:200]
        kind = (record.name, first_line, type(exc).__name__ if exc else None, getattr(exc, "errno", None))
        now = time.monotonic()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.interval:
                seen[1] += 1
                return False
            left_out = seen[1] if seen else 0
            if seen is None and len(self._kinds) >= self.max_kinds:
                self._kinds.pop(next(iter(self._kinds)))      # bounded: forget the oldest kind
            self._kinds.pop(kind, None)
            self._kinds[kind] = [now, 0]
        if left_out:
            record.msg = f"{record.msg} [{left_out} more like this in the last {self.interval:g} s not logged]"
        return True


def limit_logs(interval: float = 60.0) -> RateLimitFilter:
    """Put one RateLimitFilter on the server's loggers (remove it with `unlimit_logs`)."""
    f = RateLimitFilter(interval)
    for name in LOGGERS:
        logging.getLogger(name).addFilter(f)
    return f


def unlimit_logs(f: RateLimitFilter) -> None:
    for name in LOGGERS:
        logging.getLogger(name).removeFilter(f)


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    """None, once `timer` (if any) is cancelled: what a disarmed timer attribute holds."""
    if timer is not None:
        timer.cancel()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the connection cap and the request-head deadline.

    Subclassed per server by `protocol_class`, which sets the three class attributes."""

    max_connections: int = 0
    header_timeout: float = 10.0
    send_timeout: float = 60.0
    metrics: Metrics | None = None
    linger_max: int = 0        # refused connections left to linger at once: the descriptors the cap leaves
    lingering = 0              # refused connections lingering now (the event loop's thread only)

    _refused = False
    _linger = None             # a refused connection's deadline to close
    _head_timer = None
    _head_started = False      # bytes of the awaited request head have arrived
    _stall_timer = None        # the write buffer is full: the client's deadline to read some of it

    def connection_made(self, transport) -> None:
        if len(self.connections) >= self.max_connections:
            self._refused = True
            transport.write(_canned(503, f"the server holds its limit of {self.max_connections} connections; "
                                         "retry later", "too_many_connections"))
            cls = type(self)
            if transport.can_write_eof() and cls.lingering < cls.linger_max:
                transport.write_eof()
                self._linger = self.loop.call_later(LINGER_SECONDS, transport.close)
                cls.lingering += 1
            else:              # out of room to linger: a reset is better than running out of descriptors
                transport.close()
            self._dropped("cap", "connection refused: %d connections open (--max-connections)",
                          len(self.connections))
            return
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        if self._refused:
            if self._linger is not None:
                self._linger.cancel()
                type(self).lingering -= 1
            return
        self._disarm_head_deadline()
        self._disarm_stall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None and not self._refused:
            self._stall_timer = self.loop.call_later(self.send_timeout, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_stall()

    def _disarm_stall(self) -> None:
        self._stall_timer = _cancelled(self._stall_timer)

    def _send_stalled(self) -> None:
        self._stall_timer = None
        if not self.transport.is_closing():     # abort: the buffered answer cannot be flushed, close() would wait
            sock = self.transport.get_extra_info("socket")
            try:            # a reset: the kernel drops what it still holds for the client (MBs) at once
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except (AttributeError, OSError):
                pass
            self.transport.abort()
            self._dropped("stalled", "aborted a connection whose client read none of its response for %g s",
                          self.send_timeout)

    def data_received(self, data: bytes) -> None:
        if self._refused:          # the request of a refused connection: read, so closing does not reset
            return
        if self._head_timer is not None:
            self._head_started = True
        super().data_received(data)

    def handle_events(self) -> None:
        scope = self.scope
        super().handle_events()
        if self.scope is not scope:        # h11 delivered a request head: it is in time
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        # armed first: the call below may parse a pipelined request at once (which disarms)
        if not self.transport.is_closing():
            self._arm_head_deadline()
        super().on_response_complete()

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_started = False
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_late)

    def _disarm_head_deadline(self) -> None:
        self._head_timer = _cancelled(self._head_timer)

    def _head_too_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_started:     # a request is under way: say why it ends (an idle keep-alive just closes)
            self.transport.write(_canned(408, f"the request head did not arrive within {self.header_timeout:g} s",
                                         "request_timeout"))
        self.transport.close()
        self._dropped("timeout", "closed a connection that sent no complete request head in %g s",
                      self.header_timeout)

    def _dropped(self, reason: str, msg: str, *args) -> None:
        if self.metrics is not None:
            self.metrics.connection_dropped(reason)
        log.warning(msg, *args)


def protocol_class(max_connections: int, header_timeout: float, metrics: Metrics | None,
                   send_timeout: float = GuardedH11Protocol.send_timeout) -> type:
    """The HTTP protocol class to give uvicorn.Config(http=...)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"max_connections": max_connections, "header_timeout": header_timeout, "metrics": metrics,
                 "send_timeout": send_timeout,
                 "linger_max": max(0, fd_limit() - FD_RESERVE - max_connections)})


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class ListeningSocket(socket.socket):
    """The server's listening socket; asyncio calls its accept(). Out of descriptors, it frees its spare
    one to take the waiting connection, answers it 503 and closes it, so nothing queues up and nothing
    spins. Without a spare (or out of memory), the error goes to asyncio once per wake-up, which pauses
    accepting for a second."""

    def __init__(self, family: int, metrics: Metrics | None = None):
        super().__init__(family, socket.SOCK_STREAM)
        self.metrics = metrics
        self._spare = _reserve_fd()
        self._failed_at = -1.0
        self._refusal = _canned(503, "the server is out of file descriptors; retry later", "out_of_resources")

    def accept(self):
        if time.monotonic() - self._failed_at < 0.1:
            raise BlockingIOError(errno.EAGAIN, "paused")   # asyncio's retry loop: stop it for this wake-up
        try:
            return super().accept()
        except OSError as e:
            if e.errno not in RESOURCE_ERRNOS:
                raise
            if e.errno in (errno.EMFILE, errno.ENFILE) and self._shed():
                if self.metrics is not None:
                    self.metrics.connection_dropped("fds")
                log.error("out of file descriptors (%s): answering new connections 503", e.strerror)
                raise BlockingIOError(errno.EAGAIN, "shed") from None
            self._failed_at = time.monotonic()
            raise

    def _shed(self) -> bool:
        """Take one waiting connection with the spare descriptor and refuse it."""
        if self._spare is None:
            self._spare = _reserve_fd()
            return False
        os.close(self._spare)
        self._spare = None
        try:
            conn, _ = super().accept()
        except OSError:
            self._spare = _reserve_fd()
            return False
        try:
            conn.setblocking(False)
            conn.send(self._refusal)
            conn.recv(65536)       # what the client already sent: closing on unread data would reset
        except OSError:
            pass
        finally:
            conn.close()
            self._spare = _reserve_fd()
        return True

    def close(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        super().close()


def listening_socket(host: str, port: int, metrics: Metrics | None = None) -> ListeningSocket:
    """Bound as uvicorn binds (SO_REUSEADDR), not yet listening: asyncio calls listen()."""
    sock = ListeningSocket(socket.AF_INET6 if ":" in host else socket.AF_INET, metrics)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock

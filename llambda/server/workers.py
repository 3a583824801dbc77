"""The threads that render and tokenize prompts, off the event loop.

Chat templates come from model files and a render may take up to its CPU budget (see
llambda.chat), so this pool is the server's own rather than asyncio's default executor:
  - its threads are daemons, so nothing a prompt does can hold the process after shutdown
    (the default executor's threads are joined at exit),
  - its backlog is bounded: beyond it a request gets 429 at once instead of a timeout; a request
    whose client has gone (its task cancelled) leaves the backlog at once and is never run,
  - it knows how long its oldest job has run, so /health can say when it is stuck.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable


class PoolFull(Exception):
    """Every worker is busy and the backlog is full."""


class PoolClosed(Exception):
    """The server is shutting down."""


def _settle(fut: asyncio.Future, result: Any, error: BaseException | None, abandoned=None) -> None:
    if fut.cancelled():
        if abandoned is not None:
            abandoned(result)
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class PromptWorkers:
    def __init__(self, n_workers: int, backlog: int, name: str = "prompt"):
        self.n_workers, self.backlog, self.name = n_workers, backlog, name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._started: dict[int, float] = {}     # worker thread id -> when its current job started
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"llambda-{name}-{i}", daemon=True)
                         for i in range(n_workers)]
        for t in self._threads:
            t.start()

    async def run(self, fn: Callable[..., Any], *args: Any, abandoned: Callable[[Any], None] | None = None) -> Any:
        """fn(*args) in a worker; raises PoolFull or PoolClosed without waiting. abandoned(result): called once
        when the caller left (its task cancelled) and the job will never hand it anything: at once for a job not
        begun (result None), else once the job has ended (its result, None if it raised)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            if self._closed:
                raise PoolClosed("the server is shutting down")
            if self._waiting >= self.backlog and len(self._started) >= self.n_workers:
                raise PoolFull(f"all {self.n_workers} {self.name} workers are busy and {self._waiting} requests wait")
            self._waiting += 1
        job = [fn, args, loop, fut, abandoned]
        self._jobs.put(job)
        try:
            return await fut
        except asyncio.CancelledError:      # the client has gone: a job still queued leaves the backlog now
            with self._lock:
                skipped = job[0] is not None
                if skipped:
                    job[0] = None           # (the worker skips it)
                    self._waiting -= 1
            if abandoned is not None:
                if skipped:
                    abandoned(None)
                elif fut.done() and not fut.cancelled():     # its result came, but this task was cancelled first
                    abandoned(fut.result() if fut.exception() is None else None)
            raise

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                fn, args, loop, fut, abandoned = job
                if fn is None:              # dropped while it waited: already out of the count
                    continue
                job[0] = None               # taken (out of the count): a cancellation now changes nothing
                self._waiting -= 1
                self._started[me] = time.monotonic()
            result, error = None, None
            try:
                if not fut.cancelled():      # the client may have gone while it waited
                    result = fn(*args)
            except BaseException as e:       # handed to the request's task, which raises it
                error = e
            finally:
                with self._lock:
                    self._started.pop(me, None)
            try:
                loop.call_soon_threadsafe(_settle, fut, result, error, abandoned)
            except RuntimeError:             # the loop is closed: nobody waits for this any more
                if abandoned is not None:
                    abandoned(result)
            del job, fn, args, result, error, abandoned

    def stats(self) -> dict[str, float]:
        with self._lock:
            oldest = min(self._started.values(), default=None)
            return {"busy": len(self._started), "waiting": self._waiting,
                    "oldest_seconds": 0.0 if oldest is None else time.monotonic() - oldest}

    def close(self) -> None:
        """No new jobs; idle workers exit (a busy one finishes its job, or dies with the process)."""
        with self._lock:
            self._closed = True
        for _ in self._threads:
            self._jobs.put(None)

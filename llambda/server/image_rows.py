"""The memory the server's requests hold in encoded image rows, bounded (`--image-rows-memory`).

An image's rows are float32 [tokens, width] (Qwen3-VL: width = the text width x (1 + DeepStack levels), 64 KiB a
token for Qwen3-VL-8B), made by the image worker and held by the request's sequences until their prompts are
prefilled. A request reserves its rows' bytes (known from the prompt's image tokens before any image is decoded,
Model.image_rows_bytes) before its images are encoded, waiting on the event loop (holding no worker, no lock the
scheduler takes) until the budget has room, first come first served; its `RowsLease` goes back when the last of
its sequences has let go of its rows (prefilled, or ended: the scheduler's Job.drop_images), or at once when the
request fails or leaves before its sequences are queued. A request larger than the whole budget is refused (400);
waiting requests are bounded (a 429 past `backlog`).
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque

MIN_DEFAULT = 2**30          # the default budget is at least 1 GiB ...
FULL_REQUESTS = 4            # ... and at least this many requests whose images fill the whole context


def image_width(model) -> int:
    """The width of the model's image rows (Transformer.image_width: Qwen3-VL's DeepStack columns too)."""
    return int(getattr(getattr(model, "transformer", None), "image_width", 0) or 0)


def default_budget(n_ctx: int, width: int) -> int:
    """max(4 full-context requests' rows, 1 GiB): a request's rows are fewer than n_ctx, so four always fit."""
    return max(FULL_REQUESTS * int(n_ctx) * int(width) * 4, MIN_DEFAULT)


def budget_bytes(model, configured: int | None) -> int:
    """The budget a server of `model` keeps: the configured one (--image-rows-memory), else the default."""
    return configured or default_budget(model.n_ctx, image_width(model))


class RowsTooLarge(Exception):
    """A request's rows alone pass the whole budget."""


class RowsBacklogFull(Exception):
    """As many requests as the backlog already wait for room."""


class RowsBudget:
    """Bytes reserved by requests (`held`) never past `limit`; any thread releases, the event loop waits."""

    def __init__(self, limit: int, backlog: int, on_wait=None):
        self.limit, self.backlog = int(limit), int(backlog)
        self.on_wait = on_wait                      # called (event loop) for each request that has to wait for room
        self._lock = threading.Lock()
        self.held = 0
        self._waiters: deque[list] = deque()        # [nbytes, loop, future, granted], first come first

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"held": self.held, "limit": self.limit, "waiting": len(self._waiters)}

    async def reserve(self, nbytes: int) -> "RowsLease":
        """A lease on `nbytes`, once they fit beside what is held (after every earlier waiter). Raises
        RowsTooLarge (past the limit alone) or RowsBacklogFull at once; a cancelled wait holds nothing."""
        nbytes = int(nbytes)
        if nbytes > self.limit:
            raise RowsTooLarge(f"this request's images are {_mib(nbytes)} of encoded rows; this server holds at most "
                               f"{_mib(self.limit)} of them at once (--image-rows-memory)")
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and self.held + nbytes <= self.limit:
                self.held += nbytes
                return RowsLease(self, nbytes)
            if len(self._waiters) >= self.backlog:
                raise RowsBacklogFull(f"{len(self._waiters)} requests wait for room for their images' rows "
                                      f"({_mib(self.held)} of {_mib(self.limit)} held)")
            w = [nbytes, loop, loop.create_future(), False]
            self._waiters.append(w)
        if self.on_wait is not None:
            self.on_wait()
        try:
            await w[2]
        except asyncio.CancelledError:
            with self._lock:
                if w[3]:                    # granted just as the client left: given back
                    self.held -= nbytes
                else:
                    self._waiters.remove(w)
                settle = self._grant_locked()     # a waiter ahead that left may let the next ones in
            _settle(settle)
            raise
        return RowsLease(self, nbytes)

    def _give_back(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes
            settle = self._grant_locked()
        _settle(settle)

    def _grant_locked(self) -> list:
        """Grant the waiters at the head that fit now (in order: a large one is not passed by smaller ones)."""
        out = []
        while self._waiters and self.held + self._waiters[0][0] <= self.limit:
            w = self._waiters.popleft()
            w[3] = True
            self.held += w[0]
            out.append(w)
        return out


def _settle(granted: list) -> None:
    for _, loop, fut, _ in granted:
        try:
            loop.call_soon_threadsafe(_wake, fut)
        except RuntimeError:        # its loop is closed: nobody waits (its bytes stay held: the server is gone)
            pass


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class RowsLease:
    """One request's reserved bytes: shared by `holders` sequences (share), each letting go once (let_go), or given
    back whole at once (release); the bytes go back exactly once, whichever comes first."""

    def __init__(self, budget: RowsBudget, nbytes: int):
        self.budget, self.nbytes = budget, nbytes
        self._lock = threading.Lock()
        self._holders = 0
        self._released = False

    def share(self, holders: int) -> None:
        with self._lock:
            self._holders = int(holders)

    def let_go(self) -> None:
        """One holder has no more use for the rows: the last one gives the bytes back."""
        with self._lock:
            self._holders -= 1
            last = self._holders <= 0
        if last:
            self.release()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self.budget._give_back(self.nbytes)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"

"""A thread that works a window ahead of a position another thread advances.

The loader's read-ahead (readahead.py: pages a file in for reading) and the weight arena's prefault
(backends/weight_arena.py: faults fresh memory in for writing) both run ahead of the packing the same
way; only the work of a step differs. A RunsAhead works [0, size) step by step, never past `window`
beyond the last position `advance` was told, jumps to that position when it falls behind (the work
behind it is done by the one it runs ahead of), and waits on a condition for either more room or `stop`.
"""
from __future__ import annotations

import threading
from typing import Callable


class RunsAhead:
    """Calls `work(lo, hi)` on a thread of its own for consecutive [lo, hi) of at most `step`, up to `window`
    past the advanced position; `work` returns False to end the thread (a failure: only a help). When it is
    behind, it goes on from the position rounded down to `align`."""

    def __init__(self, size: int, work: Callable[[int, int], bool], window: int, step: int, *,
                 align: int = 1, name: str = "llambda-ahead"):
        self.size, self.window, self.step, self.align = int(size), int(window), int(step), max(1, int(align))
        self._work = work
        self._cond = threading.Condition()
        self._at = 0                    # the position the other thread last reached
        self.done = 0                   # the end of the last finished step
        self.worked = 0                 # bytes worked, jumps not counted
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def advance(self, pos: int) -> None:
        """The other thread reached `pos`: work on to pos + window. Never moves back."""
        with self._cond:
            if pos > self._at:
                self._at = pos
                self._cond.notify()

    def stop(self) -> int:
        """Stop after the current step and wait for it; returns how far the work reached. Idempotent."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
        return self.done

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and self.done >= min(self.size, self._at + self.window):
                    self._cond.wait()
                if self._stopped:
                    return
                lo = max(self.done, self._at - self._at % self.align)
                hi = min(self.size, lo + self.step, self._at + self.window)
            if not self._work(lo, hi):
                return
            with self._cond:
                self.done = hi
                self.worked += hi - lo

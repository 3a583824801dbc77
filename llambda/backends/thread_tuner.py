"""How many threads a recorded decode step runs on: the count that is fastest now.

On an idle machine every core helps; on a busy one (other processes on some cores)
a fork/join step waits for threads the scheduler has parked, and fewer threads are
faster (two threads with a busy loop on one of two cores run slower than one). The
pool cannot see that from one call, but a decode step is the same work token after
token, so its wall time compares thread counts directly.

A ThreadTuner keeps one count (at first all the threads) and now and then runs a few
steps one thread up or down (a probe). A probe whose mean step time beats the recent
steps' mean by a margin becomes the count; a losing probe makes the next one wait
twice as long, and a probe that is clearly slower (a first step far slower than any
recent one, or a mean well above theirs from the second step on) ends at once. Means,
not medians: a step that waited for a descheduled thread is part of what a thread count
costs. After the first step only the mean ends a probe: beside a busy loop a 2-thread
step is fast while both threads run and slow when one waits for a core, and such a count
can be the faster on average though some of its steps are slow.

Two more rules, for a load that comes and goes and for the scheduler's noise (its slices
of milliseconds are as long as a small model's step):
- below all the threads, the wait for a probe of one more is bounded in time as well
  as in steps (MAX_WAIT_S, or WAIT_PER_PROBE probes' time for a model whose probe takes
  longer), so once the load goes the count comes back within about a second at any
  step time; probes of fewer threads wait in steps only, so they cost an idle machine
  well under 1%;
- a won probe is confirmed: after WINDOW steps at the new count, if their mean is not
  below the old count's mean after all (the probe was lucky: a thread woken from sleep
  runs first for a while, a neighbour paused), the tuner goes back at once.
- a confirmed change back to the count the last change left, within FLIP_S seconds of
  it, makes the next probe wait twice as long instead of coming soon: the scheduler's
  rhythm (runs of fast and slow steps longer than a probe) must not flip the count back
  and forth, while a load that comes and goes over seconds is still followed.

Results never depend on the thread count (work is cut from the sizes, never the thread
count), so this changes speed only, never a token.
"""
from __future__ import annotations

from collections import deque


class ThreadTuner:
    MIN_PERIOD = 16     # steps at the chosen count before the first probe, and after a change
    MAX_PERIOD = 1024   # the longest wait between probes in steps (losing probes double it up to this)
    MAX_WAIT_S = 1.0    # ... and, for a probe of more threads, in seconds (or WAIT_PER_PROBE times the last probe's)
    WAIT_PER_PROBE = 16
    PROBE = 8           # steps of one probe
    WINDOW = 16         # recent steps at the chosen count a probe is compared with
    WIN = 0.95          # a probe whose mean is below this fraction of the recent mean wins
    ABORT_STEP = 1.25   # a probe's first step this much slower than the slowest recent step ends the probe
    ABORT_MEAN = 1.15   # so does a probe whose mean from the second step on is this much above the recent mean
    FLIP_S = 1.0        # a confirmed change back within this many seconds of the last makes the next probe wait longer

    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.max = threads
        self.current = threads
        self.recent: deque[float] = deque(maxlen=self.WINDOW)
        self.period = self.countdown = self.MIN_PERIOD
        self.waited = 0.0               # seconds of steps at the current count since the last probe
        self.max_wait = self.MAX_WAIT_S
        self.probe = 0                  # the count being probed, 0 between probes
        self.probe_times: list[float] = []
        self.down = True                # the direction of the next probe when both exist
        self.changes = 0                # how often the count changed (for benchmarks and tests)
        self.reverts = 0                # of those, changes back after a won probe was not confirmed
        self.confirm: tuple[int, float, int] | None = None  # after a win: the old count, its recent mean and period
        self.left, self.left_at = 0, 0.0    # the count the last confirmed change left, and when (clock)
        self.clock = 0.0                # seconds of all steps recorded

    def threads(self) -> int:
        """The thread count of the next step."""
        return self.probe or self.current

    def record(self, seconds: float) -> None:
        """The last step (run on threads()) took `seconds`."""
        self.clock += seconds
        if self.probe:
            self.probe_times.append(seconds)
            base = sum(self.recent) / len(self.recent)
            mean = sum(self.probe_times) / len(self.probe_times)
            first = len(self.probe_times) == 1
            if (first and seconds > self.ABORT_STEP * max(self.recent)) or (not first and mean > self.ABORT_MEAN * base):
                self._end_probe(won=False)      # clearly slower: stop paying for it
            elif len(self.probe_times) == self.PROBE:
                self._end_probe(won=mean < self.WIN * base)
            return
        self.recent.append(seconds)
        self.waited += seconds
        self.countdown -= 1
        if self.confirm and len(self.recent) == self.WINDOW:
            old, old_mean, self.period = self.confirm
            self.confirm = None
            if sum(self.recent) / self.WINDOW >= old_mean:    # not faster after all: back, no new probe soon
                self.current, self.recent = old, deque(maxlen=self.WINDOW)
                self.changes += 1
                self.reverts += 1
                self._wait(longer=True)
                return
            flip = self.current == self.left and self.clock - self.left_at <= self.FLIP_S
            self.left, self.left_at = old, self.clock
            if flip:        # soon back where the last change left: noise slower than a probe, not a load
                self._wait(longer=True)
                return
            self.period = self.MIN_PERIOD
        if len(self.recent) < self.WINDOW:
            return
        up, down = self.current + 1, self.current - 1
        if self.countdown <= 0:
            choices = [c for c in ((down, up) if self.down else (up, down)) if 1 <= c <= self.max]
            if not choices:
                self.countdown = self.MAX_PERIOD
                return
            self.probe = choices[0]
            self.down = self.probe > self.current     # alternate when both directions exist
        elif self.waited >= self.max_wait and up <= self.max:
            self.probe = up

    def _wait(self, longer: bool) -> None:
        self.period = min(2 * self.period, self.MAX_PERIOD) if longer else self.MIN_PERIOD
        self.countdown, self.waited = self.period, 0.0

    def _end_probe(self, won: bool) -> None:
        self.max_wait = max(self.MAX_WAIT_S, self.WAIT_PER_PROBE * sum(self.probe_times))
        if won:
            self.confirm = (self.current, sum(self.recent) / len(self.recent), self.period)
            self.current = self.probe
            self.recent = deque(maxlen=self.WINDOW)     # the new count's own steps, for the confirmation
            self.changes += 1
        self._wait(longer=not won)
        self.probe, self.probe_times = 0, []

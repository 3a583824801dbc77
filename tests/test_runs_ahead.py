"""RunsAhead, the thread both the loader's read-ahead and the arena's prefault run on: it works in steps up
to a window past the advanced position, waits there, jumps (aligned down) when it is behind, and stops."""
from __future__ import annotations

import threading
import time

from llambda.formats.runs_ahead import RunsAhead


def _wait_for(cond, seconds=20.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return cond()


def _recorder(fail_at=None):
    steps, lock = [], threading.Lock()

    def work(lo, hi):
        with lock:
            steps.append((lo, hi))
        return fail_at is None or lo < fail_at
    return steps, work


def test_it_works_a_window_ahead_in_steps_and_waits_there():
    steps, work = _recorder()
    r = RunsAhead(100, work, window=10, step=4)
    try:
        assert _wait_for(lambda: r.done == 10)
        assert not _wait_for(lambda: r.done > 10, seconds=0.1)      # waits for the other thread
        assert steps == [(0, 4), (4, 8), (8, 10)]                   # the last step cut at the window
        r.advance(3)
        assert _wait_for(lambda: r.done == 13)
        r.advance(2)                                                # never moves back
        assert not _wait_for(lambda: r.done > 13, seconds=0.1)
        r.advance(95)                                               # jumped past: works on from there, to the end
        assert _wait_for(lambda: r.done == 100)
        assert steps[3:] == [(10, 13), (95, 99), (99, 100)] and r.worked == 18
    finally:
        assert r.stop() == 100
    assert not r.alive
    assert r.stop() == 100                                          # idempotent


def test_a_jump_goes_on_from_the_aligned_position():
    steps, work = _recorder()
    r = RunsAhead(1000, work, window=8, step=8, align=16)
    try:
        assert _wait_for(lambda: r.done == 8)
        r.advance(45)                                   # behind: from 32, the 16-aligned start of 45's block
        assert _wait_for(lambda: r.done == 53)
        assert steps == [(0, 8), (32, 40), (40, 48), (48, 53)]
    finally:
        r.stop()


def test_a_failed_step_ends_the_thread_and_stop_still_returns():
    steps, work = _recorder(fail_at=4)
    r = RunsAhead(100, work, window=50, step=4)
    assert _wait_for(lambda: not r.alive)
    assert steps == [(0, 4), (4, 8)] and r.done == 4                # the failed step is not counted
    r.advance(60)
    assert r.stop() == 4


def test_stop_waits_for_the_step_in_flight():
    entered, release = threading.Event(), threading.Event()

    def work(lo, hi):
        entered.set()
        release.wait(10)
        return True
    r = RunsAhead(100, work, window=10, step=10)
    assert entered.wait(10)
    stopper = threading.Thread(target=r.stop)
    stopper.start()
    stopper.join(0.1)
    assert stopper.is_alive()                       # the step is still running: stop waits for it
    release.set()
    stopper.join(10)
    assert not stopper.is_alive() and not r.alive and r.done == 10

"""ThreadTuner: a decode step's thread count from its timings (backends/thread_tuner.py).

Synthetic step times (no clock, no threads): the tuner must keep every thread when more
threads are faster, lose little to its probes there, move to fewer threads when those are
faster (a busy machine), come back when the load goes, and the native backend must run each
replay on the count the tuner gives.
"""
import pytest

from llambda.backends.thread_tuner import ThreadTuner


def drive(tuner, step_time, steps, unit=1e-3):
    """Run `steps` steps, each taking step_time(threads, i) * unit seconds (a small model's step
    by default); returns the counts used."""
    used = []
    for i in range(steps):
        t = tuner.threads()
        used.append(t)
        tuner.record(step_time(t, i) * unit)
    return used


def test_keeps_all_threads_when_they_are_faster_and_probes_cost_little():
    tuner = ThreadTuner(2)
    used = drive(tuner, lambda t, i: 1.0 / t, 4000)     # 1 thread: twice as slow
    assert tuner.current == 2 and tuner.changes == 0
    probes = len(used) - used.count(2)
    assert probes <= 12                                 # each losing probe ends after one step
    assert tuner.period == ThreadTuner.MAX_PERIOD


def test_moves_to_fewer_threads_when_they_are_faster():
    tuner = ThreadTuner(2)
    used = drive(tuner, lambda t, i: 1.0 if t == 1 else 1.4, 200)
    assert tuner.current == 1
    switched = used.index(1)
    assert switched <= ThreadTuner.MIN_PERIOD + 1 and used[switched + ThreadTuner.PROBE:].count(1) > 0.9 * (200 - switched - ThreadTuner.PROBE)


def test_comes_back_when_the_load_goes():
    tuner = ThreadTuner(2)
    busy = 300
    used = drive(tuner, lambda t, i: (1.0 if t == 1 else 1.4) if i < busy else 1.0 / t, 2000)
    assert tuner.current == 2
    back = used.index(2, busy + 1)
    # after the load ends, the next probe of 2 threads wins: at most one probe period later
    assert back - busy <= ThreadTuner.MAX_PERIOD + ThreadTuner.PROBE


def test_finds_an_intermediate_count():
    # 4 threads, one core taken: 3 is best, 4 stalls, fewer are slower
    cost = {1: 3.0, 2: 1.6, 3: 1.0, 4: 1.5}
    tuner = ThreadTuner(4)
    drive(tuner, lambda t, i: cost[t], 3000)
    assert tuner.current == 3


def test_noise_does_not_make_it_leave_a_clearly_better_count():
    import random
    rng = random.Random(0)
    tuner = ThreadTuner(2)
    used = drive(tuner, lambda t, i: (1.0 / t) * rng.uniform(0.8, 1.25), 5000)
    assert used[1000:].count(2) > 0.98 * 4000


def test_one_thread_never_probes():
    tuner = ThreadTuner(1)
    assert set(drive(tuner, lambda t, i: 1.0, 100)) == {1}
    with pytest.raises(ValueError):
        ThreadTuner(0)


def test_native_replay_runs_on_the_tuners_count(monkeypatch):
    native = pytest.importorskip("llambda.backends.native")
    if native.C is None:
        pytest.skip("C core not built")
    clock = [0.0]

    class FakePlan:
        def __init__(self):
            self.calls = []

        def replay(self, threads=0):
            self.calls.append(threads)
            clock[0] += 1.0 if threads == 1 else 1.5        # one thread faster: a busy machine

    backend = native.NativeBackend(threads=2)
    monkeypatch.setattr(native.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(native.C, "threads", lambda: 2)
    monkeypatch.setattr(native, "THREAD_TUNING", True)
    plan = FakePlan()
    for _ in range(100):
        backend.replay(plan)
    assert plan.calls[0] == 2 and plan.calls[-1] == 1
    monkeypatch.setattr(native, "THREAD_TUNING", False)
    backend.replay(plan)
    assert plan.calls[-1] == 0                                 # every thread, no cap


def test_a_modest_win_under_noise_is_found_and_kept():
    # a busy machine: 1 thread 15% faster than 2, every step +-15% noise
    import random
    rng = random.Random(1)
    tuner = ThreadTuner(2)
    used = drive(tuner, lambda t, i: (1.0 if t == 1 else 1.15) * rng.uniform(0.85, 1.15), 3000)
    assert used[500:].count(1) > 0.8 * 2500


def test_a_slow_step_comes_back_within_about_a_second():
    # a 1.5B model's ~40 ms step: a probe period of 1024 steps would be 40 s; the wait between
    # probes is bounded in time instead (MAX_WAIT_S, or WAIT_PER_PROBE probes' time)
    tuner = ThreadTuner(2)
    busy = 200
    used = drive(tuner, lambda t, i: (1.0 if t == 1 else 1.4) if i < busy else 1.0 / t, 400, unit=0.04)
    assert used[busy - 1] == 1 and tuner.current == 2
    back = used.index(2, busy)
    seconds = sum(0.04 * (1.0 if t == 1 else 0.5) for t in used[busy:back])
    assert seconds <= ThreadTuner.MAX_WAIT_S + 0.04 * (ThreadTuner.WINDOW + 1)


def test_probes_on_an_idle_machine_cost_little_at_any_step_time():
    for unit in (1e-3, 3e-3, 0.04):
        tuner = ThreadTuner(2)
        used = drive(tuner, lambda t, i: 1.0 / t, 3000, unit=unit)
        assert tuner.current == 2
        assert used[200:].count(1) < 0.01 * 2800, unit


def test_a_lucky_probe_is_not_kept():
    # a busy machine where a probe of 2 threads looks fast for its first steps (a worker woken from
    # sleep runs first for a while) but 2 threads are slower once they share the cores again
    tuner = ThreadTuner(2)
    since = {"n": 0, "last": 1}

    def step(t, i):
        since["n"] = since["n"] + 1 if t == since["last"] else 0
        since["last"] = t
        if t == 1:
            return 1.0
        return 0.8 if since["n"] < ThreadTuner.PROBE else 1.4

    used = drive(tuner, step, 6000)
    assert tuner.reverts >= 1
    assert used[500:].count(1) > 0.9 * 5500


def test_a_count_faster_on_average_is_kept_though_some_of_its_steps_are_slow():
    # a busy loop on one of two cores: a 2-thread step is fast while both threads run and slow when
    # one waits for a core (30% of the steps), 13% faster than 1 thread on average; one slow step
    # after the first must not end a probe (only the probe's mean does)
    import random
    rng = random.Random(1)
    tuner = ThreadTuner(2)

    def step(t, i):
        if t == 1:
            return rng.uniform(0.9, 1.1)
        return 0.6 if rng.random() < 0.7 else 1.5

    used = drive(tuner, step, 6000)
    assert used[1000:].count(2) > 0.8 * 5000


def test_noise_slower_than_a_probe_does_not_make_it_flip_back_and_forth():
    # 2 threads 10% slower on average, but in runs of 20 fast then 20 slow steps (a scheduler's
    # rhythm): a probe and its confirmation can fall into a fast run; a change back within a second
    # of the last makes the next probe wait longer, so the count stays mostly on 1 thread
    import random
    rng = random.Random(0)
    tuner = ThreadTuner(2)
    phase = {"n": 0}

    def step(t, i):
        if t == 1:
            return rng.uniform(0.9, 1.1)
        phase["n"] += 1
        return (0.6 if phase["n"] % 40 < 20 else 1.6) * rng.uniform(0.9, 1.1)

    used = drive(tuner, step, 20000)
    assert tuner.changes < 60
    assert used[1000:].count(1) > 0.75 * 19000


def test_a_load_that_comes_and_goes_every_few_seconds_is_followed():
    # the flip rule must not keep a count the load has left: load on for 3000 steps, off for 3000
    tuner = ThreadTuner(2)
    period = 3000
    used = drive(tuner, lambda t, i: (1.0 if t == 1 else 1.4) if (i // period) % 2 == 0 else 1.0 / t, 6 * period)
    for k in range(6):
        phase = used[k * period + 1000:(k + 1) * period]
        want = 1 if k % 2 == 0 else 2
        assert phase.count(want) > 0.9 * len(phase), k

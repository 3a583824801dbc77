"""The C core's thread pool, ISA selection and allocation counters.

Correctness only (timings are measured by hand, never asserted): every item runs exactly once per
call in chunks of the grain, a worker that never runs does not stall the caller, resizes work, a nested call runs serially instead of deadlocking, two Python threads
can share the pool, sleeping workers wake up, a forked child gets a usable pool, and the process
exits cleanly with workers running.
"""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def restore_threads():
    before = native.threads()
    yield
    native.set_threads(before)


def run_python(code, **env):
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=full_env)


# ---------------------------------------------------------------- pool


def probe_ok(r, calls, items):
    """Every item ran exactly once per call and every chunk came with valid bounds and tid."""
    return r["bad"] == 0 and r["item_runs"] == [calls] * items


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("items,grain", [(64, 1), (1000, 7), (5, 16)])
def test_every_item_runs_once_per_call(n, items, grain):
    native.set_threads(n)
    assert native.threads() == n
    calls = 2000 if n <= os.cpu_count() else 200  # oversubscribed spinning is slow, not wrong
    r = native._pool_probe(calls, items=items, grain=grain)
    assert probe_ok(r, calls, items), r
    assert sum(r["chunks"]) == calls * -(-items // grain)
    assert r["nested_max_tid"] == 0


def test_nested_call_runs_serially():
    native.set_threads(2)
    r = native._pool_probe(500, True)
    assert probe_ok(r, 500, 64)
    assert r["nested_max_tid"] == 1  # the inner call ran as tid 0 on the calling thread


def test_a_worker_that_never_runs_does_not_stall_the_caller():
    """A worker held off the CPU (the hook stands in for a descheduled thread on a busy machine)
    gets no chunks; the caller does the whole of every call instead of waiting for it. If the
    pool waited, the hold would time out after 10 s (bounded) and hold_timeouts says so."""
    native.set_threads(2)
    r = native._pool_probe(300, items=64, grain=1, hold=1)
    assert r["hold_timeouts"] == 0
    assert probe_ok(r, 300, 64)
    assert r["chunks"] == [300 * 64, 0]
    # Released, the held worker wakes to stale calls, claims nothing of them and works again.
    native.set_threads(3)
    r = native._pool_probe(100, hold=2)
    assert r["hold_timeouts"] == 0 and probe_ok(r, 100, 64) and r["chunks"][2] == 0
    r = native._pool_probe(200)
    assert probe_ok(r, 200, 64)


def test_a_slow_chunk_is_waited_for():
    """A worker that stalls inside its chunk (as one descheduled mid-chunk): the call returns only
    once that chunk is done, and the pool counts the stall (after which it runs alone a while)."""
    native.set_threads(2)
    before = native.pool_stalls()
    r = native._pool_probe(3, items=64, grain=1, stall_us=20000)
    assert probe_ok(r, 3, 64)
    assert r["chunks"][1] >= 1 and native.pool_stalls() > before
    r = native._pool_probe(200)  # alone or not, every item once
    assert probe_ok(r, 200, 64)


def test_pool_stats_count_calls_and_chunks():
    """The benchmark counters: every call of several chunks is counted once, as run on several
    threads or by the back-off on the caller alone, and the workers' chunks are among its chunks."""
    native.set_threads(2)
    s0 = native.pool_stats()
    assert set(s0) == {"calls", "solo_calls", "stalls", "joins_waited", "join_wait_us", "join_wait_max_us",
                       "caller_work_us", "stolen_chunks", "worker_chunks", "worker_sleeps", "absent_calls",
                       "takeovers"}
    r = native._pool_probe(200, items=16, grain=1)
    assert probe_ok(r, 200, 16)
    s1 = native.pool_stats()
    assert (s1["calls"] + s1["solo_calls"]) - (s0["calls"] + s0["solo_calls"]) == 200
    assert s1["worker_chunks"] - s0["worker_chunks"] == r["chunks"][1]
    assert 0 <= s1["stolen_chunks"] - s0["stolen_chunks"] <= 200 * 16
    assert s1["join_wait_max_us"] >= s0["join_wait_max_us"] and s1["joins_waited"] >= s0["joins_waited"]
    native.set_threads(1)
    native._pool_probe(10, items=16, grain=1)
    s2 = native.pool_stats()
    assert s2["calls"] == s1["calls"] and s2["solo_calls"] == s1["solo_calls"]  # one thread: not pool calls


def test_resize_many_times():
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 4, 30):
        native.set_threads(int(n))
        r = native._pool_probe(50)
        assert probe_ok(r, 50, 64) and len(r["chunks"]) == int(n)
    native.set_threads(2)
    native.set_threads(2)  # same size again: a no-op
    assert probe_ok(native._pool_probe(10), 10, 64)


def test_sleeping_workers_wake_up():
    """Pauses longer than the spin budget (200 us) put workers to sleep; the next call must wake them."""
    native.set_threads(2)
    for pause in (0.0005, 0.002, 0.02) * 4:
        time.sleep(pause)
        assert probe_ok(native._pool_probe(3), 3, 64)


def test_probe_rejects_bad_arguments():
    for kw in ({"items": 0}, {"items": 5000}, {"grain": 0}, {"hold": -1}, {"stall_us": 10**6}):
        with pytest.raises(ValueError, match="_pool_probe"):
            native._pool_probe(1, **kw)


def test_set_threads_rejects_bad_values():
    native.set_threads(2)
    for bad in (0, -1, 257, 10**30):
        with pytest.raises(ValueError, match="set_threads"):
            native.set_threads(bad)
    for bad in ("2", 2.0, True, None):
        with pytest.raises(TypeError):
            native.set_threads(bad)
    assert native.threads() == 2


def test_two_python_threads_share_the_pool():
    """Ops from two Python threads at once are serialised by the pool, with correct results."""
    native.set_threads(2)
    r = np.random.default_rng(1)
    n_ctx, n_kv, hd, n_heads = 400, 3, 64, 9
    kc = r.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    vc = r.standard_normal((1, n_ctx, n_kv, hd)).astype(np.float16)
    q = r.standard_normal((1, n_heads, hd)).astype(np.float32)
    x = r.standard_normal((64, 640)).astype(np.float32)
    w = r.standard_normal(640).astype(np.float32)

    def attention():
        out = np.empty_like(q)
        native.attention(q, kc, vc, out, np.zeros(1, np.int32), np.array([n_ctx - 1], np.int32), 1, n_heads, n_kv, hd,
                         1, n_ctx, 1, 0.125, 0, 0.0)
        return out

    def rmsnorm():
        out = np.empty_like(x)
        native.rmsnorm(x, w, out, 64, 640, 1e-6)
        return out

    want_a, want_r = attention(), rmsnorm()
    errors = []

    def worker(fn, want):
        try:
            for _ in range(200):
                if not np.array_equal(fn(), want):
                    errors.append("%s result changed" % fn.__name__)
                    return
            probe = native._pool_probe(200)
            if not probe_ok(probe, 200, 64):
                errors.append("probe %r" % probe)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    jobs = ((attention, want_a), (rmsnorm, want_r), (attention, want_a))
    threads = [threading.Thread(target=worker, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "deadlock: a Python thread did not finish"
    assert errors == []


def test_forked_child_gets_a_working_pool():
    """After fork only the forking thread exists; the child's pool must not wait for ghost workers."""
    code = """
import os, signal, llambda._native as n
n.set_threads(2)
ok = lambda r: r["bad"] == 0 and r["item_runs"] == [10] * 64
assert ok(n._pool_probe(10))
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a hang kills the child instead of the test
    good = n.threads() == 1 and ok(n._pool_probe(10))
    n.set_threads(2)
    good = good and ok(n._pool_probe(10))
    os._exit(0 if good else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert ok(n._pool_probe(10))
print("ok")
"""
    res = run_python(code)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_exit_with_running_workers_is_clean():
    """atexit joins the workers; a daemon Python thread still calling ops must not hang the exit."""
    code = """
import threading, numpy as np, llambda._native as n
n.set_threads(4)
x = np.ones(1 << 16, np.float32)
def spin():
    while True:
        n.scale(x, 1.0, x.size)
threading.Thread(target=spin, daemon=True).start()
n._pool_probe(100)
print("done")
"""
    res = run_python(code)
    assert res.returncode == 0 and res.stdout.strip() == "done", res.stderr


# ---------------------------------------------------------------- ISA selection


def test_isa_available_and_set_isa():
    avail = native.isa_available()
    assert avail[0] == "scalar"
    assert set(avail) <= {"scalar", "avx2", "avx512"}
    assert avail == [n for n in ("scalar", "avx2", "avx512") if n in avail]  # ordered, each implies the previous
    before = native.isa()
    assert before == avail[-1] or os.environ.get("LLAMBDA_ISA")
    try:
        for name in avail:
            native.set_isa(name)
            assert native.isa() == name
    finally:
        native.set_isa(before)
    with pytest.raises(ValueError, match="unknown ISA"):
        native.set_isa("sse9")
    with pytest.raises(TypeError):
        native.set_isa(2)
    for name in ("scalar", "avx2", "avx512"):
        if name not in avail:
            with pytest.raises(ValueError, match="cannot run"):
                native.set_isa(name)


def test_isa_from_environment():
    avail = native.isa_available()
    for name in avail:
        res = run_python("import llambda._native as n; print(n.isa())", LLAMBDA_ISA=name)
        assert res.returncode == 0 and res.stdout.strip() == name and res.stderr == "", res.stderr
    res = run_python("import llambda._native as n; print(n.isa())", LLAMBDA_ISA="bogus")
    assert res.returncode == 0 and res.stdout.strip() == avail[-1]
    assert "LLAMBDA_ISA='bogus' is not scalar, avx2 or avx512" in res.stderr


def test_unsupported_isa_from_environment_falls_back():
    avail = native.isa_available()
    missing = [n for n in ("avx2", "avx512") if n not in avail]
    if not missing:
        pytest.skip("this CPU supports every ISA path, so none can be refused")
    res = run_python("import llambda._native as n; print(n.isa())", LLAMBDA_ISA=missing[-1])
    assert res.returncode == 0 and res.stdout.strip() == avail[-1]
    assert "not supported by this CPU" in res.stderr


# ---------------------------------------------------------------- allocation counters


def test_alloc_stats():
    count, nbytes = native.alloc_stats()
    assert isinstance(count, int) and isinstance(nbytes, int) and count >= 0 and nbytes >= 0
    # Long decode-style attention uses the per-thread scratch (keys split into chunks): sized
    # once for the longest possible rows, so a growing context does not allocate again.
    r = np.random.default_rng(2)
    n_ctx = 2048
    kc = r.standard_normal((1, n_ctx, 1, 64)).astype(np.float16)
    vc = kc.copy()
    q = r.standard_normal((1, 4, 64)).astype(np.float32)
    out = np.empty_like(q)

    def decode(pos):
        native.attention(q, kc, vc, out, np.zeros(1, np.int32), np.array([pos], np.int32), 1, 4, 1, 64, 1, n_ctx, 1,
                         0.1, 0, 0.0)

    decode(300)
    after_first = native.alloc_stats()
    assert after_first[0] >= count and after_first[1] >= nbytes
    for pos in (301, 600, 1023, 1500, 2047, 2047):
        decode(pos)
    assert native.alloc_stats() == after_first


# ---------------------------------------------------------------- default thread count


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_quota_v2(tmp_path):
    from llambda.backends.native import cgroup_cpu_quota
    write(tmp_path / "proc", "0::/user/job\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) is None  # no files: unknown
    write(tmp_path / "fs/user/job/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) is None  # unlimited
    write(tmp_path / "fs/user/job/cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) == 1.5
    write(tmp_path / "fs/cpu.max", "50000 100000\n")  # a container's own root: the tighter one holds
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) == 0.5


def test_cgroup_quota_v1(tmp_path):
    from llambda.backends.native import cgroup_cpu_quota
    write(tmp_path / "proc", "4:memory:/x\n2:cpu,cpuacct:/job\n")
    write(tmp_path / "fs/cpu,cpuacct/job/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "fs/cpu,cpuacct/job/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) is None
    write(tmp_path / "fs/cpu,cpuacct/job/cpu.cfs_quota_us", "200000\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) == 2.0
    write(tmp_path / "fs/cpu,cpuacct/job/cpu.cfs_quota_us", "garbage\n")
    assert cgroup_cpu_quota(str(tmp_path / "fs"), str(tmp_path / "proc")) is None


def test_default_threads_within_affinity():
    from llambda.backends.native import default_threads, usable_cpus
    assert 1 <= default_threads() <= usable_cpus() <= len(os.sched_getaffinity(0))

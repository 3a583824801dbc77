"""The C core under concurrent use (issue 12, item 1).

Several Python threads run matmul, matmul_many, ops and plan replays while another
resizes the thread pool (set_threads), for a few seconds. Every result must equal
the single-threaded reference bit for bit (results do not depend on the thread
count), and nothing may crash: an op that sized per-thread scratch from a thread
count read before the pool was resized let the extra workers write past it
(glibc then aborts with "free(): invalid next size" or similar).

The hammering runs in a child process so that heap corruption shows up as a
failed test instead of taking pytest down with it. Each op runs in short-lived
threads: a new thread starts with no scratch, so the scratch it allocates fits
the first call exactly and any overrun hits the heap.
"""
import os
import subprocess
import sys
import textwrap

import pytest

native = pytest.importorskip("llambda._native", reason="C core not built (python setup.py build_ext --inplace)")

HAMMER = textwrap.dedent(
    r"""
    import sys, threading, time
    import numpy as np
    from llambda import _native as nat

    SECONDS = float(sys.argv[1])
    Q4_1, Q8_0 = 3, 8
    rng = np.random.default_rng(0)

    def q4_1_bytes(rows, cols):
        nb = rows * cols // 32
        d = rng.uniform(0.002, 0.02, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        m = rng.uniform(-0.1, 0.0, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        qs = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return np.ascontiguousarray(np.concatenate([d, m, qs], axis=1)).reshape(-1)

    def q8_0_bytes(rows, cols):
        nb = rows * cols // 32
        d = rng.uniform(0.002, 0.02, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        qs = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
        return np.ascontiguousarray(np.concatenate([d, qs], axis=1)).reshape(-1)

    COLS, ROWS = 512, 256
    # Q4_1 packed (quantized activations, private per-thread copies for n <= 64),
    # Q8_0 left in the file layout (per-thread repack buffers).
    raw41 = [q4_1_bytes(ROWS, COLS) for _ in range(3)]
    packed41 = []
    for raw in raw41:
        dst = np.empty(nat.packed_size(Q4_1, ROWS, COLS), np.uint8)
        packed41.append((nat.pack(Q4_1, raw, dst, ROWS, COLS), dst))
    raw80 = q8_0_bytes(ROWS, COLS)

    def matmul_many(n):
        x = np.asarray(np.random.default_rng(n).standard_normal((n, COLS)), np.float32)
        outs = [np.zeros((n, ROWS), np.float32) for _ in packed41]
        nat.matmul_many(Q4_1, COLS, x, n, 0, tuple((lay, w, ROWS, o) for (lay, w), o in zip(packed41, outs)))
        return np.concatenate(outs, axis=1)

    def matmul_file(n):
        x = np.asarray(np.random.default_rng(n + 1).standard_normal((n, COLS)), np.float32)
        out = np.zeros((n, ROWS), np.float32)
        nat.matmul(Q8_0, 0, raw80, ROWS, COLS, x, out, n, 0)
        return out

    HD, NH, NKV, CTX = 64, 4, 2, 600
    kc = np.asarray(rng.standard_normal((1, CTX, NKV, HD)), np.float32)
    vc = np.asarray(rng.standard_normal((1, CTX, NKV, HD)), np.float32)

    def ops(n):
        x = np.asarray(np.random.default_rng(n + 2).standard_normal((n, NH * HD)), np.float32)
        w = np.ones(NH * HD, np.float32)
        nat.rmsnorm(x, w, x, n, NH * HD, 1e-6)
        nat.silu_mul(x, x, x, x.size)
        out = np.zeros_like(x)
        pos = np.arange(CTX - n, CTX, dtype=np.int32)
        nat.attention(x, kc, vc, out, np.zeros(n, np.int32), pos, n, NH, NKV, HD, 1, CTX, 0, 0.125, 0, 0.0)
        return out

    def plan(n):
        # matmul_many and attention recorded once, then replayed
        x = np.asarray(np.random.default_rng(n + 3).standard_normal((n, COLS)), np.float32)
        outs = [np.zeros((n, ROWS), np.float32) for _ in packed41]
        att = np.zeros((n, NH * HD), np.float32)
        p = nat.Plan()
        p.begin()
        nat.matmul_many(Q4_1, COLS, x, n, 0, tuple((lay, w, ROWS, o) for (lay, w), o in zip(packed41, outs)))
        nat.attention(outs[0], kc, vc, att, np.zeros(n, np.int32), np.arange(CTX - n, CTX, dtype=np.int32), n, NH,
                      NKV, HD, 1, CTX, 0, 0.125, 0, 0.0)
        p.end()
        for o in outs + [att]:
            o.fill(0)
        p.replay()
        return np.concatenate(outs + [att], axis=1)

    JOBS = [(f, n) for f in (matmul_many, matmul_file, ops, plan) for n in (1, 4, 33)]
    nat.set_threads(1)
    want = {(f.__name__, n): f(n) for f, n in JOBS}

    stop = time.monotonic() + SECONDS
    errors = []

    def job(f, n):
        try:
            for _ in range(3):
                if not np.array_equal(f(n), want[f.__name__, n]):
                    errors.append("%s(n=%d) differs from the 1-thread result" % (f.__name__, n))
        except Exception as e:
            errors.append("%s(n=%d): %r" % (f.__name__, n, e))

    def caller(k):
        i = k
        while time.monotonic() < stop and not errors:
            f, n = JOBS[i % len(JOBS)]
            i += 1
            t = threading.Thread(target=job, args=(f, n))  # fresh thread: fresh scratch
            t.start()
            t.join()

    def resizer():
        sizes = (1, 2, 3, 5, 8, 2, 6)
        i = 0
        while time.monotonic() < stop and not errors:
            nat.set_threads(sizes[i % len(sizes)])
            i += 1

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)] + [threading.Thread(target=resizer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 120)
        if t.is_alive():
            print("deadlock: a thread did not finish", flush=True)
            sys.exit(3)
    if errors:
        print("\n".join(errors[:10]), flush=True)
        sys.exit(2)
    print("ok", flush=True)
    """
)


@pytest.mark.parametrize("isa", native.isa_available())
def test_ops_while_the_pool_is_resized(isa):
    env = dict(os.environ, LLAMBDA_ISA=isa)
    seconds = 4.0 if isa != "scalar" else 2.0
    r = subprocess.run([sys.executable, "-c", HAMMER, str(seconds)], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
        "exit %d\nstdout: %s\nstderr: %s" % (r.returncode, r.stdout[-2000:], r.stderr[-2000:]))

"""One type's GEMV (n = 1, fast mode) rate on one thread, GB/s of packed weights per CPU second (not a test).

    python bench/bench_gemv_rate.py TYPE ROWS COLS COUNT SECONDS    # e.g. Q4_0 4096 1536 1 3 (hot, L3)

COUNT matrices of ROWS x COLS random weights of TYPE, run in turn for SECONDS in 0.2 s rounds of CPU time:
one small matrix reads from cache (the kernel's compute bound), many (e.g. Q4_0 8960 1536 24: 186 MB) from
DRAM. CPU time, so a shared machine's other processes do not lower it; the wall-clock rate beside it.
TH=2 runs the pool's 2 threads (then the CPU figure counts both threads' time). ARENA=1 packs the matrices
back to back into one mapping advised for 2 MB pages, as the engine's weight arena holds them (by default each
is its own NumPy array, whose pages the kernel chooses, 16 bytes past a 64-byte line); OFF=N starts the arena N
bytes past its 2 MB boundary (the engine's matrices start page-aligned, OFF=0).
"""
import mmap
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's llambda
import numpy as np  # noqa: E402

from llambda import _native as nat  # noqa: E402
from llambda.formats.quants import random_blocks  # noqa: E402

TABLE = {t["name"]: t for t in nat.qtypes()}


def main():
    tn, rows, cols, count, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    rng = np.random.default_rng(0)
    q = TABLE[tn]["id"]
    mats, size = [], nat.packed_size(q, rows, cols)
    arena = None
    if os.environ.get("ARENA") == "1":
        m = mmap.mmap(-1, size * count + (4 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as weight_arena's
        m.madvise(mmap.MADV_HUGEPAGE)
        arena = np.frombuffer(m, np.uint8)
        arena = arena[-arena.ctypes.data % (2 << 20) + int(os.environ.get("OFF", "0")):]  # from a 2 MB boundary (+ OFF)
    for k in range(count):
        raw = random_blocks(rng, tn, rows * cols // TABLE[tn]["block"], spread=1e-2).reshape(rows, -1)
        dst = np.empty(size, np.uint8) if arena is None else arena[k * size:(k + 1) * size]
        mats.append((nat.pack(q, raw, dst, rows, cols), dst))
    nat.set_threads(int(os.environ.get("TH", "1")))
    x = rng.standard_normal((1, cols), dtype=np.float32)
    out = np.empty((1, rows), np.float32)
    nb = sum(d.nbytes for _, d in mats)
    res = []
    t_end = time.time() + secs
    while time.time() < t_end:
        c0, w0, k = time.process_time(), time.perf_counter(), 0
        while time.process_time() - c0 < 0.2:
            for layout, d in mats:
                nat.matmul(q, layout, d, rows, cols, x, out, 1, 0)
            k += 1
        res.append((nb * k / (time.process_time() - c0) / 1e9, nb * k / (time.perf_counter() - w0) / 1e9))
    r = np.array(res)
    where = f"{'arena' if arena is not None else 'numpy'} at +{mats[0][1].ctypes.data % 64} of a line"
    print(f"{tn} {rows}x{cols}x{count} {nb / 1e6:.1f} MB, {where}, threads={nat.threads()} isa={nat.isa()}: "
          f"GB/s of CPU time "
          f"median {np.median(r[:, 0]):.1f} max {r[:, 0].max():.1f}; wall median {np.median(r[:, 1]):.1f}; "
          f"load average {os.getloadavg()[0]:.1f}; {huge_mb()} MB of 2 MB pages")


def huge_mb() -> int:
    """The process's anonymous memory on transparent huge pages, MB."""
    with open("/proc/self/smaps_rollup") as f:
        return next((int(ln.split()[1]) // 1024 for ln in f if ln.startswith("AnonHugePages")), 0)


if __name__ == "__main__":
    main()

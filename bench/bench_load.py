"""Load time of a model file, cold (the file evicted from the page cache) and warm, beside reading the file
and beside llama.cpp's load of the same file, each load in a fresh process.

    python bench/bench_load.py moe.gguf --modes dd,llambda,llama-mmap,llama-nommap -r 3 --threads 2

Qwen3-30B-A3B's full shapes (48 layers, ~20 GB: needs ~21 GB free; the largest model a 24 GB machine loads):

    python bench/make_moe_model.py q30b.gguf --qwen3-30b
    python bench/bench_load.py q30b.gguf --modes dd,llambda,llambda-staged,llama-mmap -r 3

Each repetition runs every mode once, in turn (alternated, so a change in the machine's load hits all
of them alike), each after --pause seconds idle; the medians are printed with each process's CPU time (user + system), its peak resident
set and its page faults. "cold" evicts the file first with posix_fadvise(DONTNEED) (dropping the whole
page cache needs root's /proc/sys/vm/drop_caches, which a container often lacks; the eviction of one
file's clean, unmapped pages is what matters here). llama.cpp is timed to its load plus one token: a
mapped load defers its reads to the first token. Our load is timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, os, resource, sys, time
mode, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
if mode == "dd":
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(16 << 20)
    n = 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            n += k
    first = time.perf_counter()
elif mode == "llambda":
    import llambda
    m = llambda.load(path, threads=threads, n_ctx=512)
    first = time.perf_counter()
    m.logits([1])
elif mode.startswith("llama-"):
    from llama_cpp import Llama
    m = Llama(path, n_threads=threads, n_ctx=512, use_mmap=mode == "llama-mmap", verbose=False)
    first = time.perf_counter()
    m.eval([1])
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "load": first - t0, "user": r.ru_utime, "sys": r.ru_stime,
                  "maxrss": r.ru_maxrss * 1024, "minflt": r.ru_minflt, "majflt": r.ru_majflt}))
"""


# llambda with settings: the file read into staging buffers (formats/staging.py), with O_DIRECT or through
# the page cache dropped behind each read; the arena faulted in ahead of the packing (weight_arena.py)
STAGED = {"llambda-staged": {"LLAMBDA_STAGED_READ": "1", "LLAMBDA_KEEP_FILE_CACHE": "0"},
          "llambda-staged-buffered": {"LLAMBDA_STAGED_READ": "1", "LLAMBDA_KEEP_FILE_CACHE": "0",
                                      "LLAMBDA_DIRECT_IO": "0"},
          "llambda-prefault": {"LLAMBDA_ARENA_PREFAULT": "1"}}


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(mode: str, path: str, threads: int, cold: bool, base: str | None = None, pause: float = 0) -> dict:
    time.sleep(pause)
    if cold:
        evict(path)
    elif mode != "dd":      # warm: the file read once just before
        run("dd", path, threads, False)
    cwd = base if mode == "base" else None      # "base": llambda imported from another checkout (A/B)
    env = dict(os.environ, **STAGED[mode]) if mode in STAGED else None
    if mode == "base":      # the other checkout is only read: no bytecode written into it
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    child = "llambda" if mode == "base" or mode in STAGED else mode
    out = subprocess.run([sys.executable, "-c", CHILD, child, path, str(threads)],
                         capture_output=True, text=True, check=True, cwd=cwd, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--modes", default="dd,llambda",
                    help="comma-separated: dd, llambda, llambda-staged (LLAMBDA_STAGED_READ=1), llambda-staged-buffered "
                         "(and LLAMBDA_DIRECT_IO=0), llambda-prefault (LLAMBDA_ARENA_PREFAULT=1), base (see --base), "
                         "llama-mmap, llama-nommap")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm", action="store_true", help="the file in the page cache (default: evicted)")
    ap.add_argument("--pause", type=float, default=5.0,
                    help="seconds idle before each run (default 5): memory the last process freed goes back to the "
                         "host first (free page reporting), so no run inherits the previous one's warm pages")
    ap.add_argument("--base", help="a checkout whose llambda the mode 'base' loads with (built in place), for A/B")
    a = ap.parse_args()
    modes = a.modes.split(",")
    size = os.path.getsize(a.path)
    res: dict[str, list[dict]] = {m: [] for m in modes}
    load0 = os.getloadavg()[0]
    for i in range(a.repeats):
        for m in modes:
            r = run(m, a.path, a.threads, not a.warm, a.base, a.pause)
            res[m].append(r)
            print(f"  rep {i} {m}: " + " ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in r.items()), flush=True)
    print(f"{a.path}: {size / 1e9:.2f} GB, {'warm' if a.warm else 'cold'}, {a.threads} threads, "
          f"load average {os.getloadavg()[0]:.1f} (at the start {load0:.1f}), medians of {a.repeats}:")
    for m in modes:
        med = {k: statistics.median(r[k] for r in res[m]) for k in res[m][0]}
        print(f"  {m:13s} load {med['load']:6.2f} s  +1st token {med['wall']:6.2f} s  CPU user {med['user']:5.2f} s "
              f"sys {med['sys']:5.2f} s  peak RSS {med['maxrss'] / 2**30:5.2f} GiB  "
              f"faults {med['minflt']:.0f} minor {med['majflt']:.0f} major"
              + (f"  ({size / med['load'] / 1e6:.0f} MB/s)" if m == "dd" else ""))


if __name__ == "__main__":
    main()

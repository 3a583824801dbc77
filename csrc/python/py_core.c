/* Python bindings of the core: ISA selection, the global switches, thread pool,
 * allocation counters, and a pool probe used by tests/test_threadpool.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/isa.h"
#include "core/pages.h"
#include "core/readbw.h"
#include "core/state.h"
#include "core/threadpool.h"
#include "python/args.h"
#include "python/bindings.h"

static PyObject *py_isa(PyObject *self, PyObject *unused) { return PyUnicode_FromString(llb_isa_name(llb_isa_current)); }

static PyObject *py_far_stream(PyObject *self, PyObject *unused) { return PyBool_FromLong(llb_isa_far_stream()); }

static PyObject *py_isa_available(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int isa = LLB_ISA_SCALAR; isa <= LLB_ISA_AVX512; isa++) {
        if (!llb_isa_supported(isa)) continue;
        PyObject *name = PyUnicode_FromString(llb_isa_name(isa));
        if (!name || PyList_Append(list, name) != 0) {
            Py_XDECREF(name);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(name);
    }
    return list;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) return PyErr_Format(PyExc_TypeError, "set_isa: name must be str, not %.100s", Py_TYPE(arg)->tp_name);
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int isa = LLB_ISA_SCALAR; isa <= LLB_ISA_AVX512; isa++) {
        if (strcmp(name, llb_isa_name(isa)) != 0) continue;
        if (!llb_isa_supported(isa))
            return PyErr_Format(PyExc_ValueError, "set_isa: this CPU cannot run '%s' (best available: '%s')", name,
                                llb_isa_name(llb_isa_best()));
        llb_isa_current = isa;
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_ValueError, "set_isa: unknown ISA '%.100s' (expected 'scalar', 'avx2' or 'avx512')", name);
}

static PyObject *py_set_threads(PyObject *self, PyObject *arg) {
    long n;
    if (PyBool_Check(arg)) /* a flag passed where a count belongs */
        return PyErr_Format(PyExc_TypeError, "set_threads: n must be an int, not bool");
    if (llb_arg_long(arg, "set_threads", "n", 1, LLB_POOL_MAX_THREADS, &n) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = llb_pool_init((int)n);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_Format(PyExc_OSError, "set_threads: could not start %ld threads", n);
    Py_RETURN_NONE;
}

/* cap_threads(n) -> int: the calling thread's cap (llb_pool_cap_thread), the previous one returned. A cap
 * above the pool's size is allowed: it means no cap until the pool grows (another thread may resize the
 * pool at any time, so checking against its size now would be a race, not a guarantee). */
static PyObject *py_cap_threads(PyObject *self, PyObject *arg) {
    long n;
    if (PyBool_Check(arg)) return PyErr_Format(PyExc_TypeError, "cap_threads: n must be an int, not bool");
    if (llb_arg_long(arg, "cap_threads", "n", 0, LLB_POOL_MAX_THREADS, &n) < 0) return NULL;
    return PyLong_FromLong(llb_pool_cap_thread((int)n));
}

static PyObject *py_pool_widest(PyObject *self, PyObject *unused) { return PyLong_FromLong(llb_pool_widest()); }

static PyObject *py_set_batch_invariant(PyObject *self, PyObject *arg) {
    const int v = PyObject_IsTrue(arg);
    if (v < 0) return NULL;
    llb_batch_invariant = v;
    Py_RETURN_NONE;
}

static PyObject *py_batch_invariant(PyObject *self, PyObject *unused) { return PyBool_FromLong(llb_batch_invariant); }

static PyObject *py_threads(PyObject *self, PyObject *unused) { return PyLong_FromLong(llb_pool_threads()); }
static PyObject *py_pool_stalls(PyObject *self, PyObject *unused) { return PyLong_FromLong(llb_pool_stalls()); }

static PyObject *py_pool_stats(PyObject *self, PyObject *unused) {
    static const char *names[LLB_POOL_STATS] = {"calls", "solo_calls", "stalls", "joins_waited", "join_wait_us",
                                                "join_wait_max_us", "caller_work_us", "stolen_chunks", "worker_chunks",
                                                "worker_sleeps", "absent_calls", "takeovers"};
    long v[LLB_POOL_STATS];
    const int k = llb_pool_stats(v, LLB_POOL_STATS);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < k; i++) {
        PyObject *x = PyLong_FromLong(v[i]);
        if (!x || PyDict_SetItemString(d, names[i], x) != 0) {
            Py_XDECREF(x);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(x);
    }
    return d;
}

static PyObject *py_alloc_stats(PyObject *self, PyObject *unused) {
    size_t count, bytes;
    llb_alloc_stats(&count, &bytes);
    return Py_BuildValue("(nn)", (Py_ssize_t)count, (Py_ssize_t)bytes);
}

/* Page a buffer's bytes in (core/pages.h), for reading or for writing, the GIL released while the kernel works. */
static PyObject *populate_with(PyObject *arg, int write) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, write ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = write ? llb_pages_populate_write(view.buf, (size_t)view.len) : llb_pages_populate(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromLong(rc);
}

/* populate(buf) -> int: page in a mapping's bytes for reading (waiting for the disk). */
static PyObject *py_populate(PyObject *self, PyObject *arg) { return populate_with(arg, 0); }

/* populate_write(buf) -> int: fault a writable buffer's pages in, zero-filled. */
static PyObject *py_populate_write(PyObject *self, PyObject *arg) {
    return populate_with(arg, 1);
}

/* read_bandwidth(nbytes, threads, reps) -> list of GB/s, one per repetition (core/readbw.h); GIL released. */
#define READBW_MAX_REPS 1000
static PyObject *py_read_bandwidth(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long nbytes, threads, reps;
    if (llb_arg_nargs("read_bandwidth", nargs, 3, "nbytes, threads, reps") < 0) return NULL;
    for (int i = 0; i < 3; i++)
        if (PyBool_Check(args[i])) return PyErr_Format(PyExc_TypeError, "read_bandwidth: arguments must be ints, not bool");
    if (llb_arg_long(args[0], "read_bandwidth", "nbytes", (long)LLB_READBW_MIN_BYTES, LONG_MAX, &nbytes) < 0 ||
        llb_arg_long(args[1], "read_bandwidth", "threads", 1, llb_pool_threads(), &threads) < 0 ||
        llb_arg_long(args[2], "read_bandwidth", "reps", 1, READBW_MAX_REPS, &reps) < 0)
        return NULL;
    if ((size_t)nbytes > LLB_READBW_MAX_BYTES)
        return PyErr_Format(PyExc_ValueError, "read_bandwidth: nbytes must be <= %zu", LLB_READBW_MAX_BYTES);
    double gbs[READBW_MAX_REPS];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = llb_read_bandwidth((size_t)nbytes, (int)threads, (int)reps, gbs);
    Py_END_ALLOW_THREADS
    if (rc == -1) return PyErr_Format(PyExc_MemoryError, "read_bandwidth: could not map %ld bytes", nbytes);
    if (rc == -3)
        return PyErr_Format(PyExc_ValueError, "read_bandwidth: nbytes %ld is more than half this machine's memory", nbytes);
    if (rc != 0) return PyErr_Format(PyExc_ValueError, "read_bandwidth: arguments out of range");
    PyObject *out = PyList_New(reps);
    if (!out) return NULL;
    for (long i = 0; i < reps; i++) {
        PyObject *v = PyFloat_FromDouble(gbs[i]);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* ---- pool probes ---------------------------------------------------------- */

#define PROBE_MAX_CALLS 1000000
#define PROBE_MAX_ITEMS 4096
struct probe {
    atomic_int item_runs[PROBE_MAX_ITEMS]; /* runs of each item over all calls */
    atomic_int chunks[LLB_POOL_MAX_THREADS]; /* chunks each tid ran */
    atomic_int bad;                        /* chunks with a tid or range out of bounds */
    atomic_int nested_max_tid;             /* largest tid + 1 a nested call reported */
    int nth, nested;
    int worker_chunks_before; /* chunks[1] when this call began (stall mode) */
    long items, grain, stall_us;
};

static void nested_task(void *ctx, long b, long e, int tid) {
    struct probe *p = ctx;
    int prev = atomic_load(&p->nested_max_tid);
    while (tid + 1 > prev && !atomic_compare_exchange_weak(&p->nested_max_tid, &prev, tid + 1)) {}
}

static void probe_task(void *ctx, long b, long e, int tid) {
    struct probe *p = ctx;
    if (tid < 0 || tid >= p->nth || b < 0 || e > p->items || e <= b || b % p->grain != 0 ||
        (e != p->items && e - b != p->grain)) {
        atomic_fetch_add(&p->bad, 1);
        return;
    }
    atomic_fetch_add(&p->chunks[tid], 1);
    if (tid > 0 && p->stall_us > 0) { /* a worker that is slow in the middle of its chunk */
        const struct timespec ts = {p->stall_us / 1000000, p->stall_us % 1000000 * 1000};
        nanosleep(&ts, NULL);
    } else if (p->stall_us > 0 && b == 0) { /* the caller lets a worker claim one first (at most 2 s) */
        const struct timespec ms = {0, 1000000};
        for (int i = 0; i < 2000 && atomic_load(&p->chunks[1]) == p->worker_chunks_before; i++) nanosleep(&ms, NULL);
    }
    for (long i = b; i < e; i++) atomic_fetch_add(&p->item_runs[i], 1);
    if (p->nested) llb_parallel_for(nested_task, ctx, 8, 1, LLB_POOL_MAX_THREADS); /* must run serially */
}

/* _pool_probe(calls, nested=False, items=64, grain=1, hold=0, stall_us=0, redo=False) ->
 * dict(item_runs=[per item], chunks=[per tid], bad, nested_max_tid, hold_timeouts).
 * hold: a worker tid kept from claiming anything during the calls (llb_pool_hold_worker).
 * redo: the calls are llb_parallel_for_redo (a stalled worker's chunk is taken over; its
 * item_runs count only once: a worker abandons its chunk in the stall, before counting). */
static PyObject *py_pool_probe(PyObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"calls", "nested", "items", "grain", "hold", "stall_us", "redo", NULL};
    long calls, items = 64, grain = 1, stall_us = 0;
    int nested = 0, hold = 0, redo = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "l|pllilp", names, &calls, &nested, &items, &grain, &hold, &stall_us,
                                     &redo))
        return NULL;
    if (calls < 1 || calls > PROBE_MAX_CALLS) return PyErr_Format(PyExc_ValueError, "_pool_probe: calls must be in [1, %d]", PROBE_MAX_CALLS);
    if (items < 1 || items > PROBE_MAX_ITEMS || grain < 1 || hold < 0 || hold >= LLB_POOL_MAX_THREADS || stall_us < 0 ||
        stall_us > 100000)
        return PyErr_Format(PyExc_ValueError, "_pool_probe: items in [1, %d], grain >= 1, hold a tid, stall_us <= 100000",
                            PROBE_MAX_ITEMS);
    struct probe *p = PyMem_Calloc(1, sizeof *p);
    if (!p) return PyErr_NoMemory();
    p->nested = nested;
    p->items = items;
    p->grain = grain;
    p->stall_us = stall_us;
    int timeouts;
    Py_BEGIN_ALLOW_THREADS
    p->nth = llb_pool_threads();
    llb_pool_hold_worker(hold);
    for (long i = 0; i < calls; i++) {
        p->worker_chunks_before = atomic_load(&p->chunks[1]);
        (redo ? llb_parallel_for_redo : llb_parallel_for)(probe_task, p, items, grain, p->nth); /* tid < nth even if the pool grows */
    }
    timeouts = llb_pool_hold_worker(0);
    Py_END_ALLOW_THREADS
    PyObject *runs = PyList_New(items), *chunks = PyList_New(p->nth);
    if (!runs || !chunks) {
        Py_XDECREF(runs);
        Py_XDECREF(chunks);
        PyMem_Free(p);
        return NULL;
    }
    for (long i = 0; i < items; i++) PyList_SET_ITEM(runs, i, PyLong_FromLong(atomic_load(&p->item_runs[i])));
    for (int i = 0; i < p->nth; i++) PyList_SET_ITEM(chunks, i, PyLong_FromLong(atomic_load(&p->chunks[i])));
    PyObject *res = Py_BuildValue("{s:N,s:N,s:i,s:i,s:i}", "item_runs", runs, "chunks", chunks, "bad", atomic_load(&p->bad),
                                  "nested_max_tid", atomic_load(&p->nested_max_tid), "hold_timeouts", timeouts);
    PyMem_Free(p);
    return res;
}

PyMethodDef llb_core_methods[] = {
    {"isa", py_isa, METH_NOARGS, "isa() -> str: the active SIMD path ('scalar', 'avx2' or 'avx512')."},
    {"set_isa", py_set_isa, METH_O, "set_isa(name) -> None: switch SIMD path; ValueError if unknown or unsupported here."},
    {"far_stream", py_far_stream, METH_NOARGS,
     "far_stream() -> bool: the GEMVs stream as on AMD's cores (LLAMBDA_FAR_STREAM; default on AMD)."},
    {"isa_available", py_isa_available, METH_NOARGS, "isa_available() -> list[str]: the paths this CPU and OS can run."},
    {"set_threads", py_set_threads, METH_O, "set_threads(n) -> None: resize the thread pool to n threads (1..256)."},
    {"cap_threads", py_cap_threads, METH_O,
     "cap_threads(n) -> int: run the pool calls this thread makes from now on on at most n threads (0..256; 0: no\n"
     "cap, the pool's size); returns the previous cap. Results never depend on it. A backend caps its forwards."},
    {"pool_widest", py_pool_widest, METH_NOARGS,
     "pool_widest() -> int: test hook; the most threads a pool call from this thread was given since the last\n"
     "pool_widest() on it (0: none reached the pool), and resets it."},
    {"threads", py_threads, METH_NOARGS, "threads() -> int: threads in the pool (the caller counts as one)."},
    {"set_batch_invariant", py_set_batch_invariant, METH_O,
     "set_batch_invariant(flag) -> None: a row's matmul and attention results never depend on the other rows of the\n"
     "call (its single-row matmuls sum in the GEMM's order, attention cuts each row the same way), the thread count,\n"
     "or how a prompt was chunked. Process-wide; the server turns it on."},
    {"batch_invariant", py_batch_invariant, METH_NOARGS, "batch_invariant() -> bool: the switch above."},
    {"alloc_stats", py_alloc_stats, METH_NOARGS, "alloc_stats() -> (count, bytes) of all allocations the core made."},
    {"pool_stalls", py_pool_stalls, METH_NOARGS,
     "pool_stalls() -> int: calls in which a worker was descheduled in the middle of its chunk; after each the pool\n"
     "runs alone on the calling thread for a few milliseconds."},
    {"pool_stats", py_pool_stats, METH_NOARGS,
     "pool_stats() -> dict: the pool's counters since the process started (calls, solo_calls, stalls, joins_waited,\n"
     "join_wait_us, join_wait_max_us, caller_work_us, stolen_chunks, worker_chunks, worker_sleeps, absent_calls, takeovers; see core/threadpool.h)."},
    {"populate", py_populate, METH_O,
     "populate(buf) -> int: fault a mapping's pages under buf in for reading, waiting for the disk with the GIL\n"
     "released: 0 done, 1 only requested (a kernel before 5.14), -1 refused (not mapped, an I/O error)."},
    {"populate_write", py_populate_write, METH_O,
     "populate_write(buf) -> int: fault a writable anonymous buffer's pages in (zero-filled) with the GIL released:\n"
     "0 done, 1 not supported (a kernel before 5.14), -1 refused (out of memory, not mapped)."},
    {"read_bandwidth", (PyCFunction)(void (*)(void))py_read_bandwidth, METH_FASTCALL,
     "read_bandwidth(nbytes, threads, reps) -> list[float]: GB/s of streaming a buffer of nbytes (>= 1 MiB, in 2 MB\n"
     "pages, faulted in first) with the active ISA's widest loads on `threads` (1..threads()) threads of the pool,\n"
     "once per repetition: the read bound a decode step over that many bytes of weights can reach."},
    {"_pool_probe", (PyCFunction)(void (*)(void))py_pool_probe, METH_VARARGS | METH_KEYWORDS,
     "_pool_probe(calls, nested=False, items=64, grain=1, hold=0, stall_us=0) -> dict: run a counting task (tests)."},
    {NULL, NULL, 0, NULL},
};

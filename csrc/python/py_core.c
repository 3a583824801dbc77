/* Python bindings of the core: ISA selection, the global switches, thread pool,
 * allocation counters, and a pool probe used by tests/test_threadpool.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <string.h>

#include "core/alloc.h"
#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"
#include "python/args.h"
#include "python/bindings.h"

static PyObject *py_isa(PyObject *self, PyObject *unused) { return PyUnicode_FromString(llb_isa_name(llb_isa_current)); }

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

static PyObject *py_set_batch_invariant(PyObject *self, PyObject *arg) {
    const int v = PyObject_IsTrue(arg);
    if (v < 0) return NULL;
    llb_batch_invariant = v;
    Py_RETURN_NONE;
}

static PyObject *py_batch_invariant(PyObject *self, PyObject *unused) { return PyBool_FromLong(llb_batch_invariant); }

static PyObject *py_threads(PyObject *self, PyObject *unused) { return PyLong_FromLong(llb_pool_threads()); }

static PyObject *py_alloc_stats(PyObject *self, PyObject *unused) {
    size_t count, bytes;
    llb_alloc_stats(&count, &bytes);
    return Py_BuildValue("(nn)", (Py_ssize_t)count, (Py_ssize_t)bytes);
}

/* ---- pool probes ---------------------------------------------------------- */

#define PROBE_MAX_CALLS 1000000
struct probe {
    atomic_int runs[LLB_POOL_MAX_THREADS]; /* runs of each ith over all calls */
    atomic_int bad_nth;                /* calls that saw an nth other than the pool's */
    atomic_int nested_nth_max;         /* largest nth a nested llb_parallel reported */
    atomic_long sum;                   /* sum of ith + 1 over all runs: checks the work itself */
    int expect_nth, nested;
};

static void nested_task(void *ctx, int ith, int nth) {
    struct probe *p = ctx;
    int prev = atomic_load(&p->nested_nth_max);
    while (nth > prev && !atomic_compare_exchange_weak(&p->nested_nth_max, &prev, nth)) {}
}

static void probe_task(void *ctx, int ith, int nth) {
    struct probe *p = ctx;
    if (nth != p->expect_nth || ith < 0 || ith >= nth) {
        atomic_fetch_add(&p->bad_nth, 1);
        return;
    }
    atomic_fetch_add(&p->runs[ith], 1);
    atomic_fetch_add(&p->sum, ith + 1);
    if (p->nested) llb_parallel(nested_task, ctx); /* misuse on purpose: must run serially */
}

/* _pool_probe(calls, nested=False) -> dict(runs=[per-ith counts], bad_nth, nested_nth_max, sum) */
static PyObject *py_pool_probe(PyObject *self, PyObject *args) {
    long calls;
    int nested = 0;
    if (!PyArg_ParseTuple(args, "l|p", &calls, &nested)) return NULL;
    if (calls < 1 || calls > PROBE_MAX_CALLS) return PyErr_Format(PyExc_ValueError, "_pool_probe: calls must be in [1, %d]", PROBE_MAX_CALLS);
    struct probe *p = PyMem_Calloc(1, sizeof *p);
    if (!p) return PyErr_NoMemory();
    p->nested = nested;
    Py_BEGIN_ALLOW_THREADS
    p->expect_nth = llb_pool_threads();
    for (long i = 0; i < calls; i++) llb_parallel(probe_task, p);
    Py_END_ALLOW_THREADS
    PyObject *runs = PyList_New(p->expect_nth);
    if (!runs) {
        PyMem_Free(p);
        return NULL;
    }
    for (int i = 0; i < p->expect_nth; i++) PyList_SET_ITEM(runs, i, PyLong_FromLong(atomic_load(&p->runs[i])));
    PyObject *res = Py_BuildValue("{s:N,s:i,s:i,s:l}", "runs", runs, "bad_nth", atomic_load(&p->bad_nth), "nested_nth_max",
                                  atomic_load(&p->nested_nth_max), "sum", atomic_load(&p->sum));
    PyMem_Free(p);
    return res;
}

PyMethodDef llb_core_methods[] = {
    {"isa", py_isa, METH_NOARGS, "isa() -> str: the active SIMD path ('scalar', 'avx2' or 'avx512')."},
    {"set_isa", py_set_isa, METH_O, "set_isa(name) -> None: switch SIMD path; ValueError if unknown or unsupported here."},
    {"isa_available", py_isa_available, METH_NOARGS, "isa_available() -> list[str]: the paths this CPU and OS can run."},
    {"set_threads", py_set_threads, METH_O, "set_threads(n) -> None: resize the thread pool to n threads (1..256)."},
    {"threads", py_threads, METH_NOARGS, "threads() -> int: threads in the pool (the caller counts as one)."},
    {"set_batch_invariant", py_set_batch_invariant, METH_O,
     "set_batch_invariant(flag) -> None: a row's matmul and attention results never depend on the other rows of the\n"
     "call (its single-row matmuls sum in the GEMM's order, attention cuts each row the same way), the thread count,\n"
     "or how a prompt was chunked. Process-wide; the server turns it on."},
    {"batch_invariant", py_batch_invariant, METH_NOARGS, "batch_invariant() -> bool: the switch above."},
    {"alloc_stats", py_alloc_stats, METH_NOARGS, "alloc_stats() -> (count, bytes) of all allocations the core made."},
    {"_pool_probe", py_pool_probe, METH_VARARGS, "_pool_probe(calls, nested=False) -> dict: run a counting task (tests)."},
    {NULL, NULL, 0, NULL},
};

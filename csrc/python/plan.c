/* _native.Plan: a recorded list of op calls, replayed in C (see plan.h).
 *
 * A plan is write-once: begin() on an empty plan, the ops run (and are kept),
 * end(); after that replay() any number of times. Recording is per thread, so
 * ops another Python thread runs meanwhile are not captured. The plan owns the
 * buffer views of its calls and releases them when it is freed (or cleared by
 * the garbage collector), which is what lets the arrays be resized or freed. */
#define PY_SSIZE_T_CLEAN
#include "python/plan.h"

#include "core/threadpool.h"

#include <string.h>
#include <time.h>

struct rec {
    const char *op; /* the binding's name (a static string) */
    int (*run)(const void *args);
    int (*check)(const void *args, char *msg);
    _Alignas(16) unsigned char args[LLB_CALL_MAX_ARGS];
};

enum { EMPTY, RECORDING, RECORDED };

typedef struct {
    PyObject_HEAD
    int state;
    int incomplete; /* a call ran but could not be kept (out of memory): never replay */
    struct rec *recs;
    Py_ssize_t n_recs, cap_recs;
    /* Moved here from the bindings: only buf, len and obj stay meaningful
     * (an exporter's shape may point into the view's old home); releasing
     * needs only obj and internal, which move by value. */
    Py_buffer *views;
    Py_ssize_t n_views, cap_views;
} PlanObject;

/* The plan this thread records into (a strong reference), or NULL. */
static _Thread_local PlanObject *recording;

int llb_plan_recording(void) { return recording != NULL; }

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t elem) {
    if (need <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *q = PyMem_Realloc(*p, (size_t)cap2 * elem);
    if (!q) {
        PyErr_NoMemory();
        return -1;
    }
    *p = q;
    *cap = cap2;
    return 0;
}

/* Append c and take views[0..n) (zeroing their obj). On failure nothing is taken. */
static int keep(PlanObject *p, const struct llb_call *c, Py_buffer *const *views, int n) {
    if (grow((void **)&p->recs, &p->cap_recs, p->n_recs + 1, sizeof(struct rec)) ||
        grow((void **)&p->views, &p->cap_views, p->n_views + n, sizeof(Py_buffer)))
        return -1;
    struct rec *r = &p->recs[p->n_recs++];
    r->op = c->op;
    r->run = c->run;
    r->check = c->check;
    memcpy(r->args, c->args, c->size);
    for (int i = 0; i < n; i++) {
        if (!views[i]->obj) continue;
        p->views[p->n_views++] = *views[i];
        views[i]->obj = NULL;
    }
    return 0;
}

PyObject *llb_call(const struct llb_call *c, Py_buffer *const *views, int n) {
    PyObject *ret = NULL;
    char msg[LLB_CHECK_MSG];
    int rc;
    if (c->size > LLB_CALL_MAX_ARGS) { /* a binding's struct outgrew the record: a bug, caught by any test of it */
        PyErr_Format(PyExc_SystemError, "%s: args of %zu bytes exceed LLB_CALL_MAX_ARGS", c->op, c->size);
        goto out;
    }
    if (c->check && c->check(c->args, msg) != 0) {
        PyErr_SetString(PyExc_ValueError, msg);
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = c->run(c->args);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_NoMemory();
        goto out;
    }
    if (recording && keep(recording, c, views, n) != 0) {
        recording->incomplete = 1;
        goto out;
    }
    ret = Py_NewRef(Py_None);
out:
    for (int i = 0; i < n; i++) PyBuffer_Release(views[i]); /* no-op for the views a plan took */
    return ret;
}

/* ---- the Python type ------------------------------------------------------- */

static void release_views(PlanObject *p) {
    /* Detach first: a release may run arbitrary code that reaches this plan. */
    Py_buffer *views = p->views;
    const Py_ssize_t n = p->n_views;
    p->views = NULL;
    p->n_views = p->cap_views = 0;
    for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
}

static int plan_clear(PlanObject *p) {
    release_views(p);
    PyMem_Free(p->recs);
    p->recs = NULL;
    p->n_recs = p->cap_recs = 0;
    return 0;
}

static int plan_traverse(PlanObject *p, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < p->n_views; i++) Py_VISIT(p->views[i].obj);
    return 0;
}

static void plan_dealloc(PlanObject *p) {
    PyObject_GC_UnTrack(p);
    plan_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds)))
        return PyErr_Format(PyExc_TypeError, "Plan() takes no arguments");
    return type->tp_alloc(type, 0); /* zeroed: EMPTY, no records */
}

static PyObject *plan_begin(PlanObject *p, PyObject *unused) {
    if (recording)
        return PyErr_Format(PyExc_RuntimeError, "Plan.begin: this thread is already recording a plan");
    if (p->state != EMPTY)
        return PyErr_Format(PyExc_RuntimeError, "Plan.begin: a plan is recorded once; make a new Plan");
    p->state = RECORDING;
    recording = (PlanObject *)Py_NewRef(p);
    Py_RETURN_NONE;
}

static PyObject *plan_end(PlanObject *p, PyObject *unused) {
    if (recording != p)
        return PyErr_Format(PyExc_RuntimeError, "Plan.end: this plan is not being recorded on this thread");
    p->state = RECORDED;
    recording = NULL;
    Py_DECREF(p);
    Py_RETURN_NONE;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The calls in order; with times (an element per call), each call's nanoseconds added to its element:
 * what a step's time goes to, for benchmarks (two clock reads per call, only when asked). */
static int run_recs(const struct rec *recs, Py_ssize_t n, int64_t *times, char *msg) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const struct rec *r = &recs[i];
        const int64_t t0 = times ? now_ns() : 0;
        if (r->check && r->check(r->args, msg) != 0) return 1; /* an earlier call wrote its ids */
        if (r->run(r->args) != 0) return 2;
        if (times) times[i] += now_ns() - t0;
    }
    return 0;
}

/* times=None, or a writable C-contiguous int64 buffer of exactly n elements (acquired into view). */
static int64_t *times_arg(PyObject *obj, Py_ssize_t n, Py_buffer *view) {
    if (obj == Py_None) return NULL;
    const int got = PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) == 0;
    const char *f = got && view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (got && view->itemsize == 8 && (!strcmp(f, "q") || !strcmp(f, "l")) && view->len == n * 8 &&
        (uintptr_t)view->buf % 8 == 0)
        return view->buf;
    if (got) PyBuffer_Release(view);
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError,
                 "Plan.replay: times must be a writable, C-contiguous, aligned int64 buffer of len(plan) = %zd elements", n);
    return NULL;
}

static PyObject *plan_replay(PlanObject *p, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"threads", "times", NULL};
    long threads = 0;
    PyObject *times_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$lO:replay", kwlist, &threads, &times_obj)) return NULL;
    if (threads < 0 || threads > LLB_POOL_MAX_THREADS)
        return PyErr_Format(PyExc_ValueError, "Plan.replay: threads must be 0..%d, got %ld", LLB_POOL_MAX_THREADS,
                            threads);
    if (p->state != RECORDED)
        return PyErr_Format(PyExc_RuntimeError, "Plan.replay: the plan is %s; call begin(), the ops, then end() first",
                            p->state == EMPTY ? "empty" : "still being recorded");
    if (recording)
        return PyErr_Format(PyExc_RuntimeError,
                            "Plan.replay: this thread is recording a plan, which cannot hold a replay");
    if (p->incomplete)
        return PyErr_Format(PyExc_RuntimeError,
                            "Plan.replay: a call could not be recorded (out of memory); record again");
    char msg[LLB_CHECK_MSG];
    const struct rec *recs = p->recs;
    const Py_ssize_t n = p->n_recs;
    for (Py_ssize_t i = 0; i < n; i++)
        if (recs[i].check && recs[i].check(recs[i].args, msg) != 0) {
            PyErr_SetString(PyExc_ValueError, msg);
            return NULL;
        }
    Py_buffer view = {0};
    int64_t *times = times_arg(times_obj, n, &view);
    if (!times && PyErr_Occurred()) return NULL;
    int failed; /* 1: a check failed mid-plan, 2: out of memory */
    Py_BEGIN_ALLOW_THREADS
    const int cap = llb_pool_cap_thread_within((int)threads); /* never above the calling thread's cap (a model's) */
    failed = run_recs(recs, n, times, msg);
    llb_pool_cap_thread(cap);
    Py_END_ALLOW_THREADS
    if (times) PyBuffer_Release(&view);
    if (failed == 1) return PyErr_Format(PyExc_ValueError, "%s (written by an earlier op of the plan)", msg);
    if (failed == 2) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static Py_ssize_t plan_len(PlanObject *p) { return p->n_recs; }

static PyObject *plan_get_buffers(PlanObject *p, void *unused) { return PyLong_FromSsize_t(p->n_views); }

static PyObject *plan_get_ops(PlanObject *p, void *unused) {
    PyObject *t = PyTuple_New(p->n_recs);
    for (Py_ssize_t i = 0; t && i < p->n_recs; i++) {
        PyObject *s = PyUnicode_FromString(p->recs[i].op);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *plan_repr(PlanObject *p) {
    static const char *const states[] = {"empty", "recording", "recorded"};
    return PyUnicode_FromFormat("<_native.Plan %s, %zd calls, %zd buffers>", states[p->state], p->n_recs, p->n_views);
}

static PyMethodDef plan_methods[] = {
    {"begin", (PyCFunction)plan_begin, METH_NOARGS,
     "begin() -> None: record every op this thread runs from now on into this (empty) plan."},
    {"end", (PyCFunction)plan_end, METH_NOARGS, "end() -> None: stop recording; the plan can now be replayed."},
    {"replay", (PyCFunction)(void (*)(void))plan_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(*, threads=0, times=None) -> None: run the recorded ops again, in order, with the GIL released once, on\n"
     "at most `threads` threads (0: the pool's size), never more than the calling thread's cap (cap_threads;\n"
     "results never depend on it). Token ids, slots and\n"
     "positions are re-read from their buffers and re-validated first: ValueError (and nothing written) if any is\n"
     "out of range. times: an int64 array of len(plan) elements, each call's wall nanoseconds added to its\n"
     "element (for benchmarks; `ops` names the calls)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"buffers", (getter)plan_get_buffers, NULL, "number of buffer views the plan holds (and pins)", NULL},
    {"ops", (getter)plan_get_ops, NULL, "tuple of each recorded call's op name, in order", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods plan_as_sequence = {.sq_length = (lenfunc)plan_len};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "llambda._native.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Plan() -> an empty op plan. begin(); run ops; end(); then replay() them from C.\n"
              "len(plan) is the number of recorded calls.",
    .tp_new = plan_new,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_traverse = (traverseproc)plan_traverse,
    .tp_clear = (inquiry)plan_clear,
    .tp_repr = (reprfunc)plan_repr,
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
    .tp_as_sequence = &plan_as_sequence,
};

int llb_plan_add_type(PyObject *module) {
    if (PyType_Ready(&PlanType) < 0) return -1;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(module, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        return -1;
    }
    return 0;
}

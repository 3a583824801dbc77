/* Argument parsing shared by every binding: see args.h. */
#define PY_SSIZE_T_CLEAN
#include "python/args.h"

#include <math.h>
#include <stdint.h>

int llb_arg_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t want, const char *sig) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s(%s) takes %zd positional arguments, got %zd", fn, sig, want, nargs);
    return -1;
}

int llb_arg_long(PyObject *o, const char *fn, const char *name, long lo, long hi, long *out) {
    PyObject *idx = PyNumber_Index(o);
    if (!idx) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.100s", fn, name, Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    const long v = PyLong_AsLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%ld, %ld], got %S", fn, name, lo, hi, o);
        return -1;
    }
    *out = v;
    return 0;
}

int llb_arg_float(PyObject *o, const char *fn, const char *name, double lo, float *out) {
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    if (!isfinite(v) || v < lo || fabs(v) > 3.0e38) {
        if (isinf(lo)) {
            PyErr_Format(PyExc_ValueError, "%s: %s must be a finite float32 value, got %S", fn, name, o);
        } else {
            /* PyErr_Format has no %g (it would print the rest of the format raw): the bound
             * goes in as a float object. */
            PyObject *bound = PyFloat_FromDouble(lo);
            if (bound) {
                PyErr_Format(PyExc_ValueError, "%s: %s must be finite and >= %R, got %S", fn, name, bound, o);
                Py_DECREF(bound);
            }
        }
        return -1;
    }
    *out = (float)v;
    return 0;
}

int llb_arg_product(const char *fn, size_t *out, size_t a, size_t b, size_t c, size_t d) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || __builtin_mul_overflow(abc, d, out)) {
        PyErr_Format(PyExc_ValueError, "%s: dims too large: the element count overflows", fn);
        return -1;
    }
    return 0;
}

static const char *const elem_names[] = {"bytes", "float32", "int32", "float16"};
static const size_t elem_sizes[] = {1, 4, 4, 2};

static int format_ok(const char *fmt, Py_ssize_t itemsize, enum llb_elem kind) {
    if (kind == LLB_ELEM_BYTES) return 1; /* raw weights: any element type, counted in bytes */
    if (!fmt) fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++; /* native / little-endian (x86, arm64) */
    if (!fmt[0] || fmt[1]) return 0;
    const char c = fmt[0];
    if ((c == 'B' || c == 'b' || c == 'c') && itemsize == 1) return 1; /* raw bytes of an arena */
    switch (kind) {
    case LLB_ELEM_F32: return c == 'f' && itemsize == 4;
    case LLB_ELEM_I32: return (c == 'i' || c == 'l') && itemsize == 4;
    case LLB_ELEM_F16: return (c == 'e' || c == 'H') && itemsize == 2;
    default: return 0;
    }
}

void *llb_arg_buf(struct llb_bufs *bufs, PyObject *obj, const char *fn, const char *name, int writable,
                  enum llb_elem kind, size_t count, int exact) {
    if (bufs->count >= LLB_ARG_MAX_BUFS) { /* a binding asked for more than it declared: a bug */
        PyErr_Format(PyExc_SystemError, "%s: more than %d buffers", fn, LLB_ARG_MAX_BUFS);
        return NULL;
    }
    Py_buffer *v = &bufs->views[bufs->count];
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(bufs->error, "%s: %s must be a %sC-contiguous %s buffer, got %.100s (%S)", fn, name,
                     writable ? "writable " : "", elem_names[kind], Py_TYPE(obj)->tp_name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    bufs->count++;
    if (!format_ok(v->format, v->itemsize, kind)) {
        PyErr_Format(bufs->error, "%s: %s must hold %s, got buffer format '%s' (itemsize %zd)", fn, name,
                     elem_names[kind], v->format ? v->format : "B", v->itemsize);
        return NULL;
    }
    const size_t esize = elem_sizes[kind];
    if ((uintptr_t)v->buf % esize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %s is not aligned to its %zu-byte elements", fn, name, esize);
        return NULL;
    }
    size_t need;
    if (__builtin_mul_overflow(count, esize, &need) || need > (size_t)PY_SSIZE_T_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s would need more than %zd bytes", fn, name, PY_SSIZE_T_MAX);
        return NULL;
    }
    if (exact ? (size_t)v->len != need : (size_t)v->len < need) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zd bytes but the dims given need %s%zu (%zu %s elements)", fn,
                     name, v->len, exact ? "exactly " : "", need, count, elem_names[kind]);
        return NULL;
    }
    return v->buf;
}

int llb_bufs_overlap(const struct llb_bufs *bufs, int i, int j) {
    const char *pa = bufs->views[i].buf, *pb = bufs->views[j].buf;
    return pa < pb + bufs->views[j].len && pb < pa + bufs->views[i].len;
}

int llb_bufs_written_overlap(const struct llb_bufs *bufs, const int *written, int n_written, int *w, int *o) {
    for (int k = 0; k < n_written; k++)
        for (int i = 0; i < bufs->count; i++)
            if (i != written[k] && llb_bufs_overlap(bufs, written[k], i)) {
                *w = written[k], *o = i;
                return 1;
            }
    return 0;
}

void llb_bufs_release(struct llb_bufs *bufs) {
    for (int i = 0; i < bufs->count; i++) PyBuffer_Release(&bufs->views[i]);
    bufs->count = 0;
}

PyObject *llb_bufs_call(struct llb_bufs *bufs, const char *fn, int (*run)(const void *),
                        int (*check)(const void *, char *), const void *args, size_t size) {
    Py_buffer *views[LLB_ARG_MAX_BUFS];
    for (int i = 0; i < bufs->count; i++) views[i] = &bufs->views[i];
    const struct llb_call c = {fn, run, check, args, size};
    PyObject *r = llb_call(&c, views, bufs->count); /* releases the views or hands them to a plan */
    bufs->count = 0;
    return r;
}

PyObject *llb_bufs_call_out_apart(struct llb_bufs *h, const char *op, int same_ok, int (*run)(const void *),
                                  int (*check)(const void *, char *), const void *a, size_t size) {
    const int o = h->count - 1;
    for (int i = 0; i < o; i++)
        if (llb_bufs_overlap(h, i, o) && !(same_ok && h->views[i].buf == h->views[o].buf && h->views[i].len == h->views[o].len)) {
            PyErr_Format(PyExc_ValueError, "%s: out overlaps an input%s", op, same_ok ? " without being it" : "");
            llb_bufs_release(h);
            return NULL;
        }
    return llb_bufs_call(h, op, run, check, a, size);
}

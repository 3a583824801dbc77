/* Python bindings of the quantized matrix kernels. Every argument is checked
 * here (types, dims, buffer sizes, contiguity, ids) before the GIL is
 * released; the C functions behind them trust their inputs. The ops run
 * through llb_call (python/plan.c), so a recording Plan keeps them; get_rows' ids are
 * re-checked by check_rows on every replay. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>

#include "python/bindings.h"
#include "matmul/matmul.h"
#include "matmul/kernels.h"
#include "python/plan.h"

#define MAX_DIM 0x7FFFFFFFL /* rows, cols, n: keeps every index product far from overflow */

typedef struct {
    Py_buffer view;
    int held;
} buf_t;

static void release(buf_t *b, int count) {
    for (int i = 0; i < count; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

static int arg_long(const char *fn, const char *name, PyObject *o, long lo, long hi, long *out) {
    PyObject *idx = PyNumber_Index(o);
    if (!idx) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be an int, not %.100s", fn, name, Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long v = PyLong_AsLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%ld, %ld], got %S", fn, name, lo, hi, o);
        return -1;
    }
    *out = v;
    return 0;
}

static const llb_type_info *arg_type(const char *fn, PyObject *o) {
    long q;
    if (arg_long(fn, "qtype", o, LONG_MIN, LONG_MAX, &q) < 0) return NULL;
    const llb_type_info *t = llb_type_get((int)q);
    if (!t || q != (int)q)
        PyErr_Format(PyExc_ValueError,
                     "%s: unsupported qtype %ld (supported ggml ids: F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q8_0=8 Q4_K=12 "
                     "Q6_K=14 BF16=30)",
                     fn, q);
    return t && q == (int)q ? t : NULL;
}

/* Block-size, positivity and range checks of a weight matrix's dims. */
static int arg_dims(const char *fn, const llb_type_info *t, PyObject *orows, PyObject *ocols, long *rows, long *cols) {
    if (arg_long(fn, "rows", orows, 1, MAX_DIM, rows) < 0 || arg_long(fn, "cols", ocols, 1, MAX_DIM, cols) < 0) return -1;
    if (*cols % t->block) {
        PyErr_Format(PyExc_ValueError, "%s: cols=%ld is not a multiple of the %s block size %d", fn, *cols, t->name,
                     t->block);
        return -1;
    }
    return 0;
}

static int arg_layout(const char *fn, const llb_type_info *t, PyObject *o, long *layout) {
    if (arg_long(fn, "layout", o, LONG_MIN, LONG_MAX, layout) < 0) return -1;
    if (*layout != LLB_LAYOUT_FILE && *layout != llb_pack_layout(t)) {
        PyErr_Format(PyExc_ValueError, "%s: layout %ld is not valid for %s (use 0 = file layout or the id pack() returned)",
                     fn, *layout, t->name);
        return -1;
    }
    return 0;
}

enum { ANY_BYTES = 0, F32 = 'f', I32 = 'i' };

/* A C-contiguous buffer of at least `need` bytes, of the given element kind, writable if asked. */
static int arg_buffer(const char *fn, const char *name, PyObject *o, int kind, int writable, size_t need, buf_t *b) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, &b->view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s must be a %sC-contiguous buffer%s, got %.100s", fn, name,
                     writable ? "writable " : "",
                     kind == F32 ? " of float32" : kind == I32 ? " of int32" : "", Py_TYPE(o)->tp_name);
        return -1;
    }
    b->held = 1;
    if (kind != ANY_BYTES) {
        const char *f = b->view.format ? b->view.format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        const int ok = b->view.itemsize == 4 && f[1] == 0 &&
                       (kind == F32 ? f[0] == 'f' : (f[0] == 'i' || f[0] == 'l'));
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s: %s must hold %s, got format '%s' with itemsize %zd", fn, name,
                         kind == F32 ? "float32" : "int32", b->view.format ? b->view.format : "B", b->view.itemsize);
            return -1;
        }
    }
    if ((size_t)b->view.len < need) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds %zd bytes but the given dims need %zu", fn, name, b->view.len, need);
        return -1;
    }
    return 0;
}

static int overlaps(const buf_t *a, const buf_t *b) {
    const char *pa = a->view.buf, *pb = b->view.buf;
    return pa < pb + b->view.len && pb < pa + a->view.len;
}

static int check_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t want, const char *sig) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%s), got %zd", fn, want, sig, nargs);
    return -1;
}

/* Run (and maybe record, see plan.h) a validated call; llb_call takes over the held views. */
static PyObject *finish(const char *fn, int (*run)(const void *), int (*check)(const void *, char *), const void *args,
                        size_t size, buf_t *b, int count) {
    Py_buffer *views[1 + 2 * LLB_MM_MAX_PARTS];
    int n = 0;
    for (int i = 0; i < count && n < 1 + 2 * LLB_MM_MAX_PARTS; i++)
        if (b[i].held) views[n++] = &b[i].view;
    const struct llb_call c = {fn, run, check, args, size};
    return llb_call(&c, views, n);
}

/* row_bytes(qtype, cols) -> int */
static PyObject *py_row_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long cols;
    const llb_type_info *t;
    if (check_nargs("row_bytes", nargs, 2, "qtype, cols") < 0 || !(t = arg_type("row_bytes", args[0]))) return NULL;
    if (arg_long("row_bytes", "cols", args[1], 1, MAX_DIM, &cols) < 0) return NULL;
    if (cols % t->block)
        return PyErr_Format(PyExc_ValueError, "row_bytes: cols=%ld is not a multiple of the %s block size %d", cols,
                            t->name, t->block);
    return PyLong_FromSize_t(llb_row_bytes(t, cols));
}

/* packed_size(qtype, rows, cols) -> int */
static PyObject *py_packed_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long rows, cols;
    const llb_type_info *t;
    if (check_nargs("packed_size", nargs, 3, "qtype, rows, cols") < 0 || !(t = arg_type("packed_size", args[0])))
        return NULL;
    if (arg_dims("packed_size", t, args[1], args[2], &rows, &cols) < 0) return NULL;
    return PyLong_FromSize_t(llb_matrix_bytes(t, llb_pack_layout(t), rows, cols));
}

/* pack(qtype, src, dst, rows, cols) -> layout */
static PyObject *py_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "pack";
    long rows, cols;
    const llb_type_info *t;
    buf_t b[2] = {{{0}}};
    if (check_nargs(fn, nargs, 5, "qtype, src, dst, rows, cols") < 0 || !(t = arg_type(fn, args[0]))) return NULL;
    if (llb_plan_recording()) /* load-time work a plan does not hold: refuse rather than leave it out silently */
        return PyErr_Format(PyExc_RuntimeError, "pack: cannot run while this thread records a Plan");
    if (arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0) return NULL;
    const int layout = llb_pack_layout(t);
    if (arg_buffer(fn, "src", args[1], ANY_BYTES, 0, llb_matrix_bytes(t, LLB_LAYOUT_FILE, rows, cols), &b[0]) < 0 ||
        arg_buffer(fn, "dst", args[2], ANY_BYTES, 1, llb_matrix_bytes(t, layout, rows, cols), &b[1]) < 0)
        goto fail;
    if (overlaps(&b[0], &b[1])) {
        PyErr_SetString(PyExc_ValueError, "pack: src and dst overlap");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    llb_pack(t, b[0].view.buf, rows, cols, b[1].view.buf);
    Py_END_ALLOW_THREADS
    release(b, 2);
    return PyLong_FromLong(layout);
fail:
    release(b, 2);
    return NULL;
}

struct matmul_args {
    const llb_type_info *t;
    int layout, exact;
    const uint8_t *w;
    long rows, cols, n;
    const float *x;
    float *out;
};
LLB_CALL_ARGS_FIT(struct matmul_args);
static int run_matmul(const void *p) {
    const struct matmul_args *a = p;
    return llb_matmul(a->t, a->layout, a->w, a->rows, a->cols, a->x, a->out, a->n, a->exact);
}

/* matmul(qtype, layout, W, rows, cols, x, out, n, exact) -> None */
static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "matmul";
    long rows, cols, layout, n, exact;
    const llb_type_info *t;
    buf_t b[3] = {{{0}}};
    if (check_nargs(fn, nargs, 9, "qtype, layout, W, rows, cols, x, out, n, exact") < 0 || !(t = arg_type(fn, args[0])))
        return NULL;
    if (arg_layout(fn, t, args[1], &layout) < 0 || arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0 ||
        arg_long(fn, "n", args[7], 1, MAX_DIM, &n) < 0 || arg_long(fn, "exact", args[8], 0, 1, &exact) < 0)
        return NULL;
    size_t xbytes, obytes;
    if (__builtin_mul_overflow((size_t)n, (size_t)cols * 4, &xbytes) ||
        __builtin_mul_overflow((size_t)n, (size_t)rows * 4, &obytes))
        return PyErr_Format(PyExc_ValueError, "matmul: n=%ld is too large for these dims", n);
    if (arg_buffer(fn, "W", args[2], ANY_BYTES, 0, llb_matrix_bytes(t, (int)layout, rows, cols), &b[0]) < 0 ||
        arg_buffer(fn, "x", args[5], F32, 0, xbytes, &b[1]) < 0 || arg_buffer(fn, "out", args[6], F32, 1, obytes, &b[2]) < 0)
        goto fail;
    if (overlaps(&b[2], &b[1]) || overlaps(&b[2], &b[0])) {
        PyErr_SetString(PyExc_ValueError, "matmul: out overlaps x or W");
        goto fail;
    }
    const struct matmul_args a = {.t = t, .layout = (int)layout, .exact = (int)exact, .w = b[0].view.buf,
                                  .rows = rows, .cols = cols, .n = n, .x = b[1].view.buf, .out = b[2].view.buf};
    return finish(fn, run_matmul, NULL, &a, sizeof a, b, 3);
fail:
    release(b, 3);
    return NULL;
}

struct matmul_many_args {
    const llb_type_info *t;
    int n_parts, exact;
    long cols, n;
    const float *x;
    llb_mm_part parts[LLB_MM_MAX_PARTS];
};
LLB_CALL_ARGS_FIT(struct matmul_many_args);
static int run_matmul_many(const void *p) {
    const struct matmul_many_args *a = p;
    return llb_matmul_many(a->t, a->parts, a->n_parts, a->cols, a->x, a->n, a->exact);
}

/* matmul_many(qtype, cols, x, n, exact, parts) -> None; parts: a tuple of 1..3 (layout, W, rows, out) */
static PyObject *py_matmul_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "matmul_many";
    enum { NB = 1 + 2 * LLB_MM_MAX_PARTS };
    long cols, n, exact;
    const llb_type_info *t;
    buf_t b[NB] = {{{0}}}; /* x, then W and out per part */
    if (check_nargs(fn, nargs, 6, "qtype, cols, x, n, exact, parts") < 0 || !(t = arg_type(fn, args[0]))) return NULL;
    if (arg_long(fn, "cols", args[1], 1, MAX_DIM, &cols) < 0 || arg_long(fn, "n", args[3], 1, MAX_DIM, &n) < 0 ||
        arg_long(fn, "exact", args[4], 0, 1, &exact) < 0)
        return NULL;
    if (cols % t->block)
        return PyErr_Format(PyExc_ValueError, "%s: cols=%ld is not a multiple of the %s block size %d", fn, cols, t->name,
                            t->block);
    if (!PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) < 1 || PyTuple_GET_SIZE(args[5]) > LLB_MM_MAX_PARTS)
        return PyErr_Format(PyExc_TypeError, "%s: parts must be a tuple of 1 to %d (layout, W, rows, out) tuples", fn,
                            LLB_MM_MAX_PARTS);
    struct matmul_many_args a = {.t = t, .n_parts = (int)PyTuple_GET_SIZE(args[5]), .exact = (int)exact, .cols = cols,
                                 .n = n};
    size_t xbytes;
    if (__builtin_mul_overflow((size_t)n, (size_t)cols * 4, &xbytes))
        return PyErr_Format(PyExc_ValueError, "%s: n=%ld is too large for these dims", fn, n);
    if (arg_buffer(fn, "x", args[2], F32, 0, xbytes, &b[0]) < 0) goto fail;
    a.x = b[0].view.buf;
    for (int i = 0; i < a.n_parts; i++) {
        PyObject *part = PyTuple_GET_ITEM(args[5], i);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 4) {
            PyErr_Format(PyExc_TypeError, "%s: parts[%d] must be a (layout, W, rows, out) tuple", fn, i);
            goto fail;
        }
        long layout, rows;
        size_t obytes;
        if (arg_layout(fn, t, PyTuple_GET_ITEM(part, 0), &layout) < 0 ||
            arg_long(fn, "rows", PyTuple_GET_ITEM(part, 2), 1, MAX_DIM, &rows) < 0)
            goto fail;
        if (__builtin_mul_overflow((size_t)n, (size_t)rows * 4, &obytes)) {
            PyErr_Format(PyExc_ValueError, "%s: n=%ld is too large for these dims", fn, n);
            goto fail;
        }
        buf_t *w = &b[1 + 2 * i], *out = &b[2 + 2 * i];
        if (arg_buffer(fn, "W", PyTuple_GET_ITEM(part, 1), ANY_BYTES, 0, llb_matrix_bytes(t, (int)layout, rows, cols), w) < 0 ||
            arg_buffer(fn, "out", PyTuple_GET_ITEM(part, 3), F32, 1, obytes, out) < 0)
            goto fail;
        a.parts[i] = (llb_mm_part){.layout = (int)layout, .w = w->view.buf, .rows = rows, .out = out->view.buf};
    }
    /* every out apart from x, every W and every other out */
    for (int i = 0; i < a.n_parts; i++) {
        const buf_t *out = &b[2 + 2 * i];
        int bad = overlaps(out, &b[0]);
        for (int j = 0; j < a.n_parts; j++) bad |= overlaps(out, &b[1 + 2 * j]) || (j != i && overlaps(out, &b[2 + 2 * j]));
        if (bad) {
            PyErr_Format(PyExc_ValueError, "%s: parts[%d]'s out overlaps x, a W or another out", fn, i);
            goto fail;
        }
    }
    return finish(fn, run_matmul_many, NULL, &a, sizeof a, b, NB);
fail:
    release(b, NB);
    return NULL;
}

struct rows_args {
    const char *fn;
    const llb_type_info *t;
    int layout;
    const uint8_t *w;
    long rows, cols, n;
    const int32_t *ids; /* NULL: rows 0..n-1 */
    float *out;
};
LLB_CALL_ARGS_FIT(struct rows_args);
static int run_rows(const void *p) {
    const struct rows_args *a = p;
    llb_get_rows(a->t, a->layout, a->w, a->rows, a->cols, a->ids, a->out, a->n);
    return 0;
}
/* Every id a row of the table; runs without the GIL too (at plan replay). */
static int check_rows(const void *p, char *msg) {
    const struct rows_args *a = p;
    for (long i = 0; a->ids && i < a->n; i++)
        if (a->ids[i] < 0 || a->ids[i] >= a->rows) {
            snprintf(msg, LLB_CHECK_MSG, "%s: ids[%ld]=%d is out of range [0, %ld)", a->fn, i, (int)a->ids[i], a->rows);
            return -1;
        }
    return 0;
}

/* Shared by get_rows (ids given) and dequant_rows (all rows). */
static PyObject *rows_common(const char *fn, PyObject *const *args, PyObject *oids, PyObject *oout, PyObject *on) {
    long rows, cols, layout, n;
    const llb_type_info *t;
    buf_t b[3] = {{{0}}};
    if (!(t = arg_type(fn, args[0]))) return NULL;
    if (arg_layout(fn, t, args[1], &layout) < 0 || arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0) return NULL;
    if (on && arg_long(fn, "n", on, 1, MAX_DIM, &n) < 0) return NULL;
    if (!on) n = rows;
    size_t obytes;
    if (__builtin_mul_overflow((size_t)n, (size_t)cols * 4, &obytes))
        return PyErr_Format(PyExc_ValueError, "%s: n=%ld is too large for these dims", fn, n);
    if (arg_buffer(fn, "W", args[2], ANY_BYTES, 0, llb_matrix_bytes(t, (int)layout, rows, cols), &b[0]) < 0 ||
        arg_buffer(fn, "out", oout, F32, 1, obytes, &b[1]) < 0 ||
        (oids && arg_buffer(fn, "ids", oids, I32, 0, (size_t)n * 4, &b[2]) < 0))
        goto fail;
    if (overlaps(&b[1], &b[0]) || (oids && overlaps(&b[1], &b[2]))) {
        PyErr_Format(PyExc_ValueError, "%s: out overlaps an input", fn);
        goto fail;
    }
    const struct rows_args a = {fn, t, (int)layout, b[0].view.buf, rows, cols, n, oids ? b[2].view.buf : NULL,
                                b[1].view.buf};
    return finish(fn, run_rows, oids ? check_rows : NULL, &a, sizeof a, b, 3);
fail:
    release(b, 3);
    return NULL;
}

/* get_rows(qtype, layout, table, rows, cols, ids, out, n) -> None */
static PyObject *py_get_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("get_rows", nargs, 8, "qtype, layout, table, rows, cols, ids, out, n") < 0) return NULL;
    return rows_common("get_rows", args, args[5], args[6], args[7]);
}

/* dequant_rows(qtype, layout, W, rows, cols, out) -> None */
static PyObject *py_dequant_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_nargs("dequant_rows", nargs, 6, "qtype, layout, W, rows, cols, out") < 0) return NULL;
    return rows_common("dequant_rows", args, NULL, args[5], NULL);
}

PyMethodDef llb_matmul_methods[] = {
    {"row_bytes", (PyCFunction)(void (*)(void))py_row_bytes, METH_FASTCALL,
     "row_bytes(qtype, cols) -> int: bytes of one row in the file layout."},
    {"packed_size", (PyCFunction)(void (*)(void))py_packed_size, METH_FASTCALL,
     "packed_size(qtype, rows, cols) -> int: bytes pack() writes (the kernel layout)."},
    {"pack", (PyCFunction)(void (*)(void))py_pack, METH_FASTCALL,
     "pack(qtype, src, dst, rows, cols) -> int: repack file-layout rows into dst; returns the layout id for matmul."},
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL,
     "matmul(qtype, layout, W, rows, cols, x, out, n, exact) -> None: out[n, rows] = x[n, cols] @ W^T.\n"
     "exact=1: FP32 activations; exact=0: activations quantized to 8-bit blocks where the type allows."},
    {"matmul_many", (PyCFunction)(void (*)(void))py_matmul_many, METH_FASTCALL,
     "matmul_many(qtype, cols, x, n, exact, parts) -> None: out = x @ W.T for each (layout, W, rows, out) of parts\n"
     "(1 to 3 matrices of one type): the activations quantized once, one fork/join; each out equals matmul's."},
    {"get_rows", (PyCFunction)(void (*)(void))py_get_rows, METH_FASTCALL,
     "get_rows(qtype, layout, table, rows, cols, ids, out, n) -> None: out[i] = dequant(table[ids[i]]) (ids int32)."},
    {"dequant_rows", (PyCFunction)(void (*)(void))py_dequant_rows, METH_FASTCALL,
     "dequant_rows(qtype, layout, W, rows, cols, out) -> None: the whole matrix as float32."},
    {NULL, NULL, 0, NULL},
};

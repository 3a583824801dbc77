/* Python bindings of the quantized matrix kernels. Every argument is checked
 * here (types, dims, buffer sizes, contiguity, ids) before the GIL is
 * released; the C functions behind them trust their inputs. The ops run
 * through llb_call (python/plan.c), so a recording Plan keeps them; get_rows' ids are
 * re-checked by check_rows on every replay. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>

#include "matmul/matmul.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/plan.h"

#define MAX_DIM LLB_ARG_MAX_DIM

/* Buffers of the matmul bindings: a wrong kind is a TypeError (see args.h). */
#define MM_BUFS {.error = PyExc_TypeError, .count = 0}

static const llb_type_info *arg_type(const char *fn, PyObject *o) {
    long q;
    if (llb_arg_long(o, fn, "qtype", LONG_MIN, LONG_MAX, &q) < 0) return NULL;
    const llb_type_info *t = q == (int)q ? llb_type_get((int)q) : NULL;
    if (!t)
        PyErr_Format(PyExc_ValueError,
                     "%s: unsupported qtype %ld (supported ggml ids: F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q8_0=8 Q4_K=12 "
                     "Q6_K=14 BF16=30)",
                     fn, q);
    return t;
}

/* cols in range and a whole number of the type's blocks. */
static int arg_cols(const char *fn, const llb_type_info *t, PyObject *o, long *cols) {
    if (llb_arg_long(o, fn, "cols", 1, MAX_DIM, cols) < 0) return -1;
    if (*cols % t->block) {
        PyErr_Format(PyExc_ValueError, "%s: cols=%ld is not a multiple of the %s block size %d", fn, *cols, t->name,
                     t->block);
        return -1;
    }
    return 0;
}

/* A weight matrix's dims. */
static int arg_dims(const char *fn, const llb_type_info *t, PyObject *orows, PyObject *ocols, long *rows, long *cols) {
    if (llb_arg_long(orows, fn, "rows", 1, MAX_DIM, rows) < 0) return -1;
    return arg_cols(fn, t, ocols, cols);
}

static int arg_layout(const char *fn, const llb_type_info *t, PyObject *o, long *layout) {
    if (llb_arg_long(o, fn, "layout", LONG_MIN, LONG_MAX, layout) < 0) return -1;
    if (*layout != LLB_LAYOUT_FILE && *layout != llb_pack_layout(t)) {
        PyErr_Format(PyExc_ValueError, "%s: layout %ld is not valid for %s (use 0 = file layout or the id pack() returned)",
                     fn, *layout, t->name);
        return -1;
    }
    return 0;
}

/* row_bytes(qtype, cols) -> int */
static PyObject *py_row_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "row_bytes";
    long cols;
    const llb_type_info *t;
    if (llb_arg_nargs(fn, nargs, 2, "qtype, cols") < 0 || !(t = arg_type(fn, args[0])) || arg_cols(fn, t, args[1], &cols) < 0)
        return NULL;
    return PyLong_FromSize_t(llb_row_bytes(t, cols));
}

/* packed_size(qtype, rows, cols) -> int */
static PyObject *py_packed_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "packed_size";
    long rows, cols;
    const llb_type_info *t;
    if (llb_arg_nargs(fn, nargs, 3, "qtype, rows, cols") < 0 || !(t = arg_type(fn, args[0])) ||
        arg_dims(fn, t, args[1], args[2], &rows, &cols) < 0)
        return NULL;
    return PyLong_FromSize_t(llb_matrix_bytes(t, llb_pack_layout(t), rows, cols));
}

/* pack(qtype, src, dst, rows, cols) -> layout */
static PyObject *py_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "pack";
    long rows, cols;
    const llb_type_info *t;
    struct llb_bufs b = MM_BUFS;
    if (llb_arg_nargs(fn, nargs, 5, "qtype, src, dst, rows, cols") < 0 || !(t = arg_type(fn, args[0]))) return NULL;
    if (llb_plan_recording()) /* load-time work a plan does not hold: refuse rather than leave it out silently */
        return PyErr_Format(PyExc_RuntimeError, "pack: cannot run while this thread records a Plan");
    if (arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0) return NULL;
    const int layout = llb_pack_layout(t);
    const uint8_t *src = llb_arg_buf(&b, args[1], fn, "src", 0, LLB_ELEM_BYTES, llb_matrix_bytes(t, LLB_LAYOUT_FILE, rows, cols), 0);
    uint8_t *dst = src ? llb_arg_buf(&b, args[2], fn, "dst", 1, LLB_ELEM_BYTES, llb_matrix_bytes(t, layout, rows, cols), 0) : NULL;
    if (!dst) goto fail;
    if (llb_bufs_overlap(&b, 0, 1)) {
        PyErr_SetString(PyExc_ValueError, "pack: src and dst overlap");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    llb_pack(t, src, rows, cols, dst);
    Py_END_ALLOW_THREADS
    llb_bufs_release(&b);
    return PyLong_FromLong(layout);
fail:
    llb_bufs_release(&b);
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
    struct llb_bufs b = MM_BUFS;
    if (llb_arg_nargs(fn, nargs, 9, "qtype, layout, W, rows, cols, x, out, n, exact") < 0 || !(t = arg_type(fn, args[0])))
        return NULL;
    if (arg_layout(fn, t, args[1], &layout) < 0 || arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0 ||
        llb_arg_long(args[7], fn, "n", 1, MAX_DIM, &n) < 0 || llb_arg_long(args[8], fn, "exact", 0, 1, &exact) < 0)
        return NULL;
    size_t nx, nout;
    if (llb_arg_product(fn, &nx, n, cols, 1, 1) < 0 || llb_arg_product(fn, &nout, n, rows, 1, 1) < 0) return NULL;
    const uint8_t *w = llb_arg_buf(&b, args[2], fn, "W", 0, LLB_ELEM_BYTES, llb_matrix_bytes(t, (int)layout, rows, cols), 0);
    const float *x = w ? llb_arg_buf(&b, args[5], fn, "x", 0, LLB_ELEM_F32, nx, 0) : NULL;
    float *out = x ? llb_arg_buf(&b, args[6], fn, "out", 1, LLB_ELEM_F32, nout, 0) : NULL;
    if (!out) goto fail;
    if (llb_bufs_overlap(&b, 2, 1) || llb_bufs_overlap(&b, 2, 0)) {
        PyErr_SetString(PyExc_ValueError, "matmul: out overlaps x or W");
        goto fail;
    }
    const struct matmul_args a = {.t = t, .layout = (int)layout, .exact = (int)exact, .w = w,
                                  .rows = rows, .cols = cols, .n = n, .x = x, .out = out};
    return llb_bufs_call(&b, fn, run_matmul, NULL, &a, sizeof a);
fail:
    llb_bufs_release(&b);
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
    long cols, n, exact;
    const llb_type_info *t;
    struct llb_bufs b = MM_BUFS; /* x, then W and out per part */
    if (llb_arg_nargs(fn, nargs, 6, "qtype, cols, x, n, exact, parts") < 0 || !(t = arg_type(fn, args[0]))) return NULL;
    if (arg_cols(fn, t, args[1], &cols) < 0 || llb_arg_long(args[3], fn, "n", 1, MAX_DIM, &n) < 0 ||
        llb_arg_long(args[4], fn, "exact", 0, 1, &exact) < 0)
        return NULL;
    if (!PyTuple_Check(args[5]) || PyTuple_GET_SIZE(args[5]) < 1 || PyTuple_GET_SIZE(args[5]) > LLB_MM_MAX_PARTS)
        return PyErr_Format(PyExc_TypeError, "%s: parts must be a tuple of 1 to %d (layout, W, rows, out) tuples", fn,
                            LLB_MM_MAX_PARTS);
    struct matmul_many_args a = {.t = t, .n_parts = (int)PyTuple_GET_SIZE(args[5]), .exact = (int)exact, .cols = cols,
                                 .n = n};
    size_t nx;
    if (llb_arg_product(fn, &nx, n, cols, 1, 1) < 0) return NULL;
    if (!(a.x = llb_arg_buf(&b, args[2], fn, "x", 0, LLB_ELEM_F32, nx, 0))) goto fail;
    for (int i = 0; i < a.n_parts; i++) {
        PyObject *part = PyTuple_GET_ITEM(args[5], i);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 4) {
            PyErr_Format(PyExc_TypeError, "%s: parts[%d] must be a (layout, W, rows, out) tuple", fn, i);
            goto fail;
        }
        long layout, rows;
        size_t nout;
        if (arg_layout(fn, t, PyTuple_GET_ITEM(part, 0), &layout) < 0 ||
            llb_arg_long(PyTuple_GET_ITEM(part, 2), fn, "rows", 1, MAX_DIM, &rows) < 0 ||
            llb_arg_product(fn, &nout, n, rows, 1, 1) < 0)
            goto fail;
        const uint8_t *w = llb_arg_buf(&b, PyTuple_GET_ITEM(part, 1), fn, "W", 0, LLB_ELEM_BYTES,
                                       llb_matrix_bytes(t, (int)layout, rows, cols), 0);
        float *out = w ? llb_arg_buf(&b, PyTuple_GET_ITEM(part, 3), fn, "out", 1, LLB_ELEM_F32, nout, 0) : NULL;
        if (!out) goto fail;
        a.parts[i] = (llb_mm_part){.layout = (int)layout, .w = w, .rows = rows, .out = out};
    }
    /* every out apart from x, every W and every other out (buffers: x, then W and out of each part) */
    for (int i = 0; i < a.n_parts; i++) {
        const int out = 2 + 2 * i;
        int bad = llb_bufs_overlap(&b, out, 0);
        for (int j = 0; j < a.n_parts; j++)
            bad |= llb_bufs_overlap(&b, out, 1 + 2 * j) || (j != i && llb_bufs_overlap(&b, out, 2 + 2 * j));
        if (bad) {
            PyErr_Format(PyExc_ValueError, "%s: parts[%d]'s out overlaps x, a W or another out", fn, i);
            goto fail;
        }
    }
    return llb_bufs_call(&b, fn, run_matmul_many, NULL, &a, sizeof a);
fail:
    llb_bufs_release(&b);
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
    struct llb_bufs b = MM_BUFS;
    if (!(t = arg_type(fn, args[0]))) return NULL;
    if (arg_layout(fn, t, args[1], &layout) < 0 || arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0) return NULL;
    if (on && llb_arg_long(on, fn, "n", 1, MAX_DIM, &n) < 0) return NULL;
    if (!on) n = rows;
    size_t nout;
    if (llb_arg_product(fn, &nout, n, cols, 1, 1) < 0) return NULL;
    const uint8_t *w = llb_arg_buf(&b, args[2], fn, "W", 0, LLB_ELEM_BYTES, llb_matrix_bytes(t, (int)layout, rows, cols), 0);
    float *out = w ? llb_arg_buf(&b, oout, fn, "out", 1, LLB_ELEM_F32, nout, 0) : NULL;
    const int32_t *ids = out && oids ? llb_arg_buf(&b, oids, fn, "ids", 0, LLB_ELEM_I32, n, 0) : NULL;
    if (!out || (oids && !ids)) goto fail;
    if (llb_bufs_overlap(&b, 1, 0) || (oids && llb_bufs_overlap(&b, 1, 2))) {
        PyErr_Format(PyExc_ValueError, "%s: out overlaps an input", fn);
        goto fail;
    }
    const struct rows_args a = {fn, t, (int)layout, w, rows, cols, n, ids, out};
    return llb_bufs_call(&b, fn, run_rows, oids ? check_rows : NULL, &a, sizeof a);
fail:
    llb_bufs_release(&b);
    return NULL;
}

/* get_rows(qtype, layout, table, rows, cols, ids, out, n) -> None */
static PyObject *py_get_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (llb_arg_nargs("get_rows", nargs, 8, "qtype, layout, table, rows, cols, ids, out, n") < 0) return NULL;
    return rows_common("get_rows", args, args[5], args[6], args[7]);
}

/* dequant_rows(qtype, layout, W, rows, cols, out) -> None */
static PyObject *py_dequant_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (llb_arg_nargs("dequant_rows", nargs, 6, "qtype, layout, W, rows, cols, out") < 0) return NULL;
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

/* Python bindings of the quantized matrix kernels. Every argument is checked
 * here (types, dims, buffer sizes, contiguity, ids) before the GIL is
 * released; the C functions behind them trust their inputs. The ops run
 * through llb_call (python/plan.c), so a recording Plan keeps them; get_rows' ids are
 * re-checked by check_rows on every replay. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>

#include "core/isa.h"
#include "matmul/matmul.h"
#include "moe/moe.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/plan.h"

#define MAX_DIM LLB_ARG_MAX_DIM

/* Buffers of the matmul bindings: a wrong kind is a TypeError (see args.h). */
#define MM_BUFS {.error = PyExc_TypeError, .count = 0}

/* "F32=0 F16=1 ...": the ids the table holds, for error messages. */
static void type_list(char *buf, size_t size) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; llb_type_at(i) && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s=%d", i ? " " : "", llb_type_at(i)->name, llb_type_at(i)->qtype);
}

static const llb_type_info *arg_type(const char *fn, PyObject *o) {
    long q;
    if (llb_arg_long(o, fn, "qtype", LONG_MIN, LONG_MAX, &q) < 0) return NULL;
    const llb_type_info *t = q == (int)q ? llb_type_get((int)q) : NULL;
    if (!t) {
        char ids[512];
        type_list(ids, sizeof ids);
        PyErr_Format(PyExc_ValueError, "%s: unsupported qtype %ld (supported ggml ids: %s)", fn, q, ids);
    }
    return t;
}

/* outlier_threshold() -> int: LLB_OUTLIER, as this build was compiled. */
static PyObject *py_outlier_threshold(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(llb_matmul_outlier());
}

/* qtypes() -> tuple of dicts, one per row of the C type table. */
static PyObject *py_qtypes(PyObject *self, PyObject *unused) {
    int n = 0;
    while (llb_type_at(n)) n++;
    PyObject *out = PyTuple_New(n);
    for (int i = 0; out && i < n; i++) {
        const llb_type_info *t = llb_type_at(i);
        PyObject *simd = PyList_New(0);
        for (int isa = LLB_ISA_AVX2; simd && isa <= LLB_ISA_AVX512; isa++) {
            /* an ISA counts as native for the type only with both its modes' kernels */
            if (!llb_matmul_has_kernel(t, isa, 1) || !llb_matmul_has_kernel(t, isa, 0)) continue;
            PyObject *name = PyUnicode_FromString(llb_isa_name(isa));
            if (!name || PyList_Append(simd, name) < 0) Py_CLEAR(simd);
            Py_XDECREF(name);
        }
        PyObject *row = simd ? Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:i,s:N}", "name", t->name, "id", t->qtype, "block",
                                             t->block, "block_bytes", t->block_bytes, "group_bytes", t->group_bytes,
                                             "far_skew", t->far_skew, "simd", simd)
                             : NULL;
        if (!row) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, row);
    }
    return out;
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

/* pack(qtype, src, dst, rows, cols[, count]) -> layout */
static PyObject *py_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "pack";
    long rows, cols, count = 1;
    const llb_type_info *t;
    struct llb_bufs b = MM_BUFS;
    if (nargs != 6 && llb_arg_nargs(fn, nargs, 5, "qtype, src, dst, rows, cols[, count]") < 0) return NULL;
    if (!(t = arg_type(fn, args[0]))) return NULL;
    if (llb_plan_recording()) /* load-time work a plan does not hold: refuse rather than leave it out silently */
        return PyErr_Format(PyExc_RuntimeError, "pack: cannot run while this thread records a Plan");
    if (arg_dims(fn, t, args[3], args[4], &rows, &cols) < 0) return NULL;
    if (nargs == 6 && llb_arg_long(args[5], fn, "count", 1, MAX_DIM, &count) < 0) return NULL;
    const int layout = llb_pack_layout(t);
    size_t src_bytes, dst_bytes;
    if (llb_arg_product(fn, &src_bytes, llb_matrix_bytes(t, LLB_LAYOUT_FILE, rows, cols), (size_t)count, 1, 1) < 0 ||
        llb_arg_product(fn, &dst_bytes, llb_matrix_bytes(t, layout, rows, cols), (size_t)count, 1, 1) < 0)
        return NULL;
    const uint8_t *src = llb_arg_buf(&b, args[1], fn, "src", 0, LLB_ELEM_BYTES, src_bytes, 0);
    uint8_t *dst = src ? llb_arg_buf(&b, args[2], fn, "dst", 1, LLB_ELEM_BYTES, dst_bytes, 0) : NULL;
    if (!dst) goto fail;
    if (llb_bufs_overlap(&b, 0, 1)) {
        PyErr_SetString(PyExc_ValueError, "pack: src and dst overlap");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    llb_pack(t, src, rows, cols, dst, count);
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

/* matmul_many(qtype, cols, x, n, exact, parts) -> None; parts: a tuple of 1..3 (layout, W, rows, out) or
 * (layout, W, rows, out, qtype): a part of a type of its own (see llb_matmul_many) */
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
        return PyErr_Format(PyExc_TypeError, "%s: parts must be a tuple of 1 to %d (layout, W, rows, out[, qtype]) tuples", fn,
                            LLB_MM_MAX_PARTS);
    struct matmul_many_args a = {.t = t, .n_parts = (int)PyTuple_GET_SIZE(args[5]), .exact = (int)exact, .cols = cols,
                                 .n = n};
    size_t nx;
    if (llb_arg_product(fn, &nx, n, cols, 1, 1) < 0) return NULL;
    if (!(a.x = llb_arg_buf(&b, args[2], fn, "x", 0, LLB_ELEM_F32, nx, 0))) goto fail;
    for (int i = 0; i < a.n_parts; i++) {
        PyObject *part = PyTuple_GET_ITEM(args[5], i);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) < 4 || PyTuple_GET_SIZE(part) > 5) {
            PyErr_Format(PyExc_TypeError, "%s: parts[%d] must be a (layout, W, rows, out[, qtype]) tuple", fn, i);
            goto fail;
        }
        long layout, rows, pcols;
        size_t nout;
        const llb_type_info *pt = PyTuple_GET_SIZE(part) == 5 ? arg_type(fn, PyTuple_GET_ITEM(part, 4)) : t;
        if (!pt || arg_cols(fn, pt, args[1], &pcols) < 0 || arg_layout(fn, pt, PyTuple_GET_ITEM(part, 0), &layout) < 0 ||
            llb_arg_long(PyTuple_GET_ITEM(part, 2), fn, "rows", 1, MAX_DIM, &rows) < 0 ||
            llb_arg_product(fn, &nout, n, rows, 1, 1) < 0)
            goto fail;
        const uint8_t *w = llb_arg_buf(&b, PyTuple_GET_ITEM(part, 1), fn, "W", 0, LLB_ELEM_BYTES,
                                       llb_matrix_bytes(pt, (int)layout, rows, cols), 0);
        float *out = w ? llb_arg_buf(&b, PyTuple_GET_ITEM(part, 3), fn, "out", 1, LLB_ELEM_F32, nout, 0) : NULL;
        if (!out) goto fail;
        a.parts[i] = (llb_mm_part){.layout = (int)layout, .w = w, .rows = rows, .out = out, .t = pt != t ? pt : NULL};
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

/* ---- mixture of experts ---------------------------------------------------- */

LLB_CALL_ARGS_FIT(llb_moe_args);
static int run_moe(const void *p) { return llb_moe(p); }

/* One expert tensor: (qtype, layout, W) holding E matrices of rows x cols back to back. */
static int arg_experts(struct llb_bufs *b, const char *fn, const char *name, PyObject *o, long E, long rows, long cols,
                       llb_experts *out) {
    long layout;
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a (qtype, layout, W) tuple", fn, name);
        return -1;
    }
    const llb_type_info *t = arg_type(fn, PyTuple_GET_ITEM(o, 0));
    if (!t || arg_layout(fn, t, PyTuple_GET_ITEM(o, 1), &layout) < 0) return -1;
    if (cols % t->block) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %ld columns, not a multiple of the %s block size %d", fn, name, cols,
                     t->name, t->block);
        return -1;
    }
    const size_t stride = llb_matrix_bytes(t, (int)layout, rows, cols);
    size_t total;
    if (llb_arg_product(fn, &total, stride, (size_t)E, 1, 1) < 0) return -1;
    const uint8_t *w = llb_arg_buf(b, PyTuple_GET_ITEM(o, 2), fn, name, 0, LLB_ELEM_BYTES, total, 0);
    if (!w) return -1;
    *out = (llb_experts){.t = t, .layout = (int)layout, .w = w, .stride = stride};
    return 0;
}

/* The routing's parameters: routing and norm, then (ext, or NULL for their defaults) groups, groups_used,
 * group_top, scale and bias (None or n_expert float32 values, acquired into b). */
static int arg_route(struct llb_bufs *b, const char *fn, PyObject *o_routing, PyObject *o_norm, PyObject *const *ext,
                     long E, long k, llb_moe_route_params *r) {
    long routing, norm, groups = 1, used = 1, top = 1;
    float scale = 1.0f;
    if (llb_arg_long(o_routing, fn, "routing", 0, 2, &routing) < 0 || llb_arg_long(o_norm, fn, "norm", 0, 1, &norm) < 0)
        return -1;
    if (ext && (llb_arg_long(ext[0], fn, "groups", 1, E, &groups) < 0 ||
                llb_arg_long(ext[1], fn, "groups_used", 1, groups, &used) < 0 ||
                llb_arg_long(ext[2], fn, "group_top", 1, E / groups, &top) < 0 ||
                llb_arg_float(ext[3], fn, "scale", 0.0, &scale) < 0))
        return -1;
    if (E % groups) {
        PyErr_Format(PyExc_ValueError, "%s: %ld experts do not split into %ld groups", fn, E, groups);
        return -1;
    }
    if (groups > 1 && k > used * (E / groups)) {
        PyErr_Format(PyExc_ValueError, "%s: k = %ld is more than the %ld experts of %ld groups", fn, k, used * (E / groups),
                     used);
        return -1;
    }
    const float *bias = NULL;
    if (ext && ext[4] != Py_None && !(bias = llb_arg_buf(b, ext[4], fn, "bias", 0, LLB_ELEM_F32, (size_t)E, 1))) return -1;
    if (routing == LLB_MOE_TOPK_SOFTMAX && (groups > 1 || bias)) {
        PyErr_Format(PyExc_ValueError, "%s: routing 1 (top-k, then softmax) takes no groups and no bias", fn);
        return -1;
    }
    *r = (llb_moe_route_params){.routing = (int)routing, .norm = (int)norm, .groups = groups, .groups_used = used,
                                .group_top = top, .scale = scale, .bias = bias};
    return 0;
}

/* moe(x, logits, out, n, d, n_expert, k, ff, routing, norm, exact, gate, up, down, fscratch, iscratch, shared,
 *     shared_logit, act, alpha, limit, gate_b, up_b, down_b[, groups, groups_used, group_top, scale, bias]) -> None */
static PyObject *py_moe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "moe";
    long n, d, E, k, ff, exact, act;
    float alpha, limit;
    struct llb_bufs b = MM_BUFS;
    const int full = nargs == 29; /* the routing's optional parameters (else their defaults) */
    if ((!full && llb_arg_nargs(fn, nargs, 24, "x, logits, out, n, d, n_expert, k, ff, routing, norm, exact, gate, up, "
                                      "down, fscratch, iscratch, shared, shared_logit, act, alpha, limit, gate_b, up_b, "
                                      "down_b[, groups, groups_used, group_top, scale, bias]") < 0) ||
        llb_arg_long(args[18], fn, "act", 0, 1, &act) < 0 || llb_arg_float(args[19], fn, "alpha", -INFINITY, &alpha) < 0 ||
        llb_arg_float(args[20], fn, "limit", 0.0, &limit) < 0 ||
        llb_arg_long(args[3], fn, "n", 1, MAX_DIM, &n) < 0 || llb_arg_long(args[4], fn, "d", 1, MAX_DIM, &d) < 0 ||
        llb_arg_long(args[5], fn, "n_expert", 1, 1L << 16, &E) < 0 || llb_arg_long(args[6], fn, "k", 1, E < 1024 ? E : 1024, &k) < 0 ||
        llb_arg_long(args[7], fn, "ff", 1, MAX_DIM, &ff) < 0 || llb_arg_long(args[10], fn, "exact", 0, 1, &exact) < 0)
        return NULL;
    size_t nd, ne, nk, fs, is;
    if (llb_arg_product(fn, &nd, n, d, 1, 1) < 0 || llb_arg_product(fn, &ne, n, E, 1, 1) < 0 ||
        llb_arg_product(fn, &nk, n, k, 1, 1) < 0 || llb_arg_product(fn, &fs, nk, 2 * (size_t)d + 2 * (size_t)ff + 1, 1, 1) < 0)
        return NULL;
    is = llb_moe_iscratch(n, k, E);
    llb_moe_args a = {.n = n, .d = d, .n_expert = E, .k = k, .ff = ff, .exact = (int)exact, .act = (int)act,
                      .alpha = alpha, .limit = limit};
    /* buffers: 0 x, 1 logits, 2 out, 3 fscratch, 4 iscratch, 5-7 experts, then shared and its logit */
    if (!(a.x = llb_arg_buf(&b, args[0], fn, "x", 0, LLB_ELEM_F32, nd, 0)) ||
        !(a.logits = llb_arg_buf(&b, args[1], fn, "logits", 0, LLB_ELEM_F32, ne, 0)) ||
        !(a.out = llb_arg_buf(&b, args[2], fn, "out", 1, LLB_ELEM_F32, nd, 0)) ||
        !(a.fscratch = llb_arg_buf(&b, args[14], fn, "fscratch", 1, LLB_ELEM_F32, fs, 0)) ||
        !(a.iscratch = llb_arg_buf(&b, args[15], fn, "iscratch", 1, LLB_ELEM_I32, is, 0)) ||
        arg_experts(&b, fn, "gate", args[11], E, ff, d, &a.gate) < 0 ||
        arg_experts(&b, fn, "up", args[12], E, ff, d, &a.up) < 0 ||
        arg_experts(&b, fn, "down", args[13], E, d, ff, &a.down) < 0)
        goto fail;
    if (args[16] != Py_None && !(a.shared = llb_arg_buf(&b, args[16], fn, "shared", 0, LLB_ELEM_F32, nd, 0))) goto fail;
    if (args[17] != Py_None) {
        if (!a.shared) {
            PyErr_SetString(PyExc_ValueError, "moe: shared_logit without shared");
            goto fail;
        }
        if (!(a.shared_logit = llb_arg_buf(&b, args[17], fn, "shared_logit", 0, LLB_ELEM_F32, n, 0))) goto fail;
    }
    size_t n_eff, n_ed;
    if (llb_arg_product(fn, &n_eff, E, ff, 1, 1) < 0 || llb_arg_product(fn, &n_ed, E, d, 1, 1) < 0) goto fail;
    if (arg_route(&b, fn, args[8], args[9], full ? args + 24 : NULL, E, k, &a.route) < 0) goto fail;
    if ((args[21] != Py_None && !(a.gate_b = llb_arg_buf(&b, args[21], fn, "gate_b", 0, LLB_ELEM_F32, n_eff, 0))) ||
        (args[22] != Py_None && !(a.up_b = llb_arg_buf(&b, args[22], fn, "up_b", 0, LLB_ELEM_F32, n_eff, 0))) ||
        (args[23] != Py_None && !(a.down_b = llb_arg_buf(&b, args[23], fn, "down_b", 0, LLB_ELEM_F32, n_ed, 0))))
        goto fail;
    /* what is written (out, the scratch) overlaps nothing else */
    for (int w = 2; w <= 4; w++)
        for (int i = 0; i < b.count; i++)
            if (i != w && llb_bufs_overlap(&b, w, i)) {
                PyErr_Format(PyExc_ValueError, "moe: %s overlaps another argument", w == 2 ? "out" : "the scratch");
                goto fail;
            }
    return llb_bufs_call(&b, fn, run_moe, NULL, &a, sizeof a);
fail:
    llb_bufs_release(&b);
    return NULL;
}

/* moe_route(logits, n, n_expert, k, routing, norm, ids, weights[, groups, groups_used, group_top, scale, bias])
 * -> None: the routing alone (for tests). */
static PyObject *py_moe_route(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *fn = "moe_route";
    long n, E, k;
    struct llb_bufs b = MM_BUFS;
    const int full = nargs == 13;
    if ((!full && llb_arg_nargs(fn, nargs, 8, "logits, n, n_expert, k, routing, norm, ids, weights[, groups, "
                                "groups_used, group_top, scale, bias]") < 0) ||
        llb_arg_long(args[1], fn, "n", 1, MAX_DIM, &n) < 0 || llb_arg_long(args[2], fn, "n_expert", 1, 1L << 16, &E) < 0 ||
        llb_arg_long(args[3], fn, "k", 1, E < 1024 ? E : 1024, &k) < 0)
        return NULL;
    size_t ne, nk;
    if (llb_arg_product(fn, &ne, n, E, 1, 1) < 0 || llb_arg_product(fn, &nk, n, k, 1, 1) < 0) return NULL;
    const float *l = llb_arg_buf(&b, args[0], fn, "logits", 0, LLB_ELEM_F32, ne, 0);
    int32_t *ids = l ? llb_arg_buf(&b, args[6], fn, "ids", 1, LLB_ELEM_I32, nk, 0) : NULL;
    float *w = ids ? llb_arg_buf(&b, args[7], fn, "weights", 1, LLB_ELEM_F32, nk, 0) : NULL;
    llb_moe_route_params r;
    if (!w || llb_bufs_overlap(&b, 0, 1) || llb_bufs_overlap(&b, 0, 2) || llb_bufs_overlap(&b, 1, 2)) {
        if (w) PyErr_SetString(PyExc_ValueError, "moe_route: buffers overlap");
        llb_bufs_release(&b);
        return NULL;
    }
    if (arg_route(&b, fn, args[4], args[5], full ? args + 8 : NULL, E, k, &r) < 0) {
        llb_bufs_release(&b);
        return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = llb_moe_route(l, n, E, k, &r, ids, w);
    Py_END_ALLOW_THREADS
    llb_bufs_release(&b);
    if (rc) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyMethodDef llb_matmul_methods[] = {
    {"outlier_threshold", py_outlier_threshold, METH_NOARGS,
     "outlier_threshold() -> int: the fast mode's LLB_OUTLIER: a 32-value activation block whose absmax exceeds it\n"
     "times its row's RMS also carries an 8-bit code of its residual."},
    {"qtypes", py_qtypes, METH_NOARGS,
     "qtypes() -> tuple[dict]: the weight types the C core runs, one per row of its type table: name, id (ggml's),\n"
     "block (values), block_bytes, group_bytes (packed 16-row group-block, 0 = file layout), far_skew (bytes past a\n"
     "page where a packed matrix starts when far_stream() is on), simd (ISAs with their own kernels; on the others\n"
     "the scalar kernel runs)."},
    {"row_bytes", (PyCFunction)(void (*)(void))py_row_bytes, METH_FASTCALL,
     "row_bytes(qtype, cols) -> int: bytes of one row in the file layout."},
    {"packed_size", (PyCFunction)(void (*)(void))py_packed_size, METH_FASTCALL,
     "packed_size(qtype, rows, cols) -> int: bytes pack() writes (the kernel layout)."},
    {"pack", (PyCFunction)(void (*)(void))py_pack, METH_FASTCALL,
     "pack(qtype, src, dst, rows, cols[, count]) -> int: repack file-layout rows into dst (count matrices of rows x cols\n"
     "back to back, each packed on its own, back to back); returns the layout id for matmul."},
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
    {"moe", (PyCFunction)(void (*)(void))py_moe, METH_FASTCALL,
     "moe(x, logits, out, n, d, n_expert, k, ff, routing, norm, exact, gate, up, down, fscratch, iscratch, shared,\n"
     "shared_logit) -> None: a mixture-of-experts MLP. Each token's k experts from its router logits (routing 0:\n"
     "softmax then top-k, renormalised if norm; 1: top-k logits then softmax); the tokens grouped by expert, each\n"
     "expert one matmul over its tokens (gate, up: (qtype, layout, W) of n_expert ff x d matrices; down: d x ff);\n"
     "out = the weighted sum of the experts' outputs, + sigmoid(shared_logit) * shared when given. act 0: SiLU(gate)\n"
     "* up; 1: GPT-OSS's (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit); gate_b, up_b\n"
     "(n_expert x ff), down_b (n_expert x d): biases or None. Optional, the routing's groups, groups_used, group_top,\n"
     "scale and bias (moe/moe.h's llb_moe_route_params; routing 2: a sigmoid per expert, then top-k)."},
    {"moe_route", (PyCFunction)(void (*)(void))py_moe_route, METH_FASTCALL,
     "moe_route(logits, n, n_expert, k, routing, norm, ids, weights[, groups, groups_used, group_top, scale, bias])\n"
     "-> None: moe's routing alone."},
    {NULL, NULL, 0, NULL},
};

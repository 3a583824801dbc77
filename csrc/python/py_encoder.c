/* Python bindings of the encoder's ops: dense products on packed panels (matmul/dense.h), the
 * residual layernorm and attention within packed sequences (ops/encoder.h). Every argument is
 * checked here (sizes, formats, sequence bounds) before the GIL is released; a violation is a
 * ValueError naming the op and the argument. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "matmul/dense.h"
#include "ops/encoder.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/plan.h"

#define MAX_DIM LLB_ARG_MAX_DIM
#define ENC_BUFS {.error = PyExc_ValueError, .count = 0}

static int arg_fmt(PyObject *o, const char *op, int *fmt) {
    long f;
    if (llb_arg_long(o, op, "fmt", LLB_DENSE_F32, LLB_DENSE_BF16, &f)) return -1;
    *fmt = (int)f;
    return 0;
}

/* fmt, rows and cols at args[f], args[r], args[r + 1]: a packed matrix's size must not overflow. */
static int arg_matrix(PyObject *const *args, int f, int r, const char *op, int *fmt, long *rows, long *cols) {
    size_t rc;
    if (arg_fmt(args[f], op, fmt) || llb_arg_long(args[r], op, "rows", 1, MAX_DIM, rows) ||
        llb_arg_long(args[r + 1], op, "cols", 1, MAX_DIM, cols) ||
        llb_arg_product(op, &rc, (size_t)*rows + LLB_DENSE_NR, (size_t)*cols + 1, 4, 1))
        return -1;
    return 0;
}

/* dense_packed_size(fmt, rows, cols) -> int */
static PyObject *py_dense_packed_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "dense_packed_size";
    int fmt;
    long rows, cols;
    if (llb_arg_nargs(op, nargs, 3, "fmt, rows, cols") || arg_matrix(args, 0, 1, op, &fmt, &rows, &cols)) return NULL;
    return PyLong_FromSize_t(llb_dense_packed_size(fmt, rows, cols));
}

/* The packed matrix: exactly llb_dense_packed_size bytes, 64-byte aligned. */
static const void *packed_buf(struct llb_bufs *h, PyObject *o, const char *op, int writable, int fmt, long rows,
                              long cols) {
    void *p = llb_arg_buf(h, o, op, "packed", writable, LLB_ELEM_BYTES, llb_dense_packed_size(fmt, rows, cols), 1);
    if (p && ((uintptr_t)p & 63)) {
        PyErr_Format(PyExc_ValueError, "%s: packed must be 64-byte aligned", op);
        return NULL;
    }
    return p;
}

/* dense_pack(fmt, w, packed, rows, cols): W (rows x cols float32) into panels */
static PyObject *py_dense_pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "dense_pack";
    int fmt;
    long rows, cols;
    if (llb_arg_nargs(op, nargs, 5, "fmt, w, packed, rows, cols") || arg_matrix(args, 0, 3, op, &fmt, &rows, &cols))
        return NULL;
    struct llb_bufs h = ENC_BUFS;
    const float *w = llb_arg_buf(&h, args[1], op, "w", 0, LLB_ELEM_F32, (size_t)rows * cols, 1);
    void *dst = w ? (void *)packed_buf(&h, args[2], op, 1, fmt, rows, cols) : NULL;
    if (!dst) goto fail;
    if (llb_bufs_overlap(&h, 0, 1)) {
        PyErr_Format(PyExc_ValueError, "%s: w and packed overlap", op);
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    llb_dense_pack(fmt, w, rows, cols, dst);
    Py_END_ALLOW_THREADS
    llb_bufs_release(&h);
    Py_RETURN_NONE;
fail:
    llb_bufs_release(&h);
    return NULL;
}

struct dense_args {
    int fmt;
    const void *packed;
    const float *bias, *x;
    float *out;
    long rows, cols, n;
};
LLB_CALL_ARGS_FIT(struct dense_args);
static int run_dense(const void *p) {
    const struct dense_args *a = p;
    return llb_dense(a->fmt, a->packed, a->bias, a->rows, a->cols, a->x, a->out, a->n);
}

/* dense(fmt, packed, bias, x, out, n, rows, cols): out[n, rows] = x[n, cols] @ W^T + bias (bias may be None) */
static PyObject *py_dense(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "dense";
    int fmt;
    long n, rows, cols;
    if (llb_arg_nargs(op, nargs, 8, "fmt, packed, bias, x, out, n, rows, cols") ||
        arg_matrix(args, 0, 6, op, &fmt, &rows, &cols) || llb_arg_long(args[5], op, "n", 1, MAX_DIM, &n))
        return NULL;
    size_t nx, no;
    if (llb_arg_product(op, &nx, n, cols + 1, 4, 1) || llb_arg_product(op, &no, n, rows, 4, 1)) return NULL;
    struct llb_bufs h = ENC_BUFS;
    struct dense_args a = {.fmt = fmt, .rows = rows, .cols = cols, .n = n};
    a.packed = packed_buf(&h, args[1], op, 0, fmt, rows, cols);
    if (!a.packed) goto fail;
    if (args[2] != Py_None && !(a.bias = llb_arg_buf(&h, args[2], op, "bias", 0, LLB_ELEM_F32, rows, 1))) goto fail;
    if (!(a.x = llb_arg_buf(&h, args[3], op, "x", 0, LLB_ELEM_F32, (size_t)n * cols, 0))) goto fail;
    if (!(a.out = llb_arg_buf(&h, args[4], op, "out", 1, LLB_ELEM_F32, (size_t)n * rows, 0))) goto fail;
    return llb_bufs_call_out_apart(&h, op, 0, run_dense, NULL, &a, sizeof a);
fail:
    llb_bufs_release(&h);
    return NULL;
}

struct ln_args {
    const float *x, *r, *w, *b;
    float *out;
    long n, d;
    float eps;
};
LLB_CALL_ARGS_FIT(struct ln_args);
static int run_ln(const void *p) {
    const struct ln_args *a = p;
    llb_add_layernorm(a->x, a->r, a->w, a->b, a->out, a->n, a->d, a->eps);
    return 0;
}

/* add_layernorm(x, r, w, b, out, n, d, eps): out = layernorm(x + r) * w + b (r may be None) */
static PyObject *py_add_layernorm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "add_layernorm";
    long n, d;
    float eps;
    if (llb_arg_nargs(op, nargs, 8, "x, r, w, b, out, n, d, eps") || llb_arg_long(args[5], op, "n", 1, MAX_DIM, &n) ||
        llb_arg_long(args[6], op, "d", 1, MAX_DIM, &d) || llb_arg_float(args[7], op, "eps", 0.0, &eps))
        return NULL;
    if (eps <= 0) return PyErr_Format(PyExc_ValueError, "%s: eps must be > 0", op);
    size_t nd;
    if (llb_arg_product(op, &nd, n, d, 1, 1)) return NULL;
    struct llb_bufs h = ENC_BUFS;
    struct ln_args a = {.n = n, .d = d, .eps = eps};
    if (!(a.x = llb_arg_buf(&h, args[0], op, "x", 0, LLB_ELEM_F32, nd, 0))) goto fail;
    if (args[1] != Py_None && !(a.r = llb_arg_buf(&h, args[1], op, "r", 0, LLB_ELEM_F32, nd, 0))) goto fail;
    if (!(a.w = llb_arg_buf(&h, args[2], op, "w", 0, LLB_ELEM_F32, d, 1))) goto fail;
    if (!(a.b = llb_arg_buf(&h, args[3], op, "b", 0, LLB_ELEM_F32, d, 1))) goto fail;
    if (!(a.out = llb_arg_buf(&h, args[4], op, "out", 1, LLB_ELEM_F32, nd, 0))) goto fail;
    return llb_bufs_call_out_apart(&h, op, 1, run_ln, NULL, &a, sizeof a);
fail:
    llb_bufs_release(&h);
    return NULL;
}

struct rot_args { float *qkv; const float *cos, *sin; long n, n_heads, head_dim; };
LLB_CALL_ARGS_FIT(struct rot_args);
static int run_rot(const void *p) {
    const struct rot_args *a = p;
    return llb_encoder_rotate(a->qkv, a->cos, a->sin, a->n, a->n_heads, a->head_dim), 0;
}

/* encoder_rotate(qkv, cos, sin, n, n_heads, head_dim): q and k of qkv rows rotated in place (rotate_half pairs)
 * by each row's angles, cos and sin (n x head_dim/2) */
static PyObject *py_encoder_rotate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "encoder_rotate";
    long n, n_heads, head_dim;
    if (llb_arg_nargs(op, nargs, 6, "qkv, cos, sin, n, n_heads, head_dim") ||
        llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "n_heads", 1, 65536, &n_heads) ||
        llb_arg_long(args[5], op, "head_dim", 2, LLB_ENC_MAX_HEAD_DIM, &head_dim))
        return NULL;
    if (head_dim % 2) return PyErr_Format(PyExc_ValueError, "%s: head_dim must be even", op);
    size_t nh, na;
    if (llb_arg_product(op, &nh, n, n_heads, head_dim, 3) || llb_arg_product(op, &na, n, head_dim / 2, 1, 1))
        return NULL;
    struct llb_bufs h = ENC_BUFS;
    struct rot_args a = {.n = n, .n_heads = n_heads, .head_dim = head_dim};
    /* the tables first, qkv (written) last: llb_bufs_call_out_apart keeps it apart from them */
    if ((a.cos = llb_arg_buf(&h, args[1], op, "cos", 0, LLB_ELEM_F32, na, 1)) &&
        (a.sin = llb_arg_buf(&h, args[2], op, "sin", 0, LLB_ELEM_F32, na, 1)) &&
        (a.qkv = llb_arg_buf(&h, args[0], op, "qkv", 1, LLB_ELEM_F32, nh, 0)))
        return llb_bufs_call_out_apart(&h, op, 0, run_rot, NULL, &a, sizeof a);
    llb_bufs_release(&h);
    return NULL;
}

struct att_args {
    const float *qkv;
    const int32_t *starts;
    float *out;
    long n, n_seqs, n_heads, head_dim;
    float scale;
};
LLB_CALL_ARGS_FIT(struct att_args);
static int check_att(const void *p, char *msg) {
    const struct att_args *a = p;
    if (a->starts[0] != 0 || a->starts[a->n_seqs] != a->n) {
        snprintf(msg, LLB_CHECK_MSG, "encoder_attention: starts must run from 0 to n = %ld", a->n);
        return -1;
    }
    for (long s = 0; s < a->n_seqs; s++)
        if (a->starts[s + 1] <= a->starts[s]) {
            snprintf(msg, LLB_CHECK_MSG, "encoder_attention: sequence %ld is empty or starts go backwards", s);
            return -1;
        }
    return 0;
}
static int run_att(const void *p) {
    const struct att_args *a = p;
    return llb_encoder_attention(a->qkv, a->starts, a->n_seqs, a->n_heads, a->head_dim, a->scale, a->out);
}

/* encoder_attention(qkv, starts, out, n, n_seqs, n_heads, head_dim, scale) */
static PyObject *py_encoder_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "encoder_attention";
    long n, n_seqs, n_heads, head_dim;
    float scale;
    if (llb_arg_nargs(op, nargs, 8, "qkv, starts, out, n, n_seqs, n_heads, head_dim, scale") ||
        llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "n_seqs", 1, MAX_DIM, &n_seqs) ||
        llb_arg_long(args[5], op, "n_heads", 1, 65536, &n_heads) ||
        llb_arg_long(args[6], op, "head_dim", 1, LLB_ENC_MAX_HEAD_DIM, &head_dim) ||
        llb_arg_float(args[7], op, "scale", -INFINITY, &scale))
        return NULL;
    size_t nh;
    if (llb_arg_product(op, &nh, n, n_heads, head_dim, 3)) return NULL;
    nh /= 3;
    struct llb_bufs h = ENC_BUFS;
    struct att_args a = {.n = n, .n_seqs = n_seqs, .n_heads = n_heads, .head_dim = head_dim, .scale = scale};
    if (!(a.qkv = llb_arg_buf(&h, args[0], op, "qkv", 0, LLB_ELEM_F32, 3 * nh, 0))) goto fail;
    if (!(a.starts = llb_arg_buf(&h, args[1], op, "starts", 0, LLB_ELEM_I32, (size_t)n_seqs + 1, 1))) goto fail;
    if (!(a.out = llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_F32, nh, 0))) goto fail;
    return llb_bufs_call_out_apart(&h, op, 0, run_att, check_att, &a, sizeof a);
fail:
    llb_bufs_release(&h);
    return NULL;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef llb_encoder_methods[] = {
    {"dense_packed_size", FASTCALL(py_dense_packed_size),
     "dense_packed_size(fmt, rows, cols) -> int: bytes of a (rows x cols) matrix packed for dense (fmt 0 f32, 1 bf16)."},
    {"dense_pack", FASTCALL(py_dense_pack),
     "dense_pack(fmt, w, packed, rows, cols): pack float32 W (rows x cols) into panels (64-byte aligned packed)."},
    {"dense", FASTCALL(py_dense),
     "dense(fmt, packed, bias, x, out, n, rows, cols): out[n, rows] = x[n, cols] @ W^T + bias (bias may be None);\n"
     "fmt 1 rounds x to bfloat16."},
    {"add_layernorm", FASTCALL(py_add_layernorm),
     "add_layernorm(x, r, w, b, out, n, d, eps): out = layernorm(x + r) * w + b over rows of d (r may be None)."},
    {"encoder_rotate", FASTCALL(py_encoder_rotate),
     "encoder_rotate(qkv, cos, sin, n, n_heads, head_dim): q and k of qkv rows [q | k | v] rotated in place,\n"
     "pairs (j, j + head_dim/2) by row i's cos[i, j], sin[i, j] (n x head_dim/2)."},
    {"encoder_attention", FASTCALL(py_encoder_attention),
     "encoder_attention(qkv, starts, out, n, n_seqs, n_heads, head_dim, scale): bidirectional attention of\n"
     "each packed sequence [starts[s], starts[s+1]) over itself; qkv rows are [q | k | v]."},
    {NULL, NULL, 0, NULL},
};

/* Python bindings of ops/: check every argument into an args struct, then
 * hand it to llb_call (python/plan.c), which runs it with the GIL released and, while
 * a Plan records on this thread, keeps it for replay. Checks of buffer contents
 * (slots, positions) are the calls' `check` functions, which replay re-runs.
 *
 * Buffers come through the buffer protocol and must be C-contiguous, of the
 * right element type (float32 'f', int32 'i', float16 'e'/'H'; raw bytes 'B'
 * are accepted too, for views of an arena), aligned to their element size, and
 * large enough for the dims given. KV caches must be exactly
 * n_slots * n_ctx * n_kv * head_dim elements, which catches a head_dim or
 * n_ctx that does not match the cache. Any violation is a ValueError naming the
 * op and the argument. Arguments are positional only (METH_FASTCALL). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>

#include "python/bindings.h"
#include "ops/ops.h"
#include "python/plan.h"

#define MAX_BUFS 8
#define MAX_DIM (1L << 30)   /* any single dim or count */
#define MAX_CTX (1L << 24)   /* n_ctx, positions: exact in float32 */
#define MAX_HEADS 4096

enum elem { E_F32, E_I32, E_F16 };
static const char *const elem_names[] = {"float32", "int32", "float16"};
static const Py_ssize_t elem_sizes[] = {4, 4, 2};

struct held {
    Py_buffer views[MAX_BUFS];
    int count;
};

static void release_all(struct held *h) {
    for (int i = 0; i < h->count; i++) PyBuffer_Release(&h->views[i]);
    h->count = 0;
}

static int format_ok(const char *fmt, Py_ssize_t itemsize, enum elem kind) {
    if (!fmt) fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++; /* native / little-endian (x86, arm64) */
    if (!fmt[0] || fmt[1]) return 0;
    const char c = fmt[0];
    if ((c == 'B' || c == 'b' || c == 'c') && itemsize == 1) return 1; /* raw bytes of an arena */
    switch (kind) {
    case E_F32: return c == 'f' && itemsize == 4;
    case E_I32: return (c == 'i' || c == 'l') && itemsize == 4;
    case E_F16: return (c == 'e' || c == 'H') && itemsize == 2;
    }
    return 0;
}

/* Acquire obj as a buffer of at least `count` elements (exactly, if exact).
 * Returns its data pointer, or NULL with ValueError set. */
static void *get_buf(struct held *h, PyObject *obj, const char *op, const char *name, int writable, enum elem kind,
                     size_t count, int exact) {
    Py_buffer *v = &h->views[h->count];
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) != 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_ValueError, "%s: %s must be a %sC-contiguous %s buffer, got %.100s (%S)", op, name,
                     writable ? "writable " : "", elem_names[kind], Py_TYPE(obj)->tp_name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    h->count++;
    if (!format_ok(v->format, v->itemsize, kind)) {
        PyErr_Format(PyExc_ValueError, "%s: %s must hold %s, got buffer format '%s' (itemsize %zd)", op, name,
                     elem_names[kind], v->format ? v->format : "B", v->itemsize);
        return NULL;
    }
    const size_t esize = (size_t)elem_sizes[kind];
    if ((uintptr_t)v->buf % esize != 0) {
        PyErr_Format(PyExc_ValueError, "%s: %s is not aligned to its %zu-byte elements", op, name, esize);
        return NULL;
    }
    size_t need;
    if (__builtin_mul_overflow(count, esize, &need) || need > (size_t)PY_SSIZE_T_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %s would need more than %zd bytes", op, name, PY_SSIZE_T_MAX);
        return NULL;
    }
    if (exact ? (size_t)v->len != need : (size_t)v->len < need) {
        PyErr_Format(PyExc_ValueError, "%s: %s has %zd bytes but the dims given need %s%zu (%zu %s elements)", op, name,
                     v->len, exact ? "exactly " : "", need, count, elem_names[kind]);
        return NULL;
    }
    return v->buf;
}

static int check_nargs(const char *op, Py_ssize_t nargs, Py_ssize_t want, const char *sig) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd positional arguments %s, got %zd", op, want, sig, nargs);
    return -1;
}

/* An integer in [lo, hi]; ints and objects with __index__ (NumPy scalars). */
static int get_int(PyObject *o, const char *op, const char *name, long lo, long hi, long *out) {
    PyObject *idx = PyNumber_Index(o);
    if (!idx) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    Py_DECREF(idx);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s: %s must be in [%ld, %ld], got %S", op, name, lo, hi, o);
        return -1;
    }
    *out = (long)v;
    return 0;
}

/* A finite float >= lo (lo = -INFINITY for any finite value). */
static int get_float(PyObject *o, const char *op, const char *name, double lo, float *out) {
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) return -1;
    if (!isfinite(v) || v < lo || fabs(v) > 3.0e38) {
        if (isinf(lo)) PyErr_Format(PyExc_ValueError, "%s: %s must be a finite float32 value, got %S", op, name, o);
        else PyErr_Format(PyExc_ValueError, "%s: %s must be finite and >= %g, got %S", op, name, lo, o);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static int mul_size(size_t *out, size_t a, size_t b, size_t c, size_t d) {
    size_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || __builtin_mul_overflow(abc, d, out)) {
        PyErr_SetString(PyExc_ValueError, "dims too large: element count overflows");
        return -1;
    }
    return 0;
}

/* Every position in [0, n_ctx) and every slot in [0, n_slots) (slots may be NULL).
 * Runs without the GIL too (at plan replay): reports through msg, not PyErr. */
static int ids_ok(const char *op, const int32_t *slots, const int32_t *pos, long n, long n_slots, long n_ctx,
                  char *msg) {
    for (long i = 0; i < n; i++) {
        if (slots && (slots[i] < 0 || slots[i] >= n_slots)) {
            snprintf(msg, LLB_CHECK_MSG, "%s: slots[%ld] = %d is out of range [0, %ld)", op, i, (int)slots[i], n_slots);
            return -1;
        }
        if (pos[i] < 0 || pos[i] >= n_ctx) {
            snprintf(msg, LLB_CHECK_MSG, "%s: pos[%ld] = %d is out of range [0, %ld)", op, i, (int)pos[i], n_ctx);
            return -1;
        }
    }
    return 0;
}

/* Run (and maybe record) the validated call; the views now belong to llb_call. */
static PyObject *finish(struct held *h, const char *op, int (*run)(const void *), int (*check)(const void *, char *),
                        const void *args, size_t size) {
    Py_buffer *views[MAX_BUFS];
    for (int i = 0; i < h->count; i++) views[i] = &h->views[i];
    const struct llb_call c = {op, run, check, args, size};
    PyObject *r = llb_call(&c, views, h->count);
    h->count = 0;
    return r;
}

static int get_cache_type(PyObject *o, const char *op, int *out) {
    long t;
    if (get_int(o, op, "cache_type", 0, 2, &t)) return -1;
    if (t == 2) {
        PyErr_Format(PyExc_ValueError, "%s: cache_type 2 (q8_0) is not implemented; use 0 (f32) or 1 (f16)", op);
        return -1;
    }
    *out = (int)t;
    return 0;
}

/* ---- bindings ------------------------------------------------------------- */

struct rmsnorm_args {
    const float *x, *w;
    float *out;
    long n, d;
    float eps;
};
LLB_CALL_ARGS_FIT(struct rmsnorm_args);
static int run_rmsnorm(const void *p) {
    const struct rmsnorm_args *a = p;
    llb_rmsnorm(a->x, a->w, a->out, a->n, a->d, a->eps);
    return 0;
}

static PyObject *py_rmsnorm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "rmsnorm";
    if (check_nargs(op, nargs, 6, "(x, w, out, n, d, eps)")) return NULL;
    long n, d;
    float eps;
    if (get_int(args[3], op, "n", 1, MAX_DIM, &n) || get_int(args[4], op, "d", 1, MAX_DIM, &d) ||
        get_float(args[5], op, "eps", 0.0, &eps))
        return NULL;
    size_t nd;
    if (mul_size(&nd, n, d, 1, 1)) return NULL;
    struct held h = {.count = 0};
    const float *x = get_buf(&h, args[0], op, "x", 0, E_F32, nd, 0);
    const float *w = x ? get_buf(&h, args[1], op, "w", 0, E_F32, d, 0) : NULL;
    float *out = w ? get_buf(&h, args[2], op, "out", 1, E_F32, nd, 0) : NULL;
    if (!out) {
        release_all(&h);
        return NULL;
    }
    const struct rmsnorm_args a = {x, w, out, n, d, eps};
    return finish(&h, op, run_rmsnorm, NULL, &a, sizeof a);
}

LLB_CALL_ARGS_FIT(struct llb_rope_args);
static int run_rope(const void *p) {
    llb_rope(p);
    return 0;
}
static int check_rope(const void *p, char *msg) {
    const struct llb_rope_args *a = p;
    return ids_ok("rope", NULL, a->pos, a->n, 0, MAX_CTX, msg);
}

static PyObject *py_rope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "rope";
    if (check_nargs(op, nargs, 8, "(x, pos, inv_freq, n, n_heads, head_dim, rope_dim, neox)")) return NULL;
    long n, n_heads, head_dim, rope_dim, neox;
    if (get_int(args[3], op, "n", 1, MAX_DIM, &n) || get_int(args[4], op, "n_heads", 1, MAX_HEADS, &n_heads) ||
        get_int(args[5], op, "head_dim", 1, MAX_DIM, &head_dim) ||
        get_int(args[6], op, "rope_dim", 2, LLB_ROPE_MAX_DIM, &rope_dim) || get_int(args[7], op, "neox", 0, 1, &neox))
        return NULL;
    if (rope_dim % 2 != 0 || rope_dim > head_dim)
        return PyErr_Format(PyExc_ValueError, "rope: rope_dim must be even and <= head_dim (%ld), got %ld", head_dim, rope_dim);
    size_t nx;
    if (mul_size(&nx, n, n_heads, head_dim, 1)) return NULL;
    struct held h = {.count = 0};
    float *x = get_buf(&h, args[0], op, "x", 1, E_F32, nx, 0);
    const int32_t *pos = x ? get_buf(&h, args[1], op, "pos", 0, E_I32, n, 0) : NULL;
    const float *inv_freq = pos ? get_buf(&h, args[2], op, "inv_freq", 0, E_F32, rope_dim / 2, 0) : NULL;
    if (!inv_freq) {
        release_all(&h);
        return NULL;
    }
    const struct llb_rope_args a = {x, pos, inv_freq, n, n_heads, head_dim, rope_dim, (int)neox};
    return finish(&h, op, run_rope, check_rope, &a, sizeof a);
}

LLB_CALL_ARGS_FIT(struct llb_kv_store_args);
static int run_kv_store(const void *p) {
    llb_kv_store(p);
    return 0;
}
static int check_kv_store(const void *p, char *msg) {
    const struct llb_kv_store_args *a = p;
    return ids_ok("kv_store", a->slots, a->pos, a->n, a->n_slots, a->n_ctx, msg);
}

static PyObject *py_kv_store(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "kv_store";
    if (check_nargs(op, nargs, 12, "(k, v, kcache, vcache, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, cache_type)"))
        return NULL;
    long n, n_kv, head_dim, n_slots, n_ctx;
    int cache_type;
    if (get_int(args[6], op, "n", 1, MAX_DIM, &n) || get_int(args[7], op, "n_kv", 1, MAX_HEADS, &n_kv) ||
        get_int(args[8], op, "head_dim", 1, LLB_ATTN_MAX_HEAD_DIM, &head_dim) ||
        get_int(args[9], op, "n_slots", 1, MAX_DIM, &n_slots) || get_int(args[10], op, "n_ctx", 1, MAX_CTX, &n_ctx) ||
        get_cache_type(args[11], op, &cache_type))
        return NULL;
    size_t nrow, ncache;
    if (mul_size(&nrow, n, n_kv, head_dim, 1) || mul_size(&ncache, n_slots, n_ctx, n_kv, head_dim)) return NULL;
    const enum elem ce = cache_type == LLB_CACHE_F16 ? E_F16 : E_F32;
    struct held h = {.count = 0};
    const float *k = get_buf(&h, args[0], op, "k", 0, E_F32, nrow, 0);
    const float *v = k ? get_buf(&h, args[1], op, "v", 0, E_F32, nrow, 0) : NULL;
    void *kc = v ? get_buf(&h, args[2], op, "kcache", 1, ce, ncache, 1) : NULL;
    void *vc = kc ? get_buf(&h, args[3], op, "vcache", 1, ce, ncache, 1) : NULL;
    const int32_t *slots = vc ? get_buf(&h, args[4], op, "slots", 0, E_I32, n, 0) : NULL;
    const int32_t *pos = slots ? get_buf(&h, args[5], op, "pos", 0, E_I32, n, 0) : NULL;
    if (!pos) goto fail;
    if (kc == vc) {
        PyErr_SetString(PyExc_ValueError, "kv_store: kcache and vcache are the same buffer");
        goto fail;
    }
    const struct llb_kv_store_args a = {k, v, kc, vc, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, cache_type};
    return finish(&h, op, run_kv_store, check_kv_store, &a, sizeof a);
fail:
    release_all(&h);
    return NULL;
}

LLB_CALL_ARGS_FIT(struct llb_attention_args);
static int run_attention(const void *p) {
    llb_attention(p);
    return 0;
}
static int check_attention(const void *p, char *msg) {
    const struct llb_attention_args *a = p;
    return ids_ok("attention", a->slots, a->pos, a->n, a->n_slots, a->n_ctx, msg);
}

static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "attention";
    if (check_nargs(op, nargs, 16,
                    "(q, kcache, vcache, out, slots, pos, n, n_heads, n_kv, head_dim, n_slots, n_ctx, cache_type, "
                    "scale, window, softcap)"))
        return NULL;
    struct llb_attention_args a;
    if (get_int(args[6], op, "n", 1, MAX_DIM, &a.n) || get_int(args[7], op, "n_heads", 1, MAX_HEADS, &a.n_heads) ||
        get_int(args[8], op, "n_kv", 1, MAX_HEADS, &a.n_kv) ||
        get_int(args[9], op, "head_dim", 1, LLB_ATTN_MAX_HEAD_DIM, &a.head_dim) ||
        get_int(args[10], op, "n_slots", 1, MAX_DIM, &a.n_slots) || get_int(args[11], op, "n_ctx", 1, MAX_CTX, &a.n_ctx) ||
        get_cache_type(args[12], op, &a.cache_type) || get_float(args[13], op, "scale", -INFINITY, &a.scale) ||
        get_int(args[14], op, "window", 0, MAX_CTX, &a.window) || get_float(args[15], op, "softcap", 0.0, &a.softcap))
        return NULL;
    if (a.n_heads % a.n_kv != 0)
        return PyErr_Format(PyExc_ValueError, "attention: n_heads (%ld) must be a multiple of n_kv (%ld)", a.n_heads, a.n_kv);
    size_t nq, ncache;
    if (mul_size(&nq, a.n, a.n_heads, a.head_dim, 1) || mul_size(&ncache, a.n_slots, a.n_ctx, a.n_kv, a.head_dim))
        return NULL;
    const enum elem ce = a.cache_type == LLB_CACHE_F16 ? E_F16 : E_F32;
    struct held h = {.count = 0};
    if (!(a.q = get_buf(&h, args[0], op, "q", 0, E_F32, nq, 0)) ||
        !(a.kcache = get_buf(&h, args[1], op, "kcache", 0, ce, ncache, 1)) ||
        !(a.vcache = get_buf(&h, args[2], op, "vcache", 0, ce, ncache, 1)) ||
        !(a.out = get_buf(&h, args[3], op, "out", 1, E_F32, nq, 0)) ||
        !(a.slots = get_buf(&h, args[4], op, "slots", 0, E_I32, a.n, 0)) ||
        !(a.pos = get_buf(&h, args[5], op, "pos", 0, E_I32, a.n, 0)))
        goto fail;
    return finish(&h, op, run_attention, check_attention, &a, sizeof a);
fail:
    release_all(&h);
    return NULL;
}

/* gate/up -> out binary ops: silu_mul, gelu_mul, add. */
struct binary_args {
    void (*fn)(const float *, const float *, float *, long);
    const float *a, *b;
    float *out;
    long count;
};
LLB_CALL_ARGS_FIT(struct binary_args);
static int run_binary(const void *p) {
    const struct binary_args *a = p;
    a->fn(a->a, a->b, a->out, a->count);
    return 0;
}

static PyObject *binary_op(const char *op, const char *na, const char *nb, PyObject *const *args, Py_ssize_t nargs,
                           void (*fn)(const float *, const float *, float *, long)) {
    char sig[64];
    PyOS_snprintf(sig, sizeof sig, "(%s, %s, out, count)", na, nb);
    if (check_nargs(op, nargs, 4, sig)) return NULL;
    long count;
    if (get_int(args[3], op, "count", 1, MAX_DIM, &count)) return NULL;
    struct held h = {.count = 0};
    const float *a = get_buf(&h, args[0], op, na, 0, E_F32, count, 0);
    const float *b = a ? get_buf(&h, args[1], op, nb, 0, E_F32, count, 0) : NULL;
    float *out = b ? get_buf(&h, args[2], op, "out", 1, E_F32, count, 0) : NULL;
    if (!out) {
        release_all(&h);
        return NULL;
    }
    const struct binary_args args_ = {fn, a, b, out, count};
    return finish(&h, op, run_binary, NULL, &args_, sizeof args_);
}

static PyObject *py_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("silu_mul", "gate", "up", args, nargs, llb_silu_mul);
}
static PyObject *py_gelu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("gelu_mul", "gate", "up", args, nargs, llb_gelu_mul);
}
static PyObject *py_add(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("add", "a", "b", args, nargs, llb_add);
}

struct add_rows_args {
    const float *x, *bias;
    float *out;
    long n, d;
};
LLB_CALL_ARGS_FIT(struct add_rows_args);
static int run_add_rows(const void *p) {
    const struct add_rows_args *a = p;
    llb_add_rows(a->x, a->bias, a->out, a->n, a->d);
    return 0;
}

static PyObject *py_add_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "add_rows";
    if (check_nargs(op, nargs, 5, "(x, bias, out, n, d)")) return NULL;
    long n, d;
    if (get_int(args[3], op, "n", 1, MAX_DIM, &n) || get_int(args[4], op, "d", 1, MAX_DIM, &d)) return NULL;
    size_t nd;
    if (mul_size(&nd, n, d, 1, 1)) return NULL;
    struct held h = {.count = 0};
    const float *x = get_buf(&h, args[0], op, "x", 0, E_F32, nd, 0);
    const float *bias = x ? get_buf(&h, args[1], op, "bias", 0, E_F32, d, 0) : NULL;
    float *out = bias ? get_buf(&h, args[2], op, "out", 1, E_F32, nd, 0) : NULL;
    if (!out) {
        release_all(&h);
        return NULL;
    }
    const struct add_rows_args a = {x, bias, out, n, d};
    return finish(&h, op, run_add_rows, NULL, &a, sizeof a);
}

/* In-place x op scalar: scale (any finite s), softcap (cap > 0). */
struct inplace_args {
    void (*fn)(float *, float, long);
    float *x;
    float s;
    long count;
};
LLB_CALL_ARGS_FIT(struct inplace_args);
static int run_inplace(const void *p) {
    const struct inplace_args *a = p;
    a->fn(a->x, a->s, a->count);
    return 0;
}

static PyObject *inplace_op(const char *op, const char *sname, double smin, PyObject *const *args, Py_ssize_t nargs,
                            void (*fn)(float *, float, long)) {
    char sig[64];
    PyOS_snprintf(sig, sizeof sig, "(x, %s, count)", sname);
    if (check_nargs(op, nargs, 3, sig)) return NULL;
    long count;
    float s;
    if (get_float(args[1], op, sname, smin, &s) || get_int(args[2], op, "count", 1, MAX_DIM, &count)) return NULL;
    if (smin >= 0 && s <= 0) return PyErr_Format(PyExc_ValueError, "%s: %s must be > 0, got %S", op, sname, args[1]);
    struct held h = {.count = 0};
    float *x = get_buf(&h, args[0], op, "x", 1, E_F32, count, 0);
    if (!x) {
        release_all(&h);
        return NULL;
    }
    const struct inplace_args a = {fn, x, s, count};
    return finish(&h, op, run_inplace, NULL, &a, sizeof a);
}

static PyObject *py_scale(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return inplace_op("scale", "s", -INFINITY, args, nargs, llb_scale);
}
static PyObject *py_softcap(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return inplace_op("softcap", "cap", 0.0, args, nargs, llb_softcap);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef llb_ops_methods[] = {
    {"rmsnorm", FASTCALL(py_rmsnorm), "rmsnorm(x, w, out, n, d, eps): out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w."},
    {"rope", FASTCALL(py_rope),
     "rope(x, pos, inv_freq, n, n_heads, head_dim, rope_dim, neox): rotary embedding in place on x (n, n_heads, head_dim)."},
    {"kv_store", FASTCALL(py_kv_store),
     "kv_store(k, v, kcache, vcache, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, cache_type): "
     "write token i's k/v to cache[slots[i], pos[i]] (cache_type 0 = f32, 1 = f16)."},
    {"attention", FASTCALL(py_attention),
     "attention(q, kcache, vcache, out, slots, pos, n, n_heads, n_kv, head_dim, n_slots, n_ctx, cache_type, scale, "
     "window, softcap): causal GQA attention over the KV cache; out may alias q."},
    {"silu_mul", FASTCALL(py_silu_mul), "silu_mul(gate, up, out, count): out = gate * sigmoid(gate) * up."},
    {"gelu_mul", FASTCALL(py_gelu_mul), "gelu_mul(gate, up, out, count): out = gelu_tanh(gate) * up."},
    {"add", FASTCALL(py_add), "add(a, b, out, count): out = a + b (out may alias a or b)."},
    {"add_rows", FASTCALL(py_add_rows), "add_rows(x, bias, out, n, d): out[i] = x[i] + bias."},
    {"scale", FASTCALL(py_scale), "scale(x, s, count): x *= s in place."},
    {"softcap", FASTCALL(py_softcap), "softcap(x, cap, count): x = cap * tanh(x / cap) in place."},
    {NULL, NULL, 0, NULL},
};

/* Python bindings of ops/: check every argument into an args struct (with the
 * helpers of args.h), then hand it to llb_call (python/plan.c), which runs it
 * with the GIL released and, while a Plan records on this thread, keeps it for
 * replay. Checks of buffer contents (slots, positions) are the calls' `check`
 * functions, which replay re-runs. KV caches must be exactly
 * n_slots * n_ctx * n_kv * head_dim elements, which catches a head_dim or
 * n_ctx that does not match the cache. Any violation is a ValueError naming the
 * op and the argument. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>

#include "ops/ops.h"
#include "ops/posscale.h"
#include "ops/ssmscan1.h"
#include "python/args.h"
#include "python/bindings.h"
#include "python/plan.h"

#define MAX_DIM LLB_ARG_MAX_DIM
#define MAX_CTX (1L << 24)   /* n_ctx, positions: exact in float32 */
#define MAX_HEADS 4096

/* Buffers of the op bindings: a wrong kind is a ValueError (see args.h). */
#define OPS_BUFS {.error = PyExc_ValueError, .count = 0}

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

static int get_cache_type(PyObject *o, const char *op, int *out) {
    long t;
    if (llb_arg_long(o, op, "cache_type", 0, 2, &t)) return -1;
    *out = (int)t;
    return 0;
}

/* The optional key bases (None or absent: NULL) of a q8_0 cache: n_slots * n_kv * head_dim floats. */
static int get_kbase(struct llb_bufs *h, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t at, const char *op,
                     int writable, int cache_type, size_t count, float **out) {
    *out = NULL;
    if (nargs <= at || args[at] == Py_None) return 0;
    if (cache_type != LLB_CACHE_Q8_0) {
        PyErr_Format(PyExc_ValueError, "%s: kbase goes with a q8_0 cache (cache_type 2) only", op);
        return -1;
    }
    *out = llb_arg_buf(h, args[at], op, "kbase", writable, LLB_ELEM_F32, count, 1);
    return *out ? 0 : -1;
}

/* How a cache of `values` values of type t is handed over: its element kind and count (Q8_0:
 * bytes, whole 32-value blocks of each head's row, so head_dim must be a multiple of 32). */
static int cache_buf_kind(const char *op, int t, long head_dim, size_t values, enum llb_elem *kind, size_t *count) {
    if (t == LLB_CACHE_Q8_0 && head_dim % LLB_Q8_0_BLOCK) {
        PyErr_Format(PyExc_ValueError, "%s: a q8_0 cache needs head_dim a multiple of %d (got %ld)", op, LLB_Q8_0_BLOCK,
                     head_dim);
        return -1;
    }
    *kind = t == LLB_CACHE_Q8_0 ? LLB_ELEM_BYTES : t == LLB_CACHE_F16 ? LLB_ELEM_F16 : LLB_ELEM_F32;
    *count = t == LLB_CACHE_Q8_0 ? llb_cache_bytes(t, values) : values;
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
    if (llb_arg_nargs(op, nargs, 6, "x, w, out, n, d, eps")) return NULL;
    long n, d;
    float eps;
    if (llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "d", 1, MAX_DIM, &d) ||
        llb_arg_float(args[5], op, "eps", 0.0, &eps))
        return NULL;
    size_t nd;
    if (llb_arg_product(op, &nd, n, d, 1, 1)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *x = llb_arg_buf(&h, args[0], op, "x", 0, LLB_ELEM_F32, nd, 0);
    const float *w = x ? llb_arg_buf(&h, args[1], op, "w", 0, LLB_ELEM_F32, d, 0) : NULL;
    float *out = w ? llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_F32, nd, 0) : NULL;
    if (!out) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct rmsnorm_args a = {x, w, out, n, d, eps};
    return llb_bufs_call(&h, op, run_rmsnorm, NULL, &a, sizeof a);
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
    if (llb_arg_nargs(op, nargs, 8, "x, pos, inv_freq, n, n_heads, head_dim, rope_dim, neox")) return NULL;
    long n, n_heads, head_dim, rope_dim, neox;
    if (llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "n_heads", 1, MAX_HEADS, &n_heads) ||
        llb_arg_long(args[5], op, "head_dim", 1, MAX_DIM, &head_dim) ||
        llb_arg_long(args[6], op, "rope_dim", 2, LLB_ROPE_MAX_DIM, &rope_dim) || llb_arg_long(args[7], op, "neox", 0, 1, &neox))
        return NULL;
    if (rope_dim % 2 != 0 || rope_dim > head_dim)
        return PyErr_Format(PyExc_ValueError, "rope: rope_dim must be even and <= head_dim (%ld), got %ld", head_dim, rope_dim);
    size_t nx;
    if (llb_arg_product(op, &nx, n, n_heads, head_dim, 1)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    float *x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, nx, 0);
    const int32_t *pos = x ? llb_arg_buf(&h, args[1], op, "pos", 0, LLB_ELEM_I32, n, 0) : NULL;
    const float *inv_freq = pos ? llb_arg_buf(&h, args[2], op, "inv_freq", 0, LLB_ELEM_F32, rope_dim / 2, 0) : NULL;
    if (!inv_freq) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct llb_rope_args a = {x, pos, inv_freq, n, n_heads, head_dim, rope_dim, (int)neox};
    return llb_bufs_call(&h, op, run_rope, check_rope, &a, sizeof a);
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
    if (nargs != 13 && llb_arg_nargs(op, nargs, 12, "k, v, kcache, vcache, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, "
                                                     "cache_type[, kbase]"))
        return NULL;
    long n, n_kv, head_dim, n_slots, n_ctx;
    int cache_type;
    if (llb_arg_long(args[6], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[7], op, "n_kv", 1, MAX_HEADS, &n_kv) ||
        llb_arg_long(args[8], op, "head_dim", 1, LLB_ATTN_MAX_HEAD_DIM, &head_dim) ||
        llb_arg_long(args[9], op, "n_slots", 1, MAX_DIM, &n_slots) || llb_arg_long(args[10], op, "n_ctx", 1, MAX_CTX, &n_ctx) ||
        get_cache_type(args[11], op, &cache_type))
        return NULL;
    size_t nrow, ncache;
    if (llb_arg_product(op, &nrow, n, n_kv, head_dim, 1) || llb_arg_product(op, &ncache, n_slots, n_ctx, n_kv, head_dim)) return NULL;
    enum llb_elem ce;
    if (cache_buf_kind(op, cache_type, head_dim, ncache, &ce, &ncache)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *k = llb_arg_buf(&h, args[0], op, "k", 0, LLB_ELEM_F32, nrow, 0);
    const float *v = k ? llb_arg_buf(&h, args[1], op, "v", 0, LLB_ELEM_F32, nrow, 0) : NULL;
    void *kc = v ? llb_arg_buf(&h, args[2], op, "kcache", 1, ce, ncache, 1) : NULL;
    void *vc = kc ? llb_arg_buf(&h, args[3], op, "vcache", 1, ce, ncache, 1) : NULL;
    const int32_t *slots = vc ? llb_arg_buf(&h, args[4], op, "slots", 0, LLB_ELEM_I32, n, 0) : NULL;
    const int32_t *pos = slots ? llb_arg_buf(&h, args[5], op, "pos", 0, LLB_ELEM_I32, n, 0) : NULL;
    if (!pos) goto fail;
    /* caches are written while k, v, slots and pos are read; two caches share every row or none */
    if ((kc != vc || h.views[2].len != h.views[3].len) && llb_bufs_overlap(&h, 2, 3)) {
        PyErr_SetString(PyExc_ValueError, "kv_store: kcache and vcache overlap without being the same buffer");
        goto fail;
    }
    for (int i = 0; i < 6; i++)
        if (i != 2 && i != 3 && (llb_bufs_overlap(&h, i, 2) || llb_bufs_overlap(&h, i, 3))) {
            PyErr_SetString(PyExc_ValueError, "kv_store: k, v, slots or pos overlaps the cache it writes");
            goto fail;
        }
    if (kc == vc && k != v) {
        PyErr_SetString(PyExc_ValueError, "kv_store: kcache and vcache are the same buffer but k and v differ");
        goto fail;
    }
    float *kbase;
    if (get_kbase(&h, args, nargs, 12, op, 1, cache_type, (size_t)n_slots * (size_t)(n_kv * head_dim), &kbase)) goto fail;
    if (kc == vc && kbase) { /* a key stored against its base would be read back as a value without it */
        PyErr_SetString(PyExc_ValueError, "kv_store: a cache whose values are its keys (kcache is vcache) takes no kbase");
        goto fail;
    }
    const struct llb_kv_store_args a = {k, v, kc, vc, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, cache_type, kbase};
    return llb_bufs_call(&h, op, run_kv_store, check_kv_store, &a, sizeof a);
fail:
    llb_bufs_release(&h);
    return NULL;
}

LLB_CALL_ARGS_FIT(struct llb_attention_args);
static int run_attention(const void *p) {
    llb_attention(p);
    return 0;
}
static int check_attention(const void *p, char *msg) {
    const struct llb_attention_args *a = p;
    if (ids_ok("attention", a->slots, a->pos, a->n, a->n_slots, a->n_ctx, msg)) return -1;
    for (long i = 0; a->kend && i < a->n; i++)
        if (a->kend[i] <= a->pos[i] || a->kend[i] > a->n_ctx) {
            snprintf(msg, LLB_CHECK_MSG, "attention: kend[%ld] = %d is out of range [pos + 1 = %d, n_ctx = %ld]", i,
                     (int)a->kend[i], (int)a->pos[i] + 1, a->n_ctx);
            return -1;
        }
    return 0;
}

/* attention's 16 arguments into a and h, then the optional kbase at args[kbase_at] (shared with
 * attention_sinks); 0, or -1 with an exception set */
static int parse_attention(const char *op, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t kbase_at,
                           struct llb_attention_args *a, struct llb_bufs *h) {
    *a = (struct llb_attention_args){0};
    if (llb_arg_long(args[6], op, "n", 1, MAX_DIM, &a->n) || llb_arg_long(args[7], op, "n_heads", 1, MAX_HEADS, &a->n_heads) ||
        llb_arg_long(args[8], op, "n_kv", 1, MAX_HEADS, &a->n_kv) ||
        llb_arg_long(args[9], op, "head_dim", 1, LLB_ATTN_MAX_HEAD_DIM, &a->head_dim) ||
        llb_arg_long(args[10], op, "n_slots", 1, MAX_DIM, &a->n_slots) || llb_arg_long(args[11], op, "n_ctx", 1, MAX_CTX, &a->n_ctx) ||
        get_cache_type(args[12], op, &a->cache_type) || llb_arg_float(args[13], op, "scale", -INFINITY, &a->scale) ||
        llb_arg_long(args[14], op, "window", 0, MAX_CTX, &a->window) || llb_arg_float(args[15], op, "softcap", 0.0, &a->softcap))
        return -1;
    if (a->n_heads % a->n_kv != 0) {
        PyErr_Format(PyExc_ValueError, "%s: n_heads (%ld) must be a multiple of n_kv (%ld)", op, a->n_heads, a->n_kv);
        return -1;
    }
    size_t nq, ncache;
    if (llb_arg_product(op, &nq, a->n, a->n_heads, a->head_dim, 1) ||
        llb_arg_product(op, &ncache, a->n_slots, a->n_ctx, a->n_kv, a->head_dim))
        return -1;
    enum llb_elem ce;
    if (cache_buf_kind(op, a->cache_type, a->head_dim, ncache, &ce, &ncache)) return -1;
    if (!(a->q = llb_arg_buf(h, args[0], op, "q", 0, LLB_ELEM_F32, nq, 0)) ||
        !(a->kcache = llb_arg_buf(h, args[1], op, "kcache", 0, ce, ncache, 1)) ||
        !(a->vcache = llb_arg_buf(h, args[2], op, "vcache", 0, ce, ncache, 1)) ||
        !(a->out = llb_arg_buf(h, args[3], op, "out", 1, LLB_ELEM_F32, nq, 0)) ||
        !(a->slots = llb_arg_buf(h, args[4], op, "slots", 0, LLB_ELEM_I32, a->n, 0)) ||
        !(a->pos = llb_arg_buf(h, args[5], op, "pos", 0, LLB_ELEM_I32, a->n, 0)))
        return -1;
    /* out is written while the caches, slots and pos are read; it may be q exactly (each row read first) */
    const int out_is_q = a->out == a->q && h->views[3].len == h->views[0].len;
    for (int i = 0; i < 6; i++)
        if (i != 3 && llb_bufs_overlap(h, 3, i) && !(i == 0 && out_is_q)) {
            PyErr_Format(PyExc_ValueError, "%s: out overlaps %s", op, (const char *[]){"q without being it", "kcache",
                         "vcache", "", "slots", "pos"}[i]);
            return -1;
        }
    float *kbase;
    if (get_kbase(h, args, nargs, kbase_at, op, 0, a->cache_type, (size_t)a->n_slots * (size_t)(a->n_kv * a->head_dim),
                  &kbase))
        return -1;
    if (kbase && a->kcache == a->vcache) { /* values read from keys stored against a base would lack it */
        PyErr_Format(PyExc_ValueError, "%s: a cache whose values are its keys (kcache is vcache) takes no kbase", op);
        return -1;
    }
    a->kbase = kbase;
    return 0;
}

static PyObject *py_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "attention";
    if (nargs != 17 && nargs != 18 && llb_arg_nargs(op, nargs, 16,
                                     "q, kcache, vcache, out, slots, pos, n, n_heads, n_kv, head_dim, n_slots, n_ctx, "
                                     "cache_type, scale, window, softcap[, kbase[, kend]]"))
        return NULL;
    struct llb_attention_args a;
    struct llb_bufs h = OPS_BUFS;
    if (parse_attention(op, args, nargs, 16, &a, &h)) {
        llb_bufs_release(&h);
        return NULL;
    }
    if (nargs == 18 && args[17] != Py_None) { /* each row's end of visible keys (checked in check_attention) */
        const int at = h.count;
        if (!(a.kend = llb_arg_buf(&h, args[17], op, "kend", 0, LLB_ELEM_I32, a.n, 0))) {
            llb_bufs_release(&h);
            return NULL;
        }
        if (llb_bufs_overlap(&h, 3, at)) {
            llb_bufs_release(&h);
            return PyErr_Format(PyExc_ValueError, "%s: out overlaps kend", op);
        }
    }
    return llb_bufs_call(&h, op, run_attention, check_attention, &a, sizeof a);
}

struct sinks_args {
    struct llb_attention_args a;
    const float *sinks;
};
LLB_CALL_ARGS_FIT(struct sinks_args);
static int run_sinks(const void *p) {
    const struct sinks_args *s = p;
    llb_attention_sinks(&s->a, s->sinks);
    return 0;
}
static int check_sinks(const void *p, char *msg) {
    const struct llb_attention_args *a = &((const struct sinks_args *)p)->a;
    return ids_ok("attention_sinks", a->slots, a->pos, a->n, a->n_slots, a->n_ctx, msg);
}

/* attention_sinks(attention's 16 arguments, sinks[, kbase]) -> None: out rescaled for each head's sink logit */
static PyObject *py_attention_sinks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "attention_sinks";
    if (nargs != 18 && llb_arg_nargs(op, nargs, 17,
                                     "q, kcache, vcache, out, slots, pos, n, n_heads, n_kv, head_dim, n_slots, n_ctx, "
                                     "cache_type, scale, window, softcap, sinks[, kbase]"))
        return NULL;
    struct sinks_args s;
    struct llb_bufs h = OPS_BUFS;
    if (parse_attention(op, args, nargs, 17, &s.a, &h) ||
        !(s.sinks = llb_arg_buf(&h, args[16], op, "sinks", 0, LLB_ELEM_F32, s.a.n_heads, 0))) {
        llb_bufs_release(&h);
        return NULL;
    }
    if (llb_bufs_overlap(&h, 3, 0) || llb_bufs_overlap(&h, 3, 6)) { /* out vs q, out vs sinks */
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: out overlaps q or sinks", op);
    }
    return llb_bufs_call(&h, op, run_sinks, check_sinks, &s, sizeof s);
}

static int state_ok(const char *op, const int32_t *slots, const int32_t *pos, const int32_t *state_pos, long n,
                    long n_slots, char *msg);
/* A recurrent op's plan hooks (its args struct has slots, pos, state_pos, n and n_slots): run_NAME runs it,
 * check_NAME asks that each position continues its slot's state. */
#define RECURRENT_OP(name)                                                                                  \
    LLB_CALL_ARGS_FIT(struct llb_##name##_args);                                                            \
    static int run_##name(const void *p) {                                                                  \
        llb_##name(p);                                                                                      \
        return 0;                                                                                           \
    }                                                                                                       \
    static int check_##name(const void *p, char *msg) {                                                     \
        const struct llb_##name##_args *a = p;                                                              \
        return state_ok(#name, a->slots, a->pos, a->state_pos, a->n, a->n_slots, msg);                      \
    }
RECURRENT_OP(short_conv)
RECURRENT_OP(gated_delta)
RECURRENT_OP(ssm_scan)
RECURRENT_OP(ssm_scan1)

static PyObject *py_short_conv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "short_conv";
    if (nargs != 13 && llb_arg_nargs(op, nargs, 12, "bcx, state, state_pos, kernel, slots, pos, out, n, d, width, "
                                                    "n_slots, gated[, bias]"))
        return NULL;
    long n, d, width, n_slots, gated;
    if (llb_arg_long(args[7], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[8], op, "d", 1, MAX_DIM, &d) ||
        llb_arg_long(args[9], op, "width", 2, 64, &width) || llb_arg_long(args[10], op, "n_slots", 1, MAX_DIM, &n_slots) ||
        llb_arg_long(args[11], op, "gated", 0, 1, &gated))
        return NULL;
    size_t nbcx, nout, nstate, nkernel;
    if (llb_arg_product(op, &nbcx, n, d, gated ? 3 : 1, 1) || llb_arg_product(op, &nout, n, d, 1, 1) ||
        llb_arg_product(op, &nstate, n_slots, width - 1, d, 1) || llb_arg_product(op, &nkernel, d, width, 1, 1))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    struct llb_short_conv_args a = {0};
    if (!(a.bcx = llb_arg_buf(&h, args[0], op, "bcx", 0, LLB_ELEM_F32, nbcx, 0)) ||
        !(a.state = llb_arg_buf(&h, args[1], op, "state", 1, LLB_ELEM_F32, nstate, 1)) ||
        !(a.state_pos = llb_arg_buf(&h, args[2], op, "state_pos", 1, LLB_ELEM_I32, n_slots, 1)) ||
        !(a.kernel = llb_arg_buf(&h, args[3], op, "kernel", 0, LLB_ELEM_F32, nkernel, 1)) ||
        !(a.slots = llb_arg_buf(&h, args[4], op, "slots", 0, LLB_ELEM_I32, n, 0)) ||
        !(a.pos = llb_arg_buf(&h, args[5], op, "pos", 0, LLB_ELEM_I32, n, 0)) ||
        !(a.out = llb_arg_buf(&h, args[6], op, "out", 1, LLB_ELEM_F32, nout, 0)) ||
        (nargs == 13 && args[12] != Py_None &&
         !(a.bias = llb_arg_buf(&h, args[12], op, "bias", 0, LLB_ELEM_F32, (size_t)d, 1)))) {
        llb_bufs_release(&h);
        return NULL;
    }
    if (a.bias && gated) {
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: a bias is for the ungated convolution only", op);
    }
    /* out, the state and its counts are written while the rest is read (slots and pos index the state) */
    static const char *names[] = {"bcx", "state", "state_pos", "kernel", "slots", "pos", "out", "bias"};
    static const int written[] = {1, 2, 6};
    int w, o;
    if (llb_bufs_written_overlap(&h, written, 3, &w, &o)) {
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: %s and %s must not overlap", op, names[w], names[o]);
    }
    a.n = n, a.d = d, a.width = width, a.n_slots = n_slots, a.gated = (int)gated;
    return llb_bufs_call(&h, op, run_short_conv, check_short_conv, &a, sizeof a);
}

/* A recurrent op's positions: slots and positions in range, each position 0 (a new sequence) or the
 * one its slot's state expects (its count, or one past the slot's previous token in this batch). */
static int state_ok(const char *op, const int32_t *slots, const int32_t *pos, const int32_t *state_pos, long n,
                    long n_slots, char *msg) {
    if (ids_ok(op, slots, pos, n, n_slots, MAX_CTX, msg)) return -1;
    for (long i = 0; i < n; i++) {
        long want = state_pos[slots[i]];
        for (long j = i - 1; j >= 0; j--)
            if (slots[j] == slots[i]) {
                want = (long)pos[j] + 1;
                break;
            }
        if (pos[i] != 0 && pos[i] != want) {
            snprintf(msg, LLB_CHECK_MSG, "%s: pos[%ld] = %d does not continue slot %d's state (at %ld)", op, i,
                     (int)pos[i], (int)slots[i], want);
            return -1;
        }
    }
    return 0;
}

static PyObject *py_gated_delta(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "gated_delta";
    if (llb_arg_nargs(op, nargs, 18, "qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, slots, pos, out, "
                                     "n, hk, hv, dk, dv, n_slots, eps"))
        return NULL;
    struct llb_gated_delta_args a = {0};
    if (llb_arg_long(args[11], op, "n", 1, MAX_DIM, &a.n) || llb_arg_long(args[12], op, "hk", 1, MAX_HEADS, &a.hk) ||
        llb_arg_long(args[13], op, "hv", 1, MAX_HEADS, &a.hv) ||
        llb_arg_long(args[14], op, "dk", 1, LLB_DELTA_MAX_DIM, &a.dk) ||
        llb_arg_long(args[15], op, "dv", 1, LLB_DELTA_MAX_DIM, &a.dv) ||
        llb_arg_long(args[16], op, "n_slots", 1, MAX_DIM, &a.n_slots) || llb_arg_float(args[17], op, "eps", 0.0, &a.eps))
        return NULL;
    if (a.hv % a.hk) return PyErr_Format(PyExc_ValueError, "%s: hv (%ld) must be a multiple of hk (%ld)", op, a.hv, a.hk);
    size_t nqkv, nv, nstate;
    if (llb_arg_product(op, &nqkv, a.n, 2 * a.hk * a.dk + a.hv * a.dv, 1, 1) ||
        llb_arg_product(op, &nv, a.n, a.hv, a.dv, 1) || llb_arg_product(op, &nstate, a.n_slots, a.hv, a.dk, a.dv))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    if (!(a.qkv = llb_arg_buf(&h, args[0], op, "qkv", 0, LLB_ELEM_F32, nqkv, 0)) ||
        !(a.ba = llb_arg_buf(&h, args[1], op, "ba", 0, LLB_ELEM_F32, (size_t)a.n * (size_t)(2 * a.hv), 0)) ||
        !(a.z = llb_arg_buf(&h, args[2], op, "z", 0, LLB_ELEM_F32, nv, 0)) ||
        !(a.state = llb_arg_buf(&h, args[3], op, "state", 1, LLB_ELEM_F32, nstate, 1)) ||
        !(a.state_pos = llb_arg_buf(&h, args[4], op, "state_pos", 1, LLB_ELEM_I32, a.n_slots, 1)) ||
        !(a.a_neg = llb_arg_buf(&h, args[5], op, "a_neg", 0, LLB_ELEM_F32, a.hv, 1)) ||
        !(a.dt_bias = llb_arg_buf(&h, args[6], op, "dt_bias", 0, LLB_ELEM_F32, a.hv, 1)) ||
        !(a.norm_w = llb_arg_buf(&h, args[7], op, "norm_w", 0, LLB_ELEM_F32, a.dv, 1)) ||
        !(a.slots = llb_arg_buf(&h, args[8], op, "slots", 0, LLB_ELEM_I32, a.n, 0)) ||
        !(a.pos = llb_arg_buf(&h, args[9], op, "pos", 0, LLB_ELEM_I32, a.n, 0)) ||
        !(a.out = llb_arg_buf(&h, args[10], op, "out", 1, LLB_ELEM_F32, nv, 0))) {
        llb_bufs_release(&h);
        return NULL;
    }
    /* out, the state and its counts are written while the rest is read (slots and pos index the state) */
    static const char *names[] = {"qkv", "ba", "z", "state", "state_pos", "a_neg", "dt_bias", "norm_w", "slots",
                                  "pos", "out"};
    static const int written[] = {3, 4, 10};
    int w, o;
    if (llb_bufs_written_overlap(&h, written, 3, &w, &o)) {
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: %s overlaps %s", op, names[w], names[o]);
    }
    return llb_bufs_call(&h, op, run_gated_delta, check_gated_delta, &a, sizeof a);
}

/* ssm_scan's array arguments in order: its name, whether it is written, its element kind and its size (a
 * product of the call's sizes, filled in by the binding), whether the size must be exact. */
struct ssm_buf {
    const char *name;
    int writable;
    enum llb_elem kind;
    size_t count;
    int exact;
};

static PyObject *py_ssm_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "ssm_scan";
    struct llb_ssm_scan_args a = {0};
    if (llb_arg_nargs(op, nargs, 19, "xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, slots, pos, out, "
                                     "n, groups, heads, dstate, dhead, n_slots, eps"))
        return NULL;
    static const char *const size_names[6] = {"n", "groups", "heads", "dstate", "dhead", "n_slots"};
    const long size_max[6] = {MAX_DIM, MAX_HEADS, MAX_HEADS, LLB_SSM_MAX_DIM, LLB_SSM_MAX_DIM, MAX_DIM};
    long *sizes[6] = {&a.n, &a.groups, &a.heads, &a.dstate, &a.dhead, &a.n_slots};
    for (int i = 0; i < 6; i++)
        if (llb_arg_long(args[12 + i], op, size_names[i], 1, size_max[i], sizes[i])) return NULL;
    if (llb_arg_float(args[18], op, "eps", 0.0, &a.eps)) return NULL;
    if (a.heads % a.groups)
        return PyErr_Format(PyExc_ValueError, "%s: heads (%ld) must be a multiple of groups (%ld)", op, a.heads, a.groups);
    size_t row, nv, nstate;     /* (all far below SIZE_MAX: each factor is bounded above) */
    if (llb_arg_product(op, &row, a.n, a.heads * a.dhead + 2 * a.groups * a.dstate, 1, 1) ||
        llb_arg_product(op, &nv, a.n, a.heads, a.dhead, 1) ||
        llb_arg_product(op, &nstate, a.n_slots, a.heads, a.dstate, a.dhead))
        return NULL;
    const size_t H = (size_t)a.heads, n = (size_t)a.n;
    struct ssm_buf spec[12] = {
        {"xbc", 0, LLB_ELEM_F32, row, 0}, {"dt", 0, LLB_ELEM_F32, n * H, 0}, {"z", 0, LLB_ELEM_F32, nv, 0},
        {"state", 1, LLB_ELEM_F32, nstate, 1}, {"state_pos", 1, LLB_ELEM_I32, (size_t)a.n_slots, 1},
        {"a_neg", 0, LLB_ELEM_F32, H, 1}, {"dt_bias", 0, LLB_ELEM_F32, H, 1}, {"d_skip", 0, LLB_ELEM_F32, H, 1},
        {"norm_w", 0, LLB_ELEM_F32, H * (size_t)a.dhead, 1}, {"slots", 0, LLB_ELEM_I32, n, 0},
        {"pos", 0, LLB_ELEM_I32, n, 0}, {"out", 1, LLB_ELEM_F32, nv, 0}};
    void *ptr[12];
    int spec_of[12], held = 0; /* the spec row of each acquired view (norm_w None acquires none) */
    struct llb_bufs h = OPS_BUFS;
    for (int i = 0; i < 12; i++) {
        ptr[i] = NULL;
        if (i == 8 && args[i] == Py_None) continue; /* norm_w None: no gated norm (Falcon-H1's mamba_rms_norm false) */
        spec_of[held++] = i;
        if (!(ptr[i] = llb_arg_buf(&h, args[i], op, spec[i].name, spec[i].writable, spec[i].kind, spec[i].count,
                                   spec[i].exact))) {
            llb_bufs_release(&h);
            return NULL;
        }
    }
    a.xbc = ptr[0], a.dt = ptr[1], a.z = ptr[2], a.state = ptr[3], a.state_pos = ptr[4], a.a_neg = ptr[5];
    a.dt_bias = ptr[6], a.d_skip = ptr[7], a.norm_w = ptr[8], a.slots = ptr[9], a.pos = ptr[10], a.out = ptr[11];
    /* out, state and state_pos are written while every other buffer is read (slots and pos index the
     * state: a write into them would move later writes off the buffer): none may share a byte with another */
    const int written[] = {3, 4, held - 1}; /* state, state_pos, out (the last view) */
    int w, o;
    if (llb_bufs_written_overlap(&h, written, 3, &w, &o)) {
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: %s overlaps %s", op, spec[spec_of[w]].name, spec[spec_of[o]].name);
    }
    return llb_bufs_call(&h, op, run_ssm_scan, check_ssm_scan, &a, sizeof a);
}

/* ssm_scan1(x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out, n, d_inner, dstate,
 * n_slots): Mamba 1's scan (ops/ssmscan1.h). */
static const char ssm_scan1_sig[] = "x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out, n, "
                                    "d_inner, dstate, n_slots";
static PyObject *py_ssm_scan1(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "ssm_scan1";
    if (llb_arg_nargs(op, nargs, 17, ssm_scan1_sig)) return NULL;
    struct llb_ssm_scan1_args a = {0};
    if (llb_arg_long(args[13], op, "n", 1, MAX_DIM, &a.n) ||
        llb_arg_long(args[14], op, "d_inner", 1, MAX_DIM, &a.d_inner) ||
        llb_arg_long(args[15], op, "dstate", 1, LLB_SSM1_MAX_STATE, &a.dstate) ||
        llb_arg_long(args[16], op, "n_slots", 1, MAX_DIM, &a.n_slots))
        return NULL;
    size_t nd, nn, dn, nstate;
    if (llb_arg_product(op, &nd, a.n, a.d_inner, 1, 1) || llb_arg_product(op, &nn, a.n, a.dstate, 1, 1) ||
        llb_arg_product(op, &dn, a.d_inner, a.dstate, 1, 1) || llb_arg_product(op, &nstate, a.n_slots, dn, 1, 1))
        return NULL;
    const size_t D = (size_t)a.d_inner, n = (size_t)a.n;
    /* in argument order: name, written, kind, count, exact */
    const struct ssm_buf spec[13] = {
        {"x", 0, LLB_ELEM_F32, nd, 0}, {"dt", 0, LLB_ELEM_F32, nd, 0}, {"b", 0, LLB_ELEM_F32, nn, 0},
        {"c", 0, LLB_ELEM_F32, nn, 0}, {"z", 0, LLB_ELEM_F32, nd, 0}, {"state", 1, LLB_ELEM_F32, nstate, 1},
        {"state_pos", 1, LLB_ELEM_I32, (size_t)a.n_slots, 1}, {"a_neg", 0, LLB_ELEM_F32, dn, 1},
        {"dt_bias", 0, LLB_ELEM_F32, D, 1}, {"d_skip", 0, LLB_ELEM_F32, D, 1}, {"slots", 0, LLB_ELEM_I32, n, 0},
        {"pos", 0, LLB_ELEM_I32, n, 0}, {"out", 1, LLB_ELEM_F32, nd, 0}};
    void *ptr[13];
    struct llb_bufs h = OPS_BUFS;
    for (int i = 0; i < 13; i++)
        if (!(ptr[i] = llb_arg_buf(&h, args[i], op, spec[i].name, spec[i].writable, spec[i].kind, spec[i].count,
                                   spec[i].exact))) {
            llb_bufs_release(&h);
            return NULL;
        }
    a.x = ptr[0], a.dt = ptr[1], a.b = ptr[2], a.c = ptr[3], a.z = ptr[4], a.state = ptr[5], a.state_pos = ptr[6];
    a.a_neg = ptr[7], a.dt_bias = ptr[8], a.d_skip = ptr[9], a.slots = ptr[10], a.pos = ptr[11], a.out = ptr[12];
    /* out, the state and its counts are written while the rest is read (slots and pos index the state) */
    static const int written[] = {5, 6, 12};
    int w, o;
    if (llb_bufs_written_overlap(&h, written, 3, &w, &o)) {
        llb_bufs_release(&h);
        return PyErr_Format(PyExc_ValueError, "%s: %s overlaps %s", op, spec[w].name, spec[o].name);
    }
    return llb_bufs_call(&h, op, run_ssm_scan1, check_ssm_scan1, &a, sizeof a);
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
    PyOS_snprintf(sig, sizeof sig, "%s, %s, out, count", na, nb);
    if (llb_arg_nargs(op, nargs, 4, sig)) return NULL;
    long count;
    if (llb_arg_long(args[3], op, "count", 1, MAX_DIM, &count)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *a = llb_arg_buf(&h, args[0], op, na, 0, LLB_ELEM_F32, count, 0);
    const float *b = a ? llb_arg_buf(&h, args[1], op, nb, 0, LLB_ELEM_F32, count, 0) : NULL;
    float *out = b ? llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_F32, count, 0) : NULL;
    if (!out) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct binary_args args_ = {fn, a, b, out, count};
    return llb_bufs_call(&h, op, run_binary, NULL, &args_, sizeof args_);
}

static PyObject *py_silu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("silu_mul", "gate", "up", args, nargs, llb_silu_mul);
}
static PyObject *py_gelu_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("gelu_mul", "gate", "up", args, nargs, llb_gelu_mul);
}
static PyObject *py_sigmoid_mul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return binary_op("sigmoid_mul", "x", "gate", args, nargs, llb_sigmoid_mul);
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
    if (llb_arg_nargs(op, nargs, 5, "x, bias, out, n, d")) return NULL;
    long n, d;
    if (llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "d", 1, MAX_DIM, &d)) return NULL;
    size_t nd;
    if (llb_arg_product(op, &nd, n, d, 1, 1)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *x = llb_arg_buf(&h, args[0], op, "x", 0, LLB_ELEM_F32, nd, 0);
    const float *bias = x ? llb_arg_buf(&h, args[1], op, "bias", 0, LLB_ELEM_F32, d, 0) : NULL;
    float *out = bias ? llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_F32, nd, 0) : NULL;
    if (!out) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct add_rows_args a = {x, bias, out, n, d};
    return llb_bufs_call(&h, op, run_add_rows, NULL, &a, sizeof a);
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
    PyOS_snprintf(sig, sizeof sig, "x, %s, count", sname);
    if (llb_arg_nargs(op, nargs, 3, sig)) return NULL;
    long count;
    float s;
    if (llb_arg_float(args[1], op, sname, smin, &s) || llb_arg_long(args[2], op, "count", 1, MAX_DIM, &count)) return NULL;
    if (smin >= 0 && s <= 0) return PyErr_Format(PyExc_ValueError, "%s: %s must be > 0, got %S", op, sname, args[1]);
    struct llb_bufs h = OPS_BUFS;
    float *x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, count, 0);
    if (!x) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct inplace_args a = {fn, x, s, count};
    return llb_bufs_call(&h, op, run_inplace, NULL, &a, sizeof a);
}

static PyObject *py_scale(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return inplace_op("scale", "s", -INFINITY, args, nargs, llb_scale);
}
static PyObject *py_softcap(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return inplace_op("softcap", "cap", 0.0, args, nargs, llb_softcap);
}

/* pos_scale(x, pos, n, width, beta, length): row i of x times (float)(1 + beta log1p(floor(pos[i] / length))),
 * in place. The positions are re-checked (>= 0) at every replay: a plan reads each step's from its buffer. */
static int check_pos_scale(const void *p, char *msg) {
    const struct llb_pos_scale_args *a = p;
    return ids_ok("pos_scale", NULL, a->pos, a->n, 0, (long)INT32_MAX + 1, msg);
}
static int run_pos_scale(const void *p) {
    llb_pos_scale(p);
    return 0;
}
LLB_CALL_ARGS_FIT(struct llb_pos_scale_args);

static PyObject *py_pos_scale(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "pos_scale";
    if (llb_arg_nargs(op, nargs, 6, "x, pos, n, width, beta, length")) return NULL;
    long n, width, length;
    if (llb_arg_long(args[2], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[3], op, "width", 1, MAX_DIM, &width) ||
        llb_arg_long(args[5], op, "length", 1, LONG_MAX, &length))
        return NULL;
    if (!PyFloat_Check(args[4]) && !PyLong_Check(args[4]))
        return PyErr_Format(PyExc_TypeError, "%s: beta must be a number, got %.100s", op, Py_TYPE(args[4])->tp_name);
    const double beta = PyFloat_AsDouble(args[4]);     /* a double: the factor is computed in double */
    if (beta == -1.0 && PyErr_Occurred()) return NULL;
    if (!isfinite(beta)) return PyErr_Format(PyExc_ValueError, "%s: beta must be finite, got %R", op, args[4]);
    size_t nx;
    if (llb_arg_product(op, &nx, n, width, 1, 1)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    float *x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, nx, 0);
    const int32_t *pos = x ? llb_arg_buf(&h, args[1], op, "pos", 0, LLB_ELEM_I32, n, 0) : NULL;
    if (pos && llb_bufs_overlap(&h, 0, 1)) {
        PyErr_Format(PyExc_ValueError, "%s: x and pos overlap (x is written while pos is read)", op);
        pos = NULL;
    }
    if (!pos) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct llb_pos_scale_args a = {x, pos, n, width, length, beta};
    return llb_bufs_call(&h, op, run_pos_scale, check_pos_scale, &a, sizeof a);
}

/* gelu_erf(x, count): in place, no scalar; through inplace_args with s unused. */
static void gelu_erf_s(float *x, float s, long count) {
    (void)s;
    llb_gelu_erf(x, count);
}
static PyObject *py_gelu_erf(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    const char *op = "gelu_erf";
    if (llb_arg_nargs(op, nargs, 2, "x, count")) return NULL;
    long count;
    if (llb_arg_long(args[1], op, "count", 1, MAX_DIM, &count)) return NULL;
    struct llb_bufs h = OPS_BUFS;
    float *x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, count, 0);
    if (!x) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct inplace_args a = {gelu_erf_s, x, 0.f, count};
    return llb_bufs_call(&h, op, run_inplace, NULL, &a, sizeof a);
}

/* xielu(x, count, alpha_p, alpha_n, beta, eps): in place, the effective scalars (ops.h: llb_xielu). */
struct xielu_args {
    float *x;
    float p[4];
    long count;
};
LLB_CALL_ARGS_FIT(struct xielu_args);
static int run_xielu(const void *p) {
    const struct xielu_args *a = p;
    llb_xielu(a->x, a->count, a->p[0], a->p[1], a->p[2], a->p[3]);
    return 0;
}
static PyObject *py_xielu(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "xielu";
    static const char *names[4] = {"alpha_p", "alpha_n", "beta", "eps"};
    if (llb_arg_nargs(op, nargs, 6, "x, count, alpha_p, alpha_n, beta, eps")) return NULL;
    struct xielu_args a;
    if (llb_arg_long(args[1], op, "count", 1, MAX_DIM, &a.count)) return NULL;
    for (int i = 0; i < 4; i++)
        if (llb_arg_float(args[2 + i], op, names[i], -INFINITY, &a.p[i])) return NULL;
    struct llb_bufs h = OPS_BUFS;
    a.x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, a.count, 0);
    if (!a.x) {
        llb_bufs_release(&h);
        return NULL;
    }
    return llb_bufs_call(&h, op, run_xielu, NULL, &a, sizeof a);
}

/* copy_blocks(src, dst, n, groups, width, src_row, src_group, src_off, dst_row, dst_group, dst_off) */
struct copy_blocks_args {
    const float *src;
    float *dst;
    long v[9]; /* n, groups, width, src_row, src_group, src_off, dst_row, dst_group, dst_off */
};
LLB_CALL_ARGS_FIT(struct copy_blocks_args);
static int run_copy_blocks(const void *p) {
    const struct copy_blocks_args *a = p;
    const long *v = a->v;
    llb_copy_blocks(a->src, a->dst, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]);
    return 0;
}

/* The elements a strided block layout reaches: (n - 1) row + (groups - 1) group + off + width (no overflow:
 * each term is at most MAX_DIM^2 < 2^62). */
static size_t blocks_extent(long n, long groups, long width, long row, long group, long off) {
    return (size_t)(n - 1) * (size_t)row + (size_t)(groups - 1) * (size_t)group + (size_t)off + (size_t)width;
}

static PyObject *py_copy_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "copy_blocks";
    static const char *names[9] = {"n", "groups", "width", "src_row", "src_group", "src_off", "dst_row", "dst_group",
                                   "dst_off"};
    if (llb_arg_nargs(op, nargs, 11, "src, dst, n, groups, width, src_row, src_group, src_off, dst_row, dst_group, "
                      "dst_off")) return NULL;
    struct copy_blocks_args a;
    for (int i = 0; i < 9; i++)
        if (llb_arg_long(args[2 + i], op, names[i], i < 3 ? 1 : 0, MAX_DIM, &a.v[i])) return NULL;
    const long *v = a.v;
    struct llb_bufs h = OPS_BUFS;
    a.src = llb_arg_buf(&h, args[0], op, "src", 0, LLB_ELEM_F32, blocks_extent(v[0], v[1], v[2], v[3], v[4], v[5]), 0);
    a.dst = a.src ? llb_arg_buf(&h, args[1], op, "dst", 1, LLB_ELEM_F32, blocks_extent(v[0], v[1], v[2], v[6], v[7], v[8]), 0)
                  : NULL;
    if (!a.dst || llb_bufs_overlap(&h, 0, 1)) {
        if (a.dst) PyErr_Format(PyExc_ValueError, "%s: src and dst overlap", op);
        llb_bufs_release(&h);
        return NULL;
    }
    return llb_bufs_call(&h, op, run_copy_blocks, NULL, &a, sizeof a);
}

/* ---- Gemma 3n (ops/altup.c) ------------------------------------------------ */

struct altup_args {
    int kind;  /* 0 mul_rows, 1 gaussian_topk, 2 rms_match, 3 altup_predict, 4 altup_correct, 5 ids_below */
    const float *a, *b, *c;
    float *out;
    const int32_t *ids;
    int32_t *iout;
    long streams, n, d, idx;
    float s;
};
LLB_CALL_ARGS_FIT(struct altup_args);
static int run_altup(const void *p) {
    const struct altup_args *a = p;
    switch (a->kind) {
    case 0: llb_mul_rows(a->a, a->b, a->out, a->n, a->d); break;
    case 1: llb_gaussian_topk(a->out, a->n, a->d, a->s); break;
    case 2: llb_rms_match(a->a, a->b, a->out, a->n, a->d); break;
    case 3: llb_altup_predict(a->a, a->b, a->out, a->streams, a->n, a->d); break;
    case 4: llb_altup_correct(a->a, a->b, a->c, a->idx, a->out, a->streams, a->n, a->d); break;
    default: llb_ids_below(a->ids, (int32_t)a->idx, a->iout, a->n); break;
    }
    return 0;
}

/* mul_rows(x, w, out, n, d): out[i] = x[i] * w (w: d values); rms_match(y, target, out, n, d): out[i] =
 * y[i] * rms(target[i]) / sqrt(max(mean(y[i]^2), 1e-5)) (target: n d values). */
static PyObject *rows_op(const char *op, const char *na, const char *nb, int kind, int b_rows, PyObject *const *args,
                         Py_ssize_t nargs) {
    char sig[64];
    PyOS_snprintf(sig, sizeof sig, "%s, %s, out, n, d", na, nb);
    if (llb_arg_nargs(op, nargs, 5, sig)) return NULL;
    long n, d;
    size_t nd;
    if (llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[4], op, "d", 1, MAX_DIM, &d) ||
        llb_arg_product(op, &nd, n, d, 1, 1))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *x = llb_arg_buf(&h, args[0], op, na, 0, LLB_ELEM_F32, nd, 0);
    const float *w = x ? llb_arg_buf(&h, args[1], op, nb, 0, LLB_ELEM_F32, b_rows ? nd : (size_t)d, 0) : NULL;
    float *out = w ? llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_F32, nd, 0) : NULL;
    if (!out) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct altup_args a = {.kind = kind, .a = x, .b = w, .out = out, .n = n, .d = d};
    return llb_bufs_call_out_apart(&h, op, 1, run_altup, NULL, &a, sizeof a);   /* out may be an input, whole */
}
static PyObject *py_mul_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return rows_op("mul_rows", "x", "w", 0, 0, args, nargs);
}
static PyObject *py_rms_match(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return rows_op("rms_match", "y", "target", 2, 1, args, nargs);
}

/* gaussian_topk(x, n, d, mult): in place, relu(x - (mean + std * mult)) per row. */
static PyObject *py_gaussian_topk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "gaussian_topk";
    if (llb_arg_nargs(op, nargs, 4, "x, n, d, mult")) return NULL;
    long n, d;
    size_t nd;
    float mult;
    if (llb_arg_long(args[1], op, "n", 1, MAX_DIM, &n) || llb_arg_long(args[2], op, "d", 2, MAX_DIM, &d) ||
        llb_arg_product(op, &nd, n, d, 1, 1) || llb_arg_float(args[3], op, "mult", -1e30, &mult))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    float *x = llb_arg_buf(&h, args[0], op, "x", 1, LLB_ELEM_F32, nd, 0);
    if (!x) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct altup_args a = {.kind = 1, .out = x, .n = n, .d = d, .s = mult};
    return llb_bufs_call(&h, op, run_altup, NULL, &a, sizeof a);
}

#define ALTUP_MAX_STREAMS 16

/* altup_predict(x, coef, out, streams, n, d) (kind 3: coef n A A values, out not overlapping x) and
 * altup_correct(pred, coef, active, idx, out, streams, n, d) (kind 4: coef n A values, out pred or apart
 * from it, and apart from active). */
static int overlaps(const float *a, size_t na, const float *b, size_t nb) {
    return a < b + nb && b < a + na;
}

static PyObject *altup_op(const char *op, int kind, PyObject *const *args, Py_ssize_t nargs) {
    int correct = kind == 4;
    if (llb_arg_nargs(op, nargs, correct ? 8 : 6, correct ? "pred, coef, active, idx, out, streams, n, d" :
                      "x, coef, out, streams, n, d"))
        return NULL;
    PyObject *const *dims = args + (correct ? 5 : 3);
    long A, n, d, idx = 0;
    size_t all, nc, nd;
    if (llb_arg_long(dims[0], op, "streams", 1, ALTUP_MAX_STREAMS, &A) || llb_arg_long(dims[1], op, "n", 1, MAX_DIM, &n) ||
        llb_arg_long(dims[2], op, "d", 1, MAX_DIM, &d) || (correct && llb_arg_long(args[3], op, "idx", 0, A - 1, &idx)) ||
        llb_arg_product(op, &all, A, n, d, 1) || llb_arg_product(op, &nc, n, A, correct ? 1 : A, 1) ||
        llb_arg_product(op, &nd, n, d, 1, 1))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    const float *x = llb_arg_buf(&h, args[0], op, correct ? "pred" : "x", 0, LLB_ELEM_F32, all, 0);
    const float *c = x ? llb_arg_buf(&h, args[1], op, "coef", 0, LLB_ELEM_F32, nc, 0) : NULL;
    const float *act = c && correct ? llb_arg_buf(&h, args[2], op, "active", 0, LLB_ELEM_F32, nd, 0) : NULL;
    float *out = c && (act || !correct) ? llb_arg_buf(&h, args[correct ? 4 : 2], op, "out", 1, LLB_ELEM_F32, all, 0)
                                        : NULL;
    const char *bad = !out ? NULL : (!correct || out != x) && overlaps(out, all, x, all) ? "out overlaps its input"
                      : correct && overlaps(out, all, act, nd) ? "out overlaps active"
                      : overlaps(out, all, c, nc) ? "out overlaps coef" : NULL;
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: %s", op, bad);
        out = NULL;
    }
    if (!out) {
        llb_bufs_release(&h);
        return NULL;
    }
    const struct altup_args a = {.kind = kind, .a = x, .b = c, .c = act, .out = out, .streams = A, .n = n, .d = d,
                                 .idx = idx};
    return llb_bufs_call(&h, op, run_altup, NULL, &a, sizeof a);
}
static PyObject *py_altup_predict(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return altup_op("altup_predict", 3, args, nargs);
}
static PyObject *py_altup_correct(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return altup_op("altup_correct", 4, args, nargs);
}

/* ids_below(ids, limit, out, n): out[i] = ids[i] if 0 <= ids[i] < limit, else 0 (int32). */
static PyObject *py_ids_below(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *op = "ids_below";
    if (llb_arg_nargs(op, nargs, 4, "ids, limit, out, n")) return NULL;
    long n, limit;
    if (llb_arg_long(args[1], op, "limit", 1, INT32_MAX, &limit) || llb_arg_long(args[3], op, "n", 1, MAX_DIM, &n))
        return NULL;
    struct llb_bufs h = OPS_BUFS;
    const int32_t *ids = llb_arg_buf(&h, args[0], op, "ids", 0, LLB_ELEM_I32, n, 0);
    int32_t *out = ids ? llb_arg_buf(&h, args[2], op, "out", 1, LLB_ELEM_I32, n, 0) : NULL;
    if (out) {     /* (out may be ids: each id is read before it is written) */
        const struct altup_args a = {.kind = 5, .ids = ids, .iout = out, .n = n, .idx = limit};
        return llb_bufs_call(&h, op, run_altup, NULL, &a, sizeof a);
    }
    llb_bufs_release(&h);
    return NULL;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef llb_ops_methods[] = {
    {"rmsnorm", FASTCALL(py_rmsnorm), "rmsnorm(x, w, out, n, d, eps): out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w."},
    {"rope", FASTCALL(py_rope),
     "rope(x, pos, inv_freq, n, n_heads, head_dim, rope_dim, neox): rotary embedding in place on x (n, n_heads, head_dim)."},
    {"kv_store", FASTCALL(py_kv_store),
     "kv_store(k, v, kcache, vcache, slots, pos, n, n_kv, head_dim, n_slots, n_ctx, cache_type): "
     "write token i's k/v to cache[slots[i], pos[i]] (cache_type 0 = f32, 1 = f16); kcache is vcache or\n"
     "overlaps it nowhere, and no input overlaps either."},
    {"attention_sinks", FASTCALL(py_attention_sinks),
     "attention_sinks(attention's 16 arguments, sinks): after attention, rescale out as if each head h's softmax\n"
     "had one more column of logit sinks[h] and no value (out must not alias q, whose scores it recomputes)."},
    {"attention", FASTCALL(py_attention),
     "attention(q, kcache, vcache, out, slots, pos, n, n_heads, n_kv, head_dim, n_slots, n_ctx, cache_type, scale, "
     "window, softcap[, kbase[, kend]]): causal GQA attention over the KV cache; kend (n int32, or None): row i\n"
     "sees keys up to kend[i] - 1 (> pos[i]); out may be q, and overlaps nothing else."},
    {"short_conv", FASTCALL(py_short_conv),
     "short_conv(bcx, state, state_pos, kernel, slots, pos, out, n, d, width, n_slots, gated): a causal depthwise\n"
     "convolution over each slot's state: gated, LFM2's out = C * conv(B * x); else out = silu(conv(x)) (the state\n"
     "shifted; position 0 restarts it); bias (d floats, or None), ungated only, is added before the SiLU."},
    {"ssm_scan", FASTCALL(py_ssm_scan),
     "ssm_scan(xbc, dt, z, state, state_pos, a_neg, dt_bias, d_skip, norm_w, slots, pos, out, n, groups, heads,\n"
     "dstate, dhead, n_slots, eps): Mamba2's selective scan over each slot's (heads, dstate, dhead) state, then its\n"
     "gated group RMSNorm (norm_w None: none)."},
    {"ssm_scan1", FASTCALL(py_ssm_scan1),
     "ssm_scan1(x, dt, b, c, z, state, state_pos, a_neg, dt_bias, d_skip, slots, pos, out, n, d_inner, dstate,\n"
     "n_slots): Mamba 1's selective scan over each slot's (d_inner, dstate) state, its D skip and silu(z) gate."},
    {"gated_delta", FASTCALL(py_gated_delta),
     "gated_delta(qkv, ba, z, state, state_pos, a_neg, dt_bias, norm_w, slots, pos, out, n, hk, hv, dk, dv, n_slots,\n"
     "eps): Qwen3-Next's gated delta rule over each slot's (hv, dk, dv) state, then its gated RMSNorm."},
    {"sigmoid_mul", FASTCALL(py_sigmoid_mul), "sigmoid_mul(x, gate, out, count): out = x * sigmoid(gate)."},
    {"silu_mul", FASTCALL(py_silu_mul), "silu_mul(gate, up, out, count): out = gate * sigmoid(gate) * up."},
    {"gelu_mul", FASTCALL(py_gelu_mul), "gelu_mul(gate, up, out, count): out = gelu_tanh(gate) * up."},
    {"add", FASTCALL(py_add), "add(a, b, out, count): out = a + b (out may alias a or b)."},
    {"add_rows", FASTCALL(py_add_rows), "add_rows(x, bias, out, n, d): out[i] = x[i] + bias."},
    {"scale", FASTCALL(py_scale), "scale(x, s, count): x *= s in place."},
    {"pos_scale", FASTCALL(py_pos_scale),
     "pos_scale(x, pos, n, width, beta, length): row i of x (n, width) times (float)(1 + beta log1p(floor(pos[i] /\n"
     "length))) in place, the factor computed in double (rows of band 0 untouched); pos int32 >= 0."},
    {"gelu_erf", FASTCALL(py_gelu_erf), "gelu_erf(x, count): x = 0.5 x (1 + erf(x / sqrt 2)) in place (BERT's GELU)."},
    {"softcap", FASTCALL(py_softcap), "softcap(x, cap, count): x = cap * tanh(x / cap) in place."},
    {"xielu", FASTCALL(py_xielu), "xielu(x, count, alpha_p, alpha_n, beta, eps): in place, x > 0: alpha_p x^2 + beta x, "
     "else (expm1(min(x, eps)) - x) alpha_n + beta x (0 + beta x when alpha_n is 0: ReLU^2 is 1, 0, 0, 0); "
     "an infinite x gives the formula's limit (ReLU^2: +inf and 0), a NaN stays NaN."},
    {"copy_blocks", FASTCALL(py_copy_blocks),
     "copy_blocks(src, dst, n, groups, width, src_row, src_group, src_off, dst_row, dst_group, dst_off): for t < n,\n"
     "g < groups: dst[t dst_row + g dst_group + dst_off:][:width] = src[t src_row + g src_group + src_off:][:width]\n"
     "(float32, in elements; src_group 0 repeats one block; src and dst must not overlap)."},
    /* Gemma 3n (ops/altup.c; the formulas in ops.h): two entries a line */
    {"mul_rows", FASTCALL(py_mul_rows), "mul_rows(x, w, out, n, d)."}, {"rms_match", FASTCALL(py_rms_match),
     "rms_match(y, target, out, n, d)."}, {"gaussian_topk", FASTCALL(py_gaussian_topk), "gaussian_topk(x, n, d, mult)."},
    {"altup_predict", FASTCALL(py_altup_predict), "altup_predict(x, coef, out, streams, n, d)."},
    {"altup_correct", FASTCALL(py_altup_correct), "altup_correct(pred, coef, active, idx, out, streams, n, d)."},
    {"ids_below", FASTCALL(py_ids_below), "ids_below(ids, limit, out, n): ids[i] < limit ? ids[i] : 0."},
    {NULL, NULL, 0, NULL},
};

/* Op drivers for the elementwise, norm, RoPE and KV-cache ops: pick the ISA's
 * kernels, split the work over the thread pool (attention: ops/attention.c).
 *
 * Thresholds below are in elements and mark
 * where splitting beats the ~0.5 us fork/join of the pool on this machine;
 * smaller calls run on the calling thread alone. */
#define _GNU_SOURCE
#include "ops/ops.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/fp16.h"
#include "core/isa.h"
#include "core/state.h"
#include "ops/kernels/kernels.h"
#include "core/threadpool.h"

#define PAR_MIN_CHEAP 32768    /* add, scale, add_rows, kv_store: memory-bound */
#define PAR_MIN_TRANSC 4096    /* silu_mul, gelu_mul, softcap: an exp per element */
#define PAR_MIN_RMSNORM 16384
#define PAR_MIN_ROPE_ANGLES 256 /* tokens * rope_dim/2: each needs a cos and a sin */
#define SPLIT_ALIGN 64          /* chunk boundaries on whole cache lines */
/* Chunks an op is cut into (from its size, never the thread count): enough that a
 * thread that is descheduled holds little of the op while the others take the rest. */
#define OP_CHUNKS 16

const struct llb_op_kernels *llb_op_kernels_current(void) {
    return LLB_PER_ISA(&llb_ops_scalar, &llb_ops_avx2, &llb_ops_avx512);
}

/* ---- elementwise ---------------------------------------------------------- */

enum ew_op { EW_SILU, EW_GELU, EW_ADD, EW_SCALE, EW_SOFTCAP, EW_GELU_ERF };

struct ew_task {
    const struct llb_op_kernels *k;
    enum ew_op op;
    const float *a, *b;
    float *out;
    float s;
    long count;
};

static void ew_range(const struct ew_task *t, long i, long m) {
    switch (t->op) {
    case EW_SILU: t->k->silu_mul(t->a + i, t->b + i, t->out + i, m); break;
    case EW_GELU: t->k->gelu_mul(t->a + i, t->b + i, t->out + i, m); break;
    case EW_ADD: t->k->add(t->a + i, t->b + i, t->out + i, m); break;
    case EW_SCALE: t->k->scale(t->out + i, t->s, m); break;
    case EW_SOFTCAP: t->k->softcap(t->out + i, t->s, m); break;
    case EW_GELU_ERF: t->k->gelu_erf(t->out + i, m); break;
    }
}

static void ew_task_run(void *ctx, long b, long e, int tid) {
    (void)tid;
    ew_range(ctx, b, e - b);
}

static void ew_dispatch(struct ew_task *t, long threshold) {
    t->k = llb_op_kernels_current();
    if (t->count < threshold || llb_pool_threads() == 1) ew_range(t, 0, t->count);
    else llb_parallel_for(ew_task_run, t, t->count, llb_grain(t->count, OP_CHUNKS, threshold / 2, SPLIT_ALIGN), LLB_POOL_MAX_THREADS);
}

void llb_silu_mul(const float *gate, const float *up, float *out, long count) {
    struct ew_task t = {.op = EW_SILU, .a = gate, .b = up, .out = out, .count = count};
    ew_dispatch(&t, PAR_MIN_TRANSC);
}
void llb_silu_mul_here(const float *gate, const float *up, float *out, long count) {
    struct ew_task t = {.op = EW_SILU, .a = gate, .b = up, .out = out, .count = count, .k = llb_op_kernels_current()};
    ew_range(&t, 0, count);
}
void llb_gelu_mul(const float *gate, const float *up, float *out, long count) {
    struct ew_task t = {.op = EW_GELU, .a = gate, .b = up, .out = out, .count = count};
    ew_dispatch(&t, PAR_MIN_TRANSC);
}
void llb_add(const float *a, const float *b, float *out, long count) {
    struct ew_task t = {.op = EW_ADD, .a = a, .b = b, .out = out, .count = count};
    ew_dispatch(&t, PAR_MIN_CHEAP);
}
void llb_scale(float *x, float s, long count) {
    struct ew_task t = {.op = EW_SCALE, .out = x, .s = s, .count = count};
    ew_dispatch(&t, PAR_MIN_CHEAP);
}
void llb_gelu_erf(float *x, long count) {
    struct ew_task t = {.op = EW_GELU_ERF, .out = x, .count = count};
    ew_dispatch(&t, PAR_MIN_TRANSC);
}
void llb_softcap(float *x, float cap, long count) {
    struct ew_task t = {.op = EW_SOFTCAP, .out = x, .s = cap, .count = count};
    ew_dispatch(&t, PAR_MIN_TRANSC);
}

/* xIELU (and ReLU^2 as its special case): scalar; the expm1 only on the negative side, and not at all when an
 * is 0 (ReLU^2: its negative side is 0 whatever x, not 0 * (expm1 - x) for a -inf) */
struct xielu_task {
    float *x;
    float ap, an, beta, eps;
};

/* The sign of c as +-inf, or `zero` when c is 0 */
static float signed_inf(float c, float zero) {
    return c > 0.f ? INFINITY : c < 0.f ? -INFINITY : zero;
}

/* xIELU at an infinite x, the formula's limit (its terms would give 0 * inf or inf - inf, a NaN): at +inf ap x^2
 * dominates (beta x when ap is 0; 0 when both are); at -inf the formula is -an + (beta - an) x. ReLU^2 (1, 0, 0)
 * gives +inf and 0. */
static float xielu_at_inf(const struct xielu_task *t, float x) {
    if (x > 0.f) return signed_inf(t->ap != 0.f ? t->ap : t->beta, 0.f);
    return signed_inf(t->an - t->beta, -t->an);
}

static void xielu_range(const struct xielu_task *t, long i0, long i1) {
    for (long i = i0; i < i1; i++) {
        const float x = t->x[i];
        if (isinf(x)) t->x[i] = xielu_at_inf(t, x);
        else if (x > 0.f) t->x[i] = t->ap * x * x + t->beta * x;
        else t->x[i] = (t->an != 0.f ? (expm1f(fminf(x, t->eps)) - x) * t->an : 0.f) + t->beta * x;
    }
}

static void xielu_task_run(void *ctx, long b, long e, int tid) {
    (void)tid;
    xielu_range(ctx, b, e);
}

void llb_xielu(float *x, long count, float ap, float an, float beta, float eps) {
    struct xielu_task t = {x, ap, an, beta, eps};
    if (count < PAR_MIN_TRANSC || llb_pool_threads() == 1) xielu_range(&t, 0, count);
    else llb_parallel_for(xielu_task_run, &t, count, llb_grain(count, OP_CHUNKS, PAR_MIN_TRANSC / 2, SPLIT_ALIGN),
                          LLB_POOL_MAX_THREADS);
}

/* ---- row ops: rmsnorm, add_rows ------------------------------------------- */

struct rows_task {
    const struct llb_op_kernels *k;
    const float *x, *w;
    float *out;
    long n, d;
    float eps;
    int is_norm;
};

static void rows_range(const struct rows_task *t, long r0, long r1) {
    if (t->is_norm) {
        t->k->rmsnorm_rows(t->x + r0 * t->d, t->w, t->out + r0 * t->d, r1 - r0, t->d, t->eps);
    } else {
        for (long r = r0; r < r1; r++) t->k->add(t->x + r * t->d, t->w, t->out + r * t->d, t->d);
    }
}

static void rows_task_run(void *ctx, long b, long e, int tid) {
    (void)tid;
    rows_range(ctx, b, e);
}

static void rows_dispatch(struct rows_task *t, long threshold) {
    t->k = llb_op_kernels_current();
    if (t->n < 2 || t->n * t->d < threshold || llb_pool_threads() == 1) rows_range(t, 0, t->n);
    else llb_parallel_for(rows_task_run, t, t->n, llb_grain(t->n, OP_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
}

void llb_rmsnorm(const float *x, const float *w, float *out, long n, long d, float eps) {
    struct rows_task t = {.x = x, .w = w, .out = out, .n = n, .d = d, .eps = eps, .is_norm = 1};
    rows_dispatch(&t, PAR_MIN_RMSNORM);
}

void llb_add_rows(const float *x, const float *bias, float *out, long n, long d) {
    struct rows_task t = {.x = x, .w = bias, .out = out, .n = n, .d = d};
    rows_dispatch(&t, PAR_MIN_CHEAP);
}

/* ---- rope ----------------------------------------------------------------- */

static void rope_tokens(const struct llb_rope_args *t, long t0, long t1) {
    const long half = t->rope_dim / 2;
    float cs[LLB_ROPE_MAX_DIM / 2], sn[LLB_ROPE_MAX_DIM / 2];
    for (long tok = t0; tok < t1; tok++) {
        const float p = (float)t->pos[tok];
        for (long i = 0; i < half; i++) {
            const float angle = p * t->inv_freq[i]; /* float32 product, as HF and the NumPy reference */
            cs[i] = cosf(angle); /* glibc: < 1 ulp, with exact range reduction; fused into one sincosf */
            sn[i] = sinf(angle);
        }
        for (long h = 0; h < t->n_heads; h++) {
            float *xh = t->x + (tok * t->n_heads + h) * t->head_dim;
            if (t->neox) {
                for (long i = 0; i < half; i++) {
                    const float a = xh[i], b = xh[i + half];
                    xh[i] = a * cs[i] - b * sn[i];
                    xh[i + half] = a * sn[i] + b * cs[i];
                }
            } else {
                for (long i = 0; i < half; i++) {
                    const float a = xh[2 * i], b = xh[2 * i + 1];
                    xh[2 * i] = a * cs[i] - b * sn[i];
                    xh[2 * i + 1] = a * sn[i] + b * cs[i];
                }
            }
        }
    }
}

static void rope_task_run(void *ctx, long b, long e, int tid) {
    (void)tid;
    rope_tokens(ctx, b, e);
}

void llb_rope(const struct llb_rope_args *a) {
    if (a->n < 2 || a->n * (a->rope_dim / 2) < PAR_MIN_ROPE_ANGLES || llb_pool_threads() == 1) rope_tokens(a, 0, a->n);
    else llb_parallel_for(rope_task_run, (void *)a, a->n, llb_grain(a->n, OP_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
}

/* ---- kv cache ------------------------------------------------------------- */

struct kv_task {
    const struct llb_op_kernels *k;
    const float *kin, *vin;
    void *kcache, *vcache;
    const int32_t *slots, *pos;
    long n, row, n_slots, n_ctx, n_kv, head_dim;
    int cache_type;
    float *kbase;
};

/* n values (a multiple of 32) as Q8_0 blocks: scale amax / 127 (rounded to f16 when stored), codes
 * round(x / scale) with halves away from zero, as the NumPy quantizer (formats/quants.py).
 *
 * With a base (keys: their slot's keys at position 0), a block whose difference from the base has a
 * smaller amax is stored as that difference instead, flagged by the scale's sign bit (a scale is
 * never negative) and read back as base + difference. Some models' keys carry a few huge channels
 * (Qwen2.5's reach 145 where most are below 2: the k_proj bias, which rope barely turns in the
 * low-frequency dims); a block holding one rounds the small channels beside it to 0, and the
 * attention sink (position 0) is read wrong: plain Q8_0 moved Qwen2.5-Coder-0.5B's top-20 logits
 * by 10. Those channels are nearly the same at every position, so their differences quantize
 * finely, and position 0 itself is stored exactly. Blocks without such channels are better plain
 * (a difference can span twice the range): always subtracting took SmolLM2's error from 0.57 to 0.70. */
static void q8_0_row(const float *x, const float *base, uint8_t *dst, long n) {
    float dv[LLB_Q8_0_BLOCK];
    for (long b = 0; b < n; b += LLB_Q8_0_BLOCK, dst += LLB_Q8_0_BYTES) {
        float amax = 0.f, amax_d = INFINITY;
        for (int i = 0; i < LLB_Q8_0_BLOCK; i++) amax = fabsf(x[b + i]) > amax ? fabsf(x[b + i]) : amax;
        if (base) {
            amax_d = 0.f;
            for (int i = 0; i < LLB_Q8_0_BLOCK; i++) {
                dv[i] = x[b + i] - base[b + i];
                amax_d = fabsf(dv[i]) > amax_d ? fabsf(dv[i]) : amax_d;
            }
        }
        const int rel = amax_d < amax;
        const float *v = rel ? dv : x + b;
        const float d = (rel ? amax_d : amax) / 127.f, id = d != 0.f ? 1.f / d : 0.f;
        const uint16_t h = (uint16_t)(llb_f32_to_f16(d) | (rel ? 0x8000 : 0));
        dst[0] = (uint8_t)(h & 0xFF);
        dst[1] = (uint8_t)(h >> 8);
        for (int i = 0; i < LLB_Q8_0_BLOCK; i++) dst[2 + i] = (uint8_t)(int8_t)roundf(v[i] * id);
    }
}

static void kv_tokens(const struct kv_task *t, long t0, long t1) {
    const int keys_only = t->kcache == t->vcache; /* values read from the keys' rows: one write */
    for (long i = t0; i < t1; i++) {
        const long s = t->slots[i], p = t->pos[i];
        if (s < 0 || s >= t->n_slots || p < 0 || p >= t->n_ctx) continue; /* validated by the caller; never write outside */
        const long hd = t->head_dim;
        for (long h = 0; h < t->n_kv; h++) { /* each kv head's row to its run (llb_kv_elem) */
            const size_t dst = llb_kv_elem(t->n_kv, t->n_ctx, hd, s, h, p);
            const float *ksrc = t->kin + i * t->row + h * hd, *vsrc = t->vin + i * t->row + h * hd;
            if (t->cache_type == LLB_CACHE_Q8_0) { /* head_dim a multiple of the block: the same blocks as a whole row's */
                const float *base = t->kbase ? t->kbase + (size_t)s * (size_t)t->row + h * hd : NULL;
                q8_0_row(ksrc, base, (uint8_t *)llb_cache_at(t->kcache, dst, LLB_CACHE_Q8_0), hd);
                if (!keys_only) q8_0_row(vsrc, NULL, (uint8_t *)llb_cache_at(t->vcache, dst, LLB_CACHE_Q8_0), hd);
            } else if (t->cache_type == LLB_CACHE_F16) {
                t->k->f32_to_f16(ksrc, (uint16_t *)t->kcache + dst, hd);
                if (!keys_only) t->k->f32_to_f16(vsrc, (uint16_t *)t->vcache + dst, hd);
            } else {
                memcpy((float *)t->kcache + dst, ksrc, (size_t)hd * sizeof(float));
                if (!keys_only) memcpy((float *)t->vcache + dst, vsrc, (size_t)hd * sizeof(float));
            }
        }
    }
}

static void kv_task_run(void *ctx, long b, long e, int tid) {
    (void)tid;
    kv_tokens(ctx, b, e);
}

void llb_kv_store(const struct llb_kv_store_args *a) {
    if (a->cache_type == LLB_CACHE_Q8_0 && a->head_dim % LLB_Q8_0_BLOCK) return; /* the binding refuses it */
    struct kv_task t = {llb_op_kernels_current(), a->k, a->v, a->kcache, a->vcache, a->slots, a->pos, a->n,
                        a->n_kv * a->head_dim, a->n_slots, a->n_ctx, a->n_kv, a->head_dim, a->cache_type,
                        a->cache_type == LLB_CACHE_Q8_0 ? a->kbase : NULL};
    /* Bases first: a position 0 in this call sets its slot's base before any key of the slot is stored. */
    for (long i = 0; t.kbase && i < t.n; i++)
        if (t.pos[i] == 0 && t.slots[i] >= 0 && t.slots[i] < t.n_slots)
            memcpy(t.kbase + (size_t)t.slots[i] * (size_t)t.row, t.kin + i * t.row, (size_t)t.row * sizeof(float));
    if (t.n < 2 || 2 * t.n * t.row < PAR_MIN_CHEAP || llb_pool_threads() == 1) kv_tokens(&t, 0, t.n);
    else llb_parallel_for(kv_task_run, &t, t.n, llb_grain(t.n, OP_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
}

/* ---- copy_blocks ---------------------------------------------------------- */

void llb_copy_blocks(const float *src, float *dst, long n, long groups, long width, long src_row, long src_group,
                     long src_off, long dst_row, long dst_group, long dst_off) {
    /* a few values per token and group (a head's part): one thread, the copies are cheap beside the matmuls */
    for (long t = 0; t < n; t++)
        for (long g = 0; g < groups; g++)
            memcpy(dst + (size_t)t * dst_row + (size_t)g * dst_group + dst_off,
                   src + (size_t)t * src_row + (size_t)g * src_group + src_off, (size_t)width * sizeof(float));
}

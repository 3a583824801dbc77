/* The encoder's ops (ops/encoder.h). Their loops are plain C written so the compiler vectorizes
 * them without reassociating a sum (each lane its own output), compiled once per ISA through
 * target-attributed copies; llb_isa_current picks one per call. */
#include "ops/encoder.h"

#include <math.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"

#define AI __attribute__((always_inline)) inline

/* ---- layernorm -------------------------------------------------------------- */

typedef struct {
    const float *x, *r, *w, *b;
    float *out;
    long d;
    float eps;
} ln_ctx;

/* The sum of v[0..d) in LANES partial sums, then those in order: the same on every ISA, and each
 * lane a vector lane for the compiler (no reassociation needed). */
#define LANES 16
static AI float lanes_total(const float part[LANES]) {
    float s = 0;
    for (int j = 0; j < LANES; j++) s += part[j];
    return s;
}

static AI float lane_sum(const float *v, long d) {
    float part[LANES] = {0};
    long k = 0;
    for (; k + LANES <= d; k += LANES)
        for (int j = 0; j < LANES; j++) part[j] += v[k + j];
    for (; k < d; k++) part[k % LANES] += v[k];
    return lanes_total(part);
}

/* sum of (v - mu)^2 */
static AI float lane_sq(const float *v, long d, float mu) {
    float part[LANES] = {0};
    long k = 0;
    for (; k + LANES <= d; k += LANES)
        for (int j = 0; j < LANES; j++) part[j] += (v[k + j] - mu) * (v[k + j] - mu);
    for (; k < d; k++) part[k % LANES] += (v[k] - mu) * (v[k] - mu);
    return lanes_total(part);
}

static AI void ln_rows(const ln_ctx *c, long i0, long i1) {
    const long d = c->d;
    for (long i = i0; i < i1; i++) {
        const float *x = c->x + (size_t)i * d, *r = c->r ? c->r + (size_t)i * d : NULL;
        float *o = c->out + (size_t)i * d;
        if (r)
            for (long k = 0; k < d; k++) o[k] = x[k] + r[k];
        else if (o != x)
            for (long k = 0; k < d; k++) o[k] = x[k];
        const float mu = lane_sum(o, d) / (float)d;
        const float var = lane_sq(o, d, mu);
        const float inv = 1.0f / sqrtf(var / (float)d + c->eps);
        for (long k = 0; k < d; k++) o[k] = (o[k] - mu) * inv * c->w[k] + c->b[k];
    }
}

static void ln_scalar(void *ctx, long i0, long i1, int tid) { (void)tid; ln_rows(ctx, i0, i1); }
#if LLB_X86
LLB_TARGET_AVX2 static void ln_avx2(void *ctx, long i0, long i1, int tid) { (void)tid; ln_rows(ctx, i0, i1); }
LLB_TARGET_AVX512 static void ln_avx512(void *ctx, long i0, long i1, int tid) { (void)tid; ln_rows(ctx, i0, i1); }
#endif

void llb_add_layernorm(const float *x, const float *r, const float *w, const float *b, float *out, long n, long d,
                       float eps) {
    ln_ctx c = {x, r, w, b, out, d, eps};
    const llb_range_fn fn = LLB_PER_ISA(ln_scalar, ln_avx2, ln_avx512);
    if (n * d < 65536 || llb_pool_threads() < 2) fn(&c, 0, n, 0);
    else llb_parallel_for(fn, &c, n, llb_grain(n, 16, 8, 1), llb_pool_threads());
}

/* ---- attention within each sequence -------------------------------------- */

typedef struct {
    const float *qkv;
    const int32_t *starts;
    long n_seqs, n_heads, head_dim, max_len;
    float scale;
    float *out;
    float *scratch; /* per thread: kt (head_dim x max_len) and scores (max_len) */
} att_ctx;

/* e^x for x <= 0 (softmax's shifted scores) in plain arithmetic the compiler vectorizes: x = n ln 2 + r,
 * |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (relative error < 1e-8 before rounding), 2^n
 * from the exponent bits; below -87 it is 0 (e^-87 is under float's normal range). */
static AI float exp_neg(float x) {
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float c = x < -87.0f ? -87.0f : x;
    const float n = (c * 1.44269504088896341f + big) - big;
    const float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &e, 4);
    return x < -87.0f ? 0.0f : p * scale;
}

/* Unit u = (sequence u / n_heads, head u % n_heads). K is transposed once per unit (keys padded with
 * zeros to a multiple of 16) so the scores of one query are a sum over dims of (q_d x row d of K^T):
 * a vector over keys, whole vectors, no reduction. */
static AI void att_units(const att_ctx *c, long u0, long u1, int tid) {
    const long hd = c->head_dim, H = c->n_heads * hd, ld = 3 * H, L = (c->max_len + 15) & ~15L;
    float *kt = c->scratch + (size_t)tid * (size_t)(hd + 1) * L, *s = kt + (size_t)hd * L;
    for (long u = u0; u < u1; u++) {
        const long seq = u / c->n_heads, h = u % c->n_heads;
        const long t0 = c->starts[seq], t = c->starts[seq + 1] - t0, tp = (t + 15) & ~15L;
        const float *base = c->qkv + (size_t)t0 * ld;
        for (long d = 0; d < hd; d++) {
            float *kr = kt + d * tp;
            for (long j = 0; j < t; j++) kr[j] = base[j * ld + H + h * hd + d];
            for (long j = t; j < tp; j++) kr[j] = 0;
        }
        for (long i = 0; i < t; i++) {
            const float *restrict q = base + i * ld + h * hd;
            float *restrict sc = s;
            for (long jb = 0; jb < tp; jb += 16) {
                float a16[16] = {0};
                for (long d = 0; d < hd; d++) {
                    const float qd = q[d] * c->scale;
                    const float *restrict kr = kt + d * tp + jb;
                    for (int jj = 0; jj < 16; jj++) a16[jj] += qd * kr[jj];
                }
                for (int jj = 0; jj < 16; jj++) sc[jb + jj] = a16[jj];
            }
            float m = -INFINITY;
            for (long j = 0; j < t; j++) m = sc[j] > m ? sc[j] : m;
            for (long jb = 0; jb < tp; jb += 16)
                for (int jj = 0; jj < 16; jj++) sc[jb + jj] = jb + jj < t ? exp_neg(sc[jb + jj] - m) : 0.0f;
            float z = 0;
            for (long j = 0; j < t; j++) z += sc[j];
            const float iz = 1.0f / z;
            float *restrict o = c->out + (size_t)(t0 + i) * H + h * hd;
            long db = 0;
            for (; db + 16 <= hd; db += 16) {
                float a16[16] = {0};
                for (long j = 0; j < t; j++) {
                    const float p = sc[j];
                    const float *restrict v = base + j * ld + 2 * H + h * hd + db;
                    for (int dd = 0; dd < 16; dd++) a16[dd] += p * v[dd];
                }
                for (int dd = 0; dd < 16; dd++) o[db + dd] = a16[dd] * iz;
            }
            for (; db < hd; db++) {
                float acc = 0;
                for (long j = 0; j < t; j++) acc += sc[j] * base[j * ld + 2 * H + h * hd + db];
                o[db] = acc * iz;
            }
        }
    }
}

static void att_scalar(void *ctx, long u0, long u1, int tid) { att_units(ctx, u0, u1, tid); }
#if LLB_X86
LLB_TARGET_AVX2 static void att_avx2(void *ctx, long u0, long u1, int tid) { att_units(ctx, u0, u1, tid); }
LLB_TARGET_AVX512 static void att_avx512(void *ctx, long u0, long u1, int tid) { att_units(ctx, u0, u1, tid); }
#endif

int llb_encoder_attention(const float *qkv, const int32_t *starts, long n_seqs, long n_heads, long head_dim,
                          float scale, float *out) {
    long max_len = 1;
    for (long s = 0; s < n_seqs; s++)
        if (starts[s + 1] - starts[s] > max_len) max_len = starts[s + 1] - starts[s];
    const int nth = llb_pool_threads();
    const size_t lp = (size_t)(max_len + 15) & ~(size_t)15;
    float *scratch = llb_scratch((size_t)nth * (size_t)(head_dim + 1) * lp * sizeof(float));
    if (!scratch) return -1;
    att_ctx c = {qkv, starts, n_seqs, n_heads, head_dim, max_len, scale, out, scratch};
    const llb_range_fn fn = LLB_PER_ISA(att_scalar, att_avx2, att_avx512);
    const long units = n_seqs * n_heads;
    if (nth < 2 || starts[n_seqs] * n_heads * max_len * head_dim < 65536) fn(&c, 0, units, 0);
    else llb_parallel_for(fn, &c, units, llb_grain(units, 32, 1, 1), nth);
    return 0;
}

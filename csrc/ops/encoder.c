/* The encoder's ops (ops/encoder.h). Their loops are plain C written so the compiler vectorizes
 * them without reassociating a sum (each lane its own output), compiled once per ISA through
 * target-attributed copies; llb_isa_current picks one per call. */
#include "ops/encoder.h"

#include <math.h>
#include <stddef.h>

#include "core/alloc.h"
#include "core/expneg.h"
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

/* The largest of v[0..d) (exact in any order: a max rounds nothing), in LANES partial maxima. */
static AI float lane_max(const float *v, long d) {
    float part[LANES];
    for (int j = 0; j < LANES; j++) part[j] = -INFINITY;
    long k = 0;
    for (; k + LANES <= d; k += LANES)
        for (int j = 0; j < LANES; j++) part[j] = v[k + j] > part[j] ? v[k + j] : part[j];
    for (; k < d; k++) part[k % LANES] = v[k] > part[k % LANES] ? v[k] : part[k % LANES];
    float m = part[0];
    for (int j = 1; j < LANES; j++) m = part[j] > m ? part[j] : m;
    return m;
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

/* ---- rotation of q and k by per-row angle tables ---------------------------- */

typedef struct {
    float *qkv;
    const float *cos, *sin;
    long n_heads, head_dim;
} rot_ctx;

static AI void rot_rows(const rot_ctx *c, long i0, long i1) {
    const long half = c->head_dim / 2, width = c->n_heads * c->head_dim;
    for (long i = i0; i < i1; i++) {
        const float *co = c->cos + (size_t)i * half, *si = c->sin + (size_t)i * half;
        float *row = c->qkv + (size_t)i * 3 * width;
        for (long h = 0; h < 2 * c->n_heads; h++) {       /* q's heads, then k's */
            float *x = row + h * c->head_dim;
            for (long j = 0; j < half; j++) {
                const float a = x[j], b = x[j + half];
                x[j] = a * co[j] - b * si[j];
                x[j + half] = b * co[j] + a * si[j];
            }
        }
    }
}

static void rot_scalar(void *ctx, long i0, long i1, int tid) { (void)tid; rot_rows(ctx, i0, i1); }
#if LLB_X86
LLB_TARGET_AVX2 static void rot_avx2(void *ctx, long i0, long i1, int tid) { (void)tid; rot_rows(ctx, i0, i1); }
LLB_TARGET_AVX512 static void rot_avx512(void *ctx, long i0, long i1, int tid) { (void)tid; rot_rows(ctx, i0, i1); }
#endif

void llb_encoder_rotate(float *qkv, const float *cos, const float *sin, long n, long n_heads, long head_dim) {
    rot_ctx c = {qkv, cos, sin, n_heads, head_dim};
    const llb_range_fn fn = LLB_PER_ISA(rot_scalar, rot_avx2, rot_avx512);
    if (n * n_heads * head_dim < 65536 || llb_pool_threads() < 2) fn(&c, 0, n, 0);
    else llb_parallel_for(fn, &c, n, llb_grain(n, 16, 8, 1), llb_pool_threads());
}

/* ---- attention within each sequence -------------------------------------- */

typedef struct {
    const float *qkv;
    const int32_t *starts;
    long n_seqs, n_heads, head_dim, max_len;
    float scale;
    float *out;
    float *scratch; /* per thread: att_scratch_floats(head_dim, max_len) */
} att_ctx;

/* Queries whose scores one pass computes together (at most): each K^T and V vector loaded feeds a block of
 * queries, so a long sequence's keys and values (4096 patches of a vision tower: 1.2 MB a head) stream
 * through the caches once per block, not once per query (a 4096-patch head: 12 -> ~75 GFLOP/s on AVX-512).
 * Blocks of 8 on AVX-512 and AVX2 (8 accumulators of one register each; 16 on AVX-512 measured slower),
 * 4 on the scalar path (SSE registers). A row's max and its exponentials' sum go in LANES partials
 * (lane_max, lane_sum: the same order on every ISA), not one serial chain each. */
#define QB 8

/* Vectors of 16, 8 and 4 floats as values (GCC/Clang vector extensions), the width each ISA's registers hold
 * (zmm, ymm, xmm): accumulators the compiler keeps in registers; the `u` types load and store at any
 * alignment. */
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));
typedef float v4 __attribute__((vector_size(16)));
typedef float v4u __attribute__((vector_size(16), aligned(4)));

/* Per-thread scratch (floats): K^T (head_dim x tp), V (max_len x hp, each row padded to 16 with zeros),
 * the scores of QB queries (QB x tp). */
static size_t att_scratch_floats(long head_dim, long max_len) {
    const size_t tp = (size_t)(max_len + 15) & ~(size_t)15, hp = (size_t)(head_dim + 15) & ~(size_t)15;
    return (size_t)head_dim * tp + (size_t)max_len * hp + QB * tp;
}

#define ATT_NAME att_units_avx512
#define ATT_QB 8
#define ATT_V v16
#define ATT_VU v16u
#define ATT_W 16
#include "ops/encoder_att.inc"
#define ATT_NAME att_units_avx2
#define ATT_QB 8
#define ATT_V v8
#define ATT_VU v8u
#define ATT_W 8
#include "ops/encoder_att.inc"
#define ATT_NAME att_units_scalar
#define ATT_QB 4
#define ATT_V v4
#define ATT_VU v4u
#define ATT_W 4
#include "ops/encoder_att.inc"

static void att_scalar(void *ctx, long u0, long u1, int tid) { att_units_scalar(ctx, u0, u1, tid); }
#if LLB_X86
LLB_TARGET_AVX2 static void att_avx2(void *ctx, long u0, long u1, int tid) { att_units_avx2(ctx, u0, u1, tid); }
LLB_TARGET_AVX512 static void att_avx512(void *ctx, long u0, long u1, int tid) { att_units_avx512(ctx, u0, u1, tid); }
#endif

int llb_encoder_attention(const float *qkv, const int32_t *starts, long n_seqs, long n_heads, long head_dim,
                          float scale, float *out) {
    long max_len = 1;
    for (long s = 0; s < n_seqs; s++)
        if (starts[s + 1] - starts[s] > max_len) max_len = starts[s + 1] - starts[s];
    const int nth = llb_pool_threads();
    float *scratch = llb_scratch((size_t)nth * att_scratch_floats(head_dim, max_len) * sizeof(float));
    if (!scratch) return -1;
    att_ctx c = {qkv, starts, n_seqs, n_heads, head_dim, max_len, scale, out, scratch};
    const llb_range_fn fn = LLB_PER_ISA(att_scalar, att_avx2, att_avx512);
    const long units = n_seqs * n_heads;
    if (nth < 2 || starts[n_seqs] * n_heads * max_len * head_dim < 65536) fn(&c, 0, units, 0);
    else llb_parallel_for(fn, &c, units, llb_grain(units, 32, 1, 1), nth);
    return 0;
}

/* Mamba 1's selective scan (ops/ssmscan1.h): channels independent, each running every token of the batch in
 * order over its slot's N-value state. The loops (over a channel's state, and over channels for the softplus and
 * the gate) are plain C the compiler vectorizes, their exponentials included (core/expneg.h), compiled once per ISA
 * through target attributes; a token's output is summed in LANES partial sums, then those in order, so every
 * thread split adds alike (and the ISAs within float rounding: FMA where the ISA has it).
 * GCC if-converts the loop's selects (the exponential's clamp) into vector blends only where comparisons may not
 * trap: nothing here enables FP traps, so the file says so (clang assumes it already). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "ops/ssmscan1.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/expneg.h"
#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"

#define AI __attribute__((always_inline)) inline
#define LANES 16

#define CB 64     /* channels a block: their states (CB x N) stay in L1 over the batch's tokens */

/* softplus(u) = max(u, 0) + log1p(e^-|u|), log1p(e) for e in (0, 1] as 2 atanh(s), s = e / (2 + e) <= 1/3, by its odd
 * series to s^15 (the next term under 3e-9 relative): plain arithmetic that vectorizes over channels, as libm's
 * log1pf does not. */
static AI float softplus_v(float u) {
    const float e = exp_neg(u < 0.0f ? u : -u);
    const float s = e / (2.0f + e), s2 = s * s;
    float p = 1.0f / 15;
    p = p * s2 + 1.0f / 13;
    p = p * s2 + 1.0f / 11;
    p = p * s2 + 1.0f / 9;
    p = p * s2 + 1.0f / 7;
    p = p * s2 + 1.0f / 5;
    p = p * s2 + 1.0f / 3;
    p = p * s2 + 1.0f;
    return (u > 0.0f ? u : 0.0f) + 2.0f * s * p;
}

/* silu(z) = z sigmoid(z), the sigmoid 1 / (1 + e^-z) at or above 0 and e^z / (1 + e^z) below (e^-|z| either way). */
static AI float silu_v(float z) {
    const float e = exp_neg(z < 0.0f ? z : -z);
    const float r = 1.0f / (1.0f + e);
    return z * (z < 0.0f ? e * r : r);
}

/* One token's update of channel state S (N values) and its output S . C, in LANES partial sums. */
static AI float scan_token(float *restrict S, const float *restrict A, const float *restrict B,
                           const float *restrict C, float d, float x, long N) {
    float part[LANES] = {0};
    long k = 0;
    for (; k + LANES <= N; k += LANES)
        for (int j = 0; j < LANES; j++) {
            const float da = d * A[k + j];
            const float s = exp_neg(da < 0.0f ? da : 0.0f) * S[k + j] + d * B[k + j] * x;
            S[k + j] = s;
            part[j] += s * C[k + j];
        }
    for (; k < N; k++) {
        const float da = d * A[k];
        const float s = exp_neg(da < 0.0f ? da : 0.0f) * S[k] + d * B[k] * x;
        S[k] = s;
        part[k % LANES] += s * C[k];
    }
    float y = 0.0f;
    for (int j = 0; j < LANES; j++) y += part[j];
    return y;
}

/* Channels [c0, c1) in blocks of CB, each block running the batch's tokens in order: per token the block's
 * softplus(dt) and silu(z) in loops over channels, each channel's state update and sum (scan_token). */
static AI void scan_channels(const struct llb_ssm_scan1_args *a, long c0, long c1) {
    const long D = a->d_inner, N = a->dstate;
    float d[CB], y[CB];
    for (long cb = c0; cb < c1; cb += CB) {
        const long m = c1 - cb < CB ? c1 - cb : CB;
        const float *bias = a->dt_bias + cb, *skip = a->d_skip + cb;
        for (long t = 0; t < a->n; t++) {
            const size_t row = (size_t)t * (size_t)D + (size_t)cb;
            const float *x = a->x + row, *dt = a->dt + row, *z = a->z + row;
            const float *B = a->b + (size_t)t * (size_t)N, *C = a->c + (size_t)t * (size_t)N;
            float *S = a->state + ((size_t)a->slots[t] * (size_t)D + (size_t)cb) * (size_t)N, *out = a->out + row;
            if (a->pos[t] == 0) memset(S, 0, (size_t)(m * N) * sizeof(float));
            for (long j = 0; j < m; j++) d[j] = softplus_v(dt[j] + bias[j]);
            for (long j = 0; j < m; j++)
                y[j] = scan_token(S + j * N, a->a_neg + (size_t)(cb + j) * (size_t)N, B, C, d[j], x[j], N);
            for (long j = 0; j < m; j++) out[j] = (y[j] + skip[j] * x[j]) * silu_v(z[j]);
        }
    }
}

static void scan_scalar(void *ctx, long c0, long c1, int tid) { (void)tid; scan_channels(ctx, c0, c1); }
#if LLB_X86
LLB_TARGET_AVX2 static void scan_avx2(void *ctx, long c0, long c1, int tid) { (void)tid; scan_channels(ctx, c0, c1); }
LLB_TARGET_AVX512 static void scan_avx512(void *ctx, long c0, long c1, int tid) {
    (void)tid;
    scan_channels(ctx, c0, c1);
}
#endif

void llb_ssm_scan1(const struct llb_ssm_scan1_args *a) {
    const llb_range_fn fn = LLB_PER_ISA(scan_scalar, scan_avx2, scan_avx512);
    const int nth = llb_pool_threads();
    if (nth < 2 || a->n * a->d_inner * a->dstate < 16384) fn((void *)a, 0, a->d_inner, 0);
    else llb_parallel_for(fn, (void *)a, a->d_inner, llb_grain(a->d_inner, 64, 16, 16), nth);
    for (long t = 0; t < a->n; t++) a->state_pos[a->slots[t]] = a->pos[t] + 1;
}

/* Mamba 1's selective scan (ops/ssmscan1.h): channels independent, each running every token of the batch in
 * order over its slot's N-value state. The loop over the state is plain C the compiler vectorizes (the decay's
 * exponential included: core/expneg.h), compiled once per ISA through target attributes; a token's output is
 * summed in LANES partial sums, then those in order, so every ISA and every thread split adds alike.
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

static AI float softplus1(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

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

static AI void scan_channels(const struct llb_ssm_scan1_args *a, long c0, long c1) {
    const long D = a->d_inner, N = a->dstate;
    for (long ch = c0; ch < c1; ch++) {
        const float *A = a->a_neg + (size_t)ch * (size_t)N;
        for (long t = 0; t < a->n; t++) {
            float *S = a->state + ((size_t)a->slots[t] * (size_t)D + (size_t)ch) * (size_t)N;
            if (a->pos[t] == 0) memset(S, 0, (size_t)N * sizeof(float));
            const size_t tc = (size_t)t * (size_t)D + (size_t)ch;
            const float x = a->x[tc], z = a->z[tc];
            const float d = softplus1(a->dt[tc] + a->dt_bias[ch]);
            const float y = scan_token(S, A, a->b + (size_t)t * (size_t)N, a->c + (size_t)t * (size_t)N, d, x, N);
            a->out[tc] = (y + a->d_skip[ch] * x) * (z / (1.0f + expf(-z)));
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

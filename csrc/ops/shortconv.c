/* Causal depthwise convolutions with a per-sequence state: LFM2's gated short convolution and
 * Qwen3-Next's convolution before its delta rule.
 *
 * Token t (in batch order) of slot s: u = B * x (gated: the first and third d-wide parts of a
 * 3d-wide input row) or the input row itself, then y = sum_j kernel[c][j] * window[j] over the
 * slot's last L - 1 inputs (its state, oldest first) followed by u, and out = C * y (gated) or
 * silu(y + bias) (the bias optional: Mamba2's); the state then drops its oldest row and keeps u.
 * A token at position 0 starts its slot from a zero state. Channels are independent, so the
 * work splits over channel ranges and each range runs every token in order: a token's result
 * depends only on its own slot's inputs, whatever else shares the batch (batch invariant). */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/ops.h"

#define CONV_PAR_MIN 8192   /* tokens * channels below which one thread does it all */

/* Channels [c0, c1) of one token: u = b * x (gated) or b; y over the state's rows then u; the state
 * shifted; out = cg * y (gated) or silu(y + bias[c]) (bias NULL: none). */
static inline void conv_channels(float *restrict st, const float *restrict b, const float *restrict x,
                                 const float *restrict cg, const float *restrict kernel, const float *restrict bias,
                                 float *restrict o, long c0, long c1, long d, long L) {
    const long keep = L - 1;
    for (long c = c0; c < c1; c++) {
        const float *k = kernel + (size_t)c * (size_t)L;
        const float u = x ? b[c] * x[c] : b[c];
        float y = 0.0f;
        for (long j = 0; j < keep; j++) y += k[j] * st[j * d + c];
        y += k[keep] * u;
        for (long j = 0; j + 1 < keep; j++) st[j * d + c] = st[(j + 1) * d + c];
        st[(keep - 1) * d + c] = u;
        if (bias) y += bias[c];
        o[c] = cg ? cg[c] * y : y / (1.0f + expf(-y));
    }
}

static void conv_range(void *ctx, long c0, long c1, int tid) {
    (void)tid;
    const struct llb_short_conv_args *a = ctx;
    const long d = a->d, L = a->width, keep = L - 1;
    for (long t = 0; t < a->n; t++) {
        float *st = a->state + (size_t)a->slots[t] * (size_t)(keep * d);
        const float *b = a->bcx + (size_t)t * (size_t)(a->gated ? 3 * d : d), *cg = b + d, *x = b + 2 * d;
        float *o = a->out + (size_t)t * (size_t)d;
        if (a->pos[t] == 0)
            for (long j = 0; j < keep; j++) memset(st + j * d + c0, 0, (size_t)(c1 - c0) * sizeof(float));
        if (a->gated) conv_channels(st, b, x, cg, a->kernel, NULL, o, c0, c1, d, L);
        else conv_channels(st, b, NULL, NULL, a->kernel, a->bias, o, c0, c1, d, L);
    }
}

void llb_short_conv(const struct llb_short_conv_args *a) {
    if (a->n * a->d < CONV_PAR_MIN || llb_pool_threads() == 1) conv_range((void *)a, 0, a->d, 0);
    else llb_parallel_for(conv_range, (void *)a, a->d, llb_grain(a->d, 16, 16, 16), LLB_POOL_MAX_THREADS);
    for (long t = 0; t < a->n; t++) a->state_pos[a->slots[t]] = a->pos[t] + 1;
}

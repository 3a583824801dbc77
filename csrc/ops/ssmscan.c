/* Mamba2's selective scan (Granite 4's recurrent layers) over a per-sequence (H, N, P) state.
 *
 * Heads are independent in the scan: the work splits over them and each head runs every token of the
 * batch in order, so a token's result depends only on its own slot's earlier tokens (batch invariant),
 * whatever the thread count. Per token and head h (group g = h / (H / G)):
 *   d = softplus(dt_h + dt_bias_h);  S = exp(d a_neg_h) S + d B_g x_h^T;  y = S^T C_g + D_h x_h;  y *= silu(z_h)
 * then per token each of the G groups of H P / G values y / sqrt(mean(y^2) + eps) * w (a second pass: a
 * group spans heads), unless norm_w is NULL (no norm). */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/ops.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* One state row n of a head (restrict: the state, the output and x never alias, so this vectorizes). */
static void scan_row(float *restrict Sn, float *restrict y, const float *restrict x, float decay, float bn, float cn,
                     long P) {
    for (long p = 0; p < P; p++) {
        Sn[p] = decay * Sn[p] + bn * x[p];
        y[p] += Sn[p] * cn;
    }
}

static void head_range(void *ctx, long h0, long h1, int tid) {
    (void)tid;
    const struct llb_ssm_scan_args *a = ctx;
    const long H = a->heads, G = a->groups, N = a->dstate, P = a->dhead, xd = H * P, c = xd + 2 * G * N;
    float y[LLB_SSM_MAX_DIM];
    for (long h = h0; h < h1; h++) {
        const long g = h / (H / G);
        for (long t = 0; t < a->n; t++) {
            float *S = a->state + ((size_t)a->slots[t] * (size_t)H + (size_t)h) * (size_t)(N * P);
            if (a->pos[t] == 0) memset(S, 0, (size_t)(N * P) * sizeof(float));
            const float *row = a->xbc + (size_t)t * (size_t)c, *x = row + h * P;
            const float *B = row + xd + g * N, *C = row + xd + G * N + g * N;
            const float d = softplus(a->dt[(size_t)t * (size_t)H + (size_t)h] + a->dt_bias[h]);
            const float decay = expf(d * a->a_neg[h]);
            for (long p = 0; p < P; p++) y[p] = 0.0f;
            for (long n = 0; n < N; n++) scan_row(S + n * P, y, x, decay, d * B[n], C[n], P);
            const float *z = a->z + (size_t)t * (size_t)xd + h * P;
            float *out = a->out + (size_t)t * (size_t)xd + h * P;
            for (long p = 0; p < P; p++) out[p] = (y[p] + a->d_skip[h] * x[p]) * (z[p] / (1.0f + expf(-z[p])));
        }
    }
}

static void norm_range(void *ctx, long t0, long t1, int tid) {
    (void)tid;
    const struct llb_ssm_scan_args *a = ctx;
    const long xd = a->heads * a->dhead, gs = xd / a->groups;
    for (long t = t0; t < t1; t++)
        for (long g = 0; g < a->groups; g++) {
            float *o = a->out + (size_t)t * (size_t)xd + g * gs;
            const float *w = a->norm_w + g * gs;
            float ms = 0.0f;
            for (long j = 0; j < gs; j++) ms += o[j] * o[j];
            const float r = 1.0f / sqrtf(ms / (float)gs + a->eps);
            for (long j = 0; j < gs; j++) o[j] = o[j] * r * w[j];
        }
}

void llb_ssm_scan(const struct llb_ssm_scan_args *a) {
    const int one = llb_pool_threads() == 1 || a->n * a->dstate * a->dhead * a->heads < 16384;
    if (one) head_range((void *)a, 0, a->heads, 0);
    else llb_parallel_for(head_range, (void *)a, a->heads, 1, LLB_POOL_MAX_THREADS);
    if (a->norm_w) {
        if (one || a->n < 4) norm_range((void *)a, 0, a->n, 0);
        else llb_parallel_for(norm_range, (void *)a, a->n, 1, LLB_POOL_MAX_THREADS);
    }
    for (long t = 0; t < a->n; t++) a->state_pos[a->slots[t]] = a->pos[t] + 1;
}

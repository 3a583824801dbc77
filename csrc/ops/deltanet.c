/* Qwen3-Next's gated delta rule (linear attention with a per-head dk x dv state), and the
 * sigmoid gate its attention layers put on their output.
 *
 * Value heads are independent: the work splits over them and each head runs every token of the
 * batch in order, so a token's result depends only on its own slot's earlier tokens (batch
 * invariant), whatever the thread count. Per token and value head h (key head h / (hv / hk)):
 *   q, k L2-normalised, q scaled by dk^-0.5; beta = sigmoid(b_h); g = a_neg_h softplus(a_h + dt_h)
 *   S = exp(g) S;  d = beta (v - S^T k);  S += k d^T;  o = S^T q
 *   out = o / sqrt(mean(o^2) + eps) * w * silu(z) */
#include <math.h>
#include <string.h>

#include "core/threadpool.h"
#include "ops/ops.h"


static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* v[0..n) times 1 / sqrt(sum(v^2) + 1e-6), times scale */
static void l2norm(const float *v, float *out, long n, float scale) {
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += v[i] * v[i];
    const float r = scale / sqrtf(s + 1e-6f);
    for (long i = 0; i < n; i++) out[i] = v[i] * r;
}

/* One row i of a head's state (restrict: the state, the accumulators and the delta never alias, so
 * these loops vectorize). */
static void decay_row(float *restrict Si, float *restrict mem, float decay, float ki, long dv) {
    for (long j = 0; j < dv; j++) {
        Si[j] *= decay;
        mem[j] += Si[j] * ki;
    }
}

static void update_row(float *restrict Si, float *restrict o, const float *restrict delta, float ki, float qi,
                       long dv) {
    for (long j = 0; j < dv; j++) {
        Si[j] += ki * delta[j];
        o[j] += Si[j] * qi;
    }
}

static void head_range(void *ctx, long h0, long h1, int tid) {
    (void)tid;
    const struct llb_gated_delta_args *a = ctx;
    const long hk = a->hk, hv = a->hv, dk = a->dk, dv = a->dv, kd = hk * dk, c = 2 * kd + hv * dv;
    float q[LLB_DELTA_MAX_DIM], k[LLB_DELTA_MAX_DIM], mem[LLB_DELTA_MAX_DIM], o[LLB_DELTA_MAX_DIM];
    for (long h = h0; h < h1; h++) {
        const long g = h / (hv / hk);
        for (long t = 0; t < a->n; t++) {
            float *S = a->state + ((size_t)a->slots[t] * (size_t)hv + (size_t)h) * (size_t)(dk * dv);
            if (a->pos[t] == 0) memset(S, 0, (size_t)(dk * dv) * sizeof(float));
            const float *row = a->qkv + (size_t)t * (size_t)c, *v = row + 2 * kd + h * dv;
            l2norm(row + g * dk, q, dk, 1.0f / sqrtf((float)dk));
            l2norm(row + kd + g * dk, k, dk, 1.0f);
            const float *ba = a->ba + (size_t)t * (size_t)(2 * hv);
            const float beta = 1.0f / (1.0f + expf(-ba[h]));
            const float decay = expf(a->a_neg[h] * softplus(ba[hv + h] + a->dt_bias[h]));
            for (long j = 0; j < dv; j++) mem[j] = 0.0f;
            for (long i = 0; i < dk; i++) decay_row(S + i * dv, mem, decay, k[i], dv);   /* S *= decay; mem = S^T k */
            for (long j = 0; j < dv; j++) mem[j] = (v[j] - mem[j]) * beta;           /* the delta */
            for (long j = 0; j < dv; j++) o[j] = 0.0f;
            for (long i = 0; i < dk; i++) update_row(S + i * dv, o, mem, k[i], q[i], dv); /* S += k delta^T; o = S^T q */
            float ms = 0.0f;
            for (long j = 0; j < dv; j++) ms += o[j] * o[j];
            const float r = 1.0f / sqrtf(ms / (float)dv + a->eps);
            const float *z = a->z + (size_t)t * (size_t)(hv * dv) + h * dv;
            float *out = a->out + (size_t)t * (size_t)(hv * dv) + h * dv;
            for (long j = 0; j < dv; j++) out[j] = o[j] * r * a->norm_w[j] * (z[j] / (1.0f + expf(-z[j])));
        }
    }
}

void llb_gated_delta(const struct llb_gated_delta_args *a) {
    if (a->n * a->dk * a->dv < 4096 || llb_pool_threads() == 1) head_range((void *)a, 0, a->hv, 0);
    else llb_parallel_for(head_range, (void *)a, a->hv, 1, LLB_POOL_MAX_THREADS);
    for (long t = 0; t < a->n; t++) a->state_pos[a->slots[t]] = a->pos[t] + 1;
}

struct gate_task {
    const float *x, *gate;
    float *out;
};

static void gate_range(void *ctx, long i0, long i1, int tid) {
    (void)tid;
    const struct gate_task *t = ctx;
    for (long i = i0; i < i1; i++) t->out[i] = t->x[i] / (1.0f + expf(-t->gate[i]));
}

void llb_sigmoid_mul(const float *x, const float *gate, float *out, long count) {
    struct gate_task t = {x, gate, out};
    if (count < 4096 || llb_pool_threads() == 1) gate_range(&t, 0, count, 0);
    else llb_parallel_for(gate_range, &t, count, llb_grain(count, 16, 1024, 16), LLB_POOL_MAX_THREADS);
}

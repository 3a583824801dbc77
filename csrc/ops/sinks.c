/* Attention sinks (GPT-OSS): a learned logit per head that joins each softmax as one more
 * column with no value. Applied after attention as a rescale, so the attention kernels stay as
 * they are: with Z the sum of e^score over the keys a row sees, the softmax with the sink gives
 * out * Z / (Z + e^sink) = out / (1 + e^(sink - log Z)). log Z is recomputed from the scores
 * (a second pass over the keys, none over the values). */
#include <math.h>

#include "core/fp16.h"
#include "core/threadpool.h"
#include "ops/ops.h"

struct sink_task {
    const struct llb_attention_args *a;
    const float *sinks;
};

static float dot_key(const struct llb_attention_args *a, const float *q, size_t at) {
    float s = 0.0f;
    if (a->cache_type == LLB_CACHE_F16) {
        const uint16_t *k = (const uint16_t *)a->kcache + at;
        for (long d = 0; d < a->head_dim; d++) s += q[d] * llb_f16_to_f32(k[d]);
    } else {
        const float *k = (const float *)a->kcache + at;
        for (long d = 0; d < a->head_dim; d++) s += q[d] * k[d];
    }
    return s;
}

static void sinks_task(void *ctx, int ith, int nth) {
    const struct sink_task *t = ctx;
    const struct llb_attention_args *a = t->a;
    const long group = a->n_heads / a->n_kv, hd = a->head_dim;
    long r0, r1;
    llb_split(a->n * a->n_heads, 1, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        const long i = r / a->n_heads, h = r % a->n_heads, p = a->pos[i];
        const long first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        const float *q = a->q + (size_t)r * hd;
        float m = -INFINITY, l = 0.0f; /* running max and sum of e^(score - max) */
        for (long j = first; j <= p; j++) {
            const size_t at = (((size_t)a->slots[i] * a->n_ctx + j) * a->n_kv + h / group) * hd;
            float s = dot_key(a, q, at) * a->scale;
            if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
            if (s > m) {
                l = l * expf(m - s) + 1.0f;
                m = s;
            } else {
                l += expf(s - m);
            }
        }
        const float keep = 1.0f / (1.0f + expf(t->sinks[h] - (m + logf(l))));
        float *o = a->out + (size_t)r * hd;
        for (long d = 0; d < hd; d++) o[d] *= keep;
    }
}

void llb_attention_sinks(const struct llb_attention_args *a, const float *sinks) {
    struct sink_task t = {a, sinks};
    if (a->n * a->n_heads < 8 || llb_pool_threads() == 1) sinks_task(&t, 0, 1);
    else llb_parallel(sinks_task, &t);
}

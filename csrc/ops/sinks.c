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

/* q . key at element `at` of the cache; base: the slot's key base for that kv head (q8_0 caches
 * stored with bases, see ops.c's q8_0_row), or NULL. */
static float dot_key(const struct llb_attention_args *a, const float *q, size_t at, const float *base) {
    float s = 0.0f;
    if (a->cache_type == LLB_CACHE_Q8_0) {
        const uint8_t *r = llb_cache_at(a->kcache, at, LLB_CACHE_Q8_0);
        for (long c = 0; c + LLB_Q8_0_BLOCK <= a->head_dim; c += LLB_Q8_0_BLOCK, r += LLB_Q8_0_BYTES) {
            const uint16_t h = (uint16_t)(r[0] | r[1] << 8);
            const float d = llb_f16_to_f32(h & 0x7FFF);
            const float *b = base && (h & 0x8000) ? base + c : NULL;
            for (int i = 0; i < LLB_Q8_0_BLOCK; i++) s += q[c + i] * ((float)(int8_t)r[2 + i] * d + (b ? b[i] : 0.0f));
        }
    } else if (a->cache_type == LLB_CACHE_F16) {
        const uint16_t *k = (const uint16_t *)a->kcache + at;
        for (long d = 0; d < a->head_dim; d++) s += q[d] * llb_f16_to_f32(k[d]);
    } else {
        const float *k = (const float *)a->kcache + at;
        for (long d = 0; d < a->head_dim; d++) s += q[d] * k[d];
    }
    return s;
}

static void sinks_task(void *ctx, long r0, long r1, int tid) {
    (void)tid;
    const struct sink_task *t = ctx;
    const struct llb_attention_args *a = t->a;
    const long group = a->n_heads / a->n_kv, hd = a->head_dim;
    for (long r = r0; r < r1; r++) {
        const long i = r / a->n_heads, h = r % a->n_heads, p = a->pos[i];
        const long first = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        const float *q = a->q + (size_t)r * hd;
        const float *base = a->kbase && a->cache_type == LLB_CACHE_Q8_0
                                ? a->kbase + ((size_t)a->slots[i] * (size_t)a->n_kv + (size_t)(h / group)) * (size_t)hd
                                : NULL;
        float m = -INFINITY, l = 0.0f; /* running max and sum of e^(score - max) */
        for (long j = first, last = llb_attn_last_key(a, i); j <= last; j++) {
            const size_t at = llb_kv_elem(a->n_kv, a->n_ctx, hd, a->slots[i], h / group, j);
            float s = dot_key(a, q, at, base) * a->scale;
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
    const long rows = a->n * a->n_heads;
    if (rows < 8 || llb_pool_threads() == 1) sinks_task(&t, 0, rows, 0);
    else llb_parallel_for(sinks_task, &t, rows, llb_grain(rows, 32, 1, 1), LLB_POOL_MAX_THREADS);
}

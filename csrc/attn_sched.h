/* Internal to the attention driver (ops_attention.c) and its batch-invariant
 * schedule (attn_invariant.c). */
#ifndef LLB_ATTN_SCHED_H
#define LLB_ATTN_SCHED_H
#include "ops.h"
#include "ops_kernels.h"

#define ATTN_CHUNK 256           /* keys per chunk when a row is split */
#define PAR_MIN_ATTN_MACS 65536 /* below this many multiply-adds, one thread */

/* The first key a query at position p reads (sliding window). */
static inline long llb_attn_first_key(const struct llb_attention_args *a, long p) {
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

/* Byte offset of kv head kvh's first key of slot s in the caches. */
static inline size_t llb_attn_cache_base(const struct llb_attention_args *a, long s, long kvh) {
    const size_t stride = (size_t)a->n_kv * (size_t)a->head_dim, esize = a->cache_type == LLB_CACHE_F16 ? 2 : 4;
    return ((size_t)s * (size_t)a->n_ctx * stride + (size_t)kvh * (size_t)a->head_dim) * esize;
}

/* A tile over slot s's keys of kv head kvh; row_order 1: sum like the row kernel (invariant mode). */
static inline struct llb_attn_tile llb_attn_tile_at(const struct llb_attention_args *a, long s, long kvh, int row_order) {
    const size_t base = llb_attn_cache_base(a, s, kvh);
    const struct llb_attn_tile tile = {
        .k = (const char *)a->kcache + base,
        .v = (const char *)a->vcache + base,
        .stride = (size_t)a->n_kv * (size_t)a->head_dim,
        .head_dim = a->head_dim,
        .scale = a->scale,
        .softcap = a->softcap,
        .row_order = row_order,
    };
    return tile;
}

/* Keys lo..hi of token i's heads [h0, h0 + nh) of kv head kvh through the row kernel: normalised
 * into a->out (out NULL), or the partial into out (nh rows of sums) and ml (nh (max, sum) pairs). */
void llb_attn_rows(const struct llb_attention_args *a, const struct llb_op_kernels *k, long i, long kvh, long h0,
                   long nh, long lo, long hi, float *out, float *ml);

/* Set by set_batch_invariant (defined in matmul.c, see kernels.h): the server's mode. */
extern int llb_batch_invariant;

/* The batch-invariant schedule (attn_invariant.c). Returns 0, or -1 (nothing done) when its
 * scratch cannot be had. */
int llb_attention_invariant(const struct llb_attention_args *a);

#endif

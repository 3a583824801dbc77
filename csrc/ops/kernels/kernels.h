/* The per-ISA kernels behind ops/ops.c and ops/attention.c: one table per instruction set, all made
 * from the same template (simd.inc, attention.inc) over a small vector vocabulary, so the
 * three paths compute the same thing in the same order, only wider. */
#ifndef LLB_OPS_KERNELS_H
#define LLB_OPS_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "core/isa.h"

/* One token's `group` query heads (consecutive rows) against one kv head, keys lo..hi (inclusive). */
struct llb_attn_unit {
    const float *q;     /* group rows of head_dim */
    const void *k, *v;  /* the rows of key position 0 (f32, f16 or q8_0 blocks) */
    size_t stride;      /* elements from one key position to the next (see llb_cache_at) */
    long lo, hi;
    long head_dim, group;
    float scale, softcap;
    float *out; /* group rows: the normalised output, or with ml the unnormalised sum */
    float *ml;  /* NULL, or group pairs (max score, sum of exp) of a partial to merge */
    const float *kbase; /* q8_0: NULL or head_dim floats added to every key read */
    /* NULL, or the K and V rows of the first key of the unit this thread likely runs next: its
     * first next_n keys are prefetched after this unit's last (a prefetch only, no result changes) */
    const void *next_k, *next_v;
    long next_n;
    /* 0: K/V asked for into L2 far ahead and L1 near (tuned on Intel); else into L2 only, this many
     * bytes of a stream's rows ahead (llb_isa_far_stream: Zen 4) */
    long pf_far;
};

/* Up to LLB_TILE_MAX_ROWS query rows reading keys of one kv head (a few
 * tokens of one slot x some of its query heads), each with its own key range:
 * at most 3 vectors of lanes (lanes * 3 rows), in either order. */
#define LLB_TILE_VECS 3
#define LLB_TILE_MAX_ROWS (16 * LLB_TILE_VECS)
/* The tile kernels take arrays of tiles of one kv head (same k, v, stride, head_dim, scale,
 * softcap, kbase): up to LLB_TILE_GROUP of them go through each block of keys together. */
#define LLB_TILE_GROUP 4
/* In the row order (batch-invariant) up to LLB_INV_TILE_GROUP, as many as the kernel's state
 * holds at the head size (8 at head_dim 64, 4 at 128): a row's sums do not depend on its tile
 * or the tiles beside it there, so its rows fill the tiles' lanes regardless of tokens. */
#define LLB_INV_TILE_GROUP 8
struct llb_attn_tile {
    const void *k, *v; /* the rows of key position 0 (f32, f16 or q8_0 blocks) */
    size_t stride;
    long head_dim, n_rows;
    float scale, softcap;
    const float *q[LLB_TILE_MAX_ROWS];
    float *out[LLB_TILE_MAX_ROWS];
    long lo[LLB_TILE_MAX_ROWS], hi[LLB_TILE_MAX_ROWS];
    /* Nonzero: sum exactly as attend does (a row's bits then do not depend on the kernel; the
     * batch-invariant schedule). */
    int row_order;
    /* Row order: the rows (sharing their first key) cut into chunks of `chunk` keys from it; 0: one
     * range each. */
    long chunk;
    /* Row order with chunks, merge set: the rows go through every chunk of theirs in this
     * call; a row of several gets its chunks' partials kept here transposed and merged at the end,
     * as attn_merge does, into out[r]. At least n_tiles x chunks x (head_dim + 2) x
     * lanes x LLB_TILE_VECS floats, 64-byte aligned. */
    float *merge;
    const float *kbase; /* as llb_attn_unit's */
};

struct llb_op_kernels {
    void (*rmsnorm_rows)(const float *x, const float *w, float *out, long rows, long d, float eps);
    void (*silu_mul)(const float *gate, const float *up, float *out, long count);
    void (*gelu_mul)(const float *gate, const float *up, float *out, long count);
    void (*softcap)(float *x, float cap, long count);
    void (*gelu_erf)(float *x, long count);
    void (*add)(const float *a, const float *b, float *out, long count);
    void (*scale)(float *x, float s, long count);
    void (*f32_to_f16)(const float *src, uint16_t *dst, long count);
    void (*attend_f32)(const struct llb_attn_unit *u);
    void (*attend_f16)(const struct llb_attn_unit *u);
    void (*attend_q8_0)(const struct llb_attn_unit *u);
    void (*attn_merge)(const float *parts, size_t part_stride, const float *ml, size_t ml_stride, long n_parts, long hd,
                       float *out);
    void (*attend_tile_f32)(const struct llb_attn_tile *t, long n_tiles);
    void (*attend_tile_f16)(const struct llb_attn_tile *t, long n_tiles);
    void (*attend_tile_q8_0)(const struct llb_attn_tile *t, long n_tiles);
    int lanes; /* floats per vector: rows a tile can hold */
};

/* The table of llb_isa_current (ops/ops.c). */
const struct llb_op_kernels *llb_op_kernels_current(void);

extern const struct llb_op_kernels llb_ops_scalar;
#if LLB_X86
extern const struct llb_op_kernels llb_ops_avx2;
extern const struct llb_op_kernels llb_ops_avx512;
#endif

#endif

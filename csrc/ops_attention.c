/* Attention driver: schedules (token, kv head) work over the thread pool and
 * the per-ISA kernels of attn_simd.inc. */
#include <stdatomic.h>

#include "attn_sched.h"
#include "core.h"
#include "threadpool.h"

/* Three schedules, chosen from the arguments only (never from the thread
 * count, so results are identical for any number of threads; with
 * llb_batch_invariant set, the schedule of attn_invariant.c instead):
 *  - tiles (prefill): units are (a few consecutive tokens, kv head, pass over
 *    its heads) holding up to `lanes` query rows in vector lanes;
 *  - rows: units are (token, kv head) with the kv head's query heads;
 *  - split (decode with few rows and long contexts): rows cut into chunks of
 *    ATTN_CHUNK keys whose partial softmax sums are merged afterwards.
 * Units are handed out by an atomic counter so uneven causal rows balance; the
 * last tokens (most keys) go first. */
#define ATTN_SPLIT_MAX_ROWS 16 /* split only when n * n_kv is below this */
#define ATTN_SCRATCH_MAX ((size_t)64 << 20)

enum attn_mode { ATTN_ROWS, ATTN_SPLIT, ATTN_TILES };

struct attn_task {
    const struct llb_attention_args *a;
    const struct llb_op_kernels *k;
    enum attn_mode mode;
    long units, group;
    /* tiles: tile_tokens tokens x heads_per_pass heads per unit */
    long tile_tokens, heads_per_pass, passes, n_tiles;
    /* split: token i's chunks are units [first_chunk[i] * n_kv, first_chunk[i+1] * n_kv) */
    long first_chunk[ATTN_SPLIT_MAX_ROWS + 1];
    float *parts; /* split: per unit, group * head_dim sums, then group (max, sum) pairs */
    _Alignas(64) atomic_long next;
};

static size_t part_floats(const struct attn_task *t) {
    return (size_t)t->group * (size_t)t->a->head_dim + 2 * (size_t)t->group;
}

void llb_attn_rows(const struct llb_attention_args *a, const struct llb_op_kernels *k, long i, long kvh, long h0,
                   long nh, long lo, long hi, float *out, float *ml) {
    const long s = a->slots[i];
    if (s < 0 || s >= a->n_slots || hi < 0 || hi >= a->n_ctx) return; /* validated by the caller; never read outside */
    const size_t base = llb_attn_cache_base(a, s, kvh);
    const long row = i * a->n_heads + kvh * (a->n_heads / a->n_kv) + h0; /* first query row */
    struct llb_attn_unit u = {
        .q = a->q + row * a->head_dim,
        .k = (const char *)a->kcache + base,
        .v = (const char *)a->vcache + base,
        .stride = (size_t)a->n_kv * (size_t)a->head_dim,
        .lo = lo,
        .hi = hi,
        .head_dim = a->head_dim,
        .group = nh,
        .scale = a->scale,
        .softcap = a->softcap,
        .out = out ? out : a->out + row * a->head_dim,
        .ml = ml,
    };
    (a->cache_type == LLB_CACHE_F16 ? k->attend_f16 : k->attend_f32)(&u);
}

static void attend_rows(const struct attn_task *t, long i, long kvh, long h0, long nh, long lo, long hi, float *out,
                        float *ml) {
    llb_attn_rows(t->a, t->k, i, kvh, h0, nh, lo, hi, out, ml);
}

/* Tokens [t0, t1) of one slot, heads [h0, h0 + nh) of kv head kvh, as one tile. */
static void attend_tile(const struct attn_task *t, long t0, long t1, long kvh, long h0, long nh) {
    const struct llb_attention_args *a = t->a;
    const long s = a->slots[t0];
    if (s < 0 || s >= a->n_slots) return;
    struct llb_attn_tile tile = llb_attn_tile_at(a, s, kvh, 0);
    for (long i = t0; i < t1; i++) {
        const long p = a->pos[i];
        if (p < 0 || p >= a->n_ctx) continue;
        for (long h = h0; h < h0 + nh; h++) {
            const long r = tile.n_rows++, row = i * a->n_heads + kvh * t->group + h;
            tile.q[r] = a->q + row * a->head_dim;
            tile.out[r] = a->out + row * a->head_dim;
            tile.lo[r] = llb_attn_first_key(a, p);
            tile.hi[r] = p;
        }
    }
    if (tile.n_rows) (a->cache_type == LLB_CACHE_F16 ? t->k->attend_tile_f16 : t->k->attend_tile_f32)(&tile);
}

/* A tile unit: its tokens in runs of equal slot; a run with too few rows to
 * fill half the lanes goes through the row kernel instead. */
static void tile_unit_run(const struct attn_task *t, long unit) {
    const struct llb_attention_args *a = t->a;
    const long per_tile = a->n_kv * t->passes, tile = t->n_tiles - 1 - unit / per_tile;
    const long kvh = unit % per_tile / t->passes, pass = unit % t->passes;
    const long h0 = pass * t->heads_per_pass;
    const long nh = t->group - h0 < t->heads_per_pass ? t->group - h0 : t->heads_per_pass;
    const long end = (tile + 1) * t->tile_tokens < a->n ? (tile + 1) * t->tile_tokens : a->n;
    for (long r0 = tile * t->tile_tokens, r1; r0 < end; r0 = r1) {
        for (r1 = r0 + 1; r1 < end && a->slots[r1] == a->slots[r0];) r1++;
        if ((r1 - r0) * nh * 2 >= t->k->lanes) {
            attend_tile(t, r0, r1, kvh, h0, nh);
        } else {
            for (long i = r0; i < r1; i++) attend_rows(t, i, kvh, h0, nh, llb_attn_first_key(a, a->pos[i]), a->pos[i], NULL, NULL);
        }
    }
}

static void attn_unit_run(const struct attn_task *t, long unit) {
    const struct llb_attention_args *a = t->a;
    if (t->mode == ATTN_TILES) {
        tile_unit_run(t, unit);
    } else if (t->mode == ATTN_SPLIT) {
        const long chunk = unit / a->n_kv, kvh = unit % a->n_kv;
        long i = 0;
        while (t->first_chunk[i + 1] <= chunk) i++;
        const long lo = llb_attn_first_key(a, a->pos[i]) + (chunk - t->first_chunk[i]) * ATTN_CHUNK;
        const long hi = lo + ATTN_CHUNK - 1 < a->pos[i] ? lo + ATTN_CHUNK - 1 : a->pos[i];
        float *out = t->parts + (size_t)unit * part_floats(t);
        attend_rows(t, i, kvh, 0, t->group, lo, hi, out, out + (size_t)t->group * (size_t)a->head_dim);
    } else {
        const long i = a->n - 1 - unit / a->n_kv, kvh = unit % a->n_kv;
        attend_rows(t, i, kvh, 0, t->group, llb_attn_first_key(a, a->pos[i]), a->pos[i], NULL, NULL);
    }
}

static void attn_task_run(void *ctx, int ith, int nth) {
    struct attn_task *t = ctx;
    for (;;) {
        const long unit = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (unit >= t->units) break;
        attn_unit_run(t, unit);
    }
}

/* Split mode: combine each (token, head)'s chunk partials into out. */
static void attn_merge_all(const struct attn_task *t) {
    const struct llb_attention_args *a = t->a;
    const size_t pf = part_floats(t), hd = (size_t)a->head_dim;
    for (long i = 0; i < a->n; i++) {
        const long n_parts = t->first_chunk[i + 1] - t->first_chunk[i];
        for (long h = 0; h < a->n_heads; h++) {
            const long kvh = h / t->group, g = h % t->group;
            const float *first = t->parts + (size_t)(t->first_chunk[i] * a->n_kv + kvh) * pf;
            t->k->attn_merge(first + g * hd, pf * a->n_kv, first + t->group * hd + 2 * g, pf * a->n_kv, n_parts,
                             a->head_dim, a->out + (i * a->n_heads + h) * hd);
        }
    }
}

/* Decide the schedule: split for few long rows, tiles when several tokens can
 * share a tile, rows otherwise. */
static void attn_plan(struct attn_task *t, long max_keys) {
    const struct llb_attention_args *a = t->a;
    t->mode = ATTN_ROWS;
    t->units = a->n * a->n_kv;
    if (a->n * a->n_kv < ATTN_SPLIT_MAX_ROWS && max_keys > ATTN_CHUNK) {
        t->first_chunk[0] = 0;
        for (long i = 0; i < a->n; i++) {
            const long keys = a->pos[i] - llb_attn_first_key(a, a->pos[i]) + 1;
            t->first_chunk[i + 1] = t->first_chunk[i] + (keys + ATTN_CHUNK - 1) / ATTN_CHUNK;
        }
        const long units = t->first_chunk[a->n] * a->n_kv;
        /* Ask for what the longest possible rows would need, so the scratch does not
         * grow (allocate) again as a decode's context grows; the exact need if that
         * is unreasonable. Scratch is per calling thread; without it, whole rows. */
        const long row_keys = a->window > 0 && a->window < a->n_ctx ? a->window : a->n_ctx;
        const size_t unit_bytes = part_floats(t) * sizeof(float);
        size_t bytes = (size_t)a->n * (size_t)((row_keys + ATTN_CHUNK - 1) / ATTN_CHUNK) * (size_t)a->n_kv * unit_bytes;
        if (bytes > ATTN_SCRATCH_MAX) bytes = (size_t)units * unit_bytes;
        t->parts = llb_scratch(bytes);
        if (t->parts) {
            t->mode = ATTN_SPLIT;
            t->units = units;
        }
        return;
    }
    const long lanes = t->k->lanes;
    if (lanes < 8 || a->n < 2) return;
    t->heads_per_pass = t->group < lanes ? t->group : lanes;
    t->passes = (t->group + lanes - 1) / lanes;
    t->tile_tokens = lanes / t->heads_per_pass;
    if (t->tile_tokens * t->heads_per_pass * 2 < lanes) return; /* tiles would be under half full */
    t->mode = ATTN_TILES;
    t->n_tiles = (a->n + t->tile_tokens - 1) / t->tile_tokens;
    t->units = t->n_tiles * a->n_kv * t->passes;
}

void llb_attention(const struct llb_attention_args *a) {
    /* Without its scratch (out of memory) the invariant schedule gives way to these: still
     * correct, no longer independent of the batch. */
    if (llb_batch_invariant && llb_attention_invariant(a) == 0) return;
    struct attn_task t = {.a = a, .k = llb_op_kernels_current(), .group = a->n_heads / a->n_kv};
    atomic_init(&t.next, 0);
    double macs = 0; /* q.k and p.v multiply-adds, to decide whether to split */
    long max_keys = 0;
    for (long i = 0; i < a->n; i++) {
        const long keys = a->pos[i] - llb_attn_first_key(a, a->pos[i]) + 1;
        macs += (double)keys;
        if (keys > max_keys) max_keys = keys;
    }
    macs *= 2.0 * (double)a->n_heads * (double)a->head_dim;
    attn_plan(&t, max_keys);
    if (t.units < 2 || macs < PAR_MIN_ATTN_MACS || llb_pool_threads() == 1) {
        for (long unit = 0; unit < t.units; unit++) attn_unit_run(&t, unit);
    } else {
        llb_parallel(attn_task_run, &t);
    }
    if (t.mode == ATTN_SPLIT) attn_merge_all(&t);
}

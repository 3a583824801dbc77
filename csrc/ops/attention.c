/* Attention: llb_attention over the KV cache, its schedules and the per-ISA
 * kernels of ops/kernels/attention.inc. One module, dependencies one way:
 * the shared helpers, then the default schedules, then the batch-invariant
 * schedule (llb_batch_invariant set: the server), then the entry point. */
#include <stdint.h>

#include "core/alloc.h"
#include "core/env.h"
#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"
#include "ops/kernels/kernels.h"
#include "ops/ops.h"

/* ---- shared by both schedule families -------------------------------------- */

#define ATTN_CHUNK 256           /* keys per chunk when a row is split */
#define PAR_MIN_ATTN_MACS 65536 /* below this many multiply-adds, one thread */

/* The first key a query at position p reads (sliding window). */
static inline long first_key(const struct llb_attention_args *a, long p) {
    return a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
}

/* Keys row i reads, and the ATTN_CHUNK chunks they make when the row is split. */
static inline long row_keys(const struct llb_attention_args *a, long i) {
    return llb_attn_last_key(a, i) - first_key(a, a->pos[i]) + 1;
}
static inline long row_chunks(const struct llb_attention_args *a, long i) {
    return (row_keys(a, i) + ATTN_CHUNK - 1) / ATTN_CHUNK;
}

/* Keys of row i's chunk c: [*lo, *hi]. */
static void chunk_keys(const struct llb_attention_args *a, long i, long c, long *lo, long *hi) {
    const long last = llb_attn_last_key(a, i);
    *lo = first_key(a, a->pos[i]) + c * ATTN_CHUNK;
    *hi = *lo + ATTN_CHUNK - 1 < last ? *lo + ATTN_CHUNK - 1 : last;
}

/* Chunks of the longest row the cache (or window) allows: scratch asked for that does
 * not grow (allocate) again as a decode's context grows. */
static long max_row_chunks(const struct llb_attention_args *a) {
    const long keys = a->window > 0 && a->window < a->n_ctx ? a->window : a->n_ctx;
    long most = (keys + ATTN_CHUNK - 1) / ATTN_CHUNK;
    if (a->kend) /* a window's row that sees its image block past its position may read more */
        for (long i = 0; i < a->n; i++) most = row_chunks(a, i) > most ? row_chunks(a, i) : most;
    return most;
}

/* Floats of one chunk partial of a kv head: group rows of unnormalised sums, then group (max, sum) pairs. */
static size_t part_floats(const struct llb_attention_args *a, long group) {
    return (size_t)group * (size_t)a->head_dim + 2 * (size_t)group;
}

/* Whether rows [i0, i1) (units of work, or of heads where units may be cut by heads) are worth a
 * fork/join: count the q.k and p.v multiply-adds. */
static int worth_forking(const struct llb_attention_args *a, long i0, long i1, long units) {
    double macs = 0;
    for (long i = i0; i < i1; i++) macs += (double)row_keys(a, i);
    macs *= 2.0 * (double)a->n_heads * (double)a->head_dim;
    return units >= 2 && macs >= PAR_MIN_ATTN_MACS && llb_pool_threads() > 1;
}

/* Whether `tokens` consecutive tokens' nh heads of a kv head go through a tile (query rows in
 * lanes) rather than the row kernel (same bits either way): at least half a vector of rows, and a
 * lone token only with 8 heads or more. A lone token's heads under that take the row kernel, which
 * converts each K/V vector once in registers for all of them; as a tile on AVX2 (8 lanes) they ran
 * at a quarter of its speed (decode at depth in the batch-invariant schedule). On AVX-512 such a
 * token never filled half a vector, so nothing changes there. */
static inline int tile_worth(long lanes, long tokens, long nh) {
    return (tokens > 1 || nh >= 8) && tokens * nh * 2 >= lanes;
}

/* Token i's heads, normalised into a->out from its n_parts chunk partials: chunk-major, then
 * kv head, pf floats each, from parts. */
static void merge_token(const struct llb_attention_args *a, const struct llb_op_kernels *k, long group, size_t pf,
                        const float *parts, long n_parts, long i) {
    const size_t hd = (size_t)a->head_dim, stride = pf * (size_t)a->n_kv;
    for (long h = 0; h < a->n_heads; h++) {
        const long kvh = h / group, g = h % group;
        const float *first = parts + (size_t)kvh * pf;
        k->attn_merge(first + g * hd, stride, first + group * hd + 2 * g, stride, n_parts, a->head_dim,
                      a->out + (i * a->n_heads + h) * hd);
    }
}

/* Units [0, units) of a schedule, claimed one at a time from the pool (grain 1) so that
 * uneven causal rows balance over the threads. run does heads [h0, h0 + nh) of a unit (a kv
 * head's `group` query heads); by_heads: the units go through the row kernel, so they may be cut
 * by heads (else run is always given all of a unit's). */
struct unit_queue {
    void (*run)(const void *task, long unit, long h0, long nh);
    const void *task;
    long group;
    int by_heads;
};

static void queue_task(void *ctx, long b, long e, int tid) {
    (void)tid;
    const struct unit_queue *q = ctx;
    for (long unit = b; unit < e; unit++) q->run(q->task, unit, 0, q->group);
}

/* Items [b, e) of the units' heads flattened (unit-major): each unit's run of them in one call. */
static void heads_task(void *ctx, long b, long e, int tid) {
    (void)tid;
    const struct unit_queue *q = ctx;
    for (long unit = b / q->group; unit * q->group < e; unit++) {
        const long h0 = b > unit * q->group ? b - unit * q->group : 0;
        const long h1 = e < (unit + 1) * q->group ? e - unit * q->group : q->group;
        q->run(q->task, unit, h0, h1 - h0);
    }
}

/* Fewer units than two per thread that do not share evenly (a decode token's 3 kv heads on 2
 * threads: one thread ran two, the other one) are cut by query heads instead, a contiguous run
 * of about the same number for each thread. The row kernel sums each head alone: the same bits
 * however a unit's heads are grouped, so this may follow the thread count. */
static void run_units(const struct unit_queue *q, long units, int parallel) {
    const long threads = parallel && q->by_heads ? llb_pool_call_threads() : 1;
    if (threads > 1 && units < 2 * threads && units % threads) {
        const long items = units * q->group;
        llb_parallel_for(heads_task, (void *)q, items, (items + threads - 1) / threads, (int)threads);
    } else if (parallel) llb_parallel_for(queue_task, (void *)q, units, 1, LLB_POOL_MAX_THREADS);
    else
        for (long unit = 0; unit < units; unit++) q->run(q->task, unit, 0, q->group);
}

/* Byte offset of kv head kvh's first key of slot s in the caches. */
static inline size_t cache_base(const struct llb_attention_args *a, long s, long kvh) {
    return llb_cache_bytes(a->cache_type, llb_kv_elem(a->n_kv, a->n_ctx, a->head_dim, s, kvh, 0));
}

/* Slot s's key base for kv head kvh (Q8_0 caches stored with bases), or NULL. */
static inline const float *key_base(const struct llb_attention_args *a, long s, long kvh) {
    if (!a->kbase || a->cache_type != LLB_CACHE_Q8_0) return NULL;
    return a->kbase + ((size_t)s * (size_t)a->n_kv + (size_t)kvh) * (size_t)a->head_dim;
}

/* The kernels for the cache's element type. */
static inline void attend_kernel(const struct llb_op_kernels *k, int type, const struct llb_attn_unit *u) {
    (type == LLB_CACHE_Q8_0 ? k->attend_q8_0 : type == LLB_CACHE_F16 ? k->attend_f16 : k->attend_f32)(u);
}
static inline void tile_kernel(const struct llb_op_kernels *k, int type, const struct llb_attn_tile *t, long n) {
    (type == LLB_CACHE_Q8_0 ? k->attend_tile_q8_0 : type == LLB_CACHE_F16 ? k->attend_tile_f16 : k->attend_tile_f32)(t, n);
}

/* A tile over slot s's keys of kv head kvh; row_order 1: sum like the row kernel (invariant mode). */
static inline struct llb_attn_tile tile_at(const struct llb_attention_args *a, long s, long kvh, int row_order) {
    const size_t base = cache_base(a, s, kvh);
    const struct llb_attn_tile tile = {
        .k = (const char *)a->kcache + base,
        .v = (const char *)a->vcache + base,
        .stride = (size_t)a->head_dim, /* one kv head's rows (llb_kv_elem) */
        .head_dim = a->head_dim,
        .scale = a->scale,
        .softcap = a->softcap,
        .row_order = row_order,
        .kbase = key_base(a, s, kvh),
    };
    return tile;
}

/* The decode kernel's K/V prefetch on AMD (llb_isa_far_stream): into L2 only, this far ahead in bytes
 * of one stream's rows; 0 elsewhere. */
static long attn_pf_far(void) {
    static long bytes = -1;
    if (bytes < 0) bytes = llb_isa_far_stream() ? llb_env_long("LLAMBDA_ATT_PF_FAR", 16384, 0, 1 << 20) : 0;
    return bytes;
}

/* The unit a thread likely runs after the current one (a split row's chunks, which it claims in
 * order): token i's keys lo..hi of kv head kvh, for the kernel to prefetch ahead; i < 0: none. */
struct next_unit {
    long i, kvh, lo, hi;
};

/* Keys lo..hi of token i's heads [h0, h0 + nh) of kv head kvh through the row kernel: normalised
 * into a->out (out NULL), or the partial into out (nh rows of sums) and ml (nh (max, sum) pairs). */
static void attend_rows_next(const struct llb_attention_args *a, const struct llb_op_kernels *k, long i, long kvh,
                             long h0, long nh, long lo, long hi, float *out, float *ml, struct next_unit nx) {
    const long s = a->slots[i];
    if (s < 0 || s >= a->n_slots || hi < 0 || hi >= a->n_ctx) return; /* validated by the caller; never read outside */
    const size_t base = cache_base(a, s, kvh);
    const long row = i * a->n_heads + kvh * (a->n_heads / a->n_kv) + h0; /* first query row */
    struct llb_attn_unit u = {
        .q = a->q + row * a->head_dim,
        .k = (const char *)a->kcache + base,
        .v = (const char *)a->vcache + base,
        .stride = (size_t)a->head_dim, /* one kv head's rows (llb_kv_elem) */
        .lo = lo,
        .hi = hi,
        .head_dim = a->head_dim,
        .group = nh,
        .scale = a->scale,
        .softcap = a->softcap,
        .out = out ? out : a->out + row * a->head_dim,
        .ml = ml,
        .kbase = key_base(a, s, kvh),
        .pf_far = attn_pf_far(),
    };
    const long s2 = nx.i >= 0 && nx.i < a->n ? a->slots[nx.i] : -1;
    if (s2 >= 0 && s2 < a->n_slots && nx.lo >= 0 && nx.lo <= nx.hi && nx.hi < a->n_ctx) {
        const size_t b2 = cache_base(a, s2, nx.kvh), first = llb_cache_bytes(a->cache_type, (size_t)nx.lo * u.stride);
        u.next_k = (const char *)a->kcache + b2 + first;
        u.next_v = (const char *)a->vcache + b2 + first;
        u.next_n = nx.hi - nx.lo + 1;
    }
    attend_kernel(k, a->cache_type, &u);
}

static void attend_rows(const struct llb_attention_args *a, const struct llb_op_kernels *k, long i, long kvh, long h0,
                        long nh, long lo, long hi, float *out, float *ml) {
    attend_rows_next(a, k, i, kvh, h0, nh, lo, hi, out, ml, (struct next_unit){.i = -1});
}

/* ---- default schedules ------------------------------------------------------ */

/* Three schedules, chosen from the arguments only (never from the thread
 * count, so results are identical for any number of threads; with
 * llb_batch_invariant set, the batch-invariant schedule below instead):
 *  - tiles (prefill): units are (a few consecutive tokens, kv head, pass over
 *    its heads) holding up to LLB_TILE_VECS vectors of query rows in vector lanes
 *    (GQA 6 on AVX-512: 8 tokens x 6 heads, 3 vectors sharing each K/V read);
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
    /* tiles: tile_tokens tokens x heads_per_pass heads per tile, LLB_TILE_GROUP tiles per unit */
    long tile_tokens, heads_per_pass, passes, n_groups;
    /* split: token i's chunks are units [first_chunk[i] * n_kv, first_chunk[i+1] * n_kv) */
    long first_chunk[ATTN_SPLIT_MAX_ROWS + 1];
    float *parts; /* split: per unit, a partial of part_floats() */
};

/* Tokens [t0, t1) of one slot, heads [h0, h0 + nh) of kv head kvh, as one tile; returns its rows. */
static long fill_tile(const struct attn_task *t, struct llb_attn_tile *tile, long t0, long t1, long kvh, long h0, long nh) {
    const struct llb_attention_args *a = t->a;
    const long s = a->slots[t0];
    if (s < 0 || s >= a->n_slots) return 0;
    *tile = tile_at(a, s, kvh, 0);
    for (long i = t0; i < t1; i++) {
        const long p = a->pos[i];
        if (p < 0 || p >= a->n_ctx) continue;
        for (long h = h0; h < h0 + nh; h++) {
            const long r = tile->n_rows++, row = i * a->n_heads + kvh * t->group + h;
            tile->q[r] = a->q + row * a->head_dim;
            tile->out[r] = a->out + row * a->head_dim;
            tile->lo[r] = first_key(a, p);
            tile->hi[r] = llb_attn_last_key(a, i);
        }
    }
    return tile->n_rows;
}

/* A tile unit: up to LLB_TILE_GROUP tiles of tile_tokens consecutive tokens of one slot, which
 * the kernel runs through each block of keys together; a run of a slot's tokens with too few
 * rows to fill half a vector goes through the row kernel instead. */
static void tile_unit_run(const struct attn_task *t, long unit) {
    const struct llb_attention_args *a = t->a;
    const long per_group = a->n_kv * t->passes, group = t->n_groups - 1 - unit / per_group;
    const long kvh = unit % per_group / t->passes, pass = unit % t->passes;
    const long h0 = pass * t->heads_per_pass;
    const long nh = t->group - h0 < t->heads_per_pass ? t->group - h0 : t->heads_per_pass;
    const long span = t->tile_tokens * LLB_TILE_GROUP, start = group * span;
    const long end = start + span < a->n ? start + span : a->n;
    struct llb_attn_tile tiles[LLB_TILE_GROUP];
    long nt = 0;
    for (long r0 = start, r1; r0 < end; r0 = r1) {
        for (r1 = r0 + 1; r1 < end && r1 - r0 < t->tile_tokens && a->slots[r1] == a->slots[r0];) r1++;
        if (nt && a->slots[r0] != a->slots[r0 - 1]) { /* the tiles of one call share a slot's cache */
            tile_kernel(t->k, a->cache_type, tiles, nt);
            nt = 0;
        }
        if (tile_worth(t->k->lanes, r1 - r0, nh)) {
            nt += fill_tile(t, &tiles[nt], r0, r1, kvh, h0, nh) > 0;
        } else {
            for (long i = r0; i < r1; i++)
                attend_rows(t->a, t->k, i, kvh, h0, nh, first_key(a, a->pos[i]), llb_attn_last_key(a, i), NULL, NULL);
        }
    }
    if (nt) tile_kernel(t->k, a->cache_type, tiles, nt);
}

/* Heads [h0, h0 + nh) of a rows or split unit (a tile unit: all of it). */
static void attn_unit_heads(const void *task, long unit, long h0, long nh) {
    const struct attn_task *t = task;
    const struct llb_attention_args *a = t->a;
    if (t->mode == ATTN_TILES) {
        tile_unit_run(t, unit);
    } else if (t->mode == ATTN_SPLIT) {
        const long chunk = unit / a->n_kv, kvh = unit % a->n_kv;
        long i = 0;
        while (t->first_chunk[i + 1] <= chunk) i++;
        long lo, hi;
        chunk_keys(a, i, chunk - t->first_chunk[i], &lo, &hi);
        float *out = t->parts + (size_t)unit * part_floats(a, t->group);
        struct next_unit nx = {.i = -1};
        if (unit + 1 < t->units) { /* units are claimed in order */
            const long c2 = (unit + 1) / a->n_kv;
            nx.i = i + (t->first_chunk[i + 1] <= c2), nx.kvh = (unit + 1) % a->n_kv;
            chunk_keys(a, nx.i, c2 - t->first_chunk[nx.i], &nx.lo, &nx.hi);
        }
        attend_rows_next(t->a, t->k, i, kvh, h0, nh, lo, hi, out + (size_t)h0 * (size_t)a->head_dim,
                         out + (size_t)t->group * (size_t)a->head_dim + 2 * h0, nx);
    } else {
        const long i = a->n - 1 - unit / a->n_kv, kvh = unit % a->n_kv;
        attend_rows(t->a, t->k, i, kvh, h0, nh, first_key(a, a->pos[i]), llb_attn_last_key(a, i), NULL, NULL);
    }
}

/* Split mode: combine each (token, head)'s chunk partials into out. */
static void attn_merge_all(const struct attn_task *t) {
    const struct llb_attention_args *a = t->a;
    const size_t pf = part_floats(a, t->group);
    for (long i = 0; i < a->n; i++)
        merge_token(a, t->k, t->group, pf, t->parts + (size_t)(t->first_chunk[i] * a->n_kv) * pf,
                    t->first_chunk[i + 1] - t->first_chunk[i], i);
}

/* Decide the schedule: split for few long rows, tiles when several tokens can
 * share a tile, rows otherwise. */
static void attn_plan(struct attn_task *t, long max_keys) {
    const struct llb_attention_args *a = t->a;
    t->mode = ATTN_ROWS;
    t->units = a->n * a->n_kv;
    if (a->n * a->n_kv < ATTN_SPLIT_MAX_ROWS && max_keys > ATTN_CHUNK) {
        t->first_chunk[0] = 0;
        for (long i = 0; i < a->n; i++) t->first_chunk[i + 1] = t->first_chunk[i] + row_chunks(a, i);
        const long units = t->first_chunk[a->n] * a->n_kv;
        /* Ask for what the longest possible rows would need (max_row_chunks); the exact need
         * if that is unreasonable. Scratch is per calling thread; without it, whole rows. */
        const size_t unit_bytes = part_floats(a, t->group) * sizeof(float);
        size_t bytes = (size_t)a->n * (size_t)max_row_chunks(a) * (size_t)a->n_kv * unit_bytes;
        if (bytes > ATTN_SCRATCH_MAX) bytes = (size_t)units * unit_bytes;
        t->parts = llb_scratch(bytes);
        if (t->parts) {
            t->mode = ATTN_SPLIT;
            t->units = units;
        }
        return;
    }
    const long lanes = t->k->lanes, rows = lanes * LLB_TILE_VECS; /* a tile: up to LLB_TILE_VECS vectors of rows */
    if (lanes < 8 || a->n < 2) return;
    t->heads_per_pass = t->group < rows ? t->group : rows;
    t->passes = (t->group + rows - 1) / rows;
    t->tile_tokens = rows / t->heads_per_pass;
    if (t->tile_tokens * t->heads_per_pass * 2 < lanes) return; /* tiles would be under half a vector */
    t->mode = ATTN_TILES;
    t->n_groups = (a->n + t->tile_tokens * LLB_TILE_GROUP - 1) / (t->tile_tokens * LLB_TILE_GROUP);
    t->units = t->n_groups * a->n_kv * t->passes;
}

/* ---- the batch-invariant schedule ------------------------------------------- */

/* The batch-invariant attention schedule (llb_batch_invariant set: the server).
 *
 * A query row's output must not depend on the other rows of the call, on how
 * its prompt was cut into chunks, or on the thread count. So every row is cut
 * the same way whatever else is in the call, from its own key count only: keys
 * in ATTN_CHUNK chunks from its first key, each chunk an online softmax in
 * blocks from the chunk's start, the chunk partials merged in chunk order (a
 * row of one chunk is normalised directly). The two kernels add up a chunk in
 * the same order (attend_tile's row_order, see ops/kernels/attention.inc), so a run of
 * tokens of one slot may share tiles when they share a first key (the blocks
 * then start at the same key) while a lone row takes the row kernel: same bits.
 * The tiles hold up to LLB_TILE_VECS vectors of rows, an item's (token, head) rows
 * packed into them in order (0.5B's 7 heads a token fill 24 AVX2 lanes, not 21), and up
 * to LLB_INV_TILE_GROUP of them go through each converted block of a chunk's keys (as
 * many as the kernel's state holds: 8 at head_dim 64, 4 at 128).
 *
 * Rows go in passes whose partials fit the scratch; the pass a row falls in
 * changes nothing for it. Within a pass, items are runs of tiles (up to item_tokens
 * tokens; units: kv head x pass over its heads, each through all the rows' chunks, merged
 * in the kernel from its transposed partials: no partial leaves the tile in rows) or lone
 * rows (units: chunk x kv head, merged after the pass), handed out from the last (most
 * keys) first. */
#define INV_PASS_BYTES ((size_t)16 << 20) /* partials of one pass (more only if one row needs more) */

struct inv_task {
    const struct llb_attention_args *a;
    const struct llb_op_kernels *k;
    long group;
    size_t pf;                                /* floats of one partial: group rows of sums, group (max, sum) */
    /* an item of tiles: up to item_tokens tokens x heads_per_pass heads, their rows packed into
     * up to LLB_INV_TILE_GROUP tiles of tile_rows; item_tokens 0: no tiles */
    long item_tokens, tile_rows, heads_per_pass, passes;
    long full_tokens; /* the fewest tokens whose rows fill whole tiles */
    /* the pass: items [0, n_items) over rows [r0, r1) */
    long r0, r1, n_items, units;
    long *item_row;   /* an item's first row */
    long *item_rows;  /* its rows (a run of tiles), or 0 (a lone row) */
    long *first_unit; /* n_items + 1: item k's units are [first_unit[k], first_unit[k + 1]) */
    long *first_part; /* per row of the call: its first partial in the pass (chunk-major, then kv head), -1: direct */
    long *item_part;  /* an item of tiles: the first partial of its units' merge areas, -1: none */
    long *item_area;  /* floats of each of those units' areas */
    float *parts;
};

/* Every chunk of an item's rows [i0, i0 + n), heads [h0, h0 + nh) of kv head kvh: the (token, head)
 * rows packed into tiles of tile_rows (a token's heads may straddle two: every lane sums alone), up
 * to LLB_INV_TILE_GROUP tiles through each converted block of keys, Q transposed once; a row of
 * several chunks has their partials merged in the kernel, in the unit's area `merge`. */
static void run_tiles(const struct inv_task *t, long i0, long n, long kvh, long h0, long nh, float *merge) {
    const struct llb_attention_args *a = t->a;
    const long s = a->slots[i0];
    if (s < 0 || s >= a->n_slots) return;
    struct llb_attn_tile tiles[LLB_INV_TILE_GROUP];
    long nt = 0;
    for (long i = i0; i < i0 + n; i++) {
        if (a->pos[i] < 0 || a->pos[i] >= a->n_ctx || row_chunks(a, i) <= 0) continue; /* validated by the caller */
        long lo, hi, lo1;
        chunk_keys(a, i, 0, &lo, &hi);
        chunk_keys(a, i, row_chunks(a, i) - 1, &lo1, &hi);
        for (long h = h0; h < h0 + nh; h++) {
            if (!nt || tiles[nt - 1].n_rows == t->tile_rows) { /* a new tile */
                if (nt == LLB_INV_TILE_GROUP) { /* not with item_tokens' rows; a call holds no more */
                    tile_kernel(t->k, a->cache_type, tiles, nt);
                    nt = 0;
                }
                tiles[nt] = tile_at(a, s, kvh, 1);
                tiles[nt].chunk = ATTN_CHUNK;
                tiles[nt].merge = merge;
                nt++;
            }
            struct llb_attn_tile *tile = &tiles[nt - 1];
            const long r = tile->n_rows++, row = i * a->n_heads + kvh * t->group + h;
            tile->q[r] = a->q + row * a->head_dim;
            tile->out[r] = a->out + row * a->head_dim;
            tile->lo[r] = lo;
            tile->hi[r] = hi;
        }
    }
    if (nt) tile_kernel(t->k, a->cache_type, tiles, nt);
}

/* Item k's first merge area (64-byte aligned within its partials). */
static float *merge_area(const struct inv_task *t, long k) {
    const uintptr_t p = (uintptr_t)(t->parts + (size_t)t->item_part[k] * t->pf);
    return (float *)((p + 63) & ~(uintptr_t)63);
}

/* Heads [h0, h0 + nh) of a unit (a unit of tiles: all of it). */
static void run_unit_heads(const void *task, long unit, long h0, long nh) {
    const struct inv_task *t = task;
    const struct llb_attention_args *a = t->a;
    unit = t->units - 1 - unit;
    long lo = 0, hi = t->n_items - 1; /* the item holding the unit: the last k with first_unit[k] <= unit */
    while (lo < hi) {
        const long mid = (lo + hi + 1) / 2;
        if (t->first_unit[mid] <= unit) lo = mid;
        else hi = mid - 1;
    }
    const long i = t->item_row[lo], u = unit - t->first_unit[lo];
    if (t->item_rows[lo]) { /* units: kv head x pass over its heads */
        const long kvh = u / t->passes, th0 = u % t->passes * t->heads_per_pass;
        float *merge = t->item_part[lo] < 0 ? NULL : merge_area(t, lo) + (size_t)u * (size_t)t->item_area[lo];
        run_tiles(t, i, t->item_rows[lo], kvh, th0,
                  t->group - th0 < t->heads_per_pass ? t->group - th0 : t->heads_per_pass, merge);
        return;
    }
    const long c = u / a->n_kv, kvh = u % a->n_kv;
    long k0, k1;
    chunk_keys(a, i, c, &k0, &k1);
    struct next_unit nx = {.i = -1}; /* units go from the last: the next is the row's u - 1 */
    if (u > 0) {
        nx.i = i, nx.kvh = (u - 1) % a->n_kv;
        chunk_keys(a, i, (u - 1) / a->n_kv, &nx.lo, &nx.hi);
    }
    if (t->first_part[i] < 0) {
        attend_rows_next(a, t->k, i, kvh, h0, nh, k0, k1, NULL, NULL, nx);
    } else {
        float *part = t->parts + (size_t)(t->first_part[i] + u) * t->pf;
        attend_rows_next(a, t->k, i, kvh, h0, nh, k0, k1, part + (size_t)h0 * (size_t)a->head_dim,
                         part + (size_t)t->group * (size_t)a->head_dim + 2 * h0, nx);
    }
}

/* Rows [i0, i1) of the pass: their chunk partials merged into out, in chunk order. */
static void merge_rows(const struct inv_task *t, long i0, long i1) {
    for (long i = i0; i < i1; i++)
        if (t->first_part[i] >= 0)
            merge_token(t->a, t->k, t->group, t->pf, t->parts + (size_t)t->first_part[i] * t->pf, row_chunks(t->a, i), i);
}

static void merge_task(void *ctx, long i0, long i1, int tid) {
    (void)tid;
    const struct inv_task *t = ctx;
    merge_rows(t, t->r0 + i0, t->r0 + i1);
}

/* Rows from i that may share an item's tiles with row i (same slot and first key, at most
 * item_tokens). */
static long tile_run(const struct inv_task *t, long i) {
    const struct llb_attention_args *a = t->a;
    const long fk = first_key(a, a->pos[i]), most = t->item_tokens;
    long j = i + 1;
    while (j < a->n && j - i < most && a->slots[j] == a->slots[i] && first_key(a, a->pos[j]) == fk) j++;
    return j - i;
}

/* Partials of row i (chunk x kv head), or 0: a row of one chunk is normalised directly. */
static size_t row_parts(const struct llb_attention_args *a, long i) {
    const long chunks = row_chunks(a, i);
    return chunks > 1 ? (size_t)(chunks * a->n_kv) : 0;
}

/* Floats of the merge area of one unit of an item of `rows` tokens whose rows have up to `chunks`
 * chunks (attn_tile's merge: its tiles' chunk partials, transposed), or 0: none needed. */
static size_t unit_area(const struct inv_task *t, long rows, long chunks) {
    const size_t tiles = (size_t)((rows * t->heads_per_pass + t->tile_rows - 1) / t->tile_rows);
    const size_t floats = tiles * (size_t)chunks * (size_t)(t->a->head_dim + 2) * (size_t)t->tile_rows;
    return chunks > 1 ? (floats + 15) & ~(size_t)15 : 0;
}

/* Partials (of pf floats) the merge areas of an item's units take, with 64 bytes to align them. */
static size_t area_parts(const struct inv_task *t, long rows, long chunks) {
    const size_t floats = unit_area(t, rows, chunks) * (size_t)(t->a->n_kv * t->passes);
    return floats ? (floats + 16 + t->pf - 1) / t->pf : 0;
}

/* The most chunks of rows [i, i + rows). */
static long most_chunks(const struct llb_attention_args *a, long i, long rows) {
    long most = 0;
    for (long j = i; j < i + rows; j++) most = row_chunks(a, j) > most ? row_chunks(a, j) : most;
    return most;
}

/* Lays out the pass starting at row r0, with at most cap partials (at least one row's); returns its end.
 * An item whose partials do not all fit starts the next pass, unless it is the pass's first: then
 * it keeps the rows that fit. */
static long plan_pass(struct inv_task *t, long r0, size_t cap) {
    const struct llb_attention_args *a = t->a;
    size_t n_parts = 0;
    long i = r0, units = 0;
    t->n_items = 0;
    while (i < a->n) {
        long rows = t->item_tokens ? tile_run(t, i) : 1;
        int tile = t->item_tokens && tile_worth(t->k->lanes, rows, t->heads_per_pass);
        if (tile) {
            long fit = rows;
            while (fit > 0 && n_parts + area_parts(t, fit, most_chunks(a, i, fit)) > cap) fit--;
            if (fit < rows && t->n_items) break; /* the next pass */
            /* A first item cut by the cap keeps whole tiles: 42 tokens of 6 heads made 5 tiles of
             * 48 rows and one of 12, which costs a full one. */
            if (fit < rows && fit > t->full_tokens) fit -= fit % t->full_tokens;
            rows = fit > 0 ? fit : 1; /* cap holds one token's tiles */
            tile = tile_worth(t->k->lanes, rows, t->heads_per_pass);
        }
        if (!tile) {
            rows = 1;
            if (n_parts + row_parts(a, i) > cap && t->n_items) break; /* cap holds one row's partials */
        }
        const long chunks_max = most_chunks(a, i, rows);
        t->item_part[t->n_items] = -1;
        if (tile) {
            for (long j = i; j < i + rows; j++) t->first_part[j] = -1; /* merged in the kernel */
            if (chunks_max > 1) {
                t->item_part[t->n_items] = (long)n_parts;
                t->item_area[t->n_items] = (long)unit_area(t, rows, chunks_max);
                n_parts += area_parts(t, rows, chunks_max);
            }
        } else {
            t->first_part[i] = chunks_max > 1 ? (long)n_parts : -1;
            n_parts += row_parts(a, i);
        }
        t->item_row[t->n_items] = i;
        t->item_rows[t->n_items] = tile ? rows : 0;
        t->first_unit[t->n_items] = units;
        units += tile ? a->n_kv * t->passes : chunks_max * a->n_kv;
        t->n_items++;
        i += rows;
    }
    t->first_unit[t->n_items] = units;
    t->units = units;
    return i;
}

/* Tokens per item of tiles: at most `most`, fewer when the call's rows would make too few units to
 * share over the threads (SmolLM2's 128-token prefill was one item, 3 kv heads' units on 2 threads:
 * one thread ran two). Whole tiles (multiples of full), from ATT_UNITS_PER_THREAD units a thread. An
 * item's rows sum as they would in any other item (row order), so this changes no bits. */
#define ATT_UNITS_PER_THREAD 4
static long balanced_item_tokens(const struct llb_attention_args *a, long most, long full, long passes) {
    const long threads = llb_pool_call_threads(), per_item = a->n_kv * passes;
    if (threads < 2) return most;
    const long items = (ATT_UNITS_PER_THREAD * threads + per_item - 1) / per_item;
    long tokens = (a->n + items - 1) / items;
    tokens = (tokens + full - 1) / full * full;
    return tokens < most ? tokens : most;
}

static int attention_invariant(const struct llb_attention_args *a) {
    struct inv_task t = {.a = a, .k = llb_op_kernels_current(), .group = a->n_heads / a->n_kv};
    t.pf = part_floats(a, t.group);
    const long lanes = t.k->lanes;
    if (lanes >= 8) { /* tiles: up to LLB_TILE_VECS vectors of rows, tokens x heads; more heads go in passes */
        const long rows = lanes * LLB_TILE_VECS;
        t.heads_per_pass = t.group < rows ? t.group : rows;
        t.passes = (t.group + rows - 1) / rows;
        t.tile_rows = rows;
        t.item_tokens = LLB_INV_TILE_GROUP * rows / t.heads_per_pass;
        long g = rows, h = t.heads_per_pass; /* full_tokens = rows / gcd(rows, heads_per_pass) */
        while (h) {
            const long r = g % h;
            g = h, h = r;
        }
        t.full_tokens = rows / g;
        t.item_tokens = balanced_item_tokens(a, t.item_tokens, t.full_tokens, t.passes);
    }
    /* Scratch: the index arrays, then the partials of one pass, for rows as long as the
     * context allows (max_row_chunks), capped. */
    const long max_chunks = max_row_chunks(a);
    const size_t row_parts = max_chunks > 1 ? (size_t)(max_chunks * a->n_kv) : 0, part_bytes = t.pf * sizeof(float);
    /* the rows' partials, plus the tiles' padding (at most an item's worth) */
    size_t cap = (size_t)a->n * row_parts + (t.item_tokens ? area_parts(&t, t.item_tokens, max_chunks) : 0);
    if (cap * part_bytes > INV_PASS_BYTES) cap = INV_PASS_BYTES / part_bytes > row_parts ? INV_PASS_BYTES / part_bytes : row_parts;
    if (t.item_tokens && cap < area_parts(&t, 1, max_chunks)) cap = area_parts(&t, 1, max_chunks); /* one token's tiles */
    const size_t index_bytes = ((size_t)(6 * a->n + 1) * sizeof(long) + 63) & ~(size_t)63;
    char *scratch = llb_scratch(index_bytes + cap * part_bytes);
    if (!scratch) return -1;
    t.first_part = (long *)scratch;
    t.item_row = t.first_part + a->n;
    t.item_rows = t.item_row + a->n;
    t.first_unit = t.item_rows + a->n;
    t.item_part = t.first_unit + a->n + 1;
    t.item_area = t.item_part + a->n;
    t.parts = (float *)(scratch + index_bytes);

    for (long r0 = 0; r0 < a->n; r0 = t.r1) {
        t.r0 = r0;
        t.r1 = plan_pass(&t, r0, cap);
        /* a lone row's units (no tiles) may be cut by heads */
        const int heads = t.n_items == 1 && !t.item_rows[0];
        const struct unit_queue q = {.run = run_unit_heads, .task = &t, .group = t.group, .by_heads = heads};
        const int parallel = worth_forking(a, t.r0, t.r1, heads ? t.units * t.group : t.units);
        run_units(&q, t.units, parallel);
        if (parallel && t.r1 - t.r0 > 1)
            llb_parallel_for(merge_task, &t, t.r1 - t.r0, llb_grain(t.r1 - t.r0, 16, 1, 1), LLB_POOL_MAX_THREADS);
        else merge_rows(&t, t.r0, t.r1);
    }
    return 0;
}

void llb_attention(const struct llb_attention_args *a) {
    if (a->n_kv < 1 || a->n_heads % a->n_kv || (a->cache_type == LLB_CACHE_Q8_0 && a->head_dim % LLB_Q8_0_BLOCK))
        return; /* the binding refuses these */
    /* Without its scratch (out of memory) the invariant schedule gives way to these: still
     * correct, no longer independent of the batch. */
    if (llb_batch_invariant && attention_invariant(a) == 0) return;
    struct attn_task t = {.a = a, .k = llb_op_kernels_current(), .group = a->n_heads / a->n_kv};
    long max_keys = 0;
    for (long i = 0; i < a->n; i++) {
        const long keys = row_keys(a, i);
        if (keys > max_keys) max_keys = keys;
    }
    attn_plan(&t, max_keys);
    const struct unit_queue q = {.run = attn_unit_heads, .task = &t, .group = t.group, .by_heads = t.mode != ATTN_TILES};
    run_units(&q, t.units, worth_forking(a, 0, a->n, q.by_heads ? t.units * t.group : t.units));
    if (t.mode == ATTN_SPLIT) attn_merge_all(&t);
}

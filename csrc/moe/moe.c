/* Mixture-of-experts layer (see moe.h). Each expert with tokens runs as one matmul (gate and up
 * together) over the rows of the tokens routed to it. With at least as many such experts as pool
 * threads, the threads claim whole experts (one fork/join per layer instead of three per expert);
 * else the experts run one after another and each matmul splits its rows over the pool. A decode-sized
 * batch (few rows per expert) instead runs every expert's gate/up units as one list over the pool, then
 * every expert's down units as another (see units_path). Routing,
 * gathering and the weighted sum are serial: a few values per token, against the experts' weights
 * streamed from memory. */
#include "moe/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/env.h"
#include "core/threadpool.h"
#include "matmul/matmul.h"
#include "ops/ops.h"

size_t llb_moe_fscratch(long n, long d, long k, long ff) {
    return (size_t)n * k * (2 * (size_t)d + 2 * (size_t)ff + 1); /* gathered x, gate, up, expert outputs, weights */
}

size_t llb_moe_iscratch(long n, long k, long n_expert) {
    return 3 * (size_t)n * k + (size_t)n_expert + 1; /* ids, entries by expert, each entry's row, expert offsets */
}

/* The k largest of l[0..m) into ids, descending, ties to the lower index, NaN as -inf: in
 * O(k m), each pick the largest entry ordered after the previous pick (so every id is distinct and
 * valid whatever the values). */
static float rank_key(float v) { return isnan(v) ? -INFINITY : v; }

static void top_k(const float *l, long m, long k, int32_t *ids) {
    float prev = INFINITY;
    long prev_id = -1;
    for (long j = 0; j < k; j++) {
        long best = -1;
        float best_v = -INFINITY;
        for (long e = 0; e < m; e++) {
            const float v = rank_key(l[e]);
            const int after_prev = v < prev || (v == prev && e > prev_id);
            if (after_prev && (best < 0 || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        ids[j] = (int32_t)best;
        prev = best_v;
        prev_id = best;
    }
}

/* The general routing (moe.h): scores, the choice (+ bias) within the best groups, weights from the scores. */
static void route_general(const float *l, long E, long k, const llb_moe_route_params *r, float *score, float *choice,
                          int32_t *gids, int32_t *tmp, int32_t *id, float *w) {
    if (r->routing == LLB_MOE_SIGMOID_TOPK) {
        for (long e = 0; e < E; e++) score[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float top = -INFINITY, all = 0.0f;
        for (long e = 0; e < E; e++) top = rank_key(l[e]) > top ? rank_key(l[e]) : top;
        for (long e = 0; e < E; e++) all += score[e] = expf(l[e] - top);
        for (long e = 0; e < E; e++) score[e] /= all;
    }
    for (long e = 0; e < E; e++) choice[e] = score[e] + (r->bias ? r->bias[e] : 0.0f);
    if (r->groups > 1) {
        const long G = r->groups, m = E / G;
        float *gscore = score + E; /* G floats past the scores */
        for (long g = 0; g < G; g++) {
            top_k(choice + g * m, m, r->group_top, tmp);
            float s = 0.0f;
            for (long j = 0; j < r->group_top; j++) s += choice[g * m + tmp[j]];
            gscore[g] = s;
        }
        top_k(gscore, G, r->groups_used, gids);
        for (long g = 0; g < G; g++) { /* a group not among the chosen: its experts out of the running */
            int keep = 0;
            for (long j = 0; j < r->groups_used; j++) keep |= gids[j] == g;
            for (long e = g * m; !keep && e < (g + 1) * m; e++) choice[e] = -INFINITY;
        }
    }
    top_k(choice, E, k, id);
    float sum = 0.0f;
    for (long j = 0; j < k; j++) sum += w[j] = score[id[j]];
    for (long j = 0; j < k; j++) w[j] = (r->norm ? w[j] / sum : w[j]) * r->scale;
}

int llb_moe_route(const float *logits, long n, long n_expert, long k, const llb_moe_route_params *r, int32_t *ids,
                  float *weights) {
    const int general = r->routing == LLB_MOE_SIGMOID_TOPK || r->groups > 1 || r->bias;
    float *fs = NULL;
    int32_t *is = NULL;
    if (general) { /* scores, choices and group scores; group ids and one group's top ids */
        const long G = r->groups > 1 ? r->groups : 1, m = n_expert / G;
        fs = llb_scratch((2 * (size_t)n_expert + (size_t)G) * sizeof(float) + ((size_t)G + (size_t)m) * sizeof(int32_t));
        if (!fs) return -1;
        is = (int32_t *)(fs + 2 * (size_t)n_expert + (size_t)G);
    }
    for (long t = 0; t < n; t++) {
        const float *l = logits + t * n_expert;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        if (general) {
            const long G = r->groups > 1 ? r->groups : 1;
            /* fs: the scores (E), the group scores (G), the choices (E); is: the chosen groups (G), a group's top */
            route_general(l, n_expert, k, r, fs, fs + n_expert + G, is, is + G, id, w);
            continue;
        }
        top_k(l, n_expert, k, id);
        const float top = l[id[0]];
        float sum = 0.0f;
        if (r->routing == LLB_MOE_TOPK_SOFTMAX) {
            for (long j = 0; j < k; j++) sum += w[j] = expf(l[id[j]] - top);
        } else {
            float all = 0.0f;
            for (long e = 0; e < n_expert; e++) all += expf(l[e] - top);
            for (long j = 0; j < k; j++) sum += w[j] = expf(l[id[j]] - top);
            if (!r->norm) sum = all;
        }
        for (long j = 0; j < k; j++) w[j] = w[j] / sum * r->scale;
    }
    return 0;
}

static const uint8_t *expert_w(const llb_experts *x, long e) { return x->w + (size_t)e * x->stride; }

/* What every expert's MLP needs: where its rows are, and (on a pool thread) its scratch. */
typedef struct {
    const llb_moe_args *a;
    const int32_t *off;     /* expert e's rows: [off[e], off[e+1]) of the gathered rows */
    const int32_t *active;  /* the experts with rows */
    long n_active;
    float *xg, *g, *u, *y;
    uint8_t *scratch;       /* NULL: row-parallel matmuls; else per_thread bytes per pool thread */
    size_t per_thread;
    int failed;
} moe_ctx;

/* rows x cols values += the expert's bias on every row (a NULL bias: nothing) */
static void add_bias(float *v, const float *bias, long rows, long cols) {
    for (long r = 0; bias && r < rows; r++)
        for (long c = 0; c < cols; c++) v[r * cols + c] += bias[c];
}

/* g = act(g, u) over count values, on this thread (scratch) or the pool's */
static void activate(const llb_moe_args *a, float *g, const float *u, long count, int here) {
    if (a->act == LLB_MOE_SILU) {
        if (here) llb_silu_mul_here(g, u, g, count);
        else llb_silu_mul(g, u, g, count);
        return;
    }
    for (long i = 0; i < count; i++) {
        const float gi = g[i] < a->limit ? g[i] : a->limit; /* NaN stays NaN: it fails every comparison */
        const float ui = u[i] < -a->limit ? -a->limit : u[i] > a->limit ? a->limit : u[i];
        g[i] = (ui + 1.0f) * gi / (1.0f + expf(-a->alpha * gi));
    }
}

/* Expert e's MLP over its m gathered rows: gate and up, SiLU, down. With scratch, on this thread
 * alone; else each matmul splits its rows over the pool. */
static int run_expert(moe_ctx *c, long e, uint8_t *scratch) {
    const llb_moe_args *a = c->a;
    const long r0 = c->off[e], m = c->off[e + 1] - r0, d = a->d, ff = a->ff;
    const float *xe = c->xg + (size_t)r0 * d;
    float *ge = c->g + (size_t)r0 * ff, *ue = c->u + (size_t)r0 * ff, *ye = c->y + (size_t)r0 * d;
    llb_mm_part gu[2] = {{a->gate.layout, expert_w(&a->gate, e), ff, ge}, {a->up.layout, expert_w(&a->up, e), ff, ue}};
    const llb_mm_part dn = {a->down.layout, expert_w(&a->down, e), d, ye};
    const int fused = a->gate.t == a->up.t; /* one call: activations quantized once */
    const float *gb = a->gate_b ? a->gate_b + e * ff : NULL, *ub = a->up_b ? a->up_b + e * ff : NULL,
                *db = a->down_b ? a->down_b + e * d : NULL;
    if (scratch) {
        if (llb_matmul_many_here(a->gate.t, gu, fused ? 2 : 1, d, xe, m, a->exact, scratch) ||
            (!fused && llb_matmul_many_here(a->up.t, gu + 1, 1, d, xe, m, a->exact, scratch)))
            return -1;
    } else if (llb_matmul_many(a->gate.t, gu, fused ? 2 : 1, d, xe, m, a->exact) ||
               (!fused && llb_matmul_many(a->up.t, gu + 1, 1, d, xe, m, a->exact))) {
        return -1;
    }
    add_bias(ge, gb, m, ff);
    add_bias(ue, ub, m, ff);
    activate(a, ge, ue, m * ff, scratch != NULL);
    if (scratch ? llb_matmul_many_here(a->down.t, &dn, 1, ff, ge, m, a->exact, scratch)
                : llb_matmul_many(a->down.t, &dn, 1, ff, ge, m, a->exact))
        return -1;
    add_bias(ye, db, m, d);
    return 0;
}

/* Pool threads claim whole experts one at a time: a thread the OS deschedules holds up only the
 * expert it is on, and a token's expert output does not depend on which thread ran it. */
static void experts_task(void *ctx, long i0, long i1, int tid) {
    moe_ctx *c = ctx;
    uint8_t *scratch = c->scratch + (size_t)tid * c->per_thread;
    for (long i = i0; i < i1; i++)
        if (run_expert(c, c->active[i], scratch)) __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Up to this many rows per expert the units path runs (decode steps, small server batches). */
#define MOE_UNIT_ROWS 4

/* LLAMBDA_MOE_UNITS=0 turns the units path off (whole experts per thread, as before): for A/B runs. */
static int units_enabled(void) {
    static int on = -1;
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        v = llb_env_flag("LLAMBDA_MOE_UNITS", 1);
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v;
}
/* Chunks a units phase is cut into (see llb_parallel_for): ~1/4 of a Qwen3-30B-A3B expert's gate+up
 * each, so the threads reach the join within ~30 us of each other. */
#define MOE_CHUNKS 32

/* Prepared products (matmul's llb_mm_prep) back to back, and where each one's units start in the
 * phase's list. */
typedef struct {
    uint8_t *preps;
    size_t prep_bytes;
    long *first; /* count + 1 entries */
    int count;
} unit_list;

static llb_mm_prep *prep_at(const unit_list *l, int i) { return (llb_mm_prep *)(l->preps + (size_t)i * l->prep_bytes); }

static void units_task(void *ctx, long u0, long u1, int tid) {
    (void)tid;
    const unit_list *l = ctx;
    int i = 0;
    while (l->first[i + 1] <= u0) i++;
    for (long u = u0; u < u1; i++) {
        const long end = u1 < l->first[i + 1] ? u1 : l->first[i + 1];
        llb_matmul_prep_run(prep_at(l, i), u - l->first[i], end - l->first[i]);
        u = end;
    }
}

/* Adds a prep of parts over x (m rows) to l; same_x: a prep of the same activations, or NULL. Returns it, or
 * NULL when matmul cannot run it in units. */
static llb_mm_prep *add_prep(unit_list *l, const llb_experts *w, const llb_mm_part *parts, int n_parts, long cols,
                             const float *x, long m, int exact, uint8_t **act, size_t act_bytes,
                             const llb_mm_prep *same_x) {
    llb_mm_prep *p = prep_at(l, l->count);
    const long units = llb_matmul_prep(p, w->t, parts, n_parts, cols, x, m, exact, *act, same_x);
    if (units < 0) return NULL;
    if (!same_x) *act += act_bytes;
    l->first[l->count + 1] = l->first[l->count] + units;
    l->count++;
    return p;
}

static void run_units(unit_list *l) {
    const long n = l->first[l->count];
    if (n > 0) llb_parallel_for(units_task, l, n, llb_grain(n, MOE_CHUNKS, 1, 1), llb_pool_threads());
}

/* The experts' gate/up units, from every expert, as one list over the pool; the activation; then the down
 * units as another. Claiming whole experts left a thread idle for up to one expert's time (~3 MB of
 * weights in Qwen3-30B-A3B) at every layer's join; units are ~30x finer, for one more join. The products
 * and so every row's result are those of run_expert. Returns 1 when a part cannot run in units (the
 * caller takes another path, which computes everything again), 0 done, -1 no scratch. */
static int units_path(moe_ctx *c, long max_m) {
    const llb_moe_args *a = c->a;
    const long d = a->d, ff = a->ff, na = c->n_active;
    const int fused = a->gate.t == a->up.t;
    const size_t prep_bytes = (llb_matmul_prep_bytes() + 63) & ~(size_t)63;
    const size_t act_bytes = (max_sz(max_sz(llb_matmul_here_scratch(a->gate.t, d, max_m, a->exact),
                                            llb_matmul_here_scratch(a->up.t, d, max_m, a->exact)),
                                     llb_matmul_here_scratch(a->down.t, ff, max_m, a->exact)) + 63) & ~(size_t)63;
    const size_t n_preps = 2 * (size_t)na; /* the larger phase: gate and up apart */
    const size_t firsts = ((n_preps + 1) * sizeof(long) + 63) & ~(size_t)63;
    uint8_t *s = llb_scratch(n_preps * (prep_bytes + act_bytes) + firsts);
    if (!s) return -1;
    unit_list l = {.preps = s, .prep_bytes = prep_bytes, .first = (long *)(s + n_preps * prep_bytes)};
    uint8_t *act = s + n_preps * prep_bytes + firsts;
    const llb_mm_prep *last_x = NULL;
    const float *last_xp = NULL;
    long last_m = -1;

    /* gate and up: the experts of one token (a decode step) share its quantized row */
    l.first[0] = 0;
    for (long i = 0; i < na; i++) {
        const long e = c->active[i], r0 = c->off[e], m = c->off[e + 1] - r0;
        const float *xe = c->xg + (size_t)r0 * d;
        float *ge = c->g + (size_t)r0 * ff, *ue = c->u + (size_t)r0 * ff;
        const llb_mm_part gu[2] = {{a->gate.layout, expert_w(&a->gate, e), ff, ge},
                                   {a->up.layout, expert_w(&a->up, e), ff, ue}};
        const int same = last_x && m == last_m && !memcmp(xe, last_xp, (size_t)m * d * sizeof(float));
        const llb_mm_prep *p = add_prep(&l, &a->gate, gu, fused ? 2 : 1, d, xe, m, a->exact, &act, act_bytes,
                                        same ? last_x : NULL);
        if (!p || (!fused && !add_prep(&l, &a->up, gu + 1, 1, d, xe, m, a->exact, &act, act_bytes, p))) return 1;
        if (!same) last_x = p, last_xp = xe, last_m = m;
    }
    run_units(&l);
    for (long i = 0; i < na; i++) {
        const long e = c->active[i], r0 = c->off[e], m = c->off[e + 1] - r0;
        add_bias(c->g + (size_t)r0 * ff, a->gate_b ? a->gate_b + e * ff : NULL, m, ff);
        add_bias(c->u + (size_t)r0 * ff, a->up_b ? a->up_b + e * ff : NULL, m, ff);
    }
    activate(a, c->g, c->u, a->n * a->k * ff, 1); /* the active experts' rows are all the rows */

    /* down: each expert's own activations (the preps' scratch is reused: phase one is done) */
    l.count = 0;
    act = s + n_preps * prep_bytes + firsts;
    for (long i = 0; i < na; i++) {
        const long e = c->active[i], r0 = c->off[e], m = c->off[e + 1] - r0;
        const llb_mm_part dn = {a->down.layout, expert_w(&a->down, e), d, c->y + (size_t)r0 * d};
        if (!add_prep(&l, &a->down, &dn, 1, ff, c->g + (size_t)r0 * ff, m, a->exact, &act, act_bytes, NULL))
            return 1; /* the other paths recompute gate and up */
    }
    run_units(&l);
    for (long i = 0; i < na; i++) {
        const long e = c->active[i], r0 = c->off[e], m = c->off[e + 1] - r0;
        add_bias(c->y + (size_t)r0 * d, a->down_b ? a->down_b + e * d : NULL, m, d);
    }
    return 0;
}

int llb_moe(const llb_moe_args *a) {
    const long n = a->n, d = a->d, k = a->k, ff = a->ff, E = a->n_expert, nk = n * k;
    float *xg = a->fscratch, *g = xg + (size_t)nk * d, *u = g + (size_t)nk * ff, *y = u + (size_t)nk * ff,
          *w = y + (size_t)nk * d;
    int32_t *ids = a->iscratch, *entry = ids + nk, *row_of = entry + nk, *off = row_of + nk;
    if (llb_moe_route(a->logits, n, E, k, &a->route, ids, w)) return -1;

    /* entries (token t's j-th choice = t*k + j) grouped by expert, in token order within one */
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (long i = 0; i < nk; i++) off[ids[i] + 1]++;
    for (long e = 0; e < E; e++) off[e + 1] += off[e];
    for (long i = 0; i < nk; i++) {
        const long r = off[ids[i]]++;
        entry[r] = (int32_t)i;
        row_of[i] = (int32_t)r;
    }
    for (long e = E; e > 0; e--) off[e] = off[e - 1]; /* the fill advanced each start to the next one's */
    off[0] = 0;
    for (long r = 0; r < nk; r++) memcpy(xg + (size_t)r * d, a->x + (size_t)(entry[r] / k) * d, (size_t)d * sizeof(float));

    /* the experts with rows (an expert no token chose: its weights are never read), listed in the
     * entry slots of the ids, which are no longer needed */
    int32_t *active = ids;
    long n_active = 0, max_m = 0;
    for (long e = 0; e < E; e++)
        if (off[e + 1] > off[e]) {
            active[n_active++] = (int32_t)e;
            if (off[e + 1] - off[e] > max_m) max_m = off[e + 1] - off[e];
        }
    moe_ctx c = {.a = a, .off = off, .active = active, .n_active = n_active, .xg = xg, .g = g, .u = u, .y = y};
    const int nth = llb_pool_threads();
    const int rc = nth > 1 && max_m <= MOE_UNIT_ROWS && units_enabled() ? units_path(&c, max_m) : 1;
    if (rc < 0) return -1;
    if (rc == 0) {
        /* done in units */
    } else if (nth > 1 && n_active >= nth) { /* enough experts to give every thread whole ones */
        c.per_thread = max_sz(max_sz(llb_matmul_here_scratch(a->gate.t, d, max_m, a->exact),
                                     llb_matmul_here_scratch(a->up.t, d, max_m, a->exact)),
                              llb_matmul_here_scratch(a->down.t, ff, max_m, a->exact));
        c.per_thread = (c.per_thread + 63) & ~(size_t)63;
        if (!(c.scratch = llb_scratch(c.per_thread * (size_t)nth))) return -1;
        llb_parallel_for(experts_task, &c, n_active, 1, nth);
        if (c.failed) return -1;
    } else {
        for (long i = 0; i < n_active; i++)
            if (run_expert(&c, active[i], NULL)) return -1;
    }

    /* each token's sum over its k choices in choice order: the same whatever else is in the batch */
    for (long t = 0; t < n; t++) {
        float *o = a->out + (size_t)t * d;
        const float *sh = a->shared ? a->shared + (size_t)t * d : NULL;
        const float s = !sh ? 0.0f : a->shared_logit ? 1.0f / (1.0f + expf(-a->shared_logit[t])) : 1.0f;
        for (long c = 0; c < d; c++) o[c] = sh ? s * sh[c] : 0.0f;
        for (long j = 0; j < k; j++) {
            const float wj = w[t * k + j];
            const float *yr = y + (size_t)row_of[t * k + j] * d;
            for (long c = 0; c < d; c++) o[c] += wj * yr[c];
        }
    }
    return 0;
}

/* Mixture-of-experts layer (see moe.h). Each expert with tokens runs as one matmul (gate and up
 * together) over the rows of the tokens routed to it. With at least as many such experts as pool
 * threads, the threads claim whole experts (one fork/join per layer instead of three per expert);
 * else the experts run one after another and each matmul splits its rows over the pool. Routing,
 * gathering and the weighted sum are serial: a few values per token, against the experts' weights
 * streamed from memory. */
#include "moe/moe.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
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

void llb_moe_route(const float *logits, long n, long n_expert, long k, int routing, int norm, int32_t *ids,
                   float *weights) {
    for (long t = 0; t < n; t++) {
        const float *l = logits + t * n_expert;
        int32_t *id = ids + t * k;
        float *w = weights + t * k;
        top_k(l, n_expert, k, id);
        const float top = l[id[0]];
        float sum = 0.0f;
        if (routing == LLB_MOE_TOPK_SOFTMAX) {
            for (long j = 0; j < k; j++) sum += w[j] = expf(l[id[j]] - top);
        } else {
            float all = 0.0f;
            for (long e = 0; e < n_expert; e++) all += expf(l[e] - top);
            for (long j = 0; j < k; j++) sum += w[j] = expf(l[id[j]] - top);
            if (!norm) sum = all;
        }
        for (long j = 0; j < k; j++) w[j] /= sum;
    }
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

int llb_moe(const llb_moe_args *a) {
    const long n = a->n, d = a->d, k = a->k, ff = a->ff, E = a->n_expert, nk = n * k;
    float *xg = a->fscratch, *g = xg + (size_t)nk * d, *u = g + (size_t)nk * ff, *y = u + (size_t)nk * ff,
          *w = y + (size_t)nk * d;
    int32_t *ids = a->iscratch, *entry = ids + nk, *row_of = entry + nk, *off = row_of + nk;
    llb_moe_route(a->logits, n, E, k, a->routing, a->norm, ids, w);

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
    if (nth > 1 && n_active >= nth) { /* enough experts to give every thread whole ones */
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

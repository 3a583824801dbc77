/* Mixture-of-experts layer (see moe.h). The experts run one after another, each as one matmul
 * (gate and up together) over the rows of the tokens routed to it, which the matmul driver
 * splits over the thread pool; routing, gathering and the weighted sum are serial (a few
 * values per token against the experts' weights streamed from memory). */
#include "moe/moe.h"

#include <math.h>
#include <string.h>

#include "matmul/matmul.h"
#include "ops/ops.h"

size_t llb_moe_fscratch(long n, long d, long k, long ff) {
    return (size_t)n * k * (2 * (size_t)d + 2 * (size_t)ff + 1); /* gathered x, gate, up, expert outputs, weights */
}

size_t llb_moe_iscratch(long n, long k, long n_expert) {
    return 3 * (size_t)n * k + (size_t)n_expert + 1; /* ids, entries by expert, each entry's row, expert offsets */
}

/* The k largest of l[0..m) into ids, descending, ties to the lower index; NaNs never win but
 * every slot still gets a distinct valid index. */
static void top_k(const float *l, long m, long k, int32_t *ids) {
    for (long j = 0; j < k; j++) {
        long best = -1;
        for (long e = 0; e < m; e++) {
            int taken = 0;
            for (long i = 0; i < j; i++) taken |= ids[i] == e;
            if (taken) continue;
            if (best < 0 || l[e] > l[best] || (isnan(l[best]) && !isnan(l[e]))) best = e;
        }
        ids[j] = (int32_t)best;
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

    for (long e = 0; e < E; e++) {
        const long r0 = off[e], m = off[e + 1] - r0;
        if (!m) continue; /* an expert no token chose: its weights are never read */
        const float *xe = xg + (size_t)r0 * d;
        float *ge = g + (size_t)r0 * ff, *ue = u + (size_t)r0 * ff;
        if (a->gate.t == a->up.t) {
            const llb_mm_part parts[2] = {{a->gate.layout, expert_w(&a->gate, e), ff, ge},
                                          {a->up.layout, expert_w(&a->up, e), ff, ue}};
            if (llb_matmul_many(a->gate.t, parts, 2, d, xe, m, a->exact)) return -1;
        } else if (llb_matmul(a->gate.t, a->gate.layout, expert_w(&a->gate, e), ff, d, xe, ge, m, a->exact) ||
                   llb_matmul(a->up.t, a->up.layout, expert_w(&a->up, e), ff, d, xe, ue, m, a->exact)) {
            return -1;
        }
        llb_silu_mul(ge, ue, ge, m * ff);
        if (llb_matmul(a->down.t, a->down.layout, expert_w(&a->down, e), d, ff, ge, y + (size_t)r0 * d, m, a->exact))
            return -1;
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

/* Gemma 3n's small ops around its layers: AltUp's stream prediction and correction, the rescaling of a
 * stream to another's magnitude, a row-vector product and the MLP gate's gaussian top-k. Row by row in
 * plain C (the same on every ISA), over the pool's threads when there are enough rows; each row's sums
 * in one order whatever the threads, so a row's result does not depend on the batch. */
#include <math.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "ops/ops.h"

struct rows_task {
    void (*row)(const struct rows_task *, long);
    const float *a, *b, *c;
    float *out;
    long n, d, k;
    float s;
};

static void rows_range(void *ctx, long i0, long i1, int tid) {
    (void)tid;
    const struct rows_task *t = ctx;
    for (long i = i0; i < i1; i++) t->row(t, i);
}

static void run_rows(struct rows_task *t) {
    if (t->n * t->d < 16384 || llb_pool_threads() == 1) rows_range(t, 0, t->n, 0);
    else llb_parallel_for(rows_range, t, t->n, llb_grain(t->n, 1, 64, 1), LLB_POOL_MAX_THREADS);
}

/* sum of squares of a row, in double (a row of 2048 values: no drift against NumPy's pairwise sum) */
static double sum_sq(const float *x, long d) {
    double s = 0;
    for (long j = 0; j < d; j++) s += (double)x[j] * x[j];
    return s;
}

static void mul_row(const struct rows_task *t, long i) {
    const float *x = t->a + i * t->d;
    float *o = t->out + i * t->d;
    for (long j = 0; j < t->d; j++) o[j] = x[j] * t->b[j];
}

void llb_mul_rows(const float *x, const float *w, float *out, long n, long d) {
    struct rows_task t = {.row = mul_row, .a = x, .b = w, .out = out, .n = n, .d = d};
    run_rows(&t);
}

static void topk_row(const struct rows_task *t, long i) {
    float *x = t->out + i * t->d;
    long d = t->d;
    double mean = 0, var = 0;
    for (long j = 0; j < d; j++) mean += x[j];
    mean /= d;
    for (long j = 0; j < d; j++) var += ((double)x[j] - mean) * ((double)x[j] - mean);
    float cut = (float)(mean + sqrt(var / d) * t->s);
    for (long j = 0; j < d; j++) x[j] = x[j] > cut ? x[j] - cut : 0.0f;
}

void llb_gaussian_topk(float *x, long n, long d, float mult) {
    struct rows_task t = {.row = topk_row, .out = x, .n = n, .d = d, .s = mult};
    run_rows(&t);
}

static void match_row(const struct rows_task *t, long i) {
    const float *y = t->a + i * t->d, *g = t->b + i * t->d;
    float *o = t->out + i * t->d;
    double have = sum_sq(y, t->d) / t->d;
    double want = sqrt(sum_sq(g, t->d) / t->d);
    float f = (float)(want / sqrt(have > 1e-5 ? have : 1e-5));
    for (long j = 0; j < t->d; j++) o[j] = y[j] * f;
}

void llb_rms_match(const float *y, const float *target, float *out, long n, long d) {
    struct rows_task t = {.row = match_row, .a = y, .b = target, .out = out, .n = n, .d = d};
    run_rows(&t);
}

/* token i of every stream: out[j][i] = x[j][i] + sum_m coef[i][j A + m] x[m][i] */
static void predict_row(const struct rows_task *t, long i) {
    long A = t->k, n = t->n, d = t->d;
    const float *c = t->b + i * A * A;
    for (long j = 0; j < A; j++) {
        float *o = t->out + (j * n + i) * d;
        const float *xj = t->a + (j * n + i) * d;
        for (long e = 0; e < d; e++) {
            float s = 0.0f;
            for (long m = 0; m < A; m++) s += c[j * A + m] * t->a[(m * n + i) * d + e];
            o[e] = xj[e] + s;
        }
    }
}

void llb_altup_predict(const float *x, const float *coef, float *out, long A, long n, long d) {
    struct rows_task t = {.row = predict_row, .a = x, .b = coef, .out = out, .n = n, .d = d, .k = A};
    run_rows(&t);
}

/* token i of every stream: out[j][i] = pred[j][i] + coef[i][j] (active[i] - pred[idx][i]); out may be pred */
static void correct_row(const struct rows_task *t, long i) {
    long A = t->k, n = t->n, d = t->d, idx = (long)t->s;
    const float *act = t->c + i * d, *pa = t->a + (idx * n + i) * d;
    const float *c = t->b + i * A;
    for (long e = 0; e < d; e++) {
        float innovation = act[e] - pa[e];
        for (long j = 0; j < A; j++) {
            if (j == idx) continue;         /* the active stream last: the others read its prediction */
            t->out[(j * n + i) * d + e] = t->a[(j * n + i) * d + e] + c[j] * innovation;
        }
        t->out[(idx * n + i) * d + e] = pa[e] + c[idx] * innovation;
    }
}

void llb_altup_correct(const float *pred, const float *coef, const float *active, long idx, float *out, long A,
                       long n, long d) {
    struct rows_task t = {.row = correct_row, .a = pred, .b = coef, .c = active, .out = out, .n = n, .d = d, .k = A,
                          .s = (float)idx};
    run_rows(&t);
}

void llb_ids_below(const int32_t *ids, int32_t limit, int32_t *out, long n) {
    for (long i = 0; i < n; i++) out[i] = ids[i] >= 0 && ids[i] < limit ? ids[i] : 0;
}

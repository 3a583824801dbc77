/* The dense driver (matmul/dense.h): packing into panels, the activations' bfloat16 copy, and the
 * work split: (group of DENSE_PG panels) x (chunk of DENSE_MC rows) units over the thread pool,
 * panel-group major, so a thread streams its share of the weights once while the activations'
 * chunks come from cache. Results never depend on the split (dense.h). */
#include "matmul/dense.h"

#include <string.h>

#include "core/alloc.h"
#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"

#define DENSE_MC 48 /* activation rows per unit: a multiple of every kernel's tile height */
#define DENSE_PG 2  /* panels per unit */

static const llb_dense_kernels *dense_kernels(void) {
    return LLB_PER_ISA(&llb_dense_scalar, &llb_dense_avx2, &llb_dense_avx512);
}

static long kdim_of(int fmt, long cols) { return fmt == LLB_DENSE_BF16 ? (cols + 1) & ~1L : cols; }

static size_t panel_bytes(int fmt, long cols) {
    return (size_t)kdim_of(fmt, cols) * LLB_DENSE_NR * (fmt == LLB_DENSE_BF16 ? 2 : 4);
}

size_t llb_dense_packed_size(int fmt, long rows, long cols) {
    return (size_t)((rows + LLB_DENSE_NR - 1) / LLB_DENSE_NR) * panel_bytes(fmt, cols);
}

void llb_dense_pack(int fmt, const float *w, long rows, long cols, void *dst) {
    const long np = (rows + LLB_DENSE_NR - 1) / LLB_DENSE_NR, kd = kdim_of(fmt, cols);
    memset(dst, 0, llb_dense_packed_size(fmt, rows, cols));
    for (long p = 0; p < np; p++)
        for (int c = 0; c < LLB_DENSE_NR && p * LLB_DENSE_NR + c < rows; c++) {
            const float *row = w + (size_t)(p * LLB_DENSE_NR + c) * cols;
            if (fmt == LLB_DENSE_F32) {
                float *pf = (float *)dst + (size_t)p * kd * LLB_DENSE_NR;
                for (long k = 0; k < cols; k++) pf[k * LLB_DENSE_NR + c] = row[k];
            } else {
                uint16_t *pb = (uint16_t *)dst + (size_t)p * kd * LLB_DENSE_NR;
                for (long k = 0; k < cols; k++) pb[(k / 2 * LLB_DENSE_NR + c) * 2 + (k & 1)] = llb_f32_to_bf16(row[k]);
            }
        }
}

typedef struct {
    const llb_dense_kernels *k;
    int fmt;
    const uint8_t *packed;
    const float *bias, *x;
    long rows, cols, kdim, n, npanels, nchunks;
    uint16_t *xb; /* BF16: the activations rounded, n x kdim */
    float *out;
} dense_ctx;

/* Rows [r0, r1) of x into xb (bfloat16, the pad column zero). */
static void to_bf16_task(void *ctx, long r0, long r1, int tid) {
    (void)tid;
    const dense_ctx *c = ctx;
    for (long i = r0; i < r1; i++) {
        const float *x = c->x + (size_t)i * c->cols;
        uint16_t *d = c->xb + (size_t)i * c->kdim;
        if (c->k->to_bf16) c->k->to_bf16(x, d, c->cols);
        else
            for (long k = 0; k < c->cols; k++) d[k] = llb_f32_to_bf16(x[k]);
        if (c->kdim > c->cols) d[c->cols] = 0;
    }
}

static void dense_task(void *ctx, long u0, long u1, int tid) {
    (void)tid;
    const dense_ctx *c = ctx;
    const size_t pb = panel_bytes(c->fmt, c->cols);
    const int bf = c->fmt == LLB_DENSE_BF16, mr = c->k->max_rows;
    const llb_dense_fn fn = bf ? c->k->bf16 : c->k->f32;
    for (long u = u0; u < u1; u++) {
        const long g = u / c->nchunks, i0 = u % c->nchunks * DENSE_MC;
        const long i1 = i0 + DENSE_MC < c->n ? i0 + DENSE_MC : c->n;
        for (long p = g * DENSE_PG; p < (g + 1) * DENSE_PG && p < c->npanels; p++) {
            const long col0 = p * LLB_DENSE_NR, left = c->rows - col0;
            for (long i = i0; i < i1; i += mr) {
                const llb_dense_tile t = {
                    .xa = bf ? (const void *)(c->xb + (size_t)i * c->kdim) : (const void *)(c->x + (size_t)i * c->cols),
                    .ldx = bf ? c->kdim : c->cols,
                    .panel = c->packed + (size_t)p * pb,
                    .kdim = c->kdim,
                    .bias = c->bias ? c->bias + col0 : NULL,
                    .out = c->out + (size_t)i * c->rows + col0,
                    .ldo = c->rows,
                    .ncols = left < LLB_DENSE_NR ? (int)left : LLB_DENSE_NR,
                };
                fn(&t, (int)(i1 - i < mr ? i1 - i : mr));
            }
        }
    }
}

int llb_dense(int fmt, const void *packed, const float *bias, long rows, long cols, const float *x, float *out,
              long n) {
    if (n <= 0) return 0;
    dense_ctx c = {.k = dense_kernels(), .fmt = fmt, .packed = packed, .bias = bias, .x = x, .rows = rows,
                   .cols = cols, .kdim = kdim_of(fmt, cols), .n = n, .out = out};
    c.npanels = (rows + LLB_DENSE_NR - 1) / LLB_DENSE_NR;
    c.nchunks = (n + DENSE_MC - 1) / DENSE_MC;
    const int nth = llb_pool_threads();
    /* a small product (a few rows, a classifier head) is not worth a fork/join */
    const int parallel = nth > 1 && (double)n * rows * cols >= 262144.0;
    if (fmt == LLB_DENSE_BF16) {
        c.xb = llb_scratch((size_t)n * c.kdim * sizeof(uint16_t));
        if (!c.xb) return -1;
        if (parallel) llb_parallel_for(to_bf16_task, &c, n, llb_grain(n, 8, 16, 1), nth);
        else to_bf16_task(&c, 0, n, 0);
    }
    const long units = (c.npanels + DENSE_PG - 1) / DENSE_PG * c.nchunks;
    if (parallel) llb_parallel_for(dense_task, &c, units, llb_grain(units, 32, 1, 1), nth);
    else dense_task(&c, 0, units, 0);
    return 0;
}

/* The dense kernels (matmul/dense.h) in portable C: the reference every SIMD path rounds like
 * (BF16 exactly, F32 up to the FMA's single rounding). */
#include "core/fp16.h"
#include "matmul/dense.h"

#define NR LLB_DENSE_NR

static void store_row(const llb_dense_tile *t, int r, const float *acc) {
    float *o = t->out + (size_t)r * t->ldo;
    for (int c = 0; c < t->ncols; c++) o[c] = acc[c] + (t->bias ? t->bias[c] : 0.0f);
}

static void f32_tile(const llb_dense_tile *t, int mr) {
    const float *P = t->panel;
    for (int r = 0; r < mr; r++) {
        const float *x = (const float *)t->xa + (size_t)r * t->ldx;
        float acc[NR] = {0};
        for (long k = 0; k < t->kdim; k++)
            for (int c = 0; c < NR; c++) acc[c] += x[k] * P[k * NR + c];
        store_row(t, r, acc);
    }
}

static void bf16_tile(const llb_dense_tile *t, int mr) {
    const uint16_t *P = t->panel;
    for (int r = 0; r < mr; r++) {
        const uint16_t *x = (const uint16_t *)t->xa + (size_t)r * t->ldx;
        float acc[NR] = {0};
        for (long kp = 0; kp < t->kdim / 2; kp++) {
            const float x0 = llb_bf16_to_f32(x[2 * kp]), x1 = llb_bf16_to_f32(x[2 * kp + 1]);
            const uint16_t *w = P + kp * 2 * NR;
            for (int c = 0; c < NR; c++) {
                acc[c] += x1 * llb_bf16_to_f32(w[2 * c + 1]); /* exact products: one rounding per add */
                acc[c] += x0 * llb_bf16_to_f32(w[2 * c]);
            }
        }
        store_row(t, r, acc);
    }
}

const llb_dense_kernels llb_dense_scalar = {f32_tile, bf16_tile, 4, NULL};

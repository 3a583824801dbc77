/* The dense kernels (matmul/dense.h) on AVX-512: tiles of 12 rows x one 32-column panel, 24
 * accumulators; F32 by FMA with the activation broadcast, BF16 by VDPBF16PS (AVX512-BF16) on a
 * broadcast pair of activations. Fewer rows (a batch's last tile) run 4 or 1 at a time, each
 * output summed in the same order. */
#include <immintrin.h>

#include "core/isa.h"
#include "matmul/dense.h"

#if LLB_X86
#define TGT LLB_TARGET_AVX512
#define NR LLB_DENSE_NR
#define MR 12
#define AI __attribute__((always_inline)) inline

TGT static AI void store_tile(const llb_dense_tile *t, int mr, __m512 acc[MR][2]) {
    const __mmask16 m0 = t->ncols >= 16 ? 0xFFFF : (__mmask16)((1u << t->ncols) - 1);
    const __mmask16 m1 = t->ncols >= 32 ? 0xFFFF : t->ncols <= 16 ? 0 : (__mmask16)((1u << (t->ncols - 16)) - 1);
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (t->bias) {
        b0 = _mm512_maskz_loadu_ps(m0, t->bias);
        b1 = _mm512_maskz_loadu_ps(m1, t->bias + 16);
    }
    for (int r = 0; r < mr; r++) {
        float *o = t->out + (size_t)r * t->ldo;
        _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(acc[r][0], b0));
        _mm512_mask_storeu_ps(o + 16, m1, _mm512_add_ps(acc[r][1], b1));
    }
}

TGT static AI void f32_rows(const llb_dense_tile *t, const int mr) {
    const float *P = t->panel;
    const float *x = t->xa;
    __m512 acc[MR][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long k = 0; k < t->kdim; k++) {
        const __m512 b0 = _mm512_loadu_ps(P + k * NR), b1 = _mm512_loadu_ps(P + k * NR + 16);
        for (int r = 0; r < mr; r++) {
            const __m512 a = _mm512_set1_ps(x[r * t->ldx + k]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    store_tile(t, mr, acc);
}

TGT static AI void bf16_rows(const llb_dense_tile *t, const int mr) {
    const uint16_t *P = t->panel;
    const uint16_t *x = t->xa;
    __m512 acc[MR][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long kp = 0; kp < t->kdim / 2; kp++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(P + kp * 2 * NR);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(P + kp * 2 * NR + 32);
        for (int r = 0; r < mr; r++) {
            int32_t pair;
            __builtin_memcpy(&pair, x + r * t->ldx + 2 * kp, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
    store_tile(t, mr, acc);
}

/* A sub-tile of t starting r rows down. */
static llb_dense_tile shift(const llb_dense_tile *t, int r, size_t elem) {
    llb_dense_tile s = *t;
    s.xa = (const char *)t->xa + (size_t)r * t->ldx * elem;
    s.out = t->out + (size_t)r * t->ldo;
    return s;
}

/* A tile of mr rows: 12 at once, else 4 and then 1 at a time (each output summed alike). */
#define TILE_FN(name, rows_fn, elem)                                                                                  \
    TGT static void name(const llb_dense_tile *t, int mr) {                                                           \
        if (mr == MR) {                                                                                               \
            rows_fn(t, MR);                                                                                           \
            return;                                                                                                   \
        }                                                                                                             \
        int r = 0;                                                                                                    \
        for (; r + 4 <= mr; r += 4) {                                                                                 \
            const llb_dense_tile s = shift(t, r, elem);                                                               \
            rows_fn(&s, 4);                                                                                           \
        }                                                                                                             \
        for (; r < mr; r++) {                                                                                         \
            const llb_dense_tile s = shift(t, r, elem);                                                               \
            rows_fn(&s, 1);                                                                                           \
        }                                                                                                             \
    }
TILE_FN(f32_tile, f32_rows, 4)
TILE_FN(bf16_tile, bf16_rows, 2)

/* float32 -> bfloat16, nearest even (VCVTNEPS2BF16), 16 at a time, the tail masked. */
TGT static void to_bf16(const float *x, uint16_t *out, long count) {
    for (long k = 0; k < count; k += 16) {
        const long left = count - k;
        const __mmask16 m = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
        _mm256_mask_storeu_epi16(out + k, m, (__m256i)h);
    }
}

const llb_dense_kernels llb_dense_avx512 = {f32_tile, bf16_tile, MR, to_bf16};
#endif

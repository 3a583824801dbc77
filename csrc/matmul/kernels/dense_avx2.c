/* The dense kernels (matmul/dense.h) on AVX2+FMA: tiles of 4 rows x 16 columns (half a panel),
 * 8 accumulators. BF16 weights are widened in registers (a bfloat16 is a float's high half) and
 * summed odd column first, as VDPBF16PS does, so the results equal the scalar kernel's. */
#include <immintrin.h>

#include "core/isa.h"
#include "matmul/dense.h"

#if LLB_X86
#define TGT LLB_TARGET_AVX2
#define NR LLB_DENSE_NR
#define MR 4

TGT static void store_half(const llb_dense_tile *t, int mr, int h, __m256 acc[MR][2]) {
    for (int r = 0; r < mr; r++) {
        float tmp[16];
        _mm256_storeu_ps(tmp, acc[r][0]);
        _mm256_storeu_ps(tmp + 8, acc[r][1]);
        float *o = t->out + (size_t)r * t->ldo;
        for (int c = 16 * h; c < 16 * h + 16 && c < t->ncols; c++) o[c] = tmp[c - 16 * h] + (t->bias ? t->bias[c] : 0.0f);
    }
}

TGT static void f32_tile(const llb_dense_tile *t, int mr) {
    const float *P = t->panel;
    const float *x = t->xa;
    for (int h = 0; h < 2 && 16 * h < t->ncols; h++) {
        __m256 acc[MR][2];
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        if (mr == MR) {
            for (long k = 0; k < t->kdim; k++) {
                const __m256 b0 = _mm256_loadu_ps(P + k * NR + 16 * h), b1 = _mm256_loadu_ps(P + k * NR + 16 * h + 8);
                for (int r = 0; r < MR; r++) {
                    const __m256 a = _mm256_broadcast_ss(x + r * t->ldx + k);
                    acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
                }
            }
        } else {
            for (int r = 0; r < mr; r++)
                for (long k = 0; k < t->kdim; k++) {
                    const __m256 a = _mm256_broadcast_ss(x + r * t->ldx + k);
                    acc[r][0] = _mm256_fmadd_ps(a, _mm256_loadu_ps(P + k * NR + 16 * h), acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(a, _mm256_loadu_ps(P + k * NR + 16 * h + 8), acc[r][1]);
                }
        }
        store_half(t, mr, h, acc);
    }
}

/* One pair of bfloat16 activations (x[2kp], x[2kp+1]) as two broadcast floats. */
#define BF_PAIR(p, even, odd)                                                                                         \
    do {                                                                                                              \
        int32_t u_;                                                                                                   \
        __builtin_memcpy(&u_, (p), 4);                                                                                \
        const __m256i v_ = _mm256_set1_epi32(u_);                                                                     \
        even = _mm256_castsi256_ps(_mm256_slli_epi32(v_, 16));                                                        \
        odd = _mm256_castsi256_ps(_mm256_and_si256(v_, _mm256_set1_epi32((int)0xFFFF0000u)));                         \
    } while (0)

TGT static void bf16_tile(const llb_dense_tile *t, int mr) {
    const uint16_t *P = t->panel;
    const uint16_t *x = t->xa;
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int h = 0; h < 2 && 16 * h < t->ncols; h++) {
        __m256 acc[MR][2];
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (long kp = 0; kp < t->kdim / 2; kp++) {
            const uint16_t *w = P + kp * 2 * NR + 32 * h;
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)w), v1 = _mm256_loadu_si256((const __m256i *)(w + 16));
            const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi));
            const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi));
            for (int r = 0; r < mr; r++) {
                __m256 ae, ao;
                BF_PAIR(x + r * t->ldx + 2 * kp, ae, ao);
                acc[r][0] = _mm256_fmadd_ps(ae, e0, _mm256_fmadd_ps(ao, o0, acc[r][0]));
                acc[r][1] = _mm256_fmadd_ps(ae, e1, _mm256_fmadd_ps(ao, o1, acc[r][1]));
            }
        }
        store_half(t, mr, h, acc);
    }
}

const llb_dense_kernels llb_dense_avx2 = {f32_tile, bf16_tile, MR, NULL};
#endif

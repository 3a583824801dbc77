/* Horizontal reductions shared by the matmul kernels (matmul/kernels/) and the
 * op kernels (ops/kernels/). Every sum halves the stride: x[i] += x[i + w] for
 * w = VL/2, VL/4, ..., 1, so a sum's bits are the same wherever it is taken
 * (attention relies on this: its row and tile kernels must agree bit for bit).
 * Include before any `#pragma GCC target` region; each helper carries the
 * smallest target its callers all have. */
#ifndef LLB_SIMD_H
#define LLB_SIMD_H
#include <stdint.h>

#include "core/isa.h"

#if LLB_X86
#include <immintrin.h>

#define LLB_HSUM_AVX2 static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define LLB_HSUM_AVX512 static inline __attribute__((always_inline, target("avx512f,avx512dq,avx2,fma,f16c")))

/* Sum of 8 lanes: strides 4, 2, 1. */
LLB_HSUM_AVX2 float llb_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Largest of 8 lanes, in the same tree. */
LLB_HSUM_AVX2 float llb_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Sum of 8 int32 lanes. */
LLB_HSUM_AVX2 int32_t llb_hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Sum of 16 lanes: stride 8, then llb_hsum8's tree (GCC's _mm512_reduce_add_ps adds in
 * this order too; written out so that no compiler may pick another). */
LLB_HSUM_AVX512 float llb_hsum16(__m512 v) {
    return llb_hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

#endif

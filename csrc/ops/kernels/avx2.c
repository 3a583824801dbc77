/* AVX2 + FMA + F16C kernels (VL = 8), from the template in simd.inc. */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "core/isa.h"
#include "core/simd.h"
#include "ops/ops.h"
#include "ops/kernels/kernels.h"

#if LLB_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>

#define VL 8
typedef __m256 vf;
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_set1(float x) { return _mm256_set1_ps(x); }
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
/* Partial vectors go through a small buffer: no reads or writes past the data. */
static inline vf v_load_part(const float *p, long n) {
    float t[8] = {0};
    memcpy(t, p, (size_t)n * 4);
    return _mm256_loadu_ps(t);
}
static inline void v_store_part(float *p, vf v, long n) {
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(p, t, (size_t)n * 4);
}
static inline vf v_load_h(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf v_load_h_part(const uint16_t *p, long n) {
    uint16_t t[8] = {0};
    memcpy(t, p, (size_t)n * 2);
    return v_load_h(t);
}
static inline void v_store_h(uint16_t *p, vf v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void v_store_h_part(uint16_t *p, vf v, long n) {
    uint16_t t[8];
    v_store_h(t, v);
    memcpy(p, t, (size_t)n * 2);
}
static inline vf v_load_q8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
/* 1/a for a >= 1 (sigmoid denominators): 12-bit estimate + one Newton step
 * (~2 ulp; a divide costs several times more); 0 where a is +inf. */
static inline vf v_recip(vf a) {
    const vf r = _mm256_rcp_ps(a);
    const vf e = _mm256_fmadd_ps(r, _mm256_fnmadd_ps(a, r, _mm256_set1_ps(1.f)), r);
    return _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(a, _mm256_set1_ps(1e37f), _CMP_GT_OQ));
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline float v_hsum(vf v) { return llb_hsum8(v); }
static inline float v_hmax(vf v) { return llb_hmax8(v); }
static inline vf v_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for integral n in [-126, 127]: build 2^n in the exponent field. */
static inline vf v_ldexp(vf p, vf n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline vf v_abs(vf x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }
static inline vf v_copysign(vf mag, vf sgn) {
    const vf s = _mm256_set1_ps(-0.f);
    return _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sgn));
}
static inline vf v_select_lt(vf a, vf b, vf x, vf y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }

#define OPS_TABLE llb_ops_avx2
#include "ops/kernels/simd.inc"
#include "ops/kernels/attention.inc"
#ifndef LLB_KERNEL_HARNESS /* bench/attention_unit.c: the kernels alone, none instantiated unless called */
#include "ops/kernels/table.inc"
#endif

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* LLB_X86 */

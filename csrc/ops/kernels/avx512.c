/* AVX-512 (F, BW, VL, DQ) kernels (VL = 16), from the template in simd.inc. */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "core/isa.h"
#include "core/simd.h"
#include "ops/ops.h"
#include "ops/kernels/kernels.h"

#if LLB_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
#include <immintrin.h>

#define VL 16
typedef __m512 vf;
static inline __mmask16 first_n(long n) { return (__mmask16)((1u << n) - 1u); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_set1(float x) { return _mm512_set1_ps(x); }
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
/* Masked: lanes past n are neither read nor written (no fault past the data). */
static inline vf v_load_part(const float *p, long n) { return _mm512_maskz_loadu_ps(first_n(n), p); }
static inline void v_store_part(float *p, vf v, long n) { _mm512_mask_storeu_ps(p, first_n(n), v); }
static inline vf v_load_h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf v_load_h_part(const uint16_t *p, long n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_n(n), p)); }
static inline void v_store_h(uint16_t *p, vf v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline void v_store_h_part(uint16_t *p, vf v, long n) {
    _mm256_mask_storeu_epi16(p, first_n(n), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf v_load_q8(const int8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* 1/a for a >= 1 (sigmoid denominators): 14-bit estimate + one Newton step
 * (~1 ulp; a divide costs several times more); 0 where a is +inf. */
static inline vf v_recip(vf a) {
    const vf r = _mm512_rcp14_ps(a);
    const vf e = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(1.f)), r);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(1e37f), _CMP_GT_OQ), e, _mm512_setzero_ps());
}
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline float v_hsum(vf v) { return llb_hsum16(v); }
static inline float v_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf v_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf v_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }
static inline vf v_abs(vf x) { return _mm512_abs_ps(x); }
static inline vf v_copysign(vf mag, vf sgn) {
    const vf s = _mm512_set1_ps(-0.f);
    return _mm512_or_ps(_mm512_andnot_ps(s, mag), _mm512_and_ps(s, sgn));
}
static inline vf v_select_lt(vf a, vf b, vf x, vf y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x); }

#define OPS_TABLE llb_ops_avx512
#include "ops/kernels/simd.inc"
#include "ops/kernels/attention.inc"
#include "ops/kernels/table.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* LLB_X86 */

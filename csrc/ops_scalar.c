/* Portable kernels (VL = 1): the reference path every CPU can run, and the
 * half <-> float conversions used where F16C is not available. */
#include <math.h>
#include <string.h>

#include "ops.h"
#include "ops_kernels.h"

float llb_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf, NaN (payload kept) */
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t llb_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff); /* NaN stays a quiet NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00;                              /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                                                    /* below 2^-14: subnormal half */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)rintf(a * 16777216.0f); /* units of 2^-24, ties to even; 1024 = min normal */
    }
    /* Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even. */
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((rounded - (112u << 23)) >> 13);
}

#define VL 1
#define V_LIBM_MATH 1
typedef float vf;
static inline vf v_zero(void) { return 0.f; }
static inline vf v_set1(float x) { return x; }
static inline vf v_load(const float *p) { return *p; }
static inline void v_store(float *p, vf v) { *p = v; }
static inline vf v_load_part(const float *p, long n) { return n > 0 ? *p : 0.f; }
static inline void v_store_part(float *p, vf v, long n) {
    if (n > 0) *p = v;
}
static inline vf v_load_h(const uint16_t *p) { return llb_f16_to_f32(*p); }
static inline vf v_load_h_part(const uint16_t *p, long n) { return n > 0 ? llb_f16_to_f32(*p) : 0.f; }
static inline void v_store_h(uint16_t *p, vf v) { *p = llb_f32_to_f16(v); }
static inline void v_store_h_part(uint16_t *p, vf v, long n) {
    if (n > 0) *p = llb_f32_to_f16(v);
}
static inline vf v_add(vf a, vf b) { return a + b; }
static inline vf v_sub(vf a, vf b) { return a - b; }
static inline vf v_mul(vf a, vf b) { return a * b; }
static inline vf v_div(vf a, vf b) { return a / b; }
static inline vf v_recip(vf a) { return 1.f / a; }
static inline vf v_fma(vf a, vf b, vf c) { return a * b + c; } /* contracted or not, as the compiler likes */
static inline vf v_max(vf a, vf b) { return a > b ? a : b; }
static inline vf v_min(vf a, vf b) { return a < b ? a : b; }
static inline float v_hsum(vf v) { return v; }
static inline float v_hmax(vf v) { return v; }
static inline vf v_sum_lanes(const vf *a) { return a[0]; }
static inline vf v_exp(vf x) { return expf(x); }
static inline vf v_tanh(vf x) { return tanhf(x); }
static inline vf v_select_lt(vf a, vf b, vf x, vf y) { return a < b ? x : y; }

#define OPS_TABLE llb_ops_scalar
#include "ops_simd.inc"
#include "attn_simd.inc"
#include "ops_table.inc"

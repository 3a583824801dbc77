/* Portable kernels (VL = 1): the reference path every CPU can run. */
#include <math.h>
#include <string.h>

#include "core/fp16.h"
#include "ops/ops.h"
#include "ops/kernels/kernels.h"

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
static inline vf v_load_q8(const int8_t *p) { return (float)*p; }
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
static inline vf v_exp(vf x) { return expf(x); }
static inline vf v_tanh(vf x) { return tanhf(x); }
static inline vf v_select_lt(vf a, vf b, vf x, vf y) { return a < b ? x : y; }

#define OPS_TABLE llb_ops_scalar
#include "ops/kernels/simd.inc"
#include "ops/kernels/attention.inc"
#include "ops/kernels/table.inc"

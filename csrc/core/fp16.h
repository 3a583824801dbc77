/* IEEE half and bfloat16 <-> float32 in portable C: the one copy, used by the
 * weight formats (quants/), the scalar kernels and the f16 KV cache. The SIMD
 * paths convert with F16C instead, which rounds the same way. */
#ifndef LLB_FP16_H
#define LLB_FP16_H
#include <stdint.h>
#include <string.h>

static inline float llb_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t llb_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* binary16 -> binary32, exact for normals, subnormals, inf and NaN (payload kept). */
static inline float llb_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return llb_bits_f32(sign | 0x7F800000u | (man << 13));
    if (exp != 0) return llb_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float */
    const float v = (float)man * (1.0f / 16777216.0f);
    return sign ? -v : v;
}

/* binary32 -> binary16, round to nearest even (what F16C does); NaN stays a quiet NaN. */
static inline uint16_t llb_f32_to_f16(float f) {
    const uint32_t x = llb_f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (ax < 0x38800000u) {                      /* below 2^-14: subnormal half */
        /* units of 2^-24, ties to even (rintf in the default rounding mode); 1024 = min normal */
        return sign | (uint16_t)__builtin_rintf(llb_bits_f32(ax) * 16777216.0f);
    }
    /* Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even. */
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((rounded - (112u << 23)) >> 13);
}

static inline float llb_bf16_to_f32(uint16_t b) { return llb_bits_f32((uint32_t)b << 16); }

#endif

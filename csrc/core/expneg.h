/* e^x for x <= 0 in plain arithmetic the compiler vectorizes (a loop of them becomes SIMD code under an ISA's
 * target attributes): x = n ln 2 + r, |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (relative error < 1e-8
 * before rounding), 2^n from the exponent bits; below -87 it is 0 (e^-87 is under float's normal range).
 * Softmax's shifted scores (ops/encoder.c) and Mamba's decays (ops/ssmscan1.c). */
#ifndef LLB_EXPNEG_H
#define LLB_EXPNEG_H
#include <stdint.h>

static inline __attribute__((always_inline)) float exp_neg(float x) {
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float c = x < -87.0f ? -87.0f : x;
    const float n = (c * 1.44269504088896341f + big) - big;
    const float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &e, 4);
    return x < -87.0f ? 0.0f : p * scale;
}

#endif

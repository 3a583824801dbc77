/* AVX-512 decoders of the packed layout (see quants.h), shared by the AVX-512
 * kernel files: each turns packed bytes into vectors of unsigned weight codes,
 * one byte per value, lane r (4 bytes) = row r of the group. */
#ifndef LLB_AVX512_DECODE_H
#define LLB_AVX512_DECODE_H
#include "matmul/kernels/common.h"

#if LLB_X86
#include <immintrin.h>

#define TGT LLB_TARGET_AVX512

/* once: each vector loaded into a register once, where GCC folds its load into both the and and the shift
 * (twice the loads: the Zen 4 GEMV's loop is bound by its load slots, kernels' common.h). */
LLB_AI TGT void dec_nibbles_as(const uint8_t *v, __m512i q[8], const int once) {
    const __m512i m4 = _mm512_set1_epi8(15);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        __m512i a = _mm512_loadu_si512(v + 64 * k);
        if (once) __asm__("" : "+v"(a));
        q[k] = _mm512_and_si512(a, m4);
        q[k + 4] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    }
}

LLB_AI TGT void dec_nibbles(const uint8_t *v, __m512i q[8]) { dec_nibbles_as(v, q, 0); }

/* Q5_0's bit plane: byte bit t = 5th bit of quad t. a | (b & c) = ternlog 0xF8. */
LLB_AI TGT void add_fifth_bits(const uint8_t *plane, __m512i q[8]) {
    const __m512i h = _mm512_loadu_si512(plane), b4 = _mm512_set1_epi8(0x10);
    q[0] = _mm512_ternarylogic_epi32(q[0], _mm512_slli_epi16(h, 4), b4, 0xF8);
    q[1] = _mm512_ternarylogic_epi32(q[1], _mm512_slli_epi16(h, 3), b4, 0xF8);
    q[2] = _mm512_ternarylogic_epi32(q[2], _mm512_slli_epi16(h, 2), b4, 0xF8);
    q[3] = _mm512_ternarylogic_epi32(q[3], _mm512_slli_epi16(h, 1), b4, 0xF8);
    q[4] = _mm512_ternarylogic_epi32(q[4], h, b4, 0xF8);
    q[5] = _mm512_ternarylogic_epi32(q[5], _mm512_srli_epi16(h, 1), b4, 0xF8);
    q[6] = _mm512_ternarylogic_epi32(q[6], _mm512_srli_epi16(h, 2), b4, 0xF8);
    q[7] = _mm512_ternarylogic_epi32(q[7], _mm512_srli_epi16(h, 3), b4, 0xF8);
}

/* Nibbles -> grid[nibble] + off, one byte shuffle per vector. */
LLB_AI TGT void grid_lookup(const int8_t grid[16], int off, __m512i q[8]) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)grid), _mm_set1_epi8((char)off)));
    LLB_UNROLL
    for (int t = 0; t < 8; t++) q[t] = _mm512_shuffle_epi8(lut, q[t]);
}

/* One 32-value block of a 32-block type as unsigned codes: Q8_0's are stored as w + 128, IQ4_NL's
 * are its grid levels + 128, MXFP4's its doubled FP4 values + LLB_MXFP4_OFF (common.h). */
LLB_AI TGT void dec_block32_as(const int qt, const uint8_t *gb, __m512i q[8], const int once) {
    if (qt == LLB_Q8_0) {
        LLB_UNROLL
        for (int t = 0; t < 8; t++) q[t] = _mm512_loadu_si512(gb + 32 + 64 * t);
        return;
    }
    dec_nibbles_as(gb + LLB_NIBBLES32(qt), q, once);
    if (qt == LLB_Q5_0) add_fifth_bits(gb + LLB_Q5_0_PLANE, q);
    if (qt == LLB_Q5_1) add_fifth_bits(gb + LLB_Q5_1_PLANE, q);
    if (qt == LLB_IQ4_NL) grid_lookup(llb_iq4_grid, 128, q);
    if (qt == LLB_MXFP4) grid_lookup(llb_fp4_grid, LLB_MXFP4_OFF, q);
}

LLB_AI TGT void dec_block32(const int qt, const uint8_t *gb, __m512i q[8]) { dec_block32_as(qt, gb, q, 0); }

/* Sub-block s (32 values) of a Q4_K/Q5_K/IQ4_XS group-block as unsigned codes: Q4_K's nibbles,
 * Q5_K's plus its bit plane, IQ4_XS's grid levels + 128 (one byte shuffle of the nibbles). */
LLB_AI TGT void dec_k4_sub(const int qt, const uint8_t *gb, int s, __m512i q[8]) {
    dec_nibbles(gb + LLB_K4_NIBBLES(qt, s), q);
    if (qt == LLB_Q5_K) add_fifth_bits(gb + LLB_Q5_K_PLANE(s), q);
    if (qt == LLB_IQ4_XS) {
        const __m512i lut = _mm512_broadcast_i32x4(
            _mm_xor_si128(_mm_loadu_si128((const __m128i *)llb_iq4_grid), _mm_set1_epi8((char)0x80)));
        LLB_UNROLL
        for (int t = 0; t < 8; t++) q[t] = _mm512_shuffle_epi8(lut, q[t]);
    }
}

/* One 16-value sub-block u of Q6_K: A/B hold the low nibbles of quads 0,1 / 2,3,
 * H their top 2 bits (bits 2i..2i+1 for quad i). c ? a : b = ternlog 0xE4. */
LLB_AI TGT void dec_q6k_sub(const uint8_t *sub, __m512i q[4]) {
    const __m512i m4 = _mm512_set1_epi8(15), m33 = _mm512_set1_epi8(0x33);
    const __m512i a = _mm512_loadu_si512(sub), b = _mm512_loadu_si512(sub + 64), h = _mm512_loadu_si512(sub + 128);
    const __m512i hp = _mm512_and_si512(h, m33), hq = _mm512_and_si512(_mm512_srli_epi16(h, 2), m33);
    q[0] = _mm512_ternarylogic_epi32(a, _mm512_slli_epi16(hp, 4), m4, 0xE4);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), _mm512_slli_epi16(hq, 4), m4, 0xE4);
    q[2] = _mm512_ternarylogic_epi32(b, hp, m4, 0xE4);
    q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, 4), hq, m4, 0xE4);
}

/* Q3_K: the 2-bit codes of one 16-value sub-block's L vector (quad i in bits 2i..2i+1). */
LLB_AI TGT void dec_l2(const uint8_t *l, __m512i q[4]) {
    const __m512i a = _mm512_loadu_si512(l), m3 = _mm512_set1_epi8(3);
    LLB_UNROLL
    for (int i = 0; i < 4; i++) q[i] = _mm512_and_si512(i ? _mm512_srli_epi16(a, 2 * i) : a, m3);
}

/* 16-value sub-block u of a Q2_K (codes 0..3) or Q3_K (0..7: L's 2 bits, H's bit 4k+i as bit 2) group-block. */
LLB_AI TGT void dec_k16_sub(const int qt, const uint8_t *gb, int u, __m512i q[4]) {
    if (qt == LLB_Q2_K) { /* quads 0, 1 from vector 0, 2, 3 from vector 1: bits 2k and 4 + 2k (quants.h) */
        const uint8_t *l = gb + LLB_Q2_K_CODES + 128 * (u >> 1);
        const int k = u & 1;
        LLB_UNROLL
        for (int i = 0; i < 4; i++) {
            const __m512i a = _mm512_loadu_si512(l + 64 * (i >> 1));
            const int sh = 2 * k + 4 * (i & 1);
            q[i] = _mm512_and_si512(sh ? _mm512_srli_epi16(a, sh) : a, _mm512_set1_epi8(3));
        }
        return;
    }
    const uint8_t *p = gb + LLB_Q3_K_SUBS + 192 * (u >> 1);
    const int k = u & 1;
    dec_l2(p + 64 * k, q);
    const __m512i h = _mm512_loadu_si512(p + 128), b2 = _mm512_set1_epi8(4);
    LLB_UNROLL
    for (int i = 0; i < 4; i++) { /* bit 4k+i to bit 2; a | (b & c) = ternlog 0xF8 */
        const int sh = 4 * k + i - 2;
        const __m512i hs = sh > 0 ? _mm512_srli_epi16(h, sh) : sh < 0 ? _mm512_slli_epi16(h, -sh) : h;
        q[i] = _mm512_ternarylogic_epi32(q[i], hs, b2, 0xF8);
    }
}

LLB_AI TGT __m512 load_f16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* The 16 rows' scales of a 32-block group-block: fp16, or MXFP4's E8M0 bytes e as 2^(e-128)
 * (the doubled grid's half), built from its bits: (e-1) << 23, subnormal 0x200000 << e for e < 2. */
LLB_AI TGT __m512 block_scale16(const int qt, const uint8_t *gb) {
    if (qt != LLB_MXFP4) return load_f16x16(gb);
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)gb));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_sllv_epi32(normal, tiny, _mm512_set1_epi32(0x200000), e));
}

/* A GEMM chain's initial value: the int32 at p broadcast from memory, or (p NULL) a zeroing idiom, per
 * chain. GCC would make the value once and copy the register per chain: a vector move each on the
 * multiply ports, where a broadcast is a load and the idiom no uop at all. */
LLB_AI TGT __m512i chain_init(const int32_t *p) {
    __m512i v;
    if (p) __asm__ volatile("vpbroadcastd %1, %0" : "=v"(v) : "m"(*p));
    else __asm__ volatile("vpxord %0, %0, %0" : "=v"(v));
    return v;
}

/* Results of M activation rows (rows of out `stride` floats apart), stored or, for a later
 * K chunk, added to what earlier chunks stored. */
LLB_AI TGT void llb512_put_rows(float *o, long stride, __mmask16 km, const __m512 *t, int M, int accumulate) {
    for (int m = 0; m < M; m++) {
        float *p = o + m * stride;
        _mm512_mask_storeu_ps(p, km, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(km, p), t[m]) : t[m]);
    }
}

#endif
#endif

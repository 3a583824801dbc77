/* AVX2 decoders of the packed layout (see quants.h) and other helpers shared
 * by the AVX2 kernel files. A 64-byte packed vector holds rows 0-7 in its first 32 bytes
 * and rows 8-15 in the other 32: AVX2 kernels work on one half (h) at a time,
 * one ymm lane = one row, 4 codes per lane. */
#ifndef LLB_AVX2_DECODE_H
#define LLB_AVX2_DECODE_H
#include "matmul/kernels/common.h"

#if LLB_X86
#include <immintrin.h>

#define TGT LLB_TARGET_AVX2

LLB_AI TGT __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
LLB_AI TGT __m256i bcast32(const int8_t *p) { return _mm256_set1_epi32(llb_ld32(p)); }
/* 8 fp16 (16 bytes) -> 8 floats */
LLB_AI TGT __m256 load_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

LLB_AI TGT void dec_nibbles_h(const uint8_t *v, int h, __m256i q[8]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i a = ld256(v + 64 * k + 32 * h);
        q[k] = _mm256_and_si256(a, m4);
        q[k + 4] = _mm256_and_si256(_mm256_srli_epi16(a, 4), m4);
    }
}

/* The 5th bits of quads k and k + 4 (bits k and k + 4 of each byte of a bit plane vector p) moved to
 * bit 4 and or-ed into their codes. */
LLB_AI TGT void add_fifth_bits_pair(__m256i p, int k, __m256i *lo, __m256i *hi) {
    const __m256i b4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(p, 4 - k), b4));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi16(p, k), b4));
}

/* Q5_0's bit plane (byte bit t = 5th bit of quad t) moved to bit 4 and or-ed in. */
LLB_AI TGT void add_fifth_bits_h(const uint8_t *plane, int h, __m256i q[8]) {
    const __m256i p = ld256(plane + 32 * h);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) add_fifth_bits_pair(p, k, &q[k], &q[k + 4]);
}

/* The byte-shuffle table of grid[nibble] + off, in both 128-bit lanes. */
LLB_AI TGT __m256i grid_lut(const int8_t grid[16], int off) {
    return _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_loadu_si128((const __m128i *)grid), _mm_set1_epi8((char)off)));
}

/* Nibbles -> grid[nibble] + off, one byte shuffle per vector. */
LLB_AI TGT void grid_lookup_h(const int8_t grid[16], int off, __m256i q[8]) {
    const __m256i lut = grid_lut(grid, off);
    LLB_UNROLL
    for (int t = 0; t < 8; t++) q[t] = _mm256_shuffle_epi8(lut, q[t]);
}

/* One 32-value block as unsigned codes (as avx512_decode.h's dec_block32: Q8_0 w + 128, IQ4_NL
 * grid + 128, MXFP4 doubled FP4 + LLB_MXFP4_OFF). */
LLB_AI TGT void dec_block32_h(const int qt, const uint8_t *gb, int h, __m256i q[8]) {
    if (qt == LLB_Q8_0) {
        LLB_UNROLL
        for (int t = 0; t < 8; t++) q[t] = ld256(gb + 32 + 64 * t + 32 * h);
        return;
    }
    dec_nibbles_h(gb + LLB_NIBBLES32(qt), h, q);
    if (qt == LLB_Q5_0) add_fifth_bits_h(gb + LLB_Q5_0_PLANE, h, q);
    if (qt == LLB_Q5_1) add_fifth_bits_h(gb + LLB_Q5_1_PLANE, h, q);
    if (qt == LLB_IQ4_NL) grid_lookup_h(llb_iq4_grid, 128, q);
    if (qt == LLB_MXFP4) grid_lookup_h(llb_fp4_grid, LLB_MXFP4_OFF, q);
}

/* Scales of rows 8h..8h+7 of a 32-block group-block: fp16, or MXFP4's E8M0 bytes e as 2^(e-128)
 * from their bits ((e-1) << 23; subnormal 0x200000 << e for e < 2). */
LLB_AI TGT __m256 block_scale8(const int qt, const uint8_t *gb, int h) {
    if (qt != LLB_MXFP4) return load_f16x8(gb + 16 * h);
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 8 * h)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

/* Rows 8h..8h+7 of sub-block s (32 values) of a Q4_K/Q5_K/IQ4_XS group-block as unsigned codes
 * (as avx512_decode.h's dec_k4_sub: IQ4_XS's are its grid levels + 128). */
LLB_AI TGT void dec_k4_sub_h(const int qt, const uint8_t *gb, int s, int h, __m256i q[8]) {
    dec_nibbles_h(gb + LLB_K4_NIBBLES(qt, s), h, q);
    if (qt == LLB_Q5_K) add_fifth_bits_h(gb + LLB_Q5_K_PLANE(s), h, q);
    if (qt == LLB_IQ4_XS) {
        const __m256i lut = _mm256_broadcastsi128_si256(
            _mm_xor_si128(_mm_loadu_si128((const __m128i *)llb_iq4_grid), _mm_set1_epi8((char)0x80)));
        LLB_UNROLL
        for (int t = 0; t < 8; t++) q[t] = _mm256_shuffle_epi8(lut, q[t]);
    }
}

/* One 16-value sub-block of Q6_K: 6-bit codes of quads 0..3 (see quants.h). */
LLB_AI TGT void dec_q6k_sub_h(const uint8_t *sub, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const __m256i a = ld256(sub + 32 * h), b = ld256(sub + 64 + 32 * h), hb = ld256(sub + 128 + 32 * h);
    q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(b, m4), _mm256_and_si256(hb, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
}

/* Rows 8h..8h+7 of a Q2_K/Q3_K 16-value sub-block u (as avx512_decode.h's dec_k16_sub). */
LLB_AI TGT void dec_k16_sub_h(const int qt, const uint8_t *gb, int u, int h, __m256i q[4]) {
    const __m256i m3 = _mm256_set1_epi8(3);
    if (qt == LLB_Q2_K) { /* quads 0, 1 from vector 0, 2, 3 from vector 1: bits 2k and 4 + 2k (quants.h) */
        const uint8_t *l = gb + LLB_Q2_K_CODES + 128 * (u >> 1) + 32 * h;
        LLB_UNROLL
        for (int i = 0; i < 4; i++) {
            const __m256i a = ld256(l + 64 * (i >> 1));
            const int sh = 2 * (u & 1) + 4 * (i & 1);
            q[i] = _mm256_and_si256(sh ? _mm256_srli_epi16(a, sh) : a, m3);
        }
        return;
    }
    const __m256i a = ld256(gb + LLB_Q3_K_SUBS + 192 * (u >> 1) + 64 * (u & 1) + 32 * h);
    LLB_UNROLL
    for (int i = 0; i < 4; i++) q[i] = _mm256_and_si256(i ? _mm256_srli_epi16(a, 2 * i) : a, m3);
    const __m256i hb = ld256(gb + LLB_Q3_K_SUBS + 192 * (u >> 1) + 128 + 32 * h), b2 = _mm256_set1_epi8(4);
    LLB_UNROLL
    for (int i = 0; i < 4; i++) { /* bit 4k+i to bit 2 */
        const int sh = 4 * (u & 1) + i - 2;
        const __m256i hs = sh > 0 ? _mm256_srli_epi16(hb, sh) : sh < 0 ? _mm256_slli_epi16(hb, -sh) : hb;
        q[i] = _mm256_or_si256(q[i], _mm256_and_si256(hs, b2));
    }
}

/* Sum of nq u8 x s8 quad products per lane in int16 (caller guarantees no overflow), widened to int32
 * with the lane's int16 pair w (dot_u8s8: by ones; Q4_K's sub-block scale pairs). */
LLB_AI TGT __m256i dot_u8s8_w(const __m256i *q, int nq, const int8_t *xq, __m256i w) {
    __m256i p = _mm256_maddubs_epi16(q[0], bcast32(xq));
    LLB_UNROLL
    for (int t = 1; t < nq; t++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[t], bcast32(xq + 4 * t)));
    return _mm256_madd_epi16(p, w);
}
LLB_AI TGT __m256i dot_u8s8(const __m256i *q, int nq, const int8_t *xq) { return dot_u8s8_w(q, nq, xq, _mm256_set1_epi16(1)); }

/* The same for codes stored as w + 128 (Q8_0, IQ4_XS), taken as signed w: |w| x sign(x, w), each
 * pair <= 2*128*127, so every quad is widened. */
LLB_AI TGT __m256i dot_off128(const __m256i *q, int nq, const int8_t *xq) {
    __m256i acc = _mm256_setzero_si256();
    LLB_UNROLL
    for (int t = 0; t < nq; t++) {
        const __m256i w = _mm256_xor_si256(q[t], _mm256_set1_epi8((char)0x80));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(bcast32(xq + 4 * t), w));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    return acc;
}

/* The same for the signed grid levels w (|w| <= 127: IQ4_NL's, an IQ4_XS sub-block's; nibbles at v, as
 * dec_nibbles_h reads them) of both halves of a block, as |x| x sign(w, x) (pairs <= 2 x 128 x 127):
 * the activation's broadcast and |x| do not depend on the weights, so both halves share them (one sign
 * per quad and half, where dot_off128 takes an offset and two). s[h] = half h's dot with one activation
 * row, quad by quad over both halves so the live values fit the 16 ymm registers (decoding a half's 8
 * vectors first spilled them in the GEMV). Exact integers: any order sums the same. */
LLB_AI TGT void dot_xsign2(const uint8_t *v, const int8_t *xq, __m256i s[2]) {
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)llb_iq4_grid));
    s[0] = s[1] = _mm256_setzero_si256();
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i xl = bcast32(xq + 4 * k), xh = bcast32(xq + 4 * k + 16);
        const __m256i al = _mm256_abs_epi8(xl), ah = _mm256_abs_epi8(xh);
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i a = ld256(v + 64 * k + 32 * h);
            const __m256i wl = _mm256_shuffle_epi8(lut, _mm256_and_si256(a, m4));
            const __m256i wh = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(a, 4), m4));
            const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(al, _mm256_sign_epi8(wl, xl)), ones);
            const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(ah, _mm256_sign_epi8(wh, xh)), ones);
            s[h] = _mm256_add_epi32(s[h], _mm256_add_epi32(pl, ph));
        }
    }
}

/* dot_off128 of both halves of a Q8_0 group-block (codes w + 128 at gb + 32) against one activation
 * row, quad by quad over both halves as dot_xsign2 (each broadcast feeding both): s[h] =
 * dot_off128(half h). */
LLB_AI TGT void dot_off2(const uint8_t *gb, const int8_t *xq, __m256i s[2]) {
    const __m256i ones = _mm256_set1_epi16(1), off = _mm256_set1_epi8((char)0x80);
    s[0] = s[1] = _mm256_setzero_si256();
    LLB_UNROLL
    for (int t = 0; t < 8; t++) {
        const __m256i x = bcast32(xq + 4 * t);
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_xor_si256(ld256(gb + 32 + 64 * t + 32 * h), off);
            s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones));
        }
    }
}

/* Stores rows 8h..8h+7 of group g for M activation rows, clipped to the rows that exist (plain stores
 * for a whole half: a vmaskmovps store is slow on Zen). */
LLB_AI TGT void store_half(const llb_mm *mm, long g, int h, long i, int M, const __m256 t[]) {
    const int nr = llb_group_rows(mm, g) - 8 * h;
    const long rows = mm->rows; /* once: a store through out could alias mm->rows */
    float *o = mm->out + i * rows + g * LLB_IL + 8 * h;
    if (nr >= 8) {
        for (int m = 0; m < M; m++) _mm256_storeu_ps(o + m * rows, t[m]);
        return;
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int m = 0; m < M; m++) _mm256_maskstore_ps(o + m * rows, mask, t[m]);
}

#endif
#endif

/* AVX2 kernels (with FMA and F16C): activation quantization, the integer
 * kernels of the 32-value block types, and the exact (FP32) kernels of every
 * type. The K-quant integer kernels are in avx2_kquants.c.
 *
 * Integer dot products: vpmaddubsw (u8 codes x s8 activations, pairs summed
 * to int16) accumulated in int16 as long as the bound allows (8 quads, with
 * the zero point folded into the words: zero_words; 4 quads for Q5_1's 5-bit
 * codes), then vpmaddwd with ones to int32. Q8_0's codes are signed: |w| x
 * sign(x, w) keeps each pair within int16. */
#include "matmul/kernels/avx2_decode.h"

#if LLB_X86

/* ---- activation quantization (same rounding as the scalar path) ---------- */

LLB_AI TGT __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* 32 int32 codes (4 vectors) -> 32 bytes in order. */
LLB_AI TGT void store_codes32(int8_t *dst, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* One 32-value block: codes (rounded as the scalar path rounds) to dst, and as int32 vectors to q;
 * returns the block's absmax. */
LLB_AI TGT float quant_block32(const float *xb, int8_t *dst, __m256i q[4]) {
    __m256 v[4];
    LLB_UNROLL
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(xb + 8 * k);
    const float amax = llb_hmax8(_mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3]))));
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    store_codes32(dst, q[0], q[1], q[2], q[3]);
    return amax;
}

/* The row's squared threshold on a block's absmax (LLB_OUTLIER, kernels.h): sum(x^2) in double. */
LLB_AI TGT double outlier_t2(const float *x, long cols) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    long k = 0;
    for (; k + 8 <= cols; k += 8) {
        const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + k)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + k + 4));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __attribute__((aligned(32))) double l[4];
    _mm256_store_pd(l, _mm256_add_pd(a0, a1));
    double ss = (l[0] + l[1]) + (l[2] + l[3]);
    for (; k < cols; k++) ss += (double)x[k] * x[k];
    return LLB_OUTLIER * LLB_OUTLIER * ss / (double)cols;
}

/* The zero point of a 32-block's quad dots as an int16 pair (llb_act.bias here): [-offset x the sum of
 * the block's values 0,1 of every quad; -offset x values 2,3] (|.| <= 16 x 16 x 127 < 2^15). Added to
 * the int16 words of the quad dots before their vpmaddwd by ones, it makes each word the sum of 16
 * (code - offset) x activation products, within int16 for every type with an offset (Q4_0 8 x 16 x 127,
 * MXFP4 12 x 16 x 127, Q5_0 16 x 16 x 127; the unsigned partial sums wrap on the way, exactly): Q5_0 and
 * MXFP4 sum all 8 quads in one int16 chain and no int32 bias remains for the float steps. The pair's
 * words add up to the int32 bias -offset x sum(q). */
LLB_AI TGT int32_t zero_words(const int8_t *codes, int offset) {
    __m256i v = _mm256_maddubs_epi16(_mm256_set1_epi8(1), ld256((const uint8_t *)codes)); /* pair sums, in order */
    v = _mm256_add_epi16(v, _mm256_shuffle_epi32(v, 0x4E));
    v = _mm256_add_epi16(v, _mm256_shuffle_epi32(v, 0xB1)); /* per 128-bit lane: [even pairs, odd pairs] */
    const __m128i w = _mm_add_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_cvtsi128_si32(_mm_mullo_epi16(w, _mm_set1_epi16((short)-offset)));
}

LLB_AI TGT int32_t sum_codes32(const __m256i q[4]) {
    return llb_hsum8i(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

TGT static void quant32(const float *x, long cols, long xt, int offset, int8_t *qs, float *d, int32_t *bias, float *sum,
                        int8_t *qs2, float *d2, int32_t *bias2) {
    const double t2 = outlier_t2(x, cols);
    for (long b = 0; b < cols / 32; b++) {
        __m256i q[4];
        const float *xb = x + 32 * b;
        const float amax = quant_block32(xb, qs + xt * 32 * b, q), db = amax / 127.0f;
        const int32_t isum = sum_codes32(q);
        d[xt * b] = db;
        bias[xt * b] = zero_words(qs + xt * 32 * b, offset);
        float s = db * (float)isum, dr = 0.0f; /* see scalar.c: the quantized sum, not the exact one */
        if ((double)amax * amax > t2) { /* an outlier block: its residual x - d * q (fused) too */
            __attribute__((aligned(32))) float r[32];
            const __m256 dv = _mm256_set1_ps(-db);
            LLB_UNROLL
            for (int k = 0; k < 4; k++)
                _mm256_store_ps(r + 8 * k, _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(q[k]), _mm256_loadu_ps(xb + 8 * k)));
            dr = quant_block32(r, qs2 + xt * 32 * b, q) / 127.0f;
            const int32_t isum2 = sum_codes32(q);
            bias2[xt * b] = zero_words(qs2 + xt * 32 * b, offset);
            s += dr * (float)isum2;
        }
        d2[xt * b] = dr;
        sum[xt * b] = s;
    }
}

/* 256-blocks: one scale per 32 values, as quant32; Q6_K wants -32 * sum(q) per 16. */
TGT static void quant256(const float *x, long cols, long xt, int8_t *qs, float *d, float *sum, int32_t *bs16n) {
    for (long b = 0; b < cols / 256; b++) {
        for (int s = 0; s < 8; s++) {
            __m256i q[4];
            const float amax = quant_block32(x + 256 * b + 32 * s, qs + xt * 256 * b + 32 * s, q);
            const int32_t s0 = llb_hsum8i(_mm256_add_epi32(q[0], q[1])), s1 = llb_hsum8i(_mm256_add_epi32(q[2], q[3]));
            d[xt * 8 * b + s] = amax / 127.0f;
            sum[xt * 8 * b + s] = (amax / 127.0f) * (float)(s0 + s1); /* Q4_K's min term, see scalar.c */
            bs16n[xt * 16 * b + 2 * s] = -32 * s0;
            bs16n[xt * 16 * b + 2 * s + 1] = -32 * s1;
        }
    }
}

/* Q6_K's zero point per word of its quad dots (llb_act.w16): a 16-value sub-block's pair sums x0+x1,
 * x2+x3, ... (one vpmaddubsw by ones), the even and the odd ones added, times -32 (|.| <= 32 x 8 x 127). */
TGT static void words16(const int8_t *qs, long cols, long xt, int32_t *w16) {
    for (long b = 0; b < cols / 256; b++) {
        for (int s = 0; s < 8; s++) { /* sub-blocks 2s, 2s+1: one in each 128-bit lane */
            __m256i v = _mm256_maddubs_epi16(_mm256_set1_epi8(1), ld256((const uint8_t *)qs + xt * 256 * b + 32 * s));
            v = _mm256_add_epi16(v, _mm256_shuffle_epi32(v, 0x4E));
            v = _mm256_add_epi16(v, _mm256_shuffle_epi32(v, 0xB1));
            v = _mm256_mullo_epi16(v, _mm256_set1_epi16(-32));
            w16[xt * 16 * b + 2 * s] = _mm256_cvtsi256_si32(v);
            w16[xt * 16 * b + 2 * s + 1] = _mm256_extract_epi32(v, 4);
        }
    }
}
#define LLB_WORDS16 words16

/* Q8_0's and IQ4_NL's codes are dotted as signed values (dot_off128): no zero point to fold in. */
#define SIGNED32(qt) ((qt) == LLB_Q8_0 || (qt) == LLB_IQ4_NL)
static int act_offset(int qtype) { return SIGNED32(qtype) ? 0 : LLB_CODE_OFF32(qtype); }

/* ---- fast kernels of the 32-value block types ----------------------------- */

#define TILE_ROWS 4 /* activation rows per GEMM tile: 2 x 4 int16 chains in ymm registers, the codes from the panel */

/* Q5_1's 5-bit codes without a zero point to fold in (zero_words): two int16 chains of 4 quads each. */
#define WIDE32(qt) ((qt) == LLB_Q5_1)

/* Integer dot of one block half with one activation row, its zero point (the pair xb) included. */
LLB_AI TGT __m256i block_dot_h(const int qt, const __m256i q[8], const int8_t *xq, int32_t xb) {
    if (SIGNED32(qt)) return dot_off128(q, 8, xq);
    if (WIDE32(qt)) /* codes up to 31: 4 quads per int16 sum */
        return _mm256_add_epi32(dot_u8s8(q, 4, xq), dot_u8s8(q + 4, 4, xq + 16));
    __m256i p = _mm256_maddubs_epi16(q[0], bcast32(xq));
    LLB_UNROLL
    for (int t = 1; t < 8; t++) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[t], bcast32(xq + 4 * t)));
    if (act_offset(qt)) p = _mm256_add_epi16(p, _mm256_set1_epi32(xb)); /* the words now within int16 */
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); /* Q4_1: 8 x 2 x 15 x 127 < 2^15 */
}

/* The float steps of one half's block dot s with one activation row (scale xd; the min term xs if
 * min): the GEMV and every GEMM tile go through this with the same values, so a row sums in the same
 * operations alone or in a batch (the integer dot is exact, however summed). */
LLB_AI TGT __m256 block_fin(const int qt, __m256i s, __m256 dv, __m256 mv, float xd, float xs, __m256 tot, const int min) {
    tot = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), dv), _mm256_set1_ps(xd), tot);
    if (min && LLB_HAS_MIN32(qt)) tot = _mm256_fmadd_ps(mv, _mm256_set1_ps(xs), tot);
    return tot;
}

/* One block of rows 8h..8h+7 (codes q, scales dv, Q4_1/Q5_1's mins mv) against one activation row's
 * block: its dot, scaled, added to tot; then the min term, and an outlier block's residual
 * (LLB_OUTLIER). */
LLB_AI TGT __m256 block_acc(const int qt, const __m256i q[8], __m256 dv, __m256 mv, const int8_t *xq, float xd, float xs,
                            int32_t xb, const int8_t *xq2, float xd2, int32_t xb2, __m256 tot) {
    tot = block_fin(qt, block_dot_h(qt, q, xq, xb), dv, mv, xd, xs, tot, 1);
    if (xd2 != 0.0f) tot = block_fin(qt, block_dot_h(qt, q, xq2, xb2), dv, mv, xd2, 0.0f, tot, 0);
    return tot;
}

/* Rows 8h..8h+7's min vector (Q4_1, Q5_1; unused by the others). */
LLB_AI TGT __m256 block_min8(const int qt, const uint8_t *gb, int h) {
    return LLB_HAS_MIN32(qt) ? load_f16x8(gb + 32 + 16 * h) : _mm256_setzero_ps();
}

/* The signed types' GEMV dot of both halves of a group-block (the same integers as block_dot_h's). */
LLB_AI TGT void signed_dot2(const int qt, const uint8_t *gb, const int8_t *xq, __m256i s[2]) {
    if (qt == LLB_IQ4_NL) dot_xsign2(gb + LLB_NIBBLES32(qt), xq, s); /* signed levels: no offset to undo */
    else dot_off2(gb, xq, s);
}

/* The unsigned types' GEMV dot of both halves of a group-block with one activation row (its zero-point
 * pair xb), the same integers as block_dot_h's: nibble vector k holds quads k and k + 4 of both halves,
 * so each pair of activation broadcasts feeds both halves and the live values fit the 16 ymm registers
 * (a half at a time, GCC kept the 8 broadcasts for the second half and some dots on the stack: 25
 * spills and reloads per block). Two int16 chains per half, quads 0-3 and 4-7: Q5_1's two sums (WIDE32);
 * the others add them (int16 words wrap on the way and end within range: any order sums the same). */
LLB_AI TGT void unsigned_dot2(const int qt, const uint8_t *gb, const int8_t *xq, int32_t xb, __m256i s[2]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *v = gb + LLB_NIBBLES32(qt);
    const uint8_t *plane = qt == LLB_Q5_0 ? gb + LLB_Q5_0_PLANE : gb + LLB_Q5_1_PLANE;
    __m256i lo[2], hi[2];
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256i xl = bcast32(xq + 4 * k), xh = bcast32(xq + 4 * k + 16);
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i a = ld256(v + 64 * k + 32 * h);
            __m256i ql = _mm256_and_si256(a, m4), qh = _mm256_and_si256(_mm256_srli_epi16(a, 4), m4);
            if (qt == LLB_Q5_0 || qt == LLB_Q5_1) add_fifth_bits_pair(ld256(plane + 32 * h), k, &ql, &qh);
            if (qt == LLB_MXFP4) { /* grid_lookup_h's */
                const __m256i lut = grid_lut(llb_fp4_grid, LLB_MXFP4_OFF);
                ql = _mm256_shuffle_epi8(lut, ql);
                qh = _mm256_shuffle_epi8(lut, qh);
            }
            const __m256i pl = _mm256_maddubs_epi16(ql, xl), ph = _mm256_maddubs_epi16(qh, xh);
            lo[h] = k ? _mm256_add_epi16(lo[h], pl) : pl;
            hi[h] = k ? _mm256_add_epi16(hi[h], ph) : ph;
            __asm__("" : "+x"(lo[h]), "+x"(hi[h])); /* chains in registers: GCC's tree of them spilled */
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    LLB_UNROLL
    for (int h = 0; h < 2; h++) {
        if (WIDE32(qt)) {
            s[h] = _mm256_add_epi32(_mm256_madd_epi16(lo[h], ones), _mm256_madd_epi16(hi[h], ones));
            continue;
        }
        __m256i p = _mm256_add_epi16(lo[h], hi[h]);
        if (act_offset(qt)) p = _mm256_add_epi16(p, _mm256_set1_epi32(xb));
        s[h] = _mm256_madd_epi16(p, ones);
    }
}

/* A GEMV block's outlier residual dot (rare), out of line: inline, GCC kept the decoded codes live from
 * the main dot's through the loop and spilled them and the sums (10-16% of the signed GEMVs). Only the
 * integer dots come back through memory: tot, which the float steps chain through, stays in registers
 * (handing tot over kept it on the stack, a store and a reload in every block's chain). */
__attribute__((noinline)) TGT static void residual_dot(const int qt, const uint8_t *gb, const int8_t *xq2, int32_t xb2,
                                                       __m256i s[2]) {
    switch (qt) {
    case LLB_Q8_0: signed_dot2(LLB_Q8_0, gb, xq2, s); break;
    case LLB_IQ4_NL: signed_dot2(LLB_IQ4_NL, gb, xq2, s); break;
    case LLB_Q4_0: unsigned_dot2(LLB_Q4_0, gb, xq2, xb2, s); break;
    case LLB_Q4_1: unsigned_dot2(LLB_Q4_1, gb, xq2, xb2, s); break;
    case LLB_Q5_0: unsigned_dot2(LLB_Q5_0, gb, xq2, xb2, s); break;
    case LLB_Q5_1: unsigned_dot2(LLB_Q5_1, gb, xq2, xb2, s); break;
    case LLB_MXFP4: unsigned_dot2(LLB_MXFP4, gb, xq2, xb2, s); break;
    }
}

/* n == 1: both halves of the group in one pass over its blocks (each line streamed once, ahead of its
 * use; the activation broadcasts shared), each half as a GEMM tile sums it. A partial group's missing
 * rows are zero-padded (scale 0), so the second half runs anyway and its stores are masked. */
LLB_AI TGT void gemv32(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const long nb = mm->cols / 32;
    const llb_act *a = &mm->a; /* n == 1: xt = 1, the row's blocks are contiguous */
    __m256 tot[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (long b = 0; b < nb; b++) {
        const uint8_t *gb = wg + b * LLB_GB_BYTES(qt);
        llb_prefetch_ahead(gb, LLB_GB_BYTES(qt), 0);
        __m256i s[2];
        if (SIGNED32(qt)) signed_dot2(qt, gb, a->qs + 32 * b, s);
        else unsigned_dot2(qt, gb, a->qs + 32 * b, a->bias[b], s);
        LLB_UNROLL
        for (int h = 0; h < 2; h++) /* block_acc's steps */
            tot[h] = block_fin(qt, s[h], block_scale8(qt, gb, h), block_min8(qt, gb, h), a->d[b], a->sum[b], tot[h], 1);
        if (a->d2[b] != 0.0f) {
            residual_dot(qt, gb, a->qs2 + 32 * b, a->bias2[b], s);
            LLB_UNROLL
            for (int h = 0; h < 2; h++)
                tot[h] = block_fin(qt, s[h], block_scale8(qt, gb, h), _mm256_setzero_ps(), a->d2[b], 0.0f, tot[h], 0);
        }
    }
    store_half(mm, g, 0, 0, 1, tot);
    store_half(mm, g, 1, 0, 1, tot + 1);
}

/* GEMM: a work unit decodes the group once per K chunk into a panel on the stack, which its tiles of
 * activation rows read (panel_dotm); a tile's sums run on across chunks through its outputs
 * (stored and reloaded: exact), so each row sums block by block as the GEMV does. Per block: both
 * halves' 16 code vectors, scales and mins (640 bytes, a chunk of 32 blocks 20 KB, near L1); the signed
 * types (Q8_0, IQ4_NL) also keep w and |w| (the offset removed once, not per row): 1152 bytes, 18 a chunk
 * (21 KB: a 576-wide row in one chunk, 3% faster than 16 + 2 on Zen 3; 24 was slower at K = 1536). */
#define PANEL32(qt) (SIGNED32(qt) ? 36 : 20)
#define KC32(qt) (SIGNED32(qt) ? 18 : 32)
#define PANEL32_MAX 648 /* vectors: the larger of 20 x 32 and 36 x 18 */

LLB_AI TGT void fill_panel32(const int qt, const uint8_t *wg, long b0, long b1, __m256i *pan) {
    for (long b = b0; b < b1; b++) {
        const uint8_t *gb = wg + b * LLB_GB_BYTES(qt);
        __m256i *pb = pan + PANEL32(qt) * (b - b0);
        llb_prefetch_ahead(gb, LLB_GB_BYTES(qt), 0);
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i q[8];
            dec_block32_h(qt, gb, h, q);
            LLB_UNROLL
            for (int t = 0; t < 8; t++) {
                if (!SIGNED32(qt)) {
                    _mm256_store_si256(pb + 8 * h + t, q[t]);
                } else { /* w at 0..15, |w| at 20..35 */
                    const __m256i w = _mm256_xor_si256(q[t], _mm256_set1_epi8((char)0x80));
                    _mm256_store_si256(pb + 8 * h + t, w);
                    _mm256_store_si256(pb + 20 + 8 * h + t, _mm256_sign_epi8(w, w));
                }
            }
            _mm256_store_ps((float *)(pb + 16 + h), block_scale8(qt, gb, h));
            if (LLB_HAS_MIN32(qt)) _mm256_store_ps((float *)(pb + 18 + h), block_min8(qt, gb, h));
        }
    }
}

/* Quads [t0, t1) of panel_dotm's unsigned types, their int16 chains p carried between calls (a tile
 * runs a block's quads in two steps with the previous block's float steps in between), started from
 * the zero point's words (xb[m], zero_words); s is final once t1 == 8. */
LLB_AI TGT void panel_dotq(const int qt, const __m256i *pb, const int8_t *xq, const int32_t *xb, const int M, const int t0,
                           const int t1, __m256i p[][2], __m256i s[][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int wide = WIDE32(qt); /* int16 sums of 4 quads, as block_dot_h */
    LLB_UNROLL
    for (int t = t0; t < t1; t++) {
        const __m256i c0 = _mm256_load_si256(pb + t), c1 = _mm256_load_si256(pb + 8 + t);
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const __m256i x = bcast32(xq + 32 * m + 4 * t);
            __m256i v0 = _mm256_maddubs_epi16(c0, x), v1 = _mm256_maddubs_epi16(c1, x);
            if (t == 0 && act_offset(qt)) {
                const __m256i z = _mm256_set1_epi32(xb[m]);
                v0 = _mm256_add_epi16(v0, z), v1 = _mm256_add_epi16(v1, z);
            }
            const int first = t == 0 || (wide && t == 4);
            p[m][0] = first ? v0 : _mm256_add_epi16(p[m][0], v0);
            p[m][1] = first ? v1 : _mm256_add_epi16(p[m][1], v1);
            /* keeps the chains in registers (GCC otherwise reassociates them into a spilled tree) */
            __asm__("" : "+x"(p[m][0]), "+x"(p[m][1]));
            if (wide && t == 3) s[m][0] = _mm256_madd_epi16(p[m][0], ones), s[m][1] = _mm256_madd_epi16(p[m][1], ones);
        }
    }
    if (t1 < 8) return;
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        LLB_UNROLL
        for (int h = 0; h < 2; h++)
            s[m][h] = wide ? _mm256_add_epi32(s[m][h], _mm256_madd_epi16(p[m][h], ones)) : _mm256_madd_epi16(p[m][h], ones);
}

/* Both halves' integer dots of one panel block with M activation rows' blocks (s[m][h]; equal to
 * block_dot_h's: exact integers), quad by quad: each quad's code vectors of both halves loaded once for
 * the M rows, each activation broadcast feeding both halves. Row by row (every code reloaded per row,
 * as memory operands) the loads bounded the tile on Zen 3: llvm-mca znver3 74 -> 61 cycles a block. */
LLB_AI TGT void panel_dotm(const int qt, const __m256i *pb, const int8_t *xq, const int32_t *xb, const int M, __m256i s[][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (SIGNED32(qt)) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) s[m][0] = s[m][1] = _mm256_setzero_si256();
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            const __m256i a0 = _mm256_load_si256(pb + 20 + t), a1 = _mm256_load_si256(pb + 28 + t);
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                /* w as memory operands of the signs, read per row (an opaque pointer: not kept in registers) */
                const __m256i *pw = pb;
                __asm__("" : "+r"(pw));
                const __m256i w0 = _mm256_load_si256(pw + t), w1 = _mm256_load_si256(pw + 8 + t);
                const __m256i x = bcast32(xq + 32 * m + 4 * t);
                s[m][0] = _mm256_add_epi32(s[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
                s[m][1] = _mm256_add_epi32(s[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
                __asm__("" : "+x"(s[m][0]), "+x"(s[m][1]));
            }
        }
        return;
    }
    __m256i p[TILE_ROWS][2];
    panel_dotq(qt, pb, xq, xb, M, 0, 8, p, s);
}

/* The float steps of one panel block for a tile's M rows (s[m][h] its integer dots), and an outlier
 * block's residual (LLB_OUTLIER), into tot[2m + h]. */
LLB_AI TGT void tile_fin(const int qt, const __m256i *pb, const int M, __m256i s[][2], const float *xd, const float *xs,
                         const int8_t *xq2, const float *xd2, const int32_t *xb2, __m256 tot[]) {
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        LLB_UNROLL
        for (int h = 0; h < 2; h++)
            tot[2 * m + h] = block_fin(qt, s[m][h], _mm256_load_ps((const float *)(pb + 16 + h)),
                                       _mm256_load_ps((const float *)(pb + 18 + h)), xd[m], xs[m], tot[2 * m + h], 1);
    /* d2 is 0.0f or positive, tested as integers (no FP compare in the loop): first the tile's rows at once
     * (most blocks have no residual in any row), then row by row; each row's float steps keep their order */
    int any = 0;
    if (M == 4) {
        const __m128i d2 = _mm_loadu_si128((const __m128i *)xd2);
        any = !_mm_testz_si128(d2, d2);
    } else {
        LLB_UNROLL
        for (int m = 0; m < M; m++) any |= llb_ld32(xd2 + m);
    }
    if (!any) return;
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        if (llb_ld32(xd2 + m) != 0) {
            __m256i r[1][2];
            panel_dotm(qt, pb, xq2 + 32 * m, xb2 + m, 1, r);
            LLB_UNROLL
            for (int h = 0; h < 2; h++)
                tot[2 * m + h] = block_fin(qt, r[0][h], _mm256_load_ps((const float *)(pb + 16 + h)), _mm256_setzero_ps(),
                                           xd2[m], 0.0f, tot[2 * m + h], 0);
        }
    }
}

/* M activation rows from row i (one activation tile) against the whole group over the panel's blocks
 * [b0, b1): tot[2m + h] = row m x half h, loaded from the outputs after the first chunk. */
LLB_AI TGT void tile32(const llb_mm *mm, const __m256i *pan, long g, long b0, long b1, long i, const int M, const int qt) {
    const long nb = mm->cols / 32, xt = mm->a.xt;
    const size_t at = llb_act_at(i, b0, nb, xt);
    const int8_t *xq = mm->a.qs + 32 * at, *xq2 = mm->a.qs2 + 32 * at;
    const float *xd = mm->a.d + at, *xs = mm->a.sum + at, *xd2 = mm->a.d2 + at;
    const int32_t *xb = mm->a.bias + at, *xb2 = mm->a.bias2 + at;
    const int nr = llb_group_rows(mm, g);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lanes), _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lanes)};
    float *o = mm->out + i * mm->rows + g * LLB_IL;
    __m256 tot[2 * TILE_ROWS];
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        LLB_UNROLL
        for (int h = 0; h < 2; h++)
            tot[2 * m + h] = !b0 ? _mm256_setzero_ps() : nr == LLB_IL ? _mm256_loadu_ps(o + m * mm->rows + 8 * h)
                                                                      : _mm256_maskload_ps(o + m * mm->rows + 8 * h, mask[h]);
    /* software-pipelined: block b's float steps come between block b + 1's integer dots in program
     * order, so their inputs are ready when they issue and the next block's dots are not held back behind
     * the epilogue's latency chain (cvt, mul, fma): 1.1-1.25x on Zen 3. The last block is peeled. */
    __m256i sm[TILE_ROWS][2];
    panel_dotm(qt, pan, xq, xb, M, sm);
    long b = b0;
    for (; b + 1 < b1; b++) {
        const __m256i *pb = pan + PANEL32(qt) * (b - b0);
        const long nx = 32 * xt;
        __m256i sn[TILE_ROWS][2], pn[TILE_ROWS][2];
        if (SIGNED32(qt)) panel_dotm(qt, pb + PANEL32(qt), xq + nx, xb + xt, M, sn);
        else panel_dotq(qt, pb + PANEL32(qt), xq + nx, xb + xt, M, 0, 4, pn, sn);
        tile_fin(qt, pb, M, sm, xd, xs, xq2, xd2, xb2, tot);
        if (!SIGNED32(qt)) panel_dotq(qt, pb + PANEL32(qt), xq + nx, xb + xt, M, 4, 8, pn, sn);
        LLB_UNROLL
        for (int m = 0; m < M; m++) sm[m][0] = sn[m][0], sm[m][1] = sn[m][1];
        xq += nx;
        xd += xt;
        xs += xt;
        xb += xt;
        xq2 += nx;
        xd2 += xt;
        xb2 += xt;
    }
    tile_fin(qt, pan + PANEL32(qt) * (b - b0), M, sm, xd, xs, xq2, xd2, xb2, tot);
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            /* a full group stores plainly: a vmaskmovps store costs tens of cycles on Zen */
            if (nr == LLB_IL) _mm256_storeu_ps(o + m * mm->rows + 8 * h, tot[2 * m + h]);
            else _mm256_maskstore_ps(o + m * mm->rows + 8 * h, mask[h], tot[2 * m + h]);
        }
}

LLB_AI TGT void fast32(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    if (LLB_GEMV(mm)) {
        gemv32(mm, wg, g, qt);
        return;
    }
    const long nb = mm->cols / 32;
    __m256i pan[PANEL32_MAX];
    for (long b0 = 0; b0 < nb; b0 += KC32(qt)) {
        const long b1 = b0 + KC32(qt) < nb ? b0 + KC32(qt) : nb;
        fill_panel32(qt, wg, b0, b1, pan);
#define TILE32(i, M) tile32(mm, pan, g, b0, b1, i, M, qt)
        LLB_TILE_LADDER(i0, i1, TILE_ROWS, TILE32);
#undef TILE32
    }
}

TGT static void fast_q4_0(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q4_0); }
TGT static void fast_q4_1(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q4_1); }
TGT static void fast_q5_0(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q5_0); }
TGT static void fast_q8_0(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q8_0); }
TGT static void fast_q5_1(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q5_1); }
TGT static void fast_iq4_nl(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_IQ4_NL); }
TGT static void fast_mxfp4(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_MXFP4); }

/* ---- exact kernels: dequantize a 16x32 chunk to FP32 (layout [quad][row][j], as in
 * avx512.c), then FMA against broadcasts of 4 activations ------------- */

/* Per-row scales of rows 8h..8h+7 -> per T lane of ymm k (rows 2k, 2k+1 of the half, 4 times each). */
LLB_AI TGT __m256 spread_rows(__m256 v, int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1));
}

/* Codes of half h, quads 0..3 scaled by (dw0, mw0), quads 4..7 by (dw1, mw1). */
LLB_AI TGT void codes_to_T(const __m256i q[8], int h, __m256 dw0, __m256 mw0, __m256 dw1, __m256 mw1, float *T) {
    __attribute__((aligned(32))) uint8_t U[8 * 32];
    LLB_UNROLL
    for (int t = 0; t < 8; t++) _mm256_store_si256((__m256i *)(U + 32 * t), q[t]);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m256 d0 = spread_rows(dw0, k), m0 = spread_rows(mw0, k), d1 = spread_rows(dw1, k), m1 = spread_rows(mw1, k);
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(U + 32 * t + 8 * k)));
            _mm256_store_ps(T + 64 * t + 32 * h + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), t < 4 ? d0 : d1, t < 4 ? m0 : m1));
        }
    }
}

LLB_AI TGT void chunk_T(const int qt, const uint8_t *wg, long c, float *T) {
    LLB_UNROLL
    for (int h = 0; h < 2; h++) {
        __m256i q[8];
        if (qt == LLB_Q4_K || qt == LLB_Q5_K) {
            const uint8_t *gb = wg + (c >> 3) * LLB_GB_BYTES(qt);
            const int s = (int)(c & 7);
            dec_k4_sub_h(qt, gb, s, h, q);
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 64 + 16 * s + 8 * h))));
            const __m256i mn16 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(gb + 192 + 32 * (s >> 1) + 16 * h)));
            const __m256 mn = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(mn16, 8 * (s & 1)), _mm256_set1_epi32(0xFF)));
            const __m256 dw = _mm256_mul_ps(load_f16x8(gb + 16 * h), sc);
            const __m256 mw = _mm256_mul_ps(load_f16x8(gb + 32 + 16 * h), _mm256_sub_ps(_mm256_setzero_ps(), mn));
            codes_to_T(q, h, dw, mw, dw, mw, T);
        } else if (qt == LLB_IQ4_XS) { /* codes are grid + 128 */
            const uint8_t *gb = wg + (c >> 3) * LLB_GB_IQ4_XS;
            const int s = (int)(c & 7);
            dec_k4_sub_h(qt, gb, s, h, q);
            const __m256 dw = _mm256_mul_ps(load_f16x8(gb + 16 * h), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 32 + 16 * s + 8 * h)))));
            const __m256 mw = _mm256_mul_ps(dw, _mm256_set1_ps(-128.0f));
            codes_to_T(q, h, dw, mw, dw, mw, T);
        } else if (qt == LLB_Q6_K) {
            const uint8_t *gb = wg + (c >> 3) * LLB_GB_Q6_K;
            const int u = 2 * (int)(c & 7);
            dec_q6k_sub_h(gb + LLB_Q6_K_SUBS + 192 * u, h, q);
            dec_q6k_sub_h(gb + LLB_Q6_K_SUBS + 192 * (u + 1), h, q + 4);
            const __m256 d = load_f16x8(gb + 16 * h), m32 = _mm256_set1_ps(-32.0f);
            const __m256 dw0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 32 + 16 * u + 8 * h)))));
            const __m256 dw1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + 48 + 16 * u + 8 * h)))));
            codes_to_T(q, h, dw0, _mm256_mul_ps(dw0, m32), dw1, _mm256_mul_ps(dw1, m32), T);
        } else if (qt == LLB_Q3_K || qt == LLB_Q2_K) { /* sub-blocks 2s, 2s+1 */
            const uint8_t *gb = wg + (c >> 3) * LLB_GB_BYTES(qt);
            const int u = 2 * (int)(c & 7);
            dec_k16_sub_h(qt, gb, u, h, q);
            dec_k16_sub_h(qt, gb, u + 1, h, q + 4);
            const __m256 d = load_f16x8(gb + 16 * h);
            __m256 dw[2], mw[2];
            for (int k = 0; k < 2; k++) {
                const __m128i b8 = _mm_loadl_epi64((const __m128i *)(gb + (qt == LLB_Q3_K ? 32 : 64) + 16 * (u + k) + 8 * h));
                if (qt == LLB_Q3_K) {
                    dw[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8)));
                    mw[k] = _mm256_mul_ps(dw[k], _mm256_set1_ps(-4.0f));
                } else {
                    const __m256i sm = _mm256_cvtepu8_epi32(b8);
                    dw[k] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(15))));
                    mw[k] = _mm256_mul_ps(load_f16x8(gb + 32 + 16 * h), _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_srli_epi32(sm, 4))));
                }
            }
            codes_to_T(q, h, dw[0], mw[0], dw[1], mw[1], T);
        } else {
            const uint8_t *gb = wg + c * LLB_GB_BYTES(qt);
            dec_block32_h(qt, gb, h, q);
            const __m256 d = block_scale8(qt, gb, h);
            __m256 mw;
            if (LLB_HAS_MIN32(qt)) mw = load_f16x8(gb + 32 + 16 * h);
            else mw = _mm256_mul_ps(d, _mm256_set1_ps((float)-LLB_CODE_OFF32(qt)));
            codes_to_T(q, h, d, mw, d, mw, T);
        }
    }
}

/* F32/F16/BF16 rows (file layout) into T; a partial last chunk is copied to a zero-padded buffer first. */
LLB_AI TGT void float_chunk_T(const int qt, const llb_mm *mm, const uint8_t *wg, int nr, long c, float *T) {
    const int esize = qt == LLB_F32 ? 4 : 2;
    const long left = mm->cols - 32 * c;
    __attribute__((aligned(32))) uint8_t pad[128];
    for (int r = 0; r < nr; r++) {
        const uint8_t *src = wg + r * mm->row_bytes + 32 * esize * c;
        if (left < 32) {
            memset(pad, 0, sizeof pad);
            memcpy(pad, src, (size_t)left * esize);
            src = pad;
        }
        LLB_UNROLL
        for (int k = 0; k < 4; k++) { /* values 8k..8k+7 = quads 2k, 2k+1 */
            __m256 v;
            if (qt == LLB_F32) v = _mm256_loadu_ps((const float *)src + 8 * k);
            else if (qt == LLB_F16) v = load_f16x8(src + 16 * k);
            else v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 16 * k))), 16));
            _mm_store_ps(T + 64 * (2 * k) + 4 * r, _mm256_castps256_ps128(v));
            _mm_store_ps(T + 64 * (2 * k + 1) + 4 * r, _mm256_extractf128_ps(v, 1));
        }
    }
}

LLB_AI TGT void exact_kernel(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    const long K = mm->cols, nch = (K + 31) / 32;
    const int nr = llb_group_rows(mm, g), is_float = qt == LLB_F32 || qt == LLB_F16 || qt == LLB_BF16;
    __attribute__((aligned(32))) float T[8 * 64], acc[LLB_ICHUNK][64], xpad[32];
    if (is_float && nr < LLB_IL) memset(T, 0, sizeof T);
    memset(acc, 0, sizeof(float) * 64 * (size_t)(i1 - i0));
    for (long c = 0; c < nch; c++) {
        if (is_float) float_chunk_T(qt, mm, wg, nr, c, T);
        else chunk_T(qt, wg, c, T);
        const int tail = 32 * c + 32 > K;
        for (long i = i0; i < i1; i++) {
            const float *x = mm->x + i * K + 32 * c;
            if (tail) {
                memset(xpad, 0, sizeof xpad);
                memcpy(xpad, x, sizeof(float) * (size_t)(K - 32 * c));
                x = xpad;
            }
            float *a = acc[i - i0];
            __m256 av[8];
            LLB_UNROLL
            for (int k = 0; k < 8; k++) av[k] = _mm256_load_ps(a + 8 * k);
            for (int t = 0; t < 8; t++) {
                const __m256 xb = _mm256_broadcast_ps((const __m128 *)(x + 4 * t));
                LLB_UNROLL
                for (int k = 0; k < 8; k++) av[k] = _mm256_fmadd_ps(_mm256_load_ps(T + 64 * t + 8 * k), xb, av[k]);
            }
            LLB_UNROLL
            for (int k = 0; k < 8; k++) _mm256_store_ps(a + 8 * k, av[k]);
        }
    }
    for (long i = i0; i < i1; i++) llb_store_quad_sums(acc[i - i0], mm->out + i * mm->rows + g * LLB_IL, nr);
}

/* n == 1 for F32/F16/BF16: row-by-row dot products (4 rows share each activation load);
 * the last partial 8 values of a row go through a zero-padded copy. */
LLB_AI TGT __m256 load_row8(const int qt, const uint8_t *p) {
    if (qt == LLB_F32) return _mm256_loadu_ps((const float *)p);
    if (qt == LLB_F16) return load_f16x8(p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

LLB_AI TGT void float_gemv(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const int nr = llb_group_rows(mm, g), es = qt == LLB_F32 ? 4 : 2;
    const long K = mm->cols, K8 = K / 8 * 8;
    float *o = mm->out + g * LLB_IL;
    __attribute__((aligned(32))) float xpad[8] = {0};
    __attribute__((aligned(32))) uint8_t wpad[4][32];
    memcpy(xpad, mm->x + K8, sizeof(float) * (size_t)(K - K8));
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int rn = nr - r0 < 4 ? nr - r0 : 4;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (long k = 0; k < K8; k += 8) {
            const __m256 x = _mm256_loadu_ps(mm->x + k);
            LLB_UNROLL
            for (int r = 0; r < 4; r++)
                if (r < rn) {
                    const uint8_t *row = wg + (size_t)(r0 + r) * mm->row_bytes;
                    _mm_prefetch((const char *)row + es * k + LLB_PF_DIST / 4, _MM_HINT_T0);
                    acc[r] = _mm256_fmadd_ps(load_row8(qt, row + es * k), x, acc[r]);
                }
        }
        if (K8 < K)
            for (int r = 0; r < rn; r++) {
                memset(wpad[r], 0, sizeof wpad[r]);
                memcpy(wpad[r], wg + (size_t)(r0 + r) * mm->row_bytes + es * K8, (size_t)(es * (K - K8)));
                acc[r] = _mm256_fmadd_ps(load_row8(qt, wpad[r]), _mm256_load_ps(xpad), acc[r]);
            }
        for (int r = 0; r < rn; r++) o[r0 + r] = llb_hsum8(acc[r]);
    }
}

/* n == 1 for F32/F16/BF16 in exact_kernel's order, so that a single row equals that row of a
 * batch bit for bit: per row, 4 chains over the values k = j (mod 4) in order, then
 * (c0 + c1) + (c2 + c3). A ymm holds 2 rows x 4 consecutive values (exact_kernel's lanes), joined
 * by one 128-bit insert; the group's 8 row pairs are 8 independent chains. Measured 1.0-1.5x the
 * time of float_gemv, 0.7-1.0x that of exact_kernel at n == 1. */
LLB_AI TGT __m256 load_quads(const int qt, const uint8_t *r0, const uint8_t *r1, long k) {
    if (qt == LLB_F32)
        return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps((const float *)r0 + k)), _mm_loadu_ps((const float *)r1 + k), 1);
    const __m128i h = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)(r0 + 2 * k))), (const double *)(r1 + 2 * k)));
    if (qt == LLB_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

LLB_AI TGT void float_gemv_ordered(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const int nr = llb_group_rows(mm, g), np = (nr + 1) / 2, es = qt == LLB_F32 ? 4 : 2;
    const long K = mm->cols, K4 = K / 4 * 4, line = 64 / es; /* values per cache line */
    const uint8_t *row[LLB_IL];
    for (int r = 0; r < LLB_IL; r++) row[r] = wg + (size_t)(r < nr ? r : nr - 1) * mm->row_bytes; /* a missing row: any real one */
    __m256 acc[8];
    LLB_UNROLL
    for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
    for (long k0 = 0; k0 < K4; k0 += line) {
        for (int r = 0; r < nr; r++) _mm_prefetch((const char *)row[r] + es * k0 + LLB_PF_DIST / 4, _MM_HINT_T0);
        const long k1 = k0 + line < K4 ? k0 + line : K4;
        for (long k = k0; k < k1; k += 4) {
            const __m256 xb = _mm256_broadcast_ps((const __m128 *)(mm->x + k));
            LLB_UNROLL
            for (int p = 0; p < 8; p++)
                if (p < np) acc[p] = _mm256_fmadd_ps(load_quads(qt, row[2 * p], row[2 * p + 1], k), xb, acc[p]);
        }
    }
    if (K4 < K) { /* the last 1-3 values, zero-padded (0 x 0 adds nothing) */
        __attribute__((aligned(16))) float xpad[4] = {0};
        __attribute__((aligned(16))) uint8_t wpad[LLB_IL][16];
        memcpy(xpad, mm->x + K4, sizeof(float) * (size_t)(K - K4));
        for (int r = 0; r < LLB_IL; r++) {
            memset(wpad[r], 0, sizeof wpad[r]);
            memcpy(wpad[r], row[r] + es * K4, (size_t)(es * (K - K4)));
        }
        const __m256 xb = _mm256_broadcast_ps((const __m128 *)xpad);
        LLB_UNROLL
        for (int p = 0; p < 8; p++)
            if (p < np) acc[p] = _mm256_fmadd_ps(load_quads(qt, wpad[2 * p], wpad[2 * p + 1], 0), xb, acc[p]);
    }
    __attribute__((aligned(32))) float a[64]; /* a[4r + j]: chain j of row r */
    LLB_UNROLL
    for (int p = 0; p < 8; p++) _mm256_store_ps(a + 8 * p, acc[p]);
    llb_store_quad_sums(a, mm->out + g * LLB_IL, nr);
}

#define LLB_KQUANT_FAST llb_avx2_kquant_kernel
#define LLB_PAIRS(qt, exact) (!(exact) && llb_avx2_kquant_pairs(qt))
#define LLB_KERNELS_NAME llb_kernels_avx2
#include "matmul/kernels/table.inc"
#endif

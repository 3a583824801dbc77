/* AVX2 integer kernels of the 256-value types (Q4_K, Q5_K, Q6_K, IQ4_XS, Q3_K, Q2_K) against activations
 * quantized with one scale per 32 values; the same arithmetic as the AVX-512
 * file (avx512_kquants.c), on 8-row halves of each group. */
#include "matmul/kernels/avx2_decode.h"

#if LLB_X86

/* Activation rows per GEMM tile: one xt-tile (LLB_XT) of them per decoded half, the 8 x 8 accumulators
 * spilling in part; from 4 rows, Q4_K prefill ran 15% and Q6_K 29% faster on Zen 3 (the decoding and
 * the half's weight vectors are shared by twice the rows). Q4_K's GEMM now runs tile_q4k2 instead. */
#define TILE_ROWS 8

LLB_AI TGT __m256 sub_scale(const uint8_t *sc8, __m256 d, int is_signed) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)sc8);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)));
}

/* m[s] of rows 8h..8h+7 as FP32: bytes 192 + 32p + 2r + j = row r's min of sub 2p+j. */
LLB_AI TGT void q4k_mins_h(const uint8_t *gb, int h, __m256 mn[8]) {
    LLB_UNROLL
    for (int p = 0; p < 4; p++) {
        const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(gb + 192 + 32 * p + 16 * h)));
        mn[2 * p] = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)));
        mn[2 * p + 1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 16));
    }
}

/* The min term of one activation row: dmin * sum_s m[s] * (dx[s]*bsum32[s]) (the quantized sums). */
LLB_AI TGT __m256 q4k_min_term(const __m256 mn[8], const float *xs, __m256 dmin, __m256 tot) {
    __m256 a = _mm256_mul_ps(mn[0], _mm256_set1_ps(xs[0])), b = _mm256_mul_ps(mn[1], _mm256_set1_ps(xs[1]));
    LLB_UNROLL
    for (int s = 2; s < 8; s += 2) {
        a = _mm256_fmadd_ps(mn[s], _mm256_set1_ps(xs[s]), a);
        b = _mm256_fmadd_ps(mn[s + 1], _mm256_set1_ps(xs[s + 1]), b);
    }
    return _mm256_fnmadd_ps(_mm256_add_ps(a, b), dmin, tot);
}

/* Q4_K, Q5_K and IQ4_XS (qt): Q5_K's codes are Q4_K's plus a 5th bit; IQ4_XS's are level + 128,
 * dotted as signed values, with signed scales and no min. Halves h0 .. h0 + H - 1 of the group in one
 * pass over K (tot[hh][m]): the GEMV takes both (H = 2), so the group streams from memory once rather
 * than rows 8-15 in a second pass from L2 with the memory idle; every lane's operations are the same
 * whatever H, so a GEMV row equals a GEMM row (which runs H = 1 on up to TILE_ROWS rows). */
LLB_AI TGT void tile_q4k(const int qt, const llb_mm *mm, const uint8_t *wg, int h0, const int H, long i, const int M,
                         const int gemv, __m256 tot[][TILE_ROWS]) {
    const long nsb = mm->cols / 256;
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, nsb, xt);
    LLB_UNROLL
    for (int hh = 0; hh < H; hh++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) tot[hh][m] = _mm256_setzero_ps();
    }
    for (long sb = 0; sb < nsb; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_BYTES(qt);
        const size_t e = at + xt * sb;
        for (int s = 0; s < 8; s++) {
            if (gemv) llb_prefetch_slice(gb, LLB_GB_BYTES(qt), s);
            LLB_UNROLL
            for (int hh = 0; hh < H; hh++) {
                const int h = h0 + hh;
                __m256i q[8];
                const __m256 d = load_f16x8(gb + 16 * h);
                /* IQ4_XS's GEMV: signed levels and dot_xsign (its |x| shared by both halves); a GEMM tile
                 * keeps dot_off128, whose weight-side steps its rows share. The same integers either way. */
                const int xsign = qt == LLB_IQ4_XS && H == 2;
                if (xsign) {
                    dec_nibbles_h(gb + LLB_IQ4_XS_CODES + 256 * s, h, q);
                    grid_lookup_h(llb_iq4_grid, 0, q);
                } else {
                    dec_k4_sub_h(qt, gb, s, h, q);
                }
                const __m256 sc = qt == LLB_IQ4_XS ? sub_scale(gb + 32 + 16 * s + 8 * h, d, 1) : sub_scale(gb + 64 + 16 * s + 8 * h, d, 0);
                LLB_UNROLL
                for (int m = 0; m < M; m++) {
                    const int8_t *xq = mm->a.qs + 256 * (e + m) + 32 * s;
                    /* int16 sums: 8 quads of 4-bit codes (8 x 2 x 15 x 127 < 2^15), 4 quads of 5-bit ones */
                    const __m256i acc = xsign ? dot_xsign(q, xq)
                                        : qt == LLB_IQ4_XS ? dot_off128(q, 8, xq)
                                        : qt == LLB_Q4_K ? dot_u8s8(q, 8, xq)
                                                         : _mm256_add_epi32(dot_u8s8(q, 4, xq), dot_u8s8(q + 4, 4, xq + 16));
                    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(mm->a.d[8 * (e + m) + s]));
                    tot[hh][m] = _mm256_fmadd_ps(v, sc, tot[hh][m]);
                }
            }
        }
        if (qt == LLB_IQ4_XS) continue;
        LLB_UNROLL
        for (int hh = 0; hh < H; hh++) {
            __m256 mn[8];
            q4k_mins_h(gb, h0 + hh, mn);
            const __m256 dmin = load_f16x8(gb + 32 + 16 * (h0 + hh));
            LLB_UNROLL
            for (int m = 0; m < M; m++) tot[hh][m] = q4k_min_term(mn, mm->a.sum + 8 * (e + m), dmin, tot[hh][m]);
        }
    }
}

/* Q4_K's GEMM tile on both halves of the group: each activation broadcast feeds rows 0-7 and 8-15
 * (on Zen 3 the broadcasts and the loads, not the multiplies, bounded the 8-row one-half tile), one
 * quad of both halves decoded at a time. The int16 sums are exact in any order, and
 * the float steps per (half, row) are tile_q4k's in its order: every lane equals the GEMV's. */
#define TILE2_ROWS 4
LLB_AI TGT void tile_q4k2(const llb_mm *mm, const uint8_t *wg, long i, const int M, __m256 tot[2][TILE_ROWS]) {
    const long nsb = mm->cols / 256;
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, nsb, xt);
    const __m256i m4 = _mm256_set1_epi8(15);
    LLB_UNROLL
    for (int h = 0; h < 2; h++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) tot[h][m] = _mm256_setzero_ps();
    }
    for (long sb = 0; sb < nsb; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_Q4_K;
        const size_t e = at + xt * sb;
        for (int s = 0; s < 8; s++) {
            const uint8_t *v = gb + LLB_Q4_K_CODES + 256 * s;
            const int8_t *xq = mm->a.qs + 256 * e + 32 * s;
            __m256i p[2][TILE2_ROWS];
            LLB_UNROLL
            for (int t = 0; t < 8; t++) { /* quad t: nibbles (t >> 2) of vector t & 3, one quad at a time (few registers) */
                __m256i q0 = ld256(v + 64 * (t & 3)), q1 = ld256(v + 64 * (t & 3) + 32);
                if (t >= 4) q0 = _mm256_srli_epi16(q0, 4), q1 = _mm256_srli_epi16(q1, 4);
                q0 = _mm256_and_si256(q0, m4), q1 = _mm256_and_si256(q1, m4);
                LLB_UNROLL
                for (int m = 0; m < M; m++) {
                    const __m256i b = bcast32(xq + 256 * m + 4 * t);
                    const __m256i t0 = _mm256_maddubs_epi16(q0, b), t1 = _mm256_maddubs_epi16(q1, b);
                    p[0][m] = t ? _mm256_add_epi16(p[0][m], t0) : t0;
                    p[1][m] = t ? _mm256_add_epi16(p[1][m], t1) : t1;
                    /* keeps the sums chained in registers: GCC reassociated them into a tree of all
                     * 64 products first, spilled to the stack */
                    __asm__("" : "+x"(p[0][m]), "+x"(p[1][m]));
                }
            }
            LLB_UNROLL
            for (int h = 0; h < 2; h++) {
                const __m256 sc = sub_scale(gb + 64 + 16 * s + 8 * h, load_f16x8(gb + 16 * h), 0);
                LLB_UNROLL
                for (int m = 0; m < M; m++) {
                    const __m256i acc = _mm256_madd_epi16(p[h][m], _mm256_set1_epi16(1));
                    const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(mm->a.d[8 * (e + m) + s]));
                    tot[h][m] = _mm256_fmadd_ps(x, sc, tot[h][m]);
                }
            }
        }
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256 mn[8];
            q4k_mins_h(gb, h, mn);
            const __m256 dmin = load_f16x8(gb + 32 + 16 * h);
            LLB_UNROLL
            for (int m = 0; m < M; m++) tot[h][m] = q4k_min_term(mn, mm->a.sum + 8 * (e + m), dmin, tot[h][m]);
        }
    }
}

/* Q6_K's step s of rows 8h..8h+7 (sub-blocks u = 2s, 2s+1) for M activation rows: p[m], before the
 * activation scale dx[s]. */
LLB_AI TGT void q6k_step(const llb_mm *mm, const uint8_t *gb, size_t e, int s, int h, const int M, __m256 p[TILE_ROWS]) {
    const __m256 d = load_f16x8(gb + 16 * h);
    LLB_UNROLL
    for (int j = 0; j < 2; j++) {
        const int u = 2 * s + j;
        __m256i q[4];
        dec_q6k_sub_h(gb + LLB_Q6_K_SUBS + 192 * u, h, q);
        const __m256 sc = sub_scale(gb + 32 + 16 * u + 8 * h, d, 1);
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const int8_t *xq = mm->a.qs + 256 * (e + m) + 16 * u;
            const int32_t bs = mm->a.bs16n[16 * (e + m) + u]; /* -32 * bsum16 */
            /* int16 sums of the 6-bit codes two quads at a time (2 x 2 x 63 x 127 < 2^15) */
            __m256i acc = _mm256_add_epi32(dot_u8s8(q, 2, xq), dot_u8s8(q + 2, 2, xq + 8));
            acc = _mm256_add_epi32(acc, _mm256_set1_epi32(bs));
            const __m256 v = _mm256_cvtepi32_ps(acc);
            p[m] = j ? _mm256_fmadd_ps(v, sc, p[m]) : _mm256_mul_ps(v, sc);
        }
    }
}

/* A Q2_K/Q3_K sub-block's 8 scale bytes (rows 8h..8h+7) as int16 pairs, lane r = [s_r, s_r]: Q2_K's
 * file bytes zero-extended (scale | min << 4), Q3_K's signed scales sign-extended. */
LLB_AI TGT __m256i scale_pairs(const int qt, const uint8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    const __m256i b = _mm256_set1_epi64x(v);
    if (qt == LLB_Q2_K)
        return _mm256_shuffle_epi8(b, _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                                       4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1));
    return _mm256_srai_epi16(_mm256_shuffle_epi8(b, _mm256_setr_epi8(-1, 0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3,
                                                                     -1, 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7)), 8);
}

/* Q3_K's and Q2_K's step, as q6k_step: the sub-block scale applied in the integer pair sum (vpmaddwd
 * by [sc, sc] instead of by ones), so the two sub-blocks add as int32 and convert once: per sub-block
 * no scale conversion or float multiply (Q3_K's zero point 4 joins the int16 sums first:
 * |sums| <= 4*2*7*128 + 4*16*128 < 2^15; then * |sc| <= 32). Exact integers, so the result is at least
 * as close as a float sum of the two. */
LLB_AI TGT void k23_step(const int qt, const llb_mm *mm, const uint8_t *gb, size_t e, int s, int h, const int M,
                         __m256 p[TILE_ROWS]) {
    __m256i acc[TILE_ROWS];
    __m256 mn[2];
    LLB_UNROLL
    for (int j = 0; j < 2; j++) {
        const int u = 2 * s + j;
        __m256i q[4];
        dec_k16_sub_h(qt, gb, u, h, q);
        const __m256i sp = scale_pairs(qt, gb + (qt == LLB_Q2_K ? 64 : 32) + 16 * u + 8 * h);
        const __m256i sc = qt == LLB_Q2_K ? _mm256_and_si256(sp, _mm256_set1_epi16(15)) : sp;
        /* Q2_K's min m = the pair's 32-bit lane b | b << 16 shifted down by 20 */
        if (qt == LLB_Q2_K) mn[j] = _mm256_mul_ps(load_f16x8(gb + 32 + 16 * h), _mm256_cvtepi32_ps(_mm256_srli_epi32(sp, 20)));
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const int8_t *xq = mm->a.qs + 256 * (e + m) + 16 * u;
            __m256i v = _mm256_maddubs_epi16(q[0], bcast32(xq));
            LLB_UNROLL
            for (int t = 1; t < 4; t++) v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[t], bcast32(xq + 4 * t)));
            if (qt == LLB_Q3_K) /* -4 * bsum16 into the low word of each pair */
                v = _mm256_add_epi16(v, _mm256_set1_epi32((uint16_t)(mm->a.bs16n[16 * (e + m) + u] / 8)));
            const __m256i a = _mm256_madd_epi16(v, sc);
            acc[m] = j ? _mm256_add_epi32(acc[m], a) : a;
        }
    }
    const __m256 d = load_f16x8(gb + 16 * h);
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        p[m] = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[m]), d);
        if (qt == LLB_Q2_K) { /* - dmin * m * bsum16 (bs16n = -32 * bsum16) */
            p[m] = _mm256_fmadd_ps(mn[0], _mm256_set1_ps((float)mm->a.bs16n[16 * (e + m) + 2 * s] * (1.0f / 32)), p[m]);
            p[m] = _mm256_fmadd_ps(mn[1], _mm256_set1_ps((float)mm->a.bs16n[16 * (e + m) + 2 * s + 1] * (1.0f / 32)), p[m]);
        }
    }
}

/* The 16-value sub-block types Q6_K, Q3_K, Q2_K (see avx512_kquants.c's tile_k16); halves as tile_q4k. */
LLB_AI TGT void tile_k16(const int qt, const llb_mm *mm, const uint8_t *wg, int h0, const int H, long i, const int M,
                         const int gemv, __m256 tot[][TILE_ROWS]) {
    const long nsb = mm->cols / 256;
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, nsb, xt);
    const int gbb = LLB_GB_BYTES(qt);
    LLB_UNROLL
    for (int hh = 0; hh < H; hh++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) tot[hh][m] = _mm256_setzero_ps();
    }
    for (long sb = 0; sb < nsb; sb++) {
        const uint8_t *gb = wg + sb * gbb;
        const size_t e = at + xt * sb;
        for (int s = 0; s < 8; s++) { /* sub-blocks u = 2s, 2s+1 share the activation scale dx[s] */
            if (gemv) llb_prefetch_slice(gb, gbb, s);
            LLB_UNROLL
            for (int hh = 0; hh < H; hh++) {
                __m256 p[TILE_ROWS];
                if (qt == LLB_Q6_K) q6k_step(mm, gb, e, s, h0 + hh, M, p);
                else k23_step(qt, mm, gb, e, s, h0 + hh, M, p);
                LLB_UNROLL
                for (int m = 0; m < M; m++) tot[hh][m] = _mm256_fmadd_ps(p[m], _mm256_set1_ps(mm->a.d[8 * (e + m) + s]), tot[hh][m]);
            }
        }
    }
}

LLB_AI TGT void tile_k(const int qt, const llb_mm *mm, const uint8_t *wg, int h0, const int H, long i, const int M,
                       const int gemv, __m256 tot[][TILE_ROWS]) {
    if (qt == LLB_Q6_K || qt == LLB_Q3_K || qt == LLB_Q2_K) tile_k16(qt, mm, wg, h0, H, i, M, gemv, tot);
    else tile_q4k(qt, mm, wg, h0, H, i, M, gemv, tot);
}

LLB_AI TGT void fast_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    __m256 t[2][TILE_ROWS];
    if (LLB_GEMV(mm)) { /* the tile's arithmetic at M = 1, both halves in one pass, plus prefetch: equal to a batch row */
        if (llb_group_rows(mm, g) > 8) {
            tile_k(qt, mm, wg, 0, 2, 0, 1, 1, t);
            store_half(mm, g, 0, 0, 1, t[0]);
            store_half(mm, g, 1, 0, 1, t[1]);
        } else {
            tile_k(qt, mm, wg, 0, 1, 0, 1, 1, t);
            store_half(mm, g, 0, 0, 1, t[0]);
        }
        return;
    }
    if (qt == LLB_Q4_K && llb_group_rows(mm, g) > 8) {
#define KQ2_TILE(i, M)                                 \
    do {                                               \
        tile_q4k2(mm, wg, i, M, t);                    \
        store_half(mm, g, 0, i, M, t[0]);              \
        store_half(mm, g, 1, i, M, t[1]);              \
    } while (0)
        LLB_TILE_LADDER(i0, i1, TILE2_ROWS, KQ2_TILE);
#undef KQ2_TILE
        return;
    }
    for (int h = 0; h < 2 && 8 * h < llb_group_rows(mm, g); h++) {
#define KQ_TILE(i, M)                                  \
    do {                                               \
        tile_k(qt, mm, wg, h, 1, i, M, 0, t);          \
        store_half(mm, g, h, i, M, t[0]);              \
    } while (0)
        LLB_TILE_LADDER(i0, i1, TILE_ROWS, KQ_TILE);
#undef KQ_TILE
    }
}

TGT static void fast_q4_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q4_K); }
TGT static void fast_q5_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q5_K); }
TGT static void fast_q6_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q6_K); }
TGT static void fast_iq4_xs(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_IQ4_XS); }
TGT static void fast_q2_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q2_K); }
TGT static void fast_q3_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q3_K); }

llb_kernel_fn llb_avx2_kquant_kernel(int qtype) {
    return qtype == LLB_Q4_K ? fast_q4_k : qtype == LLB_Q5_K ? fast_q5_k : qtype == LLB_Q6_K ? fast_q6_k
         : qtype == LLB_IQ4_XS ? fast_iq4_xs : qtype == LLB_Q2_K ? fast_q2_k : qtype == LLB_Q3_K ? fast_q3_k : NULL;
}
#endif

/* AVX2 integer kernels of the 256-value types (Q4_K, Q5_K, Q6_K, IQ4_XS, Q3_K, Q2_K) against activations
 * quantized with one scale per 32 values; the AVX-512 file's (avx512_kquants.c) decoding, on 8-row halves
 * of each group (the sub-block scales of Q4_K and the 16-value types applied in integers here, not in floats). */
#include "matmul/kernels/avx2_decode.h"

#if LLB_X86

/* Activation rows per GEMM tile: one xt-tile (LLB_XT) of them per decoded half, the 8 x 8 accumulators
 * spilling in part; from 4 rows, Q4_K prefill ran 15% and Q6_K 29% faster on Zen 3 (the decoding and
 * the half's weight vectors are shared by twice the rows). Q4_K's GEMM now runs the panel tiles
 * (fast_kp), and Q6_K, Q3_K, Q2_K and IQ4_XS's too where a unit has 4 rows or more. */
#define TILE_ROWS 8

LLB_AI TGT __m256 sub_scale(const uint8_t *sc8, __m256 d, int is_signed) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)sc8);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)));
}

/* 8 bytes (rows 8h..8h+7) zero-extended to int16 pairs, lane r = [b_r, b_r]: vpmaddwd's weights. */
LLB_AI TGT __m256i u8_pairs(const uint8_t *p) {
    long long v;
    memcpy(&v, p, 8);
    return _mm256_shuffle_epi8(_mm256_set1_epi64x(v), _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                                                       4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1));
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

/* Q4_K's step s for one (half, activation row): acc = sc * (codes . x) exact in int32 (the sub-block
 * scale as vpmaddwd's pair: |.| <= 63 x 2 x 30480 < 2^23), times dx[s] into the super-block's sum *t,
 * zeroed per super-block, which the caller scales by d once (not d * sc per step: a multiply fewer). */
LLB_AI TGT void q4k_step(__m256i acc, float dx, __m256 *t) { *t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(dx), *t); }

/* Q5_K and IQ4_XS (qt; Q4_K runs tile_q4kp): Q5_K's codes are Q4_K's plus a 5th bit; IQ4_XS's are
 * level + 128, dotted as signed values, with signed scales and no min. Halves h0 .. h0 + H - 1 of the group in one
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
            if (gemv) llb_prefetch_slice(gb, LLB_GB_BYTES(qt), s, 0);
            if (qt == LLB_IQ4_XS && H == 2 && M == 1) {
                /* IQ4_XS's GEMV: signed levels and dot_xsign2 (its |x| shared by both halves); a GEMM tile
                 * keeps dot_off128, whose weight-side steps its rows share. The same integers either way,
                 * the same float steps as below. */
                __m256i acc[2];
                dot_xsign2(gb + LLB_K4_NIBBLES(LLB_IQ4_XS, s), mm->a.qs + 256 * e + 32 * s, acc);
                LLB_UNROLL
                for (int hh = 0; hh < 2; hh++) {
                    const __m256 sc = sub_scale(gb + 32 + 16 * s + 8 * (h0 + hh), load_f16x8(gb + 16 * (h0 + hh)), 1);
                    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[hh]), _mm256_set1_ps(mm->a.d[8 * e + s]));
                    tot[hh][0] = _mm256_fmadd_ps(v, sc, tot[hh][0]);
                }
                continue;
            }
            LLB_UNROLL
            for (int hh = 0; hh < H; hh++) {
                const int h = h0 + hh;
                __m256i q[8];
                const __m256 d = load_f16x8(gb + 16 * h);
                dec_k4_sub_h(qt, gb, s, h, q);
                const __m256 sc = qt == LLB_IQ4_XS ? sub_scale(gb + 32 + 16 * s + 8 * h, d, 1) : sub_scale(gb + 64 + 16 * s + 8 * h, d, 0);
                LLB_UNROLL
                for (int m = 0; m < M; m++) {
                    const int8_t *xq = mm->a.qs + 256 * (e + m) + 32 * s;
                    /* int16 sums: 4 quads of 5-bit codes (4 x 2 x 31 x 127 < 2^15) */
                    const __m256i acc = qt == LLB_IQ4_XS ? dot_off128(q, 8, xq)
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

/* Rows per GEMM tile over both halves of a group (the panel tiles). */
#define TILE2_ROWS 4

/* A Q2_K/Q3_K/Q6_K sub-block's 8 scale bytes (rows 8h..8h+7) as int16 pairs, lane r = [s_r, s_r]: Q2_K's
 * file bytes zero-extended (scale | min << 4), Q3_K's and Q6_K's signed scales sign-extended. */
LLB_AI TGT __m256i scale_pairs(const int qt, const uint8_t *p) {
    if (qt == LLB_Q2_K) return u8_pairs(p);
    long long v;
    memcpy(&v, p, 8);
    const __m256i b = _mm256_set1_epi64x(v);
    return _mm256_srai_epi16(_mm256_shuffle_epi8(b, _mm256_setr_epi8(-1, 0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3,
                                                                     -1, 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7)), 8);
}

/* Sub-block u of rows 8h..8h+7 of Q6_K, Q3_K or Q2_K: codes q, scale pairs sc (scale_pairs), Q2_K's
 * dmin * min mn. */
LLB_AI TGT void k16_sub(const int qt, const uint8_t *gb, int u, int h, __m256i q[4], __m256i *sc, __m256 *mn) {
    if (qt == LLB_Q6_K) dec_q6k_sub_h(gb + LLB_Q6_K_SUBS + 192 * u, h, q);
    else dec_k16_sub_h(qt, gb, u, h, q);
    const __m256i sp = scale_pairs(qt, gb + (qt == LLB_Q2_K ? 64 : 32) + 16 * u + 8 * h);
    *sc = qt == LLB_Q2_K ? _mm256_and_si256(sp, _mm256_set1_epi16(15)) : sp;
    /* Q2_K's min m = the pair's 32-bit lane b | b << 16 shifted down by 20 */
    if (qt == LLB_Q2_K) *mn = _mm256_mul_ps(load_f16x8(gb + 32 + 16 * h), _mm256_cvtepi32_ps(_mm256_srli_epi32(sp, 20)));
}

/* What a super-block's steps take from one activation row's bs16n (= -32 x the sum of each 16 codes),
 * made once per super-block and row with vector operations (one by one in every step they took 8-10
 * scalar operations per row and step): Q3_K's zero point -4 x sum16 as the low int16 word of z[u]
 * (bs16n / 8, exact), Q2_K's min factor bs16n / 32 as a float f[u] (exact: |bs16n| < 2^24). */
typedef union {
    int32_t z[16];
    float f[16];
} k16_row;

LLB_AI TGT void k16_rows(const int qt, const llb_mm *mm, size_t e, const int M, k16_row kr[]) {
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        LLB_UNROLL
        for (int k = 0; k < 2; k++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(mm->a.bs16n + 16 * (e + m) + 8 * k));
            if (qt == LLB_Q3_K)
                _mm256_storeu_si256((__m256i *)(kr[m].z + 8 * k), _mm256_and_si256(_mm256_srai_epi32(b, 3), _mm256_set1_epi32(0xFFFF)));
            if (qt == LLB_Q2_K) _mm256_storeu_ps(kr[m].f + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(b), _mm256_set1_ps(1.0f / 32)));
        }
}

/* The int16 zero-point words of activation row e's sub-block u (see k16_step; kr: the row's k16_rows),
 * 0 for Q2_K. */
LLB_AI TGT __m256i k16_zero(const int qt, const llb_mm *mm, size_t e, int u, const k16_row *kr) {
    if (qt == LLB_Q3_K) return _mm256_set1_epi32(kr->z[u]);
    if (qt == LLB_Q6_K) return _mm256_set1_epi32(mm->a.w16[16 * e + u]);
    return _mm256_setzero_si256();
}

/* Step s (sub-blocks u = 2s, 2s+1) of rows 8h..8h+7 of Q6_K, Q3_K or Q2_K for M activation rows: p[m],
 * before the activation scale dx[s]. The sub-block scale is applied in the integer pair sum (vpmaddwd
 * by [sc, sc] instead of by ones), so the two sub-blocks add as int32 and convert once: per sub-block
 * no scale conversion or float multiply. The zero point joins the int16 sums first, so each word holds
 * (code - zero) x activation, summed: Q3_K's 4 in the low word (|sums| <= 4*2*7*128 + 4*16*128 < 2^15;
 * then * |sc| <= 32); Q6_K's 32 in each word as -32 x its own 8 activations (llb_act.w16), so one word
 * sums all 4 quads: 8 x 32 x 127 < 2^15, the 6-bit codes' partial sums wrapping on the way
 * (vpmaddubsw's pairs <= 2 x 63 x 127 never saturate; vpaddw wraps), then * |sc| <= 128 (two
 * sub-blocks < 2^24). Exact integers, so the result is at least as close as a float sum of the two. */
LLB_AI TGT void k16_step(const int qt, const llb_mm *mm, const uint8_t *gb, size_t e, int s, int h, const int M,
                         const k16_row kr[], __m256 p[TILE_ROWS]) {
    __m256i acc[TILE_ROWS];
    __m256 mn[2];
    LLB_UNROLL
    for (int j = 0; j < 2; j++) {
        const int u = 2 * s + j;
        __m256i q[4], sc;
        k16_sub(qt, gb, u, h, q, &sc, &mn[j]);
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const int8_t *xq = mm->a.qs + 256 * (e + m) + 16 * u;
            __m256i v = _mm256_maddubs_epi16(q[0], bcast32(xq));
            LLB_UNROLL
            for (int t = 1; t < 4; t++) v = _mm256_add_epi16(v, _mm256_maddubs_epi16(q[t], bcast32(xq + 4 * t)));
            if (qt != LLB_Q2_K) v = _mm256_add_epi16(v, k16_zero(qt, mm, e + m, u, &kr[m]));
            const __m256i a = _mm256_madd_epi16(v, sc);
            acc[m] = j ? _mm256_add_epi32(acc[m], a) : a;
        }
    }
    const __m256 d = load_f16x8(gb + 16 * h);
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        p[m] = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[m]), d);
        if (qt == LLB_Q2_K) { /* - dmin * m * bsum16 (bs16n = -32 * bsum16) */
            p[m] = _mm256_fmadd_ps(mn[0], _mm256_set1_ps(kr[m].f[2 * s]), p[m]);
            p[m] = _mm256_fmadd_ps(mn[1], _mm256_set1_ps(kr[m].f[2 * s + 1]), p[m]);
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
        k16_row kr[TILE_ROWS];
        k16_rows(qt, mm, e, M, kr);
        for (int s = 0; s < 8; s++) { /* sub-blocks u = 2s, 2s+1 share the activation scale dx[s] */
            if (gemv) llb_prefetch_slice(gb, gbb, s, 0);
            LLB_UNROLL
            for (int hh = 0; hh < H; hh++) {
                __m256 p[TILE_ROWS];
                k16_step(qt, mm, gb, e, s, h0 + hh, M, kr, p);
                LLB_UNROLL
                for (int m = 0; m < M; m++) tot[hh][m] = _mm256_fmadd_ps(p[m], _mm256_set1_ps(mm->a.d[8 * (e + m) + s]), tot[hh][m]);
            }
        }
    }
}

/* The GEMV of Q6_K, Q3_K and Q2_K over both halves of a group: each sub-block's codes of both halves
 * decoded (k16_sub), then every activation broadcast feeds both halves' int16 chains, pinned in
 * registers (tile_k16 at H = 2 broadcast every activation twice and kept more on the stack: Q6_K 6-7%,
 * Q2_K 20% slower L3-resident on Zen 3). Per lane k16_step's integers (int16 words wrap exactly: any
 * order gives the same sums) and tile_k16's float steps in their order: equal to a batch row. */
LLB_AI TGT void gemv_k16(const int qt, const llb_mm *mm, const uint8_t *wg, __m256 tot[2][TILE_ROWS]) {
    const long nsb = mm->cols / 256;
    const size_t at = llb_act_at(0, 0, nsb, mm->a.xt);
    const int gbb = LLB_GB_BYTES(qt);
    tot[0][0] = tot[1][0] = _mm256_setzero_ps();
    for (long sb = 0; sb < nsb; sb++) {
        const uint8_t *gb = wg + sb * gbb;
        const size_t e = at + mm->a.xt * sb;
        k16_row kr[1];
        k16_rows(qt, mm, e, 1, kr);
        for (int s = 0; s < 8; s++) {
            llb_prefetch_slice(gb, gbb, s, 0);
            __m256i acc[2];
            __m256 mn[2][2];
            LLB_UNROLL
            for (int j = 0; j < 2; j++) {
                const int u = 2 * s + j;
                const int8_t *xq = mm->a.qs + 256 * e + 16 * u;
                __m256i q[2][4], sc[2], v[2];
                LLB_UNROLL
                for (int h = 0; h < 2; h++) k16_sub(qt, gb, u, h, q[h], &sc[h], &mn[h][j]);
                LLB_UNROLL
                for (int t = 0; t < 4; t++) {
                    const __m256i x = bcast32(xq + 4 * t);
                    LLB_UNROLL
                    for (int h = 0; h < 2; h++) {
                        const __m256i p = _mm256_maddubs_epi16(q[h][t], x);
                        v[h] = t ? _mm256_add_epi16(v[h], p) : p;
                    }
                    __asm__("" : "+x"(v[0]), "+x"(v[1])); /* chained in registers (see tile_q4kp) */
                }
                const __m256i z = k16_zero(qt, mm, e, u, kr);
                LLB_UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m256i a = _mm256_madd_epi16(qt == LLB_Q2_K ? v[h] : _mm256_add_epi16(v[h], z), sc[h]);
                    acc[h] = j ? _mm256_add_epi32(acc[h], a) : a;
                }
            }
            const __m256 dx = _mm256_set1_ps(mm->a.d[8 * e + s]);
            LLB_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h]), load_f16x8(gb + 16 * h));
                if (qt == LLB_Q2_K) { /* as k16_step */
                    p = _mm256_fmadd_ps(mn[h][0], _mm256_set1_ps(kr->f[2 * s]), p);
                    p = _mm256_fmadd_ps(mn[h][1], _mm256_set1_ps(kr->f[2 * s + 1]), p);
                }
                tot[h][0] = _mm256_fmadd_ps(p, dx, tot[h][0]);
            }
        }
    }
}

/* GEMM of the 16-value types: a work unit decodes each super-block of its group once into a panel (both
 * halves: codes, scale pairs, Q2_K's mins, d; 6 KB) that its tiles of 4 activation rows read as memory
 * operands, each activation broadcast feeding rows 0-15; a tile's running sums wait in the unit's `run`
 * between super-blocks. Per (half, row) every integer is k16_step's and the float steps are its and
 * tile_k16's in their order, so every lane equals the GEMV's. */
typedef struct {
    __m256i q[16][2][4]; /* sub-block u, half h, quad t */
    __m256i sc[16][2];
    __m256 mn[16][2];
    __m256 d[2];
} k16_panel;

LLB_AI TGT void fill_k16(const int qt, const uint8_t *gb, k16_panel *pan) {
    LLB_UNROLL
    for (int h = 0; h < 2; h++) pan->d[h] = load_f16x8(gb + 16 * h);
    for (int u = 0; u < 16; u++) {
        LLB_UNROLL
        for (int h = 0; h < 2; h++) k16_sub(qt, gb, u, h, pan->q[u][h], &pan->sc[u][h], &pan->mn[u][h]);
    }
}

/* Super-block sb of the panel for M activation rows from row i: tot[h][m] carried in and out; next (or
 * NULL): the next tile's first activation entry, whose codes and per-row words are prefetched over the 8
 * steps as tile_q4kp_pf's. */
LLB_AI TGT void tile_k16p(const int qt, const llb_mm *mm, const k16_panel *pan, long sb, long i, const int M,
                          __m256 tot[2][TILE_ROWS], const size_t *next) {
    const size_t e = llb_act_at(i, sb, mm->cols / 256, mm->a.xt);
    k16_row kr[TILE2_ROWS];
    k16_rows(qt, mm, e, M, kr);
    const int8_t *nq = NULL;
    if (next) { /* 4 rows: Q6_K's w16 or bs16n (256 B) and d (128 B) here, the codes (1 KB) two lines a step
                 * (all in the steps: GCC spilled the loop's pointers) */
        const char *nw = qt == LLB_Q6_K ? (const char *)(mm->a.w16 + 16 * *next) : (const char *)(mm->a.bs16n + 16 * *next);
        LLB_UNROLL
        for (int l = 0; l < 4; l++) __builtin_prefetch(nw + 64 * l, 0, 3);
        __builtin_prefetch(mm->a.d + 8 * *next, 0, 3), __builtin_prefetch(mm->a.d + 8 * *next + 16, 0, 3);
        nq = mm->a.qs + 256 * *next;
    }
    /* no next tile: the prefetches ask for this one's lines (in L1), so the steps test nothing (Q3_K 3-11%
     * less time, Q6_K and Q2_K 1-2%, on Zen 3), and the codes' rows come from one pointer */
    const int8_t *x0 = mm->a.qs + 256 * e;
    if (!nq) nq = x0;
    for (int s = 0; s < 8; s++) {
        __builtin_prefetch(nq + 128 * s, 0, 3), __builtin_prefetch(nq + 128 * s + 64, 0, 3);
        __m256i acc[2][TILE2_ROWS];
        LLB_UNROLL
        for (int j = 0; j < 2; j++) {
            const int u = 2 * s + j;
            __m256i v[2][TILE2_ROWS];
            LLB_UNROLL
            for (int t = 0; t < 4; t++) {
                LLB_UNROLL
                for (int m = 0; m < M; m++) {
                    /* an opaque pointer: the codes are read as memory operands, not held (and spilled) */
                    const __m256i *pq = pan->q[u][0] + t;
                    __asm__("" : "+r"(pq));
                    const __m256i x = bcast32(x0 + 256 * m + 16 * u + 4 * t);
                    const __m256i t0 = _mm256_maddubs_epi16(pq[0], x), t1 = _mm256_maddubs_epi16(pq[4], x);
                    v[0][m] = t ? _mm256_add_epi16(v[0][m], t0) : t0;
                    v[1][m] = t ? _mm256_add_epi16(v[1][m], t1) : t1;
                    __asm__("" : "+x"(v[0][m]), "+x"(v[1][m])); /* chained in registers (see tile_q4kp) */
                }
            }
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m256i z = k16_zero(qt, mm, e + m, u, &kr[m]);
                LLB_UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m256i a = _mm256_madd_epi16(qt == LLB_Q2_K ? v[h][m] : _mm256_add_epi16(v[h][m], z), pan->sc[u][h]);
                    acc[h][m] = j ? _mm256_add_epi32(acc[h][m], a) : a;
                }
            }
        }
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const __m256 dx = _mm256_set1_ps(mm->a.d[8 * (e + m) + s]);
            LLB_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][m]), pan->d[h]);
                if (qt == LLB_Q2_K) { /* as k16_step */
                    p = _mm256_fmadd_ps(pan->mn[2 * s][h], _mm256_set1_ps(kr[m].f[2 * s]), p);
                    p = _mm256_fmadd_ps(pan->mn[2 * s + 1][h], _mm256_set1_ps(kr[m].f[2 * s + 1]), p);
                }
                tot[h][m] = _mm256_fmadd_ps(p, dx, tot[h][m]);
            }
        }
    }
}

/* Q4_K's GEMM panel, as k16_panel: per super-block its codes (sub-block s, quad t, half h: the nibbles
 * masked and shifted once per unit rather than once per tile: 66 -> 55 llvm-mca cycles per 2048
 * multiply-adds on Zen 3), the sub-block scale pairs (u8_pairs), d, the mins (q4k_mins_h) and dmin (5 KB). */
typedef struct {
    __m256i q[8][8][2];
    __m256i sc[8][2]; /* scale pairs (u8_pairs) */
    __m256 mn[2][8];
    __m256 d[2], dmin[2];
} q4k_panel;

LLB_AI TGT void fill_q4k(const uint8_t *gb, q4k_panel *pan) {
    for (int s = 0; s < 8; s++) {
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i q[8];
            dec_nibbles_h(gb + LLB_K4_NIBBLES(LLB_Q4_K, s), h, q);
            LLB_UNROLL
            for (int t = 0; t < 8; t++) pan->q[s][t][h] = q[t];
            pan->sc[s][h] = u8_pairs(gb + 64 + 16 * s + 8 * h);
        }
    }
    LLB_UNROLL
    for (int h = 0; h < 2; h++) {
        q4k_mins_h(gb, h, pan->mn[h]);
        pan->d[h] = load_f16x8(gb + 16 * h);
        pan->dmin[h] = load_f16x8(gb + 32 + 16 * h);
    }
}

/* Super-block sb (group-block gb) of a Q4_K group for M activation rows from row i, both halves: each
 * activation broadcast feeds rows 0-15, each quad's two code vectors decoded or loaded once for the M
 * rows. From the panel (pan), or with pan NULL decoded here (a unit of fewer rows than a tile, where
 * filling the panel cost more than it saved: 13% at n = 3; and the GEMV, M = 1 with pf set: the group
 * streamed once, llb_prefetch_slice ahead). The int16 sums are exact in any order and the float steps
 * per (half, row) are the same whatever M and pan, so every lane of a batch equals the GEMV's;
 * tot[h][m] carried in and out. */
LLB_AI TGT void tile_q4kp_pf(const llb_mm *mm, const q4k_panel *pan, const uint8_t *gb, long sb, long i, const int M,
                             const int pf, __m256 tot[2][TILE_ROWS], const size_t *next) {
    const size_t e = llb_act_at(i, sb, mm->cols / 256, mm->a.xt);
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 sbt[2][TILE2_ROWS] = {{_mm256_setzero_ps()}}; /* the super-block's sum before d (q4k_step) */
    const int8_t *x0 = mm->a.qs + 256 * e;
    const float *xd = mm->a.d + 8 * e;
    /* The next tile's activations (next, or none: then the lines of this one, already in L1): its d and
     * sum here, its 4 rows of codes (1 KB, contiguous) two lines a step. Addresses made once, before the
     * loop, and no test in it: with them made per step GCC spilled more of the tile (2-4% of the GEMM). */
    const int8_t *nq = next ? mm->a.qs + 256 * *next : x0;
    if (next) {
        __builtin_prefetch(mm->a.d + 8 * *next, 0, 3), __builtin_prefetch(mm->a.d + 8 * *next + 16, 0, 3);
        __builtin_prefetch(mm->a.sum + 8 * *next, 0, 3), __builtin_prefetch(mm->a.sum + 8 * *next + 16, 0, 3);
    }
    for (int s = 0; s < 8; s++) {
        if (pf) llb_prefetch_slice(gb, LLB_GB_Q4_K, s, 0);
        const int8_t *xq = x0 + 32 * s;
        __builtin_prefetch(nq + 128 * s, 0, 3);
        __builtin_prefetch(nq + 128 * s + 64, 0, 3);
        const uint8_t *v = gb + LLB_K4_NIBBLES(LLB_Q4_K, s);
        __m256i p[2][TILE2_ROWS];
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            __m256i q0, q1;
            if (pan) {
                q0 = pan->q[s][t][0], q1 = pan->q[s][t][1];
            } else { /* quad t: nibbles (t >> 2) of vector t & 3 (dec_nibbles_h's order) */
                q0 = ld256(v + 64 * (t & 3)), q1 = ld256(v + 64 * (t & 3) + 32);
                if (t >= 4) q0 = _mm256_srli_epi16(q0, 4), q1 = _mm256_srli_epi16(q1, 4);
                q0 = _mm256_and_si256(q0, m4), q1 = _mm256_and_si256(q1, m4);
            }
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
            const __m256i scp = pan ? pan->sc[s][h] : u8_pairs(gb + 64 + 16 * s + 8 * h);
            LLB_UNROLL
            for (int m = 0; m < M; m++) q4k_step(_mm256_madd_epi16(p[h][m], scp), xd[8 * m + s], &sbt[h][m]);
        }
    }
    /* d and the min term: q4k_min_term's steps per (half, row), each activation sum broadcast once for
     * both halves; the mins, d and dmin from the panel or decoded here (the GEMV), the same operations */
    __m256 mnd[2][8], dd[2], dmd[2];
    if (!pan) {
        LLB_UNROLL
        for (int h = 0; h < 2; h++) q4k_mins_h(gb, h, mnd[h]), dd[h] = load_f16x8(gb + 16 * h), dmd[h] = load_f16x8(gb + 32 + 16 * h);
    }
    const __m256(*mn)[8] = pan ? pan->mn : mnd;
    const __m256 *d = pan ? pan->d : dd, *dmin = pan ? pan->dmin : dmd;
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        const float *xs = mm->a.sum + 8 * (e + m);
        __m256 a[2], b[2];
        LLB_UNROLL
        for (int s = 0; s < 8; s += 2) {
            const __m256 x0 = _mm256_set1_ps(xs[s]), x1 = _mm256_set1_ps(xs[s + 1]);
            LLB_UNROLL
            for (int h = 0; h < 2; h++) {
                a[h] = s ? _mm256_fmadd_ps(mn[h][s], x0, a[h]) : _mm256_mul_ps(mn[h][s], x0);
                b[h] = s ? _mm256_fmadd_ps(mn[h][s + 1], x1, b[h]) : _mm256_mul_ps(mn[h][s + 1], x1);
            }
        }
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            tot[h][m] = _mm256_fmadd_ps(sbt[h][m], d[h], tot[h][m]);
            tot[h][m] = _mm256_fnmadd_ps(_mm256_add_ps(a[h], b[h]), dmin[h], tot[h][m]);
        }
    }
}

LLB_AI TGT void tile_q4kp(const llb_mm *mm, const q4k_panel *pan, const uint8_t *gb, long sb, long i, const int M,
                          const int pf, __m256 tot[2][TILE_ROWS]) {
    tile_q4kp_pf(mm, pan, gb, sb, i, M, pf, tot, NULL);
}

/* IQ4_XS's GEMM panel, as k16_panel: per sub-block s, half h and quad t its signed levels w and |w|
 * (dot_off128's operands, the offset removed once; 8 KB), and the sub-block scales. */
typedef struct {
    __m256i w[8][2][8], aw[8][2][8];
    __m256 sc[8][2];
} iq4_panel;

LLB_AI TGT void fill_iq4(const uint8_t *gb, iq4_panel *pan) {
    for (int s = 0; s < 8; s++) {
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i q[8];
            dec_nibbles_h(gb + LLB_K4_NIBBLES(LLB_IQ4_XS, s), h, q);
            grid_lookup_h(llb_iq4_grid, 0, q);
            LLB_UNROLL
            for (int t = 0; t < 8; t++) pan->w[s][h][t] = q[t], pan->aw[s][h][t] = _mm256_sign_epi8(q[t], q[t]);
            pan->sc[s][h] = sub_scale(gb + 32 + 16 * s + 8 * h, load_f16x8(gb + 16 * h), 1);
        }
    }
}

/* Super-block sb of an IQ4_XS panel for M activation rows from row i, as tile_k16p: the integers of
 * dot_off128 (|w| x sign(x, w)), the float steps of tile_q4k. */
LLB_AI TGT void tile_iq4p(const llb_mm *mm, const iq4_panel *pan, long sb, long i, const int M, __m256 tot[2][TILE_ROWS]) {
    const size_t e = llb_act_at(i, sb, mm->cols / 256, mm->a.xt);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int s = 0; s < 8; s++) {
        __m256i acc[2][TILE2_ROWS];
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m256i *pw = pan->w[s][0] + t, *pa = pan->aw[s][0] + t;
                __asm__("" : "+r"(pw), "+r"(pa));
                const __m256i x = bcast32(mm->a.qs + 256 * (e + m) + 32 * s + 4 * t);
                LLB_UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(pa[8 * h], _mm256_sign_epi8(x, pw[8 * h])), ones);
                    acc[h][m] = t ? _mm256_add_epi32(acc[h][m], a) : a;
                }
                __asm__("" : "+x"(acc[0][m]), "+x"(acc[1][m]));
            }
        }
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const __m256 dx = _mm256_set1_ps(mm->a.d[8 * (e + m) + s]);
            LLB_UNROLL
            for (int h = 0; h < 2; h++) tot[h][m] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[h][m]), dx), pan->sc[s][h], tot[h][m]);
        }
    }
}

#define K16P_TILE_(i, M, PF, P, G, RUN)                                                       \
    do {                                                                                      \
        __m256 t_[2][TILE_ROWS];                                                              \
        LLB_UNROLL                                                                            \
        for (int h = 0; h < 2; h++) {                                                         \
            LLB_UNROLL                                                                        \
            for (int m = 0; m < (M); m++) t_[h][m] = sb ? (RUN)[(i) - i0 + m][h] : _mm256_setzero_ps(); \
        }                                                                                     \
        if (qt == LLB_IQ4_XS) tile_iq4p(mm, &(P)->iq4, sb, i, M, t_);                         \
        else if ((M) == TILE2_ROWS) {                                                         \
            /* the next tile's activations: this unit's next rows, or its first at the next super-block */ \
            const long in_ = (i) + (M) + TILE2_ROWS <= i1 ? (i) + (M) : i0, sn_ = in_ == i0 ? sb + 1 : sb; \
            const size_t nx_ = llb_act_at(in_, sn_, nsb, mm->a.xt);                         \
            const size_t *np_ = sn_ < nsb ? &nx_ : NULL;                                      \
            if (qt != LLB_Q4_K) tile_k16p(qt, mm, &(P)->k16, sb, i, M, t_, (PF) ? np_ : NULL); \
            else if (pq) tile_q4kp_pf(mm, &(P)->q4k, gb, sb, i, M, 0, t_, (PF) ? np_ : NULL); /* always: the test lets \
                                                  GCC drop the tile's own tests of pan */   \
        } else if (qt == LLB_Q4_K) tile_q4kp(mm, pq ? &(P)->q4k : NULL, gb, sb, i, M, 0, t_);  \
        else tile_k16p(qt, mm, &(P)->k16, sb, i, M, t_, NULL);                                \
        if (sb + 1 < nsb) {                                                                   \
            LLB_UNROLL                                                                        \
            for (int h = 0; h < 2; h++) {                                                     \
                LLB_UNROLL                                                                    \
                for (int m = 0; m < (M); m++) (RUN)[(i) - i0 + m][h] = t_[h][m];              \
            }                                                                                 \
        } else {                                                                              \
            store_half(mm, G, 0, i, M, t_[0]);                                                \
            store_half(mm, G, 1, i, M, t_[1]);                                                \
        }                                                                                     \
    } while (0)
#define K16P_TILE(i, M) K16P_TILE_(i, M, 1, &pan[0], g, run[0])
#define K16P_TILE_NOPF(i, M) K16P_TILE_(i, M, 0, &pan[0], g, run[0])
/* A pair's tile: group g from the first panel (its activations then in L1 for the second), no prefetch; group g + 1 prefetching */
#define K16P_TILE2(i, M)                                          \
    do {                                                            \
        K16P_TILE_(i, M, 0, &pan[0], g, run[0]);                    \
        K16P_TILE_(i, M, 1, &pan[1], g + 1, run[1]);                \
    } while (0)

/* Super-blocks per row from which the 16-value types' panel tiles prefetch the next tile's activations:
 * at K = 8960 (35) a unit's 64 rows (560 KB) outgrow the L2 and the tiles ran ~20% faster with it; at
 * K = 1536 (6) it was no faster (its extra pointer spilled in the loop), so those run without. */
#define K16P_PF_NSB 16

/* A GEMM work unit of Q4_K, Q6_K, Q3_K, Q2_K or IQ4_XS through a panel per super-block (a Q4_K unit of
 * fewer rows than a tile without one: tile_q4kp decodes); with mm->wg2, group g + 1 through a second
 * panel, each activation tile's rows run against both before the next tile's. */
LLB_AI TGT void fast_kp(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    const long nsb = mm->cols / 256;
    typedef union {
        k16_panel k16;
        iq4_panel iq4;
        q4k_panel q4k;
    } kpanel;
    kpanel pan[2];
    __m256 run[2][LLB_ICHUNK][2];
    const int few = i1 - i0 < TILE2_ROWS;
    const int two = mm->wg2 != NULL && !few;
    /* a pointer, not a constant per call: GCC compiled the tile's loop worse (and warned) with pan.q4k */
    const q4k_panel *pq = few ? NULL : &pan[0].q4k;
    for (long sb = 0; sb < nsb; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_BYTES(qt);
        for (int p = 0; p <= two; p++) {
            const uint8_t *gp = (p ? mm->wg2 : wg) + sb * LLB_GB_BYTES(qt);
            if (qt == LLB_IQ4_XS) fill_iq4(gp, &pan[p].iq4);
            else if (qt == LLB_Q4_K && !few) fill_q4k(gp, &pan[p].q4k);
            else if (qt != LLB_Q4_K) fill_k16(qt, gp, &pan[p].k16);
        }
        if (two) LLB_TILE_LADDER(i0, i1, TILE2_ROWS, K16P_TILE2);
        else if ((qt != LLB_Q6_K && qt != LLB_Q3_K && qt != LLB_Q2_K) || nsb >= K16P_PF_NSB) LLB_TILE_LADDER(i0, i1, TILE2_ROWS, K16P_TILE);
        else LLB_TILE_LADDER(i0, i1, TILE2_ROWS, K16P_TILE_NOPF);
    }
}
#undef K16P_TILE
#undef K16P_TILE2
#undef K16P_TILE_NOPF
#undef K16P_TILE_

LLB_AI TGT void tile_k(const int qt, const llb_mm *mm, const uint8_t *wg, int h0, const int H, long i, const int M,
                       const int gemv, __m256 tot[][TILE_ROWS]) {
    if (qt == LLB_Q6_K || qt == LLB_Q3_K || qt == LLB_Q2_K) tile_k16(qt, mm, wg, h0, H, i, M, gemv, tot);
    else tile_q4k(qt, mm, wg, h0, H, i, M, gemv, tot);
}

LLB_AI TGT void fast_k1(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    __m256 t[2][TILE_ROWS];
    if (LLB_GEMV(mm)) { /* the tile's arithmetic at M = 1, both halves in one pass, plus prefetch: equal to a batch row */
        if (qt == LLB_Q4_K) {
            t[0][0] = t[1][0] = _mm256_setzero_ps();
            for (long sb = 0; sb < mm->cols / 256; sb++) tile_q4kp(mm, NULL, wg + sb * LLB_GB_Q4_K, sb, 0, 1, 1, t);
            store_half(mm, g, 0, 0, 1, t[0]);
            store_half(mm, g, 1, 0, 1, t[1]); /* a partial group's rows 8-15 (zero-padded) or fewer: masked */
        } else if (llb_group_rows(mm, g) > 8) {
            if (qt == LLB_Q6_K || qt == LLB_Q3_K || qt == LLB_Q2_K) gemv_k16(qt, mm, wg, t);
            else tile_k(qt, mm, wg, 0, 2, 0, 1, 1, t);
            store_half(mm, g, 0, 0, 1, t[0]);
            store_half(mm, g, 1, 0, 1, t[1]);
        } else {
            tile_k(qt, mm, wg, 0, 1, 0, 1, 1, t);
            store_half(mm, g, 0, 0, 1, t[0]);
        }
        return;
    }
    /* Q4_K always (a partial group's padded rows computed and not stored: one group of a matrix) */
    if (qt == LLB_Q4_K || (qt != LLB_Q5_K && llb_group_rows(mm, g) > 8 && i1 - i0 >= TILE2_ROWS)) {
        fast_kp(mm, wg, g, i0, i1, qt); /* a pair's second group too (mm->wg2, set only by fast_k) */
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

/* Group g, and g + 1 where the call takes pairs (mm->wg2): through the panels together (fast_kp) from
 * PAIR_MIN_ROWS activation rows a unit, else one after the other. Under ~24 rows the weights' stream, not
 * the activations', bounds the unit, and two panels filled at once ran 3-15% slower (n = 4..16, Q4_K
 * 8960x1536, Zen 3); from 24 rows on they ran 2-6% faster. */
#define PAIR_MIN_ROWS 32
LLB_AI TGT void fast_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    const int panels = qt != LLB_Q5_K && i1 - i0 >= PAIR_MIN_ROWS; /* a pair's first group is never partial */
    if (!mm->wg2 || panels) {
        fast_k1(mm, wg, g, i0, i1, qt);
        return;
    }
    llb_mm one = *mm;
    one.wg2 = NULL;
    fast_k1(&one, wg, g, i0, i1, qt);
    fast_k1(&one, mm->wg2, g + 1, i0, i1, qt);
}

TGT static void fast_q4_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q4_K); }
TGT static void fast_q5_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q5_K); }
TGT static void fast_q6_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q6_K); }
TGT static void fast_iq4_xs(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_IQ4_XS); }
TGT static void fast_q2_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q2_K); }
TGT static void fast_q3_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q3_K); }

/* Every fast kernel here takes pairs of groups (mm->wg2, kernels.h): the panel types' tiles run each
 * activation tile against both groups' panels in turn (the second reads it from L1: Q4_K's GEMM 1-4%
 * less time on Zen 3, the others level), Q5_K runs the two groups one after the other. All of them, so
 * that a layer's mixed types (Q4_K beside Q6_K, Q5_K beside Q6_K) still share one activation
 * quantization (matmul.c's can_share asks for one span). */
int llb_avx2_kquant_pairs(int qtype) { return llb_avx2_kquant_kernel(qtype) != NULL; }

llb_kernel_fn llb_avx2_kquant_kernel(int qtype) {
    return qtype == LLB_Q4_K ? fast_q4_k : qtype == LLB_Q5_K ? fast_q5_k : qtype == LLB_Q6_K ? fast_q6_k
         : qtype == LLB_IQ4_XS ? fast_iq4_xs : qtype == LLB_Q2_K ? fast_q2_k : qtype == LLB_Q3_K ? fast_q3_k : NULL;
}
#endif

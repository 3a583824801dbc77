/* AVX-512 VNNI integer kernels of the 256-value types (Q4_K, Q5_K, Q6_K, IQ4_XS, Q3_K, Q2_K) against
 * activations quantized with one scale per 32 values (8 per super-block).
 *
 * Per 32-value sub-block s the integer dot (vpdpbusd) is converted to FP32
 * once and scaled by the activation's dx[s] and each row's d*sc. Q4_K's min
 * term, dmin * sum_s m[s] * (dx[s]*bsum[s]), is an FP32 dot of the 8 mins with
 * the 8 quantized sub-block sums (Q5_K: the same, its codes one bit wider).
 * Q6_K's zero point 32 enters as the integer
 * accumulator's initial value, -32 * bsum16; its two 16-value sub-blocks of
 * one 32 share dx[s], applied once to their sum. Q2_K sums its scales and mins
 * in integers too (tile_q2k). */
#include "matmul/kernels/avx512_decode.h"

#if LLB_X86

#define TILE_ROWS 8 /* activation rows per tile in the GEMM */
/* Rows per pair tile (two groups): 2 x PAIR_ROWS accumulators and running sums in registers (pairs
 * of 8-row tiles spill: 0.81-1.02x of single groups). */
#define PAIR_ROWS 4
/* Where a unit of more than one tile decodes into the panel: not Q4_K's and Q2_K's cheap decoders
 * (there the panel lost 9-11%). */
#define PANEL_K_TYPE(qt) ((qt) != LLB_Q4_K && (qt) != LLB_Q2_K)
/* The types whose GEMM takes pairs of groups (kernels.h): each activation broadcast feeds two groups'
 * chains. Measured (CPU time, n = 128/512, 1536x3072 and 8960x1536): Q6_K 1.11-1.15x, Q3_K 1.08-1.12x,
 * IQ4_XS 1.03-1.11x; Q4_K, Q5_K and Q2_K lost 2-14% (as did the 32-block types, 0.80-1.06x). */
#define PAIRS_K(qt) ((qt) == LLB_Q6_K || (qt) == LLB_Q3_K || (qt) == LLB_IQ4_XS)

/* Per-row scales of one sub-block as FP32: d * sc[s] (u8 for Q4_K, i8 for Q6_K). */
LLB_AI TGT __m512 sub_scale_u8(const uint8_t *sc16, __m512 d) {
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sc16))));
}
LLB_AI TGT __m512 sub_scale_i8(const uint8_t *sc16, __m512 d) {
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc16))));
}

/* The super-block's 8 mins as FP32: bytes 192 + 32p + 2r + j = row r's min of sub 2p+j. */
LLB_AI TGT void q4k_mins(const uint8_t *gb, __m512 mn[8]) {
    LLB_UNROLL
    for (int p = 0; p < 4; p++) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(gb + 192 + 32 * p)));
        mn[2 * p] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)));
        mn[2 * p + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 16));
    }
}

/* sum_s m[s] * (dx[s]*bsum32[s]) per row, in two chains. */
LLB_AI TGT __m512 q4k_min_dot(const __m512 mn[8], const float *xsum) {
    __m512 a = _mm512_mul_ps(mn[0], _mm512_set1_ps(xsum[0])), b = _mm512_mul_ps(mn[1], _mm512_set1_ps(xsum[1]));
    LLB_UNROLL
    for (int s = 2; s < 8; s += 2) {
        a = _mm512_fmadd_ps(mn[s], _mm512_set1_ps(xsum[s]), a);
        b = _mm512_fmadd_ps(mn[s + 1], _mm512_set1_ps(xsum[s + 1]), b);
    }
    return _mm512_add_ps(a, b);
}

/* acc += q . the 4 activation bytes at x broadcast, the broadcast folded into the vpdpbusd as its
 * {1to16} memory operand (GCC emits a separate vpbroadcastd: one more uop per multiply in the GEMM
 * tiles, and a register). The same instruction, so the same integers. */
LLB_AI TGT __m512i dpbusd_b(__m512i acc, __m512i q, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const int32_t *)x));
    return acc;
}

/* acc[gi][m] += codes of group gi (from q[gi]) . activations of rows m (a tile's rows are 256 bytes apart),
 * quad-major so the G x M chains advance together, each activation broadcast feeding the G groups. nq
 * quads from xq. */
LLB_AI TGT void dot_rows(__m512i acc[][TILE_ROWS], const int G, const int M, const __m512i *const q[], const int nq,
                         const int8_t *xq) {
    LLB_UNROLL
    for (int t = 0; t < nq; t++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            if (G == 1 && M > 1) { /* the GEMM's single-group tiles (the GEMV keeps its broadcast) */
                acc[0][m] = dpbusd_b(acc[0][m], q[0][t], xq + 256 * m + 4 * t);
                continue;
            }
            const __m512i xv = _mm512_set1_epi32(llb_ld32(xq + 256 * m + 4 * t));
            LLB_UNROLL
            for (int gi = 0; gi < G; gi++) acc[gi][m] = _mm512_dpbusd_epi32(acc[gi][m], q[gi][t], xv);
        }
    }
}

/* acc[0][0] += codes . activations of one row, nq quads in two chains (the GEMV is latency-bound; integer
 * sums, so the same result as one chain). */
LLB_AI TGT void dot_row2(__m512i acc[][TILE_ROWS], const __m512i *const q[], const int nq, const int8_t *xq) {
    __m512i acc2[1][TILE_ROWS];
    acc2[0][0] = _mm512_setzero_si512();
    const __m512i *const hi[1] = {q[0] + nq / 2};
    dot_rows(acc, 1, 1, q, nq / 2, xq);
    dot_rows(acc2, 1, 1, hi, nq / 2, xq + 2 * nq);
    acc[0][0] = _mm512_add_epi32(acc[0][0], acc2[0][0]);
}

/* The GEMV's integer dot of Q3_K sub-block u from a0: quads 1 and 3 stay in place as 4x their codes
 * (bits 2-3 of L and of L >> 4), summed in a chain of their own and shifted back (exact), so L takes one
 * shift instead of three; the high bit lands at bit 2 or bit 4 to match. Two chains of two, as dot_row2. */
LLB_AI TGT __m512i l2_dot_row(const int qt, const uint8_t *gb, int u, __m512i a0, const int8_t *xq) {
    const uint8_t *l = gb + LLB_Q3_K_SUBS + 192 * (u >> 1) + 64 * (u & 1);
    const __m512i a = _mm512_loadu_si512(l), a4 = _mm512_srli_epi16(a, 4);
    const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12);
    __m512i q[4] = {_mm512_and_si512(a, m3), _mm512_and_si512(a, m12), _mm512_and_si512(a4, m3), _mm512_and_si512(a4, m12)};
    if (qt == LLB_Q3_K) {
        const __m512i h = _mm512_loadu_si512(l - 64 * (u & 1) + 128);
        LLB_UNROLL
        for (int i = 0; i < 4; i++) { /* bit 4k+i to bit 2 (quads 0, 2) or 4 (1, 3); a | (b & c) = ternlog 0xF8 */
            const int sh = 4 * (u & 1) + i - (i & 1 ? 4 : 2);
            const __m512i hs = sh > 0 ? _mm512_srli_epi16(h, sh) : sh < 0 ? _mm512_slli_epi16(h, -sh) : h;
            q[i] = _mm512_ternarylogic_epi32(q[i], hs, _mm512_set1_epi8(i & 1 ? 16 : 4), 0xF8);
        }
    }
    __m512i x[4];
    LLB_UNROLL
    for (int t = 0; t < 4; t++) x[t] = _mm512_set1_epi32(llb_ld32(xq + 4 * t));
    const __m512i lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(a0, q[0], x[0]), q[2], x[2]);
    const __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q[1], x[1]), q[3], x[3]);
    return _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 2));
}

/* A work unit's tiles share one decoding of each of the group's super-blocks (fast_k_panel): per
 * 32-value sub-block s PANEL_SUB vectors, its 8 code vectors, then its scales d * sc (a 16-value type's
 * two; Q4_K's spare entries hold its mins), as the tiles would decode them: the same values, so the same sums. */
#define PANEL_SUB 12

/* 16-value sub-block u of a Q6_K/Q3_K group-block: its codes (unless q is NULL) and scale d * sc. */
LLB_AI TGT void k16_decode(const int qt, const uint8_t *gb, int u, __m512 d, __m512i q[4], __m512 *sc) {
    if (q) {
        if (qt == LLB_Q6_K) dec_q6k_sub(gb + LLB_Q6_K_SUBS + 192 * u, q);
        else dec_k16_sub(qt, gb, u, q);
    }
    *sc = sub_scale_i8(gb + 32 + 16 * u, d);
}

/* Half j of sub-block s from its panel entry ps. */
LLB_AI TGT void k16_from_panel(const __m512i *ps, int j, __m512i q[4], __m512 *sc) {
    LLB_UNROLL
    for (int t = 0; t < 4; t++) q[t] = _mm512_load_si512(ps + 4 * j + t);
    *sc = _mm512_castsi512_ps(_mm512_load_si512(ps + 8 + j));
}

/* Super-blocks [s0, s1) of group wg into the panel pan. */
LLB_AI TGT void fill_panel(const int qt, const uint8_t *wg, long s0, long s1, __m512i *pan) {
    const int gbb = LLB_GB_BYTES(qt), k16 = qt == LLB_Q6_K || qt == LLB_Q3_K;
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb = wg + sb * gbb;
        const __m512 d = load_f16x16(gb);
        for (int s = 0; s < 8; s++) {
            __m512i *ps = pan + PANEL_SUB * (8 * (sb - s0) + s);
            if (k16) {
                LLB_UNROLL
                for (int j = 0; j < 2; j++) {
                    __m512i q[4];
                    __m512 sc;
                    k16_decode(qt, gb, 2 * s + j, d, q, &sc);
                    LLB_UNROLL
                    for (int t = 0; t < 4; t++) _mm512_store_si512(ps + 4 * j + t, q[t]);
                    _mm512_store_si512(ps + 8 + j, _mm512_castps_si512(sc));
                }
            } else {
                __m512i q[8];
                dec_k4_sub(qt, gb, s, q);
                LLB_UNROLL
                for (int t = 0; t < 8; t++) _mm512_store_si512(ps + t, q[t]);
                const __m512 sc = qt == LLB_IQ4_XS ? sub_scale_i8(gb + 32 + 16 * s, d) : sub_scale_u8(gb + 64 + 16 * s, d);
                _mm512_store_si512(ps + 8, _mm512_castps_si512(sc));
            }
        }
        if (qt == LLB_Q4_K || qt == LLB_Q5_K) { /* the mins and dmin (q4k_min_at), once for the unit's tiles */
            __m512 mn[8];
            __m512i *ps = pan + PANEL_SUB * 8 * (sb - s0);
            q4k_mins(gb, mn);
            LLB_UNROLL
            for (int s = 0; s < 8; s++) _mm512_store_si512(ps + PANEL_SUB * s + 9, _mm512_castps_si512(mn[s]));
            _mm512_store_si512(ps + 10, _mm512_castps_si512(load_f16x16(gb + 32)));
        }
    }
}

/* Q4_K/Q5_K's mins of a super-block (mn) and dmin: from the panel's spare entries (fill_panel) or decoded. */
LLB_AI TGT __m512 q4k_min_at(const uint8_t *gb, const __m512i *ps, __m512 mn[8]) {
    if (!ps) {
        q4k_mins(gb, mn);
        return load_f16x16(gb + 32);
    }
    LLB_UNROLL
    for (int s = 0; s < 8; s++) mn[s] = _mm512_castsi512_ps(_mm512_load_si512(ps + PANEL_SUB * s + 9));
    return _mm512_castsi512_ps(_mm512_load_si512(ps + 10));
}

/* The GEMM's integer zero-point terms of a super-block for M rows (bs16n of consecutive rows 16 apart),
 * computed as vectors once per super-block and tile (IQ4_XS's GEMV takes them one by one): IQ4_XS's
 * -128 * sum32 = 4 * (bs16n[2s] + bs16n[2s+1]) at zp[m][2s] (pairs), Q3_K's -4 * sum16 = bs16n / 8 (exact:
 * bs16n = -32 * sum16). The same integers, so the same sums. */
LLB_AI TGT void zero_points(const int32_t *bs16n, const int M, const int pairs, int32_t zp[][16]) {
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        const __m512i v = _mm512_loadu_si512(bs16n + 16 * m);
        const __m512i z = pairs ? _mm512_slli_epi32(_mm512_add_epi32(v, _mm512_shuffle_epi32(v, _MM_PERM_CDAB)), 2)
                                : _mm512_srai_epi32(v, 3);
        _mm512_storeu_si512(zp[m], z);
    }
}

/* M activation rows from row i, all in one activation tile, against G groups (wg[gi], or their panels
 * pan[gi]: G == 2 shares each activation broadcast between two groups); gemv (n == 1, G == M == 1) adds
 * prefetch and splits the dependency chains. Q4_K, Q5_K and IQ4_XS (qt): IQ4_XS has signed scales, no min,
 * and codes stored as level + 128, whose offset enters the accumulator as -128 * sum(xq) = 4 * bs16n. A
 * group's sums go through the same operations whatever G and M. */
LLB_AI TGT void tile_q4k(const int qt, const llb_mm *mm, const uint8_t *const wg[], const int G, long i, const int M,
                         const int gemv, long s0, long s1, const __m512i *const pan[], const int cont,
                         __m512 tot[][TILE_ROWS]) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, mm->cols / 256, xt);
    LLB_UNROLL
    for (int gi = 0; gi < G; gi++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++)
            if (!cont) tot[gi][m] = _mm512_setzero_ps();
    }
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb[LLB_MAXG];
        __m512 d[LLB_MAXG];
        LLB_UNROLL
        for (int gi = 0; gi < G; gi++) {
            gb[gi] = wg[gi] + sb * LLB_GB_BYTES(qt);
            d[gi] = load_f16x16(gb[gi]);
        }
        const size_t e = at + xt * sb; /* row i's entry of this super-block */
        /* A panel tile computes row m's min dot in sub-block step m, among the integer dots, rather than
         * all M at the end: the same operations on the same values. */
        const int spread = pan[0] != NULL && !gemv;
        __m512 mdot[LLB_MAXG][TILE_ROWS];
        int32_t zp[qt == LLB_IQ4_XS ? TILE_ROWS : 1][16];
        if (qt == LLB_IQ4_XS && !gemv) zero_points(mm->a.bs16n + 16 * e, M, 1, zp);
        for (int s = 0; s < 8; s++) {
            __m512i q[LLB_MAXG][8], acc[LLB_MAXG][TILE_ROWS];
            __m512 sc[LLB_MAXG];
            LLB_UNROLL
            for (int gi = 0; gi < G; gi++) {
                if (pan[gi]) { /* decoded once per work unit (fast_k) */
                    const __m512i *ps = pan[gi] + PANEL_SUB * (8 * (sb - s0) + s);
                    LLB_UNROLL
                    for (int t = 0; t < 8; t++) q[gi][t] = _mm512_load_si512(ps + t);
                    sc[gi] = _mm512_castsi512_ps(_mm512_load_si512(ps + 8));
                } else {
                    llb_prefetch_slice(gb[gi], LLB_GB_BYTES(qt), s, gemv);
                    dec_k4_sub(qt, gb[gi], s, q[gi]);
                    sc[gi] = qt == LLB_IQ4_XS ? sub_scale_i8(gb[gi] + 32 + 16 * s, d[gi]) : sub_scale_u8(gb[gi] + 64 + 16 * s, d[gi]);
                }
            }
            const int8_t *xq = mm->a.qs + 256 * e + 32 * s;
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const int32_t *bs = mm->a.bs16n + 16 * (e + m) + 2 * s;
                const __m512i a0 = qt != LLB_IQ4_XS ? _mm512_setzero_si512()
                                 : _mm512_set1_epi32(gemv ? 4 * (bs[0] + bs[1]) : zp[qt == LLB_IQ4_XS ? m : 0][2 * s]);
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++)
                    acc[gi][m] = qt == LLB_Q5_K && !gemv ? chain_init(NULL) : a0; /* IQ4_XS: chain_init measured 1-3% slower */
            }
            const __m512i *const qg[LLB_MAXG] = {q[0], q[LLB_MAXG - 1]};
            if (gemv) dot_row2(acc, qg, 8, xq);
            else dot_rows(acc, G, M, qg, 8, xq);
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m512 dx = _mm512_set1_ps(mm->a.d[8 * (e + m) + s]);
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++)
                    tot[gi][m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[gi][m]), dx), sc[gi], tot[gi][m]);
            }
            if (qt != LLB_IQ4_XS && spread && s < M) { /* row s's min dot, between the dots (stored until the end) */
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++) {
                    __m512 mn[8];
                    q4k_min_at(gb[gi], pan[gi] + PANEL_SUB * 8 * (sb - s0), mn);
                    mdot[gi][s] = q4k_min_dot(mn, mm->a.sum + 8 * (e + s));
                }
            }
        }
        if (qt == LLB_IQ4_XS) continue;
        LLB_UNROLL
        for (int gi = 0; gi < G; gi++) {
            __m512 mn[8];
            const __m512 dmin = q4k_min_at(gb[gi], pan[gi] ? pan[gi] + PANEL_SUB * 8 * (sb - s0) : NULL, mn);
            LLB_UNROLL
            for (int m = 0; m < M; m++)
                tot[gi][m] = _mm512_fnmadd_ps(spread ? mdot[gi][m] : q4k_min_dot(mn, mm->a.sum + 8 * (e + m)), dmin, tot[gi][m]);
        }
    }
}

/* The 16-value sub-block types with signed scales: Q6_K (6-bit codes, zero point 32) and Q3_K (3-bit,
 * zero point 4). G groups as tile_q4k. */
LLB_AI TGT void tile_k16(const int qt, const llb_mm *mm, const uint8_t *const wg[], const int G, long i, const int M,
                         const int gemv, long s0, long s1, const __m512i *const pan[], const int cont,
                         __m512 tot[][TILE_ROWS]) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, mm->cols / 256, xt);
    const int gbb = LLB_GB_BYTES(qt), l2 = gemv && qt != LLB_Q6_K;
    LLB_UNROLL
    for (int gi = 0; gi < G; gi++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++)
            if (!cont) tot[gi][m] = _mm512_setzero_ps();
    }
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb[LLB_MAXG];
        __m512 d[LLB_MAXG];
        LLB_UNROLL
        for (int gi = 0; gi < G; gi++) {
            gb[gi] = wg[gi] + sb * gbb;
            d[gi] = load_f16x16(gb[gi]);
        }
        const size_t e = at + xt * sb;
        int32_t zp[qt == LLB_Q3_K ? TILE_ROWS : 1][16];
        if (qt == LLB_Q3_K) zero_points(mm->a.bs16n + 16 * e, M, 0, zp);
        for (int s = 0; s < 8; s++) { /* sub-blocks u = 2s, 2s+1 share the activation scale dx[s] */
            __m512 p[LLB_MAXG][TILE_ROWS];
            LLB_UNROLL
            for (int gi = 0; gi < G; gi++) /* a panel's fill asked for these lines already */
                if (!pan[gi]) llb_prefetch_slice(gb[gi], gbb, s, gemv);
            LLB_UNROLL
            for (int j = 0; j < 2; j++) {
                const int u = 2 * s + j;
                __m512i q[LLB_MAXG][8], acc[LLB_MAXG][TILE_ROWS];
                __m512 sc[LLB_MAXG];
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++) {
                    if (pan[gi]) /* decoded once per work unit (fast_k) */
                        k16_from_panel(pan[gi] + PANEL_SUB * (8 * (sb - s0) + s), j, q[gi], &sc[gi]);
                    else /* l2 (the GEMV's Q3_K) decodes in l2_dot_row */
                        k16_decode(qt, gb[gi], u, d[gi], l2 ? NULL : q[gi], &sc[gi]);
                }
                LLB_UNROLL
                for (int m = 0; m < M; m++) { /* the zero point: -32 (Q6_K) or -4 (Q3_K) * bsum16 */
                    const int32_t *bs = &mm->a.bs16n[16 * (e + m) + u], *z = qt == LLB_Q6_K ? bs : &zp[qt == LLB_Q3_K ? m : 0][u];
                    const __m512i a0 = _mm512_set1_epi32(*z);
                    LLB_UNROLL
                    for (int gi = 0; gi < G; gi++) acc[gi][m] = gemv ? a0 : chain_init(z);
                }
                const int8_t *xq = mm->a.qs + 256 * e + 16 * u;
                const __m512i *const qg[LLB_MAXG] = {q[0], q[LLB_MAXG - 1]};
                if (l2) acc[0][0] = l2_dot_row(qt, gb[0], u, acc[0][0], xq);
                else if (gemv) dot_row2(acc, qg, 4, xq);
                else dot_rows(acc, G, M, qg, 4, xq);
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++) {
                    LLB_UNROLL
                    for (int m = 0; m < M; m++)
                        p[gi][m] = j ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[gi][m]), sc[gi], p[gi][m])
                                     : _mm512_mul_ps(_mm512_cvtepi32_ps(acc[gi][m]), sc[gi]);
                }
            }
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m512 dx = _mm512_set1_ps(mm->a.d[8 * (e + m) + s]);
                LLB_UNROLL
                for (int gi = 0; gi < G; gi++) tot[gi][m] = _mm512_fmadd_ps(p[gi][m], dx, tot[gi][m]);
            }
        }
    }
}

/* Q2_K sums each 32-value step s (sub-blocks u = 2s, 2s+1, sharing the activation scale dx[s]) in
 * integers, then converts twice: S = 4 (sc[2s] dot[2s] + sc[2s+1] dot[2s+1]) and N = m[2s] ns[2s] +
 * m[2s+1] ns[2s+1] (ns = -sum16 of the activations = bs16n / 32, exact), tot += dx[s] (S d/4 + N dmin).
 * The 16-value float path took per sub-block a convert, two FMAs and six operations making d sc and
 * dmin m as floats. Exact integers, and every tile takes the same float steps per row, so a row's
 * result does not depend on the batch. */

/* Lane r of step s: [row r's byte of sub-block 2s, of 2s+1] (scale | min << 4) as int16 words. */
LLB_AI TGT __m512i q2k_pairs(const uint8_t *gb, int s) {
#define P_(r) ((r) | (16 + (r)) << 16)
    const __m512i idx = _mm512_setr_epi32(P_(0), P_(1), P_(2), P_(3), P_(4), P_(5), P_(6), P_(7), P_(8), P_(9), P_(10),
                                          P_(11), P_(12), P_(13), P_(14), P_(15));
#undef P_
    return _mm512_permutexvar_epi16(idx, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(gb + 64 + 32 * s))));
}

/* Word 1 of each int32 lane from lo1's word 0, word 0 lo0's: [lo0, lo1] (each fits int16). */
LLB_AI TGT __m512i q2k_pack(__m512i lo0, __m512i lo1) {
    const __m512i ctl = _mm512_set4_epi32(0x0D0C0000, 0x09080000, 0x05040000, 0x01000000);
    return _mm512_mask_shuffle_epi8(lo0, (__mmask64)0xCCCCCCCCCCCCCCCCull, lo1, ctl);
}

/* The int16 pairs w . the pair at p broadcast, as a vpdpwssd from zero with a {1to16} memory operand
 * (vpmaddwd has none: GCC kept the pairs in a register and extracted each with two shuffles). */
LLB_AI TGT __m512i dpwssd_b(__m512i w, const int16_t *p) {
    __m512i acc;
    __asm__("vpxord %0, %0, %0\n\tvpdpwssd %2%{1to16%}, %1, %0" : "=&v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}

/* A chain of four dots from zero, q[t] . the 4 activation bytes at x[t] broadcast, in one asm so GCC
 * neither copies the accumulator between them nor materializes the zero in another register. */
LLB_AI TGT __m512i dpbusd4_b(const __m512i q[4], const int8_t *x0, const int8_t *x1, const int8_t *x2, const int8_t *x3) {
    __m512i acc;
    __asm__("vpxord %0, %0, %0\n\tvpdpbusd %5%{1to16%}, %1, %0\n\tvpdpbusd %6%{1to16%}, %2, %0\n\t"
            "vpdpbusd %7%{1to16%}, %3, %0\n\tvpdpbusd %8%{1to16%}, %4, %0"
            : "=&v"(acc)
            : "v"(q[0]), "v"(q[1]), "v"(q[2]), "v"(q[3]), "m"(*(const int32_t *)x0), "m"(*(const int32_t *)x1),
              "m"(*(const int32_t *)x2), "m"(*(const int32_t *)x3));
    return acc;
}

/* S of step s (codes l, scale pairs sc41 = [4 sc0, sc1]) for M rows (qs's rows 256 bytes apart): the
 * layout (quants.h) leaves sub-block 2s's codes at bits 0-1 and 2s+1's at bits 2-3 (4x its codes) of the
 * two vectors and their >> 4, so each sub-block's dot is one chain and the two pair into the words
 * [dot0, 4 dot1] (|4 dot1| <= 16 * 12 * 127 fits int16) for one vpmaddwd. Per row a pack and a
 * vpmaddwd: folding the scales into the codes (8 vpmullw and 2 shuffles a tile) measured 1-2% slower at 8
 * rows, 15-25% at 1-4. */
LLB_AI TGT void q2k_dot_pairs(const uint8_t *l, __m512i sc41, const int8_t *xq, const int M, __m512i acc[]) {
    const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12);
    const __m512i a = _mm512_loadu_si512(l), b = _mm512_loadu_si512(l + 64);
    const __m512i a4 = _mm512_srli_epi16(a, 4), b4 = _mm512_srli_epi16(b, 4);
    const __m512i q0[4] = {_mm512_and_si512(a, m3), _mm512_and_si512(a4, m3), _mm512_and_si512(b, m3), _mm512_and_si512(b4, m3)};
    const __m512i q1[4] = {_mm512_and_si512(a, m12), _mm512_and_si512(a4, m12), _mm512_and_si512(b, m12), _mm512_and_si512(b4, m12)};
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        const int8_t *x = xq + 256 * m;
        const __m512i c0 = dpbusd4_b(q0, x, x + 4, x + 8, x + 12), c1 = dpbusd4_b(q1, x + 16, x + 20, x + 24, x + 28);
        acc[m] = _mm512_madd_epi16(q2k_pack(c0, c1), sc41);
    }
}

/* Step s of super-block gb for M activation rows (qs their codes, ns their -sum16 pairs, dx their scales). */
LLB_AI TGT void q2k_step(const uint8_t *gb, int s, const int M, const int gemv, const int8_t *qs,
                         const int16_t ns[][16], const float *dx, __m512 d4, __m512 dmin, __m512 tot[TILE_ROWS]) {
    llb_prefetch_slice(gb, LLB_GB_Q2_K, s, gemv);
    const __m512i w = q2k_pairs(gb, s), mp = _mm512_srli_epi16(w, 4);
    /* [4 sc0, sc1]: sub-block 2s+1's codes come 4x from the layout */
    const __m512i sc41 = _mm512_sllv_epi16(_mm512_and_si512(w, _mm512_set1_epi16(15)), _mm512_set1_epi32(2));
    const uint8_t *l = gb + LLB_Q2_K_CODES + 128 * s;
    const int8_t *xq = qs + 32 * s;
    __m512i acc[TILE_ROWS];
    q2k_dot_pairs(l, sc41, xq, M, acc);
    LLB_UNROLL
    for (int m = 0; m < M; m++) {
        const __m512i n = dpwssd_b(mp, ns[m] + 2 * s);
        const __m512 p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), dmin, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[m]), d4));
        tot[m] = _mm512_fmadd_ps(p, _mm512_set1_ps(dx[8 * m + s]), tot[m]);
    }
}

#include "matmul/kernels/avx512_kgemv.h" /* Q2_K's Zen 4 GEMV step (kg_q2k_step) */

/* M activation rows from row i against the group at wg, super-blocks [s0, s1) (gemv: n == 1, M == 1). */
LLB_AI TGT void tile_q2k(const llb_mm *mm, const uint8_t *wg, long i, const int M, const int gemv, long s0, long s1,
                         const int cont, __m512 tot[TILE_ROWS]) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(i, 0, mm->cols / 256, xt);
    LLB_UNROLL
    for (int m = 0; m < M; m++)
        if (!cont) tot[m] = _mm512_setzero_ps();
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_Q2_K;
        const __m512 d4 = _mm512_mul_ps(load_f16x16(gb), _mm512_set1_ps(0.25f)), dmin = load_f16x16(gb + 32);
        const size_t e = at + xt * sb;
        int16_t ns[TILE_ROWS][16] __attribute__((aligned(32)));
        LLB_UNROLL
        for (int m = 0; m < M; m++)
            _mm256_store_si256((__m256i *)ns[m], _mm512_cvtepi32_epi16(_mm512_srai_epi32(
                                                     _mm512_loadu_si512(mm->a.bs16n + 16 * (e + m)), 5)));
        const int8_t *qs = mm->a.qs + 256 * e;
        const float *dx = mm->a.d + 8 * e;
        if (gemv == LLB_STREAM_FAR) { /* Zen 4: kg_q2k_step (avx512_kgemv.h), the same sums */
            LLB_UNROLL
            for (int s = 0; s < 8; s++) tot[0] = kg_q2k_step(gb, s, qs, ns[0], dx, d4, dmin, tot[0]);
        } else if (gemv) { /* unrolled: constant offsets, and fewer pointers live than GPRs */
            LLB_UNROLL
            for (int s = 0; s < 8; s++) q2k_step(gb, s, 1, 1, qs, ns, dx, d4, dmin, tot);
        } else {
            for (int s = 0; s < 8; s++) q2k_step(gb, s, M, 0, qs, ns, dx, d4, dmin, tot);
        }
    }
}

LLB_AI TGT void tile_k(const int qt, const llb_mm *mm, const uint8_t *const wg[], const int G, long i, const int M,
                       const int gemv, long s0, long s1, const __m512i *const pan[], const int cont, __m512 tot[][TILE_ROWS]) {
    if (qt == LLB_Q2_K) tile_q2k(mm, wg[0], i, M, gemv, s0, s1, cont, tot[0]); /* G == 1, no panel */
    else if (qt == LLB_Q6_K || qt == LLB_Q3_K) tile_k16(qt, mm, wg, G, i, M, gemv, s0, s1, pan, cont, tot);
    else tile_q4k(qt, mm, wg, G, i, M, gemv, s0, s1, pan, cont, tot);
}

/* A work unit of more than one tile: each super-block of the G groups is decoded once into a panel (6 KB
 * per group) that all the unit's tiles read, super-block by super-block; a tile's running sums wait in
 * `run` between super-blocks. Every output element goes through the same operations in the same order
 * as in a tile over the whole K chunk (and as the GEMV): only where the values wait differs. */
LLB_AI TGT void tile_k_at(const int qt, const llb_mm *mm, const uint8_t *const wg[], const int G, long i, const int M,
                          long sb, const __m512i *const pan[], const int cont, __m512 *const run[]) {
    __m512 t[LLB_MAXG][TILE_ROWS];
    LLB_UNROLL
    for (int gi = 0; gi < G; gi++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) t[gi][m] = run[gi][m];
    }
    tile_k(qt, mm, wg, G, i, M, 0, sb, sb + 1, pan, cont, t);
    LLB_UNROLL
    for (int gi = 0; gi < G; gi++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) run[gi][m] = t[gi][m];
    }
}

/* Tile k of a super-block's tiles asks for lines [k * per, (k + 1) * per) of a group's next super-block, into
 * L2 (after a group's last, the first of the group G ahead: packed groups follow each other), where the next
 * fill reads them. The fill's own burst of L1 prefetches (1-2 super-blocks ahead) held the line-fill buffers
 * for the DRAM latency: in the prefill of the 1.5B Q5_K_M ~8% of the kernel's samples sat on them. */
LLB_AI TGT void prefetch_share(const uint8_t *next, const int bytes, long k, long per) {
    const long l1 = (k + 1) * per < (bytes + 63) / 64 ? (k + 1) * per : (bytes + 63) / 64;
    for (long l = k * per; l < l1; l++) __builtin_prefetch(next + 64 * l, 0, 2);
}

#define TILE_K_AT(i, M)                                                                        \
    do {                                                                                       \
        __m512 *const r_[LLB_MAXG] = {run[0] + ((i) - i0), run[LLB_MAXG - 1] + ((i) - i0)};  \
        LLB_UNROLL                                                                             \
        for (int gi = 0; gi < G; gi++)                                                         \
            prefetch_share(wg[gi] + (sb + 1 < nsb ? sb + 1 : G * nsb) * gbb, gbb, ((i) - i0) / top, per);  \
        tile_k_at(qt, mm, wg, G, i, M, sb, pans, cont, r_);                                    \
    } while (0)

LLB_AI TGT void fast_k_panel(const llb_mm *mm, const uint8_t *const wg[], const int G, long i0, long i1, const int qt,
                             const __mmask16 km[], float *const o[]) {
    const long nsb = mm->cols / 256, kc = LLB_KCHUNK / 256;
    const int gbb = LLB_GB_BYTES(qt), top = G == 1 ? TILE_ROWS : PAIR_ROWS;
    const long nt = (i1 - i0 + top - 1) / top, per = ((gbb + 63) / 64 + nt - 1) / nt; /* lines per tile */
    __m512i pan[LLB_MAXG][8 * PANEL_SUB];
    __m512 run[LLB_MAXG][LLB_UNIT_ROWS_MAX];
    const __m512i *const pans[LLB_MAXG] = {pan[0], pan[LLB_MAXG - 1]};
    for (long s0 = 0; s0 < nsb; s0 += kc) {
        const long s1 = s0 + kc < nsb ? s0 + kc : nsb;
        for (long sb = s0; sb < s1; sb++) {
            LLB_UNROLL
            for (int gi = 0; gi < G; gi++) fill_panel(qt, wg[gi], sb, sb + 1, pan[gi]);
            const int cont = sb > s0;
            if (G == 1) LLB_TILE_LADDER(i0, i1, TILE_ROWS, TILE_K_AT);
            else LLB_TILE_LADDER(i0, i1, PAIR_ROWS, TILE_K_AT);
        }
        LLB_UNROLL
        for (int gi = 0; gi < G; gi++) llb512_put_rows(o[gi] + i0 * mm->rows, mm->rows, km[gi], run[gi], (int)(i1 - i0), s0 > 0);
    }
}
#undef TILE_K_AT

/* A tile of M rows from row i over super-blocks [s0, s1) of the G groups, stored (added after the first chunk). */
#define TILE_K(i, M)                                                                                       \
    do {                                                                                                   \
        __m512 t_[LLB_MAXG][TILE_ROWS];                                                                    \
        tile_k(qt, mm, w, G, i, M, 0, s0, s1, nopan, 0, t_);                                               \
        LLB_UNROLL                                                                                         \
        for (int gi = 0; gi < G; gi++) llb512_put_rows(o[gi] + (i) * mm->rows, mm->rows, km[gi], t_[gi], M, s0 > 0); \
    } while (0)

/* Groups g .. g + G - 1 (G == 2: mm->wg2 is the second), rows [i0, i1) of a GEMM work unit. */
LLB_AI TGT void fast_k_groups(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt, const int G) {
    const uint8_t *const w[LLB_MAXG] = {wg, mm->wg2};
    const __m512i *const nopan[LLB_MAXG] = {NULL, NULL};
    __mmask16 km[LLB_MAXG];
    float *o[LLB_MAXG];
    LLB_UNROLL
    for (int gi = 0; gi < G; gi++) {
        km[gi] = (__mmask16)((1u << llb_group_rows(mm, g + gi)) - 1);
        o[gi] = mm->out + (g + gi) * LLB_IL;
    }
    if (i1 - i0 > TILE_ROWS && PANEL_K_TYPE(qt)) {
        fast_k_panel(mm, w, G, i0, i1, qt, km, o);
        return;
    }
    const long nsb = mm->cols / 256, kc = LLB_KCHUNK / 256;
    for (long s0 = 0; s0 < nsb; s0 += kc) { /* K in chunks: the group's chunk stays in L1 across tiles */
        const long s1 = s0 + kc < nsb ? s0 + kc : nsb;
        if (G == 1) LLB_TILE_LADDER(i0, i1, TILE_ROWS, TILE_K);
        else LLB_TILE_LADDER(i0, i1, PAIR_ROWS, TILE_K);
    }
}
#undef TILE_K

/* n == 1, the weights streamed with prefetch as `stream` (common.h; tile_k's gemv flag); the GEMM's
 * K chunks too, so a single row sums in its exact order. */
LLB_AI TGT void gemv_k(const llb_mm *mm, const uint8_t *wg, long g, const int qt, const int stream) {
    const long nsb = mm->cols / 256, kc = LLB_KCHUNK / 256;
    const uint8_t *const w[1] = {wg};
    const __m512i *const nopan[1] = {NULL};
    __m512 t[1][TILE_ROWS], sum = _mm512_setzero_ps();
    for (long s0 = 0; s0 < nsb; s0 += kc) {
        tile_k(qt, mm, w, 1, 0, 1, stream, s0, s0 + kc < nsb ? s0 + kc : nsb, nopan, 0, t);
        sum = s0 ? _mm512_add_ps(sum, t[0][0]) : t[0][0];
    }
    _mm512_mask_storeu_ps(mm->out + g * LLB_IL, (__mmask16)((1u << llb_group_rows(mm, g)) - 1), sum);
}

LLB_AI TGT void fast_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    if (LLB_GEMV(mm)) {
        if (mm->far) gemv_k(mm, wg, g, qt, LLB_FAR_STREAM_OF(qt));
        else gemv_k(mm, wg, g, qt, LLB_STREAM);
        return;
    }
    if (PAIRS_K(qt) && mm->wg2) fast_k_groups(mm, wg, g, i0, i1, qt, 2);
    else fast_k_groups(mm, wg, g, i0, i1, qt, 1);
}

TGT static void fast_q4_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q4_K); }
TGT static void fast_q5_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q5_K); }
TGT static void fast_q6_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q6_K); }
TGT static void fast_iq4_xs(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_IQ4_XS); }
TGT static void fast_q2_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q2_K); }
TGT static void fast_q3_k(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast_k(mm, wg, g, i0, i1, LLB_Q3_K); }
llb_kernel_fn llb_avx512_kquant_kernel(int qtype) {
    return qtype == LLB_Q4_K ? fast_q4_k : qtype == LLB_Q5_K ? fast_q5_k : qtype == LLB_Q6_K ? fast_q6_k
         : qtype == LLB_IQ4_XS ? fast_iq4_xs : qtype == LLB_Q2_K ? fast_q2_k : qtype == LLB_Q3_K ? fast_q3_k : NULL;
}
int llb_avx512_kquant_pairs(int qtype) { return PAIRS_K(qtype); }
/* The panel types decode each super-block once per unit: a unit of LLB_UNIT_ROWS_MAX rows decodes it
 * once where 64-row units decoded it once per 64 rows. Only at a depth of one K chunk: over several
 * (1536x8960, n = 512) the 128-row units lost 5-12% for Q6_K, Q3_K and IQ4_XS. */
long llb_avx512_kquant_unit_rows(int qtype, int exact, long cols) {
    const int panel = !exact && llb_avx512_kquant_kernel(qtype) && PANEL_K_TYPE(qtype);
    return panel && cols <= LLB_KCHUNK ? LLB_UNIT_ROWS_MAX : LLB_ICHUNK;
}
#endif

/* The K-quant GEMVs (n == 1) of avx512_kquants.c (included by it after its helpers; not a header of its
 * own). Each sums in exactly its GEMM tile's order (tile_q4k, tile_k16, tile_q2k at M == 1): the same
 * float operations on the same values; only the exact int32 dots of a sub-block are split into more
 * chains, which gives the same integers. What differs from the tile code, for the load slots and the
 * latency the GEMV is bound by on Zen 4 (docs/BENCHMARKS.md, 2026-12-04):
 *  - every packed vector is loaded once (kg_ld: GCC folded one load into both the and and the shift);
 *  - a sub-block's dot runs in chains of two multiplies (the tile's four was a latency chain the
 *    out-of-order window could not hide), the activation broadcast folded into each (dpbusd_b);
 *  - the super-block's 8 steps are unrolled, so the prefetch slices are constant lines without tests,
 *    each step's asked for beside its first packed vector (kg_prefetch, avx512_kquants.c).
 * Zen 4 only (mm->far): Intel keeps the tile code's GEMV (gemv_k), its machine code unchanged. */
#ifndef LLB_AVX512_KGEMV_H
#define LLB_AVX512_KGEMV_H
#if defined(KG_ROLL)
#define KG_UNROLL _Pragma("GCC unroll 1")
#elif defined(KG_ROLL2)
#define KG_UNROLL _Pragma("GCC unroll 2")
#else
#define KG_UNROLL LLB_UNROLL
#endif

/* acc0 (NULL: 0) + sum_t q[t] . the 4 activation bytes at x + 4t broadcast, nq quads (even), in chains of
 * two; a chain from zero starts from a zeroing idiom (chain_init), not a copy of one zero register. */
LLB_AI TGT __m512i kg_dot(const __m512i *acc0, const __m512i *q, const int nq, const int8_t *x) {
    __m512i c[4];
    LLB_UNROLL
    for (int k = 0; k < nq / 2; k++) {
        c[k] = k || !acc0 ? chain_init(NULL) : *acc0;
        c[k] = dpbusd_b(c[k], q[2 * k], x + 8 * k);
        c[k] = dpbusd_b(c[k], q[2 * k + 1], x + 8 * k + 4);
    }
    if (nq == 2) return c[0];
    if (nq == 4) return _mm512_add_epi32(c[0], c[1]);
    return _mm512_add_epi32(_mm512_add_epi32(c[0], c[1]), _mm512_add_epi32(c[2], c[3]));
}

/* Sub-block s of a Q4_K/Q5_K/IQ4_XS group-block as dec_k4_sub decodes it, each vector loaded once. */
LLB_AI TGT void kg_dec_k4(const int qt, const uint8_t *gb, int s, __m512i q[8]) {  /* and step s's prefetch */
    const uint8_t *v = gb + (qt == LLB_IQ4_XS ? LLB_IQ4_XS_CODES : LLB_Q4_K_CODES) + 256 * s;
    const __m512i m4 = _mm512_set1_epi8(15);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        __m512i a = kg_ld(v + 64 * k);
        if (k == 0) kg_prefetch(&a, gb, LLB_GB_BYTES(qt), s);
        q[k] = _mm512_and_si512(a, m4);
        q[k + 4] = _mm512_and_si512(_mm512_srli_epi16(a, 4), m4);
    }
    if (qt == LLB_Q5_K) { /* add_fifth_bits's ternlogs from one load of the plane */
        const __m512i h = kg_ld(gb + LLB_Q5_K_PLANES + 64 * s), b4 = _mm512_set1_epi8(0x10);
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            const __m512i hs = t < 4 ? _mm512_slli_epi16(h, 4 - t) : t > 4 ? _mm512_srli_epi16(h, t - 4) : h;
            q[t] = _mm512_ternarylogic_epi32(q[t], hs, b4, 0xF8);
        }
    }
    if (qt == LLB_IQ4_XS) {
        const __m512i lut = _mm512_broadcast_i32x4(
            _mm_xor_si128(_mm_loadu_si128((const __m128i *)llb_iq4_grid), _mm_set1_epi8((char)0x80)));
        LLB_UNROLL
        for (int t = 0; t < 8; t++) q[t] = _mm512_shuffle_epi8(lut, q[t]);
    }
}

/* tile_q4k's gemv: super-blocks [s0, s1) of the group at wg for activation row 0, into tot. */
LLB_AI TGT __m512 kg_q4k(const int qt, const llb_mm *mm, const uint8_t *wg, long s0, long s1) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(0, 0, mm->cols / 256, xt);
    __m512 tot = _mm512_setzero_ps();
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_BYTES(qt);
        const __m512 d = load_f16x16(gb);
        const size_t e = at + xt * sb;
        const int32_t *bs = mm->a.bs16n + 16 * e;
        KG_UNROLL
        for (int s = 0; s < 8; s++) {
            __m512i q[8];
            kg_dec_k4(qt, gb, s, q);
            const __m512 sc = qt == LLB_IQ4_XS ? sub_scale_i8(gb + 32 + 16 * s, d) : sub_scale_u8(gb + 64 + 16 * s, d);
            const __m512i a0 = _mm512_set1_epi32(4 * (bs[2 * s] + bs[2 * s + 1])); /* IQ4_XS's zero point */
            const __m512i acc = kg_dot(qt == LLB_IQ4_XS ? &a0 : NULL, q, 8, mm->a.qs + 256 * e + 32 * s);
            tot = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(mm->a.d[8 * e + s])), sc, tot);
        }
        if (qt != LLB_IQ4_XS) {
            __m512 mn[8];
            q4k_mins(gb, mn);
            tot = _mm512_fnmadd_ps(q4k_min_dot(mn, mm->a.sum + 8 * e), load_f16x16(gb + 32), tot);
        }
    }
    return tot;
}

/* Q6_K's 16-value sub-block u of gb as dec_q6k_sub decodes it, each vector loaded once (u even: with step
 * u / 2's prefetch). */
LLB_AI TGT void kg_dec_q6k(const uint8_t *gb, int u, __m512i q[4]) {
    const uint8_t *sub = gb + LLB_Q6_K_SUBS + 192 * u;
    const __m512i m4 = _mm512_set1_epi8(15), m33 = _mm512_set1_epi8(0x33);
    __m512i a = kg_ld(sub);
    if (!(u & 1)) kg_prefetch(&a, gb, LLB_GB_Q6_K, u >> 1);
    const __m512i b = kg_ld(sub + 64), h = kg_ld(sub + 128);
    const __m512i hp = _mm512_and_si512(h, m33), hq = _mm512_and_si512(_mm512_srli_epi16(h, 2), m33);
    q[0] = _mm512_ternarylogic_epi32(a, _mm512_slli_epi16(hp, 4), m4, 0xE4);
    q[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), _mm512_slli_epi16(hq, 4), m4, 0xE4);
    q[2] = _mm512_ternarylogic_epi32(b, hp, m4, 0xE4);
    q[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, 4), hq, m4, 0xE4);
}

/* tile_k16's gemv (Q6_K; Q3_K through l2_dot_row): super-blocks [s0, s1) of the group at wg, row 0. */
LLB_AI TGT __m512 kg_k16(const int qt, const llb_mm *mm, const uint8_t *wg, long s0, long s1) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(0, 0, mm->cols / 256, xt);
    const int gbb = LLB_GB_BYTES(qt);
    __m512 tot = _mm512_setzero_ps();
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb = wg + sb * gbb;
        const __m512 d = load_f16x16(gb);
        const size_t e = at + xt * sb;
        const int32_t *bs = mm->a.bs16n + 16 * e;
        LLB_UNROLL
        for (int s = 0; s < 8; s++) {
            __m512 p;
            LLB_UNROLL
            for (int j = 0; j < 2; j++) {
                const int u = 2 * s + j;
                const int8_t *xq = mm->a.qs + 256 * e + 16 * u;
                const __m512 sc = sub_scale_i8(gb + 32 + 16 * u, d);
                __m512i acc;
                if (qt == LLB_Q6_K) { /* zero point: -32 * bsum16 */
                    __m512i q[4];
                    kg_dec_q6k(gb, u, q);
                    const __m512i a0 = _mm512_set1_epi32(bs[u]);
                    acc = kg_dot(&a0, q, 4, xq);
                } else { /* Q3_K: -4 * bsum16 = bs16n / 8 (zero_points) */
                    acc = l2_dot_row(qt, gb, u, _mm512_set1_epi32(bs[u] >> 3), xq, 1);
                }
                p = j ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc, p) : _mm512_mul_ps(_mm512_cvtepi32_ps(acc), sc);
            }
            tot = _mm512_fmadd_ps(p, _mm512_set1_ps(mm->a.d[8 * e + s]), tot);
        }
    }
    return tot;
}

/* q2k_step's gemv (M == 1): the dots of both sub-blocks in chains of two from codes loaded once. */
LLB_AI TGT __m512 kg_q2k_step(const uint8_t *gb, int s, const int8_t *qs, const int16_t *ns, const float *dx, __m512 d4,
                              __m512 dmin, __m512 tot) {
    const __m512i w = q2k_pairs(gb, s), mp = _mm512_srli_epi16(w, 4);
    const __m512i sc41 = _mm512_sllv_epi16(_mm512_and_si512(w, _mm512_set1_epi16(15)), _mm512_set1_epi32(2));
    const uint8_t *l = gb + LLB_Q2_K_CODES + 128 * s;
    const int8_t *x = qs + 32 * s;
    const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12);
    __m512i a = kg_ld(l);
    kg_prefetch(&a, gb, LLB_GB_Q2_K, s);
    const __m512i b = kg_ld(l + 64);
    const __m512i a4 = _mm512_srli_epi16(a, 4), b4 = _mm512_srli_epi16(b, 4);
    const __m512i q0[4] = {_mm512_and_si512(a, m3), _mm512_and_si512(a4, m3), _mm512_and_si512(b, m3), _mm512_and_si512(b4, m3)};
    const __m512i q1[4] = {_mm512_and_si512(a, m12), _mm512_and_si512(a4, m12), _mm512_and_si512(b, m12), _mm512_and_si512(b4, m12)};
    const __m512i c0 = kg_dot(NULL, q0, 4, x), c1 = kg_dot(NULL, q1, 4, x + 16);
    const __m512i acc = _mm512_madd_epi16(q2k_pack(c0, c1), sc41);
    const __m512i n = dpwssd_b(mp, ns + 2 * s);
    const __m512 p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), dmin, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), d4));
    return _mm512_fmadd_ps(p, _mm512_set1_ps(dx[s]), tot);
}

/* tile_q2k's gemv: super-blocks [s0, s1) of the group at wg, row 0. */
LLB_AI TGT __m512 kg_q2k(const llb_mm *mm, const uint8_t *wg, long s0, long s1) {
    const long xt = mm->a.xt;
    const size_t at = llb_act_at(0, 0, mm->cols / 256, xt);
    __m512 tot = _mm512_setzero_ps();
    for (long sb = s0; sb < s1; sb++) {
        const uint8_t *gb = wg + sb * LLB_GB_Q2_K;
        const __m512 d4 = _mm512_mul_ps(load_f16x16(gb), _mm512_set1_ps(0.25f)), dmin = load_f16x16(gb + 32);
        const size_t e = at + xt * sb;
        int16_t ns[16] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)ns, _mm512_cvtepi32_epi16(_mm512_srai_epi32(_mm512_loadu_si512(mm->a.bs16n + 16 * e), 5)));
        LLB_UNROLL
        for (int s = 0; s < 8; s++) tot = kg_q2k_step(gb, s, mm->a.qs + 256 * e, ns, mm->a.d + 8 * e, d4, dmin, tot);
    }
    return tot;
}

/* One group's GEMV over K chunks of LLB_KCHUNK (as the GEMM's, so the row sums in its order), stored. */
LLB_AI TGT void kg_gemv(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const long nsb = mm->cols / 256, kc = LLB_KCHUNK / 256;
    __m512 sum = _mm512_setzero_ps();
    for (long s0 = 0; s0 < nsb; s0 += kc) {
        const long s1 = s0 + kc < nsb ? s0 + kc : nsb;
        const __m512 t = qt == LLB_Q2_K ? kg_q2k(mm, wg, s0, s1)
                       : qt == LLB_Q6_K || qt == LLB_Q3_K ? kg_k16(qt, mm, wg, s0, s1)
                       : kg_q4k(qt, mm, wg, s0, s1);
        sum = s0 ? _mm512_add_ps(sum, t) : t;
    }
    _mm512_mask_storeu_ps(mm->out + g * LLB_IL, (__mmask16)((1u << llb_group_rows(mm, g)) - 1), sum);
}

#endif

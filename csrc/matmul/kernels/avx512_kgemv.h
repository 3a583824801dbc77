/* Q2_K's GEMV step (n == 1) on Zen 4 (tile_q2k at LLB_STREAM_FAR), included by avx512_kquants.c after its
 * helpers. It sums in exactly q2k_step's order at M == 1 (the same float operations on the same values; the
 * exact int32 dots split into chains of two give the same integers). Against q2k_step, for the DRAM stream:
 *  - each step's prefetches are asked for beside its first packed vector (kg_prefetch): in the unrolled
 *    steps GCC had scheduled all a super-block's builtin prefetches at its start, and that burst held
 *    one core's Q2_K GEMV from DRAM at ~11 GB/s of CPU time (now ~17.5; docs/BENCHMARKS.md 2026-12-04);
 *  - each packed vector is loaded once (kg_ld), the dots in chains of two with folded broadcasts.
 * The same changes to the other K-quant GEMVs were up to 1.2x faster from L3 but not from DRAM (what
 * decode reads; 4-10% slower, or level with the loads left twice), so those keep the tile's gemv_k, as
 * Intel does. */
#ifndef LLB_AVX512_KGEMV_H
#define LLB_AVX512_KGEMV_H

/* A packed vector loaded into a register once, in program order (GCC folded one load into both the
 * and and the shift). */
LLB_AI TGT __m512i kg_ld(const void *p) {
    __m512i a;
    __asm__ volatile("vmovdqu64 %1, %0" : "=v"(a) : "m"(*(const __m512i *)p));
    return a;
}

/* Step s's slice of the group-block's lines (LLB_SLICE_AT, as llb_prefetch_slice's at LLB_STREAM_FAR: into
 * L2, LLB_PF_FAR ahead), each in an asm tied to the step's first packed vector a, so it stays in its step. */
LLB_AI TGT void kg_prefetch(__m512i *a, const uint8_t *gb, const int bytes, int s) {
    const int per = LLB_SLICE_LINES(bytes);
    LLB_UNROLL
    for (int l = 0; l < per; l++) {
        const int o = LLB_SLICE_AT(per, s, l);
        if (o < bytes) __asm__ volatile("prefetcht1 %1" : "+v"(*a) : "m"(*(const char *)(gb + o + LLB_PF_FAR)));
    }
}

/* sum_t q[t] . the 4 activation bytes at x + 4t broadcast, 4 quads in two chains, each from a zeroing
 * idiom (chain_init), not a copy of one zero register. */
LLB_AI TGT __m512i kg_dot4(const __m512i q[4], const int8_t *x) {
    __m512i c[2];
    LLB_UNROLL
    for (int k = 0; k < 2; k++) {
        c[k] = dpbusd_b(chain_init(NULL), q[2 * k], x + 8 * k);
        c[k] = dpbusd_b(c[k], q[2 * k + 1], x + 8 * k + 4);
    }
    return _mm512_add_epi32(c[0], c[1]);
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
    const __m512i c0 = kg_dot4(q0, x), c1 = kg_dot4(q1, x + 16);
    const __m512i acc = _mm512_madd_epi16(q2k_pack(c0, c1), sc41);
    const __m512i n = dpwssd_b(mp, ns + 2 * s);
    const __m512 p = _mm512_fmadd_ps(_mm512_cvtepi32_ps(n), dmin, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), d4));
    return _mm512_fmadd_ps(p, _mm512_set1_ps(dx[s]), tot);
}

#endif

/* The 32-block GEMM's pair tile for cores that broadcast apart (llb_isa_split_broadcast: AMD's Zen 4),
 * included by avx512.c after tile32x2, whose sums it computes through the same float operations in
 * the same order (integer dots are exact in any order), so bit for bit the same outputs.
 *
 * Measured on Zen 4 (docs/BENCHMARKS.md, 2026-12-04): a {1to16} broadcast operand of vpdpbusd runs as
 * fast as a separate vpbroadcastd there, in an asm loop and in the tile alike; what costs is GCC's
 * code around tile32x2's 16 chains (accumulators spilled across the panel loads, the 16 float sums
 * forced to memory every block, their activation scales folded into the FMAs). Here tiles of 4 rows
 * keep both groups' 8 chains and 8 sums in registers (8 + 8 + 2 codes + 1 broadcast of 32), every
 * broadcast is its own instruction (asm: GCC would fold it), and each feeds both groups' chains. */
#ifndef LLB_AVX512_SPLIT_H
#define LLB_AVX512_SPLIT_H

#define SPLIT_ROWS 4 /* activation rows of a split pair tile */

/* The int32 (or float) at p in all 16 lanes, as an instruction of its own (GCC would fold it into the
 * multiply). */
LLB_AI TGT __m512i bcast_epi32(const void *p) {
    __m512i v;
    __asm__("vpbroadcastd %1, %0" : "=v"(v) : "m"(*(const int32_t *)p));
    return v;
}
LLB_AI TGT __m512 bcast_ps(const float *p) {
    __m512 v;
    __asm__("vbroadcastss %1, %0" : "=v"(v) : "m"(*p));
    return v;
}

/* tile32x2 for M <= 4 rows from row i (never across an activation tile), the sums in registers. */
LLB_AI TGT void tile32x2s(const llb_mm *mm, long i, const int M, const int qt, long b0, long b1,
                          const __m512i *const pan[2], __m512 tot[2][SPLIT_ROWS]) {
    const long nb = mm->cols / 32, xt = mm->a.xt;
    const size_t at = llb_act_at(i, b0, nb, xt);
    const int8_t *xq = mm->a.qs + 32 * at;
    const float *xd = mm->a.d + at, *xs = mm->a.sum + at, *xd2 = mm->a.d2 + at;
    const int32_t *xb = mm->a.bias + at;
    LLB_UNROLL
    for (int g = 0; g < 2; g++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) tot[g][m] = _mm512_setzero_ps();
    }
    for (long b = b0; b < b1; b++) {
        const __m512i *const qp[2] = {pan[0] + PANEL32 * (b - b0), pan[1] + PANEL32 * (b - b0)};
        __m512i acc[2][SPLIT_ROWS];
        LLB_UNROLL
        for (int g = 0; g < 2; g++) {
            LLB_UNROLL
            for (int m = 0; m < M; m++) acc[g][m] = chain_init(LLB_HAS_MIN32(qt) ? NULL : xb + m);
        }
        PAIR_DOTS(acc, qp, xq, M, bcast_epi32);
        LLB_UNROLL
        for (int g = 0; g < 2; g++) {
            const __m512 dv = _mm512_castsi512_ps(_mm512_load_si512(qp[g] + 8));
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[g][m]), dv);
                tot[g][m] = _mm512_fmadd_ps(f, bcast_ps(xd + m), tot[g][m]);
                if (LLB_HAS_MIN32(qt))
                    tot[g][m] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_load_si512(qp[g] + 9)), bcast_ps(xs + m), tot[g][m]);
            }
        }
        /* the rows with a residual (d2 != 0): one test for the tile, most have none */
        unsigned r2 = _mm_cmp_ps_mask(_mm_maskz_loadu_ps((__mmask8)((1u << M) - 1), xd2), _mm_setzero_ps(), _CMP_NEQ_OQ);
        if (__builtin_expect(r2 != 0, 0)) {
            const int32_t *xb2 = mm->a.bias2 + at + (b - b0) * xt;
            const int8_t *xq2 = mm->a.qs2 + 32 * (at + (b - b0) * xt);
            const __m512 dv[2] = {_mm512_castsi512_ps(_mm512_load_si512(qp[0] + 8)), _mm512_castsi512_ps(_mm512_load_si512(qp[1] + 8))};
            LLB_UNROLL
            for (int m = 0; m < M; m++)
                if (r2 >> m & 1)
                    residual_dots(qt, 2, qp, xq2 + 32 * m, xb2[m], dv, xd2[m], (__m512 *const[]){&tot[0][m], &tot[1][m]});
        }
        xq += 32 * xt;
        xd += xt;
        xs += xt;
        xb += xt;
        xd2 += xt;
    }
}

/* The bytes a pair unit's next panel fill reads, asked into L2 a slice per tile while the tiles run (the
 * fill's own prefetch, a few KB ahead, waited on DRAM: ~10% of a Q4_0 unit's time on Zen 4): the pair's
 * next K chunk, or after its last the next pair's first chunks, the thread's next unit (units go in
 * group order, packed groups lie back to back; a prefetch past the matrix does not fault). */
typedef struct {
    const uint8_t *p[2]; /* the two groups' next bytes */
    long left, step;     /* bytes still to ask for per group, per tile */
    long tiles;          /* tiles per pass over the unit's rows (an upper bound) */
} split_pf;

LLB_AI TGT void split_next(const llb_mm *mm, const uint8_t *wg, long b1, long nb, const int qt, split_pf *pf) {
    const long gbb = LLB_GB_BYTES(qt), kc = LLB_KCHUNK / 32;
    if (b1 < nb) {
        pf->p[0] = wg + b1 * gbb;
        pf->p[1] = mm->wg2 + b1 * gbb;
        pf->left = ((b1 + kc < nb ? b1 + kc : nb) - b1) * gbb;
    } else if (mm->wg2 == wg + nb * gbb) {
        pf->p[0] = wg + 2 * nb * gbb;
        pf->p[1] = wg + 3 * nb * gbb;
        pf->left = (kc < nb ? kc : nb) * gbb;
    } else {
        pf->left = 0;
    }
    pf->step = (pf->left / 64 + pf->tiles - 1) / pf->tiles * 64;
}

LLB_AI void split_prefetch(split_pf *pf) {
    if (pf->left <= 0) return;
    for (long o = 0; o < pf->step; o += 64) {
        __builtin_prefetch(pf->p[0] + o, 0, 2);
        __builtin_prefetch(pf->p[1] + o, 0, 2);
    }
    pf->p[0] += pf->step;
    pf->p[1] += pf->step;
    pf->left -= pf->step;
}

#endif

/* AVX-512 kernels (F, BW, VL, VNNI): activation quantization, the integer
 * kernels of the 32-value block types, and the exact (FP32) kernels of every
 * type. The K-quant integer kernels are in avx512_kquants.c.
 *
 * Fast path: one zmm lane = one weight row of the 16-row group; vpdpbusd
 * multiplies the unsigned weight codes (4 per lane) by 4 broadcast int8
 * activations and sums into the lane. The code offset of Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4
 * (8/16/128/128/12, codes are decoded unsigned) is folded into the accumulator's
 * initial value, -offset * sum(xq), computed once per activation block. */
#include "matmul/kernels/avx512_decode.h"

#if LLB_X86

/* ---- activation quantization (same rounding as the scalar path) ---------- */

/* The row's squared threshold on a block's absmax (LLB_OUTLIER, kernels.h): sum(x^2) in double. */
LLB_AI TGT double outlier_t2(const float *x, long cols) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    long k = 0;
    for (; k + 16 <= cols; k += 16) {
        const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + k)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + k + 8));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; k < cols; k++) ss += (double)x[k] * x[k];
    return LLB_OUTLIER * LLB_OUTLIER * ss / (double)cols;
}

/* 32 values a, c to codes at qb (as int32 in qa, qc); returns the absmax. */
LLB_AI TGT float quant_pair(__m512 a, __m512 c, int8_t *qb, __m512i *qa, __m512i *qc) {
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    *qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
    *qc = _mm512_cvtps_epi32(_mm512_mul_ps(c, id));
    _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(*qa));
    _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtsepi32_epi8(*qc));
    return amax;
}

/* Lane u of the result = sum (or max: op 1, for non-negative values) of the 16 lanes of v[u]:
 * a transpose-and-reduce tree (45 operations instead of 16 horizontal reductions). */
LLB_AI TGT __m512i reduce_op(const int op, __m512i a, __m512i b) { return op ? _mm512_max_epi32(a, b) : _mm512_add_epi32(a, b); }
LLB_AI TGT __m512i reduce_lanes16(const int op, const __m512i v[16]) {
    __m512i p[8], q[4], w[2];
    LLB_UNROLL
    for (int k = 0; k < 8; k++) /* per 128-bit lane: [a0.a2, b0.b2, a1.a3, b1.b3] */
        p[k] = reduce_op(op, _mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
    LLB_UNROLL
    for (int k = 0; k < 4; k++) /* per 128-bit lane: that lane's reductions of 4 vectors */
        q[k] = reduce_op(op, _mm512_unpacklo_epi64(p[2 * k], p[2 * k + 1]), _mm512_unpackhi_epi64(p[2 * k], p[2 * k + 1]));
    LLB_UNROLL
    for (int k = 0; k < 2; k++) /* across 128-bit lanes, pairwise */
        w[k] = reduce_op(op, _mm512_shuffle_i32x4(q[2 * k], q[2 * k + 1], 0x88), _mm512_shuffle_i32x4(q[2 * k], q[2 * k + 1], 0xDD));
    return reduce_op(op, _mm512_shuffle_i32x4(w[0], w[1], 0x88), _mm512_shuffle_i32x4(w[0], w[1], 0xDD));
}

/* Block b of a row (quant32): codes, scale, bias, sum and, for an outlier block, its residual's. */
LLB_AI TGT void quant_block32(const float *x, long b, long xt, int offset, double t2, int8_t *qs, float *d, int32_t *bias,
                              float *sum, int8_t *qs2, float *d2, int32_t *bias2) {
    const __m512 a = _mm512_loadu_ps(x + 32 * b), c = _mm512_loadu_ps(x + 32 * b + 16);
    __m512i qa, qc;
    const float amax = quant_pair(a, c, qs + xt * 32 * b, &qa, &qc), db = amax / 127.0f;
    const int32_t isum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
    d[xt * b] = db;
    bias[xt * b] = -offset * isum;
    float s = db * (float)isum, dr = 0.0f; /* see scalar.c: the quantized sum, not the exact one */
    if ((double)amax * amax > t2) { /* an outlier block: its residual x - d * q (fused) too */
        const __m512 dv = _mm512_set1_ps(-db);
        const __m512 ra = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(qa), a), rc = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(qc), c);
        dr = quant_pair(ra, rc, qs2 + xt * 32 * b, &qa, &qc) / 127.0f;
        const int32_t isum2 = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qc));
        bias2[xt * b] = -offset * isum2;
        s += dr * (float)isum2;
    }
    d2[xt * b] = dr;
    sum[xt * b] = s;
}

/* 16 blocks from block b (quant32): the absmaxes and code sums of 16 blocks reduced together
 * (reduce_lanes16: |x| as int32 orders like the float, integer sums are exact) and their scalar
 * steps done as vectors, the same IEEE operations as quant_block32's; an outlier block is then
 * redone by quant_block32 (its residual). */
LLB_AI TGT void quant16_blocks32(const float *x, long b, long xt, int offset, double t2, int8_t *qs, float *d,
                                 int32_t *bias, float *sum, int8_t *qs2, float *d2, int32_t *bias2) {
    const float *xb = x + 32 * b;
    __m512i v[16];
    LLB_UNROLL
    for (int u = 0; u < 16; u++)
        v[u] = _mm512_castps_si512(
            _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * u)), _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * u + 16))));
    const __m512 amax = _mm512_castsi512_ps(reduce_lanes16(1, v));
    const __mmask16 nz = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0f), amax), dv = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    LLB_UNROLL
    for (int u = 0; u < 16; u++) {
        const __m512 idu = _mm512_permutexvar_ps(_mm512_set1_epi32(u), id);
        const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * u), idu));
        const __m512i qc = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 32 * u + 16), idu));
        int8_t *qb = qs + xt * 32 * (b + u);
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(qa));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtsepi32_epi8(qc));
        v[u] = _mm512_add_epi32(qa, qc);
    }
    const __m512i isum = reduce_lanes16(0, v);
    __attribute__((aligned(64))) float dd[16], ss[16];
    __attribute__((aligned(64))) int32_t bb[16];
    _mm512_store_ps(dd, dv);
    _mm512_store_ps(ss, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(isum)));
    _mm512_store_si512(bb, _mm512_mullo_epi32(isum, _mm512_set1_epi32(-offset)));
    /* the outlier test in double, as quant_block32's: amax^2 is exact there */
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(amax)), t2v = _mm512_set1_pd(t2),
                  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(amax), 1)));
    unsigned out = _mm512_cmp_pd_mask(_mm512_mul_pd(lo, lo), t2v, _CMP_GT_OQ) |
                   (unsigned)_mm512_cmp_pd_mask(_mm512_mul_pd(hi, hi), t2v, _CMP_GT_OQ) << 8;
    for (int u = 0; u < 16; u++) {
        const long k = xt * (b + u);
        d[k] = dd[u];
        bias[k] = bb[u];
        sum[k] = ss[u];
        d2[k] = 0.0f;
    }
    for (; out; out &= out - 1)
        quant_block32(x, b + __builtin_ctz(out), xt, offset, t2, qs, d, bias, sum, qs2, d2, bias2);
}

TGT static void quant32(const float *x, long cols, long xt, int offset, int8_t *qs, float *d, int32_t *bias, float *sum,
                        int8_t *qs2, float *d2, int32_t *bias2) {
    const double t2 = outlier_t2(x, cols);
    const long nb = cols / 32;
    long b = 0;
    for (; b + 16 <= nb; b += 16) quant16_blocks32(x, b, xt, offset, t2, qs, d, bias, sum, qs2, d2, bias2);
    for (; b < nb; b++) quant_block32(x, b, xt, offset, t2, qs, d, bias, sum, qs2, d2, bias2);
}

/* 256-blocks, one scale per 32 values (as quant32); vectors u = 16-value halves. |x| as int32
 * orders like the float, so the absmax reduces with integer max. */
TGT static void quant256(const float *x, long cols, long xt, int8_t *qs, float *d, float *sum, int32_t *bs16n) {
    for (long b = 0; b < cols / 256; b++) {
        const float *xb = x + 256 * b;
        __m512i v[16], q[16];
        LLB_UNROLL
        for (int u = 0; u < 16; u++) v[u] = _mm512_castps_si512(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * u)));
        const __m512i m16 = reduce_lanes16(1, v);
        /* lanes 2s, 2s+1: amax of the 32 values of sub-block s */
        const __m512 amax = _mm512_castsi512_ps(_mm512_max_epi32(m16, _mm512_shuffle_epi32(m16, _MM_PERM_CDAB)));
        const __mmask16 nz = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
        const __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0f), amax);
        const __m512 dv = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
        LLB_UNROLL
        for (int u = 0; u < 16; u++) {
            const __m512 idu = _mm512_permutexvar_ps(_mm512_set1_epi32(u), id);
            q[u] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * u), idu));
            _mm_storeu_si128((__m128i *)(qs + xt * 256 * b + 16 * u), _mm512_cvtsepi32_epi8(q[u]));
        }
        const __m512i s16 = reduce_lanes16(0, q);
        _mm512_storeu_si512(bs16n + xt * 16 * b, _mm512_mullo_epi32(s16, _mm512_set1_epi32(-32)));
        const __m512i s32 = _mm512_add_epi32(s16, _mm512_shuffle_epi32(s16, _MM_PERM_CDAB)); /* even lanes: 2s + 2s+1 */
        _mm256_storeu_ps(d + xt * 8 * b, _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, dv)));
        _mm256_storeu_ps(sum + xt * 8 * b,
                         _mm512_castps512_ps256(_mm512_maskz_compress_ps(0x5555, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(s32)))));
    }
}

static int act_offset(int qtype) { return LLB_CODE_OFF32(qtype); } /* every zero point goes in via vpdpbusd's start */

/* ---- fast kernels of the 32-value block types ----------------------------- */

#define TILE_ROWS 16 /* activation rows per GEMM tile: decode once, use 16 times */

/* An outlier block's residual (LLB_OUTLIER) against G groups (their codes q[g], already decoded):
 * tot[g] + (dv[g] * (w . q2)) * d2, each activation broadcast feeding the G groups. */
LLB_AI TGT void residual_dots(const int qt, const int G, const __m512i *const q[], const int8_t *xq2, int32_t bias2,
                              const __m512 dv[], float d2, __m512 *const tot[]) {
    __m512i a0[2], a1[2];
    LLB_UNROLL
    for (int g = 0; g < G; g++) {
        a0[g] = _mm512_set1_epi32(LLB_HAS_MIN32(qt) ? 0 : bias2);
        a1[g] = _mm512_setzero_si512();
    }
    LLB_UNROLL
    for (int t = 0; t < 4; t++) { /* two chains a group: half the latency (integer sums are exact) */
        const __m512i x0 = _mm512_set1_epi32(llb_ld32(xq2 + 4 * t)), x1 = _mm512_set1_epi32(llb_ld32(xq2 + 16 + 4 * t));
        LLB_UNROLL
        for (int g = 0; g < G; g++) {
            a0[g] = _mm512_dpbusd_epi32(a0[g], _mm512_loadu_si512(q[g] + t), x0);
            a1[g] = _mm512_dpbusd_epi32(a1[g], _mm512_loadu_si512(q[g] + t + 4), x1);
        }
    }
    LLB_UNROLL
    for (int g = 0; g < G; g++)
        *tot[g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0[g], a1[g])), dv[g]), _mm512_set1_ps(d2), *tot[g]);
}

/* The same for one group. */
LLB_AI TGT __m512 residual_dot(const int qt, const __m512i *q, const int8_t *xq2, int32_t bias2, __m512 dv, float d2,
                               __m512 tot) {
    residual_dots(qt, 1, &q, xq2, bias2, &dv, d2, (__m512 *const[]){&tot});
    return tot;
}

/* A work unit of more than one tile decodes the group's K chunk once (fast32) into a panel its
 * tiles read: per block its 8 code vectors, the rows' scales and (Q4_1, Q5_1) mins, the values a
 * tile would decode, so the same sums. */
#define PANEL32 10

LLB_AI TGT void fill_panel32(const int qt, const uint8_t *wg, long b0, long b1, __m512i *pan) {
    for (long b = b0; b < b1; b++) {
        const uint8_t *gb = wg + b * LLB_GB_BYTES(qt);
        __m512i *pb = pan + PANEL32 * (b - b0), q[8];
        llb_prefetch_ahead(gb, LLB_GB_BYTES(qt), 0);
        dec_block32(qt, gb, q);
        LLB_UNROLL
        for (int t = 0; t < 8; t++) _mm512_store_si512(pb + t, q[t]);
        _mm512_store_si512(pb + 8, _mm512_castps_si512(block_scale16(qt, gb)));
        if (LLB_HAS_MIN32(qt)) _mm512_store_si512(pb + 9, _mm512_castps_si512(load_f16x16(gb + 32)));
    }
}

/* acc += q . the 4 activation bytes at x broadcast as vpdpbusd's {1to16} memory operand (GCC loads
 * each broadcast into a register first: one more instruction per multiply). The same integers. */
LLB_AI TGT __m512i dpbusd_x4(__m512i acc, __m512i q, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(q), "m"(*(const int32_t *)x));
    return acc;
}

/* M activation rows from row i against the whole group: several rows per weight decode (or, with
 * pan, per panel read). M <= 8 lie in one activation tile; M = 16 is two whole ones (i a multiple of
 * LLB_XT), so 16 chains of vpdpbusd hide its latency; their 16 sums wait in memory between blocks
 * (tot, forced there: the registers hold the chains). */
LLB_AI TGT void tile32(const llb_mm *mm, const uint8_t *wg, long i, const int M, const int qt, long b0, long b1,
                       const __m512i *pan, __m512 tot[]) {
    const long nb = mm->cols / 32, xt = mm->a.xt, x8 = nb * xt; /* entries from row i's block to row i + 8's */
    const size_t at = llb_act_at(i, b0, nb, xt);
    /* [h]: rows 8h.. (h = 1 only for M = 16), each its own pointer so a row's operands are constant offsets */
    const int8_t *xq[2] = {mm->a.qs + 32 * at, mm->a.qs + 32 * (at + x8)};
    const float *xd[2] = {mm->a.d + at, mm->a.d + at + x8}, *xs[2] = {mm->a.sum + at, mm->a.sum + at + x8};
    const int32_t *xb[2] = {mm->a.bias + at, mm->a.bias + at + x8};
    const int8_t *xq2 = mm->a.qs2 + 32 * at;
    const float *xd2 = mm->a.d2 + at;
    const int32_t *xb2 = mm->a.bias2 + at;
#define ROW32(p, m) ((p)[(m) >> 3] + ((m) & 7)) /* row m's entry (x 32 for codes) */
#define ROW32X(m) (((m) & 7) + ((m) >> 3) * x8) /* the residual's, off row 0's (rarely read) */
    LLB_UNROLL
    for (int m = 0; m < M; m++) tot[m] = _mm512_setzero_ps();
    for (long b = b0; b < b1; b++) {
        __m512i q[8];
        const __m512i *qp = q; /* the block's code vectors: decoded, or where they lie (panel, Q8_0's bytes) */
        __m512 dv, mv;
        if (pan) {
            const __m512i *pb = pan + PANEL32 * (b - b0);
            qp = pb;
            dv = _mm512_castsi512_ps(_mm512_load_si512(pb + 8));
            mv = LLB_HAS_MIN32(qt) ? _mm512_castsi512_ps(_mm512_load_si512(pb + 9)) : dv;
        } else {
            const uint8_t *gb = wg + b * LLB_GB_BYTES(qt);
            llb_prefetch_ahead(gb, LLB_GB_BYTES(qt), 0);
            if (qt == LLB_Q8_0) qp = (const __m512i *)(gb + 32);
            else dec_block32(qt, gb, q);
            dv = block_scale16(qt, gb);
            mv = LLB_HAS_MIN32(qt) ? load_f16x16(gb + 32) : dv;
        }
        __m512i acc[TILE_ROWS];
        LLB_UNROLL
        for (int m = 0; m < M; m++) acc[m] = LLB_HAS_MIN32(qt) ? _mm512_setzero_si512() : _mm512_set1_epi32(*ROW32(xb, m));
        LLB_UNROLL
        for (int t = 0; t < 8; t++) { /* quad-major: the M accumulation chains advance together */
            const __m512i qt_ = _mm512_loadu_si512(qp + t); /* a panel's or Q8_0's: read next to its dots */
            LLB_UNROLL
            for (int m = 0; m < M; m++) acc[m] = dpbusd_x4(acc[m], qt_, xq[m >> 3] + 32 * (m & 7) + 4 * t);
        }
        /* which of the M rows' blocks carry a residual (d2 != 0): one test for the tile, most have none */
        const int m8 = M < 8 ? M : 8;
        __mmask16 r2 = _mm256_cmp_ps_mask(_mm256_maskz_loadu_ps((__mmask8)((1u << m8) - 1), xd2), _mm256_setzero_ps(), _CMP_NEQ_OQ);
        if (M > 8) r2 |= (__mmask16)(_mm256_cmp_ps_mask(_mm256_loadu_ps(xd2 + x8), _mm256_setzero_ps(), _CMP_NEQ_OQ) << 8);
        LLB_UNROLL
        for (int m = 0; m < M; m++) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[m]), dv);
            tot[m] = _mm512_fmadd_ps(f, _mm512_set1_ps(*ROW32(xd, m)), tot[m]);
            if (LLB_HAS_MIN32(qt)) tot[m] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*ROW32(xs, m)), tot[m]);
        }
        if (r2) {
            if (M > 8) { /* the sums are in memory: one loop over the rows with a residual */
                for (unsigned r = r2; r; r &= r - 1) {
                    const int m = __builtin_ctz(r);
                    const long e = (m & 7) + (m >> 3) * x8;
                    tot[m] = residual_dot(qt, qp, xq2 + 32 * e, xb2[e], dv, xd2[e], tot[m]);
                }
            } else {
                LLB_UNROLL
                for (int m = 0; m < M; m++)
                    if (r2 >> m & 1)
                        tot[m] = residual_dot(qt, qp, xq2 + 32 * ROW32X(m), xb2[ROW32X(m)], dv, xd2[ROW32X(m)], tot[m]);
            }
        }
        if (M > 8) __asm__("" : "+m"(*(__m512(*)[TILE_ROWS])tot));
        LLB_UNROLL
        for (int h = 0; h < 2; h++) {
            xq[h] += 32 * xt;
            xd[h] += xt;
            xs[h] += xt;
            xb[h] += xt;
        }
        xq2 += 32 * xt;
        xd2 += xt;
        xb2 += xt;
    }
#undef ROW32
#undef ROW32X
}

/* A block's 8 steps of a pair tile: acc[g][m] += group g's codes (panel qp[g]) . activation row m's 4
 * bytes a step (xq, rows 32 apart), each broadcast by BCAST(p) feeding both groups' chains. A macro, so
 * tile32x2 (GCC folds its broadcast into the multiply, as tuned on Intel) and the AMD tile32x2s
 * (avx512_split.h: bcast_epi32, an instruction of its own) share the loop with tile32x2's machine code
 * unchanged (an inline function changed it). */
#define PAIR_DOTS(acc, qp, xq, M, BCAST)                                                          \
    do {                                                                                          \
        LLB_UNROLL                                                                                \
        for (int t = 0; t < 8; t++) {                                                             \
            const __m512i q0 = _mm512_load_si512((qp)[0] + t), q1 = _mm512_load_si512((qp)[1] + t); \
            LLB_UNROLL                                                                            \
            for (int m = 0; m < (M); m++) {                                                       \
                const __m512i x = BCAST((xq) + 32 * m + 4 * t);                                   \
                acc[0][m] = _mm512_dpbusd_epi32(acc[0][m], q0, x);                                \
                acc[1][m] = _mm512_dpbusd_epi32(acc[1][m], q1, x);                                \
            }                                                                                     \
        }                                                                                         \
    } while (0)
#define BCAST_SET1(p) _mm512_set1_epi32(llb_ld32(p))

/* A pair of groups (their panels pan[0], pan[1]) against M <= 8 activation rows from row i: each
 * activation broadcast feeds both groups' chains (half the broadcasts of two tile32 calls); the 2M
 * sums wait in memory between blocks. Each group's sums take tile32's operations in its order. */
LLB_AI TGT void tile32x2(const llb_mm *mm, long i, const int M, const int qt, long b0, long b1, const __m512i *const pan[2],
                         __m512 tot[2][LLB_XT]) {
    const long nb = mm->cols / 32, xt = mm->a.xt;
    const size_t at = llb_act_at(i, b0, nb, xt);
    const int8_t *xq = mm->a.qs + 32 * at, *xq2 = mm->a.qs2 + 32 * at;
    const float *xd = mm->a.d + at, *xs = mm->a.sum + at, *xd2 = mm->a.d2 + at;
    const int32_t *xb = mm->a.bias + at, *xb2 = mm->a.bias2 + at;
    LLB_UNROLL
    for (int g = 0; g < 2; g++) {
        LLB_UNROLL
        for (int m = 0; m < M; m++) tot[g][m] = _mm512_setzero_ps();
    }
    for (long b = b0; b < b1; b++) {
        const __m512i *const qp[2] = {pan[0] + PANEL32 * (b - b0), pan[1] + PANEL32 * (b - b0)};
        __m512i acc[2][LLB_XT];
        LLB_UNROLL
        for (int g = 0; g < 2; g++) {
            LLB_UNROLL
            for (int m = 0; m < M; m++) acc[g][m] = chain_init(LLB_HAS_MIN32(qt) ? NULL : xb + m);
        }
        PAIR_DOTS(acc, qp, xq, M, BCAST_SET1);
        const __mmask8 r2 = _mm256_cmp_ps_mask(_mm256_maskz_loadu_ps((__mmask8)((1u << M) - 1), xd2), _mm256_setzero_ps(), _CMP_NEQ_OQ);
        __m512 dv[2], mv[2];
        LLB_UNROLL
        for (int g = 0; g < 2; g++) {
            dv[g] = _mm512_castsi512_ps(_mm512_load_si512(qp[g] + 8));
            mv[g] = LLB_HAS_MIN32(qt) ? _mm512_castsi512_ps(_mm512_load_si512(qp[g] + 9)) : dv[g];
            LLB_UNROLL
            for (int m = 0; m < M; m++) {
                const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[g][m]), dv[g]);
                tot[g][m] = _mm512_fmadd_ps(f, _mm512_set1_ps(xd[m]), tot[g][m]);
                if (LLB_HAS_MIN32(qt)) tot[g][m] = _mm512_fmadd_ps(mv[g], _mm512_set1_ps(xs[m]), tot[g][m]);
                __asm__("" : "+m"(tot[g][m])); /* stored now: its register goes back to the chains */
            }
        }
        for (unsigned r = r2; r; r &= r - 1) { /* the rows with a residual */
            const int m = __builtin_ctz(r);
            residual_dots(qt, 2, qp, xq2 + 32 * m, xb2[m], dv, xd2[m], (__m512 *const[]){&tot[0][m], &tot[1][m]});
        }
        xq += 32 * xt;
        xd += xt;
        xs += xt;
        xb += xt;
        xq2 += 32 * xt;
        xd2 += xt;
        xb2 += xt;
    }
}

#include "matmul/kernels/avx512_split.h"

/* n == 1: streams the group (prefetched as `stream` says: common.h), summing in exactly tile32's order
 * (per K chunk one FP32 chain from zero, block by block; chunks added in order), so a single row equals
 * that row of a batch bit for bit. The integer dot is split in two chains (integer sums are exact). */
LLB_AI TGT __m512 gemv32(const llb_mm *mm, const uint8_t *wg, const int qt, const int stream) {
    const long nb = mm->cols / 32, kc = LLB_KCHUNK / 32;
    const int gbb = LLB_GB_BYTES(qt);
    __m512 out = _mm512_setzero_ps();
    for (long b0 = 0; b0 < nb; b0 += kc) {
        const long b1 = b0 + kc < nb ? b0 + kc : nb;
        __m512 tot = _mm512_setzero_ps();
        for (long b = b0; b < b1; b++) { /* n == 1: one row, blocks contiguous (xt = 1) */
            const uint8_t *gb = wg + b * gbb;
            llb_prefetch_ahead(gb, gbb, stream); /* from DRAM: the stream */
            __m512i q[8];
            dec_block32_as(qt, gb, q, llb_stream_on_zen4(stream)); /* Zen 4: each code vector loaded once */
            const int8_t *xq = mm->a.qs + 32 * b;
            __m512i a0 = _mm512_set1_epi32(LLB_HAS_MIN32(qt) ? 0 : mm->a.bias[b]), a1 = _mm512_setzero_si512();
            LLB_UNROLL
            for (int t = 0; t < 4; t++) {
                a0 = _mm512_dpbusd_epi32(a0, q[t], _mm512_set1_epi32(llb_ld32(xq + 4 * t)));
                a1 = _mm512_dpbusd_epi32(a1, q[t + 4], _mm512_set1_epi32(llb_ld32(xq + 16 + 4 * t)));
            }
            const __m512 dv = block_scale16(qt, gb), f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), dv);
            tot = _mm512_fmadd_ps(f, _mm512_set1_ps(mm->a.d[b]), tot);
            if (LLB_HAS_MIN32(qt)) tot = _mm512_fmadd_ps(load_f16x16(gb + 32), _mm512_set1_ps(mm->a.sum[b]), tot);
            if (mm->a.d2[b] != 0.0f) tot = residual_dot(qt, q, mm->a.qs2 + 32 * b, mm->a.bias2[b], dv, mm->a.d2[b], tot);
        }
        out = b0 ? _mm512_add_ps(out, tot) : tot;
    }
    return out;
}

/* A tile of M rows from row i over blocks [b0, b1), stored (added after the first chunk). */
/* pan a literal in tile32 (NULL or not), so a panel tile holds one code vector at a time. */
#define TILE32(i, M)                                                                \
    do {                                                                            \
        __m512 t_[TILE_ROWS];                                                       \
        if (panel) tile32(mm, wg, i, M, qt, b0, b1, pan, t_);                       \
        else tile32(mm, wg, i, M, qt, b0, b1, NULL, t_);                            \
        llb512_put_rows(o + (i) * mm->rows, mm->rows, km, t_, M, b0 > 0);           \
    } while (0)

/* A pair tile of M rows from row i: group g's outputs, then g + 1's. */
#define TILE32X2(i, M)                                                              \
    do {                                                                            \
        __m512 t_[2][LLB_XT];                                                       \
        tile32x2(mm, i, M, qt, b0, b1, pans, t_);                                   \
        llb512_put_rows(o + (i) * mm->rows, mm->rows, km, t_[0], M, b0 > 0);        \
        llb512_put_rows(o + LLB_IL + (i) * mm->rows, mm->rows, km2, t_[1], M, b0 > 0); \
    } while (0)

/* The same with split pair tiles (avx512_split.h). */
#define TILE32X2S(i, M)                                                             \
    do {                                                                            \
        __m512 t_[2][SPLIT_ROWS];                                                   \
        split_prefetch(&pf);                                                        \
        tile32x2s(mm, i, M, qt, b0, b1, pans, t_);                                  \
        llb512_put_rows(o + (i) * mm->rows, mm->rows, km, t_[0], M, b0 > 0);        \
        llb512_put_rows(o + LLB_IL + (i) * mm->rows, mm->rows, km2, t_[1], M, b0 > 0); \
    } while (0)

LLB_AI TGT void fast32_one(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    const __mmask16 km = (__mmask16)((1u << llb_group_rows(mm, g)) - 1);
    float *o = mm->out + g * LLB_IL;
    if (LLB_GEMV(mm)) {
        const __m512 r = mm->far ? gemv32(mm, wg, qt, LLB_FAR_STREAM_OF(qt)) : gemv32(mm, wg, qt, LLB_STREAM);
        _mm512_mask_storeu_ps(o, km, r);
        return;
    }
    const long nb = mm->cols / 32, kc = LLB_KCHUNK / 32;
    __m512i pan[(LLB_KCHUNK / 32) * PANEL32];
    for (long b0 = 0; b0 < nb; b0 += kc) { /* K in chunks: the group's chunk stays in L1 across tiles */
        const long b1 = b0 + kc < nb ? b0 + kc : nb;
        /* every decoded type (Q8_0's codes are its bytes): the tiles read the panel rather than each
         * decoding the chunk, 3-12% less CPU time on AVX-512, even Q4_0 with two operations a vector.
         * Among the fast 32-block types this runs, qt != LLB_Q8_0 is PANEL32_TYPE(qt) (below) */
        const int panel = i1 - i0 > LLB_XT && qt != LLB_Q8_0;
        if (panel) fill_panel32(qt, wg, b0, b1, pan);
        long i = i0;
        for (; i + TILE_ROWS <= i1; i += TILE_ROWS) TILE32(i, TILE_ROWS);
        LLB_TILE_LADDER(i, i1, LLB_XT, TILE32);
    }
}

/* A pair unit (mm->wg2: the panel types take pairs) of more than one tile fills both groups' panels and
 * runs pair tiles (2-5% less CPU time than 16-row tiles of each group); otherwise each group alone. */
LLB_AI TGT void fast32(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt, const int split) {
    if (!mm->wg2 || i1 - i0 <= LLB_XT) {
        fast32_one(mm, wg, g, i0, i1, qt);
        if (mm->wg2) fast32_one(mm, mm->wg2, g + 1, i0, i1, qt);
        return;
    }
    const __mmask16 km = (__mmask16)((1u << llb_group_rows(mm, g)) - 1), km2 = (__mmask16)((1u << llb_group_rows(mm, g + 1)) - 1);
    float *o = mm->out + g * LLB_IL;
    const long nb = mm->cols / 32, kc = LLB_KCHUNK / 32;
    __attribute__((aligned(64))) __m512i pan[2][(LLB_KCHUNK / 32) * PANEL32];
    const __m512i *const pans[2] = {pan[0], pan[1]};
    split_pf pf = {{NULL, NULL}, 0, 0, (i1 - i0 + SPLIT_ROWS - 1) / SPLIT_ROWS + 1};
    for (long b0 = 0; b0 < nb; b0 += kc) {
        const long b1 = b0 + kc < nb ? b0 + kc : nb;
        fill_panel32(qt, wg, b0, b1, pan[0]);
        fill_panel32(qt, mm->wg2, b0, b1, pan[1]);
        if (split) {
            split_next(mm, wg, b1, nb, qt, &pf);
            LLB_TILE_LADDER(i0, i1, SPLIT_ROWS, TILE32X2S);
        } else {
            LLB_TILE_LADDER(i0, i1, LLB_XT, TILE32X2);
        }
    }
}
#undef TILE32X2
#undef TILE32X2S
#undef TILE32

/* Each type twice: the folded-broadcast tiles (Intel; 8-row pair tiles) and the split ones (avx512_split.h),
 * picked once per kernel lookup by the names table.inc reads (below), not per call. */
#define FAST32(name, qt)                                                                                            \
    TGT static void name##_fold(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, qt, 0); } \
    TGT static void name##_split(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, qt, 1); }
FAST32(fast_q4_0, LLB_Q4_0)
FAST32(fast_q4_1, LLB_Q4_1)
FAST32(fast_q5_0, LLB_Q5_0)
FAST32(fast_q5_1, LLB_Q5_1)
FAST32(fast_iq4_nl, LLB_IQ4_NL)
FAST32(fast_mxfp4, LLB_MXFP4)
#undef FAST32
/* Q8_0 takes no pairs (no panel): one form. */
TGT static void fast_q8_0(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) { fast32(mm, wg, g, i0, i1, LLB_Q8_0, 0); }
/* table.inc's names: the form llb_isa_split_broadcast() asks for. */
#define fast_q4_0 (llb_isa_split_broadcast() ? fast_q4_0_split : fast_q4_0_fold)
#define fast_q4_1 (llb_isa_split_broadcast() ? fast_q4_1_split : fast_q4_1_fold)
#define fast_q5_0 (llb_isa_split_broadcast() ? fast_q5_0_split : fast_q5_0_fold)
#define fast_q5_1 (llb_isa_split_broadcast() ? fast_q5_1_split : fast_q5_1_fold)
#define fast_iq4_nl (llb_isa_split_broadcast() ? fast_iq4_nl_split : fast_iq4_nl_fold)
#define fast_mxfp4 (llb_isa_split_broadcast() ? fast_mxfp4_split : fast_mxfp4_fold)

/* ---- exact kernels: dequantize a 16x32 chunk to FP32, then FMA ------------
 * The chunk T is stored as [quad t][row r][j] (64 floats per quad), so one
 * zmm of T holds 4 rows x 4 consecutive values and multiplies a broadcast of 4
 * activations; lane 4r+j of the accumulators sums row r. */

/* Scales per row (lane r) -> per T lane (rows 4k..4k+3, each 4 times). */
LLB_AI TGT __m512 spread_rows(__m512 v, int k) {
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(4 * k),
                                         _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
    return _mm512_permutexvar_ps(idx, v);
}

/* Codes of quads 0..3 scale with (dw0, mw0), of quads 4..7 with (dw1, mw1): T = dw * code + mw. */
LLB_AI TGT void codes_to_T(const __m512i q[8], __m512 dw0, __m512 mw0, __m512 dw1, __m512 mw1, float *T) {
    __attribute__((aligned(64))) uint8_t U[8 * 64];
    LLB_UNROLL
    for (int t = 0; t < 8; t++) _mm512_store_si512(U + 64 * t, q[t]);
    LLB_UNROLL
    for (int k = 0; k < 4; k++) {
        const __m512 d0 = spread_rows(dw0, k), m0 = spread_rows(mw0, k), d1 = spread_rows(dw1, k), m1 = spread_rows(mw1, k);
        LLB_UNROLL
        for (int t = 0; t < 8; t++) {
            const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(U + 64 * t + 16 * k))));
            _mm512_store_ps(T + 64 * t + 16 * k, _mm512_fmadd_ps(c, t < 4 ? d0 : d1, t < 4 ? m0 : m1));
        }
    }
}

/* The dequantized chunk c (32 values of 16 rows) of a packed group. */
LLB_AI TGT void chunk_T(const int qt, const uint8_t *wg, long c, float *T) {
    __m512i q[8];
    if (qt == LLB_Q4_K || qt == LLB_Q5_K) {
        const uint8_t *gb = wg + (c >> 3) * LLB_GB_BYTES(qt);
        const int s = (int)(c & 7);
        dec_k4_sub(qt, gb, s, q);
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(gb + 64 + 16 * s))));
        const __m512i mn16 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gb + 192 + 32 * (s >> 1))));
        const __m512 mn = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(mn16, 8 * (s & 1)), _mm512_set1_epi32(0xFF)));
        const __m512 dw = _mm512_mul_ps(load_f16x16(gb), sc), mw = _mm512_mul_ps(load_f16x16(gb + 32), _mm512_sub_ps(_mm512_setzero_ps(), mn));
        codes_to_T(q, dw, mw, dw, mw, T);
    } else if (qt == LLB_IQ4_XS) { /* codes are grid + 128 */
        const uint8_t *gb = wg + (c >> 3) * LLB_GB_IQ4_XS;
        const int s = (int)(c & 7);
        dec_k4_sub(qt, gb, s, q);
        const __m512 dw = _mm512_mul_ps(load_f16x16(gb), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * s)))));
        const __m512 mw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
        codes_to_T(q, dw, mw, dw, mw, T);
    } else if (qt == LLB_Q6_K) {
        const uint8_t *gb = wg + (c >> 3) * LLB_GB_Q6_K;
        const int u = 2 * (int)(c & 7);
        dec_q6k_sub(gb + LLB_Q6_K_SUBS + 192 * u, q);
        dec_q6k_sub(gb + LLB_Q6_K_SUBS + 192 * (u + 1), q + 4);
        const __m512 d = load_f16x16(gb), m32 = _mm512_set1_ps(-32.0f);
        const __m512 dw0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * u)))));
        const __m512 dw1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + 48 + 16 * u)))));
        codes_to_T(q, dw0, _mm512_mul_ps(dw0, m32), dw1, _mm512_mul_ps(dw1, m32), T);
    } else if (qt == LLB_Q3_K || qt == LLB_Q2_K) { /* sub-blocks 2s, 2s+1 */
        const uint8_t *gb = wg + (c >> 3) * LLB_GB_BYTES(qt);
        const int u = 2 * (int)(c & 7);
        dec_k16_sub(qt, gb, u, q);
        dec_k16_sub(qt, gb, u + 1, q + 4);
        const __m512 d = load_f16x16(gb);
        __m512 dw[2], mw[2];
        for (int k = 0; k < 2; k++) {
            if (qt == LLB_Q3_K) {
                dw[k] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * (u + k))))));
                mw[k] = _mm512_mul_ps(dw[k], _mm512_set1_ps(-4.0f));
            } else {
                const __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(gb + 64 + 16 * (u + k))));
                dw[k] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15))));
                mw[k] = _mm512_mul_ps(load_f16x16(gb + 32), _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_srli_epi32(sm, 4))));
            }
        }
        codes_to_T(q, dw[0], mw[0], dw[1], mw[1], T);
    } else {
        const uint8_t *gb = wg + c * LLB_GB_BYTES(qt);
        dec_block32(qt, gb, q);
        const __m512 d = block_scale16(qt, gb);
        const __m512 mw = LLB_HAS_MIN32(qt) ? load_f16x16(gb + 32) : _mm512_mul_ps(d, _mm512_set1_ps((float)-LLB_CODE_OFF32(qt)));
        codes_to_T(q, d, mw, d, mw, T);
    }
}

/* F32/F16/BF16 rows (file layout): 32 values of row r (fewer at the matrix's end) into T. */
LLB_AI TGT void float_chunk_T(const int qt, const llb_mm *mm, const uint8_t *wg, int nr, long c, float *T) {
    const long left = mm->cols - 32 * c;
    const __mmask16 k0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 k1 = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = wg + r * mm->row_bytes;
        __m512 v0, v1;
        if (qt == LLB_F32) {
            v0 = _mm512_maskz_loadu_ps(k0, (const float *)row + 32 * c);
            v1 = _mm512_maskz_loadu_ps(k1, (const float *)row + 32 * c + 16);
        } else {
            const __m256i h0 = _mm256_maskz_loadu_epi16(k0, row + 64 * c), h1 = _mm256_maskz_loadu_epi16(k1, row + 64 * c + 32);
            if (qt == LLB_F16) {
                v0 = _mm512_cvtph_ps(h0);
                v1 = _mm512_cvtph_ps(h1);
            } else {
                v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
                v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
            }
        }
        float *tr = T + 4 * r;
        _mm_store_ps(tr + 0 * 64, _mm512_extractf32x4_ps(v0, 0));
        _mm_store_ps(tr + 1 * 64, _mm512_extractf32x4_ps(v0, 1));
        _mm_store_ps(tr + 2 * 64, _mm512_extractf32x4_ps(v0, 2));
        _mm_store_ps(tr + 3 * 64, _mm512_extractf32x4_ps(v0, 3));
        _mm_store_ps(tr + 4 * 64, _mm512_extractf32x4_ps(v1, 0));
        _mm_store_ps(tr + 5 * 64, _mm512_extractf32x4_ps(v1, 1));
        _mm_store_ps(tr + 6 * 64, _mm512_extractf32x4_ps(v1, 2));
        _mm_store_ps(tr + 7 * 64, _mm512_extractf32x4_ps(v1, 3));
    }
}

LLB_AI TGT void exact_kernel(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1, const int qt) {
    const long K = mm->cols, nch = (K + 31) / 32;
    const int nr = llb_group_rows(mm, g), is_float = qt == LLB_F32 || qt == LLB_F16 || qt == LLB_BF16;
    __attribute__((aligned(64))) float T[8 * 64], acc[LLB_ICHUNK][64], xpad[32];
    if (is_float && nr < LLB_IL) memset(T, 0, sizeof T); /* rows past the end stay zero */
    memset(acc, 0, sizeof(float) * 64 * (size_t)(i1 - i0));
    for (long c = 0; c < nch; c++) {
        if (is_float) float_chunk_T(qt, mm, wg, nr, c, T);
        else chunk_T(qt, wg, c, T);
        const int tail = 32 * c + 32 > K;
        for (long i = i0; i < i1; i++) {
            const float *x = mm->x + i * K + 32 * c;
            if (tail) { /* zero-pad the activations too: 0 * garbage could be NaN */
                memset(xpad, 0, sizeof xpad);
                memcpy(xpad, x, sizeof(float) * (size_t)(K - 32 * c));
                x = xpad;
            }
            float *a = acc[i - i0];
            __m512 a0 = _mm512_load_ps(a), a1 = _mm512_load_ps(a + 16), a2 = _mm512_load_ps(a + 32), a3 = _mm512_load_ps(a + 48);
            LLB_UNROLL
            for (int t = 0; t < 8; t++) {
                const __m512 xb = _mm512_broadcast_f32x4(_mm_loadu_ps(x + 4 * t));
                a0 = _mm512_fmadd_ps(_mm512_load_ps(T + 64 * t), xb, a0);
                a1 = _mm512_fmadd_ps(_mm512_load_ps(T + 64 * t + 16), xb, a1);
                a2 = _mm512_fmadd_ps(_mm512_load_ps(T + 64 * t + 32), xb, a2);
                a3 = _mm512_fmadd_ps(_mm512_load_ps(T + 64 * t + 48), xb, a3);
            }
            _mm512_store_ps(a, a0);
            _mm512_store_ps(a + 16, a1);
            _mm512_store_ps(a + 32, a2);
            _mm512_store_ps(a + 48, a3);
        }
    }
    for (long i = i0; i < i1; i++) llb_store_quad_sums(acc[i - i0], mm->out + i * mm->rows + g * LLB_IL, nr);
}

/* 16 float-type weights of a row (fewer, zero-filled, at the row's end) as FP32. */
LLB_AI TGT __m512 load_row16(const int qt, const uint8_t *row, long k, __mmask16 km) {
    if (qt == LLB_F32) return _mm512_maskz_loadu_ps(km, (const float *)row + k);
    const __m256i h = _mm256_maskz_loadu_epi16(km, row + 2 * k);
    return qt == LLB_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* n == 1 for F32/F16/BF16: row-by-row dot products (4 rows share each activation load); rounds
 * differently from exact_kernel. */
LLB_AI TGT void float_gemv(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const int nr = llb_group_rows(mm, g);
    const long K = mm->cols;
    float *o = mm->out + g * LLB_IL;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        const int rn = nr - r0 < 4 ? nr - r0 : 4;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (long k = 0; k < K; k += 16) {
            const __mmask16 km = K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
            const __m512 x = _mm512_maskz_loadu_ps(km, mm->x + k);
            LLB_UNROLL
            for (int r = 0; r < 4; r++)
                if (r < rn) {
                    const uint8_t *row = wg + (size_t)(r0 + r) * mm->row_bytes;
                    _mm_prefetch((const char *)row + (qt == LLB_F32 ? 4 : 2) * k + LLB_PF_DIST / 4, _MM_HINT_T0);
                    acc[r] = _mm512_fmadd_ps(load_row16(qt, row, k, km), x, acc[r]);
                }
        }
        for (int r = 0; r < rn; r++) o[r0 + r] = llb_hsum16(acc[r]);
    }
}

/* n == 1 for F32/F16/BF16 in exact_kernel's order, so a single row equals that row of a batch
 * bit for bit: per row, 4 chains over the values k = j (mod 4) in order, then (c0 + c1) + (c2 + c3).
 * A zmm holds 4 rows x 4 consecutive values (exact_kernel's lanes); 16 values of 4 rows are loaded
 * per step and transposed by 128-bit quads, and the group's 4 row quartets are 4 independent
 * chains. Past K, loads are masked to 0 (0 x 0 adds nothing). Measured 1.1-1.3x the time of
 * float_gemv, 0.6-0.8x that of exact_kernel at n == 1. */
LLB_AI TGT void float_gemv_ordered(const llb_mm *mm, const uint8_t *wg, long g, const int qt) {
    const int nr = llb_group_rows(mm, g);
    const long K = mm->cols;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (long k = 0; k < K; k += 16) {
        const __mmask16 km = K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
        const float *xk = mm->x + k;
        __m512 xq[4]; /* quad q of x in all four 128-bit lanes */
        if (km == 0xFFFF) {
            LLB_UNROLL
            for (int q = 0; q < 4; q++) xq[q] = _mm512_broadcast_f32x4(_mm_loadu_ps(xk + 4 * q));
        } else {
            const __m512 xv = _mm512_maskz_loadu_ps(km, xk);
            LLB_UNROLL
            for (int q = 0; q < 4; q++) xq[q] = _mm512_shuffle_f32x4(xv, xv, 0x55 * q);
        }
        LLB_UNROLL
        for (int b = 0; b < 4; b++) { /* rows 4b..4b+3 */
            if (4 * b >= nr) break;
            __m512 R[4];
            LLB_UNROLL
            for (int r = 0; r < 4; r++) {
                if (4 * b + r < nr) {
                    const uint8_t *row = wg + (size_t)(4 * b + r) * mm->row_bytes;
                    _mm_prefetch((const char *)row + (qt == LLB_F32 ? 4 : 2) * k + LLB_PF_DIST / 4, _MM_HINT_T0);
                    R[r] = load_row16(qt, row, k, km);
                } else {
                    R[r] = _mm512_setzero_ps();
                }
            }
            const __m512 u0 = _mm512_shuffle_f32x4(R[0], R[1], 0x44), u1 = _mm512_shuffle_f32x4(R[0], R[1], 0xEE);
            const __m512 u2 = _mm512_shuffle_f32x4(R[2], R[3], 0x44), u3 = _mm512_shuffle_f32x4(R[2], R[3], 0xEE);
            acc[b] = _mm512_fmadd_ps(_mm512_shuffle_f32x4(u0, u2, 0x88), xq[0], acc[b]); /* quad 0 of the 4 rows */
            acc[b] = _mm512_fmadd_ps(_mm512_shuffle_f32x4(u0, u2, 0xDD), xq[1], acc[b]);
            acc[b] = _mm512_fmadd_ps(_mm512_shuffle_f32x4(u1, u3, 0x88), xq[2], acc[b]);
            acc[b] = _mm512_fmadd_ps(_mm512_shuffle_f32x4(u1, u3, 0xDD), xq[3], acc[b]);
        }
    }
    __attribute__((aligned(64))) float a[64];
    LLB_UNROLL
    for (int b = 0; b < 4; b++) _mm512_store_ps(a + 16 * b, acc[b]);
    llb_store_quad_sums(a, mm->out + g * LLB_IL, nr);
}

#define LLB_RB_VNNI
#define LLB_PAIRS(qt, exact) (!(exact) && (PANEL32_TYPE(qt) || llb_avx512_kquant_pairs(qt)))
#define LLB_KQUANT_FAST llb_avx512_kquant_kernel
/* The 32-block types with a panel (every fast one but Q8_0, as fast32_one decides): they take pairs of groups. */
#define PANEL32_TYPE(qt)                                                                                           \
    ((qt) == LLB_Q4_0 || (qt) == LLB_Q4_1 || (qt) == LLB_Q5_0 || (qt) == LLB_Q5_1 || (qt) == LLB_IQ4_NL || \
     (qt) == LLB_MXFP4)
/* Their units of 128 rows: a group's panel (per K chunk) filled once for twice the tiles. */
static long unit_rows(int qtype, int exact, long cols) {
    if (!exact && PANEL32_TYPE(qtype)) return LLB_UNIT_ROWS_MAX;
    return llb_avx512_kquant_unit_rows(qtype, exact, cols);
}
#define LLB_UNIT_ROWS unit_rows
#define LLB_KERNELS_NAME llb_kernels_avx512
#include "matmul/kernels/table.inc"
#endif

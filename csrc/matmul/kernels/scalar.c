/* Portable C kernels: the reference for the SIMD paths and the path on
 * non-x86 CPUs. They read the same packed layout through the scalar decoder
 * in quants/quants.c and follow the same arithmetic (integer dot products per block in
 * fast mode, FP32 dequantized weights in exact mode), without caring for speed. */
#include <math.h>

#include "matmul/kernels/kernels.h"

/* ---- activation quantization ------------------------------------------- */

/* One 32-value block: codes round(x * 127 / amax) to qs, their sums over each 16 values to
 * half; returns the block's absmax (its scale is amax / 127). */
static float quant_block32(const float *xb, int8_t *qs, int32_t half[2]) {
    float amax = 0.0f;
    for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(xb[e]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    half[0] = half[1] = 0;
    for (int e = 0; e < 32; e++) {
        const int q = (int)lrintf(xb[e] * id);
        qs[e] = (int8_t)q;
        half[e >> 4] += q;
    }
    return amax;
}

static void quant32(const float *x, long cols, long xt, int offset, int8_t *qs, float *d, int32_t *bias, float *sum,
                    int8_t *qs2, float *d2, int32_t *bias2) {
    double ss = 0.0;
    for (long k = 0; k < cols; k++) ss += (double)x[k] * x[k];
    const double t2 = LLB_OUTLIER * LLB_OUTLIER * ss / (double)cols; /* see LLB_OUTLIER (kernels.h) */
    for (long b = 0; b < cols / LLB_QK; b++) {
        int32_t half[2];
        const float *xb = x + b * LLB_QK;
        int8_t *qb = qs + b * xt * LLB_QK;
        const float amax = quant_block32(xb, qb, half), db = amax / 127.0f;
        const int32_t isum = half[0] + half[1];
        d[b * xt] = db;
        bias[b * xt] = -offset * isum;
        /* Q4_1's min term m * sum(x) uses the sum of the *quantized* activations: the
         * error is then sum((d*q + m) * dx), weights centred around 0, instead of
         * sum(d*q * dx) with q in 0..15 all positive, whose rounding errors do not
         * cancel (measured: 2-4x larger matmul error, +2.3% perplexity on SmolLM2). */
        float s = db * (float)isum, dr = 0.0f;
        if ((double)amax * amax > t2) { /* an outlier block: its residual too */
            float r[LLB_QK];
            for (int e = 0; e < LLB_QK; e++) r[e] = fmaf(-db, (float)qb[e], xb[e]);
            const float a2 = quant_block32(r, qs2 + b * xt * LLB_QK, half);
            dr = a2 / 127.0f;
            bias2[b * xt] = -offset * (half[0] + half[1]);
            s += dr * (float)(half[0] + half[1]);
        }
        d2[b * xt] = dr;
        sum[b * xt] = s;
    }
}

/* 256-blocks (K-quants): the codes of 256 values together, as the weights group them, but one
 * scale per 32 values as in quant32; Q6_K's zero point wants -32 * sum(q) per 16 values. */
static void quant256(const float *x, long cols, long xt, int8_t *qs, float *d, float *sum, int32_t *bs16n) {
    for (long b = 0; b < cols / LLB_QKK; b++) {
        for (int s = 0; s < 8; s++) {
            int32_t half[2];
            const float amax = quant_block32(x + b * LLB_QKK + 32 * s, qs + b * xt * LLB_QKK + 32 * s, half);
            d[b * xt * 8 + s] = amax / 127.0f;
            sum[b * xt * 8 + s] = (amax / 127.0f) * (float)(half[0] + half[1]); /* Q4_K's min term, see quant32 */
            bs16n[b * xt * 16 + 2 * s] = -32 * half[0];
            bs16n[b * xt * 16 + 2 * s + 1] = -32 * half[1];
        }
    }
}

static int act_offset(int qtype) { return 0; } /* the scalar decoder yields signed values */

/* ---- quantized weights ------------------------------------------------- */

static void store_group(const llb_mm *mm, long g, long i0, long i1, float acc[][LLB_IL]) {
    const int nr = llb_group_rows(mm, g);
    for (long i = i0; i < i1; i++)
        for (int r = 0; r < nr; r++) mm->out[i * mm->rows + g * LLB_IL + r] = acc[i - i0][r];
}

static void fast_quant(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) {
    const llb_type_info *t = mm->t;
    const int kquant = t->block == LLB_QKK;
    const long K = mm->cols, nb32 = K / 32, nsb = K / LLB_QKK;
    float tot[LLB_ICHUNK][LLB_IL] = {{0}};
    int16_t q[LLB_IL][32];
    float dw[LLB_IL][2], mw[LLB_IL][2];
    for (long c = 0; c < nb32; c++) {
        llb_packed_chunk_decode(t, wg, c, q, dw, mw);
        for (long i = i0; i < i1; i++) {
            /* this chunk's activation scale and sum: its block's, or its super-block's c % 8-th */
            const size_t at = kquant ? llb_act_at(i, c / 8, nsb, mm->a.xt) : llb_act_at(i, c, nb32, mm->a.xt);
            const size_t ad = kquant ? 8 * at + c % 8 : at;
            const int8_t *xq = kquant ? mm->a.qs + 256 * at + 32 * (c % 8) : mm->a.qs + 32 * at;
            const float dx = mm->a.d[ad];
            float *tr = tot[i - i0];
            for (int r = 0; r < LLB_IL; r++) {
                int32_t s0 = 0, s1 = 0;
                for (int e = 0; e < 16; e++) {
                    s0 += q[r][e] * xq[e];
                    s1 += q[r][e + 16] * xq[e + 16];
                }
                if (t->sub16) { /* two 16-value sub-blocks; a min multiplies each half's code sum */
                    const int32_t *bs = mm->a.bs16n + 16 * at + 2 * (c % 8); /* -32 * sum(q) per 16 */
                    tr[r] += (dw[r][0] * (float)s0 + dw[r][1] * (float)s1) * dx +
                             (mw[r][0] * (float)(bs[0] / -32) + mw[r][1] * (float)(bs[1] / -32)) * dx;
                } else { /* one scale and min per 32 values; the min multiplies the quantized sum */
                    tr[r] += (dw[r][0] * (float)(s0 + s1)) * dx + mw[r][0] * mm->a.sum[ad];
                    if (!kquant && mm->a.d2[ad] != 0.0f) { /* an outlier block's residual (LLB_OUTLIER) */
                        const int8_t *xr = mm->a.qs2 + 32 * at;
                        int32_t s2 = 0;
                        for (int e = 0; e < 32; e++) s2 += q[r][e] * xr[e];
                        tr[r] += (dw[r][0] * (float)s2) * mm->a.d2[ad];
                    }
                }
            }
        }
    }
    store_group(mm, g, i0, i1, tot);
}

static void exact_quant(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) {
    const long K = mm->cols;
    float acc[LLB_ICHUNK][LLB_IL] = {{0}}, w[LLB_IL][32];
    int16_t q[LLB_IL][32];
    float dw[LLB_IL][2], mw[LLB_IL][2];
    for (long c = 0; c < K / 32; c++) {
        llb_packed_chunk_decode(mm->t, wg, c, q, dw, mw);
        for (int r = 0; r < LLB_IL; r++)
            for (int e = 0; e < 32; e++) w[r][e] = dw[r][e >> 4] * (float)q[r][e] + mw[r][e >> 4];
        for (long i = i0; i < i1; i++) {
            const float *x = mm->x + i * K + 32 * c;
            for (int r = 0; r < LLB_IL; r++) {
                float s = 0.0f;
                for (int e = 0; e < 32; e++) s += w[r][e] * x[e];
                acc[i - i0][r] += s;
            }
        }
    }
    store_group(mm, g, i0, i1, acc);
}

/* ---- F32 / F16 / BF16 (file layout) ------------------------------------ */

static float float_weight(int qtype, const uint8_t *row, long k) {
    if (qtype == LLB_F32) {
        float v;
        memcpy(&v, row + 4 * k, 4);
        return v;
    }
    const uint16_t h = llb_rd16(row + 2 * k);
    return qtype == LLB_F16 ? llb_f16_to_f32(h) : llb_bf16_to_f32(h);
}

static void float_rows(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1) {
    const int nr = llb_group_rows(mm, g), qt = mm->t->qtype;
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = wg + (size_t)r * mm->row_bytes;
        for (long i = i0; i < i1; i++) {
            const float *x = mm->x + i * mm->cols;
            float s = 0.0f;
            for (long k = 0; k < mm->cols; k++) s += float_weight(qt, row, k) * x[k];
            mm->out[i * mm->rows + g * LLB_IL + r] = s;
        }
    }
}

/* Every type in the table: the float types by rows, the quantized ones through their decoders. */
static llb_kernel_fn kernel(int qtype, int exact) {
    const llb_type_info *t = llb_type_get(qtype);
    if (!t) return NULL;
    if (t->block == 1) return float_rows;
    return exact ? exact_quant : fast_quant;
}

const llb_kernels llb_kernels_scalar = {kernel, act_offset, quant32, quant256, NULL};

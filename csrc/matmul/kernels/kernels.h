/* Interface between the matmul driver (matmul/matmul.c) and the per-ISA kernels
 * (matmul/kernels/: scalar.c, avx2.c, avx512.c and their _kquants.c). Internal to the C core.
 *
 * A kernel computes one 16-row group for a range of activation rows:
 *   out[i][16g + r] = sum_k x[i][k] * W[16g + r][k],  i in [i0, i1), r < min(16, rows - 16g)
 * and, where the table says it takes pairs (llb_kernels.pairs) and mm->wg2 is set, group g + 1 too
 * (its data at mm->wg2), every output through the same operations as alone.
 * `wg` is the group's packed data (quantized types; matmul.c repacks file-layout
 * groups on the fly) or, for F32/F16/BF16, the group's first row in the file layout.
 * For a given (n, type, ISA) the arithmetic done for one output element does not
 * depend on i0/i1 or the thread split, so results are identical for any thread count. */
#ifndef LLB_KERNELS_H
#define LLB_KERNELS_H
#include "core/isa.h"
#include "core/state.h"
#include "quants/quants.h"

#define LLB_ICHUNK 64 /* activation rows per work unit (a multiple of every kernel's tile) */
/* The most rows a table's unit_rows gives (a multiple of LLB_ICHUNK): kernels sized for it take them. */
#define LLB_UNIT_ROWS_MAX 128

/* Activations quantized to 8 bits (fast mode), interleaved in tiles of xt rows
 * (LLB_XT, or n when n is smaller, so a GEMV's are contiguous) so that a GEMM
 * tile reaches all its rows from one pointer: for tile i / xt and block b, the
 * xt rows' blocks follow each other (see llb_act_at).
 * 32-blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4): qs, d, bias, sum; 256-blocks (Q4_K/Q5_K/Q6_K/IQ4_XS): qs, then per
 * 32-value sub-block d and sum (8 of each), and bs16n. The 256-block only groups the codes the way
 * the K-quant weights do: every 32 values have their own scale, so that one outlier coarsens the
 * rounding of its 32 neighbours, not of 256 (measured on Gemma-3-270M, top-20 logits vs an FP32
 * reference: up to 0.64 off with one scale per 256, 0.35 with one per 32). */
#define LLB_XT 8

/* A 32-block whose absmax exceeds LLB_OUTLIER times its row's RMS also carries a second int8 code of
 * its rounding residual, r = x - d * q (one fused multiply-add), with its own scale: x ~= d * q + d2 * q2,
 * and the kernels add d2 * (w . q2) for those blocks only (d2 = 0 marks the others; their q2 are not
 * written). One outlier makes d large for its 31 neighbours: this is where the fast mode's worst errors
 * came from (SmolLM2 Q8_0, worst top-20 logit error 1.78 with one code per value, llama.cpp 1.42). The
 * test is amax^2 * cols > LLB_OUTLIER^2 * sum(x^2) over the row, in double. The K-quants' 256-blocks
 * (quant256) have no residual.
 * Why 5 (docs/BENCHMARKS.md, 2026-12-05): each flagged block costs a second integer dot; at 4 those were
 * 15-18% of a 32-block prefill GEMM (13% of the 0.5B's blocks; 7% at 5), and 5 takes ~5-7% off a prefill. On
 * SmolLM2 and Qwen2.5-0.5B (24 prompts, every 32-block type) 5 keeps the mean error at 0.4-0.65 of llama.cpp's
 * and the worst at most 0.92 of it (4: up to 1.05); 6 let single positions' worst pass llama.cpp's. Gemma-3-270M's
 * worst is erratic at any threshold (past llama.cpp's on one file at 4, another at 5). A threshold on a block's
 * own rounding error flags the same blocks. */
#ifndef LLB_OUTLIER /* a measurement build may set it (_native.outlier_threshold() tells the tests) */
#define LLB_OUTLIER 5
#endif

/* Index of activation row i's block b among the per-block entries (nblk blocks per row);
 * its codes start at qs + blk * llb_act_at(...); a 256-block's 8 d and sum (16 bs16n) at 8 (16) times it. */
static inline size_t llb_act_at(long i, long b, long nblk, long xt) {
    return ((size_t)(i / xt) * (size_t)nblk + (size_t)b) * (size_t)xt + (size_t)(i % xt);
}

typedef struct {
    const int8_t *qs;     /* codes in [-127, 127]; x ~= d * q */
    const float *d;       /* one scale per 32 values (per block, or 8 per 256-block) */
    /* 32-blocks: -offset * sum(q), the weight type's zero point folded in; the AVX2 table's the int16 pair
     * whose words add up to it (-offset x the block's values 0,1 of every quad; 2,3: avx2.c's zero_words) */
    const int32_t *bias;
    const float *sum;     /* d * sum(q) per 32 values, the quantized sum (Q4_1's and Q4_K's min term) */
    const int32_t *bs16n; /* 256-blocks: -32 * sum(q) over each 16 values (Q6_K's zero point) */
    const int8_t *qs2;    /* 32-blocks: residual codes (at qs's place), where d2 != 0 */
    const float *d2;      /* 32-blocks: residual scale per block, 0 for a block without a residual */
    const int32_t *bias2; /* 32-blocks: -offset * sum(q2), as bias */
    /* 256-blocks, where the table fills it (llb_kernels.words16; Q6_K's kernel reads it): per 16 values the int16 pair
     * [-32 * sum of values 0,1,4,5,8,9,12,13; -32 * sum of 2,3,6,7,10,11,14,15] (a quad dot's two words) */
    const int32_t *w16;
    long xt;              /* rows per tile */
} llb_act;

typedef struct llb_mm {
    const llb_type_info *t;
    long rows, cols, n;
    const float *x; /* n x cols */
    float *out;     /* n x rows */
    size_t row_bytes; /* file-layout row stride (F32/F16/BF16) */
    llb_act a;
    const uint8_t *wg2; /* a pair's second group (g + 1), or NULL: the kernel does group g only */
    int far;            /* a GEMV streams as LLB_FAR_STREAM_OF(type) (llb_isa_far_stream: common.h), else as LLB_STREAM */
} llb_mm;

typedef void (*llb_kernel_fn)(const llb_mm *mm, const uint8_t *wg, long g, long i0, long i1);

typedef struct {
    /* Kernel for a type: exact = FP32 activations; else quantized activations
     * (float types have one kernel for both). NULL if the type is unknown. */
    llb_kernel_fn (*kernel)(int qtype, int exact);
    /* Zero point the 32-block kernels want folded into llb_act.bias (their unsigned code offset). A
     * type whose offset is 0 never reads the bias: matmul_many shares one quantization between it
     * and a type with another offset. */
    int (*act_offset)(int qtype);
    /* Quantize one activation row: 32-blocks (bias = -offset * sum q as llb_act says, the outlier blocks' residual in
     * qs2, d2, bias2; sum = d * sum(q) + d2 * sum(q2)) or 256-blocks (still one
     * scale per 32 values: d, sum hold 8 entries per 256-block, bs16n 16). The outputs
     * point at the row's first block; consecutive blocks are xt entries apart (tile layout). */
    void (*quant32)(const float *x, long cols, long xt, int offset, int8_t *qs, float *d, int32_t *bias, float *sum,
                    int8_t *qs2, float *d2, int32_t *bias2);
    void (*quant256)(const float *x, long cols, long xt, int8_t *qs, float *d, float *sum, int32_t *bs16n);
    /* Whether kernel(qtype, exact) also computes a pair of groups (mm->wg2); NULL: no kernel does. */
    int (*pairs)(int qtype, int exact);
    /* NULL, or fills llb_act.w16 of one row quantized by quant256 (its blocks xt apart, as quant256's
     * outputs) for Q6_K's kernel; the driver calls it after every quant256. */
    void (*words16)(const int8_t *qs, long cols, long xt, int32_t *w16);
    /* NULL, or the activation rows per GEMM work unit kernel(qtype, exact) takes at depth cols (LLB_ICHUNK
     * up to LLB_UNIT_ROWS_MAX): more for a kernel that decodes each group once per unit into a panel. */
    long (*unit_rows)(int qtype, int exact, long cols);
} llb_kernels;

extern const llb_kernels llb_kernels_scalar;
#if LLB_X86
extern const llb_kernels llb_kernels_avx2;
extern const llb_kernels llb_kernels_avx512;
/* The K-quant kernels live in their own files (matmul/kernels/avx2_kquants.c, avx512_kquants.c). */
llb_kernel_fn llb_avx2_kquant_kernel(int qtype);
llb_kernel_fn llb_avx512_kquant_kernel(int qtype);
/* whether the ISA's K-quant kernel takes pairs of groups (mm->wg2) */
int llb_avx512_kquant_pairs(int qtype);
int llb_avx2_kquant_pairs(int qtype);
long llb_avx512_kquant_unit_rows(int qtype, int exact, long cols); /* llb_kernels.unit_rows */
#endif

/* Rows of group g that exist (16 except in a last, partial group). */
static inline int llb_group_rows(const llb_mm *mm, long g) {
    const long left = mm->rows - g * LLB_IL;
    return left < LLB_IL ? (int)left : LLB_IL;
}

/* With llb_batch_invariant set (core/state.h) a row's result must not depend on how many rows
 * share the call. The n == 1 kernels of the quantized types sum in exactly their GEMM's order, so they run in
 * both modes (LLB_GEMV). The float types' fastest GEMVs round differently from their GEMM and
 * run only with the flag off (LLB_GEMV_ANY_ORDER); with it on, n == 1 takes a GEMV in the
 * GEMM's order. */
#define LLB_GEMV(mm) ((mm)->n == 1)
#define LLB_GEMV_ANY_ORDER(mm) ((mm)->n == 1 && !llb_batch_invariant)

#endif

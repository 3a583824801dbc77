/* Dense float matrices for encoders (BERT): out[n, rows] = x[n, cols] @ W[rows, cols]^T + bias,
 * with W packed once into panels of LLB_DENSE_NR output columns, so a register tile of
 * activation rows x one panel runs from one contiguous stream of weights. Two formats:
 *   LLB_DENSE_F32   exact: a panel is [cols][NR] floats;
 *   LLB_DENSE_BF16  fast: a panel is [cols/2][NR][2] bfloat16 (cols rounded up to even) and the
 *                   activations are rounded to bfloat16 (nearest even) once per call; each output
 *                   sums, per pair of columns k, acc = (acc + x[k+1] w[k+1]) + x[k] w[k] in float32
 *                   (AVX512-BF16's VDPBF16PS order: products of bfloat16 are exact in float32), so
 *                   every ISA path rounds alike.
 * Each output element is computed by the same sequence of operations whatever the number of rows,
 * the row's place in the batch or the thread split: a row's result never depends on its batch.
 * python/py_encoder.c validates every argument first: these functions trust them. */
#ifndef LLB_DENSE_H
#define LLB_DENSE_H
#include <stddef.h>
#include <stdint.h>

enum llb_dense_fmt { LLB_DENSE_F32 = 0, LLB_DENSE_BF16 = 1 };
#define LLB_DENSE_NR 32 /* output columns per panel */

/* Bytes of W (rows x cols) packed in fmt. */
size_t llb_dense_packed_size(int fmt, long rows, long cols);
/* Pack W (rows x cols float32, row-major) into dst (llb_dense_packed_size bytes, 64-byte aligned);
 * the panel's columns past `rows` and bf16's padding column are zeros. */
void llb_dense_pack(int fmt, const float *w, long rows, long cols, void *dst);
/* out = x @ W^T (+ bias, which may be NULL) on the active ISA and the thread pool.
 * Returns 0, or -1 when scratch memory could not be allocated. */
int llb_dense(int fmt, const void *packed, const float *bias, long rows, long cols, const float *x, float *out,
              long n);

/* ---- kernels (matmul/kernels/dense_*.c) ---------------------------------- */

/* One tile: rows [0, mr) of xa (row stride ldx elements: float32 for F32, bfloat16 pairs for BF16)
 * times one panel p (ncols <= NR valid columns), + bias (NULL: none), into out (row stride ldo). */
typedef struct {
    const void *xa;
    long ldx;
    const void *panel;
    long kdim;          /* F32: cols; BF16: cols rounded up to even */
    const float *bias;  /* this panel's first column, or NULL */
    float *out;         /* this tile's first element */
    long ldo;
    int ncols;
} llb_dense_tile;

/* Runs tiles of up to max_rows rows (the caller cuts rows into such tiles). */
typedef void (*llb_dense_fn)(const llb_dense_tile *t, int mr);
typedef struct {
    llb_dense_fn f32, bf16;
    int max_rows;
    void (*to_bf16)(const float *x, uint16_t *out, long count); /* NULL: llb_f32_to_bf16 per value */
} llb_dense_kernels;

extern const llb_dense_kernels llb_dense_scalar;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
extern const llb_dense_kernels llb_dense_avx2;
extern const llb_dense_kernels llb_dense_avx512;
#endif

/* Round to bfloat16, nearest even (VCVTNEPS2BF16 on finite values); NaN stays a quiet NaN. */
static inline uint16_t llb_f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif

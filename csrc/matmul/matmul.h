/* Quantized matrix products and row access, as called by python/py_matmul.c (which
 * validates every argument first: these functions trust them). */
#ifndef LLB_MATMUL_H
#define LLB_MATMUL_H
#include "quants/quants.h"

/* out[n, rows] = x[n, cols] @ W[rows, cols]^T on the active ISA and thread pool.
 * exact: FP32 activations; else activations quantized to 8 bits where the type
 * has integer kernels. Returns 0, or -1 if scratch memory could not be allocated. */
int llb_matmul(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const float *x, float *out,
               long n, int exact);
/* One of several matrices that multiply the same activations (llb_matmul_many). */
typedef struct {
    int layout;
    const uint8_t *w;
    long rows;
    float *out; /* n x rows */
    const llb_type_info *t; /* the part's type; NULL: the call's (llb_matmul_many only) */
} llb_mm_part;
#define LLB_MM_MAX_PARTS 3
/* out_p = x @ W_p^T for up to LLB_MM_MAX_PARTS matrices of one width (e.g. a layer's Q, K and V):
 * the activations are quantized once and the matrices' row groups shared out over the pool in one
 * fork/join. Parts may have types of their own where their kernels read one activation layout (a
 * quantized file's Q5_0 Q and K with a Q8_0 V); other mixes run as one call per part. Each output
 * equals its llb_matmul bit for bit. Returns 0, or -1 (no scratch memory, or n_parts outside
 * 1..LLB_MM_MAX_PARTS). */
int llb_matmul_many(const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols, const float *x, long n,
                    int exact);
/* llb_matmul_many on the calling thread alone, its scratch given (at least llb_matmul_here_scratch
 * bytes for the widest part type/width/n it is called with, 64-byte aligned): for drivers that share
 * out other work over the pool (MoE experts). Results equal llb_matmul_many's bit for bit. */
size_t llb_matmul_here_scratch(const llb_type_info *t, long cols, long n, int exact);
int llb_matmul_many_here(const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols, const float *x,
                         long n, int exact, uint8_t *scratch);
/* A product prepared once and run by work units on any thread: for drivers that share the units of
 * several products out over the pool in one fork/join (an MoE decode step: every routed expert's rows,
 * cut finer than whole experts). llb_matmul_prep quantizes the activations on the calling thread into
 * scratch (llb_matmul_here_scratch bytes), or takes those of `same_x`, a prep of the same x, n, type,
 * width and mode, and returns the number of units (each writes whole outputs), or -1: out of range, or
 * a part whose layout must be repacked per call (use llb_matmul_many). llb_matmul_prep_run runs units
 * [u0, u1) on the calling thread; any split of the units over any threads gives llb_matmul_many's
 * results bit for bit. A prep is llb_matmul_prep_bytes() bytes (8-byte aligned), valid while its
 * scratch is. */
typedef struct llb_mm_prep llb_mm_prep;
size_t llb_matmul_prep_bytes(void);
long llb_matmul_prep(llb_mm_prep *p, const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols,
                     const float *x, long n, int exact, uint8_t *scratch, const llb_mm_prep *same_x);
void llb_matmul_prep_run(const llb_mm_prep *p, long u0, long u1);
/* 1 if `isa` (enum llb_isa) has its own kernel for the type in this mode; else matmul runs the
 * scalar kernel there. */
int llb_matmul_has_kernel(const llb_type_info *t, int isa, int exact);
/* The fast mode's outlier threshold (LLB_OUTLIER, kernels/kernels.h): a 32-block whose absmax exceeds it
 * times its row's RMS also carries a residual code. */
int llb_matmul_outlier(void);
/* File layout -> the layout llb_pack_layout(t) names (a copy for unpacked types): `count` matrices of
 * rows x cols back to back in src (an MoE layer's experts), each packed on its own, back to back in dst,
 * in one fork/join over all their row groups. */
void llb_pack(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst, long count);
/* out[i] = dequant(W[ids[i]]) for i < n. */
void llb_get_rows(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const int32_t *ids,
                  float *out, long n);

#endif

/* Quantized matrix products and row access, as called by py_matmul.c (which
 * validates every argument first: these functions trust them). */
#ifndef LLB_MATMUL_H
#define LLB_MATMUL_H
#include "quants.h"

/* out[n, rows] = x[n, cols] @ W[rows, cols]^T on the active ISA and thread pool.
 * exact: FP32 activations; else activations quantized to 8 bits where the type
 * has integer kernels. Returns 0, or -1 if scratch memory could not be allocated. */
int llb_matmul(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const float *x, float *out,
               long n, int exact);
/* File layout -> the layout llb_pack_layout(t) names (a copy for unpacked types). */
void llb_pack(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst);
/* out[i] = dequant(W[ids[i]]) for i < n. */
void llb_get_rows(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const int32_t *ids,
                  float *out, long n);

#endif

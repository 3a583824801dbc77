/* Per-row scaling by position band (ops/posscale.c): the query temperature of Llama 4 style attention, as a
 * generic op that knows no model. */
#ifndef LLB_POSSCALE_H
#define LLB_POSSCALE_H
#include <stdint.h>

/* In place: row i of x (n rows of `width` floats, contiguous) times the float32 factor
 * (float)(1 + beta * log1p(floor(pos[i] / length))), computed in double and rounded once; each element is
 * multiplied once, and a row whose factor is exactly 1 (band 0) is not touched. Needs n, width, length >= 1,
 * every pos[i] >= 0 and beta finite (the binding checks all of them). */
struct llb_pos_scale_args {
    float *x;
    const int32_t *pos;
    long n, width, length;
    double beta;
};
void llb_pos_scale(const struct llb_pos_scale_args *a);

#endif

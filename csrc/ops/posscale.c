/* Per-row scaling by position band (posscale.h). A per-row multiply, scalar: the compiler vectorizes the row
 * loop. One thread: a decode step scales a few rows, a prefill's rows are a small part of its attention. */
#include <math.h>
#include <stddef.h>

#include "ops/posscale.h"

void llb_pos_scale(const struct llb_pos_scale_args *a) {
    float *x = a->x;
    const int32_t *pos = a->pos;
    const long n = a->n, width = a->width, length = a->length;
    const double beta = a->beta;
    if (!x || !pos || n < 1 || width < 1 || length < 1 || !isfinite(beta)) return;
    for (long i = 0; i < n; i++) {
        const int32_t p = pos[i];
        if (p < 0) continue;        /* refused by the binding's check; never a negative band */
        const long band = (long)p / length;
        if (band == 0) continue;
        const float f = (float)(1.0 + beta * log1p((double)band));
        if (f == 1.0f) continue;    /* as multiplying by 1, without touching the row */
        float *row = x + (size_t)i * (size_t)width;
        for (long j = 0; j < width; j++) row[j] *= f;
    }
}

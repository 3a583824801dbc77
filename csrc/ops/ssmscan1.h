/* Mamba 1's selective scan over a per-sequence (d_inner, dstate) state. python/py_ops.c validates every argument
 * first: this trusts them. */
#ifndef LLB_SSMSCAN1_H
#define LLB_SSMSCAN1_H
#include <stdint.h>

/* Largest dstate the binding takes (no model comes near it). */
#define LLB_SSM1_MAX_STATE 4096

/* Per token t (of slot slots[t], in batch order) and channel c (D = d_inner, N = dstate):
 *   d = softplus(dt[t, c] + dt_bias[c]);  S[c, k] = exp(min(d a_neg[c, k], 0)) S[c, k] + d b[t, k] x[t, c];
 *   out[t, c] = (sum_k S[c, k] c[t, k] + d_skip[c] x[t, c]) silu(z[t, c])
 * (a_neg is -exp(A_log), never positive: the loader refuses a positive one, and the op takes it as 0, a decay
 * of 1). A token at position 0 starts its slot's state from zeros; state_pos[slot] becomes its last position + 1.
 * Channels split over the thread pool; a channel's sums run in one order whatever the split or the batch. */
struct llb_ssm_scan1_args {
    const float *x, *dt, *z;   /* (n, D) */
    const float *b, *c;        /* (n, N) */
    float *state;              /* (n_slots, D, N) */
    int32_t *state_pos;        /* (n_slots) */
    const float *a_neg;        /* (D, N) */
    const float *dt_bias, *d_skip; /* (D) */
    const int32_t *slots, *pos; /* (n) */
    float *out;                /* (n, D) */
    long n, d_inner, dstate, n_slots;
};
void llb_ssm_scan1(const struct llb_ssm_scan1_args *a);

#endif

/* Mixture-of-experts layers: routing and the routed experts' MLPs, over the matmul driver and
 * the element-wise ops. Knows no model: it is handed router logits, three expert tensors and
 * how to turn logits into weights. Called by python/py_moe.c, which validates everything. */
#ifndef LLB_MOE_H
#define LLB_MOE_H
#include <stdint.h>

#include "quants/quants.h"

enum llb_moe_routing {
    LLB_MOE_SOFTMAX_TOPK = 0, /* softmax over all experts, the k largest (optionally renormalised) */
    LLB_MOE_TOPK_SOFTMAX = 1, /* the k largest logits, softmax over those k */
    LLB_MOE_SIGMOID_TOPK = 2, /* a sigmoid per expert, the k largest (optionally renormalised) */
};

/* How router logits become each token's k experts and weights. A score per expert (the softmax over all,
 * or each logit's sigmoid); the choice ranks score + bias (bias: NULL or n_expert values), within the
 * groups_used best of `groups` equal groups of experts when groups > 1 (a group's rank: the sum of its
 * group_top best choice values); the weights are the chosen experts' scores (bias not added), renormalised
 * to sum to 1 if norm, then times scale. LLB_MOE_TOPK_SOFTMAX takes neither groups nor a bias. */
typedef struct {
    int routing, norm;
    long groups, groups_used, group_top;
    float scale;
    const float *bias;
} llb_moe_route_params;

enum llb_moe_act {
    LLB_MOE_SILU = 0,       /* silu(gate) * up */
    LLB_MOE_SWIGLU_OAI = 1, /* g = min(gate, limit): (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) */
};

/* E matrices of one type back to back, expert e's packed data at w + e * stride. */
typedef struct {
    const llb_type_info *t;
    int layout;
    const uint8_t *w;
    size_t stride;
} llb_experts;

typedef struct {
    long n, d, n_expert, k, ff;  /* tokens, model width, experts, experts per token, expert width */
    llb_moe_route_params route;
    int exact, act;
    float alpha, limit;          /* LLB_MOE_SWIGLU_OAI's */
    const float *x;              /* n x d, the normed hidden states */
    const float *logits;         /* n x n_expert */
    llb_experts gate, up, down;  /* gate, up: ff x d each; down: d x ff */
    const float *gate_b, *up_b, *down_b; /* NULL, or per expert biases: E x ff, E x ff, E x d */
    const float *shared;         /* n x d or NULL: added to every token's output */
    const float *shared_logit;   /* n or NULL: the shared output is scaled by sigmoid of it */
    float *out;                  /* n x d */
    float *fscratch;             /* llb_moe_fscratch(n, d, k, ff) floats */
    int32_t *iscratch;           /* llb_moe_iscratch(n, k, n_expert) ints */
} llb_moe_args;

size_t llb_moe_fscratch(long n, long d, long k, long ff);
size_t llb_moe_iscratch(long n, long k, long n_expert);

/* Each token's k experts and weights: ids[t*k + j] by descending choice (ties: lower id). Returns 0, or -1
 * when the scratch of a grouped, biased or sigmoid routing could not be allocated. The caller checks the
 * parameters (groups divides n_expert, k <= groups_used * n_expert / groups, group_top <= a group's size). */
int llb_moe_route(const float *logits, long n, long n_expert, long k, const llb_moe_route_params *r, int32_t *ids,
                  float *weights);

/* out = the routed experts' weighted MLP outputs (+ shared). The tokens are grouped by expert and
 * each expert with tokens runs as one matrix product over them. A token's result does not depend
 * on which other tokens share its experts when the matmul is batch invariant (core/state.h).
 * Returns 0, or -1 when the matmul's scratch could not be allocated. */
int llb_moe(const llb_moe_args *a);

#endif

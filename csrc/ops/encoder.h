/* The encoder's (BERT's) own ops on a batch of sequences packed back to back (no padding):
 * sequence s holds rows [starts[s], starts[s + 1]). python/py_encoder.c validates every argument
 * first: these functions trust them. Each runs on the thread pool, and every output element is
 * computed by the same code whatever the thread count or the other sequences of the batch. */
#ifndef LLB_ENCODER_H
#define LLB_ENCODER_H
#include <stdint.h>

/* Largest head_dim encoder_attention takes (its accumulator lives on the stack). */
#define LLB_ENC_MAX_HEAD_DIM 1024

/* out[i] = (y - mean(y)) / sqrt(var(y) + eps) * w + b with y = x[i] + r[i] (r may be NULL),
 * rows of d; out may alias x or r. */
void llb_add_layernorm(const float *x, const float *r, const float *w, const float *b, float *out, long n, long d,
                       float eps);

/* In place on the q and k parts of qkv rows [q | k | v] (n_heads x head_dim each): each head's pairs
 * (j, j + head_dim/2) rotated by row i's angle table, a = x[j], b = x[j + half]:
 * x[j] = a cos[i, j] - b sin[i, j], x[j + half] = b cos[i, j] + a sin[i, j]; cos, sin (n x head_dim/2).
 * (rotate_half rotary with per-row angles of any origin: a vision tower's 2D positions.) */
void llb_encoder_rotate(float *qkv, const float *cos, const float *sin, long n, long n_heads, long head_dim);

/* Bidirectional multi-head attention within each sequence: qkv rows are [q | k | v], each
 * n_heads x head_dim; out[i] (n_heads x head_dim) = softmax(scale q_i k_j^T over j in i's
 * sequence) v. Returns 0, or -1 when scratch memory could not be allocated. */
int llb_encoder_attention(const float *qkv, const int32_t *starts, long n_seqs, long n_heads, long head_dim,
                          float scale, float *out);

#endif

/* Elementwise, normalisation, RoPE, KV-cache and attention ops on float32.
 *
 * These functions trust their arguments: python/py_ops.c
 * validates every size and index before calling. Each picks the kernels of
 * llb_isa_current and splits its work over the thread pool when the size
 * warrants it; results do not depend on the thread count (every output element
 * is computed by the same code whichever thread runs it). */
#ifndef LLB_OPS_H
#define LLB_OPS_H
#include <stddef.h>
#include <stdint.h>

/* KV cache element types. Q8_0 stores each 32 consecutive values of a row (a head's row never
 * shares a block: head_dim is a multiple of 32) as an f16 scale and 32 int8 codes, as ggml's Q8_0. */
enum llb_cache_type { LLB_CACHE_F32 = 0, LLB_CACHE_F16 = 1, LLB_CACHE_Q8_0 = 2 };
#define LLB_Q8_0_BLOCK 32
#define LLB_Q8_0_BYTES 34

/* Bytes of the first `elems` values of a cache (elems a multiple of 32 for Q8_0). */
static inline size_t llb_cache_bytes(int type, size_t elems) {
    if (type == LLB_CACHE_Q8_0) return elems / LLB_Q8_0_BLOCK * LLB_Q8_0_BYTES;
    return elems * (type == LLB_CACHE_F16 ? 2 : 4);
}
/* Where value `elem` of a cache starts. */
static inline const void *llb_cache_at(const void *base, size_t elem, int type) {
    return (const char *)base + llb_cache_bytes(type, elem);
}
/* The K/V caches are (n_slots, n_kv, n_ctx, head_dim): each kv head's keys of a slot one run of
 * rows. Position-major rows (n_ctx, n_kv, head_dim) had a decode read every other 256 bytes at
 * head_dim 128 f16, which a Zen 4 host's memory served slower than whole rows (the op from memory
 * 1.3x the time alone, ~1.1x inside a decode step; docs/BENCHMARKS.md, session 42).
 * The first value of (slot s, kv head kvh, position p) is element llb_kv_elem(...). */
static inline size_t llb_kv_elem(long n_kv, long n_ctx, long head_dim, long s, long kvh, long p) {
    return (((size_t)s * (size_t)n_kv + (size_t)kvh) * (size_t)n_ctx + (size_t)p) * (size_t)head_dim;
}

/* Largest head_dim attention accepts (its block buffers live on the stack): 576 takes latent
 * attention's compressed rows (a 512-value latent beside a 64-value rotary key) as one head. */
#define LLB_ATTN_MAX_HEAD_DIM 576
/* Largest rope_dim (the per-token cos/sin table lives on the stack). */
#define LLB_ROPE_MAX_DIM 4096

/* out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, rows of d; out may alias x. */
void llb_rmsnorm(const float *x, const float *w, float *out, long n, long d, float eps);

/* In place on x (n, n_heads, head_dim): rotate the first rope_dim dims of every
 * head by angle pos[t] * inv_freq[i]. neox=1 pairs (i, i + rope_dim/2), neox=0
 * pairs (2i, 2i+1). The angle is the float32 product pos * inv_freq (as HF
 * and the NumPy reference compute it: at pos 8191 that product is itself only
 * good to ~5e-4 rad, the same error the references make); its cos/sin come
 * from libm's cosf/sinf (glibc: within 1 ulp of the exact value). */
struct llb_rope_args {
    float *x;                /* n tokens x n_heads x head_dim, rotated in place */
    const int32_t *pos;      /* n positions */
    const float *inv_freq;   /* rope_dim / 2 frequencies */
    long n, n_heads, head_dim, rope_dim;
    int neox;
};
void llb_rope(const struct llb_rope_args *a);

/* Token i's k/v rows (n_kv * head_dim floats) go to cache[slots[i], :, pos[i]];
 * caches are (n_slots, n_kv, n_ctx, head_dim) of cache_type (llb_kv_elem). kcache == vcache (k == v, no kbase):
 * a cache whose values are read from the keys' rows, written once. */
struct llb_kv_store_args {
    const float *k, *v;      /* n rows of n_kv * head_dim floats */
    void *kcache, *vcache;
    const int32_t *slots, *pos;
    long n, n_kv, head_dim, n_slots, n_ctx;
    int cache_type;
    /* Q8_0 only, or NULL: (n_slots, n_kv * head_dim) floats, each slot's key base. A token at
     * position 0 sets its slot's base to its keys; a key block may be stored as its difference
     * from the base, read back as base + that (ops.c's q8_0_row says when and why). */
    float *kbase;
};
void llb_kv_store(const struct llb_kv_store_args *a);

struct llb_attention_args {
    const float *q;            /* (n, n_heads, head_dim) */
    const void *kcache, *vcache; /* (n_slots, n_kv, n_ctx, head_dim) of cache_type */
    float *out;                /* (n, n_heads, head_dim) */
    const int32_t *slots, *pos; /* (n) */
    long n, n_heads, n_kv, head_dim, n_slots, n_ctx;
    int cache_type;
    float scale;   /* applied to q.k */
    long window;   /* keys max(0, p - window + 1)..p; 0 = all keys 0..p */
    float softcap; /* > 0: score = softcap * tanh(score / softcap) */
    const float *kbase; /* Q8_0: the key bases llb_kv_store used (NULL: none) */
    const int32_t *kend; /* (n) or NULL: row i sees keys up to kend[i] - 1 (kend[i] > pos[i]: an image's
                          * tokens see their whole block), not only up to pos[i]; the window's start stays */
};
/* The last key row i of a reads: pos[i], or kend[i] - 1 where a kend is given. */
static inline long llb_attn_last_key(const struct llb_attention_args *a, long i) {
    return a->kend ? (long)a->kend[i] - 1 : (long)a->pos[i];
}
/* Causal attention of each token over its slot's cache, GQA (head h reads kv
 * head h / (n_heads / n_kv)), softmax in float32; keys up to llb_attn_last_key. */
void llb_attention(const struct llb_attention_args *a);
/* After llb_attention with the same args: each head h's output as if its softmax had one more
 * column of logit sinks[h] and no value (GPT-OSS). */
void llb_attention_sinks(const struct llb_attention_args *a, const float *sinks);

/* A causal depthwise convolution with a per-slot state (ops/shortconv.c), token by token in batch
 * order. gated (LFM2): bcx (n, 3d) holds B, C, x; u = B * x; out = C * sum_j kernel[c][j] * window[j],
 * the window the slot's state (its last width - 1 u, oldest first) then this u. Not gated (Qwen3-Next):
 * u = bcx's row (n, d), out = silu(that sum + bias, if any). The state then shifts in u. A token at position 0
 * starts from a zero state; state_pos[slot] becomes the last position + 1. */
struct llb_short_conv_args {
    const float *bcx;          /* (n, 3d) gated, else (n, d) */
    float *state;              /* (n_slots, width - 1, d) */
    int32_t *state_pos;        /* (n_slots): tokens each slot's state has taken in */
    const float *kernel;       /* (d, width) */
    const float *bias;         /* (d) or NULL, ungated only */
    const int32_t *slots, *pos; /* (n) */
    float *out;                /* (n, d) */
    long n, d, width, n_slots;
    int gated;
};
void llb_short_conv(const struct llb_short_conv_args *a);

/* Qwen3-Next's gated delta rule (ops/deltanet.c), token by token in batch order, value heads in
 * parallel. qkv (n, 2 hk dk + hv dv): q heads, k heads, v heads; ba (n, 2 hv): b, then a; z (n, hv dv);
 * state (n_slots, hv, dk, dv), zeroed at position 0. Value head h reads key head h / (hv / hk):
 * q, k L2-normalised (eps 1e-6 under the root), q times dk^-0.5; beta = sigmoid(b),
 * g = a_neg[h] * softplus(a + dt_bias[h]); S = exp(g) S; S += k ((v - S^T k) beta)^T; o = S^T q;
 * out = o / sqrt(mean(o^2) + eps) * norm_w * silu(z). */
struct llb_gated_delta_args {
    const float *qkv, *ba, *z;
    float *state;
    int32_t *state_pos;
    const float *a_neg, *dt_bias, *norm_w;
    const int32_t *slots, *pos;
    float *out;                /* (n, hv dv) */
    long n, hk, hv, dk, dv, n_slots;
    float eps;
};
#define LLB_DELTA_MAX_DIM 1024 /* largest dk, dv */
void llb_gated_delta(const struct llb_gated_delta_args *a);

/* Mamba2's selective scan (ops/ssmscan.c), token by token in batch order, heads in parallel. xbc (n, H P + 2 G N):
 * x (H heads of P), B, C (G groups of N; head h reads group h / (H / G)); dt (n, H); z (n, H P); state
 * (n_slots, H, N, P), zeroed at position 0. d = softplus(dt + dt_bias[h]); S = exp(d a_neg[h]) S + d B x^T;
 * y = S^T C + d_skip[h] x; out = y silu(z), each of G groups of H P / G RMS-normed (eps), times norm_w
 * (norm_w NULL: no norm). */
struct llb_ssm_scan_args {
    const float *xbc;          /* (n, H P + 2 G N): x, B, C */
    const float *dt, *z;       /* (n, H), (n, H P) */
    float *state;              /* (n_slots, H, N, P) */
    int32_t *state_pos;        /* (n_slots): tokens each slot's state has taken in */
    const float *a_neg, *dt_bias, *d_skip; /* (H) each */
    const float *norm_w;       /* (H P), or NULL */
    const int32_t *slots, *pos; /* (n) */
    float *out;                /* (n, H P) */
    long n, groups, heads, dstate, dhead, n_slots;
    float eps;
};
#define LLB_SSM_MAX_DIM 1024 /* largest N, P */
void llb_ssm_scan(const struct llb_ssm_scan_args *a);

void llb_sigmoid_mul(const float *x, const float *gate, float *out, long count); /* x * sigmoid(gate) */

/* Gemma 3n (altup.c): rows of d values, n tokens; A streams of n rows each, stream-major */
void llb_mul_rows(const float *x, const float *w, float *out, long n, long d);   /* out[i] = x[i] * w */
void llb_ids_below(const int32_t *ids, int32_t limit, int32_t *out, long n);  /* ids[i] < limit ? ids[i] : 0 */
void llb_gaussian_topk(float *x, long n, long d, float mult);  /* relu(x - mean - std * mult) per row, std over d */
/* out[i] = y[i] * rms(target[i]) / sqrt(max(mean(y[i]^2), 1e-5)) */
void llb_rms_match(const float *y, const float *target, float *out, long n, long d);
/* out[j][i] = x[j][i] + sum_m coef[i][j A + m] x[m][i]; out is not x */
void llb_altup_predict(const float *x, const float *coef, float *out, long A, long n, long d);
/* out[j][i] = pred[j][i] + coef[i][j] (active[i] - pred[idx][i]); out may be pred */
void llb_altup_correct(const float *pred, const float *coef, const float *active, long idx, float *out, long A,
                       long n, long d);

void llb_silu_mul(const float *gate, const float *up, float *out, long count); /* gate*sigmoid(gate)*up */
/* The same on the calling thread alone (for a caller already running on a pool thread). */
void llb_silu_mul_here(const float *gate, const float *up, float *out, long count);
void llb_gelu_mul(const float *gate, const float *up, float *out, long count); /* gelu_tanh(gate)*up */
void llb_add(const float *a, const float *b, float *out, long count);          /* out may alias a or b */
void llb_add_rows(const float *x, const float *bias, float *out, long n, long d); /* out[i] = x[i] + bias */
void llb_scale(float *x, float s, long count);                                 /* x *= s */
void llb_gelu_erf(float *x, long count);                                       /* x = 0.5 x (1 + erf(x/sqrt 2)) */
void llb_softcap(float *x, float cap, long count);                             /* x = cap * tanh(x / cap) */
/* In place: x > 0 ? ap x^2 + beta x : (expm1(min(x, eps)) - x) an + beta x, the negative branch 0 when an is 0
 * (Apertus' xIELU with its effective scalars; ReLU^2 is ap 1, an 0, beta 0) */
void llb_xielu(float *x, long count, float ap, float an, float beta, float eps);
/* A strided block copy: dst[t dst_row + g dst_group + dst_off + j] = src[t src_row + g src_group + src_off + j]
 * for t < n, g < groups, j < width (a view's columns into another layout; src_group 0 repeats one block in
 * every group). src and dst must not overlap. */
void llb_copy_blocks(const float *src, float *dst, long n, long groups, long width, long src_row, long src_group,
                     long src_off, long dst_row, long dst_group, long dst_off);

#endif

/* Micro-benchmark (not a test, not part of the build) of the AVX2 decode attention kernel itself
 * (csrc/ops/kernels/attention.inc's attend, included from avx2.c with its kernel table left out):
 * one token's query heads of a GQA group against a random f16 cache, the keys in units of WINDOW
 * (256, the batch-invariant schedule's chunks), both kv heads, one thread, the cache in L2/L3 at
 * depth 4096. A C build of the kernel alone compiles in about a minute (20 s with -DHD_ONLY=64,
 * whose code comes out a few percent slower: compare builds of one kind), against minutes for the
 * extension, and callgrind or objdump read it without Python around it. Prints the time per key and
 * kv head, in cycles at CLOCK_GHZ.
 *
 *   gcc -O3 -mavx2 -mfma -mf16c -Icsrc -DCLOCK_GHZ=3.15 -o /tmp/attention_unit bench/attention_unit.c -lm
 *   /tmp/attention_unit [KEYS [WINDOW [REPS [HEAD_DIM [GROUP]]]]]   (4096 256 auto 64 7: Qwen2.5-0.5B)
 *
 * Zen 3 (2026-12-07, 3.15 GHz): the 0.5B's shape 132 cycles a key and kv head (FMA floor 56), 108-113
 * with session 47's out-of-line loops (docs/BENCHMARKS.md); the 1.5B's (128 6) 148-160
 * (floor 96). */
#define LLB_KERNEL_HARNESS 1
#include "ops/kernels/avx2.c"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef CLOCK_GHZ
#define CLOCK_GHZ 3.0
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float rnd(void) { return rand() / (float)RAND_MAX - 0.5f; }

__attribute__((noinline)) static void run_unit(const struct llb_attn_unit *u) {
#ifdef HD_ONLY
    attend(u, LLB_CACHE_F16, HD_ONLY);
#else
    attend_any(u, LLB_CACHE_F16);
#endif
}

int main(int argc, char **argv) {
    const long nkeys = argc > 1 ? atol(argv[1]) : 4096, win = argc > 2 ? atol(argv[2]) : 256;
    const long hd = argc > 4 ? atol(argv[4]) : 64, group = argc > 5 ? atol(argv[5]) : 7, nkv = 2, stride = nkv * hd;
    const long reps = argc > 3 && atol(argv[3]) > 0 ? atol(argv[3]) : 20000000 / nkeys;
    if (nkeys < 1 || win < 1 || hd < 1 || hd > LLB_ATTN_MAX_HEAD_DIM || group < 1 || group > 64) {
        fprintf(stderr, "usage: %s [KEYS [WINDOW [REPS [HEAD_DIM [GROUP]]]]]\n", argv[0]);
        return 2;
    }
    uint16_t *k = malloc(nkeys * stride * 2), *v = malloc(nkeys * stride * 2);
    float *q = malloc(group * hd * 4), *out = malloc(group * hd * 4), *ml = malloc(group * 2 * 4);
    srand(1);
    for (long i = 0; i < nkeys * stride; i++) k[i] = _cvtss_sh(2 * rnd(), 0), v[i] = _cvtss_sh(rnd(), 0);
    for (long i = 0; i < group * hd; i++) q[i] = rnd();
    double best = 1e30, check = 0;
    for (int t = 0; t < 5; t++) {
        const double t0 = now();
        for (long r = 0; r < reps; r++)
            for (long kvh = 0; kvh < nkv; kvh++)
                for (long lo = 0; lo < nkeys; lo += win) {
                    const struct llb_attn_unit u = {.q = q, .k = k + kvh * hd, .v = v + kvh * hd, .stride = stride, .lo = lo,
                                                    .hi = (lo + win < nkeys ? lo + win : nkeys) - 1, .head_dim = hd,
                                                    .group = group, .scale = 1.f / sqrtf((float)hd), .out = out, .ml = ml,
                                                    .pf_far = 16384};
                    run_unit(&u);
                    check += out[0];
                }
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    const double per = best / reps / nkeys / nkv;
    printf("%ld keys, head_dim %ld, %ld heads a kv head: %.2f ns (%.1f cycles at %.2f GHz) a key and kv head (check %g)\n",
           nkeys, hd, group, per * 1e9, per * CLOCK_GHZ * 1e9, CLOCK_GHZ, check);
    return 0;
}

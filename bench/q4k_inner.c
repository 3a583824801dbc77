/* Micro-benchmark (not a test, not part of the build) of the AVX2 Q4_K GEMM tile's inner step
 * (csrc/matmul/kernels/avx2_kquants.c, tile_q4kp_pf) with everything in L1: per sub-block s, 8 quads t
 * of two code vectors from the panel, each activation row's 4 bytes broadcast and multiplied by both
 * (vpmaddubsw), the products summed in int16 chains over the quads, then per half and row one vpmaddwd
 * by the sub-block's scale pairs and, with FSTEP, the float step (convert, FMA by the row's scale).
 * 4 activation rows (TILE2_ROWS), as the kernel. Prints int8 multiply-adds per cycle at CLOCK_GHZ.
 *
 *   gcc -O3 -mavx2 -mfma -DFSTEP=1 -o /tmp/q4k_inner bench/q4k_inner.c && taskset -c 0 /tmp/q4k_inner
 *
 * Zen 2 (2026-12-05, 3.24 GHz): vpmaddubsw and vpmaddwd each 1 a cycle, on one pipe together (so 72
 * multiplies a sub-block and row quad: a 28.4 multiply-adds/cycle ceiling); this step 29.0 without the
 * float step, 27.9 with it; the int16 sums as vpor instead of vpaddw the same (the adds do not take the
 * multiplier's pipe). The kernel in a prefill runs Q4_K at 22 (bench_prefill_ops.py -t 1, 1.5B
 * Q4_K_M's gate/up): the other ~21% is outside this step. Without the unroll pragmas GCC kept the chains
 * in memory and it ran at 17.5. Zen 3 (2026-12-07, 3.15 GHz, two multiply pipes): 47.1 without the float
 * step, 42.0 with it; the kernel's Q4_K gate/up GEMM ran at 29-31 (docs/BENCHMARKS.md, session 46). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#ifndef FSTEP
#define FSTEP 1
#endif
#ifndef CLOCK_GHZ
#define CLOCK_GHZ 3.24
#endif
#define ROWS 4

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(void) {
    static uint8_t panel[8 * 8 * 64] __attribute__((aligned(64))); /* sub-block s, quad t: two code vectors */
    static int8_t x[ROWS * 256] __attribute__((aligned(64)));     /* one super-block of each row */
    static float dx[ROWS * 8];
    for (int i = 0; i < (int)sizeof panel; i++) panel[i] = (uint8_t)(i * 7 & 15);
    for (int i = 0; i < ROWS * 256; i++) x[i] = (int8_t)((i * 13 & 31) - 16);
    for (int i = 0; i < ROWS * 8; i++) dx[i] = 1.0f + (float)i;
    (void)dx; /* FSTEP 0: unused */
    const __m256i sc = _mm256_set1_epi16(3);
    __m256i iacc[ROWS];
    __m256 facc[2][ROWS];
    for (int m = 0; m < ROWS; m++) iacc[m] = _mm256_setzero_si256(), facc[0][m] = facc[1][m] = _mm256_setzero_ps();
    const long steps = 20000000;
    const double t0 = now();
    for (long it = 0; it < steps; it++) {
        const int s = (int)(it & 7);
        const uint8_t *q = panel + 512 * s;
        const int8_t *xq = x + 32 * s;
        __m256i p[2][ROWS];
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m256i q0 = _mm256_load_si256((const void *)(q + 64 * t)), q1 = _mm256_load_si256((const void *)(q + 64 * t + 32));
#pragma GCC unroll 8
            for (int m = 0; m < ROWS; m++) {
                int32_t w;
                __builtin_memcpy(&w, xq + 256 * m + 4 * t, 4);
                const __m256i b = _mm256_set1_epi32(w);
                const __m256i a0 = _mm256_maddubs_epi16(q0, b), a1 = _mm256_maddubs_epi16(q1, b);
                p[0][m] = t ? _mm256_add_epi16(p[0][m], a0) : a0;
                p[1][m] = t ? _mm256_add_epi16(p[1][m], a1) : a1;
                __asm__("" : "+x"(p[0][m]), "+x"(p[1][m])); /* chains in registers, as the kernel */
            }
        }
#pragma GCC unroll 8
        for (int m = 0; m < ROWS; m++) {
#if FSTEP
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++)
                facc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p[h][m], sc)), _mm256_set1_ps(dx[8 * m + s]),
                                             facc[h][m]);
#else
            iacc[m] = _mm256_add_epi32(iacc[m], _mm256_add_epi32(_mm256_madd_epi16(p[0][m], sc), _mm256_madd_epi16(p[1][m], sc)));
#endif
        }
    }
    const double secs = now() - t0;
    __m256 fs = _mm256_setzero_ps();
    __m256i is = _mm256_setzero_si256();
    for (int m = 0; m < ROWS; m++) fs = _mm256_add_ps(fs, _mm256_add_ps(facc[0][m], facc[1][m])), is = _mm256_add_epi32(is, iacc[m]);
    float f[8];
    int32_t n[8];
    _mm256_storeu_ps(f, fs);
    _mm256_storeu_si256((void *)n, is);
    const double macs = (double)steps * 8 * ROWS * 64;
    printf("%.1f int8 multiply-adds a cycle at %.2f GHz (float step %d; checksum %g %d)\n", macs / secs / (CLOCK_GHZ * 1e9),
           CLOCK_GHZ, FSTEP, (double)f[0], n[0]);
    return 0;
}

/* Micro-benchmark (not a test, not part of the build): one core streaming 300 MB in the 32-block GEMV's
 * shape (544-byte Q8_0 group-blocks by default: 8 zmm code loads, 8 activation broadcasts, vpdpbusd, one
 * float step), with the Zen 4 GEMV's software prefetch (every line, into L2, PF bytes ahead) or none.
 * Mode 0 only XORs the code vectors (a plain reader of the same shape), mode 1 does the GEMV's work.
 *
 *   gcc -O2 -march=icelake-server -DPF=16384 -o /tmp/sp bench/stream_prefetch.c && /tmp/sp 1
 *   (-DPF=0: no software prefetch; -DBB=288: Q4_0's block size; -DSMALL_PAGES: 4 KB pages)
 *
 * Prints the median of 15 passes in GB/s of the thread's CPU time. Zen 4, 2026-12-04, load 5-7 (other
 * work), alternated runs, mode 1, 2 MB pages: PF=0 22.5-28.7 GB/s, PF=4096 18.7-24.0, PF=16384 16.6-19.7;
 * 4 KB pages: PF=0 19.0-21.4, PF=16384 16.9-17.6 (docs/BENCHMARKS.md, "Zen 4 decode, per token"). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef PF
#define PF 16384
#endif
#ifndef BB
#define BB 544
#endif
#define BYTES (300L << 20)
#define HUGE (2L << 20)
#define PASSES 15

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One pass over nblk blocks; the codes sit after a 32-byte scale row, as in the packed 32-block layout. */
__attribute__((noinline)) static float pass(const uint8_t *w, long nblk, const int8_t *xq, int mode) {
    __m512 tot = _mm512_setzero_ps();
    __m512i x = _mm512_setzero_si512();
    for (long b = 0; b < nblk; b++) {
        const uint8_t *gb = w + b * BB;
        if (PF)
            for (int o = 0; o < BB; o += 64) _mm_prefetch((const char *)gb + o + PF, _MM_HINT_T1);
        if (mode == 0) {
            for (int t = 0; t < (BB - 32) / 64; t++) x = _mm512_xor_si512(x, _mm512_loadu_si512(gb + 32 + 64 * t));
            continue;
        }
        const int8_t *xb = xq + 32 * (b & 63);
        __m512i a0 = _mm512_set1_epi32((int)b), a1 = _mm512_setzero_si512();
        for (int t = 0; t < (BB - 32) / 128; t++) {
            a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(gb + 32 + 64 * t), _mm512_set1_epi32(ld32(xb + 4 * t)));
            a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(gb + 32 + 64 * (t + (BB - 32) / 128)),
                                     _mm512_set1_epi32(ld32(xb + 16 + 4 * t)));
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        tot = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), dv), _mm512_set1_ps(1.0f), tot);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(tot, _mm512_castsi512_ps(x)));
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 1;
    uint8_t *m = mmap(NULL, BYTES + 2 * HUGE + PF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 1;
    uint8_t *w = (uint8_t *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
#ifdef SMALL_PAGES
    madvise(w, BYTES + PF, MADV_NOHUGEPAGE);
#else
    madvise(w, BYTES + PF, MADV_HUGEPAGE);
#endif
    memset(w, 1, BYTES + PF);
    int8_t xq[2048];
    memset(xq, 1, sizeof xq);
    const long nblk = BYTES / BB;
    double gbs[PASSES];
    float sink = 0;
    for (int r = 0; r < PASSES; r++) {
        const double c0 = cpu_now();
        sink += pass(w, nblk, xq, mode);
        gbs[r] = (double)nblk * BB / (cpu_now() - c0) / 1e9;
    }
    qsort(gbs, PASSES, sizeof gbs[0], cmp);
    printf("mode %d block %d prefetch %d: median %.1f GB/s of CPU time (min %.1f max %.1f)%s\n", mode, BB, PF,
           gbs[PASSES / 2], gbs[0], gbs[PASSES - 1], sink == 12345.0f ? " " : "");
    return 0;
}

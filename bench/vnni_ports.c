/* Micro-benchmark (not a test, not part of the build): the rate of 512-bit vpdpbusd in 12 independent
 * chains, with the activation operand in a register, folded as a {1to16} memory broadcast, or broadcast
 * by its own vpbroadcastd; and the same chains with one vfmadd231ps or one vcvtdq2ps per 3, to see which
 * of the K-quant tiles' float epilogue shares the multiply pipes (FMAs with a register or {1to16} operand).
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -o /tmp/vnni_ports bench/vnni_ports.c && /tmp/vnni_ports
 *
 * Medians of 300 alternated runs (CPU time). Zen 4 (2 vCPUs of an EPYC, 2026-12-04, load average 7): register,
 * folded and vpbroadcastd all 3.66 per ns (one per cycle: the broadcast form does not matter); +1 FMA per 3
 * (register or {1to16} operand) 2.75 = 3.66 x 12/16: an FMA takes a vpdpbusd's slot; +1 convert per 3 3.66
 * (another pipe). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 20000
enum { REG, FOLD, SPLIT, FMA, FMAB, CVT, KINDS };

static int32_t xs[256] __attribute__((aligned(64)));
static float fx[16] __attribute__((aligned(64)));
static __m512i sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* One chain step of kind k on accumulator v (activation at p, extra float op on f). */
#define STEP(k, v, p, f)                                                                                   \
    do {                                                                                                     \
        if (k == FOLD) __asm__ volatile("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(v) : "m"(*(p)), "v"(q));       \
        else if (k == SPLIT) {                                                                               \
            __m512i b_;                                                                                      \
            __asm__ volatile("vpbroadcastd %1, %0" : "=v"(b_) : "m"(*(p)));                                  \
            __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(v) : "v"(b_), "v"(q));                             \
        } else __asm__ volatile("vpdpbusd %1, %2, %0" : "+v"(v) : "v"(x), "v"(q));                           \
    } while (0)
#define EXTRA(k, f)                                                                                          \
    do {                                                                                                     \
        if (k == FMA) __asm__ volatile("vfmadd231ps %1, %1, %0" : "+v"(f) : "v"(c));                         \
        if (k == FMAB) __asm__ volatile("vfmadd231ps %1%{1to16%}, %2, %0" : "+v"(f) : "m"(fx[0]), "v"(c)); \
        if (k == CVT) __asm__ volatile("vcvtdq2ps %1, %0" : "=v"(f) : "v"(x));                               \
    } while (0)

static inline __attribute__((always_inline)) double run_k(const int k, const int32_t *p) {
    const __m512i q = _mm512_set1_epi32(3), x = _mm512_set1_epi32(9);
    const __m512 c = _mm512_set1_ps(0.999f);
    __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
            a9 = a0, a10 = a0, a11 = a0; /* named, not an array: an array of asm operands lands on the stack */
    __m512 f0 = _mm512_set1_ps(1), f1 = f0, f2 = f0, f3 = f0;
    const double t0 = now();
    for (long it = 0; it < N; it++) {
        STEP(k, a0, p, f0); STEP(k, a1, p + 1, f0); STEP(k, a2, p + 2, f0); EXTRA(k, f0);
        STEP(k, a3, p + 3, f1); STEP(k, a4, p + 4, f1); STEP(k, a5, p + 5, f1); EXTRA(k, f1);
        STEP(k, a6, p + 6, f2); STEP(k, a7, p + 7, f2); STEP(k, a8, p + 8, f2); EXTRA(k, f2);
        STEP(k, a9, p + 9, f3); STEP(k, a10, p + 10, f3); STEP(k, a11, p + 11, f3); EXTRA(k, f3);
    }
    const double dt = now() - t0;
    const __m512i s0 = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                        _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    const __m512i s1 = _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11));
    const __m512 fs = _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3));
    sink = _mm512_add_epi32(sink, _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_castps_si512(fs)));
    return 12.0 * N / dt;
}

/* One copy per kind, so the chains stay in registers. */
#define RUN(k) static __attribute__((noinline)) double run_##k(const int32_t *p) { return run_k(k, p); }
RUN(REG)
RUN(FOLD)
RUN(SPLIT)
RUN(FMA)
RUN(FMAB)
RUN(CVT)

static int cmp(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(void) {
    enum { R = 300 };
    static double r[KINDS][R];
    const char *name[KINDS] = {"register", "folded {1to16}", "vpbroadcastd", "+1 FMA per 3", "+1 FMA {1to16} per 3",
                              "+1 convert per 3"};
    for (int i = 0; i < 256; i++) xs[i] = 7 * i;
    for (int n = 0; n < R; n++)
        for (int k = 0; k < KINDS; k++) {
            const int32_t *p = xs + 16 * (n & 7);
            r[k][n] = k == REG ? run_REG(p) : k == FOLD ? run_FOLD(p) : k == SPLIT ? run_SPLIT(p) : k == FMA ? run_FMA(p) : k == FMAB ? run_FMAB(p) : run_CVT(p);
        }
    for (int k = 0; k < KINDS; k++) {
        qsort(r[k], R, sizeof(double), cmp);
        printf("%-18s median %.2f  p90 %.2f vpdpbusd/ns\n", name[k], r[k][R / 2], r[k][R * 9 / 10]);
    }
    return _mm512_reduce_add_epi32(sink) == 1;
}

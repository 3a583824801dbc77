/* Micro-benchmark (not a test, not part of the build) of the AVX2 integer dot a GEMM tile of a signed
 * 8-bit type (Q8_0, IQ4_NL, IQ4_XS) runs, against the alternatives and Q4_0's: cycles per 2048
 * multiply-adds (one 32-value block x 16 weight rows x 4 activation rows, the tiles' shape), data in L1.
 *
 *   gcc -O3 -mavx2 -mfma -o /tmp/signed_dot bench/signed_dot.c && taskset -c 0 /tmp/signed_dot
 *
 * Cycles come from a chain of dependent vpaddd (1 cycle each) timed the same way. Variants:
 *   sign    |w| x sign(x, w) by vpmaddubsw, widened per quad by vpmaddwd with ones (the kernels' path)
 *   xorsub  the same with sign(x, w) as (x ^ n) - n, n = (w < 0) kept in the panel (no vpsignb)
 *   int16   codes and activations widened to int16: vpmaddwd + vpaddd per 2 values, no sign
 *   q4_0    4-bit unsigned codes: vpmaddubsw summed in int16 over 8 quads, one vpmaddwd
 * and the cost of a vmaskmovps store against a plain one. On Zen 3 (2026-12-03, 3.2 GHz, quiet to load 5):
 * sign 82-84, xorsub 88-94, int16 79-81, q4_0 41-44; vmaskmovps 13 cycles, vmovups 2. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define M 4
#define NB 16 /* blocks per pass: a K chunk */
#define UNROLL _Pragma("GCC unroll 16")

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline __m256i bc32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* keeps s in registers across the unrolled steps, and its final value observable */
#define PIN(v) __asm__("" : "+x"(v))

/* per block: |w| of both halves at 16 + 8h + t, w (or n) at 8h + t */
__attribute__((noipa)) static __m256i dot_sign(const __m256i *pb, const int8_t *xq, int xorsub) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < NB; b++, pb += 32, xq += 32 * M) {
        __m256i s[M][2];
        UNROLL for (int m = 0; m < M; m++) s[m][0] = s[m][1] = _mm256_setzero_si256();
        UNROLL for (int t = 0; t < 8; t++) {
            const __m256i a0 = _mm256_load_si256(pb + 16 + t), a1 = _mm256_load_si256(pb + 24 + t);
            UNROLL for (int m = 0; m < M; m++) {
                const __m256i x = bc32(xq + 32 * m + 4 * t);
                const __m256i w0 = _mm256_load_si256(pb + t), w1 = _mm256_load_si256(pb + 8 + t);
                const __m256i x0 = xorsub ? _mm256_sub_epi8(_mm256_xor_si256(x, w0), w0) : _mm256_sign_epi8(x, w0);
                const __m256i x1 = xorsub ? _mm256_sub_epi8(_mm256_xor_si256(x, w1), w1) : _mm256_sign_epi8(x, w1);
                s[m][0] = _mm256_add_epi32(s[m][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, x0), ones));
                s[m][1] = _mm256_add_epi32(s[m][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, x1), ones));
                PIN(s[m][0]);
                PIN(s[m][1]);
            }
        }
        UNROLL for (int m = 0; m < M; m++) out = _mm256_xor_si256(out, _mm256_add_epi32(s[m][0], s[m][1]));
    }
    return out;
}

/* per block: pair j of both halves at 2j + h (8 rows x 2 int16 values); x16: 32 int16 per row */
__attribute__((noipa)) static __m256i dot_int16(const __m256i *pb, const int16_t *x16) {
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < NB; b++, pb += 32, x16 += 32 * M) {
        __m256i s[M][2];
        UNROLL for (int m = 0; m < M; m++) s[m][0] = s[m][1] = _mm256_setzero_si256();
        UNROLL for (int j = 0; j < 16; j++) {
            const __m256i w0 = _mm256_load_si256(pb + 2 * j), w1 = _mm256_load_si256(pb + 2 * j + 1);
            UNROLL for (int m = 0; m < M; m++) {
                const __m256i x = bc32(x16 + 32 * m + 2 * j);
                s[m][0] = _mm256_add_epi32(s[m][0], _mm256_madd_epi16(w0, x));
                s[m][1] = _mm256_add_epi32(s[m][1], _mm256_madd_epi16(w1, x));
                PIN(s[m][0]);
                PIN(s[m][1]);
            }
        }
        UNROLL for (int m = 0; m < M; m++) out = _mm256_xor_si256(out, _mm256_add_epi32(s[m][0], s[m][1]));
    }
    return out;
}

/* per block: codes of both halves at 8h + t */
__attribute__((noipa)) static __m256i dot_q4_0(const __m256i *pb, const int8_t *xq) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < NB; b++, pb += 32, xq += 32 * M) {
        __m256i p[M][2];
        UNROLL for (int t = 0; t < 8; t++) {
            const __m256i c0 = _mm256_load_si256(pb + t), c1 = _mm256_load_si256(pb + 8 + t);
            UNROLL for (int m = 0; m < M; m++) {
                const __m256i x = bc32(xq + 32 * m + 4 * t);
                const __m256i v0 = _mm256_maddubs_epi16(c0, x), v1 = _mm256_maddubs_epi16(c1, x);
                p[m][0] = t ? _mm256_add_epi16(p[m][0], v0) : v0;
                p[m][1] = t ? _mm256_add_epi16(p[m][1], v1) : v1;
                PIN(p[m][0]);
                PIN(p[m][1]);
            }
        }
        UNROLL for (int m = 0; m < M; m++)
            out = _mm256_xor_si256(out, _mm256_add_epi32(_mm256_madd_epi16(p[m][0], ones), _mm256_madd_epi16(p[m][1], ones)));
    }
    return out;
}

/* ns per cycle: a chain of dependent vpaddd, one cycle each */
static double ns_per_cycle(void) {
    const long n = 200000000;
    __m256i v = _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi32(1);
    const double t0 = now_ns();
    for (long i = 0; i < n; i += 8) {
        UNROLL for (int k = 0; k < 8; k++) {
            v = _mm256_add_epi32(v, one);
            PIN(v);
        }
    }
    const double t = now_ns() - t0;
    volatile int sink = _mm256_extract_epi32(v, 0);
    (void)sink;
    return t / n;
}

static __m256i pan[32 * NB] __attribute__((aligned(64)));
static int8_t xq[32 * M * NB] __attribute__((aligned(64)));
static int16_t x16[32 * M * NB] __attribute__((aligned(64)));
static float out[65536] __attribute__((aligned(64)));

int main(void) {
    for (int i = 0; i < 32 * NB; i++) pan[i] = _mm256_set1_epi8((char)(i * 7 + 1));
    for (int i = 0; i < 32 * M * NB; i++) xq[i] = (int8_t)(i * 13), x16[i] = (int16_t)(i * 13 % 255 - 127);
    const double cyc = ns_per_cycle();
    const int reps = 100000;
    volatile int sink = 0;
    printf("%.2f GHz\n", 1.0 / cyc);
    for (int round = 0; round < 2; round++) {
        double t[4];
        for (int v = 0; v < 4; v++) {
            const double t0 = now_ns();
            __m256i r = _mm256_setzero_si256();
            for (int k = 0; k < reps; k++)
                r = _mm256_xor_si256(r, v < 2 ? dot_sign(pan, xq, v) : v == 2 ? dot_int16(pan, x16) : dot_q4_0(pan, xq));
            sink += _mm256_extract_epi32(r, 0);
            t[v] = (now_ns() - t0) / reps / NB / cyc;
        }
        printf("cycles per 2048 multiply-adds: sign %.1f  xorsub %.1f  int16 %.1f  q4_0 %.1f\n", t[0], t[1], t[2], t[3]);
    }
    const long n = 20000000;
    const __m256i mask = _mm256_set1_epi32(-1);
    __m256 v = _mm256_set1_ps(1.0f);
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        _mm256_maskstore_ps(out + ((i * 1544) & (65536 - 8)), mask, v);
        __asm__("" : "+x"(v));
    }
    const double tm = (now_ns() - t0) / n / cyc;
    t0 = now_ns();
    for (long i = 0; i < n; i++) {
        _mm256_storeu_ps(out + ((i * 1544) & (65536 - 8)), v);
        __asm__("" : "+x"(v));
    }
    printf("cycles per store: vmaskmovps %.1f  vmovups %.1f\n", tm, (now_ns() - t0) / n / cyc);
    return 0;
}

/* Micro-benchmark (not a test, not part of the build): cores streaming weights in the 32-block GEMV's
 * shape (544-byte Q8_0 group-blocks by default: 8 zmm code loads, 8 activation broadcasts, vpdpbusd, one
 * float step), with the Zen 4 GEMV's software prefetch (every line, into L2, PF bytes ahead) or none,
 * grown step by step toward a decode token: one 300 MB matrix, or the 0.5B's matrices in decode order
 * (seq), on 1 or 2 threads (each a contiguous half of every matrix, a fork and join per matrix as the
 * pool's), optionally with the caller alone for some microseconds between matrices (the small ops) and
 * with each thread asking for the first bytes of its share of the next matrix when its share is done.
 *
 *   gcc -O2 -march=icelake-server -pthread -DPF=16384 -o /tmp/sp bench/stream_prefetch.c
 *   /tmp/sp MODE THREADS SEQ SMALL_US NEXT_BYTES HEAD_BYTES
 *   MODE 0 XORs the code vectors (a plain reader of the same shape), 1 does the GEMV's work; SEQ 0 is one
 *   matrix of the token's bytes, 1 the real shapes; SMALL_US the caller's work alone between matrices;
 *   NEXT_BYTES of the thread's next share asked into L2 at the end of its share; HEAD_BYTES: the first
 *   bytes of each share prefetched at its start (a burst ahead of the distance).
 *   (-DPF=0: no software prefetch; -DBB=288: Q4_0's block size; -DSMALL_PAGES: 4 KB pages)
 *
 * Prints the median over 15 tokens of GB/s of each thread's CPU time (its bytes / its CPU seconds),
 * and the wall-clock GB/s of all threads. Findings: docs/BENCHMARKS.md, "Zen 4 decode, per token" and
 * "Zen 4, evening: the decode stream". */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
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
#define HUGE (2L << 20)
#define PASSES 15
#define MAXM 256

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
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

/* The token: matrices (start, blocks), each cut into nth contiguous shares of whole 16-row groups. */
static const uint8_t *mat_at[MAXM];
static long mat_blocks[MAXM], mat_gblocks[MAXM]; /* blocks, and blocks per 16-row group */
static int n_mats, nth, mode, small_us, next_bytes, head_bytes;
static _Atomic int go_gen, done_count;
static int8_t xq[2048];

static void share(int m, int tid, const uint8_t **p, long *nblk) {
    const long groups = mat_blocks[m] / mat_gblocks[m], g0 = groups * tid / nth, g1 = groups * (tid + 1) / nth;
    *p = mat_at[m] + g0 * mat_gblocks[m] * BB;
    *nblk = (g1 - g0) * mat_gblocks[m];
}

static double cpu_s[2];
static long bytes_t[2];
static float sinks[2];

static void run_token_share(int tid, int m) {
    const uint8_t *p;
    long nb;
    share(m, tid, &p, &nb);
    for (long o = 0; o < head_bytes && o < nb * BB; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T1);
    sinks[tid] += pass(p, nb, xq, mode);
    bytes_t[tid] += nb * BB;
    if (next_bytes && m + 1 < n_mats) {
        share(m + 1, tid, &p, &nb);
        for (long o = 0; o < next_bytes && o < nb * BB; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T1);
    }
}

static void *worker(void *arg) {
    (void)arg;
    int seen = 0;
    for (;;) {
        int g;
        while ((g = atomic_load_explicit(&go_gen, memory_order_acquire)) == seen) _mm_pause();
        seen = g;
        if (g < 0) return NULL;
        const int m = g % (MAXM + 1);
        if (m == MAXM) continue;
        const double c0 = cpu_now();
        run_token_share(1, m);
        cpu_s[1] += cpu_now() - c0;
        atomic_fetch_add_explicit(&done_count, 1, memory_order_release);
    }
}

static void spin_us(int us) {
    const double end = wall_now() + 1e-6 * us;
    while (wall_now() < end) _mm_pause();
}

int main(int argc, char **argv) {
    mode = argc > 1 ? atoi(argv[1]) : 1;
    nth = argc > 2 ? atoi(argv[2]) : 1;
    if (nth < 1 || nth > 2) { /* one worker thread at most: the per-thread arrays hold two */
        fprintf(stderr, "THREADS must be 1 or 2\n");
        return 2;
    }
    const int seq = argc > 3 ? atoi(argv[3]) : 0;
    small_us = argc > 4 ? atoi(argv[4]) : 0;
    next_bytes = argc > 5 ? atoi(argv[5]) : 0;
    head_bytes = argc > 6 ? atoi(argv[6]) : 0;
    /* the 0.5B (Qwen2.5 0.5B) decode's GEMVs: rows x cols per layer (QKV, O, gate+up, down), 24 layers, head */
    static const long layer[4][2] = {{1152, 896}, {896, 896}, {9728, 896}, {896, 4864}};
    long rows[MAXM], cols[MAXM];
    n_mats = 0;
    for (int l = 0; l < 24; l++)
        for (int k = 0; k < 4; k++) rows[n_mats] = layer[k][0], cols[n_mats++] = layer[k][1];
    rows[n_mats] = 151936, cols[n_mats++] = 896;
    long total = 0;
    for (int m = 0; m < n_mats; m++) total += rows[m] / 16 * (cols[m] / 32) * BB;
    if (!seq) { /* one matrix of the same bytes */
        rows[0] = total / BB / (896 / 32) * 16;
        cols[0] = 896;
        n_mats = 1;
    }
    long bytes = 0;
    for (int m = 0; m < n_mats; m++) bytes += (rows[m] / 16 * (cols[m] / 32) * BB + 4095) & ~4095L;
    uint8_t *mem = mmap(NULL, bytes + 2 * HUGE + PF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 1;
    uint8_t *w = (uint8_t *)(((uintptr_t)mem + HUGE - 1) & ~(uintptr_t)(HUGE - 1));
#ifdef SMALL_PAGES
    madvise(w, bytes + PF, MADV_NOHUGEPAGE);
#else
    madvise(w, bytes + PF, MADV_HUGEPAGE);
#endif
    memset(w, 1, bytes + PF);
    for (long o = 0, m = 0; m < n_mats; m++) {
        mat_at[m] = w + o;
        mat_gblocks[m] = cols[m] / 32;
        mat_blocks[m] = rows[m] / 16 * mat_gblocks[m];
        o += (mat_blocks[m] * BB + 4095) & ~4095L;
    }
    memset(xq, 1, sizeof xq);
    pthread_t th;
    if (nth > 1) pthread_create(&th, NULL, worker, NULL);
    double gbs[2][PASSES], wall[PASSES];
    int gen = 0;
    for (int r = 0; r < PASSES; r++) {
        cpu_s[0] = cpu_s[1] = 0;
        bytes_t[0] = bytes_t[1] = 0;
        const double w0 = wall_now();
        for (int m = 0; m < n_mats; m++) {
            if (nth > 1) { /* fork: the worker takes share 1 */
                gen = (gen / (MAXM + 1) + 1) * (MAXM + 1) + m;
                atomic_store_explicit(&done_count, 0, memory_order_relaxed);
                atomic_store_explicit(&go_gen, gen, memory_order_release);
            }
            const double c0 = cpu_now();
            run_token_share(0, m);
            cpu_s[0] += cpu_now() - c0;
            if (nth > 1) /* join */
                while (atomic_load_explicit(&done_count, memory_order_acquire) < 1) _mm_pause();
            if (small_us) spin_us(small_us);
        }
        wall[r] = (double)(bytes_t[0] + bytes_t[1]) / (wall_now() - w0) / 1e9;
        for (int t = 0; t < nth; t++) gbs[t][r] = bytes_t[t] / cpu_s[t] / 1e9;
    }
    if (nth > 1) {
        atomic_store(&go_gen, -1);
        pthread_join(th, NULL);
    }
    for (int t = 0; t < nth; t++) qsort(gbs[t], PASSES, sizeof(double), cmp);
    qsort(wall, PASSES, sizeof(double), cmp);
    printf("mode %d block %d prefetch %d threads %d seq %d small %d us next %d head %d: CPU GB/s per thread", mode,
           BB, PF, nth, seq, small_us, next_bytes, head_bytes);
    for (int t = 0; t < nth; t++) printf(" %.1f", gbs[t][PASSES / 2]);
    printf(", wall %.1f (all threads)%s\n", wall[PASSES / 2], sinks[0] + sinks[1] == 12345.0f ? " " : "");
    return 0;
}

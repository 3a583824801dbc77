/* Read-bandwidth probe (see readbw.h). Each ISA path streams its range with independent
 * accumulators (an XOR of every loaded vector, so no load can be dropped) and prefetches ahead in
 * four ways, each repetition timing all and keeping the fastest: into L1 READ_AHEAD bytes ahead;
 * also into L2 FAR_AHEAD bytes ahead; into L2 only, FAR_ONLY bytes ahead; or not at all. The second
 * reads DRAM up to ~1.4x faster on one core of a Xeon (a prefetch into L1 alone holds one of the core's
 * few line-fill buffers for the whole DRAM latency), the fourth is the fastest on Zen 4 (the hardware
 * prefetchers alone, as most of its GEMVs stream: kernels' common.h), the first can be faster from
 * cache: the bound is whichever a kernel could reach.
 *
 * Timed in each thread's CPU time, not the wall clock: on a shared machine another process took a
 * core for part of a pass, and the wall-clock figure of one 300 MB working set ranged 7-28 GB/s on
 * one thread of a Zen 4 within a minute (the CPU-time one 18-24). A pass's rate is the threads' bytes
 * over their mean CPU time, times the threads: what they read while they run, side by side. */
#include "core/readbw.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/isa.h"
#include "core/state.h"
#include "core/threadpool.h"

#if LLB_X86
#include <immintrin.h>
#endif

#define PAGE_2M ((size_t)2 << 20)
#define UNIT ((size_t)64 << 10) /* bytes per work item: chunks are whole units */
#define CHUNKS 32               /* chunks per call, as a matmul's (matmul.c) */
#define READ_AHEAD 1024         /* software prefetch distance into L1 (bytes) */
#define FAR_AHEAD 4096          /* and into L2, when the pass asks for it */
#define FAR_ONLY 16384          /* into L2 only, the third scheme */
#define SCHEMES 4 /* c.far: 0 near, 1 near and far, 2 far only, 3 none */

typedef struct {
    uint8_t *buf;
    size_t bytes;
    int write; /* the fault-in pass */
    int far;   /* the pass's scheme: 0 near, 1 near and far, 2 far only, 3 none */
    _Alignas(64) uint64_t sink[LLB_POOL_MAX_THREADS][8];
    _Alignas(64) double cpu[LLB_POOL_MAX_THREADS][8]; /* a thread's CPU seconds in the pass */
} bw_ctx;

static uint64_t read_scalar(const uint8_t *p, size_t n, int far) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n; i += 64) {
        if (far == 2) __builtin_prefetch(p + i + FAR_ONLY, 0, 2);
        if (far == 1) __builtin_prefetch(p + i + FAR_AHEAD, 0, 2);
        if (far < 2) __builtin_prefetch(p + i + READ_AHEAD);
        const uint64_t *q = (const uint64_t *)(p + i);
        a ^= q[0] ^ q[4];
        b ^= q[1] ^ q[5];
        c ^= q[2] ^ q[6];
        d ^= q[3] ^ q[7];
    }
    return a ^ b ^ c ^ d;
}

#if LLB_X86
LLB_TARGET_AVX2 static uint64_t read_avx2(const uint8_t *p, size_t n, int far) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        if (far == 2)
            for (int k = 0; k < 2; k++) _mm_prefetch((const char *)(p + i + FAR_ONLY + 64 * k), _MM_HINT_T1);
        if (far == 1)
            for (int k = 0; k < 2; k++) _mm_prefetch((const char *)(p + i + FAR_AHEAD + 64 * k), _MM_HINT_T1);
        if (far < 2) {
            _mm_prefetch((const char *)(p + i + READ_AHEAD), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i + READ_AHEAD + 64), _MM_HINT_T0);
        }
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(x, 0) ^ (uint64_t)_mm256_extract_epi64(x, 3);
}

LLB_TARGET_AVX512 static uint64_t read_avx512(const uint8_t *p, size_t n, int far) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        if (far == 2)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(p + i + FAR_ONLY + 64 * k), _MM_HINT_T1);
        if (far == 1)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(p + i + FAR_AHEAD + 64 * k), _MM_HINT_T1);
        if (far < 2)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(p + i + READ_AHEAD + 64 * k), _MM_HINT_T0);
        a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
        b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
        c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
        d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
    }
    const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_add_epi64(x);
}
#endif

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bw_task(void *ctx, long u0, long u1, int tid) {
    bw_ctx *c = ctx;
    uint8_t *p = c->buf + (size_t)u0 * UNIT;
    size_t n = (size_t)(u1 - u0) * UNIT;
    if ((size_t)u1 * UNIT > c->bytes) n = c->bytes - (size_t)u0 * UNIT; /* the last unit may be short (4 KB steps) */
    if (c->write) {
        memset(p, 0x5A, n);
        return;
    }
    const double t0 = cpu_now();
#if LLB_X86
    const uint64_t r = LLB_PER_ISA(read_scalar(p, n, c->far), read_avx2(p, n, c->far), read_avx512(p, n, c->far));
#else
    const uint64_t r = read_scalar(p, n, c->far);
#endif
    c->sink[tid][0] ^= r;
    c->cpu[tid][0] += cpu_now() - t0;
}

int llb_read_bandwidth(size_t bytes, int threads, int reps, double *gbs) {
    if (bytes < LLB_READBW_MIN_BYTES || bytes > LLB_READBW_MAX_BYTES || threads < 1 || reps < 1) return -2;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && bytes > (size_t)pages * (size_t)page / 2) return -3; /* faulting it in could OOM */
    bytes = (bytes + 4095) & ~(size_t)4095;
    /* 2 MB-aligned, in transparent huge pages where the kernel gives them, as the weight arena. */
    const size_t map = bytes + PAGE_2M;
    uint8_t *raw = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return -1;
    uint8_t *buf = (uint8_t *)(((uintptr_t)raw + PAGE_2M - 1) & ~(uintptr_t)(PAGE_2M - 1));
#ifdef MADV_HUGEPAGE
    madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    bw_ctx c = {0};
    c.buf = buf;
    c.bytes = bytes;
    const long units = (long)((bytes + UNIT - 1) / UNIT);
    const long grain = llb_grain(units, CHUNKS, 1, 1);
    c.write = 1;
    llb_parallel_for(bw_task, &c, units, grain, threads);
    c.write = 0;
    const int nth = threads < llb_pool_threads() ? threads : llb_pool_threads(); /* the fork's (llb_parallel_for) */
    c.far = 2;
    llb_parallel_for(bw_task, &c, units, grain, threads); /* untimed: the clock ramps, the TLB fills */
    for (int r = 0; r < reps; r++) {
        double best = 0;
        for (c.far = 0; c.far < SCHEMES; c.far++) {
            memset(c.cpu, 0, sizeof c.cpu);
            llb_parallel_for(bw_task, &c, units, grain, threads);
            double cpu = 0;
            for (int t = 0; t < LLB_POOL_MAX_THREADS; t++) cpu += c.cpu[t][0];
            const double g = cpu > 0 ? (double)bytes / (cpu / nth) / 1e9 : 0;
            if (g > best) best = g;
        }
        gbs[r] = best;
    }
    munmap(raw, map);
    return 0;
}

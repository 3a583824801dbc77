/* Small helpers shared by the SIMD kernel files (included by them only). */
#ifndef LLB_SIMD_COMMON_H
#define LLB_SIMD_COMMON_H
#include <string.h>

#include "core/simd.h"
#include "matmul/kernels/kernels.h"

#define LLB_AI static inline __attribute__((always_inline))
/* Loops over tile rows / quads must be fully unrolled so their accumulators live in registers. */
#define LLB_UNROLL _Pragma("GCC unroll 16")
/* Software prefetch distance for streamed weights: far enough ahead to cover
 * DRAM latency at ~12 GB/s per core (measured: 14 -> 27 GB/s on 2 threads). */
#ifndef LLB_PF_DIST
#define LLB_PF_DIST 4096
#endif
/* GEMM: values of K per pass, so a group's slice (18-35 KB) and an 8-row activation
 * tile's (16 KB) stay near L1 while the tiles of a work unit reuse them (+6% at K=4864). */
#ifndef LLB_KCHUNK
#define LLB_KCHUNK 2048
#endif

/* One line of streamed weights, LLB_PF_DIST ahead into L1; a GEMV's stream (stream = 1) asks twice,
 * into L2 LLB_PF_DIST ahead and into L1 LLB_PF_NEAR ahead. From DRAM a prefetch into L1 alone holds a
 * line-fill buffer for the whole latency, and the few buffers capped one core near 10 GB/s; L2's queue
 * is deeper, and from there the L1's misses are short (Q4_K's GEMV on 1 thread, 0.76 GB of weights:
 * 10.4 -> 15.5 GB/s of CPU time; further, either alone, or as non-temporal hints: no better). */
#ifndef LLB_PF_NEAR
#define LLB_PF_NEAR 1024
#endif
/* stream = LLB_STREAM_FAR (Zen 4, llb_isa_far_stream; the types not in LLB_HW_STREAM): into L2 only,
 * LLB_PF_FAR ahead. There the L1 prefetch cost more load slots than it saved and 4 KB ahead did not cover
 * the latency (Q4_K's GEMV on 1 thread, 191 MB of weights, GB/s of CPU time: 14.5 both; 15.6 L2 only at
 * 4 KB; 19.8 at 8 KB; 21.5 at 16 KB). */
#ifndef LLB_PF_FAR
#define LLB_PF_FAR 16384
#endif
#define LLB_STREAM 1
#define LLB_STREAM_FAR 2
/* stream = LLB_STREAM_HW (Zen 4, the types of LLB_HW_STREAM): no software prefetch, the hardware prefetchers
 * alone. There a GEMV from DRAM streamed faster without any (1 thread, GB/s of CPU time, alternated, load
 * 6: Q4_0 19.8, 17.6 -> 24.3, 23.3; Q8_0 19.2, 20.3 -> 21.7, 23.6; Q6_K 20.8, 18.9 -> 23.8, 24.2; one 370 MB
 * Q8_0 matrix 21 -> 29) and a whole decode token took 12-21% less CPU (docs/BENCHMARKS.md, "Zen 4, evening:
 * the decode stream"). Q5_K fell from 23.5 to 9.3 without while its bit planes sat after all 8 sub-blocks'
 * nibbles (each sub-block jumped ahead to its plane and back: the hardware prefetchers lost the stream; so did
 * they when a super-block's lines were skipped); in its ascending layout (quants.h) it reads 24-25 without and
 * 29-32 with the L2 prefetch (fast memory state, 1 thread, matrices 16 bytes past a line as the engine now
 * places them: native.weight_skew), so it keeps LLB_STREAM_FAR, as Q5_0, Q5_1, Q2_K and Q3_K do (level
 * either way). */
#define LLB_STREAM_HW 3
/* Both Zen 4 streams (FAR and HW) order after the others, so one comparison asks "on Zen 4". */
_Static_assert(LLB_STREAM_FAR > LLB_STREAM && LLB_STREAM_HW > LLB_STREAM_FAR, "the Zen 4 streams must be the largest");
static inline __attribute__((always_inline)) int llb_stream_on_zen4(const int stream) { return stream >= LLB_STREAM_FAR; }
#define LLB_HW_STREAM(qt)                                                                                      \
    ((qt) == LLB_Q4_0 || (qt) == LLB_Q4_1 || (qt) == LLB_Q8_0 || (qt) == LLB_IQ4_NL || (qt) == LLB_MXFP4 ||   \
     (qt) == LLB_Q4_K || (qt) == LLB_Q6_K || (qt) == LLB_IQ4_XS)
/* A GEMV's stream on Zen 4 (llb_mm.far) for type qt. */
#define LLB_FAR_STREAM_OF(qt) (LLB_HW_STREAM(qt) ? LLB_STREAM_HW : LLB_STREAM_FAR)
static inline __attribute__((always_inline)) void llb_prefetch_line(const uint8_t *p, const int stream) {
    if (stream == LLB_STREAM_HW) return;
    if (stream == LLB_STREAM_FAR) {
        __builtin_prefetch(p + LLB_PF_FAR, 0, 2);
    } else if (stream) {
        __builtin_prefetch(p + LLB_PF_DIST, 0, 2);
        __builtin_prefetch(p + LLB_PF_NEAR, 0, 3);
    } else {
        __builtin_prefetch(p + LLB_PF_DIST, 0, 3);
    }
}

/* Asks for the packed bytes ahead of a block about to be decoded: the weights stream once per call,
 * ahead of the hardware prefetchers (GEMV and GEMM tiles alike; an 8-row decode step ran 1.7x slower
 * without it on 1 thread). */
static inline void llb_prefetch_ahead(const uint8_t *block, int bytes, const int stream) {
    for (int o = 0; o < bytes; o += 64) llb_prefetch_line(block + o, stream);
}

/* A group-block of `bytes` cut into 8 slices of lines, one per sub-block step: the lines a slice holds
 * (per), and the offset of step s's line l (at or past bytes: none). */
#define LLB_SLICE_LINES(bytes) ((((bytes) + 63) / 64 + 7) / 8)
#define LLB_SLICE_AT(per, s, l) (64 * ((per) * (s) + (l)))

/* llb_prefetch_ahead spread over a group-block's 8 sub-block steps: step s (0..7) asks for its
 * eighth of the block's lines, unrolled (as one loop per block it took 13-15% of a hot K-quant
 * GEMV's time on AVX-512). The same lines. */
static inline __attribute__((always_inline)) void llb_prefetch_slice(const uint8_t *block, const int bytes, int s,
                                                                      const int stream) {
    const int per = LLB_SLICE_LINES(bytes);
    _Pragma("GCC unroll 16") for (int l = 0; l < per; l++) {
        const int o = LLB_SLICE_AT(per, s, l);
        if (o < bytes) llb_prefetch_line(block + o, stream);
    }
}

static inline int32_t llb_ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Byte sizes of one packed group-block, as compile-time constants per type. */
#define LLB_GB_BYTES(qt)                                                                                              \
    ((qt) == LLB_Q4_0 ? LLB_GB_Q4_0 : (qt) == LLB_Q4_1 ? LLB_GB_Q4_1 : (qt) == LLB_Q5_0 ? LLB_GB_Q5_0 \
     : (qt) == LLB_Q8_0 ? LLB_GB_Q8_0 : (qt) == LLB_Q4_K ? LLB_GB_Q4_K : (qt) == LLB_Q5_K ? LLB_GB_Q5_K \
     : (qt) == LLB_IQ4_XS ? LLB_GB_IQ4_XS : (qt) == LLB_Q5_1 ? LLB_GB_Q5_1 : (qt) == LLB_IQ4_NL ? LLB_GB_IQ4_NL \
     : (qt) == LLB_MXFP4 ? LLB_GB_MXFP4 : (qt) == LLB_Q2_K ? LLB_GB_Q2_K : (qt) == LLB_Q3_K ? LLB_GB_Q3_K : LLB_GB_Q6_K)

/* The 32-block types (packed as quants.h says): where a group-block's nibble vectors start, whether
 * it carries a min (fp16 m[16] @32), and the offset MXFP4's codes are decoded with (doubled FP4
 * values in [-12, 12] -> [0, 24]: unsigned for vpdpbusd, 4 quads per int16 sum in AVX2's). */
#define LLB_NIBBLES32(qt) ((qt) == LLB_Q4_1 || (qt) == LLB_Q5_1 ? 64 : (qt) == LLB_MXFP4 ? LLB_MXFP4_CODES : 32)
#define LLB_HAS_MIN32(qt) ((qt) == LLB_Q4_1 || (qt) == LLB_Q5_1)
#define LLB_MXFP4_OFF 12
/* The zero point of a 32-block type's decoded unsigned codes (weight = d * (code - offset)); 0 for the others. */
#define LLB_CODE_OFF32(qt) \
    ((qt) == LLB_Q4_0 ? 8 : (qt) == LLB_Q5_0 ? 16 : (qt) == LLB_Q8_0 || (qt) == LLB_IQ4_NL ? 128 : (qt) == LLB_MXFP4 ? LLB_MXFP4_OFF : 0)

/* The tiles of activation rows [i0, i1) (a work unit's): TILE(i, M) for M = TOP (LLB_XT or half) while
 * TOP rows are left, then the rest as tiles of 4, 2, 1 (each at most once). M is a literal at every
 * call, so a tile's arrays stay in registers; the tiles of 8 or 4 never cross an activation tile. */
#define LLB_TILE_LADDER(i0, i1, TOP, TILE)                    \
    do {                                                      \
        long i_ = (i0);                                       \
        for (; i_ + (TOP) <= (i1); i_ += (TOP)) TILE(i_, TOP); \
        if ((TOP) > 4 && (i1) - i_ >= 4) {                    \
            TILE(i_, 4);                                      \
            i_ += 4;                                          \
        }                                                     \
        if ((i1) - i_ >= 2) {                                 \
            TILE(i_, 2);                                      \
            i_ += 2;                                          \
        }                                                     \
        if ((i1) - i_ >= 1) TILE(i_, 1);                      \
    } while (0)

/* Groups a pair tile covers (two 16-row groups sharing each activation broadcast). */
#define LLB_MAXG 2

/* The group's summed rows for one activation row from the [quad][row][j] accumulator layout
 * of the exact kernels: out[r] = sum_j acc[4r + j]. */
static inline void llb_store_quad_sums(const float *acc, float *out, int nr) {
    for (int r = 0; r < nr; r++) out[r] = (acc[4 * r] + acc[4 * r + 1]) + (acc[4 * r + 2] + acc[4 * r + 3]);
}

#endif

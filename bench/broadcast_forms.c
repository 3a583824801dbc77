/* Micro-benchmark (not a test, not part of the build) of how AVX-512 VNNI takes its activation broadcasts:
 * vpdpbusd with a {1toN} memory operand ("folded", as the Intel-tuned 32-block tiles) against a separate
 * vpbroadcastd feeding 1..12 vpdpbusd ("split", llb_isa_split_broadcast's form), zmm and ymm, data in L1.
 *
 *   gcc -O2 -o /tmp/broadcast_forms bench/broadcast_forms.c && taskset -c 1 /tmp/broadcast_forms
 *
 * ns per vpdpbusd (cycles from a chain of dependent adds timed the same way), 24 independent chains unless
 * said. On Zen 4 (2026-12-04, 3.6 GHz, load 1.4-7): folded zmm 0.27 ns (1.0 cycle) with 12 or 24 chains,
 * split zmm the same for 1-8 multiplies a broadcast; ymm 0.135 either way (the same multiply-adds a second:
 * Zen 4 runs a zmm as two ymm halves); vpbroadcastd alone 2 a cycle. No penalty for the folded form here. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define S(x) #x
#define REP4(a) a a a a
/* one multiply on chain c (register zmm<c>) with weights in zmm30: folded broadcast of x + 4c */
#define FOLD(R, N, c) "vpdpbusd " S(c) "*4(%[x])%{1to" S(N) "%}, %%" R "30, %%" R S(c) "\n\t"
#define BC(R, b) "vpbroadcastd " S(b) "*4(%[x]), %%" R "28\n\t"
#define DP(R, c) "vpdpbusd %%" R "28, %%" R "30, %%" R S(c) "\n\t"

#define FOLD12(R, N) FOLD(R, N, 0) FOLD(R, N, 1) FOLD(R, N, 2) FOLD(R, N, 3) FOLD(R, N, 4) FOLD(R, N, 5) \
    FOLD(R, N, 6) FOLD(R, N, 7) FOLD(R, N, 8) FOLD(R, N, 9) FOLD(R, N, 10) FOLD(R, N, 11)
#define FOLD24(R, N) FOLD12(R, N) FOLD(R, N, 12) FOLD(R, N, 13) FOLD(R, N, 14) FOLD(R, N, 15) FOLD(R, N, 16) \
    FOLD(R, N, 17) FOLD(R, N, 18) FOLD(R, N, 19) FOLD(R, N, 20) FOLD(R, N, 21) FOLD(R, N, 22) FOLD(R, N, 23)
/* 24 chains, one broadcast per 1, 2, 4, 8, 12 multiplies */
#define SPLIT1(R) BC(R,0) DP(R,0) BC(R,1) DP(R,1) BC(R,2) DP(R,2) BC(R,3) DP(R,3) BC(R,4) DP(R,4) BC(R,5) DP(R,5) \
    BC(R,6) DP(R,6) BC(R,7) DP(R,7) BC(R,8) DP(R,8) BC(R,9) DP(R,9) BC(R,10) DP(R,10) BC(R,11) DP(R,11) \
    BC(R,12) DP(R,12) BC(R,13) DP(R,13) BC(R,14) DP(R,14) BC(R,15) DP(R,15) BC(R,16) DP(R,16) BC(R,17) DP(R,17) \
    BC(R,18) DP(R,18) BC(R,19) DP(R,19) BC(R,20) DP(R,20) BC(R,21) DP(R,21) BC(R,22) DP(R,22) BC(R,23) DP(R,23)
#define SPLIT2(R) BC(R,0) DP(R,0) DP(R,1) BC(R,1) DP(R,2) DP(R,3) BC(R,2) DP(R,4) DP(R,5) BC(R,3) DP(R,6) DP(R,7) \
    BC(R,4) DP(R,8) DP(R,9) BC(R,5) DP(R,10) DP(R,11) BC(R,6) DP(R,12) DP(R,13) BC(R,7) DP(R,14) DP(R,15) \
    BC(R,8) DP(R,16) DP(R,17) BC(R,9) DP(R,18) DP(R,19) BC(R,10) DP(R,20) DP(R,21) BC(R,11) DP(R,22) DP(R,23)
#define SPLIT4(R) BC(R,0) DP(R,0) DP(R,1) DP(R,2) DP(R,3) BC(R,1) DP(R,4) DP(R,5) DP(R,6) DP(R,7) \
    BC(R,2) DP(R,8) DP(R,9) DP(R,10) DP(R,11) BC(R,3) DP(R,12) DP(R,13) DP(R,14) DP(R,15) \
    BC(R,4) DP(R,16) DP(R,17) DP(R,18) DP(R,19) BC(R,5) DP(R,20) DP(R,21) DP(R,22) DP(R,23)
#define SPLIT8(R) BC(R,0) DP(R,0) DP(R,1) DP(R,2) DP(R,3) DP(R,4) DP(R,5) DP(R,6) DP(R,7) \
    BC(R,1) DP(R,8) DP(R,9) DP(R,10) DP(R,11) DP(R,12) DP(R,13) DP(R,14) DP(R,15) \
    BC(R,2) DP(R,16) DP(R,17) DP(R,18) DP(R,19) DP(R,20) DP(R,21) DP(R,22) DP(R,23)
#define BCAST24(R) BC(R,0) BC(R,1) BC(R,2) BC(R,3) BC(R,4) BC(R,5) BC(R,6) BC(R,7) BC(R,8) BC(R,9) BC(R,10) \
    BC(R,11) BC(R,12) BC(R,13) BC(R,14) BC(R,15) BC(R,16) BC(R,17) BC(R,18) BC(R,19) BC(R,20) BC(R,21) BC(R,22) BC(R,23)

#define BENCH(name, body, per)                                                  \
    static double name(long it, const void *x) {                                \
        double t0 = now();                                                      \
        for (long i = 0; i < it; i++) __asm__ volatile(body body : : [x] "r"(x) : "memory"); \
        return (now() - t0) / ((double)it * 2 * (per));                         \
    }
BENCH(fold_z12, FOLD12("zmm", 16), 12)
BENCH(fold_z24, FOLD24("zmm", 16), 24)
BENCH(split_z1, SPLIT1("zmm"), 24)
BENCH(split_z2, SPLIT2("zmm"), 24)
BENCH(split_z4, SPLIT4("zmm"), 24)
BENCH(split_z8, SPLIT8("zmm"), 24)
BENCH(fold_y24, FOLD24("ymm", 8), 24)
BENCH(split_y1, SPLIT1("ymm"), 24)
BENCH(split_y4, SPLIT4("ymm"), 24)
BENCH(bcast_z, BCAST24("zmm"), 24)

static double adds(long it) {
    double t0 = now();
    long a = 0;
    for (long i = 0; i < it; i++) __asm__ volatile(REP4(REP4("add $1, %0\n\t")) : "+r"(a));
    return (now() - t0) / ((double)it * 16);
}

int main(int argc, char **argv) {
    static __attribute__((aligned(64))) unsigned char x[256];
    for (int i = 0; i < 256; i++) x[i] = (unsigned char)(i * 7);
    const long it = argc > 1 ? atol(argv[1]) : 400000;
    double cyc = 1e9;
    for (int r = 0; r < 3; r++) { const double c = adds(it * 8); if (c < cyc) cyc = c; }
    printf("~%.2f GHz (a chain of dependent adds)\n", 1e-9 / cyc);
    struct { const char *name; double (*fn)(long, const void *); } v[] = {
        {"folded zmm {1to16}, 12 chains", fold_z12}, {"folded zmm {1to16}, 24 chains", fold_z24},
        {"split zmm, 1 multiply a broadcast", split_z1}, {"split zmm, 2 a broadcast", split_z2},
        {"split zmm, 4 a broadcast", split_z4}, {"split zmm, 8 a broadcast", split_z8},
        {"folded ymm {1to8}, 24 chains", fold_y24}, {"split ymm, 1 a broadcast", split_y1},
        {"split ymm, 4 a broadcast", split_y4}, {"vpbroadcastd zmm alone (per broadcast)", bcast_z}};
    for (unsigned k = 0; k < sizeof v / sizeof v[0]; k++) {
        double best = 1e9;
        for (int r = 0; r < 5; r++) { const double t = v[k].fn(it, x); if (t < best) best = t; }
        printf("%-40s %.3f ns  %.2f cycles\n", v[k].name, best * 1e9, best / cyc);
    }
    return 0;
}

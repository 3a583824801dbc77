/* The machine's read bandwidth, measured the way a decode step reads its weights: a buffer of
 * the working set's size in 2 MB pages, streamed with the widest loads the active ISA has (and
 * software prefetch, near into L1, also far into L2 or far into L2 only, whichever is fastest), split over
 * the thread pool (llb_parallel_for, the matmul's chunking), every byte once per repetition, timed in the
 * threads' CPU time (a shared machine's other processes do not lower it). What a GEMV over that many
 * bytes could reach at best while its threads run: the bound its GB/s is compared with. */
#ifndef LLB_READBW_H
#define LLB_READBW_H
#include <stddef.h>

/* Smallest and largest buffer the probe takes (bytes). */
#define LLB_READBW_MIN_BYTES ((size_t)1 << 20)
#define LLB_READBW_MAX_BYTES ((size_t)1 << 40)

/* Read `bytes` (rounded up to 4 KB) `reps` times on at most `threads` threads of the pool, after
 * one pass that faults the pages in and one untimed read; gbs[i] = GB/s (1e9 bytes) of repetition i: the
 * fastest of its passes, one per prefetch scheme, each `threads` x bytes / the threads' CPU seconds.
 * Returns 0,
 * -1 when the buffer could not be allocated, -2 on arguments out of range (bytes outside
 * [LLB_READBW_MIN_BYTES, LLB_READBW_MAX_BYTES], threads < 1, reps < 1), -3 when bytes exceed half the
 * machine's physical memory (the probe writes every page: the OOM killer, not an error, would answer). */
int llb_read_bandwidth(size_t bytes, int threads, int reps, double *gbs);

#endif

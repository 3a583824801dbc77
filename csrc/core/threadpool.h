/* Persistent worker pool shared by every op.
 *
 * llb_parallel_for(fn, ctx, n, grain, max_threads) runs fn(ctx, begin, end, tid) over
 * [0, n) in chunks of `grain` items that the threads claim one at a time (each from its
 * own contiguous share first, then from the others'), and returns when every chunk is
 * done. The caller (tid 0) claims chunks like
 * any worker and never waits for a worker that has not started: on a busy machine a
 * descheduled worker simply gets no chunks, and the threads that run do its share. Only
 * a chunk a worker already holds is waited for (in a redo call not even that, see
 * llb_parallel_for_redo), so chunks should be small (a few per thread); when such a wait shows a worker being descheduled mid-chunk, the pool runs the
 * next calls on the caller alone for a few milliseconds (longer while it recurs). Chunk boundaries are multiples of grain from 0 whatever the thread count:
 * a result may depend on the chunking, never on which thread ran a chunk or how many
 * there are. Between calls workers spin for a while before sleeping, so a decode step's
 * ~400 ops do not each pay a futex wake-up. */
#ifndef LLB_THREADPOOL_H
#define LLB_THREADPOOL_H

#define LLB_POOL_MAX_THREADS 256

/* Items [begin, end) on thread tid (0 <= tid < max_threads and < the pool's size). tid
 * indexes per-thread scratch; the same tid may run many chunks of one call. */
typedef void (*llb_range_fn)(void *ctx, long begin, long end, int tid);

/* (Re)create the pool with n threads in total (1 <= n <= LLB_POOL_MAX_THREADS). Returns 0 on
 * success. Waits for a running call to finish: the size never changes under one. */
int llb_pool_init(int n_threads);
/* Threads in the pool (1 when never initialised). Another Python thread may resize the pool
 * right after this returns: use it to decide, and pass what per-thread state was sized for
 * as max_threads. */
int llb_pool_threads(void);
/* Run fn over [0, n) in chunks of grain (>= 1) on at most max_threads threads; blocking.
 * A call made from inside a task runs serially on the calling thread (tid 0). */
void llb_parallel_for(llb_range_fn fn, void *ctx, long n, long grain, int max_threads);
/* llb_parallel_for for a fn whose chunks may run twice, and be abandoned midway: each chunk
 * writes only its own outputs, out of place (never its inputs), the same bits whichever thread
 * runs it, takes no lock and allocates nothing. When a worker is still in a chunk 30 us (plus
 * two chunks' time) after the caller ran out of chunks (the OS parked it), the caller signals
 * it to abandon the chunk and runs the chunk itself instead of waiting out a scheduler slice.
 * LLAMBDA_POOL_REDO=0 makes it a plain llb_parallel_for. */
void llb_parallel_for_redo(llb_range_fn fn, void *ctx, long n, long grain, int max_threads);
/* The grain that cuts n items into about `chunks` chunks of at least min_grain items,
 * a multiple of align: from the sizes only, never the thread count. */
long llb_grain(long n, long chunks, long min_grain, long align);

/* Cap the threads of the calls this thread makes from now on at n (0: no cap, the pool's
 * size); returns the previous cap. Results never depend on it (chunks come from the sizes):
 * the decode loop uses it to run a step on fewer threads when that is faster (a busy machine). */
int llb_pool_cap_thread(int n);
/* llb_pool_cap_thread that never loosens the cap this thread has (a model's, around its
 * forward): the cap becomes n if n is tighter, or if there was none; returns the previous cap. */
int llb_pool_cap_thread_within(int n);
/* Threads a call from this thread can count on now: the pool's size under this thread's cap; 1
 * inside a task, while the pool runs calls on the caller alone (after a stall) and while it sees
 * the machine busy (a worker absent from a call or stalled in the last second). A hint for work
 * whose results do not depend on how it is cut. */
int llb_pool_call_threads(void);

/* Calls so far in which a worker stalled in its chunk (descheduled), each followed by a
 * while of running calls on the caller alone (see threadpool.c). */
long llb_pool_stalls(void);

/* Counters since the process started, for benchmarks: out[0..n) gets, in this order, the calls
 * run on several threads, the calls the back-off ran on the caller alone, stalls, parallel calls
 * whose caller waited more than 20 us at the join (its own chunks done), the total and the longest
 * of those join waits (us, over all parallel calls), the caller's time in its own chunks (us),
 * chunks a thread ran from another's share, chunks the workers (tid >= 1) ran, and how often a
 * worker went to sleep waiting for a call, and the calls the caller ran alone though its workers
 * were awake (not on a CPU), and the chunks the caller took over from a parked worker (redo
 * calls). Returns how many it wrote (at most LLB_POOL_STATS). */
#define LLB_POOL_STATS 12
int llb_pool_stats(long *out, int n);

/* Test hook: the most threads a call from this thread was given (the pool's size under the
 * call's max_threads and this thread's cap) since the last llb_pool_widest on it; 0 when none of
 * its calls reached the pool (one chunk, or one thread allowed). Resets it. */
int llb_pool_widest(void);

/* Test hook: worker `tid` (>= 1) stops before claiming anything until released with 0 or
 * 10 s pass; returns how many holds timed out since the last call. See tests/test_threadpool.py. */
int llb_pool_hold_worker(int tid);

#endif

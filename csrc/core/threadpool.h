/* Persistent worker pool shared by every op.
 *
 * llb_parallel(fn, ctx) runs fn(ctx, ith, nth) on every thread of the pool
 * (the caller is thread 0) and returns when all have finished. Between calls
 * workers spin for a while before sleeping, so a decode step's ~400 ops do
 * not each pay a futex wake-up. */
#ifndef LLB_THREADPOOL_H
#define LLB_THREADPOOL_H

typedef void (*llb_task_fn)(void *ctx, int ith, int nth);

#define LLB_POOL_MAX_THREADS 256

/* (Re)create the pool with n threads in total (1 <= n <= LLB_POOL_MAX_THREADS). Returns 0 on
 * success. Waits for a running llb_parallel call to finish: the size never changes under one. */
int llb_pool_init(int n_threads);
/* Threads in the pool (1 when never initialised). Another Python thread may resize the pool
 * right after this returns: use it to decide, never to size per-thread state (see below). */
int llb_pool_threads(void);
/* Run fn on all threads; blocking. Safe to call with a 1-thread pool. fn must not index
 * anything by ith that was sized from an earlier llb_pool_threads(). */
void llb_parallel(llb_task_fn fn, void *ctx);
/* The same on at most max_nth threads (nth <= max_nth, ith < nth): for tasks whose per-thread
 * buffers were sized for max_nth threads, which the pool may have outgrown since. */
void llb_parallel_upto(llb_task_fn fn, void *ctx, int max_nth);
/* Split [0, n) into nth near-equal parts, rounding boundaries to multiples of `align`. */
void llb_split(long n, long align, int ith, int nth, long *begin, long *end);

#endif

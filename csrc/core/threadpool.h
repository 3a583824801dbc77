/* Persistent worker pool shared by every op.
 *
 * llb_parallel(fn, ctx) runs fn(ctx, ith, nth) on every thread of the pool
 * (the caller is thread 0) and returns when all have finished. Between calls
 * workers spin for a while before sleeping, so a decode step's ~400 ops do
 * not each pay a futex wake-up. */
#ifndef LLB_THREADPOOL_H
#define LLB_THREADPOOL_H

typedef void (*llb_task_fn)(void *ctx, int ith, int nth);

/* (Re)create the pool with n threads in total (n >= 1). Returns 0 on success. */
int llb_pool_init(int n_threads);
/* Threads in the pool (1 when never initialised). */
int llb_pool_threads(void);
/* Run fn on all threads; blocking. Safe to call with a 1-thread pool. */
void llb_parallel(llb_task_fn fn, void *ctx);
/* Split [0, n) into nth near-equal parts, rounding boundaries to multiples of `align`. */
void llb_split(long n, long align, int ith, int nth, long *begin, long *end);

#endif

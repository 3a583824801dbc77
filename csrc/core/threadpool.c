/* Persistent worker pool with a spin-then-sleep wait between calls.
 *
 * Fork: the caller publishes (fn, ctx), bumps `generation`; workers that are
 * spinning see it within ~100 ns. Workers that spun longer than the spin
 * budget without work sleep on a condition variable, and the caller pays a
 * broadcast (~30 us wake-up) only then. Join: each worker bumps `finished`;
 * the caller (thread 0) runs its share, then waits for finished == nth - 1.
 *
 * One call at a time: a mutex serialises callers (two Python threads may run
 * ops at once), and a call made from inside a task (any pool thread, or the
 * caller while it runs its share) runs serially as fn(ctx, 0, 1). */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "core/isa.h"

#if LLB_X86
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define MAX_THREADS LLB_POOL_MAX_THREADS

/* How long an idle worker spins before sleeping (microseconds). Overridable
 * with LLAMBDA_SPIN_US: 0 sleeps at once (no idle CPU burn, ~30 us per op). */
static long spin_budget_ns = 200 * 1000;

struct pool {
    /* One cache line written by the caller per call: the worker that sees the
     * new generation finds the task in the same line. */
    _Alignas(64) atomic_uint generation;
    llb_task_fn fn;
    void *ctx;
    int active;                /* threads that run this call's fn (ith < active); the others only join */
    _Atomic int nth;           /* threads in the pool; written under call_lock, read anywhere */
    _Alignas(64) atomic_int finished;
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    pthread_t workers[MAX_THREADS];
    int n_workers;             /* running workers = nth - 1 */
    unsigned spawn_generation; /* generation when the workers were created */
};

static struct pool pool = {.active = 1, .nth = 1};
/* Serialises llb_parallel callers and pool resizes. */
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int inside_task;
static int atexit_registered;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wait until generation differs from seen (or stop); spin first, then sleep. */
static unsigned wait_for_work(unsigned seen) {
    unsigned g;
    uint64_t start = 0;
    for (unsigned i = 1;; i++) {
        g = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        /* Yield now and then: on an oversubscribed machine the caller may share this
         * CPU, and a worker spinning out its whole budget would delay every op by it. */
        if ((i & 1023) == 0) sched_yield();
        if ((i & 127) == 0) {
            uint64_t t = now_ns();
            if (!start) start = t;
            else if (t - start >= (uint64_t)spin_budget_ns) break;
        }
    }
    pthread_mutex_lock(&pool.sleep_lock);
    /* seq_cst pairs with the caller's generation bump + sleepers check: either
     * we see the new generation here, or the caller sees us sleeping. */
    atomic_fetch_add(&pool.sleepers, 1);
    while ((g = atomic_load(&pool.generation)) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
    atomic_fetch_sub(&pool.sleepers, 1);
    pthread_mutex_unlock(&pool.sleep_lock);
    return g;
}

static void *worker_main(void *arg) {
    const int ith = (int)(intptr_t)arg;
    inside_task = 1; /* a pool thread never forks the pool again */
    unsigned seen = pool.spawn_generation; /* not the live value: a call may already be published */
    for (;;) {
        seen = wait_for_work(seen);
        if (atomic_load_explicit(&pool.stop, memory_order_acquire)) break;
        if (ith < pool.active) pool.fn(pool.ctx, ith, pool.active);
        atomic_fetch_add_explicit(&pool.finished, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void publish_generation(void) {
    atomic_fetch_add(&pool.generation, 1); /* seq_cst: see wait_for_work */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
}

/* Stop and join all workers; call_lock held. */
static void stop_workers(void) {
    if (pool.n_workers == 0) return;
    atomic_store(&pool.stop, 1);
    publish_generation();
    for (int i = 0; i < pool.n_workers; i++) pthread_join(pool.workers[i], NULL);
    pool.n_workers = 0;
    atomic_store(&pool.nth, 1);
    atomic_store(&pool.stop, 0);
}

static void shutdown_at_exit(void) {
    pthread_mutex_lock(&call_lock);
    stop_workers();
    pthread_mutex_unlock(&call_lock);
}

/* In a forked child only the forking thread exists: forget the workers. */
static _Thread_local int locked_for_fork;
static void prepare_fork(void) {
    /* Wait for a running call to finish, unless this thread is the one running it. */
    if (!inside_task) {
        pthread_mutex_lock(&call_lock);
        locked_for_fork = 1;
    }
}
static void parent_after_fork(void) {
    if (locked_for_fork) pthread_mutex_unlock(&call_lock);
    locked_for_fork = 0;
}
static void child_after_fork(void) {
    locked_for_fork = 0;
    pool.n_workers = 0;
    atomic_store(&pool.nth, 1);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.stop, 0);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_mutex_init(&call_lock, NULL);
}

static void read_spin_env(void) {
    const char *s = getenv("LLAMBDA_SPIN_US");
    if (!s || !*s) return;
    char *end;
    long us = strtol(s, &end, 10);
    if (*end == 0 && us >= 0 && us <= 1000000) spin_budget_ns = us * 1000;
}

int llb_pool_init(int n_threads) {
    if (n_threads < 1 || n_threads > MAX_THREADS) return -1;
    pthread_mutex_lock(&call_lock);
    if (!atexit_registered) {
        atexit_registered = 1;
        pthread_mutex_init(&pool.sleep_lock, NULL);
        pthread_cond_init(&pool.wake, NULL);
        read_spin_env();
        atexit(shutdown_at_exit);
        pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
    }
    int rc = 0;
    if (n_threads != atomic_load(&pool.nth)) {
        stop_workers();
        pool.spawn_generation = atomic_load(&pool.generation);
        for (int i = 1; i < n_threads; i++) {
            if (pthread_create(&pool.workers[i - 1], NULL, worker_main, (void *)(intptr_t)i) != 0) {
                rc = -1;
                break;
            }
            pool.n_workers = i;
        }
        if (rc != 0) stop_workers(); /* all or nothing: back to 1 thread */
        else atomic_store(&pool.nth, n_threads);
    }
    pthread_mutex_unlock(&call_lock);
    return rc;
}

int llb_pool_threads(void) { return atomic_load_explicit(&pool.nth, memory_order_relaxed); }

void llb_parallel_upto(llb_task_fn fn, void *ctx, int max_nth) {
    if (inside_task || max_nth <= 1) { /* nested call: run serially, never wait on ourselves */
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&call_lock);
    /* Read under the lock: llb_pool_init cannot change it until this call returns. */
    const int nth = atomic_load_explicit(&pool.nth, memory_order_relaxed);
    const int active = nth < max_nth ? nth : max_nth;
    inside_task = 1;
    if (active == 1) {
        fn(ctx, 0, 1);
    } else {
        pool.fn = fn;
        pool.ctx = ctx;
        pool.active = active;
        atomic_store_explicit(&pool.finished, 0, memory_order_relaxed);
        publish_generation();
        fn(ctx, 0, active);
        /* Join: spin briefly, then yield so an oversubscribed worker can run. */
        for (unsigned i = 0; atomic_load_explicit(&pool.finished, memory_order_acquire) != nth - 1; i++) {
            if (i < 4000) cpu_relax();
            else sched_yield();
        }
    }
    inside_task = 0;
    pthread_mutex_unlock(&call_lock);
}

void llb_parallel(llb_task_fn fn, void *ctx) { llb_parallel_upto(fn, ctx, MAX_THREADS); }

void llb_split(long n, long align, int ith, int nth, long *begin, long *end) {
    if (align < 1) align = 1;
    if (nth < 1) nth = 1;
    const long units = (n + align - 1) / align;
    const long b = units * ith / nth, e = units * (ith + 1) / nth;
    *begin = b * align < n ? b * align : n;
    *end = e * align < n ? e * align : n;
}

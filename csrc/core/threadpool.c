/* Persistent worker pool: chunks claimed from a shared counter, a spin-then-sleep
 * wait between calls and at the join.
 *
 * Fork: the caller publishes the task and a claim word (generation << 32 | next
 * chunk), then bumps `generation`; workers that are spinning see it within
 * ~100 ns, workers that spun out their budget sleep on a condition variable and
 * the caller pays a broadcast (~30 us wake-up) only then. Every thread, the
 * caller too, claims chunks by compare-and-swap on the claim word: a claim only
 * succeeds while the word still carries the call's generation, so a worker that
 * wakes up late (descheduled on a busy machine) finds the word moved on and
 * touches nothing of a call that has returned. Join: the caller waits until the
 * count of finished chunks reaches the number of chunks; it never waits for a
 * worker that holds none. It spins briefly, then sleeps: a worker preempted in
 * the middle of a chunk may then run on the caller's core instead of waiting
 * behind whatever preempted it.
 *
 * One call at a time: a mutex serialises callers (two Python threads may run
 * ops at once), and a call made from inside a task runs serially. */
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
/* How long the caller spins for workers' last chunks before sleeping: a running
 * worker finishes a chunk in microseconds; one that is not running needs the core. */
#define JOIN_SPIN_NS (30 * 1000)

struct pool {
    _Alignas(64) atomic_uint generation;
    /* The call: the claim word, then what a successful claim may read. */
    _Alignas(64) _Atomic uint64_t claim; /* generation << 32 | next chunk */
    atomic_long n_chunks;                /* read before a claim, hence atomic */
    atomic_int active;                   /* threads that may claim (tid < active) */
    llb_range_fn fn;
    void *ctx;
    long n, grain;
    _Alignas(64) atomic_long done; /* chunks finished in this call */
    atomic_int caller_sleeping;
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    _Atomic int nth;               /* threads in the pool; written under call_lock, read anywhere */
    pthread_mutex_t sleep_lock, join_lock;
    pthread_cond_t wake, joined;
    pthread_t workers[MAX_THREADS];
    int n_workers;             /* running workers = nth - 1 */
    unsigned spawn_generation; /* generation when the workers were created */
};

static struct pool pool = {.nth = 1};
/* Serialises callers and pool resizes. */
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int inside_task;
static int atexit_registered;
/* Test hook (llb_pool_hold_worker). */
static atomic_int hold_tid, hold_timeouts;

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

/* Claim and run chunks of call `gen` as thread tid until none is left (or the call is over);
 * returns how many it ran. */
static long run_chunks(unsigned gen, int tid) {
    long ran = 0;
    for (;;) {
        uint64_t e = atomic_load_explicit(&pool.claim, memory_order_acquire);
        if ((unsigned)(e >> 32) != gen) return ran;
        const long chunk = (long)(uint32_t)e, n_chunks = atomic_load_explicit(&pool.n_chunks, memory_order_relaxed);
        if (chunk >= n_chunks || tid >= atomic_load_explicit(&pool.active, memory_order_relaxed)) return ran;
        /* A stale n_chunks or active (a newer call's) goes with a changed word: the CAS fails. */
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &e, e + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        ran++;
        /* The call cannot end before this chunk is counted: its fields are live. */
        const long b = chunk * pool.grain, end = b + pool.grain < pool.n ? b + pool.grain : pool.n;
        pool.fn(pool.ctx, b, end, tid);
        /* seq_cst with the caller_sleeping check: see join(). */
        if (atomic_fetch_add(&pool.done, 1) + 1 == n_chunks && atomic_load(&pool.caller_sleeping)) {
            pthread_mutex_lock(&pool.join_lock);
            pthread_cond_broadcast(&pool.joined);
            pthread_mutex_unlock(&pool.join_lock);
        }
    }
}

static void hold_if_asked(int tid) {
    if (atomic_load_explicit(&hold_tid, memory_order_relaxed) != tid) return;
    const uint64_t deadline = now_ns() + 10ull * 1000000000u;
    const struct timespec ms = {0, 1000000};
    while (atomic_load(&hold_tid) == tid) {
        if (now_ns() >= deadline) {
            atomic_fetch_add(&hold_timeouts, 1);
            break;
        }
        nanosleep(&ms, NULL);
    }
}

static void *worker_main(void *arg) {
    const int tid = (int)(intptr_t)arg;
    inside_task = 1; /* a pool thread never forks the pool again */
    unsigned seen = pool.spawn_generation; /* not the live value: a call may already be published */
    for (;;) {
        seen = wait_for_work(seen);
        if (atomic_load_explicit(&pool.stop, memory_order_acquire)) break;
        hold_if_asked(tid);
        run_chunks(seen, tid);
    }
    return NULL;
}

/* Stalls: a call whose caller, its own chunks done, waited far longer than a chunk takes for
 * a worker's last one. That worker was descheduled in the middle of its chunk (the machine is
 * busy), and it will be again: for a while (solo_ns, doubling while stalls recur) the caller
 * runs calls alone, at one thread's speed, instead of waiting a scheduler slice each time.
 * Read and written under call_lock. */
#define STALL_MIN_NS (300 * 1000)
#define SOLO_MIN_NS (2 * 1000 * 1000)
#define SOLO_MAX_NS (256 * 1000 * 1000)
static uint64_t solo_until, solo_ns = SOLO_MIN_NS, last_stall;
static long stalls;

static void note_join(uint64_t start, uint64_t claimed, uint64_t end, long ran) {
    const uint64_t chunk = ran > 0 ? (claimed - start) / (uint64_t)ran : 0;
    if (end - claimed > STALL_MIN_NS + 4 * chunk) {
        stalls++;
        /* A stall soon after the last solo period: the contention persists, stay away longer. */
        if (last_stall && start - last_stall < 4 * solo_ns) solo_ns = solo_ns * 2 < SOLO_MAX_NS ? solo_ns * 2 : SOLO_MAX_NS;
        else solo_ns = SOLO_MIN_NS;
        last_stall = end;
        solo_until = end + solo_ns;
    }
}

/* Wait until every chunk is done: spin, then sleep until the last chunk's worker wakes us. */
static void join(long n_chunks) {
    uint64_t start = 0;
    for (unsigned i = 1; atomic_load_explicit(&pool.done, memory_order_acquire) != n_chunks; i++) {
        cpu_relax();
        if ((i & 63) == 0) {
            const uint64_t t = now_ns();
            if (!start) start = t;
            else if (t - start >= JOIN_SPIN_NS) break;
        }
    }
    if (atomic_load_explicit(&pool.done, memory_order_acquire) == n_chunks) return;
    pthread_mutex_lock(&pool.join_lock);
    atomic_store(&pool.caller_sleeping, 1); /* seq_cst: see run_chunks */
    while (atomic_load(&pool.done) != n_chunks) pthread_cond_wait(&pool.joined, &pool.join_lock);
    atomic_store(&pool.caller_sleeping, 0);
    pthread_mutex_unlock(&pool.join_lock);
}

static void publish_generation(unsigned g) {
    atomic_store(&pool.generation, g); /* seq_cst: see wait_for_work */
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
    publish_generation(atomic_load(&pool.generation) + 1);
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
    atomic_store(&pool.caller_sleeping, 0);
    atomic_store(&pool.stop, 0);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_mutex_init(&pool.join_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.joined, NULL);
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
        pthread_mutex_init(&pool.join_lock, NULL);
        pthread_cond_init(&pool.wake, NULL);
        pthread_cond_init(&pool.joined, NULL);
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

static void run_serially(llb_range_fn fn, void *ctx, long n, long grain) {
    for (long b = 0; b < n; b += grain) fn(ctx, b, b + grain < n ? b + grain : n, 0);
}

void llb_parallel_for(llb_range_fn fn, void *ctx, long n, long grain, int max_threads) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const long n_chunks = (n + grain - 1) / grain;
    if (inside_task || max_threads <= 1 || n_chunks == 1) { /* nested call: never wait on ourselves */
        run_serially(fn, ctx, n, grain);
        return;
    }
    pthread_mutex_lock(&call_lock);
    /* Read under the lock: llb_pool_init cannot change it until this call returns. */
    const int nth = atomic_load_explicit(&pool.nth, memory_order_relaxed);
    inside_task = 1;
    const uint64_t start = nth > 1 ? now_ns() : 0;
    if (nth == 1 || n_chunks > (long)UINT32_MAX || start < solo_until) {
        run_serially(fn, ctx, n, grain);
    } else {
        const unsigned gen = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
        pool.fn = fn;
        pool.ctx = ctx;
        pool.n = n;
        pool.grain = grain;
        atomic_store_explicit(&pool.n_chunks, n_chunks, memory_order_relaxed);
        atomic_store_explicit(&pool.active, nth < max_threads ? nth : max_threads, memory_order_relaxed);
        atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
        atomic_store_explicit(&pool.claim, (uint64_t)gen << 32, memory_order_release);
        publish_generation(gen);
        const long ran = run_chunks(gen, 0);
        const uint64_t claimed = now_ns();
        join(n_chunks);
        note_join(start, claimed, now_ns(), ran);
    }
    inside_task = 0;
    pthread_mutex_unlock(&call_lock);
}

long llb_grain(long n, long chunks, long min_grain, long align) {
    if (align < 1) align = 1;
    if (chunks < 1) chunks = 1;
    long g = (n + chunks - 1) / chunks;
    if (g < min_grain) g = min_grain;
    g = (g + align - 1) / align * align;
    return g > 0 ? g : align;
}

long llb_pool_stalls(void) {
    pthread_mutex_lock(&call_lock);
    const long n = stalls;
    pthread_mutex_unlock(&call_lock);
    return n;
}

int llb_pool_hold_worker(int tid) {
    atomic_store(&hold_tid, tid);
    return atomic_exchange(&hold_timeouts, 0);
}

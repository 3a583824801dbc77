/* Persistent worker pool: each thread claims chunks of its own share first, then
 * takes what is left of the others' shares; spin then sleep between calls and at
 * the join.
 *
 * A call cuts [0, n) into chunks of `grain` items and hands thread t a contiguous
 * share of them: a slot word (generation:32 | next:16 | end:16) on a cache line of
 * its own. A thread claims the next chunk of a slot by compare-and-swap on that word,
 * first its own (uncontended: as cheap as a static split on an idle machine), then
 * every other slot (a descheduled thread's share is taken by the threads that run).
 * A claim only succeeds while the word carries the generation the thread synchronised
 * with, and everything about the call (fn, ctx, n, grain) is read after the claim, so
 * a thread that wakes up late touches nothing of a call that has returned: the words
 * of a finished call are exhausted (every chunk claimed) or belong to a newer call.
 *
 * Join: every thread counts the chunks it finished on its own line (monotonic, never
 * reset); the call is over when the counts have grown by the call's chunks. The caller
 * spins briefly, then sleeps on a condition variable: it sets `caller_sleeping` and
 * re-checks the counts under join_lock, and a worker bumps its count then reads the
 * flag (both seq_cst) and broadcasts under the same lock, so one of the two always
 * sees the other: no wake-up is lost. Workers wait for work the same way on
 * `generation` and `sleepers`.
 *
 * Redo calls (llb_parallel_for_redo): a worker publishes the chunk it runs in its slot's
 * `holding` word; a caller still waiting for it past a deadline moves that word to H_TAKEN
 * (compare-and-swap: the worker's own move to 0 on finishing races with it, the winner counts
 * the chunk), signals the worker and runs the chunk itself. The handler jumps out of the chunk
 * (sigsetjmp/siglongjmp, armed only around the chunk's fn); a worker that finds its chunk taken
 * when arming or finishing leaves the call. See take_over for why late stores are harmless.
 *
 * One call at a time: a mutex serialises callers (two Python threads may run ops at
 * once), and a call made from inside a task runs serially. */
#include "core/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/env.h"
#include "core/isa.h"

#if LLB_X86
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() atomic_signal_fence(memory_order_seq_cst)
#endif

#define MAX_THREADS LLB_POOL_MAX_THREADS
#define MAX_CHUNKS 0xFFFF /* next and end are 16 bits of a slot word */

/* How long an idle worker spins before sleeping (microseconds). Overridable
 * with LLAMBDA_SPIN_US: 0 sleeps at once (no idle CPU burn, ~30 us per op). */
static long spin_budget_ns = 200 * 1000;
/* The budget while the machine looks busy (in the last BUSY_HOLD_NS a stall, see note_join, or
 * a call whose awake workers never showed up, see note_absent).
 * There, a worker that waits long for the next call is most likely waiting for a caller the
 * scheduler has parked, and spinning would hold the core the caller needs: sleeping soon
 * leaves it idle, and the scheduler moves the waiting caller onto it. Off by default (the same
 * 200 us): with one busy loop beside an otherwise quiet 2-core run, 20 us made 2 untuned threads
 * 215-220 tok/s against 250-266 with 200 (SmolLM2, alternated, 2026-12-02); LLAMBDA_BUSY_SPIN_US
 * below LLAMBDA_SPIN_US turns it on (it helped on a machine loaded 14-15 by other work). */
static long busy_spin_ns = 200 * 1000;
#define BUSY_HOLD_NS (1000ull * 1000 * 1000)
static _Atomic uint64_t busy_until; /* written by the caller under call_lock, read by workers */
static atomic_long worker_sleeps;
/* How long the caller spins for workers' last chunks before sleeping: a running
 * worker finishes a chunk in microseconds; one that is not running needs a core,
 * and a sleeping caller frees one (the scheduler may move the worker onto it). */
#define JOIN_SPIN_NS (30 * 1000)
/* A redo call's caller takes over a worker's chunk this long (plus two of its own chunks'
 * time) after it ran out of chunks itself. */
#define REDO_AFTER_NS (30 * 1000)
/* How long a takeover waits for the signalled worker to leave its chunk (see take_over). */
#define ACK_WAIT_NS (50 * 1000)

/* One per thread, a cache line each: its share of the call, and its finished count. */
struct slot {
    _Alignas(64) _Atomic uint64_t word; /* generation << 32 | next << 16 | end */
    atomic_ulong finished;              /* chunks this thread finished, over all calls */
    atomic_ulong stolen;                /* of those, chunks of another thread's share */
    /* In a redo call, the chunk this worker runs: gen << 32 | chunk << 2 | H_RUNNING, H_TAKEN once
     * the caller has taken it over (0: none). Whoever moves it off H_RUNNING counts the chunk. */
    _Atomic uint64_t holding;
};
#define H_RUNNING 1u
#define H_TAKEN 2u

struct pool {
    _Alignas(64) atomic_uint generation;
    /* The call, written by the caller before the slot words (release). */
    _Alignas(64) llb_range_fn fn;
    void *ctx;
    long n, grain;
    int redo; /* the call's chunks may be run twice and abandoned midway (llb_parallel_for_redo) */
    atomic_int active; /* threads that may claim (tid < active) */
    _Alignas(64) atomic_int caller_sleeping;
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    _Atomic int nth; /* threads in the pool; written under call_lock, read anywhere */
    unsigned long finished_total; /* sum of every slot's finished at the end of the last call (caller only) */
    pthread_mutex_t sleep_lock, join_lock;
    pthread_cond_t wake, joined;
    pthread_t workers[MAX_THREADS];
    int n_workers;             /* running workers = nth - 1 */
    unsigned spawn_generation; /* generation when the workers were created */
    struct slot slots[MAX_THREADS];
};

static struct pool pool = {.nth = 1};
/* Serialises callers and pool resizes. */
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int inside_task;
/* Redo: a worker's tid (0 on other threads), where its abandoned chunk jumps back to, and
 * whether it is inside such a chunk (see redo_handler). */
static _Thread_local int my_tid;
static _Thread_local sigjmp_buf redo_jump;
static _Thread_local volatile sig_atomic_t redo_armed;
static int redo_signal; /* 0: redo off (LLAMBDA_POOL_REDO=0, or the signal is someone else's) */
static long takeovers;  /* under call_lock */
/* A cap on the threads of this thread's calls (0: none): llb_pool_cap_thread. */
static _Thread_local int thread_cap;
/* The most threads a call from this thread was given since llb_pool_widest last read it. */
static _Thread_local int widest;
static int atexit_registered;
/* Test hook (llb_pool_hold_worker). */
static atomic_int hold_tid, hold_timeouts;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The join's condition variable, timed on the monotonic clock (redo deadlines come from now_ns). */
static void init_joined(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&pool.joined, &a);
    pthread_condattr_destroy(&a);
}

/* Wait until generation differs from seen (or stop); spin first, then sleep. */
static unsigned wait_for_work(unsigned seen) {
    unsigned g;
    uint64_t start = 0, budget = (uint64_t)spin_budget_ns;
    for (unsigned i = 1;; i++) {
        g = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (g != seen) return g;
        cpu_relax();
        /* Yield now and then: on an oversubscribed machine the caller may share this
         * CPU, and a worker spinning out its whole budget would delay every op by it. */
        if ((i & 1023) == 0) sched_yield();
        if ((i & 127) == 0) {
            uint64_t t = now_ns();
            if (!start) {
                start = t;
                if (t < atomic_load_explicit(&busy_until, memory_order_relaxed) && busy_spin_ns < spin_budget_ns)
                    budget = (uint64_t)busy_spin_ns;
            } else if (t - start >= budget) break;
        }
    }
    atomic_fetch_add_explicit(&worker_sleeps, 1, memory_order_relaxed);
    pthread_mutex_lock(&pool.sleep_lock);
    /* seq_cst pairs with the caller's generation store + sleepers check: either
     * we see the new generation here, or the caller sees us sleeping. */
    atomic_fetch_add(&pool.sleepers, 1);
    while ((g = atomic_load(&pool.generation)) == seen) pthread_cond_wait(&pool.wake, &pool.sleep_lock);
    atomic_fetch_sub(&pool.sleepers, 1);
    pthread_mutex_unlock(&pool.sleep_lock);
    return g;
}

/* Claim the next chunk of slot s in call gen: its index, or -1 when the slot is
 * exhausted or the call is not (any more) gen. */
static long claim(int s, unsigned gen) {
    _Atomic uint64_t *w = &pool.slots[s].word;
    uint64_t e = atomic_load_explicit(w, memory_order_acquire);
    for (;;) {
        if ((unsigned)(e >> 32) != gen) return -1;
        const long next = (long)(e >> 16 & 0xFFFF), end = (long)(e & 0xFFFF);
        if (next >= end) return -1;
        if (atomic_compare_exchange_weak_explicit(w, &e, e + (1u << 16), memory_order_acq_rel, memory_order_acquire))
            return next;
    }
}

/* The worker's side of a takeover: the caller has moved this thread's chunk to H_TAKEN and
 * signalled it. Delivered before the thread runs another instruction of the chunk (a parked
 * thread gets it when it is next scheduled, a running one at once), it abandons the chunk. */
static void redo_handler(int sig) {
    (void)sig;
    const int saved = errno;
    const int tid = my_tid;
    if (tid > 0 && redo_armed && (atomic_load(&pool.slots[tid].holding) & 3) == H_TAKEN) {
        redo_armed = 0;
        errno = saved;
        siglongjmp(redo_jump, 1);
    }
    errno = saved;
}

/* Count a chunk thread tid ran; wake the caller if it sleeps at the join. */
static void count_chunk(int tid) {
    atomic_ulong *f = &pool.slots[tid].finished;
    /* Only this thread writes its count; seq_cst pairs with the caller_sleeping store in join(). */
    atomic_store(f, atomic_load_explicit(f, memory_order_relaxed) + 1);
    if (atomic_load(&pool.caller_sleeping)) {
        pthread_mutex_lock(&pool.join_lock);
        pthread_cond_broadcast(&pool.joined);
        pthread_mutex_unlock(&pool.join_lock);
    }
}

/* Run chunk c of call gen as thread tid and count it. Returns -1 when the caller took the chunk
 * over (the thread then leaves the call: the caller has counted the chunk). */
static int run_chunk(long c, int tid, unsigned gen) {
    /* The call cannot end before this chunk is counted: its fields are live. */
    const long b = c * pool.grain, e = b + pool.grain < pool.n ? b + pool.grain : pool.n;
    if (tid == 0 || !pool.redo) {
        pool.fn(pool.ctx, b, e, tid);
        count_chunk(tid);
        return 0;
    }
    _Atomic uint64_t *h = &pool.slots[tid].holding;
    const uint64_t mine = (uint64_t)gen << 32 | (uint64_t)c << 2 | H_RUNNING;
    atomic_store(h, mine);
    if (sigsetjmp(redo_jump, 0)) { /* abandoned (redo_handler): the caller runs it */
        atomic_store(h, 0);
        return -1;
    }
    redo_armed = 1;
    atomic_signal_fence(memory_order_seq_cst);
    /* Taken over before it was armed (the signal found it unarmed and returned): do not start. */
    if ((atomic_load(h) & 3) == H_TAKEN) {
        redo_armed = 0;
        atomic_store(h, 0);
        return -1;
    }
    pool.fn(pool.ctx, b, e, tid);
    atomic_signal_fence(memory_order_seq_cst);
    redo_armed = 0;
    atomic_signal_fence(memory_order_seq_cst);
    uint64_t expect = mine;
    if (!atomic_compare_exchange_strong(h, &expect, 0)) { /* taken over after all: the caller counts it */
        atomic_store(h, 0);
        return -1;
    }
    count_chunk(tid);
    return 0;
}

/* Claim and run chunks of call gen as thread tid: its own slot first, then the others'.
 * Returns how many it ran. */
static long run_chunks(unsigned gen, int tid) {
    const int active = atomic_load_explicit(&pool.active, memory_order_relaxed);
    if (tid >= active) return 0; /* a stale active goes with a stale gen: every claim fails */
    long ran = 0;
    for (int k = 0; k < active; k++) {
        const int s = tid + k < active ? tid + k : tid + k - active;
        long mine = 0;
        long c;
        for (; (c = claim(s, gen)) >= 0; mine++)
            if (run_chunk(c, tid, gen) < 0) break;
        if (s != tid && mine) { /* only this thread writes its count */
            atomic_ulong *st = &pool.slots[tid].stolen;
            atomic_store_explicit(st, atomic_load_explicit(st, memory_order_relaxed) + (unsigned long)mine, memory_order_relaxed);
        }
        ran += mine;
        if (c >= 0) break; /* taken over: out of this call */
    }
    return ran;
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
    my_tid = tid;
    redo_armed = 0;
    if (redo_signal) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, redo_signal);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    }
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

static unsigned long finished_sum(int nth) {
    unsigned long s = 0;
    for (int t = 0; t < nth; t++) s += atomic_load(&pool.slots[t].finished);
    return s;
}

/* Take over the chunks workers still run in redo call gen: each moved to H_TAKEN, its worker
 * signalled (it abandons the chunk before running another instruction of it, see redo_handler),
 * then run and counted here once the worker has left it (or is off the CPU): the chunks are
 * deterministic and out of place, the inputs unchanged until the call returns, so the caller's
 * run writes the bits the worker's would have. Returns how many it took. */
static int take_over(unsigned gen, int active) {
    int took = 0;
    for (int t = 1; t < active; t++) {
        _Atomic uint64_t *h = &pool.slots[t].holding;
        uint64_t v = atomic_load(h);
        if ((unsigned)(v >> 32) != gen || (v & 3) != H_RUNNING) continue;
        const uint64_t taken = (v & ~(uint64_t)3) | H_TAKEN;
        if (!atomic_compare_exchange_strong(h, &v, taken)) continue; /* it finished meanwhile */
        if (pthread_kill(pool.workers[t - 1], redo_signal) != 0) {
            uint64_t x = taken;
            if (atomic_compare_exchange_strong(h, &x, v)) continue; /* back to the worker: wait for it */
            /* else the worker already left the chunk (finished it, not counted): run and count it */
        } else {
            /* The kernels add a chunk's K blocks into its outputs, so a worker still on a CPU must
             * be out of the chunk before the caller rewrites them: its handler (or its failed
             * compare-exchange) clears `holding`. A running thread gets the signal within
             * microseconds; one that does not answer in ACK_WAIT_NS is off the CPU, and the signal
             * runs before its next instruction of the chunk. */
            const uint64_t until = now_ns() + ACK_WAIT_NS;
            while (atomic_load(h) == taken && now_ns() < until) cpu_relax();
        }
        const long c = (long)(v >> 2 & 0x3FFFFFFF), b = c * pool.grain, e = b + pool.grain < pool.n ? b + pool.grain : pool.n;
        pool.fn(pool.ctx, b, e, 0);
        count_chunk(0);
        takeovers++;
        took++;
    }
    return took;
}

/* Wait until the threads' finished counts reach target: spin, then sleep until a worker
 * that finishes a chunk wakes us. In a redo call (redo_at != 0) the chunks workers still run
 * at redo_at (monotonic ns) are taken over. */
static void join(unsigned long target, int nth, unsigned gen, int active, uint64_t redo_at) {
    uint64_t start = 0;
    for (unsigned i = 1; finished_sum(nth) != target; i++) {
        cpu_relax();
        if ((i & 63) == 0) {
            const uint64_t t = now_ns();
            if (redo_at && t >= redo_at) {
                take_over(gen, active);
                redo_at = 0;
            }
            if (!start) start = t;
            else if (t - start >= JOIN_SPIN_NS) break;
        }
    }
    if (finished_sum(nth) == target) return;
    pthread_mutex_lock(&pool.join_lock);
    atomic_store(&pool.caller_sleeping, 1); /* seq_cst: see run_chunk */
    while (finished_sum(nth) != target) {
        if (!redo_at) {
            pthread_cond_wait(&pool.joined, &pool.join_lock);
            continue;
        }
        const struct timespec ts = {(time_t)(redo_at / 1000000000u), (long)(redo_at % 1000000000u)};
        if (pthread_cond_timedwait(&pool.joined, &pool.join_lock, &ts) == ETIMEDOUT || now_ns() >= redo_at) {
            pthread_mutex_unlock(&pool.join_lock);
            take_over(gen, active);
            redo_at = 0;
            pthread_mutex_lock(&pool.join_lock);
        }
    }
    atomic_store(&pool.caller_sleeping, 0);
    pthread_mutex_unlock(&pool.join_lock);
}

/* Stalls: a call whose caller, its own chunks done, waited far longer than a chunk takes for
 * a worker's last one. That worker was descheduled in the middle of its chunk (the machine is
 * busy), and it will be again: for a while (solo_ns, doubling while stalls recur) the caller
 * runs calls alone, at one thread's speed, instead of waiting a scheduler slice each time.
 * Read and written under call_lock. */
#define STALL_MIN_NS (300 * 1000)
#define SOLO_MIN_NS (2 * 1000 * 1000)
#define SOLO_MAX_NS (256 * 1000 * 1000)
static uint64_t solo_ns = SOLO_MIN_NS, last_stall;
static _Atomic uint64_t solo_until; /* written under call_lock; llb_pool_call_threads reads it without */
static long stalls;
/* Counters for llb_pool_stats (under call_lock). */
#define WAIT_NOTED_NS (20 * 1000)
static long calls_parallel, calls_solo, joins_waited;
static uint64_t join_wait_ns, join_wait_max_ns, caller_work_ns;

static void note_join(uint64_t start, uint64_t claimed, uint64_t end, long ran) {
    const uint64_t chunk = ran > 0 ? (claimed - start) / (uint64_t)ran : 0;
    calls_parallel++;
    caller_work_ns += claimed - start;
    if (end - claimed > WAIT_NOTED_NS) joins_waited++;
    join_wait_ns += end - claimed;
    if (end - claimed > join_wait_max_ns) join_wait_max_ns = end - claimed;
    if (end - claimed > STALL_MIN_NS + 4 * chunk) {
        stalls++;
        /* A stall soon after the last solo period: the contention persists, stay away longer. */
        if (last_stall && start - last_stall < 4 * solo_ns) solo_ns = solo_ns * 2 < SOLO_MAX_NS ? solo_ns * 2 : SOLO_MAX_NS;
        else solo_ns = SOLO_MIN_NS;
        last_stall = end;
        atomic_store_explicit(&solo_until, end + solo_ns, memory_order_relaxed);
        atomic_store_explicit(&busy_until, end + BUSY_HOLD_NS, memory_order_relaxed);
    }
}

/* Returns whether a worker was asleep (it was woken). */
static int publish_generation(unsigned g) {
    atomic_store(&pool.generation, g); /* seq_cst: see wait_for_work */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
        return 1;
    }
    return 0;
}

/* A call whose workers were all awake (spinning for it) but none claimed a chunk while the
 * caller ran every one for ABSENT_MIN_NS: they were not on a CPU, the machine is busy. */
#define ABSENT_MIN_NS (20 * 1000)
static long calls_absent;
static void note_absent(uint64_t start, uint64_t claimed, long ran, long n_chunks, int woke) {
    if (woke || ran != n_chunks || claimed - start < ABSENT_MIN_NS) return;
    calls_absent++;
    atomic_store_explicit(&busy_until, claimed + BUSY_HOLD_NS, memory_order_relaxed);
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
    pool.finished_total = finished_sum(1);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.caller_sleeping, 0);
    atomic_store(&pool.stop, 0);
    pthread_mutex_init(&pool.sleep_lock, NULL);
    pthread_mutex_init(&pool.join_lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    init_joined();
    pthread_mutex_init(&call_lock, NULL);
}

/* The signal a takeover sends (redo_handler), with LLAMBDA_POOL_REDO=1 and unless the program
 * already handles it; otherwise redo calls run as plain ones. Opt-in: on the quiet 2-core machine
 * with one busy loop it showed no gain through the noise (SmolLM2, 2 threads 269 tok/s with it, 287
 * without, 1 thread 280 / 346, 2026-12-02), and a program that later takes the signal for itself
 * would leave takeovers racing the worker they could no longer stop. */
static void install_redo(void) {
    if (!llb_env_flag("LLAMBDA_POOL_REDO", 0)) return;
    const int sig = SIGRTMAX - 3;
    struct sigaction old;
    if (sigaction(sig, NULL, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa = {0};
    sa.sa_handler = redo_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NODEFER; /* NODEFER: the handler jumps out, the mask must not keep it blocked */
    if (sigaction(sig, &sa, NULL) == 0) redo_signal = sig;
}

static void read_spin_env(void) {
    spin_budget_ns = llb_env_long("LLAMBDA_SPIN_US", spin_budget_ns / 1000, 0, 1000000) * 1000;
    busy_spin_ns = llb_env_long("LLAMBDA_BUSY_SPIN_US", busy_spin_ns / 1000, 0, 1000000) * 1000;
}

int llb_pool_init(int n_threads) {
    if (n_threads < 1 || n_threads > MAX_THREADS) return -1;
    pthread_mutex_lock(&call_lock);
    if (!atexit_registered) {
        atexit_registered = 1;
        pthread_mutex_init(&pool.sleep_lock, NULL);
        pthread_mutex_init(&pool.join_lock, NULL);
        pthread_cond_init(&pool.wake, NULL);
        init_joined();
        read_spin_env();
        install_redo();
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
        /* The join sums the counts of the threads in the pool: a smaller pool leaves the
         * counts of its old workers out. */
        pool.finished_total = finished_sum(atomic_load(&pool.nth));
    }
    pthread_mutex_unlock(&call_lock);
    return rc;
}

int llb_pool_threads(void) { return atomic_load_explicit(&pool.nth, memory_order_relaxed); }

static void run_serially(llb_range_fn fn, void *ctx, long n, long grain) {
    for (long b = 0; b < n; b += grain) fn(ctx, b, b + grain < n ? b + grain : n, 0);
}

static void parallel_for(llb_range_fn fn, void *ctx, long n, long grain, int max_threads, int redo) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (thread_cap > 0 && max_threads > thread_cap) max_threads = thread_cap;
    long n_chunks = (n + grain - 1) / grain;
    if (n_chunks > MAX_CHUNKS) { /* coarser, still from the sizes only (slot words hold 16-bit indices) */
        grain *= (n_chunks + MAX_CHUNKS - 1) / MAX_CHUNKS;
        n_chunks = (n + grain - 1) / grain;
    }
    if (inside_task || max_threads <= 1 || n_chunks == 1) { /* nested call: never wait on ourselves */
        run_serially(fn, ctx, n, grain);
        return;
    }
    pthread_mutex_lock(&call_lock);
    /* Read under the lock: llb_pool_init cannot change it until this call returns. */
    const int nth = atomic_load_explicit(&pool.nth, memory_order_relaxed);
    const int given = nth < max_threads ? nth : max_threads;
    if (given > widest) widest = given;
    inside_task = 1;
    const uint64_t start = nth > 1 ? now_ns() : 0;
    if (nth == 1 || start < atomic_load_explicit(&solo_until, memory_order_relaxed)) {
        if (nth > 1) calls_solo++;
        run_serially(fn, ctx, n, grain);
    } else {
        const int active = nth < max_threads ? nth : max_threads;
        const unsigned gen = atomic_load_explicit(&pool.generation, memory_order_relaxed) + 1;
        pool.fn = fn;
        pool.ctx = ctx;
        pool.n = n;
        pool.grain = grain;
        pool.redo = redo && redo_signal;
        atomic_store_explicit(&pool.active, active, memory_order_relaxed);
        /* Contiguous shares, thread t's [n_chunks * t / active, n_chunks * (t + 1) / active). */
        for (int t = 0; t < active; t++) {
            const uint64_t b = (uint64_t)(n_chunks * t / active), e = (uint64_t)(n_chunks * (t + 1) / active);
            atomic_store_explicit(&pool.slots[t].word, (uint64_t)gen << 32 | b << 16 | e, memory_order_release);
        }
        const int woke = publish_generation(gen);
        const long ran = run_chunks(gen, 0);
        const uint64_t claimed = now_ns();
        pool.finished_total += (unsigned long)n_chunks;
        /* A redo call takes over what workers still run at 30 us + 2 of the caller's chunks:
         * far past a running worker's chunk, a small part of a parked one's scheduler slice. */
        const uint64_t per_chunk = ran > 0 ? (claimed - start) / (uint64_t)ran : 1000000;
        join(pool.finished_total, nth, gen, active, pool.redo ? claimed + REDO_AFTER_NS + 2 * per_chunk : 0);
        note_join(start, claimed, now_ns(), ran);
        note_absent(start, claimed, ran, n_chunks, woke);
    }
    inside_task = 0;
    pthread_mutex_unlock(&call_lock);
}

void llb_parallel_for(llb_range_fn fn, void *ctx, long n, long grain, int max_threads) {
    parallel_for(fn, ctx, n, grain, max_threads, 0);
}

void llb_parallel_for_redo(llb_range_fn fn, void *ctx, long n, long grain, int max_threads) {
    parallel_for(fn, ctx, n, grain, max_threads, 1);
}

long llb_grain(long n, long chunks, long min_grain, long align) {
    if (align < 1) align = 1;
    if (chunks < 1) chunks = 1;
    long g = (n + chunks - 1) / chunks;
    if (g < min_grain) g = min_grain;
    g = (g + align - 1) / align * align;
    return g > 0 ? g : align;
}

int llb_pool_cap_thread(int n) {
    const int old = thread_cap;
    thread_cap = n > 0 ? n : 0;
    return old;
}

int llb_pool_cap_thread_within(int n) {
    const int old = thread_cap;
    if (n > 0 && (old == 0 || n < old)) thread_cap = n;
    return old;
}

int llb_pool_widest(void) {
    const int w = widest;
    widest = 0;
    return w;
}

int llb_pool_call_threads(void) {
    const int nth = llb_pool_threads();
    if (inside_task || nth == 1) return 1;
    const uint64_t t = now_ns(); /* running calls alone, or busy: its workers may be off the CPU */
    if (t < atomic_load_explicit(&solo_until, memory_order_relaxed) || t < atomic_load_explicit(&busy_until, memory_order_relaxed))
        return 1;
    return thread_cap > 0 && thread_cap < nth ? thread_cap : nth;
}

long llb_pool_stalls(void) {
    pthread_mutex_lock(&call_lock);
    const long n = stalls;
    pthread_mutex_unlock(&call_lock);
    return n;
}

int llb_pool_stats(long *out, int n) {
    pthread_mutex_lock(&call_lock);
    const int nth = atomic_load(&pool.nth);
    unsigned long stolen = 0, worker_chunks = 0;
    for (int t = 0; t < nth; t++) {
        stolen += atomic_load(&pool.slots[t].stolen);
        if (t) worker_chunks += atomic_load(&pool.slots[t].finished);
    }
    const long v[LLB_POOL_STATS] = {calls_parallel, calls_solo, stalls, joins_waited, (long)(join_wait_ns / 1000),
                                    (long)(join_wait_max_ns / 1000), (long)(caller_work_ns / 1000), (long)stolen,
                                    (long)worker_chunks, atomic_load(&worker_sleeps), calls_absent, takeovers};
    pthread_mutex_unlock(&call_lock);
    const int k = n < LLB_POOL_STATS ? n : LLB_POOL_STATS;
    for (int i = 0; i < k; i++) out[i] = v[i];
    return k;
}

int llb_pool_hold_worker(int tid) {
    atomic_store(&hold_tid, tid);
    return atomic_exchange(&hold_timeouts, 0);
}

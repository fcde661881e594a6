/* A fixed pthread pool for data-parallel loops. The calling thread is worker 0, so a pool
 * of n threads starts n-1 OS threads. em_pool_run returns only when every task has finished,
 * so callers may use stack data in ctx. One run at a time per pool (not reentrant).
 *
 * Decoding runs the pool dozens of times per token, so the hand-off must be cheap: workers and
 * the caller first spin briefly on atomics (a run usually follows within microseconds) and
 * only then sleep on a condition variable.
 *
 * Tasks: each thread owns a contiguous share of the task ids, [lo, hi) in one word on its own
 * cache line; it takes its tasks from the front and, when its share is empty, steals from the
 * back of the others'. Thread i thus gets the same part of a matrix run after run (its weights
 * stay in its caches) and claims without moving a shared line between cores, while a
 * descheduled thread's share is still finished by the others.
 *
 * A run ends when its tasks are done, not when every worker has checked in: on a busy machine
 * a descheduled worker would otherwise stall each run for a scheduler time slice. Invariants:
 * the run's fn / ctx / n_tasks / done are written before the share words publish the run
 * (release) and are read only after a successful claim (acquire); a share word only shrinks
 * during a run and is empty when the run ends, so a claim always takes an unclaimed task of
 * the run that published the word (a worker that wakes late simply joins the current run, or
 * finds nothing). The run cannot end while a claimed task is unfinished or not yet counted:
 * each thread adds its finished tasks to `done` once, after its last failed claim.
 * The hot path takes no mutex: a thread about to sleep announces it (sleepers /
 * caller_asleep, seq_cst) and re-checks its condition under `mu`; the other side stores its
 * news seq_cst and then looks at the announcement, broadcasting / signalling under `mu` only
 * when someone may be asleep. So no wake-up is lost. */
#include "base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Padding between groups of fields that different threads write, so that a worker spinning on
 * the run's publication does not pull in the line the tasks' claims and counts bounce on. */
#define LINE 64

/* One thread's share of the current run: (hi << 32) | lo, on its own cache line. */
typedef struct share {
    _Atomic uint64_t range;
    char pad[LINE - sizeof(uint64_t)];
} share;

struct em_pool {
    int n_threads;
    pthread_t *threads;
    share *shares; /* [n_threads], LINE-aligned */
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    char pad0[LINE];
    /* the current run, written by the caller before it bumps generation */
    atomic_uint_fast64_t generation; /* bumped for each run; workers wait for a new value */
    atomic_bool stop;
    em_pool_fn fn;
    void *ctx;
    atomic_int n_tasks;
    atomic_int sleepers;     /* workers asleep (or about to be) on start_cv */
    char pad1[LINE];
    atomic_int done;         /* tasks of the current run finished and counted */
    atomic_bool caller_asleep; /* the caller sleeps (or is about to) on done_cv */
    char pad2[LINE];
};

typedef struct worker_arg {
    em_pool *pool;
    int id;
} worker_arg;

/* Takes task lo (front) or hi - 1 (back) of a share; false when it is empty. */
static bool take(share *sh, bool front, int *task) {
    uint64_t v = atomic_load_explicit(&sh->range, memory_order_acquire);
    for (;;) {
        const uint32_t lo = (uint32_t)v, hi = (uint32_t)(v >> 32);
        if (lo >= hi) return false;
        const uint64_t next = front ? (uint64_t)hi << 32 | (lo + 1) : (uint64_t)(hi - 1) << 32 | lo;
        if (atomic_compare_exchange_weak_explicit(&sh->range, &v, next, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *task = (int)(front ? lo : hi - 1);
            return true;
        }
    }
}

/* The next task for `thread`: its own share first, then the others' from the back. */
static bool claim_task(em_pool *p, int thread, int *task) {
    if (take(&p->shares[thread], true, task)) return true;
    for (int k = 1; k < p->n_threads; k++) {
        int victim = thread + k < p->n_threads ? thread + k : thread + k - p->n_threads;
        if (take(&p->shares[victim], false, task)) return true;
    }
    return false;
}

/* Runs tasks until none is left, then counts them into done in one addition (one contended
 * atomic per thread and run, not per task). Until that addition the run cannot end, so fn /
 * ctx / n_tasks read after the first successful claim stay this run's. The thread whose
 * addition completes the run wakes the caller if it went to sleep. */
static void drain_tasks(em_pool *p, int thread) {
    int t, finished = 0, n = 0;
    em_pool_fn fn = NULL;
    void *ctx = NULL;
    while (claim_task(p, thread, &t)) {
        if (!fn) {
            fn = p->fn;
            ctx = p->ctx;
            n = atomic_load_explicit(&p->n_tasks, memory_order_relaxed);
        }
        fn(ctx, t, thread);
        finished++;
    }
    if (finished == 0) return;
    /* seq_cst pairs with the caller's store of caller_asleep and its load of done: one of the
     * two sees the other (no lost wake-up) */
    if (atomic_fetch_add(&p->done, finished) + finished == n && thread != 0 && atomic_load(&p->caller_asleep)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Spin for about this long before sleeping: covers the gap between two runs of a decode step
 * without burning a core when the pool is idle. */
#define SPIN_SECONDS 50e-6

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits until generation differs from seen (or stop); returns the new generation. A sleeper
 * announces itself in `sleepers` (seq_cst, then re-checks generation under mu), so the caller
 * takes the mutex and broadcasts only when someone may be asleep. */
static uint64_t wait_for_run(em_pool *p, uint64_t seen) {
    double deadline = 0;
    for (unsigned i = 0;; i++) {
        uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
        if ((i & 63) == 63) {
            double now = em_time_now();
            if (deadline == 0) deadline = now + SPIN_SECONDS;
            else if (now > deadline) break;
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen)
        pthread_cond_wait(&p->start_cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return atomic_load_explicit(&p->generation, memory_order_acquire);
}

static void *worker_main(void *argp) {
    worker_arg arg = *(worker_arg *)argp;
    free(argp);
    em_pool *p = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_run(p, seen);
        if (atomic_load(&p->stop)) break;
        drain_tasks(p, arg.id);
    }
    return NULL;
}

int em_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int em_pool_create(em_pool **out, int n_threads, em_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return em_err_set(err, EM_EINVAL, "thread count %d out of range 1..1024", n_threads);
    em_pool *p = em_calloc(1, sizeof *p, "thread pool", err);
    if (!p) return EM_ENOMEM;
    p->n_threads = n_threads;
    p->shares = em_aligned_alloc(LINE, (size_t)n_threads * sizeof *p->shares, "thread pool shares", err);
    if (!p->shares) {
        free(p);
        return EM_ENOMEM;
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&p->shares[i].range, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = em_calloc((size_t)n_threads, sizeof *p->threads, "thread handles", err);
    if (!p->threads) {
        em_pool_free(p);
        return EM_ENOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) *arg = (worker_arg){ .pool = p, .id = i };
        if (!arg || pthread_create(&p->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            p->n_threads = i; /* only threads 1..i-1 exist; free joins those */
            em_pool_free(p);
            return em_err_set(err, EM_ENOMEM, "cannot start worker thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return EM_OK;
}

void em_pool_free(em_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->shares);
    free(p);
}

int em_pool_threads(const em_pool *p) { return p ? p->n_threads : 1; }

uint64_t em_pool_runs(const em_pool *p) {
    return p ? (uint64_t)atomic_load_explicit(&((em_pool *)p)->generation, memory_order_relaxed) : 0;
}

void em_pool_run(em_pool *p, int n_tasks, em_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    /* Every share is empty (the last run ended), so no claim can succeed until the shares
     * below publish this run, after its fn / ctx / n_tasks / done. */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_relaxed);
    const int T = p->n_threads;
    for (int i = 0; i < T; i++) {
        const uint64_t lo = (uint64_t)n_tasks * (uint64_t)i / (uint64_t)T;
        const uint64_t hi = (uint64_t)n_tasks * (uint64_t)(i + 1) / (uint64_t)T;
        atomic_store_explicit(&p->shares[i].range, hi << 32 | lo, memory_order_release);
    }
    const uint64_t run = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    /* seq_cst store, then load of sleepers: pairs with the sleeper's increment and re-check */
    atomic_store(&p->generation, run);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->start_cv);
        pthread_mutex_unlock(&p->mu);
    }
    drain_tasks(p, 0);
    double deadline = 0;
    for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if ((i & 63) == 63) {
            double now = em_time_now();
            if (deadline == 0) deadline = now + SPIN_SECONDS;
            else if (now > deadline) break;
        }
        cpu_relax();
    }
    if (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, true);
        while (atomic_load(&p->done) < n_tasks) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_asleep, false);
        pthread_mutex_unlock(&p->mu);
    }
}

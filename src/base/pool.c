/* A fixed pthread pool for data-parallel loops. The calling thread is worker 0, so a pool
 * of n threads starts n-1 OS threads. Tasks are handed out through an atomic counter (cheap
 * dynamic balancing); em_pool_run returns only when every task has finished, so callers
 * may use stack data in ctx. One run at a time per pool (not reentrant).
 *
 * Decoding runs the pool once per layer per token, so the hand-off must be cheap: workers and
 * the caller first spin briefly on atomics (a run usually follows within microseconds) and
 * only then sleep on a condition variable.
 *
 * A run ends when its tasks are done, not when every worker has checked in: on a busy
 * machine a descheduled worker would otherwise stall each of the hundreds of runs of a decode
 * step for a scheduler time slice while the caller had long finished the work alone. Tasks
 * are claimed from one word holding (run id << 32 | next task); a worker that wakes late
 * holds a stale run id, its claim fails, and it goes back to waiting. Invariants: the run's
 * fn / ctx / n_tasks are written before the claim word publishes the run and are read only
 * after a successful claim (the run cannot end while a claimed task is unfinished); waits
 * re-check their condition under `mu`, so no wake-up is lost. */
#include "base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct em_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    atomic_uint_fast64_t generation; /* bumped for each run; workers wait for a new value */
    atomic_bool stop;
    /* the current run */
    em_pool_fn fn;
    void *ctx;
    atomic_int n_tasks;
    _Atomic uint64_t claim; /* (run id << 32) | next task index */
    atomic_int done;        /* tasks of the current run finished */
};

typedef struct worker_arg {
    em_pool *pool;
    int id;
} worker_arg;

/* Takes the next task of run `run`; false when the run is over or another one started. */
static bool claim_task(em_pool *p, uint32_t run, int *task) {
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        /* n_tasks may already belong to a newer run; the claim then fails on its run id
         * (em_pool_run closes the word before it changes n_tasks: acquire here pairs with
         * that release, so the CAS below sees the closed word) */
        if ((uint32_t)(v >> 32) != run ||
            (int64_t)(uint32_t)v >= atomic_load_explicit(&p->n_tasks, memory_order_acquire))
            return false;
        if (atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            *task = (int)(uint32_t)v;
            return true;
        }
    }
}

static void drain_tasks(em_pool *p, uint32_t run, int thread) {
    int t;
    while (claim_task(p, run, &t)) {
        int n = atomic_load_explicit(&p->n_tasks, memory_order_relaxed);
        p->fn(p->ctx, t, thread);
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep in em_pool_run */
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
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

/* Waits until generation differs from seen (or stop); returns the new generation. */
static uint64_t wait_for_run(em_pool *p, uint64_t seen) {
    double deadline = 0;
    for (unsigned i = 0;; i++) {
        uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load(&p->stop)) return g;
        if ((i & 63) == 63) {
            double now = em_time_now();
            if (deadline == 0) deadline = now + SPIN_SECONDS;
            else if (now > deadline) break;
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen)
        pthread_cond_wait(&p->start_cv, &p->mu);
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
        drain_tasks(p, (uint32_t)seen, arg.id);
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
    free(p);
}

int em_pool_threads(const em_pool *p) { return p ? p->n_threads : 1; }

void em_pool_run(em_pool *p, int n_tasks, em_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    /* First close the claim word to every earlier run (the new id with no task left): a
     * worker that read the new n_tasks below then fails its claim instead of taking task
     * n_old of the old run with this run's fn. */
    uint64_t run = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->claim, (uint64_t)(uint32_t)run << 32 | UINT32_MAX, memory_order_relaxed);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&p->claim, (uint64_t)(uint32_t)run << 32, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->generation, run, memory_order_release);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain_tasks(p, (uint32_t)run, 0);
    double deadline = 0;
    for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if ((i & 63) == 63) {
            double now = em_time_now();
            if (deadline == 0) deadline = now + SPIN_SECONDS;
            else if (now > deadline) break;
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

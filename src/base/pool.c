/* A fixed pthread pool for data-parallel loops. The calling thread is worker 0, so a pool
 * of n threads starts n-1 OS threads. Tasks are handed out through an atomic counter (cheap
 * dynamic balancing); em_pool_run returns only when every task has finished, so callers
 * may use stack data in ctx. One run at a time per pool (not reentrant).
 *
 * Decoding runs the pool once per layer per token, so the hand-off must be cheap: workers and
 * the caller first spin briefly on atomics (a run usually follows within microseconds) and
 * only then sleep on a condition variable. Invariant: `generation` and `running` are only
 * waited on under `mu` after a re-check, so no wake-up is lost. */
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
    atomic_int running;              /* workers still busy in the current run */
    atomic_bool stop;
    /* the current run */
    em_pool_fn fn;
    void *ctx;
    int n_tasks;
    atomic_int next_task;
};

typedef struct worker_arg {
    em_pool *pool;
    int id;
} worker_arg;

static void drain_tasks(em_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) return;
        p->fn(p->ctx, t, thread);
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
        drain_tasks(p, arg.id);
        if (atomic_fetch_sub_explicit(&p->running, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep in em_pool_run */
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
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
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->running, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    drain_tasks(p, 0);
    double deadline = 0;
    for (unsigned i = 0; atomic_load_explicit(&p->running, memory_order_acquire) > 0; i++) {
        if ((i & 63) == 63) {
            double now = em_time_now();
            if (deadline == 0) deadline = now + SPIN_SECONDS;
            else if (now > deadline) break;
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->running) > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* The threaded matrix-vector product y = W x over rows of any weight type with a dot kernel
 * (quant/). Owns only the split of rows into tasks: each task is a contiguous run of rows
 * of a few MiB (so every thread streams long sequential stretches of W, which the hardware
 * prefetchers need), tasks are handed out dynamically by em_pool. No allocation, no state kept between
 * calls; W, act and y are only read / written inside [0, n_rows). */
#include "compute/compute.h"

#include <limits.h>

/* Task sizing. Each thread streams its task's rows; hardware prefetchers run ahead of the
 * stream and past the task's end, into rows another core will read (wasted bandwidth, and
 * on a chip with several L3 slices the lines land in the wrong one). Measured on the
 * development machine (2 threads, 1 GiB of Q8_0): 256 KiB tasks reach 85% of the rate of
 * 4 MiB ones, 16 KiB tasks 35%. So tasks are at least MIN_TASK_BYTES (unless that would idle
 * a thread), about TASKS_PER_THREAD per thread for balance when other processes steal a core,
 * and at most MAX_TASK_BYTES. */
#define MIN_TASK_BYTES (4ull << 20)
#define MAX_TASK_BYTES (16ull << 20)
#define TASKS_PER_THREAD 8

typedef struct matvec_job {
    em_dot_fn dot;
    const uint8_t *w;
    uint64_t row_bytes;
    int64_t n_rows, n_cols, rows_per_task;
    const void *act;
    float *y;
} matvec_job;

static void matvec_task(void *ctx, int task, int thread) {
    (void)thread;
    const matvec_job *job = ctx;
    int64_t r0 = (int64_t)task * job->rows_per_task;
    int64_t r1 = r0 + job->rows_per_task < job->n_rows ? r0 + job->rows_per_task : job->n_rows;
    const uint8_t *row = job->w + (uint64_t)r0 * job->row_bytes;
    for (int64_t r = r0; r < r1; r++, row += job->row_bytes)
        job->y[r] = job->dot(row, job->act, job->n_cols);
}

static int64_t choose_rows_per_task(int64_t n_rows, uint64_t row_bytes, int n_threads) {
    const uint64_t total = row_bytes * (uint64_t)n_rows; /* checked by the caller */
    uint64_t task = total / ((uint64_t)n_threads * TASKS_PER_THREAD);
    uint64_t floor = total / (uint64_t)n_threads < MIN_TASK_BYTES ? total / (uint64_t)n_threads : MIN_TASK_BYTES;
    if (task < floor) task = floor;
    if (task > MAX_TASK_BYTES) task = MAX_TASK_BYTES;
    int64_t rows = (int64_t)(task / row_bytes);
    if (rows < 1) rows = 1;
    int64_t for_int_tasks = (n_rows + INT_MAX - 1) / INT_MAX; /* task ids are int */
    return rows > for_int_tasks ? rows : for_int_tasks;
}

int em_matvec_isa(em_pool *pool, int isa, int wtype, const void *w, int64_t n_rows,
                  int64_t n_cols, const void *act, float *y, em_err *err) {
    int blk = em_dot_block_elems(wtype);
    if (blk == 0)
        return em_err_set(err, EM_EUNSUPPORTED, "matvec: no dot product for weight type %s (%d)",
                          em_type_name(wtype), wtype);
    if (n_rows < 0 || n_cols < 0 || n_cols % blk != 0)
        return em_err_set(err, EM_EINVAL, "matvec %s: bad shape %lld x %lld (columns must be a multiple of %d)",
                          em_type_name(wtype), (long long)n_rows, (long long)n_cols, blk);
    if (n_rows == 0) return EM_OK;
    if (!w || !y || (n_cols > 0 && !act))
        return em_err_set(err, EM_EINVAL, "matvec %s: NULL buffer", em_type_name(wtype));
    em_dot_fn dot = em_dot_kernel(wtype, isa, NULL);
    if (!dot)
        return em_err_set(err, EM_EUNSUPPORTED, "matvec %s: this CPU cannot run ISA %s",
                          em_type_name(wtype), em_isa_name(isa));
    uint64_t row_bytes, total;
    int rc = em_type_row_bytes(wtype, (uint64_t)n_cols, &row_bytes, err);
    if (rc) return rc;
    if (em_mul_overflow(row_bytes, (uint64_t)n_rows, &total) || total > (uint64_t)PTRDIFF_MAX)
        return em_err_set(err, EM_EOVERFLOW, "matvec %s: %lld rows of %llu bytes overflow",
                          em_type_name(wtype), (long long)n_rows, (unsigned long long)row_bytes);
    if (row_bytes == 0) { /* zero columns: every dot is empty */
        for (int64_t r = 0; r < n_rows; r++) y[r] = 0.0f;
        return EM_OK;
    }
    matvec_job job = {
        .dot = dot, .w = w, .row_bytes = row_bytes, .n_rows = n_rows, .n_cols = n_cols,
        .act = act, .y = y,
        .rows_per_task = choose_rows_per_task(n_rows, row_bytes, em_pool_threads(pool)),
    };
    int n_tasks = (int)((n_rows + job.rows_per_task - 1) / job.rows_per_task);
    em_pool_run(pool, n_tasks, matvec_task, &job);
    return EM_OK;
}

int em_matvec(em_pool *pool, int wtype, const void *w, int64_t n_rows, int64_t n_cols,
              const void *act, float *y, em_err *err) {
    return em_matvec_isa(pool, em_isa_default(), wtype, w, n_rows, n_cols, act, y, err);
}

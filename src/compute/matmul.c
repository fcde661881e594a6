/* Multi-row matrix products over quant types: Y = X W^T for n activation rows at once.
 * Owns the conversion of activation rows to the dot kernels' activation type (once per row,
 * shared by every matrix of that type) and the split of weight rows into tasks. Each task is
 * a contiguous run of weight rows (long sequential reads of W); inside it, activation rows are
 * taken in tiles so a tile stays in L1/L2 while the task's weight rows stream past it again,
 * and every weight row is read from memory once per call. On AVX-512 CPUs, Q8_0 weights with
 * any number of activation rows go through the register-tiled kernel of matmul_avx512.c and
 * Q8_0 activations are made by its vector quantizer; both give exactly the bytes and floats
 * of the generic path (dot kernel per pair, em_dot_quantize_act), so which path ran never
 * shows in a result. No allocation, no state between calls; y is written only at
 * [j * ldy + r] for j < n, r < rows. */
#include "compute/compute.h"

#include <limits.h>

#include "compute/matmul_kernels.h"

/* Weight bytes per task (as matvec: long prefetch streams, cheap hand-out). */
#define TASK_BYTES (256u * 1024u)
#define TASKS_PER_THREAD 4
/* Activation rows per tile: 16 rows of a 4096-wide Q8_0 row are 70 KB. */
#define ACT_TILE 16
/* Activation rows from which Q8_0 weights take the register-tiled kernel (matmul_avx512.c;
 * faster than the dot kernel per pair even for one row: it keeps the activation side
 * precomputed across the weight rows). */
#ifndef MIN_TILED_ROWS
#define MIN_TILED_ROWS 1
#endif
/* Rows converted per task when preparing activations: at least PREP_ROWS, and at least
 * PREP_MIN_FLOATS values (smaller conversions are not worth a pool hand-off). */
#define PREP_ROWS 8
#define PREP_MIN_FLOATS (16 * 1024)
/* Work of a product, in multiply-adds (weight values times the activation rows each weight
 * row serves). A pool hand-off costs about a microsecond (a few cache lines moving between
 * cores), about what 30 K of this work takes one core: below MM_PAR_WORK in one call the
 * whole call runs on the calling thread, and tasks carry at least MM_TASK_WORK each. Which
 * thread computes an output never changes its value. */
#ifndef MM_PAR_WORK
#define MM_PAR_WORK (96u * 1024u)
#endif
#ifndef MM_TASK_WORK
#define MM_TASK_WORK (32u * 1024u)
#endif

int em_mat_init(em_mat *m, int type, int64_t rows, int64_t cols, const void *data, em_err *err) {
    if (rows < 0 || cols < 0)
        return em_err_set(err, EM_EINVAL, "matrix %s: bad shape %lld x %lld", em_type_name(type),
                          (long long)rows, (long long)cols);
    uint64_t rb, total;
    int rc = em_type_row_bytes(type, (uint64_t)cols, &rb, err);
    if (rc) return rc;
    if (em_mul_overflow(rb, (uint64_t)rows, &total) || total > (uint64_t)PTRDIFF_MAX)
        return em_err_set(err, EM_EOVERFLOW, "matrix %s: %lld rows of %llu bytes overflow",
                          em_type_name(type), (long long)rows, (unsigned long long)rb);
    *m = (em_mat){ .type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = data };
    return EM_OK;
}

em_mat em_mat_rows(const em_mat *m, int64_t r0, int64_t n) {
    em_mat s = *m;
    s.rows = n;
    s.data = (const uint8_t *)m->data + (uint64_t)r0 * m->row_bytes;
    s.packed = NULL;
    if (m->packed && r0 % EM_PACK_ROWS == 0 && n % EM_PACK_ROWS == 0)
        s.packed = (const uint8_t *)m->packed + (uint64_t)(r0 / EM_PACK_ROWS) * EM_PACK_GROUP_BYTES((uint64_t)m->cols / 32);
    return s;
}

/* ---- activations ---------------------------------------------------------------------- */

int em_act_bytes(int wtype, int64_t cols, int64_t n, uint64_t *bytes, em_err *err) {
    if (n < 0 || cols < 0)
        return em_err_set(err, EM_EINVAL, "activations for %s: bad shape %lld x %lld",
                          em_type_name(wtype), (long long)n, (long long)cols);
    int at = em_dot_act_type(wtype);
    if (at < 0)
        return em_err_set(err, EM_EUNSUPPORTED, "no dot product for weight type %s (%d)",
                          em_type_name(wtype), wtype);
    if (at == EM_TYPE_F32) {
        *bytes = 0;
        return EM_OK;
    }
    uint64_t rb;
    int rc = em_dot_act_bytes(wtype, cols, &rb, err);
    if (rc) return rc;
    if (em_mul_overflow(rb, (uint64_t)n, bytes))
        return em_err_set(err, EM_EOVERFLOW, "activations for %s: %lld rows overflow",
                          em_type_name(wtype), (long long)n);
    return EM_OK;
}

typedef struct prep_job {
    int wtype;
    const float *x;
    int64_t ldx, cols, n;
    uint8_t *buf;
    uint64_t stride;
    bool fast_q8; /* Q8_0 activations through em_act_q8_0_avx512 (same bytes, faster) */
    int64_t per;  /* rows per task */
} prep_job;

static void prep_rows_task(const prep_job *job, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j++) /* shapes were checked by the caller: cannot fail */
        if (job->fast_q8)
            em_act_q8_0_avx512(job->x + j * job->ldx, job->buf + (uint64_t)j * job->stride, job->cols);
        else
            (void)em_dot_quantize_act(job->wtype, job->x + j * job->ldx, job->buf + (uint64_t)j * job->stride,
                                  job->cols, NULL);
}

static void prep_task(void *ctx, int task, int thread) {
    (void)thread;
    const prep_job *job = ctx;
    int64_t j0 = (int64_t)task * job->per;
    prep_rows_task(job, j0, j0 + job->per < job->n ? j0 + job->per : job->n);
}

int em_act_prepare(em_pool *pool, int wtype, const float *x, int64_t ldx, int64_t cols, int64_t n,
                   void *buf, em_act *out, em_err *err) {
    uint64_t bytes = 0;
    int rc = em_act_bytes(wtype, cols, n, &bytes, err);
    if (rc) return rc;
    int blk = em_dot_block_elems(wtype);
    if (cols % blk != 0)
        return em_err_set(err, EM_EINVAL, "activations for %s: %lld columns are not a multiple of %d",
                          em_type_name(wtype), (long long)cols, blk);
    if (ldx < cols || (n > 0 && !x) || (bytes > 0 && !buf))
        return em_err_set(err, EM_EINVAL, "activations for %s: bad stride or NULL buffer", em_type_name(wtype));
    int at = em_dot_act_type(wtype);
    if (at == EM_TYPE_F32) {
        *out = (em_act){ .type = at, .n = n, .cols = cols, .stride = (uint64_t)ldx * sizeof(float), .data = x };
        return EM_OK;
    }
    uint64_t stride;
    rc = em_dot_act_bytes(wtype, cols, &stride, err);
    if (rc) return rc;
    prep_job job = { .wtype = wtype, .x = x, .ldx = ldx, .cols = cols, .n = n, .buf = buf, .stride = stride,
                     .fast_q8 = at == EM_TYPE_Q8_0 && em_isa_default() == EM_ISA_AVX512 };
    job.per = PREP_MIN_FLOATS / (cols > 0 ? cols : 1);
    if (job.per < PREP_ROWS) job.per = PREP_ROWS;
    if (n > (int64_t)INT_MAX * PREP_ROWS)
        return em_err_set(err, EM_EOVERFLOW, "activations: %lld rows", (long long)n);
    if (n <= job.per) prep_rows_task(&job, 0, n);
    else em_pool_run(pool, (int)((n + job.per - 1) / job.per), prep_task, &job);
    *out = (em_act){ .type = at, .n = n, .cols = cols, .stride = stride, .data = buf };
    return EM_OK;
}

/* ---- the product ---------------------------------------------------------------------- */

typedef void (*packed_fn)(const void *packed, int64_t n_groups, int64_t cols, const void *act, uint64_t stride,
                          int64_t nj, float *y, int64_t ldy);

typedef struct mm_job {
    em_dot_fn dot;
    em_dot_fn tail;   /* non-NULL: Q8_0 through the register-tiled kernel, this its block tail */
    packed_fn packed; /* non-NULL: w is packed (packed.c), rows in groups of 16 */
    bool zero;        /* zero columns: the outputs are zeros, there are no tasks */
    const uint8_t *w;
    uint64_t row_bytes;
    int64_t rows, cols, rows_per_task;
    const uint8_t *act;
    uint64_t stride;
    int64_t n;
    float *y;
    int64_t ldy;
    uint64_t work; /* multiply-adds (activation rows counted up to ACT_TILE) */
} mm_job;

/* Before a weight row is read, touch the start of every 4 KiB page that begins within the
 * next row_bytes bytes at PAGE_AHEAD past it. Hardware prefetchers stop at page boundaries,
 * and with 4 KiB pages (weights mapped from a file) each new page's translation otherwise
 * stalls the stream; measured on the development VM (Q8_0 rows of 2 KiB, one thread,
 * matrices of 1 MiB in random order from the mapped model): 24 -> 28 GB/s. A prefetch never
 * faults, so touching past the matrix is harmless. */
#define PAGE_AHEAD 8192u
#define PAGE_SIZE_ASSUMED 4096u

static inline void prefetch_pages_ahead(const uint8_t *row, uint64_t row_bytes) {
    const uintptr_t a = (uintptr_t)row + PAGE_AHEAD, b = a + row_bytes;
    for (uintptr_t p = a / PAGE_SIZE_ASSUMED + 1; p <= b / PAGE_SIZE_ASSUMED; p++)
        __builtin_prefetch((const void *)(p * PAGE_SIZE_ASSUMED));
}

/* Outputs of weight rows [r0, r1) for every activation row. */
static void mm_task_rows(const mm_job *job, int64_t r0, int64_t r1) {
    if (job->packed) { /* r0, r1: multiples of 16 (rows_per_task and rows are) */
        const uint64_t group = EM_PACK_GROUP_BYTES((uint64_t)job->cols / 32);
        job->packed(job->w + (uint64_t)(r0 / EM_PACK_ROWS) * group, (r1 - r0) / EM_PACK_ROWS, job->cols, job->act,
                    job->stride, job->n, job->y + r0, job->ldy);
        return;
    }
    for (int64_t j0 = 0; j0 < job->n; j0 += ACT_TILE) {
        int64_t j1 = j0 + ACT_TILE < job->n ? j0 + ACT_TILE : job->n;
        if (job->tail) {
            em_mm_q8_0_avx512(job->w + (uint64_t)r0 * job->row_bytes, job->row_bytes, r1 - r0,
                              job->act + (uint64_t)j0 * job->stride, job->stride, j1 - j0, job->cols,
                              job->y + j0 * job->ldy + r0, job->ldy, job->tail);
            continue;
        }
        const uint8_t *wrow = job->w + (uint64_t)r0 * job->row_bytes;
        for (int64_t r = r0; r < r1; r++, wrow += job->row_bytes) {
            if (j0 == 0) prefetch_pages_ahead(wrow, job->row_bytes);
            const uint8_t *a = job->act + (uint64_t)j0 * job->stride;
            for (int64_t j = j0; j < j1; j++, a += job->stride)
                job->y[j * job->ldy + r] = job->dot(wrow, a, job->cols);
        }
    }
}

static void mm_task(void *ctx, int task, int thread) {
    (void)thread;
    const mm_job *job = ctx;
    int64_t r0 = (int64_t)task * job->rows_per_task;
    mm_task_rows(job, r0, r0 + job->rows_per_task < job->rows ? r0 + job->rows_per_task : job->rows);
}

/* Saturating product (a work estimate; only compared with thresholds). */
static uint64_t work_of(uint64_t per_row, int64_t rows) {
    uint64_t w;
    return em_mul_overflow(per_row, (uint64_t)rows, &w) ? UINT64_MAX : w;
}

/* task_bytes: one weight row's bytes times the activation rows it serves; row_work: its
 * multiply-adds (see MM_PAR_WORK). */
static int64_t rows_per_task(int64_t rows, uint64_t task_bytes, uint64_t row_work, int n_threads) {
    int64_t per = task_bytes >= TASK_BYTES ? 1 : (int64_t)(TASK_BYTES / (task_bytes ? task_bytes : 1));
    int64_t for_balance = (rows + (int64_t)n_threads * TASKS_PER_THREAD - 1) /
                          ((int64_t)n_threads * TASKS_PER_THREAD);
    if (per > for_balance) per = for_balance;
    /* but no task below MM_TASK_WORK: at most that many tasks, in equal parts */
    uint64_t most_tasks = work_of(row_work, rows) / MM_TASK_WORK;
    if (most_tasks < 1) most_tasks = 1;
    int64_t for_size = most_tasks >= (uint64_t)rows ? 1 : (rows + (int64_t)most_tasks - 1) / (int64_t)most_tasks;
    if (per < for_size) per = for_size;
    if (per < 1) per = 1;
    int64_t for_int_tasks = (rows + INT_MAX - 1) / INT_MAX;
    return per > for_int_tasks ? per : for_int_tasks;
}

/* Checks one product and fills its job; *n_tasks 0 when there are no tasks: no rows, or zero
 * columns (then job->zero: y is to be zeroed, see mm_zero). Writes no output. */
static int mm_setup(em_pool *pool, const em_mat *w, const em_act *act, float *y, int64_t ldy, mm_job *job,
                    int *n_tasks, em_err *err) {
    *n_tasks = 0;
    job->zero = false;
    int blk = em_dot_block_elems(w->type);
    if (blk == 0)
        return em_err_set(err, EM_EUNSUPPORTED, "matmul: no dot product for weight type %s (%d)",
                          em_type_name(w->type), w->type);
    if (act->type != em_dot_act_type(w->type) || act->cols != w->cols)
        return em_err_set(err, EM_EINVAL, "matmul %s [%lld x %lld]: activations are %s x %lld",
                          em_type_name(w->type), (long long)w->rows, (long long)w->cols,
                          em_type_name(act->type), (long long)act->cols);
    if (w->rows < 0 || act->n < 0 || w->cols % blk != 0 || (act->n > 1 && ldy < w->rows))
        return em_err_set(err, EM_EINVAL, "matmul %s: bad shape %lld x %lld, %lld rows, ldy %lld",
                          em_type_name(w->type), (long long)w->rows, (long long)w->cols,
                          (long long)act->n, (long long)ldy);
    if (w->packed && (w->type != EM_TYPE_Q8_0 || w->rows % EM_PACK_ROWS != 0))
        return em_err_set(err, EM_EINVAL, "matmul %s [%lld x %lld]: packed, but not Q8_0 in groups of %d rows",
                          em_type_name(w->type), (long long)w->rows, (long long)w->cols, EM_PACK_ROWS);
    if (w->rows == 0 || act->n == 0) return EM_OK;
    if (!w->data || !y || !act->data) return em_err_set(err, EM_EINVAL, "matmul: NULL buffer");
    if (w->cols == 0) {
        *job = (mm_job){ .zero = true, .rows = w->rows, .n = act->n, .y = y, .ldy = ldy };
        return EM_OK;
    }
    *job = (mm_job){
        .dot = em_dot_get(w->type), .w = w->data, .row_bytes = w->row_bytes, .rows = w->rows,
        .cols = w->cols, .act = act->data, .stride = act->stride, .n = act->n, .y = y, .ldy = ldy,
    };
    /* Q8_0 on AVX-512: the tiled kernel, bit-identical to the dot kernel it replaces */
    int isa = EM_ISA_SCALAR;
    if (w->packed) {
        job->w = w->packed;
        job->packed = em_isa_default() == EM_ISA_AVX512 ? em_mm_q8_0x16_avx512 : em_mm_q8_0x16_ref;
    } else if (w->type == EM_TYPE_Q8_0 && act->n >= MIN_TILED_ROWS && em_dot_kernel(w->type, em_isa_default(), &isa) &&
        isa == EM_ISA_AVX512)
        job->tail = em_dot_kernel(w->type, EM_ISA_AVX2, NULL);
    /* a task's cost grows with the activation rows it serves, so fewer weight rows each */
    const uint64_t tile = (uint64_t)(act->n < ACT_TILE ? act->n : ACT_TILE);
    const uint64_t per_row = w->row_bytes * tile, row_work = (uint64_t)w->cols * tile;
    job->rows_per_task = rows_per_task(w->rows, per_row, row_work, em_pool_threads(pool));
    if (job->packed) /* whole groups (w->rows is a multiple of 16) */
        job->rows_per_task = (job->rows_per_task + EM_PACK_ROWS - 1) / EM_PACK_ROWS * EM_PACK_ROWS;
    job->work = work_of(row_work, w->rows);
    *n_tasks = (int)((w->rows + job->rows_per_task - 1) / job->rows_per_task);
    return EM_OK;
}

/* Empty dot products: zeros. */
static void mm_zero(const mm_job *job) {
    for (int64_t j = 0; j < job->n; j++)
        for (int64_t r = 0; r < job->rows; r++) job->y[j * job->ldy + r] = 0.0f;
}

int em_matmul_act(em_pool *pool, const em_mat *w, const em_act *act, float *y, int64_t ldy,
                  em_err *err) {
    mm_job job;
    int n_tasks, rc = mm_setup(pool, w, act, y, ldy, &job, &n_tasks, err);
    if (rc) return rc;
    if (job.zero) mm_zero(&job);
    if (n_tasks > 0 && job.work < MM_PAR_WORK) mm_task_rows(&job, 0, job.rows);
    else if (n_tasks > 0) em_pool_run(pool, n_tasks, mm_task, &job);
    return EM_OK;
}

/* Several products in one pool run: task t belongs to the item whose range of task ids
 * [first[k], first[k + 1]) holds it. */
typedef struct multi_job {
    mm_job jobs[EM_MATMUL_MULTI_MAX];
    int first[EM_MATMUL_MULTI_MAX + 1];
    int n;
} multi_job;

static void multi_task(void *ctx, int task, int thread) {
    const multi_job *m = ctx;
    int lo = 0, hi = m->n - 1; /* the last k with first[k] <= task */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (m->first[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    mm_task((void *)&m->jobs[lo], task - m->first[lo], thread);
}

int em_matmul_multi(em_pool *pool, const em_mm_item *items, int n_items, em_err *err) {
    if (n_items < 0 || n_items > EM_MATMUL_MULTI_MAX || (n_items > 0 && !items))
        return em_err_set(err, EM_EINVAL, "matmul_multi: %d products (at most %d)", n_items, EM_MATMUL_MULTI_MAX);
    multi_job m;
    m.n = 0;
    int64_t total = 0;
    for (int k = 0; k < n_items; k++) {
        if (!items[k].w || !items[k].act)
            return em_err_set(err, EM_EINVAL, "matmul_multi: product %d has a NULL matrix or activations", k);
        int n_tasks, rc = mm_setup(pool, items[k].w, items[k].act, items[k].y, items[k].ldy, &m.jobs[m.n], &n_tasks, err);
        if (rc) return em_err_prefix(err, "matmul_multi product %d", k);
        if (n_tasks == 0 && !m.jobs[m.n].zero) continue;
        if (total + n_tasks > INT_MAX) return em_err_set(err, EM_EOVERFLOW, "matmul_multi: too many tasks");
        m.first[m.n++] = (int)total;
        total += n_tasks;
    }
    m.first[m.n] = (int)total;
    uint64_t work = 0;
    for (int k = 0; k < m.n; k++) {
        if (m.jobs[k].zero) mm_zero(&m.jobs[k]);
        else work = work + m.jobs[k].work < work ? UINT64_MAX : work + m.jobs[k].work;
    }
    if (total > 0 && work < MM_PAR_WORK) {
        for (int k = 0; k < m.n; k++)
            if (!m.jobs[k].zero) mm_task_rows(&m.jobs[k], 0, m.jobs[k].rows);
    } else if (total > 0) {
        em_pool_run(pool, (int)total, multi_task, &m);
    }
    return EM_OK;
}

int em_matmul(em_pool *pool, const em_mat *w, const float *x, int64_t ldx, int64_t n, float *y,
              int64_t ldy, void *buf, em_err *err) {
    em_act act;
    int rc = em_act_prepare(pool, w->type, x, ldx, w->cols, n, buf, &act, err);
    if (rc) return rc;
    return em_matmul_act(pool, w, &act, y, ldy, err);
}

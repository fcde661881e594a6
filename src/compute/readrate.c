/* The plain read the products are measured against (ember bench's roofline, bench_quant's
 * %bw): the pool's threads sum `bytes` of memory in parts, as fast as loads allow. Owns
 * nothing between calls; the sums land in per-thread lines so the reads cannot be dropped. */
#include "compute/compute.h"

#include <stdlib.h>
#include <string.h>


typedef uint64_t v2u64 __attribute__((vector_size(16)));

typedef struct read_job {
    const uint8_t *data;
    uint64_t part; /* bytes per task, a multiple of 128 */
    bool wide;     /* 32-byte loads (AVX2), as the products load */
    uint64_t *sums; /* [threads][8]: a cache line per thread */
} read_job;

/* Four independent accumulators in registers (named, not an array: an array the compiler does
 * not unroll lives on the stack, and its load-add-store chain would cap the loop well below
 * memory bandwidth). */
static uint64_t sum16(const uint8_t *p, uint64_t n) {
    v2u64 a0 = { 0, 0 }, a1 = a0, a2 = a0, a3 = a0, v0, v1, v2, v3;
    for (uint64_t i = 0; i + 64 <= n; i += 64) {
        memcpy(&v0, p + i, 16);
        memcpy(&v1, p + i + 16, 16);
        memcpy(&v2, p + i + 32, 16);
        memcpy(&v3, p + i + 48, 16);
        a0 += v0;
        a1 += v1;
        a2 += v2;
        a3 += v3;
    }
    v2u64 a = a0 + a1 + a2 + a3;
    return a[0] + a[1];
}

#if defined(__x86_64__)
typedef uint64_t v4u64 __attribute__((vector_size(32)));

/* The same with 32-byte loads; only called on AVX2 CPUs. */
__attribute__((target("avx2"))) static uint64_t sum32(const uint8_t *p, uint64_t n) {
    v4u64 a0 = { 0, 0, 0, 0 }, a1 = a0, a2 = a0, a3 = a0, v0, v1, v2, v3;
    for (uint64_t i = 0; i + 128 <= n; i += 128) {
        memcpy(&v0, p + i, 32);
        memcpy(&v1, p + i + 32, 32);
        memcpy(&v2, p + i + 64, 32);
        memcpy(&v3, p + i + 96, 32);
        a0 += v0;
        a1 += v1;
        a2 += v2;
        a3 += v3;
    }
    v4u64 a = a0 + a1 + a2 + a3;
    return a[0] + a[1] + a[2] + a[3];
}
#endif

static void read_task(void *ctx, int task, int thread) {
    read_job *j = ctx;
    const uint8_t *p = j->data + (uint64_t)task * j->part;
#if defined(__x86_64__)
    if (j->wide) {
        j->sums[8 * thread] += sum32(p, j->part);
        return;
    }
#endif
    j->sums[8 * thread] += sum16(p, j->part);
}

double em_read_seconds(em_pool *pool, const void *data, uint64_t bytes, uint64_t part) {
    part = part / 128 * 128;
    const uint64_t tasks = part ? bytes / part : 0;
    if (tasks == 0 || tasks > INT32_MAX) return 0.0;
    const int threads = pool ? em_pool_threads(pool) : 1;
    read_job job = { .data = data, .part = part, .wide = em_isa_cpu_supports(EM_ISA_AVX2),
                     .sums = calloc(8 * (size_t)threads, sizeof(uint64_t)) };
    if (!job.sums) return 0.0;
    double t0 = em_time_now();
    em_pool_run(pool, (int)tasks, read_task, &job);
    double dt = em_time_now() - t0;
    volatile uint64_t sink = 0; /* the sums are used: the reads stay */
    for (int t = 0; t < threads; t++) sink += job.sums[8 * t];
    (void)sink;
    free(job.sums);
    return dt;
}

/* Small helpers the benchmarks share: process CPU time, a seeded uniform generator (so inputs
 * are the same on every run), and sorting repetitions for their median. Header-only: each
 * bench is one executable. */
#ifndef EM_BENCH_UTIL_H
#define EM_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* CPU seconds of the whole process (all threads), to set beside wall time. */
static inline double bench_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64: uniform in [0, 1) from state *s (never 0). */
static inline double bench_uniform(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0);
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..n) ascending (v[0] the min, v[n - 1] the max) and returns the median (0 when n is 0). */
static inline double bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif

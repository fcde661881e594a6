/* Small helpers the benchmarks share: process CPU time and a seeded uniform generator (so
 * inputs are the same on every run). Header-only: each bench is one executable. */
#ifndef EM_BENCH_UTIL_H
#define EM_BENCH_UTIL_H

#include <stdint.h>
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

#endif

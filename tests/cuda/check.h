/* tests/cuda/check.h: the check log the device tests share (test_gpu_target, test_gpu_seq,
 * test_gpu_draft): one line per check ("ok" or "FAIL", its name, what was measured), counted
 * for the summary line and the exit status, and a calloc that ends the test when the host is
 * out of memory. Header-only (static inline: a test uses what it needs); each test is one
 * translation unit. */
#ifndef EM_TESTS_CUDA_CHECK_H
#define EM_TESTS_CUDA_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int n_fail, n_ok;

static inline void record(const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void record(const char *name, int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char d[300];
    vsnprintf(d, sizeof d, fmt, ap);
    va_end(ap);
    printf("%-4s %-44s %s\n", ok ? "ok" : "FAIL", name, d);
    fflush(stdout);
    if (ok) n_ok++;
    else n_fail++;
}

static inline void *xcalloc(size_t n, size_t s) {
    void *p = calloc(n ? n : 1, s);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    return p;
}

#endif

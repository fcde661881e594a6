/* Helpers shared by the cmocka tests: a per-test scratch folder and small file utilities.
 * cmocka's headers need these includes first, in this order. */
#ifndef EM_TESTUTIL_H
#define EM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* A fresh empty folder for this test process (under $EMBER_TMP, else /tmp), created on first
 * use and removed at exit. Returns a path that lives for the whole process. */
const char *em_test_dir(void);
/* em_test_dir()/name in a static rotating buffer (8 slots). */
const char *em_test_path(const char *name);
/* Path of a file in the source tree ($EMBER_SRC/rel, else ./rel). */
const char *em_test_src(const char *rel);
/* Writes n bytes to path (created or truncated); fails the test on error. */
void em_test_write(const char *path, const void *data, size_t n);
/* Reads a whole file; *n gets its size. Caller frees. Fails the test on error. */
void *em_test_read(const char *path, size_t *n);
/* Runs a shell command line, returns its exit status (or -1). stdout/stderr go to the files
 * em_test_path("out.txt") / em_test_path("err.txt") when capture is nonzero. */
int em_test_sh(int capture, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Deterministic pseudo-random numbers (xorshift64*), for test data. */
uint64_t em_test_rand(uint64_t *state);
float em_test_randf(uint64_t *state); /* uniform in [-1, 1) */

#endif

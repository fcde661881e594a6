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
/* Reads a whole file; *n gets its size. The buffer has a NUL after the last byte, so text
 * files read as C strings. Caller frees. Fails the test on error. */
void *em_test_read(const char *path, size_t *n);
/* Reads a file of exactly n little-endian f32 values (fails the test otherwise). Caller frees. */
float *em_test_read_f32(const char *path, size_t n);
/* Runs a shell command line, returns its exit status (or -1). stdout/stderr go to the files
 * em_test_path("out.txt") / em_test_path("err.txt") when capture is nonzero. */
int em_test_sh(int capture, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Runs `BIN convert SRC_DIR -o OUT --type TYPE` with output captured as em_test_sh(1, ...)
 * does; returns its exit status. */
int em_test_convert(const char *bin, const char *src_dir, const char *out, const char *type);
/* Converts the fixture tests/fixtures/NAME (em_test_convert) into em_test_dir()/NAME_TYPE.gguf,
 * whose path goes to out[cap]. Returns 0, or -1 after saying why on stderr (for group setups). */
int em_test_convert_fixture(const char *bin, const char *name, const char *type, char *out,
                            size_t cap);
/* Deterministic pseudo-random numbers (xorshift64*), for test data. */
uint64_t em_test_rand(uint64_t *state);
float em_test_randf(uint64_t *state); /* uniform in [-1, 1) */

/* OK(call) fails the test with the call's text, code and message unless it returns 0; E is
 * the em_err * to pass as the call's last argument. */
#define OK(call)                                                                               \
    do {                                                                                       \
        em_err err_ = { 0 };                                                                   \
        int rc_ = (call);                                                                      \
        if (rc_) fail_msg("%s: %d %s", #call, rc_, err_.msg);                                  \
    } while (0)
#define E (&err_)

#endif

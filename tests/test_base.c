/* base/: errors, arenas, the thread pool, file reads (truncation, direct I/O), guarded
 * mappings of files that shrink or change under them, SHA-256 against FIPS 180-2 vectors,
 * size/int parsing, fp16/bf16 against the compiler's own _Float16 conversions. */
#include "testutil.h"

#include "base/base.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_err_messages(void **state) {
    (void)state;
    em_err err = { 0 };
    assert_int_equal(em_err_set(&err, EM_EFORMAT, "%s: bad key '%s'", "a.gguf", "x"), EM_EFORMAT);
    assert_int_equal(err.code, EM_EFORMAT);
    assert_string_equal(err.msg, "a.gguf: bad key 'x'");
    em_err_prefix(&err, "loading %s", "model");
    assert_string_equal(err.msg, "loading model: a.gguf: bad key 'x'");
    assert_int_equal(em_err_set(NULL, EM_EIO, "ignored"), EM_EIO);
    char longmsg[2000];
    memset(longmsg, 'a', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = 0;
    em_err_set(&err, EM_EIO, "%s", longmsg);
    assert_int_equal(strlen(err.msg), EM_ERR_MSG - 1);
    em_err_prefix(&err, "ctx");
    assert_int_equal(strncmp(err.msg, "ctx: aaa", 8), 0);
    assert_int_equal(strlen(err.msg), EM_ERR_MSG - 1);
    assert_string_equal(em_status_name(EM_ENOTFOUND), "not found");
}

static void test_arena(void **state) {
    (void)state;
    em_arena *a;
    assert_int_equal(em_arena_create(&a, 4096, NULL), EM_OK);
    uint8_t *p1 = em_arena_alloc(a, 10);
    uint8_t *p2 = em_arena_alloc(a, 100);
    assert_non_null(p1);
    assert_non_null(p2);
    assert_int_equal((uintptr_t)p1 % 64, 0);
    assert_int_equal((uintptr_t)p2 % 64, 0);
    assert_true(p2 >= p1 + 10);
    memset(p2, 0xab, 100);
    uint8_t *big = em_arena_alloc(a, 1 << 20); /* larger than a block: gets its own */
    assert_non_null(big);
    memset(big, 1, 1 << 20);
    assert_true(em_arena_used(a) >= (1 << 20) + 128);
    em_arena_reset(a);
    assert_int_equal(em_arena_used(a), 0);
    uint8_t *again = em_arena_alloc(a, 1 << 20); /* the kept block serves it */
    assert_ptr_equal(again, big);
    em_arena_free(a);
}

typedef struct pool_ctx {
    atomic_int hits[1000];
    atomic_int threads_seen;
    int n_threads;
} pool_ctx;

static void pool_task(void *ctxp, int task, int thread) {
    pool_ctx *c = ctxp;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->threads_seen, 1000000);
}

/* Many short runs back to back, alternating two contexts and small task counts: every task of
 * every run runs exactly once, with its own run's function and context, before em_pool_run
 * returns (a worker that wakes late must not take a task of a run that has ended). */
static void test_pool_stress(void **state) {
    (void)state;
    static pool_ctx c[2];
    for (int nt = 2; nt <= 3; nt++) {
        em_pool *p;
        assert_int_equal(em_pool_create(&p, nt, NULL), EM_OK);
        for (int r = 0; r < 20000; r++) {
            pool_ctx *x = &c[r & 1];
            const int n = 2 + r % 5;
            for (int i = 0; i < 8; i++) atomic_store(&x->hits[i], 0);
            x->n_threads = nt;
            em_pool_run(p, n, pool_task, x);
            for (int i = 0; i < 8; i++)
                if (atomic_load(&x->hits[i]) != (i < n)) fail_msg("run %d (%d tasks, %d threads): task %d ran %d times", r, n, nt, i, atomic_load(&x->hits[i]));
        }
        em_pool_free(p);
        for (int k = 0; k < 2; k++) assert_int_equal(atomic_load(&c[k].threads_seen), 0);
    }
}

static void test_pool(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        em_pool *p;
        assert_int_equal(em_pool_create(&p, nt, NULL), EM_OK);
        assert_int_equal(em_pool_threads(p), nt);
        for (int round = 0; round < 50; round++) {
            static pool_ctx c;
            memset(&c, 0, sizeof c);
            c.n_threads = nt;
            int n = 1 + round * 19 % 1000;
            em_pool_run(p, n, pool_task, &c);
            for (int i = 0; i < 1000; i++) assert_int_equal(c.hits[i], i < n ? 1 : 0);
            assert_int_equal(c.threads_seen, 0);
        }
        em_pool_free(p);
    }
    em_pool *p;
    em_err err = { 0 };
    assert_int_equal(em_pool_create(&p, 0, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "thread count"));
}

/* em_phases: a lap charges the time since the last lap (or start) to its phase with the bytes
 * and pool hand-offs given; off, or before a start, laps count nothing but themselves. */
static void test_phases(void **state) {
    (void)state;
    static const char *const names[] = { "a", "b" };
    em_pool *p;
    assert_int_equal(em_pool_create(&p, 2, NULL), EM_OK);
    em_phases ph;
    em_phases_init(&ph, names, 2, p);
    em_phases_start(&ph);
    em_phases_lap(&ph, 0, 100); /* off: nothing */
    assert_int_equal(ph.sum[0].laps, 0);
    em_phases_enable(&ph, true);
    em_phases_lap(&ph, 1, 7); /* on, not started: a lap with no time */
    assert_int_equal(ph.sum[1].laps, 1);
    assert_true(ph.sum[1].seconds == 0);
    em_phases_start(&ph);
    static pool_ctx c;
    memset(&c, 0, sizeof c);
    c.n_threads = 2;
    const uint64_t runs0 = em_pool_runs(p);
    em_pool_run(p, 64, pool_task, &c);
    em_pool_run(p, 64, pool_task, &c);
    assert_int_equal(em_pool_runs(p) - runs0, 2);
    double t0 = em_time_now();
    while (em_time_now() - t0 < 2e-3) {}
    em_phases_lap(&ph, 0, 100);
    em_phases_lap(&ph, 0, 20);
    em_phases_lap(&ph, 5, 1); /* not a phase: ignored */
    assert_int_equal(ph.sum[0].laps, 2);
    assert_int_equal(ph.sum[0].bytes, 120);
    assert_int_equal(ph.sum[0].pool_runs, 2);
    assert_true(ph.sum[0].seconds >= 2e-3 && ph.sum[0].seconds < 10.0);
    assert_int_equal(ph.sum[1].bytes, 7);
    em_phases_enable(&ph, false);
    assert_int_equal(ph.sum[0].laps, 0);
    em_phases_lap(NULL, 0, 1); /* NULL-safe */
    em_phases_start(NULL);
    em_pool_free(p);
}

static void test_files(void **state) {
    (void)state;
    const char *path = em_test_path("data.bin");
    size_t n = 3 * EM_DIRECT_ALIGN + 100;
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 7 + 3);
    em_test_write(path, data, n);

    em_mmap m;
    assert_int_equal(em_mmap_open(&m, path, NULL), EM_OK);
    assert_int_equal(m.size, n);
    assert_memory_equal(m.data, data, n);
    em_mmap_close(&m);

    em_err err = { 0 };
    assert_int_equal(em_mmap_open(&m, em_test_path("missing.bin"), &err), EM_EIO);
    assert_non_null(strstr(err.msg, "missing.bin"));

    int fd = open(path, O_RDONLY);
    uint8_t buf[256];
    assert_int_equal(em_pread_full(fd, buf, 200, 1000, path, NULL), EM_OK);
    assert_memory_equal(buf, data + 1000, 200);
    assert_int_equal(em_pread_full(fd, buf, 200, n - 50, path, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    assert_non_null(strstr(err.msg, "data.bin"));
    close(fd);

    em_dfile f;
    assert_int_equal(em_dfile_open(&f, path, NULL), EM_OK);
    assert_int_equal(f.size, n);
    uint8_t *abuf = em_aligned_alloc(EM_DIRECT_ALIGN, 2 * EM_DIRECT_ALIGN, "test", NULL);
    assert_int_equal(em_dfile_read(&f, abuf, 2 * EM_DIRECT_ALIGN, EM_DIRECT_ALIGN, NULL), EM_OK);
    assert_memory_equal(abuf, data + EM_DIRECT_ALIGN, 2 * EM_DIRECT_ALIGN);
    assert_int_equal(em_dfile_read(&f, abuf, 33, 5, NULL), EM_OK); /* unaligned: buffered */
    assert_memory_equal(abuf, data + 5, 33);
    assert_int_equal(em_dfile_read(&f, abuf, 200, n - 100, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "past end"));
    free(abuf);
    em_dfile_close(&f);

    char *text;
    size_t len;
    em_test_write(em_test_path("t.txt"), "hello", 5);
    assert_int_equal(em_file_read_all(em_test_path("t.txt"), &text, &len, NULL), EM_OK);
    assert_int_equal(len, 5);
    assert_string_equal(text, "hello");
    free(text);
    assert_true(em_file_exists(path));
    assert_false(em_file_exists(em_test_path("nope")));
    free(data);
}

/* A file of n pattern bytes (none zero) at path; returns the pattern. */
static uint8_t *pattern_file(const char *path, size_t n) {
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(1 + i % 251);
    em_test_write(path, data, n);
    return data;
}

/* Reads every byte of m through a volatile pointer (the compiler must not skip the loads). */
static void read_all(const em_mmap *m, uint8_t *copy) {
    const volatile uint8_t *p = m->data;
    for (uint64_t i = 0; i < m->size; i++) copy[i] = p[i];
}

static void test_guarded_mapping(void **state) {
    (void)state;
    const long page = sysconf(_SC_PAGESIZE);
    const size_t n = 5 * (size_t)page + 100, cut = 2 * (size_t)page + 10;
    const char *path = em_test_path("guarded.bin");
    uint8_t *data = pattern_file(path, n), *copy = malloc(n);
    em_err err = { 0 };

    /* truncated while mapped, then read: zeros past the new end instead of SIGBUS */
    em_mmap m;
    assert_int_equal(em_mmap_open_guarded(&m, path, &err), EM_OK);
    assert_int_equal(m.size, n);
    assert_int_equal(em_mmap_check(true, &err), EM_OK);
    assert_false(em_mmap_damaged(&m));
    assert_int_equal(truncate(path, (off_t)cut), 0);
    read_all(&m, copy);
    assert_memory_equal(copy, data, cut);
    for (size_t i = cut; i < n; i++)
        if (copy[i]) fail_msg("byte %zu past the new end reads %u, want 0", i, copy[i]);
    assert_true(em_mmap_damaged(&m));
    assert_int_equal(em_mmap_check(false, &err), EM_EIO); /* the fault alone tells */
    char want[256];
    snprintf(want, sizeof want, "%s changed on disk while mapped (%zu bytes now, %zu mapped)", path, cut, n);
    assert_string_equal(err.msg, want);
    em_mmap_close(&m);
    assert_int_equal(em_mmap_check(true, &err), EM_OK); /* closed: no longer watched */

    /* shrunk between two uses: the size check sees it before any read */
    em_test_write(path, data, n);
    assert_int_equal(em_mmap_open_guarded(&m, path, &err), EM_OK);
    assert_int_equal(truncate(path, (off_t)cut), 0);
    assert_int_equal(em_mmap_check(false, &err), EM_OK); /* no fault, files not looked at */
    assert_int_equal(em_mmap_check(true, &err), EM_EIO);
    assert_string_equal(err.msg, want);
    assert_true(em_mmap_damaged(&m));
    em_test_write(path, data, n); /* the old size again: still damaged, the pages are gone */
    assert_int_equal(em_mmap_check(false, &err), EM_EIO);
    em_mmap_close(&m);

    /* rewritten in place (same size, new modification time) */
    assert_int_equal(em_mmap_open_guarded(&m, path, &err), EM_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    struct timespec later[2] = { st.st_atim, st.st_mtim };
    later[1].tv_sec += 10;
    assert_int_equal(utimensat(AT_FDCWD, path, later, 0), 0);
    assert_int_equal(em_mmap_check(true, &err), EM_EIO);
    snprintf(want, sizeof want, "%s changed on disk while mapped (%zu bytes now, %zu mapped)", path, n, n);
    assert_string_equal(err.msg, want);
    em_mmap_close(&m);

    /* a plain mapping is not guarded: in a child, its fault still ends the process with SIGBUS
     * (the handler, installed above, hands faults outside guarded mappings on) */
    em_test_write(path, data, n);
    em_test_write(em_test_path("other.bin"), "guarded", 7);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGBUS, SIG_DFL); /* not the test harness's handler: the default is chained to */
        em_mmap g, plain;
        if (em_mmap_open_guarded(&g, em_test_path("other.bin"), NULL) || em_mmap_open(&plain, path, NULL)) _exit(3);
        if (truncate(path, (off_t)cut)) _exit(4);
        read_all(&plain, copy);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGBUS)
        fail_msg("the child read a truncated plain mapping and ended with status 0x%x, want SIGBUS", status);
    free(copy);
    free(data);
}

static void test_sha256(void **state) {
    (void)state;
    em_sha256 *s;
    uint8_t d[32];
    char hex[65];
    assert_int_equal(em_sha256_create(&s, NULL), EM_OK);
    em_sha256_update(s, "abc", 3);
    em_sha256_final(s, d);
    em_sha256_free(s);
    em_sha256_hex(d, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    /* FIPS 180-2 "one million a" vector, through the file path in 1 MiB reads */
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    em_test_write(em_test_path("a.bin"), a, n);
    free(a);
    assert_int_equal(em_sha256_file(em_test_path("a.bin"), hex, NULL), EM_OK);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    em_test_write(em_test_path("empty.bin"), "", 0);
    assert_int_equal(em_sha256_file(em_test_path("empty.bin"), hex, NULL), EM_OK);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_parse(void **state) {
    (void)state;
    uint64_t v;
    em_err err = { 0 };
    assert_int_equal(em_parse_size("4096", &v, NULL), EM_OK);
    assert_int_equal(v, 4096);
    assert_int_equal(em_parse_size("8GiB", &v, NULL), EM_OK);
    assert_int_equal(v, 8ull << 30);
    assert_int_equal(em_parse_size("512MiB", &v, NULL), EM_OK);
    assert_int_equal(v, 512ull << 20);
    assert_int_equal(em_parse_size("1.5gib", &v, NULL), EM_OK);
    assert_int_equal(v, 3ull << 29);
    assert_int_equal(em_parse_size("2G", &v, NULL), EM_OK);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(em_parse_size("3GB", &v, NULL), EM_OK);
    assert_int_equal(v, 3000000000ull);
    assert_int_equal(em_parse_size("10B", &v, NULL), EM_OK);
    assert_int_equal(v, 10);
    const char *bad[] = { "", "-1", "abc", "12XB", "1.5", "1e300", " 5", "nan", "inf", "0x10q" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_not_equal(em_parse_size(bad[i], &v, &err), EM_OK);
    assert_int_equal(em_parse_size("99999999TiB", &v, &err), EM_EOVERFLOW);

    long long x;
    assert_int_equal(em_parse_int("42", 0, 100, &x, "--threads", NULL), EM_OK);
    assert_int_equal(x, 42);
    assert_int_equal(em_parse_int("101", 0, 100, &x, "--threads", &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "--threads"));
    assert_int_equal(em_parse_int("4x", 0, 100, &x, "--threads", &err), EM_EINVAL);
    assert_int_equal(em_parse_int("", 0, 100, &x, "--threads", &err), EM_EINVAL);

    char buf[32];
    assert_string_equal(em_format_size(512, buf, sizeof buf), "512 B");
    assert_string_equal(em_format_size(3ull << 29, buf, sizeof buf), "1.50 GiB");
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_half(void **state) {
    (void)state;
#ifdef __FLT16_MAX__
    /* the compiler's _Float16 conversions are an independent IEEE reference */
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 x;
        uint16_t hb = (uint16_t)h;
        memcpy(&x, &hb, 2);
        float ref = (float)x;
        float got = em_fp16_to_fp32(hb);
        if (isnan(ref)) assert_true(isnan(got));
        else assert_int_equal(fbits(got), fbits(ref));
    }
    uint64_t seed = 1;
    for (int i = 0; i < 4000000; i++) {
        uint32_t u = (uint32_t)em_test_rand(&seed);
        if (i < 65536 * 8) u = ((uint32_t)(i >> 3) << 16) | ((uint32_t)(i & 7) << 12); /* near ties */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        _Float16 r = (_Float16)f;
        uint16_t ref;
        memcpy(&ref, &r, 2);
        uint16_t got = em_fp32_to_fp16(f);
        if (got != ref) fail_msg("fp32 %08x -> fp16: got %04x, want %04x", u, got, ref);
    }
#endif
    assert_int_equal(em_fp32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(em_fp32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(em_fp32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(em_fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(em_fp32_to_fp16(5.9604644775390625e-8f), 0x0001);
    assert_int_equal(em_fp32_to_fp16(NAN) & 0x7e00, 0x7e00);
    assert_true(em_fp16_to_fp32(0x3555) > 0.333f && em_fp16_to_fp32(0x3555) < 0.3334f);
    /* bf16: round to nearest even on the dropped 16 bits, NaN forced quiet */
    assert_int_equal(em_fp32_to_bf16(1.0f), 0x3f80);
    float t;
    uint32_t u = 0x3f808000; /* exactly halfway between 0x3f80 and 0x3f81: even stays */
    memcpy(&t, &u, 4);
    assert_int_equal(em_fp32_to_bf16(t), 0x3f80);
    u = 0x3f818000; /* halfway, odd: rounds up */
    memcpy(&t, &u, 4);
    assert_int_equal(em_fp32_to_bf16(t), 0x3f82);
    u = 0x7f800001; /* signalling NaN becomes quiet */
    memcpy(&t, &u, 4);
    assert_int_equal(em_fp32_to_bf16(t), 0x7fc0);
    assert_int_equal(fbits(em_bf16_to_fp32(0xbf80)), fbits(-1.0f));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_messages), cmocka_unit_test(test_arena),
        cmocka_unit_test(test_pool), cmocka_unit_test(test_phases),         cmocka_unit_test(test_pool_stress),         cmocka_unit_test(test_files),
        cmocka_unit_test(test_guarded_mapping),
        cmocka_unit_test(test_sha256),       cmocka_unit_test(test_parse),
        cmocka_unit_test(test_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

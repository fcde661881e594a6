/* Test helpers: scratch folder per process, file I/O that fails the test loudly, shell runs. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[512];

static void remove_dir(void) {
    if (g_dir[0] && !getenv("EMBER_KEEP_TMP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
    }
}

const char *em_test_dir(void) {
    if (!g_dir[0]) {
        const char *base = getenv("EMBER_TMP");
        char cmd[600];
        if (!base || !*base) base = "/tmp";
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", base);
        if (system(cmd) != 0) fail_msg("cannot create %s", base);
        snprintf(g_dir, sizeof g_dir, "%s/emtest.XXXXXX", base);
        if (!mkdtemp(g_dir)) fail_msg("mkdtemp %s failed", g_dir);
        atexit(remove_dir);
    }
    return g_dir;
}

const char *em_test_path(const char *name) {
    static char bufs[8][768];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", em_test_dir(), name);
    return b;
}

const char *em_test_src(const char *rel) {
    static char bufs[8][768];
    static int next;
    char *b = bufs[next++ & 7];
    const char *src = getenv("EMBER_SRC");
    snprintf(b, sizeof bufs[0], "%s/%s", src && *src ? src : ".", rel);
    return b;
}

void em_test_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    if (n && fwrite(data, 1, n, f) != n) fail_msg("short write to %s", path);
    if (fclose(f) != 0) fail_msg("close %s failed", path);
}

void *em_test_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf) fail_msg("out of memory reading %s", path);
    if (len && fread(buf, 1, (size_t)len, f) != (size_t)len) fail_msg("short read of %s", path);
    buf[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return buf;
}

float *em_test_read_f32(const char *path, size_t n) {
    size_t bytes;
    float *v = em_test_read(path, &bytes);
    if (bytes != n * sizeof(float))
        fail_msg("%s: %zu bytes, want %zu f32 values (%zu bytes)", path, bytes, n, n * sizeof(float));
    return v;
}

int em_test_sh(int capture, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof cmd - 200) fail_msg("command too long");
    if (capture)
        snprintf(cmd + len, sizeof cmd - (size_t)len, " >'%s' 2>'%s'", em_test_path("out.txt"),
                 em_test_path("err.txt"));
    int rc = system(cmd);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int em_test_convert(const char *bin, const char *src_dir, const char *out, const char *type) {
    return em_test_sh(1, "'%s' convert '%s' -o '%s' --type %s", bin, src_dir, out, type);
}

int em_test_convert_fixture(const char *bin, const char *name, const char *type, char *out,
                            size_t cap) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/%s", name);
    snprintf(out, cap, "%s/%s_%s.gguf", em_test_dir(), name, type);
    int rc = em_test_convert(bin, em_test_src(rel), out, type);
    if (rc != 0) {
        fprintf(stderr, "ember convert %s --type %s failed (%d)\n", name, type, rc);
        return -1;
    }
    return 0;
}

uint64_t em_test_rand(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float em_test_randf(uint64_t *s) {
    return (float)((double)(em_test_rand(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

/* Monotonic time, byte-size and integer parsing for flags and keys, size formatting. */
#include "base.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

double em_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const struct {
    const char *suffix;
    double mult;
} size_units[] = {
    { "", 1.0 },           { "b", 1.0 },
    { "k", 1024.0 },       { "kib", 1024.0 },       { "kb", 1e3 },
    { "m", 1048576.0 },    { "mib", 1048576.0 },    { "mb", 1e6 },
    { "g", 1073741824.0 }, { "gib", 1073741824.0 }, { "gb", 1e9 },
    { "t", 1099511627776.0 }, { "tib", 1099511627776.0 }, { "tb", 1e12 },
};

int em_parse_size(const char *text, uint64_t *out, em_err *err) {
    if (!text || !*text || isspace((unsigned char)*text) || *text == '-' || *text == '+')
        return em_err_set(err, EM_EINVAL, "bad byte size '%s' (expected e.g. 8GiB, 512MiB, 4096)",
                          text ? text : "");
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (end == text || errno == ERANGE || !isfinite(v) || v < 0)
        return em_err_set(err, EM_EINVAL, "bad byte size '%s' (expected e.g. 8GiB, 512MiB, 4096)",
                          text);
    for (size_t i = 0; i < sizeof size_units / sizeof size_units[0]; i++) {
        if (strcasecmp(end, size_units[i].suffix)) continue;
        double bytes = v * size_units[i].mult;
        if (bytes >= 18446744073709551616.0)
            return em_err_set(err, EM_EOVERFLOW, "byte size '%s' is too large", text);
        if (bytes != floor(bytes))
            return em_err_set(err, EM_EINVAL, "byte size '%s' is not a whole number of bytes", text);
        *out = (uint64_t)bytes;
        return EM_OK;
    }
    return em_err_set(err, EM_EINVAL,
                      "bad byte size '%s': unknown unit '%s' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                      text, end);
}

const char *em_format_size(uint64_t bytes, char *buf, size_t cap) {
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

int em_parse_int(const char *text, long long lo, long long hi, long long *out, const char *name,
                 em_err *err) {
    if (!text || !*text || isspace((unsigned char)*text))
        return em_err_set(err, EM_EINVAL, "%s: expected an integer, got '%s'", name,
                          text ? text : "");
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (*end || end == text)
        return em_err_set(err, EM_EINVAL, "%s: expected an integer, got '%s'", name, text);
    if (errno == ERANGE || v < lo || v > hi)
        return em_err_set(err, EM_EINVAL, "%s: %s is out of range %lld..%lld", name, text, lo, hi);
    *out = v;
    return EM_OK;
}

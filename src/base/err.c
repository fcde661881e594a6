/* Status codes, error messages and logging. The log level is the one piece of global
 * mutable state the project allows; everything else travels in an em_err. */
#include "base.h"

#include <stdio.h>
#include <string.h>

int em_err_set(em_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int em_err_prefix(em_err *err, const char *fmt, ...) {
    if (!err) return EM_EINVAL;
    char joined[2 * EM_ERR_MSG + 2];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(joined, EM_ERR_MSG, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if (n >= EM_ERR_MSG) n = EM_ERR_MSG - 1;
    joined[n++] = ':';
    joined[n++] = ' ';
    memcpy(joined + n, err->msg, strnlen(err->msg, EM_ERR_MSG - 1) + 1);
    joined[n + EM_ERR_MSG - 1] = 0;
    memcpy(err->msg, joined, EM_ERR_MSG - 1); /* truncates, keeping the new context */
    err->msg[EM_ERR_MSG - 1] = 0;
    return err->code;
}

const char *em_status_name(int code) {
    switch (code) {
    case EM_OK: return "ok";
    case EM_EINVAL: return "invalid argument";
    case EM_ENOMEM: return "out of memory";
    case EM_EIO: return "I/O error";
    case EM_EFORMAT: return "malformed input";
    case EM_ENOTFOUND: return "not found";
    case EM_EUNSUPPORTED: return "unsupported";
    case EM_EOVERFLOW: return "size overflow";
    default: return "unknown status";
    }
}

static enum em_log_level g_log_level = EM_LOG_INFO;

void em_log_set_level(enum em_log_level level) { g_log_level = level; }
enum em_log_level em_log_get_level(void) { return g_log_level; }

void em_log(enum em_log_level level, const char *fmt, ...) {
    static const char *const names[] = { "error", "warning", "info", "debug" };
    if (level > g_log_level) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* one fputs per line so lines from different threads do not interleave */
    char out[2100];
    snprintf(out, sizeof out, "ember: %s: %s\n", names[level], line);
    fputs(out, stderr);
}

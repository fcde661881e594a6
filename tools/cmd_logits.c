/* `ember logits -m MODEL.gguf --tokens 1,2,3 -o OUT.f32`: the logits of every position of one
 * full-sequence forward (a prefill from an empty state), written as little-endian f32
 * [n_tokens][n_vocab], row t = the logits after tokens 0..t. A failed run removes OUT. */
#include "cli.h"

#include "model/model.h"
#include "model_flags.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char logits_usage[] =
    "usage: ember logits -m MODEL.gguf --tokens LIST -o OUT.f32 [--threads N] [--ctx N] [--device D]\n"
    "                    [--devices L]\n"
    "\n"
    "Runs the model over the token ids of LIST from an empty state and writes the logits of\n"
    "every position to OUT.f32 as little-endian f32 [n_tokens][n_vocab].\n"
    "\n"
    "  -m, --model FILE    the model (GGUF)\n"
    "  --tokens LIST       token ids: \"1,2,3\", or @FILE holding them (commas or white space)\n"
    "  -o, --output OUT    the file to write\n"
    "  --threads N         compute threads (default: all CPUs)\n"
    "  --ctx N             context positions (default: the model's, at most 4096)\n"
    "  --device D          cpu, cuda:N or auto (default: cuda:0 when the model fits there, else cpu)\n"
    "  --devices L         the routed experts over several GPUs, e.g. cuda:0,cuda:1 (the first holds the\n"
    "                      rest of the model)\n";

#define MAX_TOKENS (1 << 24)

/* Parses ids separated by commas and/or white space into *out (malloc'd). */
static int parse_tokens(const char *text, int32_t **out, int *n_out, em_err *err) {
    int cap = 64, n = 0;
    int32_t *v = em_malloc((size_t)cap * sizeof *v, "token list", err);
    if (!v) return EM_ENOMEM;
    const char *p = text;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        const char *start = p;
        if (*p == '-' || *p == '+') p++;
        while (*p >= '0' && *p <= '9') p++;
        size_t len = (size_t)(p - start);
        char buf[32];
        if (len == 0 || len >= sizeof buf || (*p && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')) {
            free(v);
            return em_err_set(err, EM_EINVAL, "--tokens: '%.20s' is not a token id", start);
        }
        memcpy(buf, start, len);
        buf[len] = 0;
        long long id;
        int rc = em_parse_int(buf, INT32_MIN, INT32_MAX, &id, "--tokens", err);
        if (rc) {
            free(v);
            return rc;
        }
        if (n == MAX_TOKENS) {
            free(v);
            return em_err_set(err, EM_EINVAL, "--tokens: more than %d ids", MAX_TOKENS);
        }
        if (n == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                return em_err_set(err, EM_ENOMEM, "out of memory for the token list");
            }
            v = nv;
        }
        v[n++] = (int32_t)id;
    }
    if (n == 0) {
        free(v);
        return em_err_set(err, EM_EINVAL, "--tokens: no token ids");
    }
    *out = v;
    *n_out = n;
    return EM_OK;
}

static int read_tokens(const char *arg, int32_t **out, int *n, em_err *err) {
    if (arg[0] != '@') return parse_tokens(arg, out, n, err);
    char *text;
    size_t len;
    int rc = em_file_read_all(arg + 1, &text, &len, err);
    if (rc) return rc;
    rc = strlen(text) != len ? em_err_set(err, EM_EINVAL, "%s: holds a NUL byte", arg + 1)
                             : parse_tokens(text, out, n, err);
    free(text);
    return rc;
}

static int run_logits(const char *model, const int32_t *tok, int n, const char *out,
                      const em_model_opts *opts, em_err *err) {
    em_target *t;
    int rc = em_model_open(&t, model, opts, err);
    if (rc) return rc;
    const em_target_info *info = em_target_get_info(t);
    uint64_t count;
    float *logits = NULL;
    if (em_mul_overflow((uint64_t)n, (uint64_t)info->n_vocab, &count) || count > SIZE_MAX / sizeof(float))
        rc = em_err_set(err, EM_EOVERFLOW, "%d tokens x %d logits do not fit in memory", n, info->n_vocab);
    else if (!(logits = em_malloc((size_t)count * sizeof *logits, "logits", err)))
        rc = EM_ENOMEM;
    if (!rc) {
        em_rows rows = { .logits = logits };
        rc = em_target_prefill(t, tok, n, &rows, err);
        if (rc == EM_EINVAL && n > info->n_ctx && !opts->n_ctx)
            em_err_prefix(err, "%d tokens need --ctx %d or more", n, n);
    }
    if (!rc) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0) rc = em_err_set(err, EM_EIO, "%s: cannot create: %s", out, strerror(errno));
        else {
            rc = em_write_full(fd, logits, (size_t)count * sizeof *logits, out, err);
            if (close(fd) != 0 && !rc) rc = em_err_set(err, EM_EIO, "%s: close failed: %s", out, strerror(errno));
            if (rc) unlink(out);
        }
    }
    free(logits);
    em_target_close(t);
    return rc;
}

static int logits_main(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *out = NULL;
    em_model_opts opts = { 0 };
    em_err err = { 0 };
    int devices[EM_GPU_MAX_SHARES];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--tokens") || !strcmp(a, "-o") ||
                     !strcmp(a, "--output") || !strcmp(a, "--threads") || !strcmp(a, "--ctx") || !strcmp(a, "--device") ||
                     !strcmp(a, "--devices");
        if (!takes) {
            if (a[0] == '-') return em_cli_usage_error(&em_cmd_logits, "unknown flag '%s'", a);
            return em_cli_usage_error(&em_cmd_logits, "unexpected argument '%s'", a);
        }
        if (!val) return em_cli_usage_error(&em_cmd_logits, "%s needs a value", a);
        i++;
        long long v;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = val;
        else if (!strcmp(a, "--tokens")) tokens = val;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = val;
        else if (!strcmp(a, "--device")) {
            int rc = em_cli_device(&em_cmd_logits, a, val, &opts.device, &opts.cuda_index);
            if (rc >= 0) return rc;
        } else if (!strcmp(a, "--devices")) {
            int rc = em_cli_devices(&em_cmd_logits, a, val, devices, &opts.n_cuda_devices);
            if (rc >= 0) return rc;
            opts.cuda_devices = devices;
        }
        else if (!strcmp(a, "--threads")) {
            if (em_parse_int(val, 1, 1024, &v, "--threads", &err)) return em_cli_usage_error(&em_cmd_logits, "%s", err.msg);
            opts.n_threads = (int)v;
        } else {
            if (em_parse_int(val, 1, 1 << 24, &v, "--ctx", &err)) return em_cli_usage_error(&em_cmd_logits, "%s", err.msg);
            opts.n_ctx = (int)v;
        }
    }
    if (!model) return em_cli_usage_error(&em_cmd_logits, "missing -m MODEL.gguf");
    if (!tokens) return em_cli_usage_error(&em_cmd_logits, "missing --tokens LIST");
    if (!out) return em_cli_usage_error(&em_cmd_logits, "missing -o OUT.f32");

    int32_t *tok;
    int n;
    if (read_tokens(tokens, &tok, &n, &err)) return em_cli_fail(&em_cmd_logits, &err);
    int rc = run_logits(model, tok, n, out, &opts, &err);
    free(tok);
    return rc ? em_cli_fail(&em_cmd_logits, &err) : EM_EXIT_OK;
}

const em_cmd em_cmd_logits = {
    .name = "logits",
    .summary = "logits of every position of a token sequence (f32 [n_tokens][n_vocab])",
    .usage = logits_usage,
    .main = logits_main,
};

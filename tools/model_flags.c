/* tools/model_flags.c: parsing of the model flags shared by `ember serve` (and meant for
 * `ember run`, whose messages it repeats word for word). Flags of features that do not exist
 * yet (drafters, CUDA, SSD experts, the expert cache, feature dtypes) are checked for a
 * well-formed value and then refused with exit 2, never ignored. */
#include "model_flags.h"

#include <stdio.h>
#include <string.h>

static const char *const value_flags[] = {
    "-m", "--model", "--threads", "-c", "--ctx-size", "--draft", "--device", "--draft-device",
    "--moe-storage", "--expert-cache", "--verify-width", "--feature-dtype",
};

bool em_model_flag(const char *a) {
    for (size_t i = 0; i < sizeof value_flags / sizeof value_flags[0]; i++)
        if (!strcmp(a, value_flags[i])) return true;
    return false;
}

static int not_yet(const em_cmd *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int not_yet(const em_cmd *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "ember %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return EM_EXIT_USAGE;
}

static int parse_int(const em_cmd *cmd, const char *flag, const char *text, long long lo, long long hi, int *out) {
    long long v;
    em_err err = { 0 };
    if (em_parse_int(text, lo, hi, &v, flag, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
    *out = (int)v;
    return -1;
}

/* cpu is the only device so far; cuda[:N] is named as not yet available. */
static int check_device(const em_cmd *cmd, const char *flag, const char *v) {
    if (!strcmp(v, "cpu")) return -1;
    if (!strncmp(v, "cuda", 4) && (v[4] == 0 || v[4] == ':'))
        return not_yet(cmd, "%s %s: the CUDA backend is not available yet (use cpu)", flag, v);
    return em_cli_usage_error(cmd, "%s: '%s' is not cpu or cuda:N", flag, v);
}

/* The flags of features still to come: checked for a well-formed value, then refused. */
static int check_future_flag(const em_cmd *cmd, const char *a, const char *v) {
    if (!strcmp(a, "--draft")) {
        if (!strcmp(v, "none")) return -1;
        return not_yet(cmd, "--draft %s: speculative decoding with a drafter is not available yet (issue 6); use --draft none", v);
    }
    if (!strcmp(a, "--device") || !strcmp(a, "--draft-device")) return check_device(cmd, a, v);
    if (!strcmp(a, "--moe-storage")) {
        if (!strcmp(v, "resident") || !strcmp(v, "auto")) return -1;
        if (!strcmp(v, "ssd"))
            return not_yet(cmd, "--moe-storage ssd: streaming experts from SSD is not available yet (use resident or auto)");
        return em_cli_usage_error(cmd, "--moe-storage: '%s' is not resident, ssd or auto", v);
    }
    if (!strcmp(a, "--expert-cache")) {
        uint64_t bytes;
        em_err err = { 0 };
        if (em_parse_size(v, &bytes, &err)) return em_cli_usage_error(cmd, "--expert-cache: %s", err.msg);
        return not_yet(cmd, "--expert-cache %s: the expert cache is not available yet (every expert is resident)", v);
    }
    return not_yet(cmd, "--feature-dtype %s: drafter features are not available yet (there is no drafter)", v);
}

int em_model_flag_parse(const em_cmd *cmd, const char *a, const char *v, em_model_flags *f) {
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) f->model = v;
    else if (!strcmp(a, "--threads")) return parse_int(cmd, a, v, 1, 1024, &f->n_threads);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) return parse_int(cmd, a, v, 1, 1 << 24, &f->n_ctx);
    else if (!strcmp(a, "--verify-width")) {
        int rc = parse_int(cmd, a, v, 0, 1 << 16, &f->verify_width);
        if (rc < 0 && f->verify_width > 1)
            return not_yet(cmd, "--verify-width %d: verifying more than one row is not available yet (it needs a drafter, issue 6)",
                           f->verify_width);
        return rc;
    } else return check_future_flag(cmd, a, v);
    return -1;
}

int em_model_flags_need_model(const em_cmd *cmd, const em_model_flags *f) {
    if (f->model) return -1;
    fprintf(stderr, "ember %s: no model given, and there is no default model yet (the shipped default model pair "
                    "is issue 7): pass -m TARGET.gguf\n", cmd->name);
    return EM_EXIT_USAGE;
}

em_model_opts em_model_flags_opts(const em_model_flags *f) {
    return (em_model_opts){ .n_threads = f->n_threads, .n_ctx = f->n_ctx };
}

/* tools/model_flags.c: parsing of the model flags shared by `ember run` and `ember serve`, and
 * opening what they name (the drafter first: its tap layers are the target's feature layers).
 * Flags of features that do not exist yet (the drafter on a CUDA device) are checked for a
 * well-formed value and then refused with exit 2, never ignored. Without -m, the default pair's folder is
 * $EMBER_MODELS when set (and only that), else the compile-time EMBER_MODELS_DIR, else models/
 * next to or above the executable's folder: the first that holds the target file. */
#include "model_flags.h"

#include "backend/gpu.h"
#include "quant/quant.h"
#include "decode/decode.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const value_flags[] = {
    "-m", "--model", "--threads", "-c", "--ctx-size", "--draft", "--device", "--draft-device",
    "--moe-storage", "--expert-cache", "--expert-prefetch", "--verify-width", "--feature-dtype", "--spec-policy",
    "--devices",
};

bool em_model_flag(const char *a) {
    for (size_t i = 0; i < sizeof value_flags / sizeof value_flags[0]; i++)
        if (!strcmp(a, value_flags[i])) return true;
    return false;
}

static int parse_int(const em_cmd *cmd, const char *flag, const char *text, long long lo, long long hi, int *out) {
    long long v;
    em_err err = { 0 };
    if (em_parse_int(text, lo, hi, &v, flag, &err)) return em_cli_usage_error(cmd, "%s", err.msg);
    *out = (int)v;
    return -1;
}

int em_cli_device(const em_cmd *cmd, const char *flag, const char *v, int *device, int *cuda_index) {
    if (!strcmp(v, "cpu") || !strcmp(v, "auto")) {
        *device = v[0] == 'c' ? EM_DEVICE_CPU : EM_DEVICE_AUTO;
        return -1;
    }
    if (!strncmp(v, "cuda", 4) && (v[4] == 0 || v[4] == ':')) {
        em_err err = { 0 };
        if (em_gpu_parse_device(v, cuda_index, &err)) return em_cli_usage_error(cmd, "%s: %s", flag, err.msg);
        *device = EM_DEVICE_CUDA;
        return -1;
    }
    return em_cli_usage_error(cmd, "%s: '%s' is not cpu, auto, cuda or cuda:N", flag, v);
}

int em_cli_devices(const em_cmd *cmd, const char *flag, const char *v, int *list, int *n) {
    char buf[256];
    if (strlen(v) >= sizeof buf) return em_cli_usage_error(cmd, "%s: the list is too long", flag);
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    char *save = NULL;
    for (char *d = strtok_r(buf, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        em_err err = { 0 };
        if (*n == EM_GPU_MAX_SHARES) return em_cli_usage_error(cmd, "%s: more than %d devices", flag, EM_GPU_MAX_SHARES);
        if (strncmp(d, "cuda", 4) || em_gpu_parse_device(d, &list[*n], &err))
            return em_cli_usage_error(cmd, "%s: '%s' is not cuda:N%s%s", flag, d, err.msg[0] ? ": " : "", err.msg);
        for (int i = 0; i < *n; i++)
            if (list[i] == list[*n]) return em_cli_usage_error(cmd, "%s: cuda:%d is listed twice", flag, list[i]);
        ++*n;
    }
    if (*n == 0) return em_cli_usage_error(cmd, "%s: no device in '%s'", flag, v);
    return -1;
}

/* --draft-device: cpu, cuda or cuda:N (auto is the target's business only). */
static int parse_draft_device(const em_cmd *cmd, const char *flag, const char *v, em_model_flags *f) {
    int device = EM_DEVICE_CPU, index = 0;
    int rc = em_cli_device(cmd, flag, v, &device, &index);
    if (rc >= 0) return rc;
    if (device == EM_DEVICE_AUTO) return em_cli_usage_error(cmd, "%s: '%s' is not cpu, cuda or cuda:N", flag, v);
    f->draft_device = device == EM_DEVICE_CPU ? NULL : v;
    return -1;
}

/* The other flags: drafter, devices, expert storage, features. */
static int check_future_flag(const em_cmd *cmd, const char *a, const char *v, em_model_flags *f) {
    if (!strcmp(a, "--draft")) {
        f->draft = strcmp(v, "none") ? v : NULL;
        f->draft_given = true;
        return -1;
    }
    if (!strcmp(a, "--device")) return em_cli_device(cmd, a, v, &f->device, &f->cuda_index);
    if (!strcmp(a, "--devices")) return em_cli_devices(cmd, a, v, f->cuda_devices, &f->n_cuda_devices);
    if (!strcmp(a, "--draft-device")) return parse_draft_device(cmd, a, v, f);
    if (!strcmp(a, "--moe-storage")) {
        if (!strcmp(v, "resident") || !strcmp(v, "auto") || !strcmp(v, "ssd")) {
            f->moe_storage = v;
            return -1;
        }
        return em_cli_usage_error(cmd, "--moe-storage: '%s' is not resident, ssd or auto", v);
    }
    if (!strcmp(a, "--expert-cache")) {
        em_err err = { 0 };
        if (em_parse_size(v, &f->expert_cache, &err)) return em_cli_usage_error(cmd, "--expert-cache: %s", err.msg);
        if (f->expert_cache == 0) return em_cli_usage_error(cmd, "--expert-cache: '%s' is no room for any expert", v);
        return -1;
    }
    if (!strcmp(a, "--expert-prefetch")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            return em_cli_usage_error(cmd, "--expert-prefetch: '%s' is not on or off", v);
        f->expert_no_prefetch = !strcmp(v, "off");
        return -1;
    }
    if (em_decode_feature_type(v) < 0)
        return em_cli_usage_error(cmd, "--feature-dtype: '%s' is not f32, f16, bf16 or q8_0", v);
    f->feature_dtype = v;
    return -1;
}

int em_model_flag_parse(const em_cmd *cmd, const char *a, const char *v, em_model_flags *f) {
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) f->model = v;
    else if (!strcmp(a, "--threads")) return parse_int(cmd, a, v, 1, 1024, &f->n_threads);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) return parse_int(cmd, a, v, 1, 1 << 24, &f->n_ctx);
    else if (!strcmp(a, "--verify-width")) {
        return parse_int(cmd, a, v, 0, EM_DECODE_MAX_WIDTH, &f->verify_width);
    } else if (!strcmp(a, "--spec-policy")) {
        if (em_decode_spec_policy(v) < 0)
            return em_cli_usage_error(cmd, "--spec-policy: '%s' is not auto, nominal or always", v);
        f->spec_policy = v;
    } else return check_future_flag(cmd, a, v, f);
    return -1;
}

static bool is_file(const char *path) { return access(path, R_OK) == 0; }

/* dir/name into out; false when it does not fit. */
static bool join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n > 0 && (size_t)n < cap;
}

/* The folders that may hold the default pair, in order; returns how many (at most 3). The
 * executable's folder comes from /proc/self/exe (Linux); without it, the first two only. */
static int candidate_dirs(char dirs[3][PATH_MAX]) {
    const char *env = getenv("EMBER_MODELS");
    if (env && *env) {
        snprintf(dirs[0], PATH_MAX, "%s", env);
        return 1;
    }
    int n = 0;
    snprintf(dirs[n++], PATH_MAX, "%s", EMBER_MODELS_DIR);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return n;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return n;
    *slash = 0;
    if (join(dirs[n], PATH_MAX, exe, "../models")) n++;
    if (join(dirs[n], PATH_MAX, exe, "models")) n++;
    return n;
}

/* The default target (and, with want_draft, drafter) into f; else prints where it looked. */
static int find_default_pair(const em_cmd *cmd, em_model_flags *f, bool want_draft) {
    char dirs[3][PATH_MAX];
    int n = candidate_dirs(dirs);
    for (int i = 0; i < n; i++) {
        if (!join(f->default_model, sizeof f->default_model, dirs[i], EM_DEFAULT_TARGET_FILE) ||
            !is_file(f->default_model))
            continue;
        f->model = f->default_model;
        if (!want_draft) return -1;
        if (join(f->default_draft, sizeof f->default_draft, dirs[i], EM_DEFAULT_DRAFT_FILE) &&
            is_file(f->default_draft)) {
            f->draft = f->default_draft;
            return -1;
        }
        fprintf(stderr, "ember %s: no -m given: the default target %s is there, but not its drafter %s/%s; "
                "pass --draft none for plain decoding, or --draft DRAFT.gguf\n", cmd->name, f->model, dirs[i],
                EM_DEFAULT_DRAFT_FILE);
        return EM_EXIT_FAIL;
    }
    fprintf(stderr, "ember %s: no -m given, and the default model %s is not in ", cmd->name, EM_DEFAULT_TARGET_FILE);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? (i + 1 < n ? ", " : " or ") : "", dirs[i]);
    fprintf(stderr, "%s: pass -m TARGET.gguf, or set EMBER_MODELS to the folder of the default pair (%s, %s)\n",
            getenv("EMBER_MODELS") && *getenv("EMBER_MODELS") ? " ($EMBER_MODELS)" : "", EM_DEFAULT_TARGET_FILE,
            EM_DEFAULT_DRAFT_FILE);
    return EM_EXIT_FAIL;
}

int em_model_flags_need_model(const em_cmd *cmd, em_model_flags *f) {
    if (!f->model) {
        int rc = find_default_pair(cmd, f, !f->draft_given);
        if (rc >= 0) return rc;
    }
    if (f->verify_width > 1 && !f->draft)
        return em_cli_usage_error(cmd, "--verify-width %d needs a drafter (--draft DRAFT.gguf); plain decoding "
                                  "verifies 1 row", f->verify_width);
    return -1;
}

em_model_opts em_model_flags_opts(const em_model_flags *f) {
    int storage = !f->moe_storage || !strcmp(f->moe_storage, "auto") ? EM_MOE_AUTO
                  : !strcmp(f->moe_storage, "ssd")                      ? EM_MOE_SSD
                                                                        : EM_MOE_RESIDENT;
    return (em_model_opts){ .device = f->device, .cuda_index = f->cuda_index, .cuda_devices = f->cuda_devices,
                            .n_cuda_devices = f->n_cuda_devices, .n_threads = f->n_threads, .n_ctx = f->n_ctx, .moe_storage = storage,
                            .expert_cache_bytes = f->expert_cache, .expert_no_prefetch = f->expert_no_prefetch };
}

/* The target refused to capture the drafter's taps (a layer it does not have): opened without
 * them, it lends the drafter its shape, and the drafter's own check says what does not fit,
 * naming both files (hidden size, vocabulary or taps), as for any other misfit. rc and err
 * stay the target's when that cannot be said. Only on this error path is the target opened
 * twice. */
static int explain_misfit(const em_model_flags *f, em_model_opts mo, const em_draft_opts *dopts, int rc,
                          em_err *err) {
    em_target *t = NULL;
    em_drafter *d = NULL;
    em_target_shared shared;
    em_err why = { 0 };
    mo.feature_layers = NULL, mo.n_feature_layers = 0;
    if (!em_model_open(&t, f->model, &mo, &why) && !em_target_shared_weights(t, &shared, &why)) {
        int rc2 = em_draft_open(&d, f->draft, &shared, dopts, &why);
        if (rc2 && err) *err = why;
        if (rc2) rc = rc2;
    }
    em_draft_close(d);
    em_target_close(t);
    return rc;
}

int em_model_flags_open(const em_model_flags *f, em_target **target, em_drafter **drafter, em_err *err) {
    *target = NULL, *drafter = NULL;
    em_model_opts mo = em_model_flags_opts(f);
    em_draft_opts dopts = { .n_threads = f->n_threads, .n_ctx = f->n_ctx ? f->n_ctx : EM_MODEL_DEFAULT_CTX,
                            .device = f->draft_device };
    /* the target first, capturing the drafter's taps, so the drafter borrows its weights */
    int taps[EM_DRAFT_MAX_TAPS], rc = EM_OK;
    if (f->draft && !(rc = em_draft_read_taps(f->draft, taps, &mo.n_feature_layers, err))) mo.feature_layers = taps;
    if (!rc && (rc = em_model_open(target, f->model, &mo, err)) == EM_EINVAL && f->draft)
        rc = explain_misfit(f, mo, &dopts, rc, err);
    if (!rc && f->draft) {
        em_target_shared shared;
        rc = em_target_shared_weights(*target, &shared, err);
        if (!rc) rc = em_draft_open(drafter, f->draft, &shared, &dopts, err);
    }
    if (!rc && *drafter && em_target_get_info(*target)->n_feat != em_draft_get_info(*drafter)->n_feat)
        rc = em_err_set(err, EM_EINVAL, "%s: the drafter reads %d features per row, the target %s captures %d at its "
                        "tap layers", f->draft, em_draft_get_info(*drafter)->n_feat, f->model,
                        em_target_get_info(*target)->n_feat);
    if (rc) {
        em_draft_close(*drafter);
        em_target_close(*target);
        *target = NULL, *drafter = NULL;
        return rc;
    }
    em_log(EM_LOG_INFO, "%s: %s on %s%s%s", f->model, em_target_get_info(*target)->arch,
           em_target_get_info(*target)->device, f->draft ? ", drafter on cpu: " : "", f->draft ? f->draft : "");
    return rc;
}

em_decode_opts em_model_flags_decode_opts(const em_model_flags *f, const em_tok *tok, em_drafter *drafter) {
    int ftype = f->feature_dtype ? em_decode_feature_type(f->feature_dtype) : EM_TYPE_F32;
    return (em_decode_opts){ .tok = tok, .drafter = drafter, .verify_width = f->verify_width,
                           .feature_type = ftype < 0 ? EM_TYPE_F32 : ftype,
                           .spec_policy = f->spec_policy ? em_decode_spec_policy(f->spec_policy) : EM_DECODE_SPEC_TIMED };
}

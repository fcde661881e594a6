/* The target interface: opening a model by its architecture, and the checks every call
 * passes before it reaches an architecture (token ids, context room, commit bounds), so the
 * architectures can assume sane arguments. Owns no model state beyond struct em_target's
 * common fields, which only the architectures' ops change. */
#include "backend/gpu.h"
#include "model/arch.h"

#include <stdio.h>
#include <string.h>

typedef struct arch_entry {
    const char *name;
    int (*open)(em_target **out, em_gguf *g, const em_model_opts *opts, em_err *err);
} arch_entry;

static const arch_entry archs[] = {
    { "kimi-linear", em_kimi_linear_open },
    { "kimi-k3", em_kimi_linear_open }, /* the same target: kimi_load reads the variant */
};

static int resolve_opts(const em_model_opts *in, em_model_opts *o, em_err *err) {
    *o = in ? *in : (em_model_opts){ 0 };
    if (o->n_threads < 0 || o->n_ctx < 0 || o->max_verify < 0 || o->ubatch < 0)
        return em_err_set(err, EM_EINVAL, "model options: negative thread count, context, verify width or ubatch");
    if (o->n_feature_layers < 0 || o->n_feature_layers > EM_MODEL_MAX_FEATURE_LAYERS ||
        (o->n_feature_layers > 0 && !o->feature_layers))
        return em_err_set(err, EM_EINVAL, "model options: %d feature layers (at most %d)",
                          o->n_feature_layers, EM_MODEL_MAX_FEATURE_LAYERS);
    if (o->device < EM_DEVICE_AUTO || o->device > EM_DEVICE_CUDA || o->cuda_index < 0)
        return em_err_set(err, EM_EINVAL, "model options: device %d / cuda index %d", o->device, o->cuda_index);
    if (o->n_cuda_devices < 0 || o->n_cuda_devices > EM_GPU_MAX_SHARES || (o->n_cuda_devices > 0 && !o->cuda_devices))
        return em_err_set(err, EM_EINVAL, "model options: %d devices for the experts (at most %d)", o->n_cuda_devices,
                          EM_GPU_MAX_SHARES);
    for (int i = 0; i < o->n_cuda_devices; i++) {
        if (o->cuda_devices[i] < 0) return em_err_set(err, EM_EINVAL, "model options: device cuda:%d", o->cuda_devices[i]);
        for (int j = 0; j < i; j++)
            if (o->cuda_devices[j] == o->cuda_devices[i])
                return em_err_set(err, EM_EINVAL, "--devices: cuda:%d is listed twice (each device holds one share)",
                                  o->cuda_devices[i]);
    }
    if (o->n_cuda_devices > 0) { /* the first holds the rest of the model */
        if (o->device == EM_DEVICE_CPU)
            return em_err_set(err, EM_EINVAL, "--devices puts the model on CUDA devices, and --device says cpu");
        if (o->moe_storage == EM_MOE_SSD)
            return em_err_set(err, EM_EINVAL, "--devices holds the routed experts in device memory: not with --moe-storage ssd");
        o->device = EM_DEVICE_CUDA, o->cuda_index = o->cuda_devices[0];
    }
    if (o->moe_storage < EM_MOE_AUTO || o->moe_storage > EM_MOE_SSD)
        return em_err_set(err, EM_EINVAL, "model options: moe_storage %d is not auto, resident or ssd", o->moe_storage);
    if (o->n_threads == 0) o->n_threads = em_cpu_count();
    if (o->max_verify == 0) o->max_verify = EM_MODEL_DEFAULT_MAX_VERIFY;
    if (o->ubatch == 0) o->ubatch = EM_MODEL_DEFAULT_UBATCH;
    if (o->n_threads > 1024) o->n_threads = 1024;
    return EM_OK;
}

/* Opens the GGUF at path, noting in missing (cap bytes) what a file cut short lacks. */
static int open_file(const char *path, em_gguf **g, char *missing, size_t cap, em_err *err) {
    /* a file cut short (an interrupted download) opens, so its sizes can be reported; its
     * missing data is refused before any forward reads it (check_data) */
    int rc = em_gguf_open_ex(g, path, &(em_gguf_open_opts){ .allow_missing_data = true, .guard_mapping = true }, err);
    if (rc) return rc;
    missing[0] = 0;
    int64_t n_missing = 0;
    const em_gguf_tensor *first = NULL;
    const uint64_t lost = em_gguf_missing(*g, &n_missing, &first);
    if (first) {
        snprintf(missing, cap,
                 "%s: tensor data is missing (the file is %llu bytes short; %lld tensors, the first '%s' in %s): "
                 "the file was cut short, download it again",
                 path, (unsigned long long)lost, (long long)n_missing, first->name, em_gguf_shard_at(*g, first->shard)->path);
        em_log(EM_LOG_WARN, "%s; it opens for its sizes, but nothing can run on it", missing);
    }
    return EM_OK;
}

/* Whether AUTO should try cuda:0: a CUDA build that sees a device, experts not held on SSD. */
static bool auto_gpu(const em_model_opts *o) {
    if (o->device != EM_DEVICE_AUTO || o->moe_storage == EM_MOE_SSD || !em_gpu_built()) return false;
    int n = 0;
    em_err e = { 0 };
    return em_gpu_device_count(&n, &e) == EM_OK && n > 0;
}

static int open_arch(em_target **out, em_gguf *g, const char *arch, const em_model_opts *o, em_err *err) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i].name))
            return o->device == EM_DEVICE_CUDA ? em_kimi_cuda_open(out, g, o, o->cuda_index, err)
                                               : archs[i].open(out, g, o, err);
    const char *path = em_gguf_path(g);
    em_err_set(err, EM_EUNSUPPORTED, "%s: architecture '%s' is not supported (supported: kimi-linear, kimi-k3)", path,
               arch);
    em_gguf_close(g);
    return EM_EUNSUPPORTED;
}

int em_model_open(em_target **out, const char *path, const em_model_opts *opts, em_err *err) {
    *out = NULL;
    em_model_opts o;
    int rc = resolve_opts(opts, &o, err);
    if (rc) return rc;
    const bool try_gpu = auto_gpu(&o);
    if (try_gpu) o.device = EM_DEVICE_CUDA, o.cuda_index = 0;
    else if (o.device == EM_DEVICE_AUTO) o.device = EM_DEVICE_CPU;
    for (;;) {
        const bool gpu_try = try_gpu && o.device == EM_DEVICE_CUDA;
        em_err gpu_err = { 0 };
        em_err *e = gpu_try ? &gpu_err : err; /* an AUTO attempt's failure is only logged */
        em_gguf *g = NULL;
        char missing[256], arch[64];
        rc = open_file(path, &g, missing, sizeof missing, e);
        if (!rc && (rc = em_gguf_get_cstr(g, "general.architecture", arch, sizeof arch, e))) em_gguf_close(g);
        if (!rc && !(rc = open_arch(out, g, arch, &o, e))) {
            snprintf((*out)->missing_data, sizeof (*out)->missing_data, "%s", missing);
            return EM_OK;
        }
        if (!gpu_try) return rc;
        em_log(EM_LOG_INFO, "not running on cuda:0: %s; running on the CPU", gpu_err.msg);
        o.device = EM_DEVICE_CPU;
    }
}

void em_target_close(em_target *t) {
    if (t) t->ops->close(t);
}

/* The row selection of em_rows (model.h): a mask needs its output, and last_only takes none. */
static int check_selection(const char *what, const em_rows *out, em_err *err) {
    if (out->logit_rows && !out->logits)
        return em_err_set(err, EM_EINVAL, "%s: logit_rows given without a logits buffer", what);
    if (out->argmax_rows && !out->argmax)
        return em_err_set(err, EM_EINVAL, "%s: argmax_rows given without an argmax buffer", what);
    if (out->last_only && (out->logit_rows || out->argmax_rows))
        return em_err_set(err, EM_EINVAL, "%s: last_only with a %s mask (last_only already picks the last row)", what,
                          out->logit_rows ? "logit_rows" : "argmax_rows");
    return EM_OK;
}

static int check_rows(const em_target *t, const char *what, const int32_t *tok, int n,
                      const em_rows *out, em_err *err) {
    if (n < 1 || !tok || !out)
        return em_err_set(err, EM_EINVAL, "%s: %d rows%s", what, n, tok && out ? "" : " (NULL argument)");
    if ((int64_t)n > (int64_t)t->info.n_ctx - t->pos)
        return em_err_set(err, EM_EINVAL,
                          "%s: %d tokens after %lld committed exceed the context of %d positions",
                          what, n, (long long)t->pos, t->info.n_ctx);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= t->info.n_vocab)
            return em_err_set(err, EM_EINVAL, "%s: token %d (row %d) is out of range [0, %d)", what,
                              tok[i], i, t->info.n_vocab);
    if ((out->features || out->device_features) && t->info.n_feat == 0)
        return em_err_set(err, EM_EINVAL, "%s: features asked for, but no feature layers were set at open", what);
    if (out->device_features) { /* only a target that lends its device feature rows keeps them there */
        em_target_shared sh;
        em_err ignored = { 0 };
        if (!t->ops->shared_weights || t->ops->shared_weights(t, &sh, &ignored) || !sh.d_features)
            return em_err_set(err, EM_EINVAL, "%s: features kept on a device asked of a target that has none", what);
    }
    return check_selection(what, out, err);
}

/* A forward on a file cut short would read past its end (SIGBUS on the mapping). */
static int check_data(const em_target *t, const char *what, em_err *err) {
    return t->missing_data[0] ? em_err_set(err, EM_EFORMAT, "%s: %s", what, t->missing_data) : EM_OK;
}

int em_model_files_check(bool check_files, em_err *err) {
    em_err e = { 0 };
    int rc = em_mmap_check(check_files, &e);
    return rc ? em_err_set(err, rc, "model file %s: restart to reload", e.msg) : EM_OK;
}

/* After a forward: a fault on the mapped weights during it (they read as zeros then) makes its
 * results worthless, whatever the forward returned; after a failed one the files are looked
 * at too (an expert read that found its file shorter says why only in its own words). */
static int after_forward(int rc, em_err *err) {
    em_err e = { 0 };
    if (em_model_files_check(rc != 0, &e)) {
        if (err) *err = e;
        return e.code;
    }
    return rc;
}

int em_target_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    int rc = check_data(t, "verify", err);
    if (!rc) rc = em_model_files_check(false, err);
    if (rc) return rc;
    rc = check_rows(t, "verify", tok, n, out, err);
    if (rc) return rc;
    return after_forward(t->ops->verify(t, tok, n, out, err), err);
}

int em_target_commit(em_target *t, int k, em_err *err) {
    int rc = check_data(t, "commit", err);
    if (!rc) rc = em_model_files_check(false, err);
    if (rc) return rc;
    if (t->pending < 0)
        return em_err_set(err, EM_EINVAL, "commit: no verify to commit from");
    if (k < 0 || k > t->pending)
        return em_err_set(err, EM_EINVAL, "commit: %d rows, but the last verify had %d", k, t->pending);
    return after_forward(t->ops->commit(t, k, err), err);
}

int em_target_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    static const em_rows none = { 0 };
    int rc = check_data(t, "prefill", err);
    /* a prompt starts a request: the files' sizes are looked at, so a file that changed since
     * the last request is caught before anything reads it */
    if (!rc) rc = em_model_files_check(true, err);
    if (rc) return rc;
    rc = check_rows(t, "prefill", tok, n, out ? out : &none, err);
    if (rc) return rc;
    return after_forward(t->ops->prefill(t, tok, n, out ? out : &none, err), err);
}

em_cost em_target_cost(const em_target *t, int n) {
    if (n < 1) return (em_cost){ 0 };
    return t->ops->cost(t, n);
}

int em_target_prefetch(em_target *t, const int32_t *tok, int n, em_err *err) {
    if (!t->ops->prefetch || n <= 0 || t->missing_data[0]) return EM_OK;
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= t->info.n_vocab)
            return em_err_set(err, EM_EINVAL, "prefetch: token %d is not in the vocabulary (%d)", tok[i],
                              t->info.n_vocab);
    return t->ops->prefetch(t, tok, n, err);
}

void em_target_reset(em_target *t) { t->ops->reset(t); }

int64_t em_target_position(const em_target *t) { return t->pos; }

const em_target_info *em_target_get_info(const em_target *t) { return &t->info; }

int em_target_shared_weights(const em_target *t, em_target_shared *out, em_err *err) {
    *out = (em_target_shared){ 0 };
    int rc = check_data(t, "shared weights", err);
    if (rc) return rc;
    if (!t->ops->shared_weights) return em_err_set(err, EM_EUNSUPPORTED, "shared weights: this target lends none");
    return t->ops->shared_weights(t, out, err);
}

int em_target_expert_stats(const em_target *t, int layer, em_target_expert_counts *out, em_err *err) {
    *out = (em_target_expert_counts){ .storage = EM_MOE_RESIDENT };
    if (layer < -1 || layer >= t->info.n_layer)
        return em_err_set(err, EM_EINVAL, "expert stats: layer %d is not a layer of this model (0..%d)", layer,
                          t->info.n_layer - 1);
    return t->ops->expert_stats ? t->ops->expert_stats(t, layer, out, err) : EM_OK;
}

int em_target_phases_enable(em_target *t, bool on, em_err *err) {
    em_phases *p = t->ops->phases ? t->ops->phases(t) : NULL;
    if (!p) return em_err_set(err, EM_EUNSUPPORTED, "phase timing: this target (%s) has no breakdown", t->info.device);
    em_phases_enable(p, on);
    return EM_OK;
}

int em_target_phases(em_target *t, em_target_phase *out, int max) {
    const em_phases *p = t->ops->phases ? t->ops->phases(t) : NULL;
    if (!p || !p->on) return 0;
    int n = p->n < max ? p->n : max;
    for (int i = 0; i < n; i++)
        out[i] = (em_target_phase){ .name = p->names[i], .seconds = p->sum[i].seconds, .laps = p->sum[i].laps,
                                    .bytes = p->sum[i].bytes, .pool_runs = p->sum[i].pool_runs };
    return n;
}

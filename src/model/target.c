/* The target interface: opening a model by its architecture, and the checks every call
 * passes before it reaches an architecture (token ids, context room, commit bounds), so the
 * architectures can assume sane arguments. Owns no model state beyond struct em_target's
 * common fields, which only the architectures' ops change. */
#include "model/arch.h"

#include <string.h>

typedef struct arch_entry {
    const char *name;
    int (*open)(em_target **out, em_gguf *g, const em_model_opts *opts, em_err *err);
} arch_entry;

static const arch_entry archs[] = {
    { "kimi-linear", em_kimi_linear_open },
};

static int resolve_opts(const em_model_opts *in, em_model_opts *o, em_err *err) {
    *o = in ? *in : (em_model_opts){ 0 };
    if (o->n_threads < 0 || o->n_ctx < 0 || o->max_verify < 0 || o->ubatch < 0)
        return em_err_set(err, EM_EINVAL, "model options: negative thread count, context, verify width or ubatch");
    if (o->n_feature_layers < 0 || o->n_feature_layers > EM_MODEL_MAX_FEATURE_LAYERS ||
        (o->n_feature_layers > 0 && !o->feature_layers))
        return em_err_set(err, EM_EINVAL, "model options: %d feature layers (at most %d)",
                          o->n_feature_layers, EM_MODEL_MAX_FEATURE_LAYERS);
    if (o->n_threads == 0) o->n_threads = em_cpu_count();
    if (o->max_verify == 0) o->max_verify = EM_MODEL_DEFAULT_MAX_VERIFY;
    if (o->ubatch == 0) o->ubatch = EM_MODEL_DEFAULT_UBATCH;
    if (o->n_threads > 1024) o->n_threads = 1024;
    return EM_OK;
}

int em_model_open(em_target **out, const char *path, const em_model_opts *opts, em_err *err) {
    *out = NULL;
    em_model_opts o;
    int rc = resolve_opts(opts, &o, err);
    if (rc) return rc;
    em_gguf *g = NULL;
    rc = em_gguf_open(&g, path, err);
    if (rc) return rc;
    char arch[64];
    rc = em_gguf_get_cstr(g, "general.architecture", arch, sizeof arch, err);
    if (rc) { /* the reader's message names the file and the key */
        em_gguf_close(g);
        return rc;
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i].name)) return archs[i].open(out, g, &o, err);
    em_gguf_close(g);
    return em_err_set(err, EM_EUNSUPPORTED, "%s: architecture '%s' is not supported (supported: kimi-linear)",
                      path, arch);
}

void em_target_close(em_target *t) {
    if (t) t->ops->close(t);
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
    if (out->features && t->info.n_feat == 0)
        return em_err_set(err, EM_EINVAL, "%s: features asked for, but no feature layers were set at open", what);
    return EM_OK;
}

int em_target_verify(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    int rc = check_rows(t, "verify", tok, n, out, err);
    if (rc) return rc;
    return t->ops->verify(t, tok, n, out, err);
}

int em_target_commit(em_target *t, int k, em_err *err) {
    if (t->pending < 0)
        return em_err_set(err, EM_EINVAL, "commit: no verify to commit from");
    if (k < 0 || k > t->pending)
        return em_err_set(err, EM_EINVAL, "commit: %d rows, but the last verify had %d", k, t->pending);
    return t->ops->commit(t, k, err);
}

int em_target_prefill(em_target *t, const int32_t *tok, int n, const em_rows *out, em_err *err) {
    static const em_rows none = { 0 };
    int rc = check_rows(t, "prefill", tok, n, out ? out : &none, err);
    if (rc) return rc;
    return t->ops->prefill(t, tok, n, out ? out : &none, err);
}

em_cost em_target_cost(const em_target *t, int n) {
    if (n < 1) return (em_cost){ 0 };
    return t->ops->cost(t, n);
}

void em_target_reset(em_target *t) { t->ops->reset(t); }

int64_t em_target_position(const em_target *t) { return t->pos; }

const em_target_info *em_target_get_info(const em_target *t) { return &t->info; }

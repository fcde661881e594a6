/* convert/hfconfig: config.json -> em_hf_kimi (kimi_linear, kimi_k3) or em_hf_draft (DFlash /
 * DSpark drafters of four flavours).
 *
 * Invariants of a successful parse: every required field was present with the right JSON
 * type; dimensions are positive; the per-layer tables cover exactly num_hidden_layers
 * layers; top-k <= experts; taps and token ids are in range. A default is applied only
 * where a comment cites the reference note that documents it. Messages name the file and
 * the field (with its "text_config." / "dflash_config." / "linear_attn_config." path). */
#include "convert/hfconfig.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Where fields are read from, for messages: file name and the object's path prefix. */
typedef struct cfg_ctx {
    const char *file;
    const char *prefix; /* "" or "text_config." ... */
    em_err *err;
} cfg_ctx;

#define FIELD_FMT "%s: field '%s%s'"

static int field_err(const cfg_ctx *c, int code, const char *key, const char *what) {
    return em_err_set(c->err, code, FIELD_FMT ": %s", c->file, c->prefix, key, what);
}

/* A member that is present and not null, or NULL. */
static json_t *member(const json_t *obj, const char *key) {
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return json_is_null(v) ? NULL : v;
}

/* ---- typed getters: *present (optional) says whether the field was there ---------------- */

static int get_int(const cfg_ctx *c, const json_t *obj, const char *key, bool required,
                   int64_t *out, bool *present) {
    json_t *v = member(obj, key);
    if (present) *present = v != NULL;
    if (!v) return required ? field_err(c, EM_EFORMAT, key, "missing") : EM_OK;
    if (!json_is_integer(v)) return field_err(c, EM_EFORMAT, key, "not an integer");
    *out = (int64_t)json_integer_value(v);
    return EM_OK;
}

static int get_double(const cfg_ctx *c, const json_t *obj, const char *key, bool required,
                      double *out, bool *present) {
    json_t *v = member(obj, key);
    if (present) *present = v != NULL;
    if (!v) return required ? field_err(c, EM_EFORMAT, key, "missing") : EM_OK;
    if (!json_is_number(v)) return field_err(c, EM_EFORMAT, key, "not a number");
    *out = json_number_value(v);
    if (!isfinite(*out)) return field_err(c, EM_EFORMAT, key, "not finite");
    return EM_OK;
}

static int get_bool(const cfg_ctx *c, const json_t *obj, const char *key, bool required, bool *out,
                    bool *present) {
    json_t *v = member(obj, key);
    if (present) *present = v != NULL;
    if (!v) return required ? field_err(c, EM_EFORMAT, key, "missing") : EM_OK;
    if (!json_is_boolean(v)) return field_err(c, EM_EFORMAT, key, "not true or false");
    *out = json_is_true(v);
    return EM_OK;
}

static int get_string(const cfg_ctx *c, const json_t *obj, const char *key, bool required,
                      char *out, size_t cap, bool *present) {
    json_t *v = member(obj, key);
    if (present) *present = v != NULL;
    if (!v) return required ? field_err(c, EM_EFORMAT, key, "missing") : EM_OK;
    if (!json_is_string(v)) return field_err(c, EM_EFORMAT, key, "not a string");
    if (json_string_length(v) >= cap || strlen(json_string_value(v)) != json_string_length(v))
        return field_err(c, EM_EFORMAT, key, "string too long");
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return EM_OK;
}

/* An integer that may be spelled several ways (attribute aliases). All spellings present
 * must agree; *found gets the first present spelling (NULL when none). */
static int get_int_alias(const cfg_ctx *c, const json_t *obj, const char *const *keys, int n,
                         bool required, int64_t *out, const char **found) {
    const char *first = NULL;
    int64_t value = 0;
    for (int i = 0; i < n; i++) {
        int64_t v = 0;
        bool present = false;
        int rc = get_int(c, obj, keys[i], false, &v, &present);
        if (rc) return rc;
        if (!present) continue;
        if (first && v != value)
            return em_err_set(c->err, EM_EFORMAT,
                              "%s: fields '%s%s' (%lld) and '%s%s' (%lld) disagree", c->file,
                              c->prefix, first, (long long)value, c->prefix, keys[i], (long long)v);
        if (!first) first = keys[i];
        value = v;
    }
    if (found) *found = first;
    if (!first)
        return required ? em_err_set(c->err, EM_EFORMAT, FIELD_FMT ": missing", c->file, c->prefix,
                                     keys[0])
                        : EM_OK;
    *out = value;
    return EM_OK;
}

static int get_bool_alias(const cfg_ctx *c, const json_t *obj, const char *a, const char *b,
                          bool required, bool *out, bool *present) {
    bool va = false, vb = false, pa = false, pb = false;
    int rc = get_bool(c, obj, a, false, &va, &pa);
    if (!rc) rc = get_bool(c, obj, b, false, &vb, &pb);
    if (rc) return rc;
    if (pa && pb && va != vb)
        return em_err_set(c->err, EM_EFORMAT, "%s: fields '%s%s' and '%s%s' disagree", c->file,
                          c->prefix, a, c->prefix, b);
    if (present) *present = pa || pb;
    if (!pa && !pb) return required ? field_err(c, EM_EFORMAT, a, "missing") : EM_OK;
    *out = pa ? va : vb;
    return EM_OK;
}

static int check_positive(const cfg_ctx *c, const char *key, int64_t v) {
    if (v > 0) return EM_OK;
    char what[64];
    snprintf(what, sizeof what, "must be positive (is %lld)", (long long)v);
    return field_err(c, EM_EFORMAT, key, what);
}

static int check_range(const cfg_ctx *c, const char *key, int64_t v, int64_t lo, int64_t hi) {
    if (v >= lo && v <= hi) return EM_OK;
    char what[128];
    snprintf(what, sizeof what, "%lld is outside [%lld, %lld]", (long long)v, (long long)lo,
             (long long)hi);
    return field_err(c, EM_EFORMAT, key, what);
}

/* ---- RoPE ------------------------------------------------------------------------------- */

const char *em_hf_rope_type_name(enum em_hf_rope_type t) {
    switch (t) {
    case EM_HF_ROPE_DEFAULT: return "default";
    case EM_HF_ROPE_LINEAR: return "linear";
    case EM_HF_ROPE_DYNAMIC: return "dynamic";
    case EM_HF_ROPE_YARN: return "yarn";
    case EM_HF_ROPE_LLAMA3: return "llama3";
    }
    return "?";
}

/* rope_scaling / rope_parameters object: rope_type (or the older "type") and its fields. */
static int parse_rope_object(const cfg_ctx *c, const json_t *o, em_hf_rope *r) {
    char type[32] = "", old[32] = "";
    bool has_type = false, has_old = false;
    int rc = get_string(c, o, "rope_type", false, type, sizeof type, &has_type);
    if (!rc) rc = get_string(c, o, "type", false, old, sizeof old, &has_old);
    if (rc) return rc;
    if (has_type && has_old && strcmp(type, old) != 0)
        return field_err(c, EM_EFORMAT, "rope_type", "disagrees with 'type'");
    if (!has_type) memcpy(type, old, sizeof type);
    if (!has_type && !has_old) strcpy(type, "default");
    static const struct {
        const char *name;
        enum em_hf_rope_type t;
    } k_types[] = {
        { "default", EM_HF_ROPE_DEFAULT }, { "linear", EM_HF_ROPE_LINEAR },
        { "dynamic", EM_HF_ROPE_DYNAMIC }, { "yarn", EM_HF_ROPE_YARN },
        { "llama3", EM_HF_ROPE_LLAMA3 },
    };
    bool known = false;
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (strcmp(type, k_types[i].name) == 0) r->type = k_types[i].t, known = true;
    if (!known) {
        char what[80];
        snprintf(what, sizeof what, "rope type '%s' is not supported", type);
        return field_err(c, EM_EUNSUPPORTED, has_type ? "rope_type" : "type", what);
    }
    bool has = false;
    rc = get_double(c, o, "rope_theta", false, &r->theta, &has);
    if (!rc) rc = get_double(c, o, "factor", r->type != EM_HF_ROPE_DEFAULT, &r->factor, &has);
    if (!rc && r->type != EM_HF_ROPE_DEFAULT && !(r->factor > 0))
        return field_err(c, EM_EFORMAT, "factor", "must be positive");
    if (!rc)
        rc = get_int(c, o, "original_max_position_embeddings",
                     r->type == EM_HF_ROPE_YARN || r->type == EM_HF_ROPE_LLAMA3,
                     &r->original_max_position_embeddings, &has);
    if (!rc && has)
        rc = check_positive(c, "original_max_position_embeddings",
                            r->original_max_position_embeddings);
    if (!rc) rc = get_double(c, o, "beta_fast", false, &r->beta_fast, &has);
    if (!rc) rc = get_double(c, o, "beta_slow", false, &r->beta_slow, &has);
    if (!rc) rc = get_double(c, o, "mscale", false, &r->mscale, &has);
    if (!rc) rc = get_double(c, o, "mscale_all_dim", false, &r->mscale_all_dim, &has);
    if (!rc) rc = get_double(c, o, "attention_factor", false, &r->attention_factor, &has);
    if (!rc)
        rc = get_double(c, o, "low_freq_factor", r->type == EM_HF_ROPE_LLAMA3, &r->low_freq_factor,
                        &has);
    if (!rc)
        rc = get_double(c, o, "high_freq_factor", r->type == EM_HF_ROPE_LLAMA3,
                        &r->high_freq_factor, &has);
    return rc;
}

/* rope_theta at top level, plus rope_scaling (older) or rope_parameters (transformers 5). */
static int parse_rope(const cfg_ctx *c, const json_t *obj, bool theta_required, em_hf_rope *r) {
    memset(r, 0, sizeof *r);
    r->factor = 1;
    /* YaRN ramp defaults when a config omits them: HF's beta_fast = 32, beta_slow = 1
     * (dspark.md §1.5). */
    r->beta_fast = 32;
    r->beta_slow = 1;
    json_t *scaling = member(obj, "rope_scaling"), *params = member(obj, "rope_parameters");
    int rc;
    if (scaling && params)
        return em_err_set(c->err, EM_EFORMAT,
                          "%s: fields '%srope_scaling' and '%srope_parameters' are both set",
                          c->file, c->prefix, c->prefix);
    json_t *o = scaling ? scaling : params;
    if (o) {
        if (!json_is_object(o))
            return field_err(c, EM_EFORMAT, scaling ? "rope_scaling" : "rope_parameters",
                             "not an object");
        char prefix[96];
        snprintf(prefix, sizeof prefix, "%s%s.", c->prefix,
                 scaling ? "rope_scaling" : "rope_parameters");
        cfg_ctx sub = { c->file, prefix, c->err };
        rc = parse_rope_object(&sub, o, r);
        if (rc) return rc;
    }
    double top = 0;
    bool has_top = false;
    rc = get_double(c, obj, "rope_theta", false, &top, &has_top);
    if (rc) return rc;
    if (has_top && r->theta != 0 && r->theta != top)
        return field_err(c, EM_EFORMAT, "rope_theta", "disagrees with rope_parameters.rope_theta");
    if (has_top) r->theta = top;
    if (theta_required && r->theta == 0) return field_err(c, EM_EFORMAT, "rope_theta", "missing");
    if (r->theta < 0) return field_err(c, EM_EFORMAT, "rope_theta", "must be positive");
    return EM_OK;
}

/* ---- token ids -------------------------------------------------------------------------- */

static int get_eos(const cfg_ctx *c, const json_t *obj, int64_t *ids, int *n) {
    json_t *v = member(obj, "eos_token_id");
    *n = 0;
    if (!v) return EM_OK;
    if (json_is_integer(v)) {
        ids[(*n)++] = (int64_t)json_integer_value(v);
        return EM_OK;
    }
    if (!json_is_array(v) || json_array_size(v) > EM_HF_MAX_EOS)
        return field_err(c, EM_EFORMAT, "eos_token_id",
                         "not an integer or a short list of integers");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return field_err(c, EM_EFORMAT, "eos_token_id", "list holds a non-integer");
        ids[(*n)++] = (int64_t)json_integer_value(e);
    }
    return EM_OK;
}

static int check_token(const cfg_ctx *c, const char *key, int64_t id, int64_t vocab) {
    return check_range(c, key, id, 0, vocab - 1);
}

/* ---- Kimi: layer tables ----------------------------------------------------------------- */

/* Reads a 1-indexed layer list into kind[] (0-indexed), checking range and duplicates. */
static int read_layer_list(const cfg_ctx *c, const json_t *list, const char *key, const char *other,
                           int n_layers, uint8_t value, int8_t *kind) {
    if (!json_is_array(list)) return field_err(c, EM_EFORMAT, key, "not a list");
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        char what[128];
        if (!json_is_integer(e)) {
            snprintf(what, sizeof what, "item %zu is not an integer", i);
            return field_err(c, EM_EFORMAT, key, what);
        }
        json_int_t l = json_integer_value(e);
        if (l < 1 || l > n_layers) {
            snprintf(what, sizeof what, "layer %lld is outside [1, %d] (the lists are 1-indexed)",
                     (long long)l, n_layers);
            return field_err(c, EM_EFORMAT, key, what);
        }
        if (kind[l - 1] == (int8_t)value) {
            snprintf(what, sizeof what, "layer %lld is listed twice", (long long)l);
            return field_err(c, EM_EFORMAT, key, what);
        }
        if (kind[l - 1] >= 0) {
            snprintf(what, sizeof what, "layer %lld is also in %s", (long long)l, other);
            return field_err(c, EM_EFORMAT, key, what);
        }
        kind[l - 1] = (int8_t)value;
    }
    return EM_OK;
}

/* Reads a list of n_layers strings, each one of names[0] (-> 0) or names[1] (-> 1). */
static int read_type_list(const cfg_ctx *c, const json_t *list, const char *key, int n_layers,
                          const char *const names[2], int8_t *kind) {
    char what[160];
    if (!json_is_array(list)) return field_err(c, EM_EFORMAT, key, "not a list");
    if (json_array_size(list) != (size_t)n_layers) {
        snprintf(what, sizeof what, "has %zu entries for %d layers", json_array_size(list),
                 n_layers);
        return field_err(c, EM_EFORMAT, key, what);
    }
    for (int l = 0; l < n_layers; l++) {
        const char *s = json_string_value(json_array_get(list, (size_t)l));
        kind[l] = !s ? -1 : strcmp(s, names[0]) == 0 ? 0 : strcmp(s, names[1]) == 0 ? 1 : -1;
        if (kind[l] < 0) {
            snprintf(what, sizeof what, "entry %d is not \"%s\" or \"%s\"", l, names[0], names[1]);
            return field_err(c, EM_EFORMAT, key, what);
        }
    }
    return EM_OK;
}

/* Layer kinds from linear_attn_config lists and/or transformers-5 layer_types. */
static int kimi_attn_table(const cfg_ctx *c, const json_t *obj, const json_t *lac, em_hf_kimi *k) {
    int n = k->n_layers;
    int8_t from_lists[EM_HF_MAX_LAYERS], from_types[EM_HF_MAX_LAYERS];
    memset(from_lists, -1, sizeof from_lists);
    json_t *kda = member(lac, "kda_layers"), *full = member(lac, "full_attn_layers");
    json_t *types = member(obj, "layer_types");
    char lac_prefix[96];
    snprintf(lac_prefix, sizeof lac_prefix, "%slinear_attn_config.", c->prefix);
    cfg_ctx lc = { c->file, lac_prefix, c->err };
    int rc;
    if ((kda != NULL) != (full != NULL))
        return field_err(&lc, EM_EFORMAT, kda ? "full_attn_layers" : "kda_layers",
                         "missing (both 1-indexed lists are needed)");
    if (!kda && !types)
        return field_err(c, EM_EFORMAT, "linear_attn_config.kda_layers",
                         "missing (and no layer_types either)");
    if (kda) {
        rc = read_layer_list(&lc, kda, "kda_layers", "full_attn_layers", n, EM_HF_ATTN_KDA,
                             from_lists);
        if (!rc)
            rc = read_layer_list(&lc, full, "full_attn_layers", "kda_layers", n, EM_HF_ATTN_MLA,
                                 from_lists);
        if (rc) return rc;
        for (int l = 0; l < n; l++)
            if (from_lists[l] < 0) {
                char what[128];
                snprintf(what, sizeof what,
                         "layer %d (1-indexed) is in neither kda_layers nor "
                         "full_attn_layers",
                         l + 1);
                return field_err(c, EM_EFORMAT, "linear_attn_config", what);
            }
    }
    if (types) {
        static const char *const names[2] = { "linear_attention", "full_attention" };
        rc = read_type_list(c, types, "layer_types", n, names, from_types);
        if (rc) return rc;
        for (int l = 0; kda && l < n; l++)
            if (from_types[l] != from_lists[l]) {
                char what[160];
                snprintf(what, sizeof what,
                         "entry %d says %s but linear_attn_config lists layer %d "
                         "(1-indexed) as %s",
                         l, names[from_types[l]], l + 1,
                         from_lists[l] == EM_HF_ATTN_KDA ? "KDA" : "full attention");
                return field_err(c, EM_EFORMAT, "layer_types", what);
            }
    }
    for (int l = 0; l < n; l++) {
        k->attn[l] = (uint8_t)(kda ? from_lists[l] : from_types[l]);
        if (k->attn[l] == EM_HF_ATTN_KDA)
            k->n_kda++;
        else
            k->n_mla++;
    }
    return EM_OK;
}

/* MLP kinds from first_k_dense_replace / moe_layer_freq (Moonshot rule: MoE when experts
 * exist, l >= first_k_dense_replace and l % moe_layer_freq == 0) and/or transformers-5
 * mlp_layer_types ("dense" / "sparse"). */
static int kimi_mlp_table(const cfg_ctx *c, const json_t *obj, bool has_fkdr, em_hf_kimi *k) {
    int n = k->n_layers;
    int8_t from_rule[EM_HF_MAX_LAYERS], from_types[EM_HF_MAX_LAYERS];
    json_t *types = member(obj, "mlp_layer_types");
    for (int l = 0; l < n; l++)
        from_rule[l] = (int8_t)(k->num_experts > 0 && l >= k->first_k_dense_replace &&
                                l % k->moe_layer_freq == 0);
    if (k->num_experts > 0 && !has_fkdr && !types)
        return field_err(c, EM_EFORMAT, "first_k_dense_replace",
                         "missing (and no mlp_layer_types)");
    if (types) {
        static const char *const names[2] = { "dense", "sparse" };
        int rc = read_type_list(c, types, "mlp_layer_types", n, names, from_types);
        if (rc) return rc;
        for (int l = 0; l < n; l++) {
            char what[192];
            if (from_types[l] == EM_HF_MLP_MOE && k->num_experts == 0) {
                snprintf(what, sizeof what, "entry %d is \"sparse\" but the config has no experts",
                         l);
                return field_err(c, EM_EFORMAT, "mlp_layer_types", what);
            }
            if (has_fkdr && from_types[l] != from_rule[l]) {
                snprintf(
                    what, sizeof what,
                    "entry %d says %s but first_k_dense_replace=%lld, moe_layer_freq=%lld make "
                    "it %s",
                    l, names[from_types[l]], (long long)k->first_k_dense_replace,
                    (long long)k->moe_layer_freq, names[from_rule[l]]);
                return field_err(c, EM_EFORMAT, "mlp_layer_types", what);
            }
        }
    }
    for (int l = 0; l < n; l++) {
        k->mlp[l] = (uint8_t)(types ? from_types[l] : from_rule[l]);
        if (k->mlp[l] == EM_HF_MLP_MOE)
            k->n_moe++;
        else
            k->n_dense++;
    }
    /* Only mlp_layer_types stated: first_k_dense_replace becomes the dense prefix it shows
     * (the table above stays authoritative for any other pattern). */
    if (!has_fkdr)
        for (k->first_k_dense_replace = 0;
             k->first_k_dense_replace < n && k->mlp[k->first_k_dense_replace] == EM_HF_MLP_DENSE;)
            k->first_k_dense_replace++;
    return EM_OK;
}

/* ---- Kimi: field groups ----------------------------------------------------------------- */

static int kimi_core(const cfg_ctx *c, const json_t *o, em_hf_kimi *k) {
    static const char *const max_len[] = { "model_max_length", "max_position_embeddings" };
    int rc = get_int(c, o, "vocab_size", true, &k->vocab_size, NULL);
    if (!rc) rc = check_positive(c, "vocab_size", k->vocab_size);
    if (!rc) rc = get_int(c, o, "hidden_size", true, &k->hidden_size, NULL);
    if (!rc) rc = check_positive(c, "hidden_size", k->hidden_size);
    if (!rc) rc = get_int(c, o, "num_hidden_layers", true, &k->num_hidden_layers, NULL);
    if (!rc) rc = check_range(c, "num_hidden_layers", k->num_hidden_layers, 1, EM_HF_MAX_LAYERS);
    if (!rc) rc = get_int(c, o, "num_attention_heads", true, &k->num_attention_heads, NULL);
    if (!rc) rc = check_positive(c, "num_attention_heads", k->num_attention_heads);
    if (!rc) rc = get_int(c, o, "num_key_value_heads", true, &k->num_key_value_heads, NULL);
    if (!rc) rc = check_positive(c, "num_key_value_heads", k->num_key_value_heads);
    if (!rc) rc = get_int(c, o, "head_dim", false, &k->head_dim, NULL);
    if (!rc) rc = get_double(c, o, "rms_norm_eps", true, &k->rms_norm_eps, NULL);
    if (!rc && !(k->rms_norm_eps > 0))
        rc = field_err(c, EM_EFORMAT, "rms_norm_eps", "must be positive");
    if (!rc) rc = get_bool(c, o, "tie_word_embeddings", true, &k->tie_word_embeddings, NULL);
    if (!rc) rc = get_string(c, o, "hidden_act", true, k->hidden_act, sizeof k->hidden_act, NULL);
    if (!rc && strcmp(k->hidden_act, "silu") != 0 && strcmp(k->hidden_act, "situ") != 0)
        rc = field_err(c, EM_EUNSUPPORTED, "hidden_act",
                       "only \"silu\" (Kimi Linear) and \"situ\" (K3) are supported");
    if (!rc) rc = get_int_alias(c, o, max_len, 2, false, &k->model_max_length, NULL);
    if (!rc)
        rc = get_int(c, o, "num_nextn_predict_layers", false, &k->num_nextn_predict_layers, NULL);
    if (!rc) rc = check_range(c, "num_nextn_predict_layers", k->num_nextn_predict_layers, 0, 64);
    if (!rc) rc = get_int(c, o, "bos_token_id", false, &k->bos_token_id, &k->has_bos);
    if (!rc && k->has_bos) rc = check_token(c, "bos_token_id", k->bos_token_id, k->vocab_size);
    if (!rc) rc = get_int(c, o, "pad_token_id", false, &k->pad_token_id, &k->has_pad);
    if (!rc && k->has_pad) rc = check_token(c, "pad_token_id", k->pad_token_id, k->vocab_size);
    if (!rc) rc = get_eos(c, o, k->eos_token_ids, &k->n_eos);
    for (int i = 0; !rc && i < k->n_eos; i++)
        rc = check_token(c, "eos_token_id", k->eos_token_ids[i], k->vocab_size);
    return rc;
}

/* MLA fields; required only when some layer is MLA.
 *
 * mla_use_nope: transformers' KimiLinearConfig has no such field and its MLA never rotates
 * (NoPE; kimi-linear.md §4), so in the transformers-5 dialect (no linear_attn_config: tf5)
 * absent means true, as transformers runs it. Moonshot's remote code defaults the field to
 * false (RoPE), so a config in its dialect must state it. */
static int kimi_mla(const cfg_ctx *c, const json_t *o, bool tf5, em_hf_kimi *k) {
    bool need = k->n_mla > 0;
    k->mla_use_nope = tf5;
    int rc = get_int(c, o, "q_lora_rank", false, &k->q_lora_rank, &k->has_q_lora);
    if (!rc && k->has_q_lora) rc = check_positive(c, "q_lora_rank", k->q_lora_rank);
    if (!rc) rc = get_int(c, o, "kv_lora_rank", need, &k->kv_lora_rank, NULL);
    if (!rc) rc = get_int(c, o, "qk_nope_head_dim", need, &k->qk_nope_head_dim, NULL);
    if (!rc) rc = get_int(c, o, "qk_rope_head_dim", need, &k->qk_rope_head_dim, NULL);
    if (!rc) rc = get_int(c, o, "v_head_dim", need, &k->v_head_dim, NULL);
    if (!rc) rc = get_bool(c, o, "mla_use_nope", need && !tf5, &k->mla_use_nope, NULL);
    if (!rc) rc = get_bool(c, o, "mla_use_output_gate", false, &k->mla_use_output_gate, NULL);
    if (!rc && need) rc = check_positive(c, "kv_lora_rank", k->kv_lora_rank);
    if (!rc && need) rc = check_range(c, "qk_nope_head_dim", k->qk_nope_head_dim, 0, 1 << 16);
    if (!rc && need) rc = check_range(c, "qk_rope_head_dim", k->qk_rope_head_dim, 0, 1 << 16);
    if (!rc && need && k->qk_nope_head_dim + k->qk_rope_head_dim == 0)
        rc = field_err(c, EM_EFORMAT, "qk_nope_head_dim", "q/k head dim (nope + rope) is 0");
    if (!rc && need) rc = check_positive(c, "v_head_dim", k->v_head_dim);
    if (!rc) rc = parse_rope(c, o, need && !k->mla_use_nope && k->qk_rope_head_dim > 0, &k->rope);
    return rc;
}

/* KDA sizes from linear_attn_config and/or the transformers-5 top-level spellings. */
static int kimi_kda_sizes(const cfg_ctx *c, const json_t *o, const json_t *lac, em_hf_kimi *k) {
    static const char *const lac_keys[3] = { "num_heads", "head_dim", "short_conv_kernel_size" };
    static const char *const tf5_keys[3] = { "linear_num_heads", "linear_head_dim",
                                             "linear_conv_kernel_dim" };
    int64_t *dst[3] = { &k->kda_num_heads, &k->kda_head_dim, &k->kda_short_conv_kernel_size };
    char lac_prefix[96];
    snprintf(lac_prefix, sizeof lac_prefix, "%slinear_attn_config.", c->prefix);
    cfg_ctx lc = { c->file, lac_prefix, c->err };
    bool need = k->n_kda > 0;
    for (int i = 0; i < 3; i++) {
        int64_t a = 0, b = 0;
        bool pa = false, pb = false;
        int rc = get_int(&lc, lac, lac_keys[i], false, &a, &pa);
        if (!rc) rc = get_int(c, o, tf5_keys[i], false, &b, &pb);
        if (rc) return rc;
        if (pa && pb && a != b)
            return em_err_set(
                c->err, EM_EFORMAT, "%s: fields '%s%s' (%lld) and '%s%s' (%lld) disagree", c->file,
                lac_prefix, lac_keys[i], (long long)a, c->prefix, tf5_keys[i], (long long)b);
        if (!pa && !pb && need) return field_err(&lc, EM_EFORMAT, lac_keys[i], "missing");
        *dst[i] = pa ? a : b;
        if (need) {
            rc = check_positive(pa ? &lc : c, pa ? lac_keys[i] : tf5_keys[i], *dst[i]);
            if (rc) return rc;
        }
    }
    int rc = get_bool(&lc, lac, "use_full_rank_gate", false, &k->kda_use_full_rank_gate, NULL);
    if (!rc)
        rc = get_double(&lc, lac, "gate_lower_bound", false, &k->kda_gate_lower_bound,
                        &k->kda_has_gate_lower_bound);
    if (!rc && k->kda_has_gate_lower_bound && !(k->kda_gate_lower_bound < 0))
        rc = field_err(&lc, EM_EFORMAT, "gate_lower_bound", "must be negative");
    return rc;
}

/* MoE routing fields (needed when num_experts is set). */
static int kimi_moe(const cfg_ctx *c, const json_t *o, bool *has_fkdr, em_hf_kimi *k) {
    static const char *const experts[] = { "num_experts", "n_routed_experts", "num_local_experts" };
    static const char *const topk[] = { "num_experts_per_token", "num_experts_per_tok" };
    static const char *const shared[] = { "num_shared_experts", "n_shared_experts" };
    static const char *const groups[] = { "num_expert_group", "n_group" };
    const char *found = NULL;
    int rc = get_int_alias(c, o, experts, 3, false, &k->num_experts, &found);
    if (rc) return rc;
    bool moe = found != NULL;
    if (moe) rc = check_positive(c, found, k->num_experts);
    if (!rc) rc = get_int_alias(c, o, topk, 2, moe, &k->num_experts_per_token, &found);
    if (!rc && moe) rc = check_range(c, found, k->num_experts_per_token, 1, k->num_experts);
    if (!rc) rc = get_int(c, o, "moe_intermediate_size", moe, &k->moe_intermediate_size, NULL);
    if (!rc && moe) rc = check_positive(c, "moe_intermediate_size", k->moe_intermediate_size);
    if (!rc) rc = get_int_alias(c, o, shared, 2, moe, &k->num_shared_experts, &found);
    if (!rc && moe) rc = check_range(c, found, k->num_shared_experts, 0, 1 << 16);
    if (!rc)
        rc = get_int(c, o, "first_k_dense_replace", false, &k->first_k_dense_replace, has_fkdr);
    if (!rc)
        rc = check_range(c, "first_k_dense_replace", k->first_k_dense_replace, 0,
                         k->num_hidden_layers);
    /* moe_layer_freq: absent means every layer past the dense prefix (Moonshot's remote
     * code reads it with default 1; reference §1 table value 1). */
    k->moe_layer_freq = 1;
    if (!rc) rc = get_int(c, o, "moe_layer_freq", false, &k->moe_layer_freq, NULL);
    if (!rc) rc = check_range(c, "moe_layer_freq", k->moe_layer_freq, 1, k->num_hidden_layers);
    /* Router: absent means sigmoid, what transformers' KimiLinearTopkRouter always computes
     * (its config has no such field) and Moonshot's remote code defaults to. */
    if (moe) snprintf(k->moe_router_activation_func, sizeof k->moe_router_activation_func, "sigmoid");
    if (!rc)
        rc = get_string(c, o, "moe_router_activation_func", false, k->moe_router_activation_func,
                        sizeof k->moe_router_activation_func, NULL);
    if (!rc && moe && strcmp(k->moe_router_activation_func, "sigmoid") != 0 &&
        strcmp(k->moe_router_activation_func, "softmax") != 0)
        rc = field_err(c, EM_EUNSUPPORTED, "moe_router_activation_func",
                       "not \"sigmoid\" or \"softmax\"");
    if (!rc)
        rc = get_bool_alias(c, o, "moe_renormalize", "norm_topk_prob", moe, &k->moe_renormalize,
                            NULL);
    if (!rc) rc = get_double(c, o, "routed_scaling_factor", moe, &k->routed_scaling_factor, NULL);
    if (!rc && moe && !(k->routed_scaling_factor > 0))
        rc = field_err(c, EM_EFORMAT, "routed_scaling_factor", "must be positive");
    /* Expert grouping: absent means no grouping, i.e. one group and top-1 group, which is
     * exactly Kimi Linear's stated no-op setting (reference §1: 1 / 1). use_grouped_topk:
     * absent means true: transformers' router always applies the group-limited top-k (its
     * config has no such field) and Moonshot's remote code defaults it to true. */
    k->num_expert_group = 1;
    k->topk_group = 1;
    k->use_grouped_topk = true;
    if (!rc) rc = get_int_alias(c, o, groups, 2, false, &k->num_expert_group, &found);
    if (!rc) rc = get_int(c, o, "topk_group", false, &k->topk_group, NULL);
    if (!rc) rc = get_bool(c, o, "use_grouped_topk", false, &k->use_grouped_topk, NULL);
    if (!rc && moe)
        rc = check_range(c, found ? found : "num_expert_group", k->num_expert_group, 1,
                         k->num_experts);
    if (!rc && moe && k->num_experts % k->num_expert_group != 0)
        rc = field_err(c, EM_EFORMAT, found ? found : "num_expert_group",
                       "does not divide num_experts");
    if (!rc && moe) rc = check_range(c, "topk_group", k->topk_group, 1, k->num_expert_group);
    if (!rc)
        rc = get_int(c, o, "routed_expert_hidden_size", false, &k->routed_expert_hidden_size, NULL);
    if (!rc && k->routed_expert_hidden_size)
        rc = check_positive(c, "routed_expert_hidden_size", k->routed_expert_hidden_size);
    if (!rc) rc = get_bool(c, o, "latent_moe_use_norm", false, &k->latent_moe_use_norm, NULL);
    return rc;
}

/* quantization_config: method and format strings, recorded for the converter. */
static int kimi_quant(const cfg_ctx *c, const json_t *o, em_hf_kimi *k) {
    json_t *q = member(o, "quantization_config");
    if (!q) return EM_OK;
    if (!json_is_object(q)) return field_err(c, EM_EFORMAT, "quantization_config", "not an object");
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%squantization_config.", c->prefix);
    cfg_ctx qc = { c->file, prefix, c->err };
    int rc =
        get_string(&qc, q, "quant_method", false, k->quant_method, sizeof k->quant_method, NULL);
    if (!rc)
        rc = get_string(&qc, q, "format", false, k->quant_format, sizeof k->quant_format, NULL);
    return rc;
}

/* Fields that K3 adds (SiTU, AttnRes, dense width, quantization). */
static int kimi_k3_extras(const cfg_ctx *c, const json_t *o, em_hf_kimi *k) {
    bool situ = strcmp(k->hidden_act, "situ") == 0;
    int rc = get_int(c, o, "attn_res_block_size", false, &k->attn_res_block_size, NULL);
    if (!rc)
        rc = check_range(c, "attn_res_block_size", k->attn_res_block_size, 0, k->num_hidden_layers);
    if (!rc) rc = get_int(c, o, "dense_ffn_hidden", false, &k->dense_ffn_hidden, NULL);
    if (!rc && k->dense_ffn_hidden) rc = check_positive(c, "dense_ffn_hidden", k->dense_ffn_hidden);
    if (!rc) rc = get_double(c, o, "activation_situ_beta", situ, &k->activation_situ_beta, NULL);
    if (!rc)
        rc = get_double(c, o, "activation_situ_linear_beta", situ, &k->activation_situ_linear_beta,
                        NULL);
    if (!rc && situ && !(k->activation_situ_beta > 0 && k->activation_situ_linear_beta > 0))
        rc = field_err(c, EM_EFORMAT, "activation_situ_beta", "SiTU betas must be positive");
    return rc ? rc : kimi_quant(c, o, k);
}

/* A kimi_linear object (the top level, or K3's text_config). */
static int parse_kimi_object(const cfg_ctx *c, const json_t *o, em_hf_kimi *k) {
    json_t *lac = member(o, "linear_attn_config");
    if (lac && !json_is_object(lac))
        return field_err(c, EM_EFORMAT, "linear_attn_config", "not an object");
    int rc = kimi_core(c, o, k);
    if (rc) return rc;
    k->n_layers = (int)k->num_hidden_layers;
    rc = kimi_attn_table(c, o, lac, k);
    bool has_fkdr = false;
    if (!rc) rc = kimi_moe(c, o, &has_fkdr, k);
    if (!rc) rc = kimi_mlp_table(c, o, has_fkdr, k);
    if (!rc) rc = kimi_mla(c, o, lac == NULL, k);
    if (!rc) rc = kimi_kda_sizes(c, o, lac, k);
    if (!rc) rc = kimi_k3_extras(c, o, k);
    if (!rc && k->n_dense > 0 && !k->dense_ffn_hidden) {
        rc = get_int(c, o, "intermediate_size", true, &k->intermediate_size, NULL);
        if (!rc) rc = check_positive(c, "intermediate_size", k->intermediate_size);
    } else if (!rc) {
        rc = get_int(c, o, "intermediate_size", false, &k->intermediate_size, NULL);
    }
    return rc;
}

static int parse_kimi(const cfg_ctx *top, const json_t *root, bool k3, em_hf_kimi *k) {
    memset(k, 0, sizeof *k);
    k->is_k3 = k3;
    if (!k3) return parse_kimi_object(top, root, k);
    /* K3: model_type kimi_k3 wraps a kimi_linear text_config (kimi-linear.md §9). */
    json_t *text = member(root, "text_config");
    if (!json_is_object(text))
        return field_err(top, EM_EFORMAT, "text_config", "missing or not an object");
    cfg_ctx c = { top->file, "text_config.", top->err };
    char mt[EM_HF_NAME] = "";
    bool has = false;
    int rc = get_string(&c, text, "model_type", false, mt, sizeof mt, &has);
    if (rc) return rc;
    if (has && strcmp(mt, "kimi_linear") != 0)
        return field_err(&c, EM_EUNSUPPORTED, "model_type",
                         "kimi_k3 text_config must be kimi_linear");
    rc = parse_kimi_object(&c, text, k);
    /* Special-token ids may sit at the top level of the wrapper instead. */
    if (!rc && !k->has_bos)
        rc = get_int(top, root, "bos_token_id", false, &k->bos_token_id, &k->has_bos);
    if (!rc && !k->n_eos) rc = get_eos(top, root, k->eos_token_ids, &k->n_eos);
    if (!rc && !k->has_pad)
        rc = get_int(top, root, "pad_token_id", false, &k->pad_token_id, &k->has_pad);
    if (!rc && k->has_bos) rc = check_token(top, "bos_token_id", k->bos_token_id, k->vocab_size);
    if (!rc && k->has_pad) rc = check_token(top, "pad_token_id", k->pad_token_id, k->vocab_size);
    for (int i = 0; !rc && i < k->n_eos; i++)
        rc = check_token(top, "eos_token_id", k->eos_token_ids[i], k->vocab_size);
    /* ... and so may the quantization description. */
    if (!rc && !k->quant_method[0] && !k->quant_format[0]) rc = kimi_quant(top, root, k);
    return rc;
}

/* ---- drafters --------------------------------------------------------------------------- */

const char *em_hf_draft_flavour_name(enum em_hf_draft_flavour f) {
    switch (f) {
    case EM_HF_DRAFT_ZLAB: return "z-lab DFlash";
    case EM_HF_DRAFT_DEEPSPEC: return "DeepSpec DSpark";
    case EM_HF_DRAFT_SPECFORGE: return "SpecForge DSpark";
    case EM_HF_DRAFT_SPECULATORS: return "speculators";
    }
    return "?";
}

const char *em_hf_markov_name(enum em_hf_markov m) {
    switch (m) {
    case EM_HF_MARKOV_NONE: return "none";
    case EM_HF_MARKOV_VANILLA: return "vanilla";
    case EM_HF_MARKOV_GATED: return "gated";
    case EM_HF_MARKOV_RNN: return "rnn";
    }
    return "?";
}

int64_t em_hf_draft_n_drafts(const em_hf_draft *d) {
    return d->sample_from_anchor ? d->block_size : d->block_size - 1;
}

int32_t em_hf_draft_gguf_target_layer(const em_hf_draft *d, int i) {
    return i >= 0 && i < d->n_taps ? d->target_layer_ids[i] + 1 : -1;
}

static bool arch_is(const json_t *root, const char *name) {
    json_t *a = member(root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && strcmp(s, name) == 0) return true;
    }
    return false;
}

/* The flavour; -1 when root is not a drafter config; -2 when it looks like one (it has a
 * dflash_config) but names an architecture none of the flavours uses. */
static int detect_flavour(const json_t *root) {
    json_t *dfc = member(root, "dflash_config");
    const char *proj = json_string_value(member(dfc, "projector_type"));
    bool dspark_proj = proj && strcmp(proj, "dspark") == 0;
    if (member(root, "speculators_model_type")) return EM_HF_DRAFT_SPECULATORS;
    if (arch_is(root, "DSparkDraftModel")) return EM_HF_DRAFT_SPECFORGE;
    if (arch_is(root, "Qwen3DSparkModel") || arch_is(root, "Gemma4DSparkModel"))
        return EM_HF_DRAFT_DEEPSPEC;
    if (arch_is(root, "DFlashDraftModel"))
        return dspark_proj ? EM_HF_DRAFT_SPECFORGE : EM_HF_DRAFT_ZLAB;
    if (dfc) {
        if (json_array_size(member(root, "architectures")) > 0) return -2;
        return dspark_proj ? EM_HF_DRAFT_SPECFORGE : EM_HF_DRAFT_ZLAB;
    }
    /* DeepSpec writes its fields at the top level with no dflash_config (dspark.md §3.2). */
    if (member(root, "markov_rank") && member(root, "target_layer_ids"))
        return EM_HF_DRAFT_DEEPSPEC;
    return -1;
}

/* Drafter fields may live in dflash_config or at the top level (z-lab reads dflash_config
 * first). Both present with different values is an error. */
typedef struct draft_src {
    const json_t *top, *dfc;
    cfg_ctx top_ctx, dfc_ctx;
} draft_src;

static int draft_pick(const draft_src *s, const char *key, const json_t **obj,
                      const cfg_ctx **ctx) {
    json_t *a = member(s->dfc, key), *b = member(s->top, key);
    if (a && b && !json_equal(a, b))
        return em_err_set(s->top_ctx.err, EM_EFORMAT,
                          "%s: fields 'dflash_config.%s' and '%s' disagree", s->top_ctx.file, key,
                          key);
    *obj = a ? s->dfc : s->top;
    *ctx = a ? &s->dfc_ctx : &s->top_ctx;
    return EM_OK;
}

/* The context (top level or dflash_config) a drafter field was read from, for messages. */
static const cfg_ctx *draft_ctx(const draft_src *s, const char *key) {
    return member(s->dfc, key) ? &s->dfc_ctx : &s->top_ctx;
}

static int draft_int(const draft_src *s, const char *key, bool required, int64_t *out,
                     bool *present) {
    const json_t *o = NULL;
    const cfg_ctx *c = NULL;
    int rc = draft_pick(s, key, &o, &c);
    return rc ? rc : get_int(c, o, key, required, out, present);
}

static int draft_bool(const draft_src *s, const char *key, bool *out, bool *present) {
    const json_t *o = NULL;
    const cfg_ctx *c = NULL;
    int rc = draft_pick(s, key, &o, &c);
    return rc ? rc : get_bool(c, o, key, false, out, present);
}

static int draft_double(const draft_src *s, const char *key, double *out, bool *present) {
    const json_t *o = NULL;
    const cfg_ctx *c = NULL;
    int rc = draft_pick(s, key, &o, &c);
    return rc ? rc : get_double(c, o, key, false, out, present);
}

static int draft_string(const draft_src *s, const char *key, char *out, size_t cap, bool *present) {
    const json_t *o = NULL;
    const cfg_ctx *c = NULL;
    int rc = draft_pick(s, key, &o, &c);
    return rc ? rc : get_string(c, o, key, false, out, cap, present);
}

/* Taps: target_layer_ids (HF l) or speculators' aux_hidden_state_layer_ids (l + 1). */
static int draft_taps(const draft_src *s, em_hf_draft *d) {
    bool aux = d->flavour == EM_HF_DRAFT_SPECULATORS;
    const char *key = aux ? "aux_hidden_state_layer_ids" : "target_layer_ids";
    const json_t *o = NULL;
    const cfg_ctx *c = NULL;
    int rc = draft_pick(s, key, &o, &c);
    if (rc) return rc;
    json_t *list = member(o, key);
    if (!list) return field_err(c, EM_EFORMAT, key, "missing");
    if (!json_is_array(list) || json_array_size(list) == 0 ||
        json_array_size(list) > EM_HF_MAX_TAPS)
        return field_err(c, EM_EFORMAT, key, "not a list of 1 to 16 layer ids");
    int64_t top = d->num_target_layers ? d->num_target_layers - 2 : INT32_MAX - 1;
    d->n_taps = (int)json_array_size(list);
    for (int i = 0; i < d->n_taps; i++) {
        json_t *e = json_array_get(list, (size_t)i);
        char what[200];
        if (!json_is_integer(e)) {
            snprintf(what, sizeof what, "item %d is not an integer", i);
            return field_err(c, EM_EFORMAT, key, what);
        }
        int64_t id = (int64_t)json_integer_value(e) - (aux ? 1 : 0);
        /* -1 is the embedding output (DeepSpec); the last layer is never tapped, since HF
         * stores the post-final-norm state there (dspark.md §1.2). */
        if (id < -1 || id > top) {
            snprintf(what, sizeof what, "layer %lld is outside [-1, %lld]%s", (long long)id,
                     (long long)top,
                     d->num_target_layers ? " (the last target layer cannot be tapped)" : "");
            return field_err(c, EM_EFORMAT, key, what);
        }
        for (int j = 0; j < i; j++)
            if (d->target_layer_ids[j] == id) {
                snprintf(what, sizeof what, "layer %lld is listed twice", (long long)id);
                return field_err(c, EM_EFORMAT, key, what);
            }
        d->target_layer_ids[i] = (int32_t)id;
    }
    return EM_OK;
}

/* Drafter layers must all be full attention (sliding-window drafter layers change the mask;
 * Ember does not implement them). */
static int draft_layer_types(const cfg_ctx *c, const json_t *types, int64_t n_layers) {
    char what[128];
    if (!json_is_array(types) || (int64_t)json_array_size(types) != n_layers) {
        snprintf(what, sizeof what, "must be a list of %lld layer types", (long long)n_layers);
        return field_err(c, EM_EFORMAT, "layer_types", what);
    }
    for (size_t i = 0; i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        if (t && strcmp(t, "full_attention") == 0) continue;
        snprintf(what, sizeof what,
                 "entry %zu is %s%.40s%s; only \"full_attention\" drafter layers "
                 "are supported",
                 i, t ? "\"" : "", t ? t : "not a string", t ? "\"" : "");
        return field_err(c, t ? EM_EUNSUPPORTED : EM_EFORMAT, "layer_types", what);
    }
    return EM_OK;
}

/* The Qwen3-style backbone: sizes, norm, RoPE, vocabulary, layer types. */
static int draft_backbone(const cfg_ctx *c, const json_t *m, em_hf_draft *d) {
    int rc = get_string(c, m, "model_type", false, d->backbone_model_type,
                        sizeof d->backbone_model_type, NULL);
    if (!rc && d->backbone_model_type[0] && strcmp(d->backbone_model_type, "qwen3") != 0 &&
        strcmp(d->backbone_model_type, "dspark") != 0 &&
        strcmp(d->backbone_model_type, "dflash") != 0)
        return field_err(c, EM_EUNSUPPORTED, "model_type",
                         "only Qwen3-style drafter backbones are supported");
    const struct {
        const char *key;
        int64_t *dst;
    } sizes[] = {
        { "num_hidden_layers", &d->num_hidden_layers },
        { "hidden_size", &d->hidden_size },
        { "num_attention_heads", &d->num_attention_heads },
        { "num_key_value_heads", &d->num_key_value_heads },
        { "head_dim", &d->head_dim },
        { "intermediate_size", &d->intermediate_size },
        { "vocab_size", &d->vocab_size },
    };
    for (size_t i = 0; !rc && i < sizeof sizes / sizeof sizes[0]; i++) {
        rc = get_int(c, m, sizes[i].key, true, sizes[i].dst, NULL);
        if (!rc) rc = check_positive(c, sizes[i].key, *sizes[i].dst);
    }
    if (!rc) rc = check_range(c, "num_hidden_layers", d->num_hidden_layers, 1, EM_HF_MAX_LAYERS);
    if (!rc && d->num_attention_heads % d->num_key_value_heads != 0)
        rc = field_err(c, EM_EFORMAT, "num_key_value_heads", "does not divide num_attention_heads");
    if (!rc) rc = get_double(c, m, "rms_norm_eps", true, &d->rms_norm_eps, NULL);
    if (!rc && !(d->rms_norm_eps > 0))
        rc = field_err(c, EM_EFORMAT, "rms_norm_eps", "must be positive");
    if (!rc) rc = parse_rope(c, m, true, &d->rope);
    if (!rc)
        rc = get_int(c, m, "max_position_embeddings", false, &d->max_position_embeddings, NULL);
    if (!rc) rc = get_bool(c, m, "attention_bias", false, &d->attention_bias, NULL);
    if (!rc) rc = get_bool(c, m, "tie_word_embeddings", false, &d->tie_word_embeddings, NULL);
    char act[16] = "";
    if (!rc) rc = get_string(c, m, "hidden_act", false, act, sizeof act, NULL);
    if (!rc && act[0] && strcmp(act, "silu") != 0)
        rc = field_err(c, EM_EUNSUPPORTED, "hidden_act", "only \"silu\" drafters are supported");
    json_t *types = member(m, "layer_types");
    if (!rc && types) rc = draft_layer_types(c, types, d->num_hidden_layers);
    return rc;
}

/* Markov and confidence heads (dspark.md §2.2, §2.4). */
static int draft_heads(const draft_src *s, em_hf_draft *d) {
    char type[16] = "";
    bool has_type = false, has = false;
    int rc = draft_int(s, "markov_rank", false, &d->markov_rank, &d->markov_rank_stated);
    if (!rc && d->markov_rank_stated && d->markov_rank < 0)
        rc = field_err(draft_ctx(s, "markov_rank"), EM_EFORMAT, "markov_rank", "must be >= 0");
    if (!rc) rc = draft_string(s, "markov_head_type", type, sizeof type, &has_type);
    if (rc) return rc;
    static const char *const names[] = { "none", "vanilla", "gated", "rnn" };
    /* Absent head type with a rank: vanilla, the documented default (dspark.md §2.2). */
    d->markov = EM_HF_MARKOV_NONE;
    if (!has_type) strcpy(type, "vanilla");
    int found = -1;
    for (int i = 1; i < 4; i++)
        if (strcmp(type, names[i]) == 0) found = i;
    if (found < 0)
        return field_err(draft_ctx(s, "markov_head_type"), EM_EUNSUPPORTED, "markov_head_type",
                         "not vanilla, gated or rnn");
    if (!d->markov_rank_stated || d->markov_rank > 0) d->markov = (enum em_hf_markov)found;
    if (!d->markov_rank_stated && !has_type) d->markov = EM_HF_MARKOV_NONE;
    rc = draft_bool(s, "enable_confidence_head", &d->confidence_head, &has);
    /* with_markov: absent -> true, the documented default (dspark.md §2.4). */
    d->confidence_with_markov = true;
    if (!rc) rc = draft_bool(s, "confidence_head_with_markov", &d->confidence_with_markov, &has);
    if (!rc) rc = draft_double(s, "confidence_head_alpha", &d->confidence_head_alpha, &has);
    if (!rc && d->confidence_head && d->confidence_with_markov && d->markov_rank_stated &&
        d->markov_rank == 0)
        rc = field_err(draft_ctx(s, "enable_confidence_head"), EM_EFORMAT,
                       "confidence_head_with_markov", "needs a Markov head but markov_rank is 0");
    return rc;
}

/* Flavour defaults for facts a config does not carry (dspark.md §1.6, §1.7, §3). */
static void draft_flavour_defaults(em_hf_draft *d, const char *spec_type) {
    switch (d->flavour) {
    case EM_HF_DRAFT_ZLAB:
        d->sample_from_anchor = false;
        d->has_embed_tokens = d->has_lm_head = false;
        break;
    case EM_HF_DRAFT_DEEPSPEC:
        d->sample_from_anchor = true;
        d->has_embed_tokens = d->has_lm_head = true;
        break;
    case EM_HF_DRAFT_SPECFORGE:
        d->sample_from_anchor = true;
        d->has_embed_tokens = d->has_lm_head = false;
        break;
    case EM_HF_DRAFT_SPECULATORS:
        d->sample_from_anchor = strcmp(spec_type, "dflash") != 0;
        d->has_embed_tokens = d->has_lm_head = true;
        break;
    }
}

static int parse_draft(const cfg_ctx *top, const json_t *root, int flavour, em_hf_draft *d) {
    memset(d, 0, sizeof *d);
    d->flavour = (enum em_hf_draft_flavour)flavour;
    d->bos_token_id = d->eos_token_id = d->pad_token_id = -1;
    d->input_embedding_scale = d->output_multiplier = 1;
    json_t *dfc = member(root, "dflash_config");
    if (dfc && !json_is_object(dfc))
        return field_err(top, EM_EFORMAT, "dflash_config", "not an object");
    draft_src s = { root, dfc, *top, { top->file, "dflash_config.", top->err } };
    char spec_type[32] = "";
    int rc =
        get_string(top, root, "speculators_model_type", false, spec_type, sizeof spec_type, NULL);
    if (rc) return rc;
    if (d->flavour == EM_HF_DRAFT_SPECULATORS && strcmp(spec_type, "dspark") != 0 &&
        strcmp(spec_type, "dflash") != 0)
        return field_err(top, EM_EUNSUPPORTED, "speculators_model_type",
                         "not \"dspark\" or \"dflash\"");
    /* DFlash2 adds a selector and dynamic convolutions that Ember does not implement. */
    if (member(root, "selector_rank") || member(dfc, "selector_rank"))
        return field_err(top, EM_EUNSUPPORTED, "selector_rank",
                         "DFlash2 drafters are not supported");
    const json_t *model = root;
    cfg_ctx mc = *top;
    if (d->flavour == EM_HF_DRAFT_SPECULATORS) {
        model = member(root, "transformer_layer_config");
        if (!json_is_object(model))
            return field_err(top, EM_EFORMAT, "transformer_layer_config",
                             "missing or not an object");
        mc.prefix = "transformer_layer_config.";
    }
    rc = draft_backbone(&mc, model, d);
    draft_flavour_defaults(d, spec_type);
    if (!rc) rc = draft_int(&s, "block_size", true, &d->block_size, NULL);
    if (!rc) rc = check_range(draft_ctx(&s, "block_size"), "block_size", d->block_size, 1, 4096);
    if (!rc) rc = draft_int(&s, "num_target_layers", false, &d->num_target_layers, NULL);
    if (!rc && d->num_target_layers)
        rc = check_range(draft_ctx(&s, "num_target_layers"), "num_target_layers",
                         d->num_target_layers, 2, EM_HF_MAX_LAYERS);
    if (!rc) rc = draft_taps(&s, d);
    if (!rc) rc = draft_int(&s, "mask_token_id", true, &d->mask_token_id, NULL);
    if (!rc)
        rc = check_token(draft_ctx(&s, "mask_token_id"), "mask_token_id", d->mask_token_id,
                         d->vocab_size);
    bool has = false;
    d->draft_vocab_size = d->vocab_size;
    if (!rc) rc = draft_int(&s, "draft_vocab_size", false, &d->draft_vocab_size, &has);
    if (!rc && has)
        rc = check_range(draft_ctx(&s, "draft_vocab_size"), "draft_vocab_size", d->draft_vocab_size,
                         1, d->vocab_size);
    if (!rc)
        rc = draft_bool(&s, "sample_from_anchor", &d->sample_from_anchor,
                        &d->sample_from_anchor_stated);
    if (!rc && !d->sample_from_anchor && d->block_size < 2)
        rc = field_err(draft_ctx(&s, "block_size"), EM_EFORMAT, "block_size",
                       "must be at least 2 when slot 0 is the anchor");
    /* In-block attention: non-causal unless stated (dspark.md §1.4). */
    bool c1 = false, c2 = false, h1 = false, h2 = false;
    if (!rc) rc = draft_bool(&s, "is_causal", &c1, &h1);
    if (!rc) rc = draft_bool(&s, "causal", &c2, &h2);
    if (!rc && h1 && h2 && c1 != c2)
        rc = field_err(top, EM_EFORMAT, "causal", "disagrees with is_causal");
    d->causal = h1 ? c1 : c2;
    if (!rc)
        rc = draft_string(&s, "attention_mode", d->attention_mode, sizeof d->attention_mode, &has);
    if (!rc && has && strcmp(d->attention_mode, "gqa") != 0)
        rc = field_err(draft_ctx(&s, "attention_mode"), EM_EUNSUPPORTED, "attention_mode",
                       "only \"gqa\" drafters are supported");
    if (!rc)
        rc = draft_string(&s, "projector_type", d->projector_type, sizeof d->projector_type, NULL);
    if (!rc) rc = draft_double(&s, "final_logit_softcapping", &d->final_logit_softcapping, NULL);
    if (!rc) rc = draft_double(&s, "input_embedding_scale", &d->input_embedding_scale, NULL);
    if (!rc) rc = draft_double(&s, "output_multiplier", &d->output_multiplier, NULL);
    if (!rc) rc = draft_heads(&s, d);
    if (!rc) rc = get_int(top, root, "bos_token_id", false, &d->bos_token_id, NULL);
    if (!rc) rc = get_int(top, root, "pad_token_id", false, &d->pad_token_id, NULL);
    int64_t eos[EM_HF_MAX_EOS];
    int n_eos = 0;
    if (!rc) rc = get_eos(top, root, eos, &n_eos);
    if (!rc && n_eos) d->eos_token_id = eos[0];
    return rc;
}

/* ---- drafter vs checkpoint -------------------------------------------------------------- */

static const em_safetensors_tensor *draft_tensor(const em_safetensors *st, const char *name) {
    char prefixed[128];
    const em_safetensors_tensor *t = em_safetensors_find(st, name);
    if (t) return t;
    snprintf(prefixed, sizeof prefixed, "model.%s", name);
    return em_safetensors_find(st, prefixed);
}

static int want_shape2(const em_safetensors *st, const em_safetensors_tensor *t, int64_t a,
                       int64_t b, em_err *err) {
    if (t->n_dims == 2 && (int64_t)t->shape[0] == a && (int64_t)t->shape[1] == b) return EM_OK;
    return em_err_set(err, EM_EFORMAT,
                      "%s: tensor '%s': shape does not match the config (want [%lld, %lld])",
                      em_safetensors_path(st), t->name, (long long)a, (long long)b);
}

int em_hf_draft_check_tensors(em_hf_draft *d, const em_safetensors *st, em_err *err) {
    const char *path = em_safetensors_path(st);
    const em_safetensors_tensor *fc = draft_tensor(st, "fc.weight");
    if (!fc)
        return em_err_set(err, EM_ENOTFOUND, "%s: drafter tensor 'fc.weight' is missing", path);
    if (fc->n_dims != 2 || (int64_t)fc->shape[0] != d->hidden_size ||
        fc->shape[1] % (uint64_t)d->n_taps)
        return em_err_set(
            err, EM_EFORMAT,
            "%s: tensor 'fc.weight' is not [hidden_size=%lld, %d taps x target hidden]", path,
            (long long)d->hidden_size, d->n_taps);
    const em_safetensors_tensor *w1 = draft_tensor(st, "markov_head.markov_w1.weight");
    const em_safetensors_tensor *w2 = draft_tensor(st, "markov_head.markov_w2.weight");
    if (!d->markov_rank_stated && w1) {
        if (w1->n_dims != 2 || w1->shape[1] == 0 || w1->shape[1] > (1u << 20))
            return em_err_set(err, EM_EFORMAT, "%s: tensor '%s' is not [vocab, rank]", path,
                              w1->name);
        d->markov_rank = (int64_t)w1->shape[1];
        d->markov_rank_stated = true;
        if (d->markov == EM_HF_MARKOV_NONE) d->markov = EM_HF_MARKOV_VANILLA;
    }
    int rc = EM_OK;
    if (d->markov_rank > 0) {
        if (!w1 || !w2)
            return em_err_set(
                err, EM_ENOTFOUND, "%s: markov_rank is %lld but tensor '%s' is missing", path,
                (long long)d->markov_rank,
                !w1 ? "markov_head.markov_w1.weight" : "markov_head.markov_w2.weight");
        rc = want_shape2(st, w1, d->vocab_size, d->markov_rank, err);
        if (!rc) rc = want_shape2(st, w2, d->draft_vocab_size, d->markov_rank, err);
        if (rc) return rc;
        const char *extra = d->markov == EM_HF_MARKOV_GATED ? "markov_head.gate_proj.weight"
                            : d->markov == EM_HF_MARKOV_RNN ? "markov_head.joint_proj.weight"
                                                            : NULL;
        if (extra && !draft_tensor(st, extra))
            return em_err_set(err, EM_ENOTFOUND, "%s: markov_head_type %s needs tensor '%s'", path,
                              em_hf_markov_name(d->markov), extra);
    } else if (w1 || w2) {
        return em_err_set(err, EM_EFORMAT,
                          "%s: tensor '%s' exists but the config has no Markov head", path,
                          (w1 ? w1 : w2)->name);
    }
    const em_safetensors_tensor *cw = draft_tensor(st, "confidence_head.proj.weight");
    const em_safetensors_tensor *cb = draft_tensor(st, "confidence_head.proj.bias");
    if (d->confidence_head) {
        if (!cw || !cb)
            return em_err_set(err, EM_ENOTFOUND,
                              "%s: enable_confidence_head is set but tensor '%s' is missing", path,
                              !cw ? "confidence_head.proj.weight" : "confidence_head.proj.bias");
        rc = want_shape2(st, cw, 1,
                         d->hidden_size + (d->confidence_with_markov ? d->markov_rank : 0), err);
        if (rc) return rc;
    } else if (cw) {
        return em_err_set(err, EM_EFORMAT,
                          "%s: tensor '%s' exists but enable_confidence_head is not set", path,
                          cw->name);
    }
    d->has_embed_tokens = draft_tensor(st, "embed_tokens.weight") != NULL;
    d->has_lm_head = draft_tensor(st, "lm_head.weight") != NULL;
    d->tensors_checked = true;
    return EM_OK;
}

/* ---- entry points ----------------------------------------------------------------------- */

const char *em_hf_attn_kind_name(enum em_hf_attn_kind k) {
    return k == EM_HF_ATTN_MLA ? "mla" : "kda";
}
const char *em_hf_mlp_kind_name(enum em_hf_mlp_kind k) {
    return k == EM_HF_MLP_MOE ? "moe" : "dense";
}

int em_hf_config_parse(em_hf_config *out, const char *json, size_t len, const char *name,
                       em_err *err) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return em_err_set(err, EM_EFORMAT, "%s: line %d, column %d (byte %d): %s", name, jerr.line,
                          jerr.column, jerr.position, jerr.text);
    cfg_ctx c = { name, "", err };
    int rc = EM_OK;
    if (!json_is_object(root)) rc = em_err_set(err, EM_EFORMAT, "%s: not a JSON object", name);
    if (!rc)
        rc = get_string(&c, root, "model_type", false, out->model_type, sizeof out->model_type,
                        NULL);
    json_t *arch = member(root, "architectures");
    if (!rc && arch &&
        (!json_is_array(arch) ||
         (json_array_size(arch) && !json_is_string(json_array_get(arch, 0)))))
        rc = field_err(&c, EM_EFORMAT, "architectures", "not a list of strings");
    if (!rc && json_array_size(arch)) {
        const char *a = json_string_value(json_array_get(arch, 0));
        snprintf(out->architecture, sizeof out->architecture, "%s", a);
    }
    int flavour = rc ? -1 : detect_flavour(root);
    if (rc) {
    } else if (flavour == -2) {
        rc = em_err_set(err, EM_EUNSUPPORTED,
                        "%s: drafter architecture '%s' is not one Ember reads (DFlashDraftModel, "
                        "DSparkDraftModel, Qwen3DSparkModel, speculators)",
                        name, out->architecture);
    } else if (flavour >= 0) {
        out->kind = EM_HF_DRAFT;
        rc = parse_draft(&c, root, flavour, &out->draft);
    } else if (strcmp(out->model_type, "kimi_linear") == 0 ||
               strcmp(out->model_type, "kimi_k3") == 0) {
        out->kind = EM_HF_KIMI;
        rc = parse_kimi(&c, root, strcmp(out->model_type, "kimi_k3") == 0, &out->kimi);
    } else if (!out->model_type[0]) {
        rc = field_err(&c, EM_EFORMAT, "model_type",
                       "missing (and not a DFlash/DSpark drafter config)");
    } else {
        rc = em_err_set(err, EM_EUNSUPPORTED,
                        "%s: unknown model_type '%s' (supported: kimi_linear, "
                        "kimi_k3, DFlash/DSpark drafters)",
                        name, out->model_type);
    }
    json_decref(root);
    return rc;
}

int em_hf_config_load(em_hf_config *out, const char *path, em_err *err) {
    struct stat sb;
    char joined[4096];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(joined, sizeof joined, "%s/config.json", path) >= sizeof joined)
            return em_err_set(err, EM_EINVAL, "%s: path too long", path);
        path = joined;
    }
    char *text;
    size_t len;
    int rc = em_file_read_all(path, &text, &len, err);
    if (rc) return rc;
    rc = em_hf_config_parse(out, text, len, path, err);
    free(text);
    return rc;
}

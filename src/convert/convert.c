/* convert/convert.c: the conversion engine. It knows no model: an architecture's tables
 * (map_*.c) say which source tensors exist, what they become and how; this file
 *   1. plans: instantiates every rule for the layers it applies to, finds its source tensors,
 *      checks their dtype and shape against config.json, picks the output type by policy,
 *      and fails naming the tensor when a required one is missing or any source tensor is
 *      left unmapped;
 *   2. writes the metadata (general.*, the architecture's keys, tokenizer.*) and declares the
 *      tensors;
 *   3. streams each tensor in row chunks: pread the source bytes into a bounded buffer,
 *      widen to f32, apply the transform, quantize on the thread pool, measure the error on
 *      sampled rows, hand the bytes to the GGUF writer.
 *
 * Memory: the source is read with pread, never mapped (mapped pages would count in RSS once
 * touched), into buffers sized for one chunk (CHUNK_ELEMS values); only a kv_b head block
 * (nope x kv_lora values) or a d2t map may be larger. The writer holds 1 MiB. So peak memory
 * does not grow with the model.
 *
 * Failure: the GGUF writer removes its temporary files unless finish succeeded; this file
 * never creates any other output. A cancel flag is polled between chunks. */
#include "convert/convert_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_ELEMS ((uint64_t)1 << 21) /* values per chunk: 8 MiB as f32 */

/* ---- key values ---------------------------------------------------------------------- */

void em_cv_set_u(cv_model *m, enum cv_vid v, uint64_t u) {
    m->vals[v].set = true;
    m->vals[v].u = u;
}
void em_cv_set_f(cv_model *m, enum cv_vid v, double f) {
    m->vals[v].set = true;
    m->vals[v].f = f;
}
void em_cv_set_b(cv_model *m, enum cv_vid v, bool b) {
    m->vals[v].set = true;
    m->vals[v].b = b;
}
void em_cv_set_s(cv_model *m, enum cv_vid v, const char *s) {
    m->vals[v].set = true;
    snprintf(m->vals[v].s, sizeof m->vals[v].s, "%s", s);
}
void em_cv_set_arr(cv_model *m, enum cv_vid v, int32_t *arr, int n) {
    free(m->vals[v].arr);
    m->vals[v].set = true;
    m->vals[v].arr = arr;
    m->vals[v].n_arr = n;
}

static void model_free(cv_model *m) {
    for (int i = 0; i < CV_V_COUNT; i++) free(m->vals[i].arr);
}

int em_cv_arch_for(const em_hf_config *cfg, const char *cfg_path, const cv_arch **out,
                   em_err *err) {
    if (cfg->kind == EM_HF_KIMI && cfg->kimi.is_k3) *out = &em_cv_arch_kimi_k3;
    else if (cfg->kind == EM_HF_KIMI) *out = &em_cv_arch_kimi_linear;
    else if (cfg->kind == EM_HF_DRAFT) *out = &em_cv_arch_dflash;
    else return em_err_set(err, EM_EUNSUPPORTED, "%s: not a model the converter writes", cfg_path);
    return EM_OK;
}

/* ---- policy ------------------------------------------------------------------------- */

const char *em_convert_policy(int type) {
    switch (type) {
    case EM_TYPE_Q8_0:
        return "q8_0: weight matrices (2-D, and stacked experts / kv_b halves of them) whose "
               "rows are a multiple of 32 values; f16: other matrices; f32: norms, biases, "
               "ssm_a, ssm_dt bias, conv weights, MoE router, confidence head; i64: d2t";
    case EM_TYPE_BF16:
        return "bf16: weight matrices; f32: norms, biases, ssm_a, ssm_dt bias, conv weights, "
               "MoE router, confidence head; i64: d2t";
    case EM_TYPE_F16:
        return "f16: weight matrices; f32: norms, biases, ssm_a, ssm_dt bias, conv weights, "
               "MoE router, confidence head; i64: d2t";
    case EM_TYPE_F32:
        return "f32: every tensor; i64: d2t";
    default:
        return NULL;
    }
}

int em_convert_file_type(int type) {
    switch (type) {
    case EM_TYPE_F32: return 0;
    case EM_TYPE_F16: return 1;
    case EM_TYPE_Q8_0: return 7;
    case EM_TYPE_BF16: return 32;
    default: return -1;
    }
}

static int policy_type(int requested, int cls, int64_t ne0) {
    if (cls == CV_K_I64) return EM_TYPE_I64;
    if (cls == CV_K_MXFP4) return EM_TYPE_MXFP4; /* kept as the source has it: lossless */
    if (cls != CV_K_MATRIX || requested == EM_TYPE_F32) return EM_TYPE_F32;
    const em_type_info *ti = em_type_get(requested);
    if (ne0 % ti->block_elems == 0) return requested;
    return EM_TYPE_F16; /* a matrix q8_0 cannot hold, as llama.cpp's converter falls back */
}

/* ---- the plan ------------------------------------------------------------------------ */

typedef struct cv_out {
    char name[EM_CONVERT_NAME];
    const cv_rule *rule;
    int type;
    int n_dims;
    int64_t ne[4];
    uint64_t n_elem, rows, row_elems, row_bytes;
    const em_safetensors_tensor **parts; /* NEXP for CV_X_STACK, else 1 */
    int n_parts;
    uint64_t src_bytes;
} cv_out;

typedef struct cv_plan {
    cv_out *outs;
    int64_t n_outs, cap_outs;
    const em_safetensors_tensor **used; /* sources consumed (sorted at the end) */
    int64_t n_used, cap_used;
    int64_t n_dropped;
    int64_t n_skipped; /* sources under the arch's skip prefixes */
} cv_plan;

static void plan_free(cv_plan *p) {
    for (int64_t i = 0; i < p->n_outs; i++) free(p->outs[i].parts);
    free(p->outs);
    free(p->used);
    memset(p, 0, sizeof *p);
}

static int mark_used(cv_plan *p, const em_safetensors_tensor *t, em_err *err) {
    if (p->n_used == p->cap_used) {
        int64_t cap = p->cap_used ? 2 * p->cap_used : 256;
        const em_safetensors_tensor **u = realloc(p->used, (size_t)cap * sizeof *u);
        if (!u) return em_err_set(err, EM_ENOMEM, "converter: out of memory (tensor list)");
        p->used = u;
        p->cap_used = cap;
    }
    p->used[p->n_used++] = t;
    return EM_OK;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Replaces {L} with layer and {E} with expert. */
static int expand(const char *pat, int layer, int expert, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = pat; *p; p++) {
        char num[24] = "";
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            snprintf(num, sizeof num, "%d", p[1] == 'L' ? layer : expert);
            p += 2;
        } else {
            num[0] = *p;
            num[1] = 0;
        }
        size_t k = strlen(num);
        if (n + k >= cap) return -1;
        memcpy(out + n, num, k);
        n += k;
    }
    out[n] = 0;
    return 0;
}

static const em_safetensors_tensor *find_src(const cv_arch *a, const em_safetensors *st,
                                             const char *name) {
    const em_safetensors_tensor *t = em_safetensors_find(st, name);
    if (!t && a->optional_prefix) {
        char full[512];
        snprintf(full, sizeof full, "%s%s", a->optional_prefix, name);
        t = em_safetensors_find(st, full);
    }
    return t;
}

static void shape_text(const uint64_t *s, int n, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

static bool is_float_dtype(enum em_st_dtype t) {
    return t == EM_ST_F32 || t == EM_ST_F16 || t == EM_ST_BF16 || t == EM_ST_F64;
}
static bool is_int_dtype(enum em_st_dtype t) {
    return t == EM_ST_I64 || t == EM_ST_I32 || t == EM_ST_I16 || t == EM_ST_I8 ||
           t == EM_ST_U32 || t == EM_ST_U16 || t == EM_ST_U8;
}

/* The source must have the rule's shape up to dimensions of size 1 (HF writes conv weights
 * as [d_inner, 1, d_conv] or [d_inner, d_conv], A_log as [1, 1, heads, 1]). */
/* compressed-tensors MXFP4 parts: U8 weight_packed [out, in/2] (part 0 of each expert) and
 * U8 weight_scale [out, in/32] (part 1), for the rule's logical [out, in]. */
static int check_mxfp4_part(const cv_model *m, const cv_rule *r, const em_safetensors_tensor *t,
                            int part, const char *dst, em_err *err) {
    uint64_t out = (uint64_t)m->dims[r->src_dims[0]], in = (uint64_t)m->dims[r->src_dims[1]];
    if (in % 32 != 0)
        return em_err_set(err, EM_EFORMAT, "%s: MXFP4 tensor '%s': %llu columns (config.json %s) "
                          "are not a multiple of 32", t->path, t->name, (unsigned long long)in,
                          m->cfg_path);
    /* scales are E8M0 bytes, written as U8 or as the F8_E8M0 dtype */
    if (t->dtype != EM_ST_U8 && !(part && t->dtype == EM_ST_F8_E8M0))
        return em_err_set(err, EM_EUNSUPPORTED, "%s: MXFP4 tensor '%s' has dtype %s; the "
                          "converter reads %s", t->path, t->name, em_st_dtype_name(t->dtype),
                          part ? "E8M0 scale bytes (U8 or F8_E8M0)" : "U8 packed nibbles");
    uint64_t want[2] = { out, part ? in / 32 : in / 2 };
    if (t->n_dims != 2 || t->shape[0] != want[0] || t->shape[1] != want[1]) {
        char a[96], b[160];
        shape_text(want, 2, a, sizeof a);
        shape_text(t->shape, t->n_dims, b, sizeof b);
        return em_err_set(err, EM_EFORMAT, "%s: tensor '%s' has shape %s but config.json (%s) "
                          "implies %s (%s of MXFP4 GGUF tensor '%s')", t->path, t->name, b,
                          m->cfg_path, a, part ? "scales" : "packed codes", dst ? dst : "-");
    }
    return EM_OK;
}

/* A source of which only the first `want` values are used (K3's A_log, padded past the
 * heads): one dimension other than 1, at least that long. */
static bool prefix_shape_ok(const em_safetensors_tensor *t, uint64_t want) {
    int big = 0;
    for (int i = 0; i < t->n_dims; i++) big += t->shape[i] != 1;
    return big <= 1 && t->n_elements >= want;
}

static int check_source(const cv_model *m, const cv_rule *r, const em_safetensors_tensor *t,
                        int part, const char *dst, em_err *err) {
    if (r->xf == CV_X_MXFP4) return check_mxfp4_part(m, r, t, part % 2, dst, err);
    bool want_int = r->xf == CV_X_D2T;
    if (want_int ? !is_int_dtype(t->dtype) : !is_float_dtype(t->dtype))
        return em_err_set(err, EM_EUNSUPPORTED,
                          "%s: tensor '%s' has dtype %s; the converter reads %s here", t->path,
                          t->name, em_st_dtype_name(t->dtype),
                          want_int ? "an integer type" : "F32, F16, BF16 or F64");
    uint64_t want[4], got[EM_ST_MAX_DIMS], full[4];
    int nw = 0, ng = 0;
    for (int i = 0; i < r->src_n; i++) {
        full[i] = (uint64_t)m->dims[r->src_dims[i]];
        if (full[i] != 1) want[nw++] = full[i];
    }
    for (int i = 0; i < t->n_dims; i++)
        if (t->shape[i] != 1) got[ng++] = t->shape[i];
    bool same = nw == ng;
    for (int i = 0; same && i < nw; i++) same = want[i] == got[i];
    if (r->xf == CV_X_NEG_EXP_HEAD) same = prefix_shape_ok(t, (uint64_t)m->dims[r->src_dims[0]]);
    if (!same) {
        char a[96], b[160];
        shape_text(full, r->src_n, a, sizeof a);
        shape_text(t->shape, t->n_dims, b, sizeof b);
        return em_err_set(err, EM_EFORMAT,
                          "%s: tensor '%s' has shape %s but config.json (%s) implies %s "
                          "(for GGUF tensor '%s')",
                          t->path, t->name, b, m->cfg_path, a, dst ? dst : "-");
    }
    return EM_OK;
}

static cv_out *add_out(cv_plan *p, em_err *err) {
    if (p->n_outs == p->cap_outs) {
        int64_t cap = p->cap_outs ? 2 * p->cap_outs : 128;
        cv_out *o = realloc(p->outs, (size_t)cap * sizeof *o);
        if (!o) {
            em_err_set(err, EM_ENOMEM, "converter: out of memory (tensor plan)");
            return NULL;
        }
        p->outs = o;
        p->cap_outs = cap;
    }
    cv_out *o = &p->outs[p->n_outs++];
    memset(o, 0, sizeof *o);
    return o;
}

/* Whether the checkpoint spells its names with the arch's optional prefix (K3's
 * `language_model.`): error messages then name a missing tensor as it would be spelled. */
static bool uses_prefix(const cv_arch *a, const em_safetensors *st) {
    if (!a->optional_prefix) return false;
    size_t k = strlen(a->optional_prefix), n = em_safetensors_count(st);
    for (size_t i = 0; i < n; i++)
        if (!strncmp(em_safetensors_at(st, i)->name, a->optional_prefix, k)) return true;
    return false;
}

/* Looks the sources of one rule instance up; *n = 0 when an optional one is absent. */
static int find_parts(const cv_arch *a, const cv_model *m, const cv_rule *r, int layer,
                      const char *dst, const em_safetensors_tensor ***parts, int *n,
                      em_err *err) {
    int count = r->xf == CV_X_STACK   ? (int)m->dims[CV_D_NEXP]
                : r->xf == CV_X_MXFP4 ? 2 * (int)m->dims[CV_D_NEXP] /* packed, scale per expert */
                : r->xf == CV_X_FUSE_MUL ? 2                         /* the two factors */
                                         : 1;
    *n = 0;
    *parts = calloc((size_t)(count > 0 ? count : 1), sizeof **parts);
    if (!*parts) return em_err_set(err, EM_ENOMEM, "converter: out of memory");
    char name[512];
    for (int e = 0; e < count; e++) {
        /* pairs: alt names the second tensor of each pair, not another spelling */
        bool paired = r->xf == CV_X_MXFP4 || r->xf == CV_X_FUSE_MUL;
        int expert = r->xf == CV_X_MXFP4 ? e / 2 : e;
        if (expand(paired && e % 2 ? r->alt : r->src, layer, expert, name, sizeof name))
            return em_err_set(err, EM_EOVERFLOW, "converter: tensor name too long");
        const em_safetensors_tensor *t = find_src(a, m->st, name);
        if (!t && r->alt && !paired) {
            char alt[512];
            if (expand(r->alt, layer, expert, alt, sizeof alt))
                return em_err_set(err, EM_EOVERFLOW, "converter: tensor name too long");
            t = find_src(a, m->st, alt);
        }
        if (!t) {
            if (r->need != CV_REQUIRED && e == 0) return EM_OK;
            const char *pre = uses_prefix(a, m->st) ? a->optional_prefix : "";
            return em_err_set(err, EM_ENOTFOUND,
                              "%s: tensor '%s%s' is missing (needed for GGUF tensor '%s'%s%s)",
                              em_safetensors_path(m->st), pre, name, dst ? dst : "-",
                              r->alt && !paired ? "; also looked for " : "",
                              r->alt && !paired ? r->alt : "");
        }
        (*parts)[e] = t;
    }
    *n = count;
    return EM_OK;
}

static int plan_rule(cv_plan *p, const cv_arch *a, const cv_model *m, const cv_rule *r,
                     int layer, int type, em_err *err) {
    char dst[EM_CONVERT_NAME * 2] = "";
    if (r->dst && (expand(r->dst, layer, 0, dst, sizeof dst) || strlen(dst) > EM_GGUF_MAX_NAME))
        return em_err_set(err, EM_EOVERFLOW, "converter: GGUF tensor name '%s' too long", r->dst);
    const em_safetensors_tensor **parts = NULL;
    int n = 0, rc = find_parts(a, m, r, layer, r->dst ? dst : NULL, &parts, &n, err);
    for (int e = 0; !rc && e < n; e++) {
        if (r->need != CV_DROP) rc = check_source(m, r, parts[e], e, dst, err);
        if (!rc) rc = mark_used(p, parts[e], err);
    }
    if (rc || n == 0 || r->need == CV_DROP) {
        if (!rc && n && r->need == CV_DROP) p->n_dropped += n;
        free(parts);
        return rc;
    }
    cv_out *o = add_out(p, err);
    if (!o) {
        free(parts);
        return EM_ENOMEM;
    }
    memcpy(o->name, dst, strlen(dst) + 1); /* fits: checked against EM_GGUF_MAX_NAME above */
    o->rule = r;
    o->parts = parts;
    o->n_parts = n;
    o->n_dims = r->dst_n;
    o->n_elem = 1;
    for (int i = 0; i < 4; i++) o->ne[i] = i < r->dst_n ? m->dims[r->dst_ne[i]] : 1;
    for (int i = 0; i < r->dst_n; i++) o->n_elem *= (uint64_t)o->ne[i];
    o->row_elems = (uint64_t)o->ne[0];
    o->rows = o->n_elem / o->row_elems;
    o->type = policy_type(type, r->cls, o->ne[0]);
    if ((rc = em_type_row_bytes(o->type, o->row_elems, &o->row_bytes, err))) return rc;
    for (int e = 0; e < n; e++) o->src_bytes += parts[e]->n_bytes;
    if (r->xf == CV_X_KV_B_K || r->xf == CV_X_KV_B_V) /* each reads half of kv_b */
        o->src_bytes = o->n_elem * em_st_dtype_size(parts[0]->dtype);
    return EM_OK;
}

static int plan_scope(cv_plan *p, const cv_arch *a, const cv_model *m, int scope, int layer,
                      int type, em_err *err) {
    uint32_t cond = m->flags | (scope == CV_LAYER ? m->layer_flags[layer] : 0);
    for (size_t t = 0; t < a->rules.n; t++)
        for (size_t i = 0; i < a->rules.list[t]->n; i++) {
            const cv_rule *r = &a->rules.list[t]->rules[i];
            if (r->scope != scope || (r->when & cond) != r->when) continue;
            int rc = plan_rule(p, a, m, r, layer, type, err);
            if (rc) return rc;
        }
    return EM_OK;
}

/* A source the architecture leaves out on purpose (K3's vision tower). */
static bool skipped(const cv_arch *a, const char *name) {
    for (const char *const *s = a->skip_prefixes; s && *s; s++)
        if (!strncmp(name, *s, strlen(*s))) return true;
    return false;
}

static int plan_build(cv_plan *p, const cv_arch *a, const cv_model *m, int type, em_err *err) {
    if (m->n_layers < 0 || m->n_layers > EM_HF_MAX_LAYERS)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: %d layers", m->cfg_path, m->n_layers);
    int rc = plan_scope(p, a, m, CV_PRE, 0, type, err);
    for (int l = 0; !rc && l < m->n_layers; l++) rc = plan_scope(p, a, m, CV_LAYER, l, type, err);
    if (!rc) rc = plan_scope(p, a, m, CV_POST, 0, type, err);
    if (rc) return rc;
    /* every source tensor must have been consumed by some rule */
    qsort(p->used, (size_t)p->n_used, sizeof *p->used, cmp_ptr);
    int64_t uniq = 0; /* kv_b feeds two GGUF tensors */
    for (int64_t i = 0; i < p->n_used; i++)
        if (!uniq || p->used[uniq - 1] != p->used[i]) p->used[uniq++] = p->used[i];
    p->n_used = uniq;
    size_t n = em_safetensors_count(m->st);
    for (size_t i = 0; i < n; i++) {
        const em_safetensors_tensor *t = em_safetensors_at(m->st, i);
        if (skipped(a, t->name)) {
            p->n_skipped++;
            continue;
        }
        if (!bsearch(&t, p->used, (size_t)p->n_used, sizeof *p->used, cmp_ptr))
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%s' is not part of the %s mapping (unknown tensor; "
                              "config.json does not describe it)",
                              t->path, t->name, a->name);
    }
    return EM_OK;
}

/* ---- metadata ------------------------------------------------------------------------ */

static int write_key(em_gguf_writer *w, const cv_arch *a, const cv_key *k, const cv_val *v,
                     em_err *err) {
    char key[128];
    char *brace = strstr(k->key, "{A}");
    if (brace) snprintf(key, sizeof key, "%.*s%s%s", (int)(brace - k->key), k->key, a->name, brace + 3);
    else snprintf(key, sizeof key, "%s", k->key);
    switch (k->type) {
    case CV_T_U32:
        if (v->u > UINT32_MAX)
            return em_err_set(err, EM_EOVERFLOW, "converter: key %s = %llu does not fit in u32",
                              key, (unsigned long long)v->u);
        return em_gguf_writer_set_u32(w, key, (uint32_t)v->u, err);
    case CV_T_F32: return em_gguf_writer_set_f32(w, key, (float)v->f, err);
    case CV_T_BOOL: return em_gguf_writer_set_bool(w, key, v->b, err);
    case CV_T_STR: return em_gguf_writer_set_str(w, key, v->s, err);
    default: return em_gguf_writer_set_arr(w, key, EM_GGUF_I32, v->arr, (uint64_t)v->n_arr, err);
    }
}

static void base_name(const char *dir, char *out, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    snprintf(out, cap, "%.*s", (int)(n - s), dir + s);
}

static int write_metadata(em_gguf_writer *w, const cv_arch *a, const cv_model *m,
                          const em_convert_opts *o, int64_t vocab, em_convert_report *rep,
                          em_err *err) {
    char name[256];
    base_name(o->src_dir, name, sizeof name);
    int rc = em_gguf_writer_set_str(w, "general.architecture", a->name, err);
    if (!rc) rc = em_gguf_writer_set_str(w, "general.type", "model", err);
    if (!rc) rc = em_gguf_writer_set_str(w, "general.name", name, err);
    for (size_t t = 0; !rc && t < a->keys.n; t++)
        for (size_t i = 0; !rc && i < a->keys.list[t]->n; i++) {
            const cv_key *k = &a->keys.list[t]->keys[i];
            if (m->vals[k->val].set) rc = write_key(w, a, k, &m->vals[k->val], err);
        }
    if (!rc)
        rc = em_gguf_writer_set_u32(w, "general.file_type",
                                    (uint32_t)(m->file_type >= 0 ? m->file_type
                                                                 : em_convert_file_type(o->type)),
                                    err);
    if (!rc) rc = em_gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    const char *tok_dir = o->tokenizer_dir ? o->tokenizer_dir : o->src_dir;
    if (!rc) rc = em_cv_write_vocab(w, tok_dir, vocab, m->vocab_arch, m, rep, err);
    return rc;
}

/* ---- streaming ------------------------------------------------------------------------ */

typedef struct cv_stream {
    const em_convert_opts *opts;
    const em_safetensors *st;
    em_gguf_writer *w;
    em_pool *pool;
    int n_tasks;
    int *fds; /* per safetensors shard, opened on first use */
    int n_fds;
    uint8_t *raw;
    size_t raw_cap;
    float *f32, *tmp; /* source values; transposed values (kv_b k part) */
    size_t f32_cap, tmp_cap;
    uint8_t *q;
    size_t q_cap;
    float *deq;
    size_t deq_cap;
    em_convert_progress prog;
    double t0;
    int rmse_rows;
} cv_stream;

static int grow(void **p, size_t *cap, size_t need, const char *what, em_err *err) {
    if (need <= *cap) return EM_OK;
    void *n = realloc(*p, need);
    if (!n) return em_err_set(err, EM_ENOMEM, "converter: out of memory (%zu bytes of %s)", need, what);
    *p = n;
    *cap = need;
    return EM_OK;
}

static int source_fd(cv_stream *s, const em_safetensors_tensor *t, em_err *err) {
    if (s->fds[t->shard] >= 0) return s->fds[t->shard];
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_err_set(err, EM_EIO, "%s: cannot open: %s", t->path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    s->fds[t->shard] = fd;
    return fd;
}

/* Reads elements [first, first + count) of t into s->raw. */
static int read_elems(cv_stream *s, const em_safetensors_tensor *t, uint64_t first,
                      uint64_t count, em_err *err) {
    size_t es = em_st_dtype_size(t->dtype);
    if (first > t->n_elements || count > t->n_elements - first)
        return em_err_set(err, EM_EINVAL, "converter: read past tensor '%s'", t->name);
    int rc = grow((void **)&s->raw, &s->raw_cap, (size_t)(count * es), "source bytes", err);
    if (rc) return rc;
    int fd = source_fd(s, t, err);
    if (fd < 0) return fd;
    rc = em_pread_full(fd, s->raw, (size_t)(count * es), t->file_offset + first * es, t->path, err);
    if (rc) return em_err_prefix(err, "tensor '%s'", t->name);
    s->prog.bytes_done += count * es;
    return EM_OK;
}

/* Parallel pieces of one chunk. */
typedef struct chunk_job {
    cv_stream *s;
    enum em_st_dtype dtype;
    const uint8_t *raw;
    float *f32;       /* widened source */
    const float *in;  /* rows to quantize */
    uint8_t *q;
    uint64_t n;       /* values to widen */
    uint64_t rows, row_elems, row_bytes;
    int type;
    int failed;
} chunk_job;

static void job_widen(void *ctx, int task, int thread) {
    (void)thread;
    chunk_job *j = ctx;
    uint64_t per = (j->n + (uint64_t)j->s->n_tasks - 1) / (uint64_t)j->s->n_tasks;
    uint64_t a = (uint64_t)task * per, b = a + per < j->n ? a + per : j->n;
    if (a >= b) return;
    em_st_convert_f32(j->dtype, j->raw + a * em_st_dtype_size(j->dtype), j->f32 + a, (size_t)(b - a));
}

static void job_quantize(void *ctx, int task, int thread) {
    (void)thread;
    chunk_job *j = ctx;
    uint64_t per = (j->rows + (uint64_t)j->s->n_tasks - 1) / (uint64_t)j->s->n_tasks;
    uint64_t a = (uint64_t)task * per, b = a + per < j->rows ? a + per : j->rows;
    if (a >= b) return;
    if (em_quantize(j->type, j->in + a * j->row_elems, j->q + a * j->row_bytes,
                    (int64_t)((b - a) * j->row_elems), NULL))
        j->failed = 1;
}

/* Row r of the k part of kv_b, written as ne [nope, kv_lora, heads]: row (c, h) holds
 * kv_b[h*(nope+v) + n][c] for n < nope. blk holds the head's k rows [nope][kv_lora]. */
static void transpose_k(const float *blk, int64_t nope, int64_t kv_lora, uint64_t c0,
                        uint64_t nrows, float *out) {
    for (uint64_t i = 0; i < nrows; i++)
        for (int64_t n = 0; n < nope; n++)
            out[i * (uint64_t)nope + (uint64_t)n] = blk[(uint64_t)n * (uint64_t)kv_lora + c0 + i];
}

/* Rows per group: a chunk never crosses a group (an expert, a kv_b head). */
static uint64_t group_rows(const cv_out *o, const int64_t *dims) {
    switch (o->rule->xf) {
    case CV_X_STACK: return o->rows / (uint64_t)o->n_parts;
    case CV_X_MXFP4: return o->rows / ((uint64_t)o->n_parts / 2);
    case CV_X_KV_B_K: return (uint64_t)dims[CV_D_KV_LORA];
    case CV_X_KV_B_V: return (uint64_t)dims[CV_D_V];
    default: return o->rows;
    }
}

/* FUSE_MUL: multiplies s->f32 (the first factor's elements [first, first + count)) by the
 * same elements of the second factor, in f32 as llama.cpp's converter does. */
static int fuse_second(cv_stream *s, const cv_out *o, uint64_t first, uint64_t count, em_err *err) {
    const em_safetensors_tensor *t = o->parts[1];
    int rc = read_elems(s, t, first, count, err);
    if (!rc) rc = grow((void **)&s->tmp, &s->tmp_cap, (size_t)count * sizeof(float), "values", err);
    if (rc) return rc;
    em_st_convert_f32(t->dtype, s->raw, s->tmp, (size_t)count);
    for (uint64_t i = 0; i < count; i++) s->f32[i] *= s->tmp[i];
    return EM_OK;
}

/* Fills s->f32 (or s->tmp, via *vals) with output rows [r0, r0 + nrows) as f32. */
static int produce_rows(cv_stream *s, const cv_out *o, const int64_t *dims, uint64_t r0,
                        uint64_t nrows, const float **vals, em_err *err) {
    uint64_t G = group_rows(o, dims), g = r0 / G, rin = r0 - g * G;
    const em_safetensors_tensor *t = o->parts[o->rule->xf == CV_X_STACK ? g : 0];
    uint64_t first, count;
    int64_t nope = dims[CV_D_NOPE], v = dims[CV_D_V], kv_lora = dims[CV_D_KV_LORA];
    switch (o->rule->xf) {
    case CV_X_STACK: first = rin * o->row_elems, count = nrows * o->row_elems; break;
    case CV_X_KV_B_V:
        first = (g * (uint64_t)(nope + v) + (uint64_t)nope + rin) * (uint64_t)kv_lora;
        count = nrows * o->row_elems;
        break;
    case CV_X_KV_B_K: first = g * (uint64_t)(nope + v) * (uint64_t)kv_lora, count = (uint64_t)(nope * kv_lora); break;
    default: first = r0 * o->row_elems, count = nrows * o->row_elems; break;
    }
    int rc = read_elems(s, t, first, count, err);
    if (!rc) rc = grow((void **)&s->f32, &s->f32_cap, (size_t)count * sizeof(float), "values", err);
    if (rc) return rc;
    chunk_job j = { .s = s, .dtype = t->dtype, .raw = s->raw, .f32 = s->f32, .n = count };
    em_pool_run(s->pool, s->n_tasks, job_widen, &j);
    *vals = s->f32;
    if (o->rule->xf == CV_X_NEG_EXP || o->rule->xf == CV_X_NEG_EXP_HEAD) {
        for (uint64_t i = 0; i < count; i++) s->f32[i] = -expf(s->f32[i]);
    } else if (o->rule->xf == CV_X_FUSE_MUL) {
        rc = fuse_second(s, o, first, count, err);
    } else if (o->rule->xf == CV_X_KV_B_K) {
        rc = grow((void **)&s->tmp, &s->tmp_cap, (size_t)(nrows * o->row_elems) * sizeof(float),
                  "values", err);
        if (rc) return rc;
        transpose_k(s->f32, nope, kv_lora, rin, nrows, s->tmp);
        *vals = s->tmp;
    }
    return rc;
}

/* The error of the sampled rows in this chunk: sum (x - deq(q(x)))^2 and sum x^2. */
typedef struct rmse_acc {
    double err2, ref2;
    uint64_t rows, next; /* sampled so far; index of the next sample */
} rmse_acc;

static uint64_t sample_row(uint64_t k, uint64_t n_samples, uint64_t rows) {
    return (2 * k + 1) * rows / (2 * n_samples);
}

static int measure(cv_stream *s, const cv_out *o, uint64_t r0, uint64_t nrows, const float *vals,
                   const uint8_t *q, rmse_acc *acc, em_err *err) {
    uint64_t n_samples = o->rows < (uint64_t)s->rmse_rows ? o->rows : (uint64_t)s->rmse_rows;
    int rc = grow((void **)&s->deq, &s->deq_cap, (size_t)o->row_elems * sizeof(float), "row", err);
    for (; !rc && acc->next < n_samples; acc->next++) {
        uint64_t r = sample_row(acc->next, n_samples, o->rows);
        if (r >= r0 + nrows) break;
        if (r < r0) continue;
        const float *x = vals + (r - r0) * o->row_elems;
        rc = em_dequantize(o->type, q + (r - r0) * o->row_bytes, s->deq, (int64_t)o->row_elems, err);
        for (uint64_t i = 0; !rc && i < o->row_elems; i++) {
            double d = (double)x[i] - (double)s->deq[i];
            acc->err2 += d * d;
            acc->ref2 += (double)x[i] * (double)x[i];
        }
        acc->rows++;
    }
    return rc;
}

static int check_cancel(const cv_stream *s, em_err *err) {
    if (s->opts->cancel && *s->opts->cancel) /* polled between chunks */
        return em_err_set(err, EM_EIO, "conversion interrupted; no output was written");
    return EM_OK;
}

static void report_progress(cv_stream *s, const char *tensor) {
    if (!s->opts->progress) return;
    s->prog.seconds = em_time_now() - s->t0;
    s->prog.tensor = tensor;
    s->opts->progress(s->opts->progress_user, &s->prog);
}

static int stream_d2t(cv_stream *s, const cv_out *o, const int64_t *dims, em_err *err) {
    const em_safetensors_tensor *t = o->parts[0];
    int64_t vocab = dims[CV_D_VOCAB];
    int rc = read_elems(s, t, 0, t->n_elements, err);
    int64_t *ids = rc ? NULL : em_malloc((size_t)t->n_elements * sizeof *ids, "d2t", err);
    uint8_t *seen = ids ? em_calloc((size_t)vocab / 8 + 1, 1, "d2t", err) : NULL;
    if (!seen) rc = rc ? rc : EM_ENOMEM;
    size_t es = em_st_dtype_size(t->dtype);
    bool is_signed = t->dtype == EM_ST_I64 || t->dtype == EM_ST_I32 || t->dtype == EM_ST_I16 ||
                     t->dtype == EM_ST_I8;
    for (uint64_t i = 0; !rc && i < t->n_elements; i++) {
        uint64_t raw = 0;
        memcpy(&raw, s->raw + i * es, es);
        int64_t off = (int64_t)raw;
        if (is_signed && es < 8 && (raw >> (es * 8 - 1)) & 1) off = (int64_t)(raw | (~0ull << (es * 8)));
        /* checkpoints store d2t as offsets: target = draft row + d2t[row] */
        int64_t id = (int64_t)i + off;
        if (id < 0 || id >= vocab)
            rc = em_err_set(err, EM_EFORMAT, "%s: tensor '%s' maps draft token %llu to %lld, "
                            "outside the target vocabulary [0, %lld)", t->path, t->name,
                            (unsigned long long)i, (long long)id, (long long)vocab);
        else if (seen[id / 8] & (1u << (id % 8)))
            rc = em_err_set(err, EM_EFORMAT, "%s: tensor '%s' maps two draft tokens to target "
                            "token %lld", t->path, t->name, (long long)id);
        else {
            seen[id / 8] |= (uint8_t)(1u << (id % 8));
            ids[i] = id;
        }
    }
    if (!rc) rc = em_gguf_writer_write_data(s->w, ids, t->n_elements * sizeof *ids, err);
    free(ids);
    free(seen);
    return rc;
}

/* Reads bytes [off, off + n) of source t into buf (at least n bytes). */
static int read_bytes(cv_stream *s, const em_safetensors_tensor *t, uint64_t off, uint64_t n,
                      uint8_t *buf, em_err *err) {
    if (off > t->n_bytes || n > t->n_bytes - off)
        return em_err_set(err, EM_EINVAL, "converter: read past tensor '%s'", t->name);
    int fd = source_fd(s, t, err);
    if (fd < 0) return fd;
    int rc = em_pread_full(fd, buf, (size_t)n, t->file_offset + off, t->path, err);
    if (rc) return em_err_prefix(err, "tensor '%s'", t->name);
    s->prog.bytes_done += n;
    return EM_OK;
}

/* compressed-tensors MXFP4 -> ggml block_mxfp4, losslessly: per block of 32 values of a row,
 * the E8M0 scale byte is copied as the block's exponent, and the 32 four-bit E2M1 codes
 * (source: sequential pairs, value 2i in the low nibble of byte i, 2i+1 in the high one) are
 * re-paired as ggml stores them (byte j = code j | code j+16 << 4). Both formats decode a code
 * c with scale byte e to E2M1(c) * 2^(e - 127) (ggml: doubled E2M1 values times 2^(e-127)/2),
 * so every value is unchanged. */
static void repack_mxfp4_rows(const uint8_t *packed, const uint8_t *scale, uint64_t rows,
                              uint64_t cols, uint8_t *out) {
    uint64_t blocks = cols / 32;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t b = 0; b < blocks; b++) {
            const uint8_t *src = packed + r * (cols / 2) + b * 16;
            uint8_t *dst = out + (r * blocks + b) * 17;
            uint8_t code[32];
            for (int i = 0; i < 16; i++) {
                code[2 * i] = src[i] & 0x0F;
                code[2 * i + 1] = src[i] >> 4;
            }
            dst[0] = scale[r * blocks + b];
            for (int j = 0; j < 16; j++) dst[1 + j] = (uint8_t)(code[j] | code[j + 16] << 4);
        }
}

static int stream_mxfp4(cv_stream *s, const cv_out *o, em_err *err) {
    uint64_t cols = o->row_elems, G = o->rows / ((uint64_t)o->n_parts / 2);
    uint64_t step = CHUNK_ELEMS / cols ? CHUNK_ELEMS / cols : 1;
    int rc = EM_OK;
    for (uint64_t r0 = 0; !rc && r0 < o->rows;) {
        uint64_t g = r0 / G, rin = r0 - g * G, end = (g + 1) * G;
        uint64_t r1 = r0 + step < end ? r0 + step : end, n = r1 - r0;
        const em_safetensors_tensor *pk = o->parts[2 * g], *sc = o->parts[2 * g + 1];
        rc = grow((void **)&s->raw, &s->raw_cap, (size_t)(n * (cols / 2 + cols / 32)), "source bytes", err);
        if (!rc) rc = grow((void **)&s->q, &s->q_cap, (size_t)(n * o->row_bytes), "output", err);
        if (!rc) rc = read_bytes(s, pk, rin * (cols / 2), n * (cols / 2), s->raw, err);
        if (!rc) rc = read_bytes(s, sc, rin * (cols / 32), n * (cols / 32), s->raw + n * (cols / 2), err);
        if (rc) break;
        repack_mxfp4_rows(s->raw, s->raw + n * (cols / 2), n, cols, s->q);
        rc = em_gguf_writer_write_data(s->w, s->q, n * o->row_bytes, err);
        if (!rc) rc = check_cancel(s, err);
        report_progress(s, o->name);
        r0 = r1;
    }
    return rc;
}

static int stream_tensor(cv_stream *s, const cv_out *o, const int64_t *dims, rmse_acc *acc,
                         em_err *err) {
    if (o->rule->xf == CV_X_D2T) return stream_d2t(s, o, dims, err);
    if (o->rule->xf == CV_X_MXFP4) return stream_mxfp4(s, o, err);
    uint64_t G = group_rows(o, dims);
    if (G == 0 || o->row_elems == 0)
        return em_err_set(err, EM_EFORMAT, "converter: tensor '%s' has an empty dimension", o->name);
    uint64_t step = CHUNK_ELEMS / o->row_elems ? CHUNK_ELEMS / o->row_elems : 1;
    if (o->rule->xf == CV_X_KV_B_K) step = G; /* the head block is read whole anyway */
    bool lossy = o->type != EM_TYPE_F32;
    int rc = EM_OK;
    for (uint64_t r0 = 0; !rc && r0 < o->rows;) {
        uint64_t end = (r0 / G + 1) * G, r1 = r0 + step < end ? r0 + step : end;
        const float *vals = NULL;
        rc = produce_rows(s, o, dims, r0, r1 - r0, &vals, err);
        if (!rc) rc = grow((void **)&s->q, &s->q_cap, (size_t)((r1 - r0) * o->row_bytes), "output", err);
        if (rc) break;
        chunk_job j = { .s = s, .in = vals, .q = s->q, .rows = r1 - r0, .row_elems = o->row_elems,
                        .row_bytes = o->row_bytes, .type = o->type };
        em_pool_run(s->pool, s->n_tasks, job_quantize, &j);
        if (j.failed) rc = em_err_set(err, EM_EINVAL, "converter: cannot encode '%s' as %s", o->name,
                                      em_type_name(o->type));
        if (!rc && lossy) rc = measure(s, o, r0, r1 - r0, vals, s->q, acc, err);
        if (!rc) rc = em_gguf_writer_write_data(s->w, s->q, (r1 - r0) * o->row_bytes, err);
        if (!rc) rc = check_cancel(s, err);
        report_progress(s, o->name);
        r0 = r1;
    }
    return rc;
}

/* ---- report ---------------------------------------------------------------------------- */

static int add_qstat(em_convert_report *rep, const cv_out *o, const rmse_acc *acc, em_err *err) {
    em_convert_qstat *q = realloc(rep->quant, (size_t)(rep->n_quant + 1) * sizeof *q);
    if (!q) return em_err_set(err, EM_ENOMEM, "converter: out of memory (report)");
    rep->quant = q;
    q = &rep->quant[rep->n_quant++];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", o->name);
    q->type = o->type;
    q->rows = acc->rows;
    q->rel_rmse = acc->ref2 > 0 ? sqrt(acc->err2 / acc->ref2) : (acc->err2 > 0 ? 1.0 : 0.0);
    return EM_OK;
}

static void finish_qstats(em_convert_report *rep) {
    double sum = 0;
    rep->worst = -1;
    for (int i = 0; i < rep->n_quant; i++) {
        sum += rep->quant[i].rel_rmse * rep->quant[i].rel_rmse;
        if (rep->worst < 0 || rep->quant[i].rel_rmse > rep->quant[rep->worst].rel_rmse) rep->worst = i;
    }
    rep->rmse_rms = rep->n_quant ? sqrt(sum / rep->n_quant) : 0;
}

static int file_size(const char *path, uint64_t *out, em_err *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return em_err_set(err, EM_EIO, "%s: cannot stat: %s", path, strerror(errno));
    *out = (uint64_t)sb.st_size;
    return EM_OK;
}

static bool cancelled(const em_convert_opts *o) { return o->cancel && *o->cancel; }

/* SHA-256 of a written shard, read back in 4 MiB steps so that a signal still stops it (the
 * files of a large model take a while to hash). */
static int hash_file(const char *path, const em_convert_opts *o, char hex[65], em_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_err_set(err, EM_EIO, "%s: cannot open: %s", path, strerror(errno));
    enum { STEP = 1 << 22 };
    uint8_t *buf = em_malloc(STEP, "hash buffer", err);
    em_sha256 *h = NULL;
    int rc = buf ? em_sha256_create(&h, err) : EM_ENOMEM;
    for (uint64_t off = 0; !rc;) {
        ssize_t n = pread(fd, buf, STEP, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = em_err_set(err, EM_EIO, "%s: read failed: %s", path, strerror(errno));
        if (n <= 0) break;
        em_sha256_update(h, buf, (size_t)n);
        off += (uint64_t)n;
        if (cancelled(o)) rc = em_err_set(err, EM_EIO, "conversion interrupted; no output was written");
    }
    if (!rc) {
        uint8_t digest[32];
        em_sha256_final(h, digest);
        em_sha256_hex(digest, hex);
    }
    em_sha256_free(h);
    free(buf);
    close(fd);
    return rc;
}

static int report_files(em_convert_report *rep, const em_safetensors *st, em_gguf_writer *w,
                        const em_convert_opts *o, em_err *err) {
    int rc = EM_OK;
    for (int i = 0; !rc && i < em_safetensors_shard_count(st); i++) {
        uint64_t n = 0;
        rc = file_size(em_safetensors_shard_path(st, i), &n, err);
        rep->src_bytes += n;
    }
    int ns = em_gguf_writer_n_shards(w);
    rep->shards = rc ? NULL : em_calloc((size_t)(ns > 0 ? ns : 1), sizeof *rep->shards, "report", err);
    if (!rc && !rep->shards) rc = EM_ENOMEM;
    for (int i = 0; !rc && i < ns; i++) {
        /* the report names the final file; the bytes are the staged one's */
        const char *staged = em_gguf_writer_shard_path(w, i);
        em_convert_shard *sh = &rep->shards[rep->n_shards++];
        sh->path = em_cv_final_path(o->out_path, staged, err);
        if (!sh->path) return EM_ENOMEM;
        rc = file_size(staged, &sh->bytes, err);
        if (!rc) rc = hash_file(staged, o, sh->sha256, err);
        rep->out_bytes += sh->bytes;
    }
    rep->ratio = rep->src_bytes ? (double)rep->out_bytes / (double)rep->src_bytes : 0;
    return rc;
}

/* ---- the conversion ---------------------------------------------------------------------- */

static int check_opts(const em_convert_opts *o, em_err *err) {
    if (!o->src_dir || !o->src_dir[0]) return em_err_set(err, EM_EINVAL, "convert: no source folder");
    if (!o->out_path || !o->out_path[0]) return em_err_set(err, EM_EINVAL, "convert: no output file");
    if (!em_convert_policy(o->type))
        return em_err_set(err, EM_EINVAL, "convert: type %s is not one of q8_0, bf16, f16, f32",
                          em_type_name(o->type));
    if (o->n_threads < 0 || o->n_threads > 1024)
        return em_err_set(err, EM_EINVAL, "convert: %d threads", o->n_threads);
    if (o->rmse_rows < 0) return em_err_set(err, EM_EINVAL, "convert: negative rmse_rows");
    return EM_OK;
}

static int declare_tensors(em_gguf_writer *w, const cv_plan *p, em_convert_report *rep, em_err *err) {
    int rc = EM_OK;
    for (int64_t i = 0; !rc && i < p->n_outs; i++) {
        const cv_out *o = &p->outs[i];
        rc = em_gguf_writer_add_tensor(w, o->name, o->type, o->n_dims, o->ne, err);
        rep->n_params += o->n_elem;
        rep->src_tensor_bytes += o->src_bytes;
        if (o->type >= 0 && o->type < EM_TYPE_COUNT) rep->type_counts[o->type]++;
    }
    rep->n_out_tensors = p->n_outs;
    return rc;
}

static int stream_all(cv_stream *s, const cv_plan *p, const int64_t *dims, em_convert_report *rep,
                      em_err *err) {
    int rc = EM_OK;
    for (int64_t i = 0; !rc && i < p->n_outs; i++) {
        const cv_out *o = &p->outs[i];
        rmse_acc acc = { 0 };
        rc = stream_tensor(s, o, dims, &acc, err);
        /* repacked MXFP4 is lossless: no error to measure */
        if (!rc && o->type != EM_TYPE_F32 && o->type != EM_TYPE_I64 && o->rule->xf != CV_X_MXFP4)
            rc = add_qstat(rep, o, &acc, err);
        s->prog.tensors_done++;
        report_progress(s, o->name);
    }
    return rc;
}

static int run_stream(const em_convert_opts *o, const em_safetensors *st, em_gguf_writer *w,
                      const cv_plan *p, const int64_t *dims, em_convert_report *rep, em_err *err) {
    cv_stream s = { .opts = o, .st = st, .w = w, .t0 = em_time_now() };
    s.rmse_rows = rep->rmse_rows;
    s.n_tasks = rep->n_threads;
    s.n_fds = em_safetensors_shard_count(st);
    s.fds = em_malloc((size_t)(s.n_fds > 0 ? s.n_fds : 1) * sizeof *s.fds, "file table", err);
    if (!s.fds) return EM_ENOMEM;
    for (int i = 0; i < s.n_fds; i++) s.fds[i] = -1;
    s.prog.tensors_total = p->n_outs;
    for (int64_t i = 0; i < p->n_outs; i++) s.prog.bytes_total += p->outs[i].src_bytes;
    int rc = em_pool_create(&s.pool, rep->n_threads, err);
    if (!rc) rc = stream_all(&s, p, dims, rep, err);
    if (!rc) rc = check_cancel(&s, err);
    if (!rc) rc = em_gguf_writer_finish(w, err);
    for (int i = 0; i < s.n_fds; i++)
        if (s.fds[i] >= 0) close(s.fds[i]);
    em_pool_free(s.pool);
    free(s.fds);
    free(s.raw);
    free(s.f32);
    free(s.tmp);
    free(s.q);
    free(s.deq);
    return rc;
}

static void report_setup(em_convert_report *rep, const em_convert_opts *o, const cv_arch *a,
                         const cv_model *m) {
    snprintf(rep->arch, sizeof rep->arch, "%s", a->name);
    snprintf(rep->mode, sizeof rep->mode, "%s", m->mode);
    snprintf(rep->layout, sizeof rep->layout, "%s", m->layout);
    snprintf(rep->markov, sizeof rep->markov, "%s", m->markov);
    snprintf(rep->src_dir, sizeof rep->src_dir, "%s", o->src_dir);
    snprintf(rep->note, sizeof rep->note, "%s", m->note);
    rep->n_src_tensors = (int64_t)em_safetensors_count(m->st);
}

/* Renames the staged files (and the report) into place: em_cv_commit with the writer's list. */
static int commit(const em_convert_opts *o, const em_safetensors *st, const em_gguf_writer *w,
                  em_convert_report *rep, em_err *err) {
    int ns = em_gguf_writer_n_shards(w);
    const char **staged = em_calloc((size_t)(ns > 0 ? ns : 1), sizeof *staged, "outputs", err);
    if (!staged) return EM_ENOMEM;
    for (int i = 0; i < ns; i++) staged[i] = em_gguf_writer_shard_path(w, i);
    int rc = em_cv_commit(o, st, staged, rep, err);
    free(staged);
    return rc;
}

static int convert_model(const em_convert_opts *o, em_hf_config *cfg, const char *cfg_path,
                         const em_safetensors *st, em_convert_report *rep, double t0,
                         em_err *err) {
    const cv_arch *a = NULL;
    int rc = em_cv_arch_for(cfg, cfg_path, &a, err);
    if (rc) return rc;
    char *stage = em_cv_stage_path(o->out_path, err);
    if (!stage) return EM_ENOMEM;
    cv_model *m = em_calloc(1, sizeof *m, "model description", err);
    if (!m) return EM_ENOMEM;
    m->cfg = cfg;
    m->st = st;
    m->cfg_path = cfg_path;
    m->dims[CV_D_ONE] = 1;
    m->file_type = -1;
    cv_plan plan = { 0 };
    em_gguf_writer *w = NULL;
    rc = a->setup(m, err);
    if (!rc) rc = plan_build(&plan, a, m, o->type, err);
    if (!rc) {
        report_setup(rep, o, a, m);
        rep->n_src_mapped = plan.n_used - plan.n_dropped;
        rep->n_src_dropped = plan.n_dropped;
        rep->n_src_skipped = plan.n_skipped;
        em_gguf_write_opts wo = { .max_shard_bytes = o->max_shard_bytes };
        rc = em_gguf_writer_create(&w, stage, &wo, err);
    }
    if (!rc) rc = write_metadata(w, a, m, o, m->dims[CV_D_VOCAB], rep, err);
    if (!rc) rc = declare_tensors(w, &plan, rep, err);
    if (!rc) rc = run_stream(o, st, w, &plan, m->dims, rep, err);
    bool written = !rc;
    if (!rc) rc = report_files(rep, st, w, o, err);
    if (!rc && cancelled(o)) /* a signal during the final fsync or rename */
        rc = em_err_set(err, EM_EIO, "conversion interrupted; no output was written");
    if (!rc) finish_qstats(rep);
    rep->seconds = em_time_now() - t0;
    if (!rc) rc = commit(o, st, w, rep, err);
    /* the staged files exist once finish succeeded; after a failure none may stay */
    for (int i = 0; rc && written && i < em_gguf_writer_n_shards(w); i++)
        unlink(em_gguf_writer_shard_path(w, i));
    em_gguf_writer_free(w);
    free(stage);
    plan_free(&plan);
    model_free(m);
    free(m);
    return rc;
}

int em_convert(const em_convert_opts *o, em_convert_report *rep, em_err *err) {
    memset(rep, 0, sizeof *rep);
    rep->worst = -1;
    int rc = check_opts(o, err);
    if (rc) return rc;
    double t0 = em_time_now();
    rep->type = o->type;
    rep->n_threads = o->n_threads ? o->n_threads : em_cpu_count();
    rep->rmse_rows = o->rmse_rows ? o->rmse_rows : EM_CONVERT_RMSE_ROWS;
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", o->src_dir);
    em_hf_config *cfg = em_calloc(1, sizeof *cfg, "config", err);
    if (!cfg) return EM_ENOMEM;
    em_safetensors *st = NULL;
    rc = em_hf_config_load(cfg, cfg_path, err);
    if (!rc) rc = em_safetensors_open(&st, o->src_dir, err);
    if (!rc) rc = em_cv_check_outputs(o, st, &o->out_path, 1, err);
    if (!rc) rc = convert_model(o, cfg, cfg_path, st, rep, t0, err);
    em_safetensors_close(st);
    free(cfg);
    if (!rep->seconds) rep->seconds = em_time_now() - t0;
    return rc;
}

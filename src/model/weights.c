/* model/weights.c: the one weight loader (weights.h says why it sits in model/). Owns the
 * checks every key and tensor passes before a model uses it, and the messages they fail with:
 * file and key, or file, tensor, shape found and shape wanted. Matrices are views into the
 * mapping (nothing copied) unless converted (em_wload_mat_float); vectors and conversions are
 * allocated from the caller's store. Every matrix and vector made passes the hook once, after
 * its checks.
 *
 * Must not: hand out a view whose bytes the tensor does not hold (the reader bounds each
 * tensor's bytes; the shape is checked against them here), read the data of a tensor marked
 * missing, or keep anything past the call (the loader holds no memory of its own). */
#include "model/weights.h"

#include <math.h>
#include <string.h>

void em_wload_init(em_wload *L, const em_gguf *g, em_arena *store, const em_wload_hook *hook) {
    *L = (em_wload){ .g = g, .path = em_gguf_path(g), .store = store };
    if (hook) L->hook = *hook;
}

/* ---- keys ------------------------------------------------------------------------------ */

const char *em_wload_akey(em_wload *L, const char *suffix) {
    if (L->arch) snprintf(L->key, sizeof L->key, "%s.%s", L->arch, suffix);
    else snprintf(L->key, sizeof L->key, "%s", suffix);
    return L->key;
}

/* A missing key: def (rc 0, *missing true) unless required. */
static int absent(const em_wload *L, const char *key, bool required, bool *missing, em_err *err) {
    *missing = true;
    return required ? em_err_set(err, EM_ENOTFOUND, "%s: key %s is missing", L->path, key) : EM_OK;
}

int em_wload_int(const em_wload *L, const char *key, bool required, int64_t def, int64_t lo, int64_t hi,
                 int *out, em_err *err) {
    int64_t v;
    bool missing = false;
    int rc = em_gguf_get_int(L->g, key, &v, err);
    if (rc == EM_ENOTFOUND) rc = absent(L, key, required, &missing, err);
    if (rc) return rc; /* the reader's message names the file and the key */
    if (missing) v = def;
    else if (v < lo || v > hi)
        return em_err_set(err, EM_EFORMAT, "%s: key %s = %lld is out of range [%lld, %lld]", L->path, key,
                          (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return EM_OK;
}

int em_wload_float(const em_wload *L, const char *key, bool required, double def, double *out, em_err *err) {
    double v;
    bool missing = false;
    int rc = em_gguf_get_float(L->g, key, &v, err);
    if (rc == EM_ENOTFOUND) rc = absent(L, key, required, &missing, err);
    if (rc) return rc;
    if (missing) v = def;
    else if (!isfinite(v) || fabs(v) > 1e30)
        return em_err_set(err, EM_EFORMAT, "%s: key %s = %g is not a usable number", L->path, key, v);
    *out = v;
    return EM_OK;
}

int em_wload_f32(const em_wload *L, const char *key, bool required, double def, float *out, em_err *err) {
    double v = 0.0; /* set on success; the initializer quiets -O3's maybe-uninitialized */
    int rc = em_wload_float(L, key, required, def, &v, err);
    if (!rc) *out = (float)v;
    return rc;
}

int em_wload_bool(const em_wload *L, const char *key, bool def, bool *out, em_err *err) {
    int rc = em_gguf_get_bool(L->g, key, out, err);
    if (rc != EM_ENOTFOUND) return rc;
    *out = def;
    return EM_OK;
}

int em_wload_str(const em_wload *L, const char *key, char *buf, size_t cap, em_err *err) {
    int rc = em_gguf_get_cstr(L->g, key, buf, cap, err);
    if (rc != EM_ENOTFOUND) return rc;
    buf[0] = 0;
    return EM_OK;
}

/* ---- tensors --------------------------------------------------------------------------- */

bool em_wload_has(const em_wload *L, const char *name) { return em_gguf_find_tensor(L->g, name) != NULL; }

static const char *shape_str(const int64_t *ne, int nd, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < nd && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static const char *tensor_shape(const em_gguf_tensor *t, char *buf, size_t cap) {
    return shape_str(t->ne, t->n_dims > 0 ? t->n_dims : 1, buf, cap);
}

static int find(const em_wload *L, const char *name, const em_gguf_tensor **out, em_err *err) {
    *out = em_gguf_find_tensor(L->g, name);
    return *out ? EM_OK : em_err_set(err, EM_ENOTFOUND, "%s: tensor %s is missing", L->path, name);
}

int em_wload_find_shaped(const em_wload *L, const char *name, int nd, const int64_t *ne,
                         const em_gguf_tensor **out, em_err *err) {
    const em_gguf_tensor *t;
    int rc = find(L, name, &t, err);
    if (rc) return rc;
    for (int i = 0; i < EM_GGUF_MAX_DIMS; i++)
        if (t->ne[i] != (i < nd ? ne[i] : 1)) {
            char want[96], got[96];
            return em_err_set(err, EM_EFORMAT, "%s: tensor %s has shape %s, want %s", L->path, name,
                              tensor_shape(t, got, sizeof got), shape_str(ne, nd, want, sizeof want));
        }
    *out = t;
    return EM_OK;
}

int em_wload_readable(const em_wload *L, const char *name, int type, em_err *err) {
    const em_type_info *ti = em_type_get(type);
    if (ti && ti->to_float) return EM_OK;
    return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor %s has type %s, which Ember cannot read", L->path, name,
                      em_type_name(type));
}

/* The hook, once per finished matrix. */
static int made(em_wload *L, const char *name, em_mat *m, em_err *err) {
    L->n_mats++;
    L->mat_bytes += m->row_bytes * (uint64_t)m->rows;
    int rc = L->hook.mat ? L->hook.mat(L->hook.ud, name, m, err) : EM_OK;
    return rc ? em_err_prefix(err, "%s: tensor %s", L->path, name) : EM_OK;
}

/* The view of a dot-kernel matrix, checked but not hooked. */
static int view(const em_wload *L, const char *name, int64_t cols, int64_t rows, int64_t extra, em_mat *m,
                em_err *err) {
    const int64_t ne[3] = { cols, rows, extra };
    const em_gguf_tensor *t = NULL;
    int rc = em_wload_find_shaped(L, name, extra > 1 ? 3 : 2, ne, &t, err);
    if (rc) return rc;
    int blk = em_dot_block_elems(t->type);
    if (blk == 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor %s has type %s, which Ember cannot multiply with",
                          L->path, name, em_type_name(t->type));
    if (cols % blk != 0)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s: %lld columns are not a multiple of the %s block (%d)",
                          L->path, name, (long long)cols, em_type_name(t->type), blk);
    rc = em_mat_init(m, t->type, rows * extra, cols, t->data, err);
    if (rc) return em_err_prefix(err, "%s: tensor %s", L->path, name);
    if (m->row_bytes * (uint64_t)m->rows != t->bytes)
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s holds %llu bytes, its shape needs %llu", L->path, name,
                          (unsigned long long)t->bytes, (unsigned long long)(m->row_bytes * (uint64_t)m->rows));
    return EM_OK;
}

/* The packed copy em_wload_init describes, when L packs and m qualifies. */
static int pack(em_wload *L, const char *name, int64_t extra, em_mat *m, em_err *err) {
    if (extra != 1 || !strcmp(name, "token_embd.weight") || !em_mat_packable(m)) return EM_OK;
    const uint64_t bytes = em_mat_packed_bytes(m);
    if (L->packed_bytes + bytes > L->pack_budget) return EM_OK;
    void *dst = bytes <= SIZE_MAX ? em_arena_alloc(L->store, (size_t)bytes) : NULL;
    if (!dst) return em_err_set(err, EM_ENOMEM, "%s: out of memory packing tensor %s (%llu bytes)", L->path, name,
                                (unsigned long long)bytes);
    em_mat_pack(m, dst);
    L->packed_bytes += bytes;
    return EM_OK;
}

int em_wload_mat(em_wload *L, const char *name, int64_t cols, int64_t rows, int64_t extra, em_mat *m,
                 em_err *err) {
    int rc = view(L, name, cols, rows, extra, m, err);
    if (!rc) rc = pack(L, name, extra, m, err);
    return rc ? rc : made(L, name, m, err);
}

int em_wload_mat_float(em_wload *L, const char *name, int64_t cols, int64_t rows, em_mat *m, em_err *err) {
    int rc = view(L, name, cols, rows, 1, m, err);
    if (rc) return rc;
    const bool is_float = m->type == EM_TYPE_F32 || m->type == EM_TYPE_F16 || m->type == EM_TYPE_BF16;
    if (!is_float && m->data) { /* no data: a file cut short, on which nothing runs */
        uint64_t count = (uint64_t)m->rows * (uint64_t)m->cols;
        float *dst = em_arena_alloc(L->store, count * sizeof(float));
        if (!dst) return em_err_set(err, EM_ENOMEM, "%s: out of memory converting tensor %s to f32", L->path, name);
        if ((rc = em_dequantize(m->type, m->data, dst, (int64_t)count, err)) ||
            (rc = em_mat_init(m, EM_TYPE_F32, m->rows, m->cols, dst, err)))
            return em_err_prefix(err, "%s: tensor %s", L->path, name);
    }
    return made(L, name, m, err);
}

int em_wload_vec(em_wload *L, const char *name, int64_t n, int64_t lead, const float **out, em_err *err) {
    const em_gguf_tensor *t;
    int rc = find(L, name, &t, err);
    if (rc) return rc;
    int big = 0;
    for (int i = 0; i < EM_GGUF_MAX_DIMS; i++) big += t->ne[i] != 1;
    if (t->n_elements != (uint64_t)n || (lead > 0 ? t->ne[0] != lead : big > 1)) {
        char got[96], how[64] = " in one dimension";
        if (lead > 0) snprintf(how, sizeof how, " with ne[0] = %lld", (long long)lead);
        return em_err_set(err, EM_EFORMAT, "%s: tensor %s has shape %s (%llu values), want %lld values%s", L->path,
                          name, tensor_shape(t, got, sizeof got), (unsigned long long)t->n_elements, (long long)n, how);
    }
    if ((rc = em_wload_readable(L, name, t->type, err))) return rc;
    float *dst = em_arena_alloc(L->store, (size_t)n * sizeof(float));
    if (!dst) return em_err_set(err, EM_ENOMEM, "%s: out of memory loading tensor %s", L->path, name);
    if (t->missing) memset(dst, 0, (size_t)n * sizeof(float));
    else if ((rc = em_dequantize(t->type, t->data, dst, n, err)))
        return em_err_prefix(err, "%s: tensor %s", L->path, name);
    L->n_vecs++;
    if (L->hook.vec && (rc = L->hook.vec(L->hook.ud, name, dst, n, err)))
        return em_err_prefix(err, "%s: tensor %s", L->path, name);
    *out = dst;
    return EM_OK;
}

int em_wload_vec_opt(em_wload *L, const char *name, int64_t n, const float **out, em_err *err) {
    *out = NULL;
    return em_wload_has(L, name) ? em_wload_vec(L, name, n, 0, out, err) : EM_OK;
}

/* format/gguf_write.c: the GGUF writer and array builders (gguf.h's writing half).
 *
 * A model is written in two phases. Declaring: metadata is serialized as it is set and
 * tensors are declared (name, type, shape). Writing: at the first data (or at finish) the
 * shard plan and every offset are fixed, the header of shard 0 is written, and tensor data
 * streams through in declaration order; each shard's header is written when its first
 * tensor comes up. Memory holds only the headers and a 1 MiB output buffer.
 *
 * Invariants: output bytes depend only on the calls made (no time, no addresses, padding
 * is zeros), so equal inputs give identical files. Files are created as temporaries next to
 * their final names and renamed only after every byte is written and fsynced; until then
 * (and on any failure) em_gguf_writer_free removes them. The layout matches ggml's writer:
 * header, keys, tensor infos, zero padding to the alignment, then each tensor's data padded
 * to the alignment (the last one too). Data skipped with em_gguf_writer_skip_data is a hole
 * (lseek past it; the shard is extended with ftruncate at close): the same file as if zeros
 * had been written, without the disk space. */
#include "format/gguf_impl.h"

#include "quant/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- growable byte buffers ----------------------------------------------------------- */

typedef struct bytebuf {
    uint8_t *p;
    size_t len, cap;
} bytebuf;

static int bb_put(bytebuf *b, const void *src, uint64_t n, em_err *err) {
    uint64_t need;
    if (em_add_overflow(b->len, n, &need) || need > SIZE_MAX / 2)
        return em_err_set(err, EM_EOVERFLOW, "GGUF writer: metadata larger than memory");
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return em_err_set(err, EM_ENOMEM, "GGUF writer: out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, (size_t)n);
    b->len = (size_t)need;
    return EM_OK;
}

static int bb_u32(bytebuf *b, uint32_t v, em_err *err) { return bb_put(b, &v, 4, err); }
static int bb_u64(bytebuf *b, uint64_t v, em_err *err) { return bb_put(b, &v, 8, err); }

static int bb_str(bytebuf *b, const char *s, uint64_t len, em_err *err) {
    int rc = bb_u64(b, len, err);
    return rc ? rc : bb_put(b, s, len, err);
}

static int bb_zeros(bytebuf *b, uint64_t n, em_err *err) {
    static const uint8_t zeros[64];
    int rc = EM_OK;
    while (n && !rc) {
        uint64_t k = n < sizeof zeros ? n : sizeof zeros;
        rc = bb_put(b, zeros, k, err);
        n -= k;
    }
    return rc;
}

/* One element of a fixed-size type from its C value (bool stored as 0/1). */
static int bb_fixed(bytebuf *b, int type, const void *elem, em_err *err) {
    if (type == EM_GGUF_BOOL) {
        uint8_t v = *(const bool *)elem ? 1 : 0;
        return bb_put(b, &v, 1, err);
    }
    return bb_put(b, elem, (uint64_t)em_gguf_type_size(type), err);
}

/* ---- array builders ------------------------------------------------------------------ */

struct em_gguf_abuf {
    int elem_type;
    int levels; /* 1 for an array of scalars or strings, 1 + the deepest element otherwise */
    uint64_t count;
    bytebuf elems;
};

int em_gguf_abuf_create(em_gguf_abuf **out, int elem_type, em_err *err) {
    *out = NULL;
    if (elem_type < 0 || elem_type >= EM_GGUF_TYPE_COUNT)
        return em_err_set(err, EM_EINVAL, "GGUF array: unknown element type %d", elem_type);
    em_gguf_abuf *a = em_calloc(1, sizeof *a, "GGUF array", err);
    if (!a) return EM_ENOMEM;
    a->elem_type = elem_type;
    a->levels = 1;
    *out = a;
    return EM_OK;
}

void em_gguf_abuf_free(em_gguf_abuf *a) {
    if (!a) return;
    free(a->elems.p);
    free(a);
}

static int abuf_expect(const em_gguf_abuf *a, bool ok, const char *what, em_err *err) {
    if (ok) return EM_OK;
    return em_err_set(err, EM_EINVAL, "GGUF array of %s: cannot append %s",
                      em_gguf_type_name(a->elem_type), what);
}

int em_gguf_abuf_push(em_gguf_abuf *a, const void *elem, em_err *err) {
    int rc = abuf_expect(a, em_gguf_type_size(a->elem_type) > 0, "a fixed-size value", err);
    if (!rc) rc = bb_fixed(&a->elems, a->elem_type, elem, err);
    if (!rc) a->count++;
    return rc;
}

int em_gguf_abuf_push_str(em_gguf_abuf *a, const char *s, uint64_t len, em_err *err) {
    int rc = abuf_expect(a, a->elem_type == EM_GGUF_STR, "a string", err);
    if (!rc) rc = bb_str(&a->elems, s, len, err);
    if (!rc) a->count++;
    return rc;
}

int em_gguf_abuf_push_arr(em_gguf_abuf *a, const em_gguf_abuf *sub, em_err *err) {
    int rc = abuf_expect(a, a->elem_type == EM_GGUF_ARRAY, "an array", err);
    if (rc) return rc;
    if (sub->levels + 1 > EM_GGUF_MAX_DEPTH)
        return em_err_set(err, EM_EINVAL, "GGUF array: more than %d levels of nesting",
                          EM_GGUF_MAX_DEPTH);
    size_t mark = a->elems.len;
    if ((rc = bb_u32(&a->elems, (uint32_t)sub->elem_type, err)) ||
        (rc = bb_u64(&a->elems, sub->count, err)) ||
        (rc = bb_put(&a->elems, sub->elems.p, sub->elems.len, err))) {
        a->elems.len = mark;
        return rc;
    }
    a->count++;
    if (sub->levels + 1 > a->levels) a->levels = sub->levels + 1;
    return EM_OK;
}

/* ---- the writer ---------------------------------------------------------------------- */

typedef struct wkv {
    char *key;
    bytebuf val; /* value type (u32) and value, as in the file */
} wkv;

typedef struct wtensor {
    char *name;
    int type;
    int n_dims;
    int64_t ne[EM_GGUF_MAX_DIMS];
    uint64_t bytes;
    int shard;
    uint64_t offset; /* in its shard's data section */
} wtensor;

typedef struct wshard {
    char *path;     /* final name */
    char *tmp;      /* temporary name, once created */
    bool renamed;
    int64_t first;  /* its tensors: first .. first + count - 1 */
    int64_t count;
} wshard;

enum { W_DECLARING, W_WRITING, W_FINISHED, W_FAILED };

#define OUT_BUF_BYTES (1u << 20)

struct em_gguf_writer {
    char *path;
    uint64_t max_shard_bytes;
    int state;
    uint32_t alignment;
    int64_t alignment_kv; /* index of general.alignment in kv, or -1 */

    wkv *kv;
    int64_t n_kv, cap_kv;
    em_gguf_ix kv_ix;

    wtensor *tensors;
    int64_t n_tensors, cap_tensors;
    em_gguf_ix tensor_ix;
    uint64_t total_bytes; /* tensor bytes, each rounded up to 2^31 (a bound on padding) */

    wshard *shards;
    int n_shards;

    /* streaming state */
    int cur_shard;     /* open shard, -1 when none */
    int fd;
    uint64_t pos;      /* bytes written to the open shard (buffered ones included) */
    int64_t cur;       /* tensor whose data comes next */
    uint64_t cur_done; /* bytes of it already written */
    uint8_t *buf;
    size_t buf_len;
};

int em_gguf_writer_create(em_gguf_writer **out, const char *path, const em_gguf_write_opts *opts,
                          em_err *err) {
    *out = NULL;
    em_gguf_writer *w = em_calloc(1, sizeof *w, "GGUF writer", err);
    if (!w) return EM_ENOMEM;
    w->path = em_strdup(path, err);
    if (!w->path) {
        free(w);
        return EM_ENOMEM;
    }
    w->max_shard_bytes = opts ? opts->max_shard_bytes : 0;
    w->alignment = EM_GGUF_DEFAULT_ALIGNMENT;
    w->alignment_kv = -1;
    w->cur_shard = -1;
    w->fd = -1;
    *out = w;
    return EM_OK;
}

static void remove_files(em_gguf_writer *w) {
    for (int i = 0; i < w->n_shards; i++) {
        wshard *s = &w->shards[i];
        if (s->renamed) unlink(s->path);
        else if (s->tmp) unlink(s->tmp);
    }
}

void em_gguf_writer_free(em_gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->state != W_FINISHED) remove_files(w);
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val.p);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    for (int i = 0; i < w->n_shards; i++) {
        free(w->shards[i].path);
        free(w->shards[i].tmp);
    }
    em_gguf_ix_free(&w->kv_ix);
    em_gguf_ix_free(&w->tensor_ix);
    free(w->kv);
    free(w->tensors);
    free(w->shards);
    free(w->buf);
    free(w->path);
    free(w);
}

static int check_declaring(const em_gguf_writer *w, const char *what, em_err *err) {
    if (w->state == W_DECLARING) return EM_OK;
    return em_err_set(err, EM_EINVAL, "%s: cannot %s after tensor data has been written", w->path,
                      what);
}

static int fail_state(em_gguf_writer *w, int rc) {
    w->state = W_FAILED;
    return rc;
}

/* ---- metadata ------------------------------------------------------------------------ */

/* Adds key with its serialized value (ownership of val moves in, even on failure). */
static int add_kv(em_gguf_writer *w, const char *key, bytebuf *val, em_err *err) {
    int rc = check_declaring(w, "set metadata", err);
    if (!rc && !key[0]) rc = em_err_set(err, EM_EINVAL, "%s: empty metadata key", w->path);
    if (!rc && !strncmp(key, "split.", 6))
        rc = em_err_set(err, EM_EINVAL, "%s: key '%s': split.* keys are written by the writer",
                        w->path, key);
    if (!rc && !strcmp(key, EM_GGUF_KEY_ALIGNMENT)) {
        uint32_t type, a = 0;
        memcpy(&type, val->p, 4);
        if (type == EM_GGUF_U32) memcpy(&a, val->p + 4, 4);
        if (type != EM_GGUF_U32 || a == 0 || (a & (a - 1)))
            rc = em_err_set(err, EM_EINVAL, "%s: key '%s' must be a u32 power of two", w->path, key);
    }
    if (!rc && w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        wkv *kv = realloc(w->kv, (size_t)cap * sizeof *kv);
        if (!kv) rc = em_err_set(err, EM_ENOMEM, "%s: out of memory for metadata", w->path);
        else {
            w->kv = kv;
            w->cap_kv = cap;
        }
    }
    char *copy = rc ? NULL : em_strdup(key, err);
    if (!rc && !copy) rc = EM_ENOMEM;
    int64_t dup = -1;
    if (!rc) rc = em_gguf_ix_insert(&w->kv_ix, copy, strlen(copy), w->n_kv, &dup, err);
    if (!rc && dup >= 0) rc = em_err_set(err, EM_EINVAL, "%s: key '%s' set twice", w->path, key);
    if (rc) {
        free(copy);
        free(val->p);
        return rc;
    }
    if (!strcmp(key, EM_GGUF_KEY_ALIGNMENT)) {
        memcpy(&w->alignment, val->p + 4, 4);
        w->alignment_kv = w->n_kv;
    }
    w->kv[w->n_kv++] = (wkv){ copy, *val };
    return EM_OK;
}

/* Adds the value built in b under key, or frees it when building it failed (rc). */
static int add_built(em_gguf_writer *w, const char *key, bytebuf *b, int rc, em_err *err) {
    if (rc) {
        free(b->p);
        return rc;
    }
    return add_kv(w, key, b, err);
}

static int set_fixed(em_gguf_writer *w, const char *key, int type, const void *v, em_err *err) {
    bytebuf b = { 0 };
    int rc = bb_u32(&b, (uint32_t)type, err);
    if (!rc) rc = bb_fixed(&b, type, v, err);
    return add_built(w, key, &b, rc, err);
}

#define DEFINE_SETTER(suffix, ctype, TYPE, field)                                                  \
    int em_gguf_writer_set_##suffix(em_gguf_writer *w, const char *key, ctype v, em_err *err) {    \
        return set_fixed(w, key, TYPE, &v, err);                                                   \
    }

EM_GGUF_FIXED_TYPES(DEFINE_SETTER)

int em_gguf_writer_set_strn(em_gguf_writer *w, const char *key, const char *s, uint64_t len,
                            em_err *err) {
    bytebuf b = { 0 };
    int rc = bb_u32(&b, EM_GGUF_STR, err);
    if (!rc) rc = bb_str(&b, s, len, err);
    return add_built(w, key, &b, rc, err);
}

int em_gguf_writer_set_str(em_gguf_writer *w, const char *key, const char *s, em_err *err) {
    return em_gguf_writer_set_strn(w, key, s, strlen(s), err);
}

/* ARRAY tag, element type and count: the start of every array value. */
static int bb_array_head(bytebuf *b, int elem_type, uint64_t n, em_err *err) {
    int rc = bb_u32(b, EM_GGUF_ARRAY, err);
    if (!rc) rc = bb_u32(b, (uint32_t)elem_type, err);
    if (!rc) rc = bb_u64(b, n, err);
    return rc;
}

int em_gguf_writer_set_arr(em_gguf_writer *w, const char *key, int elem_type, const void *elems,
                           uint64_t n, em_err *err) {
    int size = em_gguf_type_size(elem_type);
    if (size == 0)
        return em_err_set(err, EM_EINVAL, "%s: key '%s': set_arr takes fixed-size types, not %s",
                          w->path, key, em_gguf_type_name(elem_type));
    uint64_t bytes;
    if (em_mul_overflow(n, (uint64_t)size, &bytes))
        return em_err_set(err, EM_EOVERFLOW, "%s: key '%s': array too large", w->path, key);
    bytebuf b = { 0 };
    int rc = bb_array_head(&b, elem_type, n, err);
    if (!rc && elem_type == EM_GGUF_BOOL) {
        for (uint64_t i = 0; i < n && !rc; i++) rc = bb_fixed(&b, elem_type, (const bool *)elems + i, err);
    } else if (!rc) {
        rc = bb_put(&b, elems, bytes, err);
    }
    return add_built(w, key, &b, rc, err);
}

int em_gguf_writer_set_arr_str(em_gguf_writer *w, const char *key, const char *const *strs,
                               uint64_t n, em_err *err) {
    bytebuf b = { 0 };
    int rc = bb_array_head(&b, EM_GGUF_STR, n, err);
    for (uint64_t i = 0; i < n && !rc; i++) rc = bb_str(&b, strs[i], strlen(strs[i]), err);
    return add_built(w, key, &b, rc, err);
}

int em_gguf_writer_set_abuf(em_gguf_writer *w, const char *key, const em_gguf_abuf *a,
                            em_err *err) {
    bytebuf b = { 0 };
    int rc = bb_array_head(&b, a->elem_type, a->count, err);
    if (!rc) rc = bb_put(&b, a->elems.p, a->elems.len, err);
    return add_built(w, key, &b, rc, err);
}

int em_gguf_writer_set_value(em_gguf_writer *w, const char *key, const em_gguf_value *v,
                             em_err *err) {
    switch (v->type) {
#define SET_CASE(suffix, ctype, TYPE, field) \
    case TYPE: return em_gguf_writer_set_##suffix(w, key, (ctype)v->field, err);
    EM_GGUF_FIXED_TYPES(SET_CASE)
#undef SET_CASE
    case EM_GGUF_STR: return em_gguf_writer_set_strn(w, key, v->str.ptr, v->str.len, err);
    case EM_GGUF_ARRAY: {
        /* the reader kept the array's bytes (element type onwards): copy them as they are */
        bytebuf b = { 0 };
        int rc = bb_u32(&b, EM_GGUF_ARRAY, err);
        if (!rc) rc = bb_put(&b, v->arr->raw, v->arr->raw_len, err);
        return add_built(w, key, &b, rc, err);
    }
    default:
        return em_err_set(err, EM_EINVAL, "%s: key '%s': unknown value type %d", w->path, key,
                          v->type);
    }
}

/* ---- tensors ------------------------------------------------------------------------- */

static int tensor_size(const em_gguf_writer *w, const char *name, int type, int n_dims,
                       const int64_t *ne, wtensor *t, em_err *err) {
    const em_type_info *ti = type >= 0 && type < EM_TYPE_COUNT ? em_type_get(type) : NULL;
    if (!ti || ti->block_elems <= 0 || ti->block_bytes <= 0)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor '%s': unknown tensor type %d", w->path,
                          name, type);
    if (n_dims < 0 || n_dims > EM_GGUF_MAX_DIMS)
        return em_err_set(err, EM_EINVAL, "%s: tensor '%s': %d dimensions (0..%d allowed)", w->path,
                          name, n_dims, EM_GGUF_MAX_DIMS);
    uint64_t n = 1;
    for (int j = 0; j < EM_GGUF_MAX_DIMS; j++) {
        t->ne[j] = j < n_dims ? ne[j] : 1;
        if (t->ne[j] < 0)
            return em_err_set(err, EM_EINVAL, "%s: tensor '%s': dimension %d is negative (%lld)",
                              w->path, name, j, (long long)t->ne[j]);
        if (em_mul_overflow(n, (uint64_t)t->ne[j], &n) || n > (uint64_t)INT64_MAX)
            return em_err_set(err, EM_EOVERFLOW, "%s: tensor '%s': too many elements", w->path, name);
    }
    if (t->ne[0] % ti->block_elems)
        return em_err_set(err, EM_EINVAL,
                          "%s: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %d",
                          w->path, name, (long long)t->ne[0], ti->name, ti->block_elems);
    uint64_t bytes = (uint64_t)(t->ne[0] / ti->block_elems);
    bool over = em_mul_overflow(bytes, (uint64_t)ti->block_bytes, &bytes);
    for (int j = 1; j < EM_GGUF_MAX_DIMS && !over; j++)
        over = em_mul_overflow(bytes, (uint64_t)t->ne[j], &bytes);
    if (over || bytes > UINT64_MAX / 2)
        return em_err_set(err, EM_EOVERFLOW, "%s: tensor '%s': size overflows", w->path, name);
    t->type = type;
    t->n_dims = n_dims;
    t->bytes = bytes;
    return EM_OK;
}

int em_gguf_writer_add_tensor(em_gguf_writer *w, const char *name, int type, int n_dims,
                              const int64_t *ne, em_err *err) {
    int rc = check_declaring(w, "declare tensors", err);
    if (rc) return rc;
    size_t len = strlen(name);
    if (len == 0 || len > EM_GGUF_MAX_NAME)
        return em_err_set(err, EM_EINVAL, "%s: tensor name '%s' must have 1 to %d bytes", w->path,
                          name, EM_GGUF_MAX_NAME);
    wtensor t = { 0 };
    if ((rc = tensor_size(w, name, type, n_dims, ne, &t, err))) return rc;
    /* keeps every sum of sizes and offsets the plan makes far from overflowing */
    uint64_t total;
    if (em_add_overflow(w->total_bytes, em_align_up(t.bytes, 1u << 31), &total) ||
        total > UINT64_MAX / 4)
        return em_err_set(err, EM_EOVERFLOW, "%s: tensor '%s': the model is too large", w->path, name);
    if (em_gguf_ix_find(&w->tensor_ix, name, len) >= 0)
        return em_err_set(err, EM_EINVAL, "%s: tensor '%s' declared twice", w->path, name);
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        wtensor *p = realloc(w->tensors, (size_t)cap * sizeof *p);
        if (!p) return em_err_set(err, EM_ENOMEM, "%s: out of memory for tensors", w->path);
        w->tensors = p;
        w->cap_tensors = cap;
    }
    if (!(t.name = em_strdup(name, err))) return EM_ENOMEM;
    int64_t dup;
    if ((rc = em_gguf_ix_insert(&w->tensor_ix, t.name, len, w->n_tensors, &dup, err))) {
        free(t.name);
        return rc;
    }
    w->tensors[w->n_tensors++] = t;
    w->total_bytes = total;
    return EM_OK;
}

/* ---- shard plan and headers ------------------------------------------------------------ */

static uint64_t kv_bytes(const wkv *kv) { return 8 + strlen(kv->key) + kv->val.len; }

static uint64_t info_bytes(const wtensor *t) {
    return 8 + strlen(t->name) + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
}

/* split.no (u16), split.count (u16), split.tensors.count (i32) */
static uint64_t split_kv_bytes(void) {
    return (8 + strlen(EM_GGUF_KEY_SPLIT_NO) + 4 + 2) + (8 + strlen(EM_GGUF_KEY_SPLIT_COUNT) + 4 + 2) +
           (8 + strlen(EM_GGUF_KEY_SPLIT_TENSORS) + 4 + 4);
}

/* Header bytes of shard 0 and of any other shard before their tensor infos. */
static void header_base(const em_gguf_writer *w, uint64_t *first, uint64_t *other) {
    uint64_t meta = EM_GGUF_HEADER_BYTES;
    for (int64_t i = 0; i < w->n_kv; i++) meta += kv_bytes(&w->kv[i]);
    *first = meta + split_kv_bytes();
    *other = EM_GGUF_HEADER_BYTES + split_kv_bytes() +
             (w->alignment_kv >= 0 ? kv_bytes(&w->kv[w->alignment_kv]) : 0);
}

/* Assigns each tensor a shard (greedy, in order, keeping whole files within the budget)
 * and its offset in that shard's data section; returns the shard count. */
static int64_t plan_shards(em_gguf_writer *w) {
    uint64_t a = w->alignment, base0, base_k, header = 0, data = 0;
    header_base(w, &base0, &base_k);
    int64_t shard = 0, in_shard = 0;
    header = base0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        uint64_t padded = em_align_up(t->bytes, a), info = info_bytes(t);
        uint64_t size = em_align_up(header + info, a) + data + padded;
        if (w->max_shard_bytes && in_shard > 0 && size > w->max_shard_bytes) {
            shard++;
            in_shard = 0;
            header = base_k;
            data = 0;
        }
        t->shard = (int)(shard < INT32_MAX ? shard : INT32_MAX);
        t->offset = data;
        header += info;
        data += padded;
        in_shard++;
    }
    return shard + 1;
}

static int make_shards(em_gguf_writer *w, em_err *err) {
    int64_t n = plan_shards(w);
    if (n > 1 && (n > 65535 || w->n_tensors > INT32_MAX))
        return em_err_set(err, EM_EOVERFLOW,
                          "%s: %lld shards of %lld tensors: more than split.count (u16) and "
                          "split.tensors.count (i32) can hold",
                          w->path, (long long)n, (long long)w->n_tensors);
    w->shards = em_calloc((size_t)n, sizeof *w->shards, "GGUF shards", err);
    if (!w->shards) return EM_ENOMEM;
    w->n_shards = (int)n;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        wshard *s = &w->shards[w->tensors[i].shard];
        if (s->count++ == 0) s->first = i;
    }
    size_t len = strlen(w->path);
    if (n == 1) {
        w->shards[0].path = em_strdup(w->path, err);
        return w->shards[0].path ? EM_OK : EM_ENOMEM;
    }
    if (len >= 5 && !strcmp(w->path + len - 5, ".gguf")) len -= 5;
    for (int i = 0; i < w->n_shards; i++) {
        size_t cap = len + 32;
        char *p = em_malloc(cap, "shard path", err);
        if (!p) return EM_ENOMEM;
        snprintf(p, cap, "%.*s-%05d-of-%05d.gguf", (int)len, w->path, i + 1, w->n_shards);
        w->shards[i].path = p;
    }
    return EM_OK;
}

static int bb_kv_u16(bytebuf *b, const char *key, uint16_t v, em_err *err) {
    int rc = bb_str(b, key, strlen(key), err);
    if (!rc) rc = bb_u32(b, EM_GGUF_U16, err);
    if (!rc) rc = bb_put(b, &v, 2, err);
    return rc;
}

static int bb_kv(bytebuf *b, const wkv *kv, em_err *err) {
    int rc = bb_str(b, kv->key, strlen(kv->key), err);
    return rc ? rc : bb_put(b, kv->val.p, kv->val.len, err);
}

static int build_header(const em_gguf_writer *w, int s, bytebuf *b, em_err *err) {
    const wshard *sh = &w->shards[s];
    bool split = w->n_shards > 1;
    uint64_t n_kv = (s == 0 ? (uint64_t)w->n_kv : (w->alignment_kv >= 0)) + (split ? 3 : 0);
    int rc = bb_put(b, EM_GGUF_MAGIC, 4, err);
    if (!rc) rc = bb_u32(b, EM_GGUF_VERSION, err);
    if (!rc) rc = bb_u64(b, (uint64_t)sh->count, err);
    if (!rc) rc = bb_u64(b, n_kv, err);
    for (int64_t i = 0; s == 0 && i < w->n_kv && !rc; i++) rc = bb_kv(b, &w->kv[i], err);
    if (split && !rc) {
        int32_t total = (int32_t)w->n_tensors;
        if (!rc) rc = bb_kv_u16(b, EM_GGUF_KEY_SPLIT_NO, (uint16_t)s, err);
        if (!rc) rc = bb_kv_u16(b, EM_GGUF_KEY_SPLIT_COUNT, (uint16_t)w->n_shards, err);
        if (!rc) rc = bb_str(b, EM_GGUF_KEY_SPLIT_TENSORS, strlen(EM_GGUF_KEY_SPLIT_TENSORS), err);
        if (!rc) rc = bb_u32(b, EM_GGUF_I32, err);
        if (!rc) rc = bb_put(b, &total, 4, err);
    }
    if (s > 0 && w->alignment_kv >= 0 && !rc) rc = bb_kv(b, &w->kv[w->alignment_kv], err);
    for (int64_t i = sh->first; i < sh->first + sh->count && !rc; i++) {
        const wtensor *t = &w->tensors[i];
        rc = bb_str(b, t->name, strlen(t->name), err);
        if (!rc) rc = bb_u32(b, (uint32_t)t->n_dims, err);
        for (int j = 0; j < t->n_dims && !rc; j++) rc = bb_u64(b, (uint64_t)t->ne[j], err);
        if (!rc) rc = bb_u32(b, (uint32_t)t->type, err);
        if (!rc) rc = bb_u64(b, t->offset, err);
    }
    if (!rc) rc = bb_zeros(b, em_align_up(b->len, w->alignment) - b->len, err);
    return rc;
}

/* ---- output -------------------------------------------------------------------------- */

static const char *open_path(const em_gguf_writer *w) {
    return w->cur_shard >= 0 ? w->shards[w->cur_shard].tmp : w->path;
}

static int flush_buf(em_gguf_writer *w, em_err *err) {
    if (!w->buf_len) return EM_OK;
    int rc = em_write_full(w->fd, w->buf, w->buf_len, open_path(w), err);
    w->buf_len = 0;
    return rc;
}

static int out_write(em_gguf_writer *w, const void *p, uint64_t n, em_err *err) {
    int rc = EM_OK;
    w->pos += n;
    if (n >= OUT_BUF_BYTES / 2) {
        if (!(rc = flush_buf(w, err))) {
            /* large pieces go straight out, in chunks the kernel accepts */
            const uint8_t *q = p;
            while (n && !rc) {
                size_t k = n < (1u << 30) ? (size_t)n : (1u << 30);
                rc = em_write_full(w->fd, q, k, open_path(w), err);
                q += k;
                n -= k;
            }
        }
        return rc;
    }
    if (w->buf_len + n > OUT_BUF_BYTES) rc = flush_buf(w, err);
    if (!rc) {
        memcpy(w->buf + w->buf_len, p, (size_t)n);
        w->buf_len += (size_t)n;
    }
    return rc;
}

/* Moves the open shard's position n bytes on without writing them (a hole). */
static int out_skip(em_gguf_writer *w, uint64_t n, em_err *err) {
    int rc = flush_buf(w, err);
    uint64_t end;
    if (!rc && (em_add_overflow(w->pos, n, &end) || end > (uint64_t)INT64_MAX))
        rc = em_err_set(err, EM_EOVERFLOW, "%s: file offset overflows", open_path(w));
    if (!rc && lseek(w->fd, (off_t)end, SEEK_SET) < 0)
        rc = em_err_set(err, EM_EIO, "%s: cannot seek to %llu: %s", open_path(w),
                        (unsigned long long)end, strerror(errno));
    if (!rc) w->pos = end;
    return rc;
}

static int out_pad(em_gguf_writer *w, em_err *err) {
    static const uint8_t zeros[256];
    int rc = EM_OK;
    while (w->pos % w->alignment && !rc) {
        uint64_t k = w->alignment - w->pos % w->alignment;
        rc = out_write(w, zeros, k < sizeof zeros ? k : sizeof zeros, err);
    }
    return rc;
}

static int open_shard(em_gguf_writer *w, int s, em_err *err) {
    wshard *sh = &w->shards[s];
    size_t cap = strlen(sh->path) + 48;
    sh->tmp = em_malloc(cap, "temporary path", err);
    if (!sh->tmp) return EM_ENOMEM;
    for (int attempt = 0;; attempt++) {
        snprintf(sh->tmp, cap, "%s.partial.%ld.%d", sh->path, (long)getpid(), attempt);
        w->fd = open(sh->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0) break;
        if (errno != EEXIST || attempt > 100) {
            int e = errno;
            free(sh->tmp);
            sh->tmp = NULL;
            return em_err_set(err, EM_EIO, "%s: cannot create: %s", sh->path, strerror(e));
        }
    }
    w->cur_shard = s;
    w->pos = 0;
    bytebuf h = { 0 };
    int rc = build_header(w, s, &h, err);
    if (!rc) rc = out_write(w, h.p, h.len, err);
    free(h.p);
    return rc;
}

static int close_shard(em_gguf_writer *w, em_err *err) {
    int rc = flush_buf(w, err);
    const char *path = open_path(w);
    /* a shard that ends in a hole (skip_data) is shorter on disk than its data: extend it */
    struct stat sb;
    if (!rc && fstat(w->fd, &sb) == 0 && (uint64_t)sb.st_size < w->pos && ftruncate(w->fd, (off_t)w->pos) != 0)
        rc = em_err_set(err, EM_EIO, "%s: cannot extend to %llu bytes: %s", path,
                        (unsigned long long)w->pos, strerror(errno));
    if (!rc && fsync(w->fd) != 0)
        rc = em_err_set(err, EM_EIO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(w->fd) != 0 && !rc)
        rc = em_err_set(err, EM_EIO, "%s: close failed: %s", path, strerror(errno));
    w->fd = -1;
    return rc;
}

/* Fixes the plan and opens shard 0: the end of the declaring phase. */
static int begin_data(em_gguf_writer *w, em_err *err) {
    int rc = make_shards(w, err);
    if (!rc && !(w->buf = em_malloc(OUT_BUF_BYTES, "GGUF output buffer", err))) rc = EM_ENOMEM;
    if (!rc) rc = open_shard(w, 0, err);
    w->state = rc ? W_FAILED : W_WRITING;
    return rc;
}

/* Pads the finished current tensor and moves on, into the next shard if that is where the
 * next tensor lives. */
static int complete_tensor(em_gguf_writer *w, em_err *err) {
    int rc = out_pad(w, err);
    w->cur++;
    w->cur_done = 0;
    if (!rc && w->cur < w->n_tensors && w->tensors[w->cur].shard != w->cur_shard) {
        rc = close_shard(w, err);
        if (!rc) rc = open_shard(w, w->tensors[w->cur].shard, err);
    }
    return rc;
}

static int start_writing(em_gguf_writer *w, em_err *err) {
    if (w->state == W_DECLARING) return begin_data(w, err);
    if (w->state == W_WRITING) return EM_OK;
    return em_err_set(err, EM_EINVAL, "%s: the writer has %s", w->path,
                      w->state == W_FINISHED ? "finished" : "failed");
}

/* The next n bytes of tensor data, in declaration order across tensor boundaries: written
 * from data, or (skip) left as a hole (sparse files of shape-only tensors). */
static int feed_data(em_gguf_writer *w, const uint8_t *data, bool skip, uint64_t n, em_err *err) {
    int rc = start_writing(w, err);
    if (rc) return w->state == W_FINISHED ? rc : fail_state(w, rc);
    while (n && !rc) {
        if (w->cur >= w->n_tensors) {
            rc = em_err_set(err, EM_EINVAL, "%s: %llu bytes of data beyond the declared tensors",
                            w->path, (unsigned long long)n);
            break;
        }
        const wtensor *t = &w->tensors[w->cur];
        uint64_t k = t->bytes - w->cur_done;
        if (k > n) k = n;
        if (skip) {
            rc = out_skip(w, k, err);
        } else {
            rc = out_write(w, data, k, err);
            data += k;
        }
        n -= k;
        w->cur_done += k;
        if (!rc && w->cur_done == t->bytes) rc = complete_tensor(w, err);
    }
    return rc ? fail_state(w, rc) : EM_OK;
}

int em_gguf_writer_write_data(em_gguf_writer *w, const void *data, uint64_t n, em_err *err) {
    return feed_data(w, data, false, n, err);
}

int em_gguf_writer_skip_data(em_gguf_writer *w, uint64_t n, em_err *err) {
    return feed_data(w, NULL, true, n, err);
}

int em_gguf_writer_write_tensor(em_gguf_writer *w, const char *name, const void *data,
                                uint64_t bytes, em_err *err) {
    int rc = start_writing(w, err);
    if (rc) return w->state == W_FINISHED ? rc : fail_state(w, rc);
    if (w->cur >= w->n_tensors || w->cur_done != 0 || strcmp(w->tensors[w->cur].name, name))
        return em_err_set(err, EM_EINVAL, "%s: tensor '%s' written out of order (expected '%s')",
                          w->path, name,
                          w->cur < w->n_tensors ? w->tensors[w->cur].name : "(no more tensors)");
    if (bytes != w->tensors[w->cur].bytes)
        return em_err_set(err, EM_EINVAL, "%s: tensor '%s' is %llu bytes, not %llu", w->path, name,
                          (unsigned long long)w->tensors[w->cur].bytes, (unsigned long long)bytes);
    if (bytes == 0) {
        rc = complete_tensor(w, err);
        return rc ? fail_state(w, rc) : EM_OK;
    }
    return em_gguf_writer_write_data(w, data, bytes, err);
}

static void fsync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: the renames are already done */
        close(fd);
    }
}

int em_gguf_writer_finish(em_gguf_writer *w, em_err *err) {
    int rc = start_writing(w, err);
    if (rc) return w->state == W_FINISHED ? rc : fail_state(w, rc);
    /* tensors of zero bytes need no data */
    while (!rc && w->cur < w->n_tensors && w->tensors[w->cur].bytes == 0) rc = complete_tensor(w, err);
    if (!rc && w->cur < w->n_tensors)
        rc = em_err_set(err, EM_EINVAL, "%s: tensor '%s' has %llu of its %llu bytes written",
                        w->path, w->tensors[w->cur].name, (unsigned long long)w->cur_done,
                        (unsigned long long)w->tensors[w->cur].bytes);
    if (!rc) rc = close_shard(w, err);
    for (int i = 0; i < w->n_shards && !rc; i++) {
        wshard *s = &w->shards[i];
        if (rename(s->tmp, s->path) != 0)
            rc = em_err_set(err, EM_EIO, "%s: cannot rename %s into place: %s", s->path, s->tmp,
                            strerror(errno));
        else s->renamed = true;
    }
    if (rc) return fail_state(w, rc);
    fsync_dir(w->shards[0].path);
    w->state = W_FINISHED;
    return EM_OK;
}

int em_gguf_writer_n_shards(const em_gguf_writer *w) { return w->n_shards; }

const char *em_gguf_writer_shard_path(const em_gguf_writer *w, int i) {
    return i >= 0 && i < w->n_shards ? w->shards[i].path : NULL;
}

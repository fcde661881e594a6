/* format/safetensors: parses safetensors headers (single files, sharded index sets, folders)
 * into a flat tensor table with a name hash, and converts elements to f32.
 *
 * Invariants once open succeeds: every tensor's [data, data + n_bytes) lies inside its
 * shard's data buffer; the tensors of a shard tile its data buffer exactly; names are
 * unique over all shards; n_bytes == n_elements * dtype size with no overflow.
 * Nothing here trusts a count, offset or length from the file before checking it. Parsing
 * never writes to the mapping. The host must be little-endian (checked at compile time). */
#include "format/safetensors.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

/* ---- dtypes ----------------------------------------------------------------------------- */

static const struct {
    const char *name;
    size_t size;
} k_dtypes[EM_ST_DTYPE_COUNT] = {
    [EM_ST_F32] = { "F32", 4 },         [EM_ST_F16] = { "F16", 2 },
    [EM_ST_BF16] = { "BF16", 2 },       [EM_ST_F8_E4M3] = { "F8_E4M3", 1 },
    [EM_ST_F8_E5M2] = { "F8_E5M2", 1 }, [EM_ST_F64] = { "F64", 8 },
    [EM_ST_I64] = { "I64", 8 },         [EM_ST_I32] = { "I32", 4 },
    [EM_ST_I16] = { "I16", 2 },         [EM_ST_I8] = { "I8", 1 },
    [EM_ST_U64] = { "U64", 8 },         [EM_ST_U32] = { "U32", 4 },
    [EM_ST_U16] = { "U16", 2 },         [EM_ST_U8] = { "U8", 1 },
    [EM_ST_BOOL] = { "BOOL", 1 },       [EM_ST_F8_E8M0] = { "F8_E8M0", 1 },
};

const char *em_st_dtype_name(enum em_st_dtype t) {
    return (unsigned)t < EM_ST_DTYPE_COUNT ? k_dtypes[t].name : "?";
}

size_t em_st_dtype_size(enum em_st_dtype t) {
    return (unsigned)t < EM_ST_DTYPE_COUNT ? k_dtypes[t].size : 0;
}

int em_st_dtype_parse(const char *name, enum em_st_dtype *out, em_err *err) {
    for (int t = 0; t < EM_ST_DTYPE_COUNT; t++) {
        if (strcmp(name, k_dtypes[t].name) == 0) {
            *out = (enum em_st_dtype)t;
            return EM_OK;
        }
    }
    return em_err_set(err, EM_EUNSUPPORTED, "unsupported dtype '%.64s'", name);
}

/* ---- the handle ------------------------------------------------------------------------- */

typedef struct st_shard {
    char *path;
    em_mmap map;         /* empty for a memory shard */
    const uint8_t *base; /* whole file */
    uint64_t size;
    uint64_t data_start; /* 8 + header length */
    char *pool;          /* names and metadata strings of this shard */
    size_t pool_used, pool_cap;
} st_shard;

typedef struct st_meta {
    const char *key, *value;
    int shard;
} st_meta;

struct em_safetensors {
    char *path;
    st_shard *shards;
    int n_shards;
    em_safetensors_tensor *tensors;
    size_t n_tensors, cap_tensors;
    size_t *hash; /* tensor index + 1; 0 = empty slot */
    size_t hash_cap;
    st_meta *meta;
    size_t n_meta, cap_meta;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

void em_safetensors_close(em_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_shards; i++) {
        em_mmap_close(&st->shards[i].map);
        free(st->shards[i].path);
        free(st->shards[i].pool);
    }
    free(st->shards);
    free(st->tensors);
    free(st->hash);
    free(st->meta);
    free(st->path);
    free(st);
}

static int st_create(em_safetensors **out, const char *path, em_err *err) {
    *out = NULL;
    em_safetensors *st = em_calloc(1, sizeof *st, "safetensors handle", err);
    if (!st) return EM_ENOMEM;
    st->path = em_strdup(path, err);
    if (!st->path) {
        free(st);
        return EM_ENOMEM;
    }
    *out = st;
    return EM_OK;
}

/* Appends an empty shard record (path copied); returns its index or a negative status. */
static int st_add_shard(em_safetensors *st, const char *path, em_err *err) {
    st_shard *grown = realloc(st->shards, (size_t)(st->n_shards + 1) * sizeof *grown);
    if (!grown) return em_err_set(err, EM_ENOMEM, "%s: out of memory for shard list", path);
    st->shards = grown;
    st_shard *s = &st->shards[st->n_shards];
    memset(s, 0, sizeof *s);
    s->path = em_strdup(path, err);
    if (!s->path) return EM_ENOMEM;
    return st->n_shards++;
}

/* Copies a decoded JSON string into the shard's pool. The pool holds header length + 1
 * bytes and every string occupies at least its length + 2 bytes (its quotes) in the
 * header, so it cannot run out; the check guards the invariant anyway. */
static const char *pool_copy(st_shard *s, const char *text, size_t len) {
    if (len + 1 > s->pool_cap - s->pool_used) return NULL;
    char *dst = s->pool + s->pool_used;
    memcpy(dst, text, len);
    dst[len] = 0;
    s->pool_used += len + 1;
    return dst;
}

static int add_meta(em_safetensors *st, const char *key, const char *value, int shard,
                    em_err *err) {
    if (st->n_meta == st->cap_meta) {
        size_t cap = st->cap_meta ? st->cap_meta * 2 : 8;
        st_meta *grown = realloc(st->meta, cap * sizeof *grown);
        if (!grown) return em_err_set(err, EM_ENOMEM, "%s: out of memory for metadata", st->path);
        st->meta = grown;
        st->cap_meta = cap;
    }
    st->meta[st->n_meta++] = (st_meta){ key, value, shard };
    return EM_OK;
}

static int reserve_tensors(em_safetensors *st, size_t extra, em_err *err) {
    if (extra <= st->cap_tensors - st->n_tensors) return EM_OK;
    size_t cap = st->cap_tensors ? st->cap_tensors : 64;
    while (cap - st->n_tensors < extra) cap *= 2;
    em_safetensors_tensor *grown = realloc(st->tensors, cap * sizeof *grown);
    if (!grown)
        return em_err_set(err, EM_ENOMEM, "%s: out of memory for %zu tensors", st->path, cap);
    st->tensors = grown;
    st->cap_tensors = cap;
    return EM_OK;
}

/* ---- one shard's header ----------------------------------------------------------------- */

/* A tensor while its shard is being validated: offsets relative to the data buffer. */
typedef struct st_entry {
    em_safetensors_tensor t;
    uint64_t begin, end;
} st_entry;

static int cmp_entry(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads a JSON integer in [0, INT64_MAX]. */
static bool json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static int parse_metadata(em_safetensors *st, int shard, json_t *obj, em_err *err) {
    st_shard *s = &st->shards[shard];
    if (json_is_null(obj)) return EM_OK;
    if (!json_is_object(obj))
        return em_err_set(err, EM_EFORMAT, "%s: __metadata__ is not an object", s->path);
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val) {
        if (!json_is_string(val))
            return em_err_set(err, EM_EFORMAT,
                              "%s: __metadata__ value for '%.128s' is not a string", s->path, key);
        const char *k = pool_copy(s, key, strlen(key));
        const char *v = k ? pool_copy(s, json_string_value(val), json_string_length(val)) : NULL;
        if (!k || !v)
            return em_err_set(err, EM_EFORMAT, "%s: header string pool overflow", s->path);
        int rc = add_meta(st, k, v, shard, err);
        if (rc) return rc;
    }
    return EM_OK;
}

/* Fills e from one header entry: dtype, shape, offsets, element and byte counts. */
static int parse_entry(const st_shard *s, const char *name, json_t *desc, st_entry *e,
                       em_err *err) {
    memset(e, 0, sizeof *e);
    if (!json_is_object(desc))
        return em_err_set(err, EM_EFORMAT, "%s: tensor '%.200s': entry is not an object", s->path,
                          name);
    json_t *dtype = json_object_get(desc, "dtype");
    json_t *shape = json_object_get(desc, "shape");
    json_t *offs = json_object_get(desc, "data_offsets");
    if (!json_is_string(dtype))
        return em_err_set(err, EM_EFORMAT, "%s: tensor '%.200s': missing or non-string \"dtype\"",
                          s->path, name);
    int rc = em_st_dtype_parse(json_string_value(dtype), &e->t.dtype, err);
    if (rc) {
        em_err_prefix(err, "%s: tensor '%.200s'", s->path, name);
        return rc;
    }
    if (!json_is_array(shape))
        return em_err_set(err, EM_EFORMAT, "%s: tensor '%.200s': missing or non-array \"shape\"",
                          s->path, name);
    size_t nd = json_array_size(shape);
    if (nd > EM_ST_MAX_DIMS)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: tensor '%.200s': %zu dimensions (at most %d)",
                          s->path, name, nd, EM_ST_MAX_DIMS);
    uint64_t n = 1;
    for (size_t d = 0; d < nd; d++) {
        if (!json_u64(json_array_get(shape, d), &e->t.shape[d]))
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%.200s': shape[%zu] is not a non-negative integer",
                              s->path, name, d);
        if (em_mul_overflow(n, e->t.shape[d], &n))
            return em_err_set(err, EM_EOVERFLOW, "%s: tensor '%.200s': element count overflows",
                              s->path, name);
    }
    e->t.n_dims = (int)nd;
    e->t.n_elements = n;
    if (em_mul_overflow(n, em_st_dtype_size(e->t.dtype), &e->t.n_bytes))
        return em_err_set(err, EM_EOVERFLOW, "%s: tensor '%.200s': byte size overflows", s->path,
                          name);
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_u64(json_array_get(offs, 0), &e->begin) ||
        !json_u64(json_array_get(offs, 1), &e->end))
        return em_err_set(err, EM_EFORMAT,
                          "%s: tensor '%.200s': \"data_offsets\" must be two non-negative integers",
                          s->path, name);
    return EM_OK;
}

static void format_shape(const em_safetensors_tensor *t, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%llu", d ? ", " : "",
                                 (unsigned long long)t->shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Checks the sorted entries against the data buffer: each within it, sizes consistent with
 * shape and dtype, and together an exact tiling of [0, data_size) (the crate's rule). */
static int check_tiling(const st_shard *s, const st_entry *e, size_t n, em_err *err) {
    typedef unsigned long long ull;
    const uint64_t data_size = s->size - s->data_start;
    uint64_t expect = 0; /* where the next tensor must begin */
    for (size_t i = 0; i < n; i++) {
        const st_entry *x = &e[i];
        const char *prev = i ? e[i - 1].t.name : NULL;
        ull b = x->begin, en = x->end, at = s->data_start + (ull)x->begin;
        if (x->end < x->begin)
            return em_err_set(
                err, EM_EFORMAT,
                "%s: tensor '%.200s': data_offsets [%llu, %llu) end before they begin", s->path,
                x->t.name, b, en);
        if (x->end > data_size)
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%.200s': data_offsets [%llu, %llu) run past the end of "
                              "the data (%llu bytes from file offset %llu; file is %llu bytes)",
                              s->path, x->t.name, b, en, (ull)data_size, (ull)s->data_start,
                              (ull)s->size);
        if (x->begin < expect)
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%.200s': data_offsets [%llu, %llu) overlap tensor "
                              "'%.200s' ending at %llu (file offset %llu)",
                              s->path, x->t.name, b, en, prev ? prev : "?", (ull)expect, at);
        if (x->begin > expect)
            return em_err_set(
                err, EM_EFORMAT,
                "%s: tensor '%.200s': data_offsets [%llu, %llu) leave a gap of %llu "
                "bytes after %s%.200s%s (tensors must be contiguous; file offset %llu)",
                s->path, x->t.name, b, en, (ull)(x->begin - expect),
                prev ? "tensor '" : "the start of the data", prev ? prev : "", prev ? "'" : "",
                (ull)(s->data_start + expect));
        if (x->end - x->begin != x->t.n_bytes) {
            char shape[200];
            format_shape(&x->t, shape, sizeof shape);
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%.200s': data_offsets [%llu, %llu) hold %llu bytes but "
                              "shape %s of %s needs %llu (file offset %llu)",
                              s->path, x->t.name, b, en, en - b, shape,
                              em_st_dtype_name(x->t.dtype), (ull)x->t.n_bytes, at);
        }
        expect = x->end;
    }
    if (expect != data_size)
        return em_err_set(err, EM_EFORMAT,
                          "%s: %llu bytes after the last tensor are not covered by any tensor "
                          "(from file offset %llu)",
                          s->path, (ull)(data_size - expect), (ull)(s->data_start + expect));
    return EM_OK;
}

/* Reads the length prefix and parses the JSON header of shard s. */
static int load_header(st_shard *s, json_t **root, em_err *err) {
    *root = NULL;
    if (s->size < 8)
        return em_err_set(err, EM_EFORMAT,
                          "%s: %llu bytes is too short for the 8-byte header length", s->path,
                          (unsigned long long)s->size);
    uint64_t n;
    memcpy(&n, s->base, 8);
    if (n > EM_ST_MAX_HEADER)
        return em_err_set(err, EM_EFORMAT,
                          "%s: header length %llu at offset 0 exceeds the limit of %llu", s->path,
                          (unsigned long long)n, (unsigned long long)EM_ST_MAX_HEADER);
    if (n > s->size - 8)
        return em_err_set(err, EM_EFORMAT,
                          "%s: header length %llu at offset 0 runs past the end of the file "
                          "(%llu bytes)",
                          s->path, (unsigned long long)n, (unsigned long long)s->size);
    s->data_start = 8 + n;
    json_error_t jerr;
    *root = json_loadb((const char *)s->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root)
        return em_err_set(
            err, EM_EFORMAT, "%s: header JSON at file offset %llu: %s", s->path,
            (unsigned long long)(8 + (uint64_t)(jerr.position > 0 ? jerr.position : 0)), jerr.text);
    if (!json_is_object(*root))
        return em_err_set(err, EM_EFORMAT, "%s: header JSON at file offset 8 is not an object",
                          s->path);
    s->pool_cap = (size_t)n + 1;
    s->pool = malloc(s->pool_cap);
    if (!s->pool)
        return em_err_set(err, EM_ENOMEM, "%s: out of memory for header strings", s->path);
    return EM_OK;
}

/* Parses and validates shard `shard` (its base/size already set) and appends its tensors. */
static int parse_shard(em_safetensors *st, int shard, em_err *err) {
    st_shard *s = &st->shards[shard];
    json_t *root;
    int rc = load_header(s, &root, err);
    if (rc) {
        json_decref(root);
        return rc;
    }
    size_t cap = json_object_size(root);
    st_entry *entries = cap ? calloc(cap, sizeof *entries) : NULL;
    if (cap && !entries) {
        json_decref(root);
        return em_err_set(err, EM_ENOMEM, "%s: out of memory for %zu tensors", s->path, cap);
    }
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(st, shard, val, err);
        } else {
            rc = parse_entry(s, key, val, &entries[n], err);
            if (!rc) {
                entries[n].t.name = pool_copy(s, key, strlen(key));
                if (!entries[n].t.name)
                    rc = em_err_set(err, EM_EFORMAT, "%s: header string pool overflow", s->path);
            }
            n++;
        }
        if (rc) break;
    }
    json_decref(root);
    if (!rc) {
        if (n) qsort(entries, n, sizeof *entries, cmp_entry);
        rc = check_tiling(s, entries, n, err);
    }
    if (!rc) rc = reserve_tensors(st, n, err);
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            em_safetensors_tensor *t = &st->tensors[st->n_tensors++];
            *t = entries[i].t;
            t->file_offset = s->data_start + entries[i].begin;
            t->data = s->base + t->file_offset;
            t->shard = shard;
            t->path = s->path;
        }
    }
    free(entries);
    return rc;
}

/* Maps `path` as a new shard and parses it. */
static int open_shard(em_safetensors *st, const char *path, em_err *err) {
    int shard = st_add_shard(st, path, err);
    if (shard < 0) return shard;
    st_shard *s = &st->shards[shard];
    int rc = em_mmap_open(&s->map, path, err);
    if (rc) return rc;
    s->base = s->map.data;
    s->size = s->map.size;
    return parse_shard(st, shard, err);
}

/* Builds the name hash; a name seen twice (necessarily in two shards, since duplicate keys
 * in one header are refused by the JSON parser) is an error naming both files. */
static int build_hash(em_safetensors *st, em_err *err) {
    size_t cap = 16;
    while (cap < st->n_tensors * 2) cap *= 2;
    st->hash = calloc(cap, sizeof *st->hash);
    if (!st->hash)
        return em_err_set(err, EM_ENOMEM, "%s: out of memory for the name index", st->path);
    st->hash_cap = cap;
    for (size_t i = 0; i < st->n_tensors; i++) {
        size_t slot = (size_t)hash_name(st->tensors[i].name) & (cap - 1);
        while (st->hash[slot]) {
            const em_safetensors_tensor *o = &st->tensors[st->hash[slot] - 1];
            if (strcmp(o->name, st->tensors[i].name) == 0)
                return em_err_set(err, EM_EFORMAT, "tensor '%.200s' appears twice: in %s and in %s",
                                  o->name, o->path, st->tensors[i].path);
            slot = (slot + 1) & (cap - 1);
        }
        st->hash[slot] = i + 1;
    }
    return EM_OK;
}

/* ---- opening: memory, file, index, folder ----------------------------------------------- */

int em_safetensors_open_memory(em_safetensors **out, const void *data, size_t size,
                               const char *name, em_err *err) {
    *out = NULL;
    em_safetensors *st;
    int rc = st_create(&st, name, err);
    if (rc) return rc;
    int shard = st_add_shard(st, name, err);
    if (shard < 0) {
        em_safetensors_close(st);
        return shard;
    }
    st->shards[shard].base = data;
    st->shards[shard].size = size;
    rc = parse_shard(st, shard, err);
    if (!rc) rc = build_hash(st, err);
    if (rc) {
        em_safetensors_close(st);
        return rc;
    }
    *out = st;
    return EM_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Joins folder and name into a fresh heap string. */
static char *join_path(const char *dir, const char *name, em_err *err) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = em_malloc(a + b + 2, "path", err);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* The folder part of a path ("." when it has none). */
static char *dir_of(const char *path, em_err *err) {
    const char *slash = strrchr(path, '/');
    if (!slash) return em_strdup(".", err);
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    char *d = em_malloc(len + 1, "path", err);
    if (!d) return NULL;
    memcpy(d, path, len);
    d[len] = 0;
    return d;
}

/* A shard name from an index must stay inside the index's folder. */
static bool shard_name_ok(const char *name) {
    if (!*name || name[0] == '/') return false;
    for (const char *p = name; *p;) {
        const char *end = strchr(p, '/');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || (len == 2 && p[0] == '.' && p[1] == '.')) return false;
        p += len + (end ? 1 : 0);
        if (end && !*p) return false;
    }
    return true;
}

/* Opens every distinct shard named in weight_map, in sorted order. */
static int open_index_shards(em_safetensors *st, const char *index, const char *dir, json_t *wmap,
                             em_err *err) {
    size_t n = json_object_size(wmap), n_names = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    int rc = !names ? em_err_set(err, EM_ENOMEM, "%s: out of memory", index) : EM_OK;
    const char *key;
    json_t *val;
    if (!rc) {
        json_object_foreach(wmap, key, val) {
            if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
                rc = em_err_set(
                    err, EM_EFORMAT,
                    "%s: weight_map['%.200s'] is not a file name inside the index folder", index,
                    key);
                break;
            }
            names[n_names++] = json_string_value(val);
        }
    }
    if (!rc && n_names) qsort(names, n_names, sizeof *names, cmp_str);
    for (size_t i = 0; !rc && i < n_names; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0) continue;
        char *path = join_path(dir, names[i], err);
        if (!path) {
            rc = EM_ENOMEM;
            break;
        }
        if (!em_file_exists(path))
            rc = em_err_set(err, EM_ENOTFOUND,
                            "%s: shard '%.200s' listed in the index is missing (%s)", index,
                            names[i], path);
        else
            rc = open_shard(st, path, err);
        free(path);
    }
    free(names);
    return rc;
}

/* Every weight_map entry must name a tensor that is in the shard the index says. */
static int check_index_entries(const em_safetensors *st, const char *index, const char *dir,
                               json_t *wmap, em_err *err) {
    const char *key;
    json_t *val;
    json_object_foreach(wmap, key, val) {
        const em_safetensors_tensor *t = em_safetensors_find(st, key);
        const char *want = json_string_value(val);
        if (!t)
            return em_err_set(
                err, EM_EFORMAT,
                "%s: tensor '%.200s' is listed for shard '%.200s' but is missing from it", index,
                key, want);
        size_t dl = strlen(dir);
        bool same = strncmp(t->path, dir, dl) == 0 && t->path[dl] == '/' &&
                    strcmp(t->path + dl + 1, want) == 0;
        if (!same)
            return em_err_set(err, EM_EFORMAT,
                              "%s: tensor '%.200s' is listed for shard '%.200s' but is in %s",
                              index, key, want, t->path);
    }
    return EM_OK;
}

static int open_index(em_safetensors *st, const char *index, em_err *err) {
    char *text;
    size_t len;
    int rc = em_file_read_all(index, &text, &len, err);
    if (rc) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return em_err_set(err, EM_EFORMAT, "%s: line %d, byte offset %d: %s", index, jerr.line,
                          jerr.position, jerr.text);
    json_t *wmap = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wmap))
        rc = em_err_set(err, EM_EFORMAT, "%s: no \"weight_map\" object", index);
    else if (json_object_size(wmap) == 0)
        rc = em_err_set(err, EM_EFORMAT, "%s: \"weight_map\" lists no tensors", index);
    char *dir = rc ? NULL : dir_of(index, err);
    if (!rc && !dir) rc = EM_ENOMEM;
    if (!rc) rc = open_index_shards(st, index, dir, wmap, err);
    if (!rc) rc = build_hash(st, err);
    if (!rc) rc = check_index_entries(st, index, dir, wmap, err);
    free(dir);
    json_decref(root);
    return rc;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A folder without index or model.safetensors: every *.safetensors file in it, sorted. */
static int open_folder_files(em_safetensors *st, const char *dir, em_err *err) {
    DIR *d = opendir(dir);
    if (!d) return em_err_set(err, EM_EIO, "%s: cannot list folder", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = EM_OK;
    struct dirent *ent;
    while (!rc && (ent = readdir(d))) {
        if (ent->d_name[0] == '.' || !ends_with(ent->d_name, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **grown = realloc(names, cap * sizeof *grown);
            if (!grown) {
                rc = em_err_set(err, EM_ENOMEM, "%s: out of memory", dir);
                break;
            }
            names = grown;
        }
        names[n] = em_strdup(ent->d_name, err);
        if (!names[n])
            rc = EM_ENOMEM;
        else
            n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = em_err_set(err, EM_ENOTFOUND,
                        "%s: no model.safetensors.index.json, model.safetensors or *.safetensors",
                        dir);
    if (!rc && n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; !rc && i < n; i++) {
        char *path = join_path(dir, names[i], err);
        rc = path ? open_shard(st, path, err) : EM_ENOMEM;
        free(path);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!rc) rc = build_hash(st, err);
    return rc;
}

static int open_folder(em_safetensors *st, const char *dir, em_err *err) {
    char *index = join_path(dir, "model.safetensors.index.json", err);
    char *single = join_path(dir, "model.safetensors", err);
    int rc;
    if (!index || !single)
        rc = EM_ENOMEM;
    else if (em_file_exists(index))
        rc = open_index(st, index, err);
    else if (em_file_exists(single)) {
        rc = open_shard(st, single, err);
        if (!rc) rc = build_hash(st, err);
    } else
        rc = open_folder_files(st, dir, err);
    free(index);
    free(single);
    return rc;
}

int em_safetensors_open(em_safetensors **out, const char *path, em_err *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return em_err_set(err, EM_ENOTFOUND, "%s: no such file or folder", path);
    em_safetensors *st;
    int rc = st_create(&st, path, err);
    if (rc) return rc;
    if (S_ISDIR(sb.st_mode))
        rc = open_folder(st, path, err);
    else if (ends_with(path, ".json"))
        rc = open_index(st, path, err);
    else {
        rc = open_shard(st, path, err);
        if (!rc) rc = build_hash(st, err);
    }
    if (rc) {
        em_safetensors_close(st);
        return rc;
    }
    *out = st;
    return EM_OK;
}

/* ---- queries ---------------------------------------------------------------------------- */

size_t em_safetensors_count(const em_safetensors *st) { return st->n_tensors; }

const em_safetensors_tensor *em_safetensors_at(const em_safetensors *st, size_t i) {
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

const em_safetensors_tensor *em_safetensors_find(const em_safetensors *st, const char *name) {
    if (!st->hash_cap) return NULL;
    size_t slot = (size_t)hash_name(name) & (st->hash_cap - 1);
    while (st->hash[slot]) {
        const em_safetensors_tensor *t = &st->tensors[st->hash[slot] - 1];
        if (strcmp(t->name, name) == 0) return t;
        slot = (slot + 1) & (st->hash_cap - 1);
    }
    return NULL;
}

int em_safetensors_get(const em_safetensors *st, const char *name,
                       const em_safetensors_tensor **out, em_err *err) {
    *out = em_safetensors_find(st, name);
    if (!*out) return em_err_set(err, EM_ENOTFOUND, "%s: no tensor named '%.200s'", st->path, name);
    return EM_OK;
}

int em_safetensors_shard_count(const em_safetensors *st) { return st->n_shards; }

const char *em_safetensors_shard_path(const em_safetensors *st, int shard) {
    return shard >= 0 && shard < st->n_shards ? st->shards[shard].path : NULL;
}

const char *em_safetensors_path(const em_safetensors *st) { return st->path; }

size_t em_safetensors_metadata_count(const em_safetensors *st) { return st->n_meta; }

bool em_safetensors_metadata_at(const em_safetensors *st, size_t i, const char **key,
                                const char **value, int *shard) {
    if (i >= st->n_meta) return false;
    if (key) *key = st->meta[i].key;
    if (value) *value = st->meta[i].value;
    if (shard) *shard = st->meta[i].shard;
    return true;
}

const char *em_safetensors_metadata_get(const em_safetensors *st, const char *key) {
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

/* ---- conversion to f32 ------------------------------------------------------------------ */

float em_st_f8_e4m3_to_f32(uint8_t v) {
    uint32_t sign = (uint32_t)(v >> 7) << 31;
    uint32_t exp = (v >> 3) & 15, man = v & 7;
    union {
        uint32_t u;
        float f;
    } r;
    if (exp == 15 && man == 7) {
        r.u = sign | 0x7fc00000u; /* the only NaN encodings; there are no infinities */
    } else if (exp == 0) {
        r.f = (float)man * 0x1p-9f; /* subnormal: man/8 * 2^(1-7), exact */
        r.u |= sign;
    } else {
        r.u = sign | ((exp - 7 + 127) << 23) | (man << 20);
    }
    return r.f;
}

float em_st_f8_e5m2_to_f32(uint8_t v) {
    /* E5M2 is the top byte of an IEEE half: same bias, infinities and NaNs. */
    return em_fp16_to_fp32((uint16_t)(v << 8));
}

float em_st_f8_e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return NAN;
    float f;
    uint32_t bits = v ? (uint32_t)v << 23 : 1u << 22; /* 2^-127 is the f32 subnormal 2^-1 * 2^-126 */
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define CONVERT_LOOP(ctype, expr)                                                                  \
    for (size_t i = 0; i < n; i++) {                                                               \
        ctype x;                                                                                   \
        memcpy(&x, s + i * sizeof x, sizeof x);                                                    \
        dst[i] = (expr);                                                                           \
    }

void em_st_convert_f32(enum em_st_dtype dtype, const void *src, float *dst, size_t n) {
    const uint8_t *s = src;
    switch (dtype) {
    case EM_ST_F32:
        if (n) memcpy(dst, s, n * sizeof *dst);
        break;
    case EM_ST_F16: CONVERT_LOOP(uint16_t, em_fp16_to_fp32(x)) break;
    case EM_ST_BF16: CONVERT_LOOP(uint16_t, em_bf16_to_fp32(x)) break;
    case EM_ST_F8_E4M3: CONVERT_LOOP(uint8_t, em_st_f8_e4m3_to_f32(x)) break;
    case EM_ST_F8_E5M2: CONVERT_LOOP(uint8_t, em_st_f8_e5m2_to_f32(x)) break;
    case EM_ST_F64: CONVERT_LOOP(double, (float)x) break;
    case EM_ST_I64: CONVERT_LOOP(int64_t, (float)x) break;
    case EM_ST_I32: CONVERT_LOOP(int32_t, (float)x) break;
    case EM_ST_I16: CONVERT_LOOP(int16_t, (float)x) break;
    case EM_ST_I8: CONVERT_LOOP(int8_t, (float)x) break;
    case EM_ST_U64: CONVERT_LOOP(uint64_t, (float)x) break;
    case EM_ST_U32: CONVERT_LOOP(uint32_t, (float)x) break;
    case EM_ST_U16: CONVERT_LOOP(uint16_t, (float)x) break;
    case EM_ST_U8: CONVERT_LOOP(uint8_t, (float)x) break;
    case EM_ST_BOOL: CONVERT_LOOP(uint8_t, x ? 1.0f : 0.0f) break;
    case EM_ST_F8_E8M0: CONVERT_LOOP(uint8_t, em_st_f8_e8m0_to_f32(x)) break;
    case EM_ST_DTYPE_COUNT: break;
    }
}

int em_safetensors_to_f32_range(const em_safetensors_tensor *t, uint64_t first, uint64_t count,
                                float *dst, em_err *err) {
    uint64_t end;
    if (em_add_overflow(first, count, &end) || end > t->n_elements)
        return em_err_set(err, EM_EINVAL,
                          "%s: tensor '%.200s': elements [%llu, +%llu) outside its %llu elements",
                          t->path, t->name, (unsigned long long)first, (unsigned long long)count,
                          (unsigned long long)t->n_elements);
    if ((unsigned)t->dtype >= EM_ST_DTYPE_COUNT)
        return em_err_set(err, EM_EINVAL, "%s: tensor '%.200s': bad dtype %d", t->path, t->name,
                          (int)t->dtype);
    em_st_convert_f32(t->dtype, t->data + first * em_st_dtype_size(t->dtype), dst, (size_t)count);
    return EM_OK;
}

int em_safetensors_to_f32(const em_safetensors_tensor *t, float *dst, uint64_t dst_count,
                          em_err *err) {
    if (dst_count < t->n_elements)
        return em_err_set(
            err, EM_EINVAL,
            "%s: tensor '%.200s': buffer of %llu floats is smaller than its %llu elements", t->path,
            t->name, (unsigned long long)dst_count, (unsigned long long)t->n_elements);
    return em_safetensors_to_f32_range(t, 0, t->n_elements, dst, err);
}

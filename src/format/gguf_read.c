/* format/gguf_read.c: the GGUF reader. Owns parsing of one file (from a mapping or from
 * memory), the joining of split shards into one model, and every accessor of gguf.h's
 * reading half.
 *
 * Invariants: nothing is read before a bounds check against the file size; every count is
 * bounded by the bytes left before anything is allocated for it, so memory stays O(file
 * size) whatever the header claims; sizes are computed with overflow checks. Values point
 * into the file bytes, which stay mapped until em_gguf_close. Parsing never recurses more
 * than EM_GGUF_MAX_DEPTH levels. Errors name the file, the byte offset and the key or
 * tensor being read. This file must not write anything. Tensor data past the end of a file
 * fails the open, unless the caller asked for allow_missing_data: then such a tensor is marked
 * missing (data NULL) and the shard records how many bytes are missing. */
#include "format/gguf_impl.h"

#include "quant/quant.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- value types --------------------------------------------------------------------- */

static const char *const k_type_names[EM_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "array", "u64", "i64", "f64",
};
static const int k_type_sizes[EM_GGUF_TYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

const char *em_gguf_type_name(int type) {
    return type >= 0 && type < EM_GGUF_TYPE_COUNT ? k_type_names[type] : "unknown";
}

int em_gguf_type_size(int type) {
    return type >= 0 && type < EM_GGUF_TYPE_COUNT ? k_type_sizes[type] : 0;
}

static bool type_is_int(int type) {
    return type == EM_GGUF_U8 || type == EM_GGUF_I8 || type == EM_GGUF_U16 ||
           type == EM_GGUF_I16 || type == EM_GGUF_U32 || type == EM_GGUF_I32 ||
           type == EM_GGUF_U64 || type == EM_GGUF_I64;
}

/* Decodes one element of a fixed-size type at p (bounds already checked). */
static em_gguf_value decode_fixed(int type, const uint8_t *p) {
    em_gguf_value v = { .type = type };
    switch (type) {
    case EM_GGUF_U8: v.u = p[0]; break;
    case EM_GGUF_I8: v.i = (int8_t)p[0]; break;
    case EM_GGUF_U16: v.u = em_gguf_ld16(p); break;
    case EM_GGUF_I16: v.i = (int16_t)em_gguf_ld16(p); break;
    case EM_GGUF_U32: v.u = em_gguf_ld32(p); break;
    case EM_GGUF_I32: v.i = (int32_t)em_gguf_ld32(p); break;
    case EM_GGUF_U64: v.u = em_gguf_ld64(p); break;
    case EM_GGUF_I64: v.i = (int64_t)em_gguf_ld64(p); break;
    case EM_GGUF_F32: memcpy(&v.f32, p, 4); break;
    case EM_GGUF_F64: memcpy(&v.f64, p, 8); break;
    case EM_GGUF_BOOL: v.b = p[0] != 0; break;
    default: assert(!"not a fixed-size type");
    }
    return v;
}

/* ---- parsing one file --------------------------------------------------------------- */

typedef struct gguf_kv {
    em_gguf_str key; /* in the file */
    const char *ckey;
    uint64_t at; /* byte offset of the key */
    em_gguf_value val;
} gguf_kv;

typedef struct gguf_file {
    em_gguf_shard info;
    char *path;
    em_mmap map; /* empty when parsed from memory */
    const uint8_t *bytes;
    uint64_t size;
    int64_t n_kv;
    gguf_kv *kv;
    em_gguf_ix kv_index;
    int64_t n_tensors;
    em_gguf_tensor *tensors;
    em_gguf_str *tnames; /* names in the file; freed once the model is assembled */
    uint64_t *tat;       /* byte offset of each tensor info; likewise */
    char *names;         /* NUL-terminated copies of keys and tensor names */
    bool allow_missing;  /* em_gguf_open_opts.allow_missing_data */
    bool guard;          /* em_gguf_open_opts.guard_mapping */
} gguf_file;

typedef struct parser {
    const uint8_t *b;
    uint64_t size;
    uint64_t pos;
    const char *path;
    char what[160]; /* what is being read: "key 'x'", "tensor 'y'", "header" */
    em_err *err;
} parser;

/* Printable rendering of a name for messages: at most 96 bytes, odd bytes as '?'. */
static void render_name(char *dst, size_t cap, const char *s, uint64_t len) {
    size_t n = 0;
    for (uint64_t i = 0; i < len && n + 4 < cap && i < 96; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[n++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (len > 96 && n + 4 < cap) { memcpy(dst + n, "...", 3); n += 3; }
    dst[n] = 0;
}

static void set_what(parser *ps, const char *kind, const char *s, uint64_t len) {
    char name[112];
    render_name(name, sizeof name, s, len);
    snprintf(ps->what, sizeof ps->what, "%s '%s'", kind, name);
}

static int fail(parser *ps, uint64_t at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(parser *ps, uint64_t at, int code, const char *fmt, ...) {
    char detail[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return em_err_set(ps->err, code, "%s: byte %llu: %s: %s", ps->path, (unsigned long long)at,
                      ps->what, detail);
}

static uint64_t left(const parser *ps) { return ps->size - ps->pos; }

static int take(parser *ps, uint64_t n, const char *field, const uint8_t **out) {
    *out = ps->b + ps->pos; /* not read unless the check below passes */
    if (left(ps) < n)
        return fail(ps, ps->pos, EM_EFORMAT, "truncated: %s needs %llu bytes, the file has %llu left",
                    field, (unsigned long long)n, (unsigned long long)left(ps));
    ps->pos += n;
    return EM_OK;
}

static int read_u32(parser *ps, const char *field, uint32_t *v) {
    const uint8_t *p;
    int rc = take(ps, 4, field, &p);
    if (!rc) *v = em_gguf_ld32(p);
    return rc;
}

static int read_u64(parser *ps, const char *field, uint64_t *v) {
    const uint8_t *p;
    int rc = take(ps, 8, field, &p);
    if (!rc) *v = em_gguf_ld64(p);
    return rc;
}

static int read_str(parser *ps, const char *field, em_gguf_str *s) {
    uint64_t at = ps->pos, len;
    const uint8_t *p;
    int rc = read_u64(ps, field, &len);
    if (rc) return rc;
    if (len > left(ps))
        return fail(ps, at, EM_EFORMAT, "%s length %llu is more than the %llu bytes left in the file",
                    field, (unsigned long long)len, (unsigned long long)left(ps));
    rc = take(ps, len, field, &p);
    s->ptr = (const char *)p;
    s->len = len;
    return rc;
}

static void arr_free(em_gguf_arr *a) {
    if (a->sub) {
        for (uint64_t i = 0; i < a->count; i++) arr_free(&a->sub[i]);
        free(a->sub);
    }
    free(a->str_off);
    a->sub = NULL;
    a->str_off = NULL;
}

static void arr_set_key(em_gguf_arr *a, const char *key) {
    a->key = key;
    for (uint64_t i = 0; a->sub && i < a->count; i++) arr_set_key(&a->sub[i], key);
}

/* Fails unless count elements of at least min_bytes each fit in what is left. */
static int check_count(parser *ps, uint64_t at, uint64_t count, uint64_t min_bytes, int elem) {
    if (count <= left(ps) / min_bytes) return EM_OK;
    return fail(ps, at, EM_EFORMAT,
                "array of %llu %s elements needs at least %llu bytes each, the file has %llu left",
                (unsigned long long)count, em_gguf_type_name(elem), (unsigned long long)min_bytes,
                (unsigned long long)left(ps));
}

static int parse_array(parser *ps, em_gguf_arr *a, int depth, const char *key) {
    uint64_t at = ps->pos, count;
    uint32_t elem;
    int rc;
    a->key = key;
    a->raw = ps->b + ps->pos;
    if ((rc = read_u32(ps, "array element type", &elem))) return rc;
    if (elem >= EM_GGUF_TYPE_COUNT)
        return fail(ps, at, EM_EFORMAT, "unknown array element type %u", elem);
    if (elem == EM_GGUF_ARRAY && depth + 1 >= EM_GGUF_MAX_DEPTH)
        return fail(ps, at, EM_EFORMAT, "arrays nested more than %d levels deep", EM_GGUF_MAX_DEPTH);
    a->elem_type = (int)elem;
    if ((rc = read_u64(ps, "array length", &count))) return rc;
    a->data = ps->b + ps->pos;
    if (elem == EM_GGUF_STR) {
        if ((rc = check_count(ps, at, count, 8, (int)elem))) return rc;
        if (count) {
            a->str_off = em_malloc((size_t)count * sizeof *a->str_off, "GGUF string array", ps->err);
            if (!a->str_off) return EM_ENOMEM;
        }
        a->count = count;
        for (uint64_t i = 0; i < count; i++) {
            em_gguf_str s;
            a->str_off[i] = (uint64_t)(ps->b + ps->pos - a->data);
            if ((rc = read_str(ps, "string", &s))) return rc;
        }
    } else if (elem == EM_GGUF_ARRAY) {
        if ((rc = check_count(ps, at, count, 12, (int)elem))) return rc;
        if (count) {
            a->sub = em_calloc((size_t)count, sizeof *a->sub, "GGUF nested array", ps->err);
            if (!a->sub) return EM_ENOMEM;
        }
        a->count = count;
        for (uint64_t i = 0; i < count; i++)
            if ((rc = parse_array(ps, &a->sub[i], depth + 1, key))) return rc;
    } else {
        const uint8_t *p;
        int size = k_type_sizes[elem];
        if ((rc = check_count(ps, at, count, (uint64_t)size, (int)elem))) return rc;
        if ((rc = take(ps, count * (uint64_t)size, "array elements", &p))) return rc;
        a->count = count;
    }
    a->raw_len = (uint64_t)(ps->b + ps->pos - a->raw);
    return EM_OK;
}

static int parse_value(parser *ps, uint32_t type, em_gguf_value *v, const char *key) {
    uint64_t at = ps->pos;
    if (type >= EM_GGUF_TYPE_COUNT)
        return fail(ps, at - 4, EM_EFORMAT, "unknown value type %u", type);
    v->type = (int)type;
    if (type == EM_GGUF_STR) return read_str(ps, "string", &v->str);
    if (type == EM_GGUF_ARRAY) {
        em_gguf_arr *a = em_calloc(1, sizeof *a, "GGUF array", ps->err);
        if (!a) return EM_ENOMEM;
        v->arr = a; /* owned by the kv from here on, even if parsing fails */
        return parse_array(ps, a, 0, key);
    }
    const uint8_t *p;
    int rc = take(ps, (uint64_t)k_type_sizes[type], "value", &p);
    if (!rc) *v = decode_fixed((int)type, p);
    return rc;
}

/* The smallest possible key (1-byte name, u8 value) and tensor info (1-byte name, 0 dims). */
#define MIN_KV_BYTES 14
#define MIN_TENSOR_INFO_BYTES 25

static int parse_header(parser *ps, gguf_file *f, uint64_t *n_tensors, uint64_t *n_kv) {
    const uint8_t *b = ps->b;
    snprintf(ps->what, sizeof ps->what, "header");
    if (ps->size < 4 || memcmp(b, EM_GGUF_MAGIC, 4)) {
        char magic[8];
        render_name(magic, sizeof magic, (const char *)b, ps->size < 4 ? ps->size : 4);
        return fail(ps, 0, EM_EFORMAT, "not a GGUF file (it starts with '%s', not 'GGUF')", magic);
    }
    if (ps->size < EM_GGUF_HEADER_BYTES)
        return fail(ps, 0, EM_EFORMAT, "truncated: the header needs %d bytes, the file has %llu",
                    EM_GGUF_HEADER_BYTES, (unsigned long long)ps->size);
    uint32_t version = em_gguf_ld32(b + 4);
    if (version == 0) return fail(ps, 4, EM_EFORMAT, "bad GGUF version 0");
    if ((version & 0xffff) == 0)
        return fail(ps, 4, EM_EUNSUPPORTED,
                    "version field reads 0x%08x: a big-endian GGUF, which Ember does not read",
                    version);
    if (version == 1)
        return fail(ps, 4, EM_EUNSUPPORTED, "GGUF v1 is not supported (v2 and v3 are)");
    if (version > 3)
        return fail(ps, 4, EM_EUNSUPPORTED, "GGUF v%u is newer than the v3 Ember reads", version);
    f->info.version = version;
    *n_tensors = em_gguf_ld64(b + 8);
    *n_kv = em_gguf_ld64(b + 16);
    ps->pos = EM_GGUF_HEADER_BYTES;
    uint64_t rest = left(ps), kv_bytes, ti_bytes, total;
    if (em_mul_overflow(*n_kv, MIN_KV_BYTES, &kv_bytes) ||
        em_mul_overflow(*n_tensors, MIN_TENSOR_INFO_BYTES, &ti_bytes) ||
        em_add_overflow(kv_bytes, ti_bytes, &total) || total > rest)
        return fail(ps, 8, EM_EFORMAT,
                    "the header claims %llu tensors and %llu keys, more than the %llu bytes after "
                    "it can hold",
                    (unsigned long long)*n_tensors, (unsigned long long)*n_kv,
                    (unsigned long long)rest);
    return EM_OK;
}

static int parse_kvs(parser *ps, gguf_file *f, uint64_t n_kv) {
    int rc;
    f->kv = em_calloc((size_t)n_kv, sizeof *f->kv, "GGUF keys", ps->err);
    if (!f->kv) return EM_ENOMEM;
    if ((rc = em_gguf_ix_init(&f->kv_index, n_kv, ps->err))) return rc;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        uint32_t type;
        kv->at = ps->pos;
        snprintf(ps->what, sizeof ps->what, "key #%llu", (unsigned long long)i);
        if ((rc = read_str(ps, "key", &kv->key))) return rc;
        f->n_kv = (int64_t)i + 1; /* from here on the kv is freed with the file */
        if (kv->key.len == 0) return fail(ps, kv->at, EM_EFORMAT, "empty key");
        set_what(ps, "key", kv->key.ptr, kv->key.len);
        if (memchr(kv->key.ptr, 0, kv->key.len))
            return fail(ps, kv->at, EM_EFORMAT, "the key holds a NUL byte");
        int64_t dup;
        rc = em_gguf_ix_insert(&f->kv_index, kv->key.ptr, kv->key.len, (int64_t)i, &dup, ps->err);
        if (rc) return rc;
        if (dup >= 0)
            return fail(ps, kv->at, EM_EFORMAT, "duplicate key (first at byte %llu)",
                        (unsigned long long)f->kv[dup].at);
        if ((rc = read_u32(ps, "value type", &type))) return rc;
        if ((rc = parse_value(ps, type, &kv->val, NULL))) return rc;
    }
    return EM_OK;
}

static int read_alignment(parser *ps, gguf_file *f) {
    const char *key = EM_GGUF_KEY_ALIGNMENT;
    int64_t i = em_gguf_ix_find(&f->kv_index, key, strlen(key));
    f->info.alignment = EM_GGUF_DEFAULT_ALIGNMENT;
    if (i < 0) return EM_OK;
    const em_gguf_value *v = &f->kv[i].val;
    snprintf(ps->what, sizeof ps->what, "key '%s'", key);
    if (v->type != EM_GGUF_U32)
        return fail(ps, f->kv[i].at, EM_EFORMAT, "must be u32, but is %s", em_gguf_type_name(v->type));
    if (v->u == 0 || (v->u & (v->u - 1)))
        return fail(ps, f->kv[i].at, EM_EFORMAT, "alignment %llu is not a power of two",
                    (unsigned long long)v->u);
    f->info.alignment = (uint32_t)v->u;
    return EM_OK;
}

static int parse_shape(parser *ps, uint64_t at, em_gguf_tensor *t) {
    uint32_t n_dims;
    int rc;
    if ((rc = read_u32(ps, "n_dims", &n_dims))) return rc;
    if (n_dims > EM_GGUF_MAX_DIMS)
        return fail(ps, at, EM_EFORMAT, "%u dimensions, more than the %d ggml allows", n_dims,
                    EM_GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t n = 1;
    for (int j = 0; j < EM_GGUF_MAX_DIMS; j++) {
        uint64_t ne = 1;
        if (j < (int)n_dims && (rc = read_u64(ps, "dimension", &ne))) return rc;
        if (ne > (uint64_t)INT64_MAX)
            return fail(ps, at, EM_EFORMAT, "dimension %d is %llu, negative as ggml's int64", j,
                        (unsigned long long)ne);
        t->ne[j] = (int64_t)ne;
        if (em_mul_overflow(n, ne, &n) || n > (uint64_t)INT64_MAX)
            return fail(ps, at, EM_EFORMAT, "the element count overflows int64 at dimension %d", j);
    }
    t->n_elements = n;
    return EM_OK;
}

static int parse_type_and_size(parser *ps, uint64_t at, em_gguf_tensor *t) {
    uint32_t type;
    int rc;
    if ((rc = read_u32(ps, "tensor type", &type))) return rc;
    const em_type_info *ti = type < EM_TYPE_COUNT ? em_type_get((int)type) : NULL;
    if (!ti || ti->block_elems <= 0 || ti->block_bytes <= 0)
        return fail(ps, at, EM_EUNSUPPORTED, "unknown tensor type %u", type);
    t->type = (int)type;
    if (t->ne[0] % ti->block_elems)
        return fail(ps, at, EM_EFORMAT, "ne[0] = %lld is not a multiple of the %s block size %d",
                    (long long)t->ne[0], ti->name, ti->block_elems);
    uint64_t bytes = (uint64_t)(t->ne[0] / ti->block_elems);
    bool over = em_mul_overflow(bytes, (uint64_t)ti->block_bytes, &bytes);
    for (int j = 1; j < EM_GGUF_MAX_DIMS && !over; j++)
        over = em_mul_overflow(bytes, (uint64_t)t->ne[j], &bytes);
    if (over) return fail(ps, at, EM_EFORMAT, "the size in bytes overflows 64 bits");
    t->bytes = bytes;
    return EM_OK;
}

static int parse_tensor_infos(parser *ps, gguf_file *f, uint64_t n) {
    em_gguf_ix names = { 0 };
    int rc;
    f->tensors = em_calloc((size_t)n, sizeof *f->tensors, "GGUF tensors", ps->err);
    f->tnames = em_calloc((size_t)n, sizeof *f->tnames, "GGUF tensor names", ps->err);
    f->tat = em_calloc((size_t)n, sizeof *f->tat, "GGUF tensor offsets", ps->err);
    if (!f->tensors || !f->tnames || !f->tat) return EM_ENOMEM;
    if ((rc = em_gguf_ix_init(&names, n, ps->err))) return rc;
    for (uint64_t i = 0; i < n && !rc; i++) {
        em_gguf_tensor *t = &f->tensors[i];
        em_gguf_str *name = &f->tnames[i];
        uint64_t at = f->tat[i] = ps->pos;
        snprintf(ps->what, sizeof ps->what, "tensor #%llu", (unsigned long long)i);
        if ((rc = read_str(ps, "tensor name", name))) break;
        if (name->len == 0) { rc = fail(ps, at, EM_EFORMAT, "empty tensor name"); break; }
        set_what(ps, "tensor", name->ptr, name->len);
        if (name->len > EM_GGUF_MAX_NAME) {
            rc = fail(ps, at, EM_EFORMAT, "the name is %llu bytes, more than the %d ggml allows",
                      (unsigned long long)name->len, EM_GGUF_MAX_NAME);
            break;
        }
        if (memchr(name->ptr, 0, name->len)) {
            rc = fail(ps, at, EM_EFORMAT, "the name holds a NUL byte");
            break;
        }
        int64_t dup;
        if ((rc = em_gguf_ix_insert(&names, name->ptr, name->len, (int64_t)i, &dup, ps->err)))
            break;
        if (dup >= 0) {
            rc = fail(ps, at, EM_EFORMAT, "duplicate tensor name (first at byte %llu)",
                      (unsigned long long)f->tat[dup]);
            break;
        }
        if ((rc = parse_shape(ps, at, t)) || (rc = parse_type_and_size(ps, at, t))) break;
        rc = read_u64(ps, "tensor data offset", &t->offset);
    }
    em_gguf_ix_free(&names);
    if (!rc) f->n_tensors = (int64_t)n;
    return rc;
}

typedef struct span {
    uint64_t begin, end;
    int64_t idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Places every tensor's data: aligned, inside the file, not overlapping another. */
static int place_tensors(parser *ps, gguf_file *f, uint64_t header_end) {
    uint64_t a = f->info.alignment;
    uint64_t data_offset = em_align_up(header_end, a);
    f->info.data_offset = data_offset;
    if (f->n_tensors == 0) return EM_OK;
    if (data_offset > ps->size && !f->allow_missing) {
        snprintf(ps->what, sizeof ps->what, "data section");
        return fail(ps, header_end, EM_EFORMAT,
                    "starts at byte %llu (alignment %llu), past the end of the file (%llu bytes)",
                    (unsigned long long)data_offset, (unsigned long long)a,
                    (unsigned long long)ps->size);
    }
    /* allow_missing: a data section cut short (or absent) holds what the file has */
    uint64_t data_size = data_offset <= ps->size ? ps->size - data_offset : 0, wanted_end = 0;
    span *spans = em_malloc((size_t)f->n_tensors * sizeof *spans, "GGUF tensor spans", ps->err);
    if (!spans) return EM_ENOMEM;
    int rc = EM_OK;
    for (int64_t i = 0; i < f->n_tensors && !rc; i++) {
        em_gguf_tensor *t = &f->tensors[i];
        uint64_t end = 0;
        set_what(ps, "tensor", f->tnames[i].ptr, f->tnames[i].len);
        if (t->offset % a)
            rc = fail(ps, f->tat[i], EM_EFORMAT, "data offset %llu is not a multiple of the alignment %llu",
                      (unsigned long long)t->offset, (unsigned long long)a);
        else if (em_add_overflow(t->offset, t->bytes, &end) || (end > data_size && !f->allow_missing))
            rc = fail(ps, f->tat[i], EM_EFORMAT,
                      "data at data-section offset %llu, %llu bytes, runs past the end of the file "
                      "(the data section holds %llu bytes from byte %llu)",
                      (unsigned long long)t->offset, (unsigned long long)t->bytes,
                      (unsigned long long)data_size, (unsigned long long)data_offset);
        if (rc) break;
        if (end > wanted_end) wanted_end = end;
        t->missing = end > data_size;
        if (em_add_overflow(data_offset, t->offset, &t->file_offset)) t->file_offset = UINT64_MAX;
        t->data = t->missing ? NULL : ps->b + t->file_offset;
        spans[i] = (span){ t->offset, t->offset + t->bytes, i };
    }
    f->info.missing_bytes = wanted_end > data_size ? wanted_end - data_size : 0;
    if (!rc) {
        qsort(spans, (size_t)f->n_tensors, sizeof *spans, cmp_span);
        int64_t prev = -1;
        for (int64_t k = 0; k < f->n_tensors && !rc; k++) {
            if (spans[k].begin == spans[k].end) continue; /* empty tensors overlap nothing */
            if (prev >= 0 && spans[prev].end > spans[k].begin) {
                int64_t i = spans[k].idx, j = spans[prev].idx;
                char other[112];
                render_name(other, sizeof other, f->tnames[j].ptr, f->tnames[j].len);
                set_what(ps, "tensor", f->tnames[i].ptr, f->tnames[i].len);
                rc = fail(ps, f->tat[i], EM_EFORMAT,
                          "data [%llu, %llu) overlaps tensor '%s' at [%llu, %llu)",
                          (unsigned long long)spans[k].begin, (unsigned long long)spans[k].end,
                          other, (unsigned long long)spans[prev].begin,
                          (unsigned long long)spans[prev].end);
            }
            prev = k;
        }
    }
    free(spans);
    return rc;
}

/* NUL-terminated copies of keys and tensor names, in one block. */
static int copy_names(parser *ps, gguf_file *f) {
    uint64_t total = 1;
    for (int64_t i = 0; i < f->n_kv; i++) total += f->kv[i].key.len + 1;
    for (int64_t i = 0; i < f->n_tensors; i++) total += f->tnames[i].len + 1;
    f->names = em_malloc((size_t)total, "GGUF names", ps->err);
    if (!f->names) return EM_ENOMEM;
    char *p = f->names;
    for (int64_t i = 0; i < f->n_kv; i++) {
        memcpy(p, f->kv[i].key.ptr, f->kv[i].key.len);
        p[f->kv[i].key.len] = 0;
        f->kv[i].ckey = p;
        p += f->kv[i].key.len + 1;
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        memcpy(p, f->tnames[i].ptr, f->tnames[i].len);
        p[f->tnames[i].len] = 0;
        f->tensors[i].name = p;
        p += f->tnames[i].len + 1;
    }
    return EM_OK;
}

static void file_free(gguf_file *f) {
    for (int64_t i = 0; i < f->n_kv; i++) {
        if (f->kv[i].val.type == EM_GGUF_ARRAY && f->kv[i].val.arr) {
            em_gguf_arr *a = (em_gguf_arr *)f->kv[i].val.arr;
            arr_free(a);
            free(a);
        }
    }
    free(f->kv);
    em_gguf_ix_free(&f->kv_index);
    free(f->tensors);
    free(f->tnames);
    free(f->tat);
    free(f->names);
    em_mmap_close(&f->map);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Parses bytes[0, size) into f (which owns path and, if set, the mapping). */
static int file_parse(gguf_file *f, em_err *err) {
    parser ps = { .b = f->bytes, .size = f->size, .path = f->path, .err = err };
    uint64_t n_tensors = 0, n_kv = 0;
    int rc;
    f->info.path = f->path;
    f->info.file_size = f->size;
    if ((rc = parse_header(&ps, f, &n_tensors, &n_kv))) return rc;
    if ((rc = parse_kvs(&ps, f, n_kv))) return rc;
    if ((rc = read_alignment(&ps, f))) return rc;
    if ((rc = parse_tensor_infos(&ps, f, n_tensors))) return rc;
    if ((rc = place_tensors(&ps, f, ps.pos))) return rc;
    if ((rc = copy_names(&ps, f))) return rc;
    /* arrays were parsed before their key had a stable C string */
    for (int64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].val.type == EM_GGUF_ARRAY)
            arr_set_key((em_gguf_arr *)f->kv[i].val.arr, f->kv[i].ckey);
    f->info.n_tensors = f->n_tensors;
    return EM_OK;
}

static int file_open(gguf_file *f, const char *path, bool allow_missing, bool guard, em_err *err) {
    memset(f, 0, sizeof *f);
    f->allow_missing = allow_missing;
    f->guard = guard;
    f->path = em_strdup(path, err);
    if (!f->path) return EM_ENOMEM;
    int rc = guard ? em_mmap_open_guarded(&f->map, path, err) : em_mmap_open(&f->map, path, err);
    if (!rc) {
        f->bytes = f->map.data;
        f->size = f->map.size;
        rc = file_parse(f, err);
    }
    if (rc) file_free(f);
    return rc;
}

static const em_gguf_value *file_value(const gguf_file *f, const char *key) {
    int64_t i = em_gguf_ix_find(&f->kv_index, key, strlen(key));
    return i < 0 ? NULL : &f->kv[i].val;
}

/* ---- the model ---------------------------------------------------------------------- */

struct em_gguf {
    char *path;
    int n_shards;
    gguf_file *files;
    int64_t n_tensors;
    em_gguf_tensor *tensors;
    em_gguf_ix tensor_index;
};

void em_gguf_close(em_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_shards; i++) file_free(&g->files[i]);
    free(g->files);
    free(g->tensors);
    em_gguf_ix_free(&g->tensor_index);
    free(g->path);
    free(g);
}

/* Takes ownership of files[0..n) (parsed) and joins their tensors. */
static int model_assemble(em_gguf *g, em_err *err) {
    int64_t total = 0;
    for (int s = 0; s < g->n_shards; s++) total += g->files[s].n_tensors;
    g->tensors = em_calloc((size_t)total, sizeof *g->tensors, "GGUF tensors", err);
    if (!g->tensors) return EM_ENOMEM;
    int rc = em_gguf_ix_init(&g->tensor_index, (uint64_t)total, err);
    if (rc) return rc;
    for (int s = 0; s < g->n_shards; s++) {
        gguf_file *f = &g->files[s];
        for (int64_t i = 0; i < f->n_tensors; i++) {
            em_gguf_tensor *t = &g->tensors[g->n_tensors];
            *t = f->tensors[i];
            t->shard = s;
            int64_t dup;
            rc = em_gguf_ix_insert(&g->tensor_index, t->name, strlen(t->name), g->n_tensors, &dup, err);
            if (rc) return rc;
            if (dup >= 0)
                return em_err_set(err, EM_EFORMAT, "%s: tensor '%s' is in both %s and %s",
                                  g->path, t->name, g->files[g->tensors[dup].shard].path, f->path);
            g->n_tensors++;
        }
        free(f->tensors);
        free(f->tnames);
        free(f->tat);
        f->tensors = NULL;
        f->tnames = NULL;
        f->tat = NULL;
    }
    return EM_OK;
}

static int model_new(em_gguf **out, const char *path, int n_shards, em_err *err) {
    em_gguf *g = em_calloc(1, sizeof *g, "GGUF model", err);
    if (!g) return EM_ENOMEM;
    g->path = em_strdup(path, err);
    g->files = em_calloc((size_t)n_shards, sizeof *g->files, "GGUF shards", err);
    if (!g->path || !g->files) {
        em_gguf_close(g);
        return EM_ENOMEM;
    }
    *out = g;
    return EM_OK;
}

/* A model of one already-parsed file (moved into the model). */
static int model_of_file(em_gguf **out, const char *path, gguf_file *f, em_err *err) {
    em_gguf *g;
    int rc = model_new(&g, path, 1, err);
    if (rc) {
        file_free(f);
        return rc;
    }
    g->files[0] = *f;
    g->n_shards = 1;
    memset(f, 0, sizeof *f);
    if ((rc = model_assemble(g, err))) {
        em_gguf_close(g);
        return rc;
    }
    *out = g;
    return EM_OK;
}

int em_gguf_open_single(em_gguf **out, const char *path, em_err *err) {
    gguf_file f;
    *out = NULL;
    int rc = file_open(&f, path, false, false, err);
    return rc ? rc : model_of_file(out, path, &f, err);
}

int em_gguf_open_mem(em_gguf **out, const void *data, size_t size, const char *name,
                     em_err *err) {
    gguf_file f = { 0 };
    *out = NULL;
    f.path = em_strdup(name, err);
    if (!f.path) return EM_ENOMEM;
    f.bytes = data;
    f.size = size;
    int rc = file_parse(&f, err);
    if (rc) {
        file_free(&f);
        return rc;
    }
    return model_of_file(out, name, &f, err);
}

/* ---- split models -------------------------------------------------------------------- */

typedef struct split_keys {
    bool present;      /* split.count is there */
    uint32_t no, count;
    bool has_total;
    int64_t total;
} split_keys;

static int read_split_keys(const gguf_file *f, split_keys *sk, em_err *err) {
    const em_gguf_value *no = file_value(f, EM_GGUF_KEY_SPLIT_NO);
    const em_gguf_value *count = file_value(f, EM_GGUF_KEY_SPLIT_COUNT);
    const em_gguf_value *total = file_value(f, EM_GGUF_KEY_SPLIT_TENSORS);
    memset(sk, 0, sizeof *sk);
    if (!count) return EM_OK;
    sk->present = true;
    if (count->type != EM_GGUF_U16)
        return em_err_set(err, EM_EFORMAT, "%s: key '%s' must be u16, but is %s", f->path,
                          EM_GGUF_KEY_SPLIT_COUNT, em_gguf_type_name(count->type));
    if (!no || no->type != EM_GGUF_U16)
        return em_err_set(err, EM_EFORMAT, "%s: key '%s' must be a u16 (it is %s)", f->path,
                          EM_GGUF_KEY_SPLIT_NO, no ? em_gguf_type_name(no->type) : "missing");
    sk->no = (uint32_t)no->u;
    sk->count = (uint32_t)count->u;
    if (sk->count == 0 || sk->no >= sk->count)
        return em_err_set(err, EM_EFORMAT, "%s: split.no %u does not fit split.count %u", f->path,
                          sk->no, sk->count);
    if (total) {
        if (total->type != EM_GGUF_I32 || total->i < 0)
            return em_err_set(err, EM_EFORMAT, "%s: key '%s' must be a non-negative i32", f->path,
                              EM_GGUF_KEY_SPLIT_TENSORS);
        sk->has_total = true;
        sk->total = total->i;
    }
    return EM_OK;
}

#define SPLIT_SUFFIX_LEN 20 /* "-00001-of-00014.gguf" */

/* Parses "-NNNNN-of-MMMMM.gguf" at the end of path; returns the prefix length or -1. */
static long split_name(const char *path, unsigned *no1, unsigned *count) {
    size_t n = strlen(path);
    if (n < SPLIT_SUFFIX_LEN) return -1;
    const char *s = path + n - SPLIT_SUFFIX_LEN;
    static const char pattern[] = "-ddddd-of-ddddd.gguf";
    unsigned a = 0, b = 0;
    for (int i = 0; i < SPLIT_SUFFIX_LEN; i++) {
        if (pattern[i] != 'd') {
            if (s[i] != pattern[i]) return -1;
        } else if (s[i] < '0' || s[i] > '9') {
            return -1;
        } else if (i < 6) {
            a = a * 10 + (unsigned)(s[i] - '0');
        } else {
            b = b * 10 + (unsigned)(s[i] - '0');
        }
    }
    *no1 = a;
    *count = b;
    return (long)(n - SPLIT_SUFFIX_LEN);
}

static int check_shard(const gguf_file *f, const gguf_file *first, const split_keys *want,
                       uint32_t i, em_err *err) {
    split_keys sk;
    int rc = read_split_keys(f, &sk, err);
    if (rc) return rc;
    if (!sk.present)
        return em_err_set(err, EM_EFORMAT, "%s: not a shard (no split.count), but %s says it is "
                          "shard %u of %u", f->path, first->path, i + 1, want->count);
    if (sk.no != i || sk.count != want->count)
        return em_err_set(err, EM_EFORMAT,
                          "%s: split.no %u / split.count %u, but its name makes it split.no %u of %u "
                          "(a shard of another model?)",
                          f->path, sk.no, sk.count, i, want->count);
    if (sk.has_total && sk.total != want->total)
        return em_err_set(err, EM_EFORMAT,
                          "%s: split.tensors.count %lld, but %s says %lld (a shard of another model?)",
                          f->path, (long long)sk.total, first->path, (long long)want->total);
    return EM_OK;
}

static int open_split(em_gguf **out, const char *path, gguf_file *given, const split_keys *sk,
                      em_err *err) {
    unsigned no1, count;
    long prefix = split_name(path, &no1, &count);
    if (prefix < 0 || no1 != sk->no + 1 || count != sk->count) {
        em_err_set(err, EM_EFORMAT,
                   "%s: shard %u of %u of a split model, but its name does not end in "
                   "-%05u-of-%05u.gguf, so the other shards cannot be found",
                   path, sk->no + 1, sk->count, sk->no + 1, sk->count);
        file_free(given);
        return EM_EFORMAT;
    }
    em_gguf *g;
    int rc = model_new(&g, path, (int)sk->count, err);
    if (rc) {
        file_free(given);
        return rc;
    }
    g->files[sk->no] = *given;
    g->n_shards = (int)sk->count; /* unopened shards are zeroed, which file_free accepts */
    size_t cap = (size_t)prefix + SPLIT_SUFFIX_LEN + 1;
    char *name = em_malloc(cap, "shard path", err);
    if (!name) rc = EM_ENOMEM;
    for (uint32_t i = 0; i < sk->count && !rc; i++) {
        if (i == sk->no) continue;
        snprintf(name, cap, "%.*s-%05u-of-%05u.gguf", (int)prefix, path, i + 1, sk->count);
        if (!em_file_exists(name))
            rc = em_err_set(err, EM_ENOTFOUND, "%s: missing shard %s (shard %u of %u)", path, name,
                            i + 1, sk->count);
        else
            rc = file_open(&g->files[i], name, given->allow_missing, given->guard, err);
    }
    free(name);
    /* shard 0 carries the metadata, split.tensors.count included */
    split_keys want = *sk;
    if (!rc && (rc = read_split_keys(&g->files[0], &want, err)) == 0 && !want.has_total)
        rc = em_err_set(err, EM_EFORMAT, "%s: shard 1 of a split model lacks key '%s'",
                        g->files[0].path, EM_GGUF_KEY_SPLIT_TENSORS);
    for (uint32_t i = 0; i < sk->count && !rc; i++)
        rc = check_shard(&g->files[i], &g->files[0], &want, i, err);
    int64_t sum = 0;
    for (uint32_t i = 0; i < sk->count && !rc; i++) sum += g->files[i].n_tensors;
    if (!rc && sum != want.total)
        rc = em_err_set(err, EM_EFORMAT,
                        "%s: the %u shards hold %lld tensors, but split.tensors.count says %lld",
                        path, sk->count, (long long)sum, (long long)want.total);
    if (!rc) rc = model_assemble(g, err);
    if (rc) {
        em_gguf_close(g);
        return rc;
    }
    *out = g;
    return EM_OK;
}

int em_gguf_open(em_gguf **out, const char *path, em_err *err) {
    return em_gguf_open_ex(out, path, NULL, err);
}

uint64_t em_gguf_missing(const em_gguf *g, int64_t *n, const em_gguf_tensor **first) {
    uint64_t bytes = 0;
    int64_t count = 0;
    const em_gguf_tensor *f = NULL;
    for (int s = 0; s < g->n_shards; s++) bytes += g->files[s].info.missing_bytes;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].missing) {
            if (!f) f = &g->tensors[i];
            count++;
        }
    if (n) *n = count;
    if (first) *first = f;
    return bytes;
}

int em_gguf_open_ex(em_gguf **out, const char *path, const em_gguf_open_opts *opts, em_err *err) {
    gguf_file f;
    split_keys sk;
    *out = NULL;
    int rc = file_open(&f, path, opts && opts->allow_missing_data, opts && opts->guard_mapping, err);
    if (rc) return rc;
    if ((rc = read_split_keys(&f, &sk, err))) {
        file_free(&f);
        return rc;
    }
    if (!sk.present || sk.count == 1) {
        if (sk.present && sk.has_total && sk.total != f.n_tensors) {
            rc = em_err_set(err, EM_EFORMAT, "%s: holds %lld tensors, but split.tensors.count says %lld",
                            path, (long long)f.n_tensors, (long long)sk.total);
            file_free(&f);
            return rc;
        }
        return model_of_file(out, path, &f, err);
    }
    return open_split(out, path, &f, &sk, err);
}

/* ---- model accessors ----------------------------------------------------------------- */

const char *em_gguf_path(const em_gguf *g) { return g->path; }
uint32_t em_gguf_version(const em_gguf *g) { return g->files[0].info.version; }
uint32_t em_gguf_alignment(const em_gguf *g) { return g->files[0].info.alignment; }
int em_gguf_n_shards(const em_gguf *g) { return g->n_shards; }

const em_gguf_shard *em_gguf_shard_at(const em_gguf *g, int i) {
    assert(i >= 0 && i < g->n_shards);
    return &g->files[i].info;
}

int64_t em_gguf_n_keys(const em_gguf *g) { return g->files[0].n_kv; }

const char *em_gguf_key(const em_gguf *g, int64_t i) {
    assert(i >= 0 && i < g->files[0].n_kv);
    return g->files[0].kv[i].ckey;
}

em_gguf_value em_gguf_value_at(const em_gguf *g, int64_t i) {
    assert(i >= 0 && i < g->files[0].n_kv);
    return g->files[0].kv[i].val;
}

int64_t em_gguf_find_key(const em_gguf *g, const char *key) {
    return em_gguf_ix_find(&g->files[0].kv_index, key, strlen(key));
}

/* "u32", or "array of str" for arrays. */
static const char *describe_type(const em_gguf_value *v, char *buf, size_t cap) {
    if (v->type != EM_GGUF_ARRAY) return em_gguf_type_name(v->type);
    snprintf(buf, cap, "array of %s", em_gguf_type_name(v->arr->elem_type));
    return buf;
}

/* Finds key; want < 0 accepts any type. */
static int lookup(const em_gguf *g, const char *key, int want, em_gguf_value *v, em_err *err) {
    int64_t i = em_gguf_find_key(g, key);
    if (i < 0) return em_err_set(err, EM_ENOTFOUND, "%s: key '%s' not found", g->path, key);
    *v = em_gguf_value_at(g, i);
    if (want >= 0 && v->type != want) {
        char buf[32];
        return em_err_set(err, EM_EFORMAT, "%s: key '%s' is %s, expected %s", g->path, key,
                          describe_type(v, buf, sizeof buf), em_gguf_type_name(want));
    }
    return EM_OK;
}

#define DEFINE_GETTER(suffix, ctype, TYPE, field)                                                \
    int em_gguf_get_##suffix(const em_gguf *g, const char *key, ctype *out, em_err *err) {        \
        em_gguf_value v;                                                                          \
        int rc = lookup(g, key, TYPE, &v, err);                                                   \
        if (!rc) *out = v.field;                                                                  \
        return rc;                                                                                \
    }

EM_GGUF_FIXED_TYPES(DEFINE_GETTER)
DEFINE_GETTER(str, em_gguf_str, EM_GGUF_STR, str)
DEFINE_GETTER(arr, const em_gguf_arr *, EM_GGUF_ARRAY, arr)

int em_gguf_get_cstr(const em_gguf *g, const char *key, char *buf, size_t cap, em_err *err) {
    em_gguf_value v;
    int rc = lookup(g, key, EM_GGUF_STR, &v, err);
    if (rc) return rc;
    if (memchr(v.str.ptr, 0, v.str.len))
        return em_err_set(err, EM_EFORMAT, "%s: key '%s' holds a NUL byte", g->path, key);
    if (v.str.len >= cap)
        return em_err_set(err, EM_EOVERFLOW, "%s: key '%s' is %llu bytes, more than %zu", g->path,
                          key, (unsigned long long)v.str.len, cap ? cap - 1 : 0);
    memcpy(buf, v.str.ptr, v.str.len);
    buf[v.str.len] = 0;
    return EM_OK;
}

/* Any integer value as int64; what names it in messages. */
static int value_to_int(const em_gguf_value *v, int64_t *out, const char *path, const char *what,
                        em_err *err) {
    if (!type_is_int(v->type)) {
        char buf[32];
        return em_err_set(err, EM_EFORMAT, "%s: %s is %s, expected an integer", path, what,
                          describe_type(v, buf, sizeof buf));
    }
    bool is_unsigned = v->type == EM_GGUF_U8 || v->type == EM_GGUF_U16 ||
                       v->type == EM_GGUF_U32 || v->type == EM_GGUF_U64;
    if (is_unsigned && v->u > (uint64_t)INT64_MAX)
        return em_err_set(err, EM_EOVERFLOW, "%s: %s is %llu, more than int64 holds", path, what,
                          (unsigned long long)v->u);
    *out = is_unsigned ? (int64_t)v->u : v->i;
    return EM_OK;
}

int em_gguf_get_int(const em_gguf *g, const char *key, int64_t *out, em_err *err) {
    em_gguf_value v;
    char what[160];
    int rc = lookup(g, key, -1, &v, err);
    if (rc) return rc;
    snprintf(what, sizeof what, "key '%s'", key);
    return value_to_int(&v, out, g->path, what, err);
}

int em_gguf_get_float(const em_gguf *g, const char *key, double *out, em_err *err) {
    em_gguf_value v;
    int rc = lookup(g, key, -1, &v, err);
    if (rc) return rc;
    if (v.type == EM_GGUF_F32) *out = v.f32;
    else if (v.type == EM_GGUF_F64) *out = v.f64;
    else {
        char buf[32];
        return em_err_set(err, EM_EFORMAT, "%s: key '%s' is %s, expected f32 or f64", g->path, key,
                          describe_type(&v, buf, sizeof buf));
    }
    return EM_OK;
}

/* ---- arrays -------------------------------------------------------------------------- */

int em_gguf_arr_type(const em_gguf_arr *a) { return a->elem_type; }
uint64_t em_gguf_arr_count(const em_gguf_arr *a) { return a->count; }
const char *em_gguf_arr_key(const em_gguf_arr *a) { return a->key ? a->key : "?"; }

em_gguf_value em_gguf_arr_at(const em_gguf_arr *a, uint64_t i) {
    assert(i < a->count);
    if (a->elem_type == EM_GGUF_STR) {
        const uint8_t *p = a->data + a->str_off[i];
        return (em_gguf_value){ .type = EM_GGUF_STR,
                                .str = { (const char *)p + 8, em_gguf_ld64(p) } };
    }
    if (a->elem_type == EM_GGUF_ARRAY) return (em_gguf_value){ .type = EM_GGUF_ARRAY, .arr = &a->sub[i] };
    return decode_fixed(a->elem_type, a->data + i * (uint64_t)k_type_sizes[a->elem_type]);
}

int em_gguf_arr_get_int(const em_gguf_arr *a, uint64_t i, int64_t *out, em_err *err) {
    char what[160];
    snprintf(what, sizeof what, "key '%s' element %llu", em_gguf_arr_key(a), (unsigned long long)i);
    if (i >= a->count)
        return em_err_set(err, EM_EINVAL, "%s is past the end (%llu elements)", what,
                          (unsigned long long)a->count);
    em_gguf_value v = em_gguf_arr_at(a, i);
    return value_to_int(&v, out, "GGUF", what, err);
}

int em_gguf_arr_copy(const em_gguf_arr *a, int elem_type, void *dst, uint64_t n, em_err *err) {
    if (a->elem_type != elem_type || k_type_sizes[a->elem_type] == 0)
        return em_err_set(err, EM_EFORMAT, "key '%s' is an array of %s, expected %s",
                          em_gguf_arr_key(a), em_gguf_type_name(a->elem_type),
                          em_gguf_type_name(elem_type));
    if (n != a->count)
        return em_err_set(err, EM_EINVAL, "key '%s' has %llu elements, the caller expects %llu",
                          em_gguf_arr_key(a), (unsigned long long)a->count, (unsigned long long)n);
    if (elem_type == EM_GGUF_BOOL) {
        bool *b = dst;
        for (uint64_t i = 0; i < n; i++) b[i] = a->data[i] != 0;
    } else if (n) {
        memcpy(dst, a->data, (size_t)n * (size_t)k_type_sizes[elem_type]);
    }
    return EM_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

int64_t em_gguf_n_tensors(const em_gguf *g) { return g->n_tensors; }

const em_gguf_tensor *em_gguf_tensor_at(const em_gguf *g, int64_t i) {
    assert(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}

const em_gguf_tensor *em_gguf_find_tensor(const em_gguf *g, const char *name) {
    int64_t i = em_gguf_ix_find(&g->tensor_index, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

int em_gguf_get_tensor(const em_gguf *g, const char *name, const em_gguf_tensor **out,
                       em_err *err) {
    *out = em_gguf_find_tensor(g, name);
    if (!*out) return em_err_set(err, EM_ENOTFOUND, "%s: no tensor named '%s'", g->path, name);
    return EM_OK;
}

/* Tests for format/safetensors: files written byte by byte here (header JSON spelled out,
 * data bytes chosen by hand), single files, sharded index sets and folders, every kind of
 * malformed input with its status and message, and the 8-bit float decoders against an
 * independent double-precision computation of the formats' definitions. */
#include "testutil.h"

#include "format/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- building files --------------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

/* 8-byte little-endian header length, the header text, then the data bytes. */
static buf st_bytes(const char *header, const void *data, size_t n_data) {
    size_t h = strlen(header);
    buf b = { malloc(8 + h + n_data + 1), 8 + h + n_data };
    assert_non_null(b.p);
    for (int i = 0; i < 8; i++) b.p[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b.p + 8, header, h);
    if (n_data) memcpy(b.p + 8 + h, data, n_data);
    return b;
}

static void st_write(const char *path, const char *header, const void *data, size_t n_data) {
    buf b = st_bytes(header, data, n_data);
    em_test_write(path, b.p, b.n);
    free(b.p);
}

static void write_text(const char *path, const char *text) {
    em_test_write(path, text, strlen(text));
}

static void make_dir(const char *path) {
    if (mkdir(path, 0755) != 0) fail_msg("mkdir %s failed", path);
}

/* ---- round trip: every dtype ------------------------------------------------------------ */

/* Data laid out in this order; the header lists the tensors in a different order on
 * purpose (the format allows any key order; tensors are sorted by offset). */
typedef struct dt_case {
    const char *name, *dtype, *shape;
    size_t n_bytes;
    const uint8_t *bytes;
    size_t n;
    float want[4];
} dt_case;

static const uint8_t k_f32[] = {
    0, 0, 0xc0, 0x3f, 0, 0, 0x10, 0xc0, 0x00, 0x00, 0x80, 0x7f
}; /* 1.5, -2.25, inf */
static const uint8_t k_f16[] = {
    0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00
};                                                               /* 1, -2, 65504, 2^-24 */
static const uint8_t k_bf16[] = { 0x80, 0x3f, 0xa0, 0xc0 };      /* 1, -5 */
static const uint8_t k_e4m3[] = { 0x38, 0x7e, 0x01, 0xb8 };      /* 1, 448, 2^-9, -1 */
static const uint8_t k_e5m2[] = { 0x3c, 0x01, 0xc6 };            /* 1, 2^-16, -6 */
static const uint8_t k_f64[] = { 0, 0, 0, 0, 0, 0, 0x12, 0x40 }; /* 4.5 */
static const uint8_t k_i64[] = { 0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0,    0,    0,    0,    0,    1,    0,    0 }; /* -3, 2^40 */
static const uint8_t k_i32[] = { 0xf9, 0xff, 0xff, 0xff };                      /* -7 */
static const uint8_t k_i16[] = { 0xd4, 0xfe };                                  /* -300 */
static const uint8_t k_i8[] = { 0x80, 0x7f };                                   /* -128, 127 */
static const uint8_t k_u64[] = { 0x35, 0x1c, 0xdc, 0xdf, 0x02, 0, 0, 0 };       /* 12345678901 */
static const uint8_t k_u32[] = { 0x00, 0x28, 0x6b, 0xee };                      /* 4000000000 */
static const uint8_t k_u16[] = { 0xff, 0xff };                                  /* 65535 */
static const uint8_t k_u8[] = { 0xff, 0x00, 0x07 };                             /* 255, 0, 7 */
static const uint8_t k_bool[] = { 0, 1, 2 };                                    /* 0, 1, 1 */
static const uint8_t k_e8m0[] = { 127, 128, 0, 254 }; /* 1, 2, 2^-127, 2^127 */

static const dt_case k_cases[] = {
    { "w.f32", "F32", "[3]", 12, k_f32, 3, { 1.5f, -2.25f, INFINITY } },
    { "w.f16", "F16", "[2, 2]", 8, k_f16, 4, { 1.0f, -2.0f, 65504.0f, 0x1p-24f } },
    { "w.bf16", "BF16", "[1, 2]", 4, k_bf16, 2, { 1.0f, -5.0f } },
    { "w.e4m3", "F8_E4M3", "[4]", 4, k_e4m3, 4, { 1.0f, 448.0f, 0x1p-9f, -1.0f } },
    { "w.e5m2", "F8_E5M2", "[3]", 3, k_e5m2, 3, { 1.0f, 0x1p-16f, -6.0f } },
    { "w.f64", "F64", "[]", 8, k_f64, 1, { 4.5f } },
    { "w.i64", "I64", "[2]", 16, k_i64, 2, { -3.0f, 1099511627776.0f } },
    { "w.i32", "I32", "[1]", 4, k_i32, 1, { -7.0f } },
    { "w.i16", "I16", "[1]", 2, k_i16, 1, { -300.0f } },
    { "w.i8", "I8", "[2]", 2, k_i8, 2, { -128.0f, 127.0f } },
    { "w.u64", "U64", "[1]", 8, k_u64, 1, { 12345678901.0f } },
    { "w.u32", "U32", "[1]", 4, k_u32, 1, { 4000000000.0f } },
    { "w.u16", "U16", "[1]", 2, k_u16, 1, { 65535.0f } },
    { "w.u8", "U8", "[3]", 3, k_u8, 3, { 255.0f, 0.0f, 7.0f } },
    { "w.bool", "BOOL", "[3, 1]", 3, k_bool, 3, { 0.0f, 1.0f, 1.0f } },
    { "w.e8m0", "F8_E8M0", "[4]", 4, k_e8m0, 4, { 1.0f, 2.0f, 0x1p-127f, 0x1p127f } },
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

/* Header for k_cases plus an empty tensor "w.empty" [0, 5] at the end; keys written from
 * the last case to the first. */
static char *all_dtypes_header(size_t *data_len) {
    size_t off[N_CASES + 1], at = 0;
    for (size_t i = 0; i < N_CASES; i++) off[i] = at, at += k_cases[i].n_bytes;
    off[N_CASES] = at;
    *data_len = at;
    char *h = malloc(8192);
    assert_non_null(h);
    size_t used = (size_t)sprintf(h,
                                  "{\"w.empty\":{\"dtype\":\"F32\",\"shape\":[0,5],"
                                  "\"data_offsets\":[%zu,%zu]},",
                                  at, at);
    for (size_t k = N_CASES; k-- > 0;)
        used += (size_t)sprintf(
            h + used, "\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]},",
            k_cases[k].name, k_cases[k].dtype, k_cases[k].shape, off[k],
            off[k] + k_cases[k].n_bytes);
    sprintf(h + used, "\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\"}}  ");
    return h;
}

static uint8_t *all_dtypes_data(size_t len) {
    uint8_t *d = malloc(len ? len : 1);
    assert_non_null(d);
    size_t at = 0;
    for (size_t i = 0; i < N_CASES; i++)
        memcpy(d + at, k_cases[i].bytes, k_cases[i].n_bytes), at += k_cases[i].n_bytes;
    return d;
}

static void check_all_dtypes(const em_safetensors *st, const char *path, uint64_t data_start) {
    assert_int_equal(em_safetensors_count(st), N_CASES + 1);
    assert_int_equal(em_safetensors_shard_count(st), 1);
    assert_string_equal(em_safetensors_shard_path(st, 0), path);
    uint64_t at = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        const dt_case *c = &k_cases[i];
        const em_safetensors_tensor *t = em_safetensors_at(st, i); /* sorted by offset */
        assert_non_null(t);
        assert_string_equal(t->name, c->name);
        assert_ptr_equal(em_safetensors_find(st, c->name), t);
        assert_string_equal(em_st_dtype_name(t->dtype), c->dtype);
        assert_int_equal(t->n_elements, c->n);
        assert_int_equal(t->n_bytes, c->n_bytes);
        assert_int_equal(t->file_offset, data_start + at);
        assert_int_equal(t->shard, 0);
        assert_string_equal(t->path, path);
        assert_memory_equal(t->data, c->bytes, c->n_bytes);
        float got[4] = { 0 };
        em_err err = { 0 };
        assert_int_equal(em_safetensors_to_f32(t, got, 4, &err), EM_OK);
        for (size_t e = 0; e < c->n; e++) {
            if (isinf(c->want[e]))
                assert_true(isinf(got[e]) && got[e] > 0);
            else
                assert_true(got[e] == c->want[e]);
        }
        at += c->n_bytes;
    }
    const em_safetensors_tensor *f16 = em_safetensors_find(st, "w.f16");
    assert_int_equal(f16->n_dims, 2);
    assert_int_equal(f16->shape[0], 2);
    assert_int_equal(f16->shape[1], 2);
    const em_safetensors_tensor *scalar = em_safetensors_find(st, "w.f64");
    assert_int_equal(scalar->n_dims, 0);
    const em_safetensors_tensor *empty = em_safetensors_find(st, "w.empty");
    assert_non_null(empty);
    assert_int_equal(empty->n_elements, 0);
    assert_int_equal(empty->n_bytes, 0);
    assert_int_equal(empty->shape[0], 0);
    assert_int_equal(empty->shape[1], 5);
    assert_null(em_safetensors_find(st, "w.missing"));
    assert_null(em_safetensors_at(st, N_CASES + 1));
    assert_int_equal(em_safetensors_metadata_count(st), 2);
    assert_string_equal(em_safetensors_metadata_get(st, "format"), "pt");
    assert_string_equal(em_safetensors_metadata_get(st, "note"), "caf\xc3\xa9");
    assert_null(em_safetensors_metadata_get(st, "missing"));
    const char *k, *v;
    int shard = -1;
    assert_true(em_safetensors_metadata_at(st, 0, &k, &v, &shard));
    assert_string_equal(k, "format");
    assert_int_equal(shard, 0);
    assert_false(em_safetensors_metadata_at(st, 2, &k, &v, &shard));

    em_err err = { 0 };
    const em_safetensors_tensor *t;
    assert_int_equal(em_safetensors_get(st, "w.nope", &t, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "w.nope"));
    assert_int_equal(em_safetensors_get(st, "w.i8", &t, &err), EM_OK);
    assert_string_equal(t->name, "w.i8");
}

static void test_all_dtypes_file_and_memory(void **state) {
    (void)state;
    size_t len;
    char *header = all_dtypes_header(&len);
    uint8_t *data = all_dtypes_data(len);
    const char *path = em_test_path("all.safetensors");
    st_write(path, header, data, len);

    em_safetensors *st = NULL;
    em_err err = { 0 };
    assert_int_equal(em_safetensors_open(&st, path, &err), EM_OK);
    check_all_dtypes(st, path, 8 + strlen(header));
    assert_string_equal(em_safetensors_path(st), path);
    em_safetensors_close(st);

    buf b = st_bytes(header, data, len);
    assert_int_equal(em_safetensors_open_memory(&st, b.p, b.n, "mem", &err), EM_OK);
    check_all_dtypes(st, "mem", 8 + strlen(header));
    em_safetensors_close(st);
    free(b.p);
    free(header);
    free(data);
}

static void test_empty_file_and_range(void **state) {
    (void)state;
    /* The crate's own serialization of an empty dict: "{}" padded with spaces to 8. */
    static const uint8_t empty[] = {
        8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '
    };
    em_safetensors *st;
    em_err err = { 0 };
    assert_int_equal(em_safetensors_open_memory(&st, empty, sizeof empty, "empty", &err), EM_OK);
    assert_int_equal(em_safetensors_count(st), 0);
    assert_null(em_safetensors_find(st, "x"));
    em_safetensors_close(st);

    float vals[6] = { 0.5f, 1, 2, 3, 4, 5 };
    buf b = st_bytes("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", vals,
                     sizeof vals);
    assert_int_equal(em_safetensors_open_memory(&st, b.p, b.n, "r", &err), EM_OK);
    const em_safetensors_tensor *t = em_safetensors_find(st, "x");
    float out[3];
    assert_int_equal(em_safetensors_to_f32_range(t, 2, 3, out, &err), EM_OK);
    assert_true(out[0] == 2 && out[1] == 3 && out[2] == 4);
    assert_int_equal(em_safetensors_to_f32_range(t, 4, 3, out, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "'x'"));
    assert_int_equal(em_safetensors_to_f32_range(t, UINT64_MAX, 2, out, &err), EM_EINVAL);
    assert_int_equal(em_safetensors_to_f32(t, out, 3, &err), EM_EINVAL);
    em_safetensors_close(st);
    free(b.p);
}

/* ---- malformed single files ------------------------------------------------------------- */

typedef struct bad_case {
    const char *what;
    const char *header; /* NULL: use raw */
    size_t data_len;    /* zero bytes of data after the header */
    int code;
    const char *needles[3];
} bad_case;

static const bad_case k_bad[] = {
    { "bad JSON", "{\"a\":{\"dtype\":", 0, EM_EFORMAT, { "header JSON at file offset", NULL } },
    { "header not object", "[1,2]", 0, EM_EFORMAT, { "not an object", NULL } },
    { "offsets past end",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
      8,
      EM_EFORMAT,
      { "'t'", "past the end", "[0, 16)" } },
    { "size mismatch",
      "{\"t\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
      12,
      EM_EFORMAT,
      { "'t'", "hold 12 bytes but shape [2, 2] of F32 needs 16", "file offset" } },
    { "overlap",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
      12,
      EM_EFORMAT,
      { "'b'", "overlap tensor 'a'", NULL } },
    { "gap",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
      12,
      EM_EFORMAT,
      { "'b'", "gap of 4 bytes after tensor 'a'", NULL } },
    { "first not at 0",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
      6,
      EM_EFORMAT,
      { "'a'", "start of the data", NULL } },
    { "end before begin",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}",
      6,
      EM_EFORMAT,
      { "'a'", "end before they begin", NULL } },
    { "trailing bytes",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
      7,
      EM_EFORMAT,
      { "3 bytes after the last tensor", NULL } },
    { "duplicate names",
      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
      "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
      2,
      EM_EFORMAT,
      { "duplicate", NULL } },
    { "unknown dtype",
      "{\"q\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}",
      1,
      EM_EUNSUPPORTED,
      { "'q'", "'F4'", NULL } },
    { "dtype not string",
      "{\"q\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}",
      8,
      EM_EFORMAT,
      { "'q'", "dtype", NULL } },
    { "negative dim",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}",
      2,
      EM_EFORMAT,
      { "'q'", "shape[0]", NULL } },
    { "too many dims",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
      1,
      EM_EUNSUPPORTED,
      { "'q'", "9 dimensions", NULL } },
    { "element overflow",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,1]}}",
      1,
      EM_EOVERFLOW,
      { "'q'", "element count", NULL } },
    { "byte overflow",
      "{\"q\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}",
      1,
      EM_EOVERFLOW,
      { "'q'", "byte size", NULL } },
    { "offsets one number",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}",
      1,
      EM_EFORMAT,
      { "'q'", "data_offsets", NULL } },
    { "negative offset",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}",
      1,
      EM_EFORMAT,
      { "'q'", "data_offsets", NULL } },
    { "missing shape",
      "{\"q\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}",
      1,
      EM_EFORMAT,
      { "'q'", "shape", NULL } },
    { "entry not object", "{\"q\":[1,2]}", 0, EM_EFORMAT, { "'q'", "not an object", NULL } },
    { "metadata value",
      "{\"__metadata__\":{\"format\":3}}",
      0,
      EM_EFORMAT,
      { "__metadata__", "'format'", NULL } },
    { "metadata list", "{\"__metadata__\":[1]}", 0, EM_EFORMAT, { "__metadata__", NULL } },
    { "NUL in name",
      "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
      1,
      EM_EFORMAT,
      { "header JSON", NULL } },
    { "bad UTF-8",
      "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
      1,
      EM_EFORMAT,
      { "header JSON", NULL } },
    { "huge integer",
      "{\"q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551615]}}",
      1,
      EM_EFORMAT,
      { "header JSON", NULL } },
};

static void expect_msg(const em_err *err, const char *const *needles) {
    for (int i = 0; i < 3 && needles[i]; i++)
        if (!strstr(err->msg, needles[i]))
            fail_msg("message \"%s\" lacks \"%s\"", err->msg, needles[i]);
}

static void test_bad_headers(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        uint8_t zeros[32] = { 0 };
        buf b = st_bytes(c->header, zeros, c->data_len);
        em_safetensors *st = (em_safetensors *)&st; /* must be reset to NULL */
        em_err err = { 0 };
        int rc = em_safetensors_open_memory(&st, b.p, b.n, "bad.safetensors", &err);
        if (rc != c->code) fail_msg("%s: status %d, want %d (%s)", c->what, rc, c->code, err.msg);
        assert_null(st);
        assert_non_null(strstr(err.msg, "bad.safetensors"));
        expect_msg(&err, c->needles);
        /* The same bytes through the file path name the file. */
        const char *path = em_test_path("bad.safetensors");
        em_test_write(path, b.p, b.n);
        assert_int_equal(em_safetensors_open(&st, path, &err), c->code);
        assert_non_null(strstr(err.msg, path));
        free(b.p);
    }
}

static void test_bad_length_prefix(void **state) {
    (void)state;
    em_safetensors *st;
    em_err err = { 0 };
    static const uint8_t short5[] = { 1, 0, 0, 0, 0 };
    assert_int_equal(em_safetensors_open_memory(&st, short5, sizeof short5, "s", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "too short"));
    assert_int_equal(em_safetensors_open_memory(&st, NULL, 0, "s", &err), EM_EFORMAT);

    /* header length past the file */
    uint8_t past[20] = { 100, 0, 0, 0, 0, 0, 0, 0, '{', '}' };
    assert_int_equal(em_safetensors_open_memory(&st, past, sizeof past, "p", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "header length 100 at offset 0 runs past the end"));

    /* over the 100 MB limit, and the largest u64 */
    uint8_t big[16] = { 0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0, '{', '}' }; /* 100,000,001 */
    assert_int_equal(em_safetensors_open_memory(&st, big, sizeof big, "b", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "exceeds the limit"));
    memset(big, 0xff, 8);
    assert_int_equal(em_safetensors_open_memory(&st, big, sizeof big, "b", &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "exceeds the limit"));

    /* truncated: a valid file cut short loses its data */
    float v[4] = { 1, 2, 3, 4 };
    buf b =
        st_bytes("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", v, sizeof v);
    for (size_t cut = 0; cut < b.n; cut++) {
        int rc = em_safetensors_open_memory(&st, b.p, cut, "cut", &err);
        if (rc == EM_OK) fail_msg("a file cut to %zu of %zu bytes opened", cut, b.n);
        assert_int_equal(rc, EM_EFORMAT);
    }
    assert_int_equal(em_safetensors_open_memory(&st, b.p, b.n, "whole", &err), EM_OK);
    em_safetensors_close(st);
    free(b.p);

    assert_int_equal(em_safetensors_open(&st, em_test_path("does-not-exist.safetensors"), &err),
                     EM_ENOTFOUND);
}

/* ---- shards ----------------------------------------------------------------------------- */

static const char *k_shard1 =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
static const char *k_shard2 =
    "{\"lm_head.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
    "\"scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[8,9]}}";
static const char *k_index = "{\"metadata\":{\"total_size\":33},\"weight_map\":{"
                             "\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
                             "\"model.embed.weight\":\"model-00001-of-00002.safetensors\","
                             "\"model.norm.weight\":\"model-00001-of-00002.safetensors\","
                             "\"scale\":\"model-00002-of-00002.safetensors\"}}";

/* A fresh folder name/ with the two shards and (when index != NULL) an index. */
static const char *make_sharded(const char *name, const char *index, const char *shard2) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s", em_test_path(name));
    make_dir(dir);
    char path[700];
    uint8_t d1[16] = { 0x80, 0x3f, 0, 0x40, 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40 };
    uint8_t d2[9] = { 0, 0x3c, 0, 0x3c, 0, 0x3c, 0, 0x3c, 0x40 };
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    st_write(path, k_shard1, d1, sizeof d1);
    if (shard2) {
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        st_write(path, shard2, d2, sizeof d2);
    }
    if (index) {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        write_text(path, index);
    }
    return dir;
}

static void check_sharded(const em_safetensors *st, const char *dir) {
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(em_safetensors_count(st), 4);
    assert_int_equal(em_safetensors_shard_count(st), 2);
    assert_string_equal(em_safetensors_shard_path(st, 0), p1);
    assert_string_equal(em_safetensors_shard_path(st, 1), p2);
    assert_null(em_safetensors_shard_path(st, 2));
    const char *order[4] = { "model.embed.weight", "model.norm.weight", "lm_head.weight", "scale" };
    for (int i = 0; i < 4; i++) {
        const em_safetensors_tensor *t = em_safetensors_at(st, (size_t)i);
        assert_string_equal(t->name, order[i]);
        assert_int_equal(t->shard, i / 2);
        assert_string_equal(t->path, i < 2 ? p1 : p2);
    }
    float f[4];
    em_err err = { 0 };
    assert_int_equal(
        em_safetensors_to_f32(em_safetensors_find(st, "model.embed.weight"), f, 4, &err), 0);
    assert_true(f[0] == 1 && f[1] == 2 && f[2] == 0 && f[3] == 0);
    assert_int_equal(em_safetensors_to_f32(em_safetensors_find(st, "lm_head.weight"), f, 4, &err),
                     0);
    assert_true(f[0] == 1 && f[3] == 1);
    assert_int_equal(em_safetensors_to_f32(em_safetensors_find(st, "scale"), f, 1, &err), 0);
    assert_true(f[0] == 2); /* 0x40 = 0.1000.000 = 2^(8-7) */
    assert_string_equal(em_safetensors_metadata_get(st, "format"), "pt");
}

static void test_sharded_index(void **state) {
    (void)state;
    const char *dir = make_sharded("sharded", k_index, k_shard2);
    char index[700];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    em_safetensors *st;
    em_err err = { 0 };
    assert_int_equal(em_safetensors_open(&st, index, &err), EM_OK);
    check_sharded(st, dir);
    em_safetensors_close(st);
    assert_int_equal(em_safetensors_open(&st, dir, &err), EM_OK); /* the folder finds the index */
    check_sharded(st, dir);
    em_safetensors_close(st);
}

static void test_folder_without_index(void **state) {
    (void)state;
    const char *dir = make_sharded("noindex", NULL, k_shard2);
    em_safetensors *st;
    em_err err = { 0 };
    assert_int_equal(em_safetensors_open(&st, dir, &err), EM_OK);
    check_sharded(st, dir);
    em_safetensors_close(st);

    char single[700];
    snprintf(single, sizeof single, "%s", em_test_path("single"));
    make_dir(single);
    char path[800];
    snprintf(path, sizeof path, "%s/model.safetensors", single);
    uint8_t one = 7;
    st_write(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", &one, 1);
    snprintf(path, sizeof path, "%s/other.safetensors",
             single); /* ignored: model.safetensors wins */
    st_write(path, "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", &one, 1);
    assert_int_equal(em_safetensors_open(&st, single, &err), EM_OK);
    assert_int_equal(em_safetensors_count(st), 1);
    assert_non_null(em_safetensors_find(st, "a"));
    em_safetensors_close(st);

    const char *none = em_test_path("none");
    make_dir(none);
    assert_int_equal(em_safetensors_open(&st, none, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, none));
}

typedef struct index_case {
    const char *what, *index, *shard2;
    int code;
    const char *needles[3];
} index_case;

static void test_bad_index(void **state) {
    (void)state;
    static const char *dup_shard2 =
        "{\"lm_head.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
        "\"model.norm.weight\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}";
    static const char *dup_index =
        "{\"weight_map\":{\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
        "\"model.embed.weight\":\"model-00001-of-00002.safetensors\","
        "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}";
    static const char *missing_tensor =
        "{\"weight_map\":{\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
        "\"ghost.weight\":\"model-00002-of-00002.safetensors\"}}";
    static const char *wrong_shard =
        "{\"weight_map\":{\"lm_head.weight\":\"model-00001-of-00002.safetensors\","
        "\"scale\":\"model-00002-of-00002.safetensors\"}}";
    static const char *escape =
        "{\"weight_map\":{\"lm_head.weight\":\"../model-00002-of-00002.safetensors\"}}";
    static const char *absolute = "{\"weight_map\":{\"lm_head.weight\":\"/etc/passwd\"}}";
    static const char *no_map = "{\"metadata\":{}}";
    static const char *empty_map = "{\"weight_map\":{}}";
    static const char *not_string = "{\"weight_map\":{\"x\":3}}";
    static const char *dup_key = "{\"weight_map\":{\"scale\":\"model-00002-of-00002.safetensors\","
                                 "\"scale\":\"model-00002-of-00002.safetensors\"}}";
    const index_case cases[] = {
        { "missing shard",
          k_index,
          NULL,
          EM_ENOTFOUND,
          { "model-00002-of-00002.safetensors", "missing", NULL } },
        { "tensor missing from its shard",
          missing_tensor,
          k_shard2,
          EM_EFORMAT,
          { "'ghost.weight'", "missing from it", NULL } },
        { "tensor in another shard",
          wrong_shard,
          k_shard2,
          EM_EFORMAT,
          { "'lm_head.weight'", "model-00001-of-00002", "model-00002-of-00002" } },
        { "duplicate across shards",
          dup_index,
          dup_shard2,
          EM_EFORMAT,
          { "'model.norm.weight'", "appears twice", NULL } },
        { "shard outside folder",
          escape,
          k_shard2,
          EM_EFORMAT,
          { "'lm_head.weight'", "inside the index folder", NULL } },
        { "absolute shard", absolute, k_shard2, EM_EFORMAT, { "inside the index folder", NULL } },
        { "no weight_map", no_map, k_shard2, EM_EFORMAT, { "weight_map", NULL } },
        { "empty weight_map", empty_map, k_shard2, EM_EFORMAT, { "no tensors", NULL } },
        { "non-string shard", not_string, k_shard2, EM_EFORMAT, { "weight_map['x']", NULL } },
        { "duplicate index key", dup_key, k_shard2, EM_EFORMAT, { "duplicate", NULL } },
        { "index not JSON", "{\"weight_map\":", k_shard2, EM_EFORMAT, { "index.json", NULL } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "badidx%zu", i);
        const char *dir = make_sharded(name, cases[i].index, cases[i].shard2);
        em_safetensors *st = NULL;
        em_err err = { 0 };
        int rc = em_safetensors_open(&st, dir, &err);
        if (rc != cases[i].code)
            fail_msg("%s: status %d, want %d (%s)", cases[i].what, rc, cases[i].code, err.msg);
        assert_null(st);
        expect_msg(&err, cases[i].needles);
    }
}

/* ---- 8-bit floats and dtype names ------------------------------------------------------- */

/* Independent decode from the format definitions, in double precision with ldexp. */
static double e4m3_reference(int v, bool *nan) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    *nan = e == 15 && m == 7; /* OCP E4M3FN: S.1111.111 only; no infinities */
    double mag = e == 0 ? ldexp(m / 8.0, 1 - 7) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -mag : mag;
}

static double e5m2_reference(int v, bool *nan, bool *inf) {
    int s = v >> 7, e = (v >> 2) & 31, m = v & 3;
    *nan = e == 31 && m != 0;
    *inf = e == 31 && m == 0;
    double mag = e == 0 ? ldexp(m / 4.0, 1 - 15) : ldexp(1.0 + m / 4.0, e - 15);
    return s ? -mag : mag;
}

static void test_f8_tables(void **state) {
    (void)state;
    int nan_count = 0;
    for (int v = 0; v < 256; v++) {
        bool nan;
        double want = e4m3_reference(v, &nan);
        float got = em_st_f8_e4m3_to_f32((uint8_t)v);
        assert_false(isinf(got));
        if (nan) {
            assert_true(isnan(got));
            nan_count++;
            continue;
        }
        if ((double)got != want) fail_msg("e4m3 0x%02x: got %.9g want %.17g", v, got, want);
        assert_int_equal(!!signbit(got), v >> 7);
    }
    assert_int_equal(nan_count, 2);
    /* Anchors straight from the OCP FP8 spec. */
    assert_true(em_st_f8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(em_st_f8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(em_st_f8_e4m3_to_f32(0x08) == 0.015625f);    /* min normal 2^-6 */
    assert_true(em_st_f8_e4m3_to_f32(0x01) == 0.001953125f); /* min subnormal 2^-9 */
    assert_true(em_st_f8_e4m3_to_f32(0x07) == 0.013671875f); /* max subnormal 7/8 * 2^-6 */
    assert_true(em_st_f8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(em_st_f8_e4m3_to_f32(0x78) == 256.0f);
    assert_true(isnan(em_st_f8_e4m3_to_f32(0x7f)) && isnan(em_st_f8_e4m3_to_f32(0xff)));
    assert_true(em_st_f8_e4m3_to_f32(0x80) == 0.0f && signbit(em_st_f8_e4m3_to_f32(0x80)));
    for (int v = 1; v < 0x7f; v++) /* positive codes are ordered */
        assert_true(em_st_f8_e4m3_to_f32((uint8_t)v) > em_st_f8_e4m3_to_f32((uint8_t)(v - 1)));

    for (int v = 0; v < 256; v++) {
        bool nan, inf;
        double want = e5m2_reference(v, &nan, &inf);
        float got = em_st_f8_e5m2_to_f32((uint8_t)v);
        if (nan)
            assert_true(isnan(got));
        else if (inf)
            assert_true(isinf(got) && (got < 0) == (v >> 7));
        else if ((double)got != want)
            fail_msg("e5m2 0x%02x: got %.9g want %.17g", v, got, want);
    }
    assert_true(em_st_f8_e5m2_to_f32(0x7b) == 57344.0f);

    /* the bulk converter agrees with the scalar decoders */
    uint8_t all[256];
    float bulk[256];
    for (int v = 0; v < 256; v++) all[v] = (uint8_t)v;
    em_st_convert_f32(EM_ST_F8_E4M3, all, bulk, 256);
    for (int v = 0; v < 256; v++) {
        float one = em_st_f8_e4m3_to_f32((uint8_t)v);
        assert_true(memcmp(&one, &bulk[v], sizeof one) == 0);
    }
}

static void test_dtype_names(void **state) {
    (void)state;
    for (int t = 0; t < EM_ST_DTYPE_COUNT; t++) {
        enum em_st_dtype back;
        em_err err = { 0 };
        assert_int_equal(em_st_dtype_parse(em_st_dtype_name((enum em_st_dtype)t), &back, &err),
                         EM_OK);
        assert_int_equal(back, t);
        assert_true(em_st_dtype_size((enum em_st_dtype)t) >= 1);
    }
    assert_int_equal(em_st_dtype_size(EM_ST_BF16), 2);
    assert_int_equal(em_st_dtype_size(EM_ST_I64), 8);
    assert_int_equal(em_st_dtype_size(EM_ST_F8_E4M3), 1);
    assert_string_equal(em_st_dtype_name(EM_ST_DTYPE_COUNT), "?");
    enum em_st_dtype t;
    em_err err = { 0 };
    assert_int_equal(em_st_dtype_parse("f32", &t, &err), EM_EUNSUPPORTED); /* case matters */
    assert_int_equal(em_st_dtype_parse("F4", &t, &err), EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "F4"));
    assert_true(isnan(em_st_f8_e8m0_to_f32(0xff)));
}

/* Many tensors: the hash finds every one, and misses miss. */
static void test_many_tensors(void **state) {
    (void)state;
    enum { N = 3000 };
    size_t cap = (size_t)N * 96 + 16;
    char *h = malloc(cap);
    assert_non_null(h);
    size_t used = (size_t)snprintf(h, cap, "{");
    for (int i = 0; i < N; i++)
        used += (size_t)snprintf(h + used, cap - used,
                                 "%s\"model.layers.%d.w\":{\"dtype\":\"U8\",\"shape\":[1],"
                                 "\"data_offsets\":[%d,%d]}",
                                 i ? "," : "", i, i, i + 1);
    snprintf(h + used, cap - used, "}");
    uint8_t *data = malloc(N);
    assert_non_null(data);
    for (int i = 0; i < N; i++) data[i] = (uint8_t)(i * 7);
    buf b = st_bytes(h, data, N);
    em_safetensors *st;
    em_err err = { 0 };
    assert_int_equal(em_safetensors_open_memory(&st, b.p, b.n, "many", &err), EM_OK);
    assert_int_equal(em_safetensors_count(st), N);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.w", i);
        const em_safetensors_tensor *t = em_safetensors_find(st, name);
        assert_non_null(t);
        assert_int_equal(t->data[0], (uint8_t)(i * 7));
        snprintf(name, sizeof name, "model.layers.%d.x", i);
        assert_null(em_safetensors_find(st, name));
    }
    em_safetensors_close(st);
    free(b.p);
    free(h);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_dtypes_file_and_memory),
        cmocka_unit_test(test_empty_file_and_range),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_bad_length_prefix),
        cmocka_unit_test(test_sharded_index),
        cmocka_unit_test(test_folder_without_index),
        cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_f8_tables),
        cmocka_unit_test(test_dtype_names),
        cmocka_unit_test(test_many_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

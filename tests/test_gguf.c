/* format/gguf: writer -> reader round trips of every metadata type and of tensor shapes; a
 * byte-exact file built by hand from the spec as the independent reference for the layout;
 * hand-crafted broken files for every check the reader makes (status code and the key,
 * tensor or byte offset in the message); truncation and byte-flip sweeps; split models
 * (any shard opens all, missing and foreign shards are refused); determinism; v2 files;
 * writer misuse and clean-up.
 *
 * With EMBER_WRITE_CORPUS=DIR set, the files these tests build (valid and broken) are also
 * written to DIR: that is how fuzz/corpus/gguf/ is generated. */
#include "testutil.h"

#include "format/gguf.h"
#include "quant/quant.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- corpus output -------------------------------------------------------------------- */

static void corpus_save(const char *name, const void *data, size_t n) {
    const char *dir = getenv("EMBER_WRITE_CORPUS");
    if (!dir || !*dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, name);
    em_test_write(path, data, n);
}

static void corpus_save_file(const char *name, const char *src) {
    size_t n;
    void *p = em_test_read(src, &n);
    corpus_save(name, p, n);
    free(p);
}

/* ---- hand-built files ----------------------------------------------------------------- */

typedef struct fb {
    uint8_t p[8192];
    size_t len;
} fb;

static void fb_put(fb *b, const void *src, size_t n) {
    assert_true(b->len + n <= sizeof b->p);
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void fb_u8(fb *b, uint8_t v) { fb_put(b, &v, 1); }
static void fb_u16(fb *b, uint16_t v) { fb_put(b, &v, 2); }
static void fb_u32(fb *b, uint32_t v) { fb_put(b, &v, 4); }
static void fb_u64(fb *b, uint64_t v) { fb_put(b, &v, 8); }
static void fb_f32(fb *b, float v) { fb_put(b, &v, 4); }
static void fb_strn(fb *b, const char *s, size_t n) { fb_u64(b, n); fb_put(b, s, n); }
static void fb_str(fb *b, const char *s) { fb_strn(b, s, strlen(s)); }
static void fb_pad(fb *b, size_t a) { while (b->len % a) fb_u8(b, 0); }

static void fb_header(fb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->len = 0;
    fb_put(b, "GGUF", 4);
    fb_u32(b, version);
    fb_u64(b, n_tensors);
    fb_u64(b, n_kv);
}

static void fb_kv_u32(fb *b, const char *key, uint32_t v) {
    fb_str(b, key);
    fb_u32(b, EM_GGUF_U32);
    fb_u32(b, v);
}

static void fb_kv_u16(fb *b, const char *key, uint16_t v) {
    fb_str(b, key);
    fb_u32(b, EM_GGUF_U16);
    fb_u16(b, v);
}

static void fb_kv_i32(fb *b, const char *key, int32_t v) {
    fb_str(b, key);
    fb_u32(b, EM_GGUF_I32);
    fb_u32(b, (uint32_t)v);
}

static void fb_tensor(fb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    fb_str(b, name);
    fb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) fb_u64(b, ne[i]);
    fb_u32(b, type);
    fb_u64(b, offset);
}

static int g_case;

/* Opening b (from a file and from memory) must fail with code, the message holding the
 * path and every given fragment. */
static void expect_fail(const fb *b, int code, const char *frag1, const char *frag2) {
    char name[32];
    snprintf(name, sizeof name, "bad%02d", g_case++);
    corpus_save(name, b->p, b->len);
    const char *path = em_test_path("bad.gguf");
    em_test_write(path, b->p, b->len);
    em_err err = { 0 };
    em_gguf *g = NULL;
    int rc = em_gguf_open(&g, path, &err);
    if (rc != code || !strstr(err.msg, path) || (frag1 && !strstr(err.msg, frag1)) ||
        (frag2 && !strstr(err.msg, frag2)))
        fail_msg("case %s: got %d '%s', want %d with '%s' and '%s'", name, rc, err.msg, code,
                 frag1 ? frag1 : "", frag2 ? frag2 : "");
    assert_null(g);
    em_err err2 = { 0 };
    assert_int_equal(em_gguf_open_mem(&g, b->p, b->len, "mem", &err2), code);
    assert_null(g);
}

static em_gguf *open_ok(const char *path) {
    em_err err = { 0 };
    em_gguf *g = NULL;
    int rc = em_gguf_open(&g, path, &err);
    if (rc) fail_msg("open %s: %s", path, err.msg);
    return g;
}

/* ---- writer helpers -------------------------------------------------------------------- */

static const float k_f32_data[6] = { 1.0f, -2.5f, 3.25f, 1e-3f, -0.0f, 65504.0f };
static const uint16_t k_f16_data[4] = { 0x3c00, 0xc000, 0x7bff, 0x0001 };

/* The array values the metadata test writes and reads back. */
static const uint8_t au8[] = { 1, 2, 255 };
static const int8_t ai8[] = { -128, 0, 127 };
static const uint16_t au16[] = { 0, 65535 };
static const int16_t ai16[] = { -32768, 32767 };
static const uint32_t au32[] = { 7, 0, 4294967295u };
static const int32_t ai32[] = { -1, 2147483647, -2147483647 - 1 };
static const uint64_t au64[] = { UINT64_MAX, 1 };
static const int64_t ai64[] = { INT64_MIN, INT64_MAX, 0 };
static const float af32[] = { 1.5f, -2.0f, 1e-30f };
static const double af64[] = { 0.1, -1e-300 };
static const bool abool[] = { true, false, true };
static const char *const astr[] = { "a", "", "ccc", "\xe4\xb8\xad" };

static void q8_block(uint8_t *blk, float d, int seed) {
    uint16_t h = em_fp32_to_fp16(d);
    memcpy(blk, &h, 2);
    for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)((i * 7 + seed) % 255 - 127);
}

/* A model with every metadata type and a range of tensor shapes. */
static void write_full_model(const char *path, const em_gguf_write_opts *opts, uint32_t alignment) {
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, opts, E));
    if (alignment) OK(em_gguf_writer_set_u32(w, "general.alignment", alignment, E));
    OK(em_gguf_writer_set_str(w, "general.architecture", "test-arch", E));
    OK(em_gguf_writer_set_u8(w, "t.u8", 200, E));
    OK(em_gguf_writer_set_i8(w, "t.i8", -100, E));
    OK(em_gguf_writer_set_u16(w, "t.u16", 60000, E));
    OK(em_gguf_writer_set_i16(w, "t.i16", -30000, E));
    OK(em_gguf_writer_set_u32(w, "t.u32", 4000000000u, E));
    OK(em_gguf_writer_set_i32(w, "t.i32", -2000000000, E));
    OK(em_gguf_writer_set_u64(w, "t.u64", UINT64_MAX, E));
    OK(em_gguf_writer_set_i64(w, "t.i64", INT64_MIN, E));
    OK(em_gguf_writer_set_f32(w, "t.f32", 3.5f, E));
    OK(em_gguf_writer_set_f64(w, "t.f64", -1e300, E));
    OK(em_gguf_writer_set_bool(w, "t.bool", true, E));
    OK(em_gguf_writer_set_bool(w, "t.false", false, E));
    OK(em_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo \"q\"\n", E));
    OK(em_gguf_writer_set_strn(w, "t.nul", "a\0\xff", 3, E));
    OK(em_gguf_writer_set_str(w, "t.empty", "", E));
    OK(em_gguf_writer_set_arr(w, "a.u8", EM_GGUF_U8, au8, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.i8", EM_GGUF_I8, ai8, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.u16", EM_GGUF_U16, au16, 2, E));
    OK(em_gguf_writer_set_arr(w, "a.i16", EM_GGUF_I16, ai16, 2, E));
    OK(em_gguf_writer_set_arr(w, "a.u32", EM_GGUF_U32, au32, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.i32", EM_GGUF_I32, ai32, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.u64", EM_GGUF_U64, au64, 2, E));
    OK(em_gguf_writer_set_arr(w, "a.i64", EM_GGUF_I64, ai64, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.f32", EM_GGUF_F32, af32, 3, E));
    OK(em_gguf_writer_set_arr(w, "a.f64", EM_GGUF_F64, af64, 2, E));
    OK(em_gguf_writer_set_arr(w, "a.bool", EM_GGUF_BOOL, abool, 3, E));
    OK(em_gguf_writer_set_arr_str(w, "a.str", astr, 4, E));
    OK(em_gguf_writer_set_arr(w, "a.empty", EM_GGUF_U32, NULL, 0, E));
    /* [[1, 2, 3] u32, ["x", "yz"] str, [] i8] and [[[ -1 ] i8]] */
    em_gguf_abuf *outer, *sub, *deep, *mid;
    OK(em_gguf_abuf_create(&outer, EM_GGUF_ARRAY, E));
    OK(em_gguf_abuf_create(&sub, EM_GGUF_U32, E));
    for (uint32_t v = 1; v <= 3; v++) OK(em_gguf_abuf_push(sub, &v, E));
    OK(em_gguf_abuf_push_arr(outer, sub, E));
    em_gguf_abuf_free(sub);
    OK(em_gguf_abuf_create(&sub, EM_GGUF_STR, E));
    OK(em_gguf_abuf_push_str(sub, "x", 1, E));
    OK(em_gguf_abuf_push_str(sub, "yz", 2, E));
    OK(em_gguf_abuf_push_arr(outer, sub, E));
    em_gguf_abuf_free(sub);
    OK(em_gguf_abuf_create(&sub, EM_GGUF_I8, E));
    OK(em_gguf_abuf_push_arr(outer, sub, E));
    em_gguf_abuf_free(sub);
    OK(em_gguf_writer_set_abuf(w, "a.nested", outer, E));
    em_gguf_abuf_free(outer);
    OK(em_gguf_abuf_create(&deep, EM_GGUF_I8, E));
    int8_t m1 = -1;
    OK(em_gguf_abuf_push(deep, &m1, E));
    OK(em_gguf_abuf_create(&mid, EM_GGUF_ARRAY, E));
    OK(em_gguf_abuf_push_arr(mid, deep, E));
    OK(em_gguf_abuf_create(&outer, EM_GGUF_ARRAY, E));
    OK(em_gguf_abuf_push_arr(outer, mid, E));
    OK(em_gguf_writer_set_abuf(w, "a.deep", outer, E));
    em_gguf_abuf_free(deep);
    em_gguf_abuf_free(mid);
    em_gguf_abuf_free(outer);

    static const int64_t ne_f32[] = { 3, 2 }, ne_f16[] = { 4 }, ne_q8[] = { 64, 2 },
                         ne_4d[] = { 2, 1, 3, 1 }, ne_empty[] = { 0, 5 };
    OK(em_gguf_writer_add_tensor(w, "w.f32", EM_TYPE_F32, 2, ne_f32, E));
    OK(em_gguf_writer_add_tensor(w, "w.f16", EM_TYPE_F16, 1, ne_f16, E));
    OK(em_gguf_writer_add_tensor(w, "w.q8", EM_TYPE_Q8_0, 2, ne_q8, E));
    OK(em_gguf_writer_add_tensor(w, "w.4d", EM_TYPE_F32, 4, ne_4d, E));
    OK(em_gguf_writer_add_tensor(w, "w.empty", EM_TYPE_F32, 2, ne_empty, E));
    OK(em_gguf_writer_add_tensor(w, "w.scalar", EM_TYPE_F32, 0, NULL, E));
    uint8_t q8[4 * 34];
    for (int b = 0; b < 4; b++) q8_block(q8 + 34 * b, 0.5f + (float)b, b);
    OK(em_gguf_writer_write_tensor(w, "w.f32", k_f32_data, sizeof k_f32_data, E));
    OK(em_gguf_writer_write_tensor(w, "w.f16", k_f16_data, sizeof k_f16_data, E));
    /* streamed in uneven pieces, as the converter would */
    OK(em_gguf_writer_write_data(w, q8, 5, E));
    OK(em_gguf_writer_write_data(w, q8 + 5, 100, E));
    OK(em_gguf_writer_write_data(w, q8 + 105, sizeof q8 - 105, E));
    OK(em_gguf_writer_write_tensor(w, "w.4d", k_f32_data, sizeof k_f32_data, E));
    OK(em_gguf_writer_write_tensor(w, "w.empty", NULL, 0, E));
    OK(em_gguf_writer_write_tensor(w, "w.scalar", k_f32_data + 2, 4, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
}

static em_gguf_value get(const em_gguf *g, const char *key) {
    int64_t i = em_gguf_find_key(g, key);
    if (i < 0) fail_msg("key %s missing", key);
    return em_gguf_value_at(g, i);
}

static void check_arr(const em_gguf *g, const char *key, int elem, uint64_t n, const void *want) {
    em_gguf_value v = get(g, key);
    assert_int_equal(v.type, EM_GGUF_ARRAY);
    assert_int_equal(em_gguf_arr_type(v.arr), elem);
    assert_int_equal(em_gguf_arr_count(v.arr), n);
    assert_string_equal(em_gguf_arr_key(v.arr), key);
    uint8_t got[64];
    int size = em_gguf_type_size(elem);
    OK(em_gguf_arr_copy(v.arr, elem, got, n, E));
    assert_memory_equal(got, want, n * (size_t)(elem == EM_GGUF_BOOL ? sizeof(bool) : (size_t)size));
}

static void check_full_model(em_gguf *g, uint32_t alignment) {
    em_gguf_value v;
    assert_int_equal(em_gguf_version(g), 3);
    assert_int_equal(em_gguf_alignment(g), alignment);
    char buf[64];
    OK(em_gguf_get_cstr(g, "general.architecture", buf, sizeof buf, E));
    assert_string_equal(buf, "test-arch");
    v = get(g, "t.u8"); assert_int_equal(v.type, EM_GGUF_U8); assert_int_equal(v.u, 200);
    v = get(g, "t.i8"); assert_int_equal(v.type, EM_GGUF_I8); assert_int_equal(v.i, -100);
    v = get(g, "t.u16"); assert_int_equal(v.type, EM_GGUF_U16); assert_int_equal(v.u, 60000);
    v = get(g, "t.i16"); assert_int_equal(v.type, EM_GGUF_I16); assert_int_equal(v.i, -30000);
    v = get(g, "t.u32"); assert_int_equal(v.type, EM_GGUF_U32); assert_int_equal(v.u, 4000000000u);
    v = get(g, "t.i32"); assert_int_equal(v.type, EM_GGUF_I32); assert_int_equal(v.i, -2000000000);
    v = get(g, "t.u64"); assert_int_equal(v.type, EM_GGUF_U64); assert_true(v.u == UINT64_MAX);
    v = get(g, "t.i64"); assert_int_equal(v.type, EM_GGUF_I64); assert_true(v.i == INT64_MIN);
    v = get(g, "t.f32"); assert_int_equal(v.type, EM_GGUF_F32); assert_true(v.f32 == 3.5f);
    v = get(g, "t.f64"); assert_int_equal(v.type, EM_GGUF_F64); assert_true(v.f64 == -1e300);
    v = get(g, "t.bool"); assert_int_equal(v.type, EM_GGUF_BOOL); assert_true(v.b);
    v = get(g, "t.false"); assert_int_equal(v.type, EM_GGUF_BOOL); assert_false(v.b);
    v = get(g, "t.str");
    assert_int_equal(v.type, EM_GGUF_STR);
    assert_int_equal(v.str.len, 11);
    assert_memory_equal(v.str.ptr, "h\xc3\xa9llo \"q\"\n", 11);
    v = get(g, "t.nul");
    assert_int_equal(v.str.len, 3);
    assert_memory_equal(v.str.ptr, "a\0\xff", 3);
    v = get(g, "t.empty");
    assert_int_equal(v.str.len, 0);

    check_arr(g, "a.u8", EM_GGUF_U8, 3, au8);
    check_arr(g, "a.i8", EM_GGUF_I8, 3, ai8);
    check_arr(g, "a.u16", EM_GGUF_U16, 2, au16);
    check_arr(g, "a.i16", EM_GGUF_I16, 2, ai16);
    check_arr(g, "a.u32", EM_GGUF_U32, 3, au32);
    check_arr(g, "a.i32", EM_GGUF_I32, 3, ai32);
    check_arr(g, "a.u64", EM_GGUF_U64, 2, au64);
    check_arr(g, "a.i64", EM_GGUF_I64, 3, ai64);
    check_arr(g, "a.f32", EM_GGUF_F32, 3, af32);
    check_arr(g, "a.f64", EM_GGUF_F64, 2, af64);
    check_arr(g, "a.bool", EM_GGUF_BOOL, 3, abool);
    check_arr(g, "a.empty", EM_GGUF_U32, 0, au32);

    v = get(g, "a.str");
    assert_int_equal(em_gguf_arr_type(v.arr), EM_GGUF_STR);
    assert_int_equal(em_gguf_arr_count(v.arr), 4);
    for (int i = 0; i < 4; i++) {
        em_gguf_value e = em_gguf_arr_at(v.arr, (uint64_t)i);
        assert_int_equal(e.type, EM_GGUF_STR);
        assert_int_equal(e.str.len, strlen(astr[i]));
        assert_memory_equal(e.str.ptr, astr[i], e.str.len);
    }

    v = get(g, "a.nested");
    assert_int_equal(em_gguf_arr_type(v.arr), EM_GGUF_ARRAY);
    assert_int_equal(em_gguf_arr_count(v.arr), 3);
    em_gguf_value e0 = em_gguf_arr_at(v.arr, 0), e1 = em_gguf_arr_at(v.arr, 1),
                  e2 = em_gguf_arr_at(v.arr, 2);
    assert_int_equal(em_gguf_arr_type(e0.arr), EM_GGUF_U32);
    assert_int_equal(em_gguf_arr_count(e0.arr), 3);
    for (uint64_t i = 0; i < 3; i++) {
        int64_t x;
        OK(em_gguf_arr_get_int(e0.arr, i, &x, E));
        assert_int_equal(x, (int64_t)i + 1);
    }
    assert_string_equal(em_gguf_arr_key(e0.arr), "a.nested");
    assert_int_equal(em_gguf_arr_type(e1.arr), EM_GGUF_STR);
    assert_int_equal(em_gguf_arr_count(e1.arr), 2);
    em_gguf_value yz = em_gguf_arr_at(e1.arr, 1);
    assert_int_equal(yz.str.len, 2);
    assert_memory_equal(yz.str.ptr, "yz", 2);
    assert_int_equal(em_gguf_arr_type(e2.arr), EM_GGUF_I8);
    assert_int_equal(em_gguf_arr_count(e2.arr), 0);
    v = get(g, "a.deep");
    em_gguf_value lvl1 = em_gguf_arr_at(v.arr, 0);
    em_gguf_value lvl2 = em_gguf_arr_at(lvl1.arr, 0);
    em_gguf_value leaf = em_gguf_arr_at(lvl2.arr, 0);
    assert_int_equal(leaf.type, EM_GGUF_I8);
    assert_int_equal(leaf.i, -1);

    /* tensors: file order, shapes, sizes, aligned offsets, data */
    assert_int_equal(em_gguf_n_tensors(g), 6);
    static const char *const names[] = { "w.f32", "w.f16", "w.q8", "w.4d", "w.empty", "w.scalar" };
    static const int types[] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_Q8_0, EM_TYPE_F32, EM_TYPE_F32,
                                 EM_TYPE_F32 };
    static const int dims[] = { 2, 1, 2, 4, 2, 0 };
    static const int64_t nes[6][4] = { { 3, 2, 1, 1 }, { 4, 1, 1, 1 }, { 64, 2, 1, 1 },
                                       { 2, 1, 3, 1 }, { 0, 5, 1, 1 }, { 1, 1, 1, 1 } };
    static const uint64_t bytes[] = { 24, 8, 4 * 34, 24, 0, 4 };
    uint64_t want_offset = 0;
    for (int i = 0; i < 6; i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        assert_ptr_equal(em_gguf_find_tensor(g, names[i]), t);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->type, types[i]);
        assert_int_equal(t->n_dims, dims[i]);
        assert_memory_equal(t->ne, nes[i], sizeof nes[i]);
        assert_int_equal(t->n_elements, (uint64_t)(nes[i][0] * nes[i][1] * nes[i][2] * nes[i][3]));
        assert_int_equal(t->bytes, bytes[i]);
        assert_int_equal(t->offset, want_offset); /* packed in order, as ggml lays them out */
        want_offset += (bytes[i] + alignment - 1) / alignment * alignment;
        const em_gguf_shard *sh = em_gguf_shard_at(g, t->shard);
        assert_int_equal(sh->data_offset % alignment, 0);
        assert_int_equal(t->file_offset, sh->data_offset + t->offset);
    }
    assert_memory_equal(em_gguf_find_tensor(g, "w.f32")->data, k_f32_data, 24);
    assert_memory_equal(em_gguf_find_tensor(g, "w.f16")->data, k_f16_data, 8);
    assert_memory_equal(em_gguf_find_tensor(g, "w.4d")->data, k_f32_data, 24);
    assert_memory_equal(em_gguf_find_tensor(g, "w.scalar")->data, k_f32_data + 2, 4);
    uint8_t q8[4 * 34];
    for (int b = 0; b < 4; b++) q8_block(q8 + 34 * b, 0.5f + (float)b, b);
    assert_memory_equal(em_gguf_find_tensor(g, "w.q8")->data, q8, sizeof q8);
    assert_null(em_gguf_find_tensor(g, "nope"));
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_round_trip(void **state) {
    (void)state;
    const char *path = em_test_path("full.gguf");
    write_full_model(path, NULL, 0);
    em_gguf *g = open_ok(path);
    check_full_model(g, 32);
    assert_int_equal(em_gguf_n_shards(g), 1);
    assert_null(em_gguf_find_tensor(g, "w.f3"));
    em_gguf_close(g);
    corpus_save_file("full", path);

    /* an alignment of 64 is honoured: data section and every tensor offset */
    path = em_test_path("full64.gguf");
    write_full_model(path, NULL, 64);
    g = open_ok(path);
    check_full_model(g, 64);
    em_gguf_close(g);

    /* open_mem sees the same */
    size_t n;
    void *bytes = em_test_read(em_test_path("full.gguf"), &n);
    OK(em_gguf_open_mem(&g, bytes, n, "mem", E));
    check_full_model(g, 32);
    assert_string_equal(em_gguf_path(g), "mem");
    em_gguf_close(g);
    free(bytes);
}

/* The layout from the spec, byte by byte: the independent reference for the writer. */
static void test_exact_bytes(void **state) {
    (void)state;
    fb want = { .len = 0 };
    fb_header(&want, 3, 1, 2);
    fb_kv_u32(&want, "a", 7);
    fb_str(&want, "s");
    fb_u32(&want, EM_GGUF_ARRAY);
    fb_u32(&want, EM_GGUF_STR);
    fb_u64(&want, 2);
    fb_str(&want, "xy");
    fb_str(&want, "");
    uint64_t ne = 2;
    fb_tensor(&want, "t", 1, &ne, EM_TYPE_F32, 0);
    fb_pad(&want, 32);
    fb_f32(&want, 1.0f);
    fb_f32(&want, 2.0f);
    fb_pad(&want, 32);

    const char *path = em_test_path("exact.gguf");
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_u32(w, "a", 7, E));
    static const char *const s[] = { "xy", "" };
    OK(em_gguf_writer_set_arr_str(w, "s", s, 2, E));
    int64_t ne2 = 2;
    OK(em_gguf_writer_add_tensor(w, "t", EM_TYPE_F32, 1, &ne2, E));
    static const float data[2] = { 1.0f, 2.0f };
    OK(em_gguf_writer_write_tensor(w, "t", data, sizeof data, E));
    OK(em_gguf_writer_finish(w, E));
    assert_int_equal(em_gguf_writer_n_shards(w), 1);
    assert_string_equal(em_gguf_writer_shard_path(w, 0), path);
    em_gguf_writer_free(w);
    size_t n;
    uint8_t *got = em_test_read(path, &n);
    assert_int_equal(n, want.len);
    assert_memory_equal(got, want.p, n);
    free(got);
    corpus_save("exact", want.p, want.len);

    /* a model without tensors is a header, padded */
    path = em_test_path("notensors.gguf");
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_u32(w, "a", 7, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    fb_header(&want, 3, 0, 1);
    fb_kv_u32(&want, "a", 7);
    fb_pad(&want, 32);
    got = em_test_read(path, &n);
    assert_int_equal(n, want.len);
    assert_memory_equal(got, want.p, n);
    free(got);
}

static void test_v2_and_versions(void **state) {
    (void)state;
    fb b;
    uint64_t ne = 2;
    fb_header(&b, 2, 1, 1);
    fb_kv_u32(&b, "k", 5);
    fb_tensor(&b, "t", 1, &ne, EM_TYPE_F32, 0);
    fb_pad(&b, 32);
    fb_f32(&b, 4.0f);
    fb_f32(&b, 5.0f);
    corpus_save("v2", b.p, b.len);
    const char *path = em_test_path("v2.gguf");
    em_test_write(path, b.p, b.len);
    em_gguf *g = open_ok(path);
    assert_int_equal(em_gguf_version(g), 2);
    uint32_t k;
    OK(em_gguf_get_u32(g, "k", &k, E));
    assert_int_equal(k, 5);
    const em_gguf_tensor *t;
    OK(em_gguf_get_tensor(g, "t", &t, E));
    assert_true(((const float *)t->data)[1] == 5.0f);
    em_gguf_close(g);

    b.p[4] = 1;
    expect_fail(&b, EM_EUNSUPPORTED, "v1", "byte 4");
    b.p[4] = 4;
    expect_fail(&b, EM_EUNSUPPORTED, "v4", NULL);
    b.p[4] = 0;
    expect_fail(&b, EM_EFORMAT, "version 0", NULL);
    uint32_t be = 0x03000000; /* version 3 written big-endian */
    memcpy(b.p + 4, &be, 4);
    expect_fail(&b, EM_EUNSUPPORTED, "big-endian", NULL);
    memcpy(b.p, "GGML", 4);
    expect_fail(&b, EM_EFORMAT, "not a GGUF file", "GGML");
    b.len = 3;
    expect_fail(&b, EM_EFORMAT, "not a GGUF file", NULL);
    b.len = 0;
    expect_fail(&b, EM_EFORMAT, "not a GGUF file", NULL);
    memcpy(b.p, "GGUF", 4);
    b.len = 20;
    expect_fail(&b, EM_EFORMAT, "truncated", NULL);
}

static void test_bad_metadata(void **state) {
    (void)state;
    fb b;
    /* counts the file cannot hold */
    fb_header(&b, 3, 0, UINT64_MAX / 2);
    expect_fail(&b, EM_EFORMAT, "keys", "byte 8");
    fb_header(&b, 3, UINT64_MAX, 0);
    expect_fail(&b, EM_EFORMAT, "tensors", NULL);
    fb_header(&b, 3, 0, 1);
    fb_u64(&b, 0);
    fb_u64(&b, 0); /* padding so the count passes the size pre-check */
    b.len = 24;
    fb_u64(&b, 1000); /* key length past the end */
    fb_u64(&b, 0);
    expect_fail(&b, EM_EFORMAT, "key #0", "byte 24");

    /* empty key */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "");
    fb_u32(&b, EM_GGUF_U8);
    fb_u8(&b, 1);
    fb_u8(&b, 1);
    expect_fail(&b, EM_EFORMAT, "empty key", NULL);

    /* a key holding NUL */
    fb_header(&b, 3, 0, 1);
    fb_strn(&b, "a\0b", 3);
    fb_u32(&b, EM_GGUF_U8);
    fb_u8(&b, 1);
    expect_fail(&b, EM_EFORMAT, "NUL", NULL);

    /* string value longer than the file */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "my.key");
    fb_u32(&b, EM_GGUF_STR);
    fb_u64(&b, 1u << 20);
    fb_put(&b, "abc", 3);
    expect_fail(&b, EM_EFORMAT, "my.key", "byte 42");

    /* unknown value type */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "my.key");
    fb_u32(&b, 13);
    fb_u64(&b, 0);
    expect_fail(&b, EM_EFORMAT, "unknown value type 13", "my.key");

    /* unknown array element type */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "arr.key");
    fb_u32(&b, EM_GGUF_ARRAY);
    fb_u32(&b, 99);
    fb_u64(&b, 0);
    expect_fail(&b, EM_EFORMAT, "unknown array element type 99", "arr.key");

    /* array counts that overflow or exceed the file, for each element kind */
    static const uint32_t kinds[] = { EM_GGUF_U64, EM_GGUF_STR, EM_GGUF_ARRAY, EM_GGUF_U8 };
    static const uint64_t counts[] = { 1ull << 61, 1ull << 62, UINT64_MAX, 100 };
    for (int i = 0; i < 4; i++) {
        fb_header(&b, 3, 0, 1);
        fb_str(&b, "arr.key");
        fb_u32(&b, EM_GGUF_ARRAY);
        fb_u32(&b, kinds[i]);
        fb_u64(&b, counts[i]);
        fb_u64(&b, 0);
        fb_u64(&b, 0);
        expect_fail(&b, EM_EFORMAT, "arr.key", "array of");
    }

    /* arrays nested deeper than the reader accepts */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "deep");
    fb_u32(&b, EM_GGUF_ARRAY);
    for (int i = 0; i < EM_GGUF_MAX_DEPTH + 2; i++) {
        fb_u32(&b, EM_GGUF_ARRAY);
        fb_u64(&b, 1);
    }
    expect_fail(&b, EM_EFORMAT, "nested", "deep");

    /* truncated inside an array of strings */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "tok");
    fb_u32(&b, EM_GGUF_ARRAY);
    fb_u32(&b, EM_GGUF_STR);
    fb_u64(&b, 3);
    fb_str(&b, "a");
    fb_str(&b, "b");
    fb_u64(&b, 100);
    fb_put(&b, "xy", 2);
    expect_fail(&b, EM_EFORMAT, "tok", "string length 100");

    /* duplicate key */
    fb_header(&b, 3, 0, 2);
    fb_kv_u32(&b, "dup.key", 1);
    fb_kv_u32(&b, "dup.key", 2);
    expect_fail(&b, EM_EFORMAT, "duplicate key", "dup.key");

    /* general.alignment: wrong type, not a power of two, zero */
    fb_header(&b, 3, 0, 1);
    fb_kv_i32(&b, "general.alignment", 32);
    expect_fail(&b, EM_EFORMAT, "general.alignment", "i32");
    fb_header(&b, 3, 0, 1);
    fb_kv_u32(&b, "general.alignment", 48);
    expect_fail(&b, EM_EFORMAT, "general.alignment", "power of two");
    fb_header(&b, 3, 0, 1);
    fb_kv_u32(&b, "general.alignment", 0);
    expect_fail(&b, EM_EFORMAT, "general.alignment", "power of two");

    /* bools other than 0/1 read as true, as ggml reads them */
    fb_header(&b, 3, 0, 1);
    fb_str(&b, "b");
    fb_u32(&b, EM_GGUF_BOOL);
    fb_u8(&b, 2);
    em_gguf *g;
    OK(em_gguf_open_mem(&g, b.p, b.len, "mem", E));
    bool v = false;
    OK(em_gguf_get_bool(g, "b", &v, E));
    assert_true(v);
    em_gguf_close(g);
}

static void test_bad_tensors(void **state) {
    (void)state;
    fb b;
    uint64_t ne[5] = { 4, 2, 1, 1, 1 };
    /* too many dimensions */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.five", 5, ne, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "t.five", "dimensions");
    /* a dimension negative as int64 */
    uint64_t neg[2] = { 4, 1ull << 63 };
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.neg", 2, neg, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "t.neg", "dimension 1");
    /* element count overflow */
    uint64_t big[3] = { 1ull << 31, 1ull << 31, 1ull << 31 };
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.big", 3, big, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "t.big", "overflow");
    /* byte size overflow */
    uint64_t big2[2] = { 1ull << 32, 1ull << 30 };
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.big2", 2, big2, EM_TYPE_F64, 0);
    expect_fail(&b, EM_EFORMAT, "t.big2", "overflow");
    /* unknown type ids: past the table and a hole in it (ggml's removed Q4_2) */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.type", 2, ne, 200, 0);
    expect_fail(&b, EM_EUNSUPPORTED, "t.type", "unknown tensor type 200");
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.type4", 2, ne, 4, 0);
    expect_fail(&b, EM_EUNSUPPORTED, "t.type4", "unknown tensor type 4");
    /* row not a multiple of the block */
    uint64_t ne33[1] = { 33 };
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.q8", 1, ne33, EM_TYPE_Q8_0, 0);
    expect_fail(&b, EM_EFORMAT, "t.q8", "block size");
    /* empty name, name too long, NUL in a name */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "", 1, ne, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "empty tensor name", "tensor #0");
    char longname[80];
    memset(longname, 'x', 64);
    longname[64] = 0;
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, longname, 1, ne, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "64 bytes", "xxxx");
    /* duplicate name */
    fb_header(&b, 3, 2, 0);
    fb_tensor(&b, "t.same", 1, ne, EM_TYPE_F32, 0);
    fb_tensor(&b, "t.same", 1, ne, EM_TYPE_F32, 32);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 16);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 16);
    expect_fail(&b, EM_EFORMAT, "duplicate tensor name", "t.same");
    /* misaligned offset */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.mis", 1, ne, EM_TYPE_F32, 4);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 24);
    expect_fail(&b, EM_EFORMAT, "t.mis", "not a multiple of the alignment");
    /* data running past the end (and an offset far past it) */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.short", 1, ne, EM_TYPE_F32, 0);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 12);
    expect_fail(&b, EM_EFORMAT, "t.short", "past the end");
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.far", 1, ne, EM_TYPE_F32, UINT64_MAX - 31);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 16);
    expect_fail(&b, EM_EFORMAT, "t.far", "past the end");
    /* data section starting past the end of the file */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.nodata", 1, ne, EM_TYPE_F32, 0);
    expect_fail(&b, EM_EFORMAT, "data section", "past the end");
    /* overlapping tensors */
    uint64_t ne8[1] = { 8 };
    fb_header(&b, 3, 2, 0);
    fb_tensor(&b, "t.a", 1, ne8, EM_TYPE_F32, 0);
    fb_tensor(&b, "t.b", 1, ne8, EM_TYPE_F32, 0);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 24);
    fb_put(&b, k_f32_data, 8);
    expect_fail(&b, EM_EFORMAT, "t.b", "overlaps tensor 't.a'");
    /* truncated tensor info */
    fb_header(&b, 3, 1, 0);
    fb_tensor(&b, "t.cut", 2, ne, EM_TYPE_F32, 0);
    b.len -= 10;
    fb_u64(&b, 0);
    expect_fail(&b, EM_EFORMAT, "truncated", NULL);

    /* zero-element tensors are valid (ggml allows them) and may sit at the very end */
    uint64_t ne0[2] = { 0, 3 };
    fb_header(&b, 3, 2, 0);
    fb_tensor(&b, "t.zero", 2, ne0, EM_TYPE_Q8_0, 32);
    fb_tensor(&b, "t.one", 1, ne, EM_TYPE_F32, 0);
    fb_pad(&b, 32);
    fb_put(&b, k_f32_data, 16);
    fb_pad(&b, 32);
    em_gguf *g;
    OK(em_gguf_open_mem(&g, b.p, b.len, "mem", E));
    assert_int_equal(em_gguf_find_tensor(g, "t.zero")->bytes, 0);
    assert_int_equal(em_gguf_find_tensor(g, "t.zero")->n_elements, 0);
    em_gguf_close(g);
}

/* Every prefix of a valid file that cuts into the header or any tensor's data fails cleanly;
 * every single-byte change either opens or fails cleanly (ASan/UBSan watch the rest). */
static void test_truncation_and_flips(void **state) {
    (void)state;
    const char *path = em_test_path("sweep.gguf");
    write_full_model(path, NULL, 0);
    size_t n;
    uint8_t *bytes = em_test_read(path, &n);
    em_gguf *g = open_ok(path);
    uint64_t needed = 0;
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (t->file_offset + t->bytes > needed) needed = t->file_offset + t->bytes;
    }
    em_gguf_close(g);
    for (size_t len = 0; len < needed; len++) {
        uint8_t *copy = malloc(len ? len : 1); /* exact size, so ASan sees any overread */
        memcpy(copy, bytes, len);
        em_err err = { 0 };
        int rc = em_gguf_open_mem(&g, copy, len, "cut", &err);
        if (rc != EM_EFORMAT) fail_msg("prefix %zu: rc %d (%s)", len, rc, err.msg);
        assert_non_null(strstr(err.msg, "cut: "));
        free(copy);
    }
    uint8_t *copy = malloc(n);
    static const uint8_t values[] = { 0x00, 0xff, 0x7f, 0x80, 0x01 };
    for (size_t i = 0; i < n; i++) {
        for (size_t v = 0; v < sizeof values; v++) {
            memcpy(copy, bytes, n);
            copy[i] = values[v];
            em_err err = { 0 };
            if (em_gguf_open_mem(&g, copy, n, "flip", &err) == EM_OK) {
                for (int64_t k = 0; k < em_gguf_n_keys(g); k++) (void)em_gguf_value_at(g, k);
                em_gguf_close(g);
            } else {
                assert_true(err.msg[0] != 0);
            }
        }
    }
    free(copy);
    free(bytes);
}

static void test_getters(void **state) {
    (void)state;
    const char *path = em_test_path("getters.gguf");
    write_full_model(path, NULL, 0);
    em_gguf *g = open_ok(path);
    em_err err = { 0 };
    uint32_t u32;
    int64_t i64;
    double f;
    assert_int_equal(em_gguf_get_u32(g, "t.i32", &u32, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "t.i32"));
    assert_non_null(strstr(err.msg, "is i32, expected u32"));
    assert_int_equal(em_gguf_get_u32(g, "a.str", &u32, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "array of str"));
    assert_int_equal(em_gguf_get_u32(g, "no.such", &u32, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "no.such"));
    assert_non_null(strstr(err.msg, path));
    OK(em_gguf_get_u32(g, "t.u32", &u32, E));
    assert_int_equal(u32, 4000000000u);
    static const char *const ints[] = { "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32", "t.i64" };
    static const int64_t want[] = { 200, -100, 60000, -30000, 4000000000ll, -2000000000, INT64_MIN };
    for (int i = 0; i < 7; i++) {
        OK(em_gguf_get_int(g, ints[i], &i64, E));
        assert_true(i64 == want[i]);
    }
    assert_int_equal(em_gguf_get_int(g, "t.u64", &i64, &err), EM_EOVERFLOW);
    assert_int_equal(em_gguf_get_int(g, "t.f32", &i64, &err), EM_EFORMAT);
    OK(em_gguf_get_float(g, "t.f32", &f, E));
    assert_true(f == 3.5);
    OK(em_gguf_get_float(g, "t.f64", &f, E));
    assert_true(f == -1e300);
    assert_int_equal(em_gguf_get_float(g, "t.u8", &f, &err), EM_EFORMAT);
    char small[4];
    assert_int_equal(em_gguf_get_cstr(g, "t.str", small, sizeof small, &err), EM_EOVERFLOW);
    assert_int_equal(em_gguf_get_cstr(g, "t.nul", small, sizeof small, &err), EM_EFORMAT);
    em_gguf_str s;
    OK(em_gguf_get_str(g, "t.nul", &s, E));
    assert_int_equal(s.len, 3);
    const em_gguf_arr *a;
    OK(em_gguf_get_arr(g, "a.i16", &a, E));
    int16_t i16[2];
    int32_t i32[2];
    assert_int_equal(em_gguf_arr_copy(a, EM_GGUF_I32, i32, 2, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "a.i16"));
    assert_int_equal(em_gguf_arr_copy(a, EM_GGUF_I16, i16, 3, &err), EM_EINVAL);
    OK(em_gguf_arr_get_int(a, 0, &i64, E));
    assert_int_equal(i64, -32768);
    assert_int_equal(em_gguf_arr_get_int(a, 2, &i64, &err), EM_EINVAL);
    OK(em_gguf_get_arr(g, "a.f32", &a, E));
    assert_int_equal(em_gguf_arr_get_int(a, 0, &i64, &err), EM_EFORMAT);
    const em_gguf_tensor *t;
    assert_int_equal(em_gguf_get_tensor(g, "missing.weight", &t, &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, "missing.weight"));
    /* iteration sees file order */
    assert_string_equal(em_gguf_key(g, 0), "general.architecture");
    assert_string_equal(em_gguf_key(g, 1), "t.u8");
    assert_string_equal(em_gguf_type_name(EM_GGUF_ARRAY), "array");
    assert_string_equal(em_gguf_type_name(99), "unknown");
    em_gguf_close(g);
}

/* Copying every value of a model into a new one reproduces its metadata bytes. */
static void test_copy_values(void **state) {
    (void)state;
    const char *src = em_test_path("src.gguf"), *dst = em_test_path("copy.gguf");
    write_full_model(src, NULL, 0);
    em_gguf *g = open_ok(src);
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, dst, NULL, E));
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        em_gguf_value v = em_gguf_value_at(g, i);
        OK(em_gguf_writer_set_value(w, em_gguf_key(g, i), &v, E));
    }
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        OK(em_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, E));
    }
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        OK(em_gguf_writer_write_tensor(w, t->name, t->data, t->bytes, E));
    }
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    em_gguf_close(g);
    size_t n1, n2;
    uint8_t *a = em_test_read(src, &n1), *b = em_test_read(dst, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
}

static void test_determinism(void **state) {
    (void)state;
    const char *p1 = em_test_path("det1.gguf"), *p2 = em_test_path("det2.gguf");
    write_full_model(p1, NULL, 64);
    write_full_model(p2, NULL, 64);
    size_t n1, n2;
    uint8_t *a = em_test_read(p1, &n1), *b = em_test_read(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    /* padding is zeros: every byte between the header and the data, and after each tensor */
    em_gguf *g = open_ok(p1);
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        uint64_t end = t->file_offset + t->bytes, next = (end + 63) / 64 * 64;
        for (uint64_t k = end; k < next; k++) assert_int_equal(a[k], 0);
    }
    em_gguf_close(g);
    free(a);
    free(b);
}

/* ---- splits ---------------------------------------------------------------------------- */

/* n tensors "s.I" of 64 f32 each (value I*1000 + j), one key, split by max bytes. */
static void write_split_model(const char *path, int n, uint64_t max_bytes, uint32_t alignment) {
    em_gguf_write_opts opts = { .max_shard_bytes = max_bytes };
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, &opts, E));
    if (alignment) OK(em_gguf_writer_set_u32(w, "general.alignment", alignment, E));
    OK(em_gguf_writer_set_str(w, "general.name", "splitty", E));
    int64_t ne = 64;
    char name[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "s.%d", i);
        OK(em_gguf_writer_add_tensor(w, name, EM_TYPE_F32, 1, &ne, E));
    }
    float data[64];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 64; j++) data[j] = (float)(i * 1000 + j);
        snprintf(name, sizeof name, "s.%d", i);
        OK(em_gguf_writer_write_tensor(w, name, data, sizeof data, E));
    }
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
}

static void check_split_model(em_gguf *g, int n) {
    char name[32];
    assert_int_equal(em_gguf_n_tensors(g), n);
    int last_shard = 0;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "s.%d", i);
        const em_gguf_tensor *t = em_gguf_find_tensor(g, name);
        assert_non_null(t);
        assert_ptr_equal(t, em_gguf_tensor_at(g, i)); /* shard order, then file order */
        assert_true(t->shard >= last_shard);
        last_shard = t->shard;
        const float *d = t->data;
        for (int j = 0; j < 64; j++) assert_true(d[j] == (float)(i * 1000 + j));
    }
    assert_int_equal(last_shard, em_gguf_n_shards(g) - 1);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    void *p = em_test_read(from, &n);
    em_test_write(to, p, n);
    free(p);
}

static void test_split(void **state) {
    (void)state;
    const char *path = em_test_path("m.gguf");
    /* 7 tensors of 256 bytes, at most 800 bytes a file: two tensors a shard, 4 shards */
    write_split_model(path, 7, 800, 0);
    char shard[4][512];
    for (int i = 0; i < 4; i++) snprintf(shard[i], sizeof shard[i], "%s/m-%05d-of-00004.gguf", em_test_dir(), i + 1);
    assert_false(em_file_exists(path));
    for (int i = 0; i < 4; i++) {
        size_t n;
        void *p = em_test_read(shard[i], &n);
        assert_true(n <= 800);
        free(p);
    }
    corpus_save_file("split-00001-of-00004", shard[0]);
    corpus_save_file("split-00003-of-00004", shard[2]);

    /* any shard opens the whole model, with shard 0's metadata */
    for (int s = 0; s < 4; s++) {
        em_gguf *g = open_ok(shard[s]);
        assert_int_equal(em_gguf_n_shards(g), 4);
        check_split_model(g, 7);
        char name[32];
        OK(em_gguf_get_cstr(g, "general.name", name, sizeof name, E));
        assert_string_equal(name, "splitty");
        uint16_t no, count;
        int32_t total;
        OK(em_gguf_get_u16(g, "split.no", &no, E));
        OK(em_gguf_get_u16(g, "split.count", &count, E));
        OK(em_gguf_get_i32(g, "split.tensors.count", &total, E));
        assert_int_equal(no, 0);
        assert_int_equal(count, 4);
        assert_int_equal(total, 7);
        for (int k = 0; k < 4; k++) assert_string_equal(em_gguf_shard_at(g, k)->path, shard[k]);
        em_gguf_close(g);
    }
    /* the other shards carry only the split keys, as gguf-split writes them */
    em_gguf *g;
    OK(em_gguf_open_single(&g, shard[2], E));
    assert_int_equal(em_gguf_n_shards(g), 1);
    assert_int_equal(em_gguf_n_keys(g), 3);
    assert_string_equal(em_gguf_key(g, 0), "split.no");
    assert_string_equal(em_gguf_key(g, 1), "split.count");
    assert_string_equal(em_gguf_key(g, 2), "split.tensors.count");
    uint16_t no;
    OK(em_gguf_get_u16(g, "split.no", &no, E));
    assert_int_equal(no, 2);
    em_gguf_close(g);

    /* determinism holds for splits too */
    const char *again = em_test_path("again/m.gguf");
    assert_int_equal(em_test_sh(0, "mkdir -p '%s/again'", em_test_dir()), 0);
    write_split_model(again, 7, 800, 0);
    for (int i = 0; i < 4; i++) {
        char other[600];
        snprintf(other, sizeof other, "%s/again/m-%05d-of-00004.gguf", em_test_dir(), i + 1);
        size_t n1, n2;
        uint8_t *a = em_test_read(shard[i], &n1), *b = em_test_read(other, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(a, b, n1);
        free(a);
        free(b);
    }

    /* a missing shard */
    char moved[600];
    snprintf(moved, sizeof moved, "%s.away", shard[3]);
    assert_int_equal(rename(shard[3], moved), 0);
    em_err err = { 0 };
    assert_int_equal(em_gguf_open(&g, shard[0], &err), EM_ENOTFOUND);
    assert_non_null(strstr(err.msg, shard[3]));
    assert_int_equal(rename(moved, shard[3]), 0);

    /* a shard in the wrong place */
    char saved[600];
    snprintf(saved, sizeof saved, "%s.saved", shard[1]);
    copy_file(shard[1], saved);
    copy_file(shard[2], shard[1]);
    assert_int_equal(em_gguf_open(&g, shard[0], &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "split.no 2"));
    assert_non_null(strstr(err.msg, shard[1]));

    /* a shard of another model (same shard count, other tensor total) */
    const char *other = em_test_path("o.gguf");
    write_split_model(other, 8, 800, 0);
    char other2[600];
    snprintf(other2, sizeof other2, "%s/o-00002-of-00004.gguf", em_test_dir());
    copy_file(other2, shard[1]);
    assert_int_equal(em_gguf_open(&g, shard[0], &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "split.tensors.count"));
    copy_file(saved, shard[1]);
    g = open_ok(shard[1]);
    em_gguf_close(g);

    /* a shard whose name does not say where the others are */
    const char *lone = em_test_path("lone.gguf");
    copy_file(shard[1], lone);
    assert_int_equal(em_gguf_open(&g, lone, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "-00002-of-00004.gguf"));
    OK(em_gguf_open_single(&g, lone, E));
    em_gguf_close(g);

    /* alignment 64 carries into every shard */
    const char *a64 = em_test_path("a64.gguf");
    write_split_model(a64, 5, 900, 64);
    char first[600];
    snprintf(first, sizeof first, "%s/a64-00001-of-00003.gguf", em_test_dir());
    g = open_ok(first);
    assert_int_equal(em_gguf_n_shards(g), 3);
    check_split_model(g, 5);
    for (int s = 0; s < 3; s++) {
        const em_gguf_shard *sh = em_gguf_shard_at(g, s);
        assert_int_equal(sh->alignment, 64);
        assert_int_equal(sh->data_offset % 64, 0);
    }
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++)
        assert_int_equal(em_gguf_tensor_at(g, i)->offset % 64, 0);
    em_gguf_close(g);

    /* a budget that fits everything writes one plain file */
    const char *one = em_test_path("one.gguf");
    write_split_model(one, 3, 1u << 30, 0);
    g = open_ok(one);
    assert_int_equal(em_gguf_n_shards(g), 1);
    assert_int_equal(em_gguf_find_key(g, "split.count"), -1);
    check_split_model(g, 3);
    em_gguf_close(g);

    /* a tensor bigger than the budget gets a shard of its own, never split */
    const char *tiny = em_test_path("tiny.gguf");
    write_split_model(tiny, 3, 64, 0);
    snprintf(first, sizeof first, "%s/tiny-00002-of-00003.gguf", em_test_dir());
    g = open_ok(first);
    check_split_model(g, 3);
    for (int s = 0; s < 3; s++) assert_int_equal(em_gguf_shard_at(g, s)->n_tensors, 1);
    em_gguf_close(g);
}

/* Hand-made split sets: split keys of the wrong type, a bad split.no, a wrong total. */
static void test_split_bad_keys(void **state) {
    (void)state;
    fb b;
    char path[600];
    snprintf(path, sizeof path, "%s/h-00001-of-00002.gguf", em_test_dir());
    fb_header(&b, 3, 0, 2);
    fb_kv_u16(&b, "split.no", 0);
    fb_kv_u32(&b, "split.count", 2);
    em_test_write(path, b.p, b.len);
    em_gguf *g;
    em_err err = { 0 };
    assert_int_equal(em_gguf_open(&g, path, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "split.count"));
    assert_non_null(strstr(err.msg, "u16"));

    fb_header(&b, 3, 0, 2);
    fb_kv_u16(&b, "split.no", 5);
    fb_kv_u16(&b, "split.count", 2);
    em_test_write(path, b.p, b.len);
    assert_int_equal(em_gguf_open(&g, path, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "split.no 5"));

    /* split.count 1 with a wrong total */
    fb_header(&b, 3, 0, 3);
    fb_kv_u16(&b, "split.no", 0);
    fb_kv_u16(&b, "split.count", 1);
    fb_kv_i32(&b, "split.tensors.count", 4);
    em_test_write(path, b.p, b.len);
    assert_int_equal(em_gguf_open(&g, path, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "split.tensors.count"));
}

/* ---- the writer's own checks and clean-up ------------------------------------------------ */

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* skip_data leaves holes: the file equals one written with zeros there, byte for byte, in a
 * single file and across split shards (a shard may end in a hole), and a skipped 64 MiB tensor
 * takes next to no disk space. */
static void write_holey(const char *path, uint64_t max_shard, bool skip, bool overrun) {
    em_gguf_writer *w;
    em_gguf_write_opts opts = { .max_shard_bytes = max_shard };
    OK(em_gguf_writer_create(&w, path, &opts, E));
    OK(em_gguf_writer_set_str(w, "general.name", "holes", E));
    const uint64_t big_bytes = (uint64_t)(16 << 20) * 4;
    const int64_t big[1] = { 16 << 20 }, small[1] = { 40 }, mid[2] = { 64, 3 };
    OK(em_gguf_writer_add_tensor(w, "a", EM_TYPE_F32, 1, small, E));
    OK(em_gguf_writer_add_tensor(w, "big", EM_TYPE_F32, 1, big, E));
    OK(em_gguf_writer_add_tensor(w, "b", EM_TYPE_Q8_0, 2, mid, E));
    OK(em_gguf_writer_add_tensor(w, "c", EM_TYPE_F32, 1, small, E));
    float v[40];
    for (int i = 0; i < 40; i++) v[i] = (float)i - 7.5f;
    uint8_t *zeros = calloc(1, (size_t)big_bytes + 4096); /* covers "big" and what follows it */
    assert_non_null(zeros);
    OK(em_gguf_writer_write_tensor(w, "a", v, sizeof v, E));
    /* "big", "b" and the first half of "c" as one skip (it crosses tensor boundaries), then
     * the rest of "c": the file (or its last shard) ends in a hole */
    uint64_t first = big_bytes + 3 * 68 + 80;
    if (skip) {
        OK(em_gguf_writer_skip_data(w, first, E));
        OK(em_gguf_writer_skip_data(w, 80, E));
    } else {
        OK(em_gguf_writer_write_data(w, zeros, first, E));
        OK(em_gguf_writer_write_data(w, zeros, 80, E));
    }
    free(zeros);
    if (overrun) {
        em_err err = { 0 };
        assert_int_equal(em_gguf_writer_skip_data(w, 1, &err), EM_EINVAL);
        assert_non_null(strstr(err.msg, "beyond the declared tensors"));
    } else {
        OK(em_gguf_writer_finish(w, E));
    }
    em_gguf_writer_free(w);
}

static void test_skip_data(void **state) {
    (void)state;
    for (int split = 0; split < 2; split++) {
        /* split: at most 4 KiB a shard, so "big" has a shard of its own and "b", "c" another */
        uint64_t max = split ? 4096 : 0;
        char p0[512], p1[512];
        snprintf(p0, sizeof p0, "%s", em_test_path(split ? "z.gguf" : "zero.gguf"));
        snprintf(p1, sizeof p1, "%s", em_test_path(split ? "h.gguf" : "hole.gguf"));
        write_holey(p0, max, false, false);
        write_holey(p1, max, true, false);
        int n = split ? 3 : 1;
        uint64_t holey_disk = 0, total = 0;
        for (int k = 0; k < n; k++) {
            char a[600], b[600];
            if (split) {
                snprintf(a, sizeof a, "%s/z-%05d-of-%05d.gguf", em_test_dir(), k + 1, n);
                snprintf(b, sizeof b, "%s/h-%05d-of-%05d.gguf", em_test_dir(), k + 1, n);
            } else {
                snprintf(a, sizeof a, "%s", p0);
                snprintf(b, sizeof b, "%s", p1);
            }
            size_t na, nb;
            void *da = em_test_read(a, &na), *db = em_test_read(b, &nb);
            assert_int_equal(na, nb);
            assert_memory_equal(da, db, na);
            free(da);
            free(db);
            struct stat sb;
            assert_int_equal(stat(b, &sb), 0);
            holey_disk += (uint64_t)sb.st_blocks * 512;
            total += (uint64_t)sb.st_size;
        }
        assert_true(total > (uint64_t)(64 << 20));
        /* sparse where the file system supports it (tmpfs, ext4, xfs, btrfs all do) */
        assert_true(holey_disk < (uint64_t)(4 << 20));
        em_gguf *g = open_ok(split ? em_test_path("h-00001-of-00003.gguf") : p1);
        assert_int_equal(em_gguf_n_tensors(g), 4);
        const float *a = em_gguf_find_tensor(g, "a")->data;
        assert_true(a[39] == 31.5f);
        em_gguf_close(g);
    }
    /* data past the declared tensors is refused and the writer cleans up */
    write_holey(em_test_path("over.gguf"), 0, true, true);
    assert_false(em_file_exists(em_test_path("over.gguf")));
}

static void test_writer_misuse(void **state) {
    (void)state;
    assert_int_equal(em_test_sh(0, "mkdir -p '%s/w'", em_test_dir()), 0);
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/w", em_test_dir());
    snprintf(path, sizeof path, "%s/x.gguf", dir);
    em_gguf_writer *w;
    em_err err = { 0 };
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_u32(w, "k", 1, E));
    assert_int_equal(em_gguf_writer_set_u32(w, "k", 2, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "'k'"));
    assert_int_equal(em_gguf_writer_set_u32(w, "", 2, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_set_i32(w, "general.alignment", 32, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_set_u32(w, "general.alignment", 48, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_set_u16(w, "split.no", 0, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_set_arr(w, "s", EM_GGUF_STR, NULL, 0, &err), EM_EINVAL);
    int64_t ne[2] = { 32, 2 }, bad[1] = { 33 }, neg[1] = { -1 };
    char longname[80];
    memset(longname, 'n', 64);
    longname[64] = 0;
    assert_int_equal(em_gguf_writer_add_tensor(w, longname, EM_TYPE_F32, 1, ne, &err), EM_EINVAL);
    longname[63] = 0; /* 63 bytes is fine */
    OK(em_gguf_writer_add_tensor(w, longname, EM_TYPE_F32, 1, ne, E));
    assert_int_equal(em_gguf_writer_add_tensor(w, "", EM_TYPE_F32, 1, ne, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_add_tensor(w, longname, EM_TYPE_F32, 1, ne, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_add_tensor(w, "u", 200, 1, ne, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_gguf_writer_add_tensor(w, "u", EM_TYPE_Q8_0, 1, bad, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_add_tensor(w, "u", EM_TYPE_F32, 1, neg, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_add_tensor(w, "u", EM_TYPE_F32, 5, ne, &err), EM_EINVAL);
    OK(em_gguf_writer_add_tensor(w, "t2", EM_TYPE_F32, 2, ne, E));
    float data[192] = { 0 }; /* 768 bytes: room for the overlong write below */
    assert_int_equal(em_gguf_writer_write_tensor(w, "t2", data, 256, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "out of order"));
    assert_int_equal(em_gguf_writer_write_tensor(w, longname, data, 100, &err), EM_EINVAL);
    OK(em_gguf_writer_write_tensor(w, longname, data, 128, E));
    assert_int_equal(em_gguf_writer_set_u32(w, "late", 1, &err), EM_EINVAL);
    assert_int_equal(em_gguf_writer_add_tensor(w, "late", EM_TYPE_F32, 1, ne, &err), EM_EINVAL);
    OK(em_gguf_writer_write_data(w, data, 100, E));
    /* only 100 of 256 bytes: finish refuses, and nothing is left behind */
    assert_int_equal(em_gguf_writer_finish(w, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "t2"));
    em_gguf_writer_free(w);
    assert_int_equal(count_files(dir), 0);

    /* abandoned mid-way, split: every temporary file goes */
    em_gguf_write_opts opts = { .max_shard_bytes = 300 };
    OK(em_gguf_writer_create(&w, path, &opts, E));
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        OK(em_gguf_writer_add_tensor(w, name, EM_TYPE_F32, 2, ne, E));
    }
    OK(em_gguf_writer_write_data(w, data, 256, E));
    OK(em_gguf_writer_write_data(w, data, 256, E));
    assert_true(count_files(dir) >= 1);
    assert_int_equal(em_gguf_writer_write_data(w, data, 256 * 3, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "beyond the declared tensors"));
    em_gguf_writer_free(w);
    assert_int_equal(count_files(dir), 0);

    /* an unwritable place fails at the first data, naming the file */
    OK(em_gguf_writer_create(&w, "/nonexistent-dir/x.gguf", NULL, E));
    assert_int_equal(em_gguf_writer_finish(w, &err), EM_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.gguf"));
    em_gguf_writer_free(w);

    /* arrays nested too deep are refused by the builder */
    em_gguf_abuf *a;
    OK(em_gguf_abuf_create(&a, EM_GGUF_U8, E));
    for (int level = 1; level < EM_GGUF_MAX_DEPTH; level++) {
        em_gguf_abuf *outer;
        OK(em_gguf_abuf_create(&outer, EM_GGUF_ARRAY, E));
        OK(em_gguf_abuf_push_arr(outer, a, E));
        em_gguf_abuf_free(a);
        a = outer;
    }
    em_gguf_abuf *too_deep;
    OK(em_gguf_abuf_create(&too_deep, EM_GGUF_ARRAY, E));
    assert_int_equal(em_gguf_abuf_push_arr(too_deep, a, &err), EM_EINVAL);
    assert_int_equal(em_gguf_abuf_push_str(a, "x", 1, &err), EM_EINVAL);
    uint8_t one = 1;
    assert_int_equal(em_gguf_abuf_push(a, &one, &err), EM_EINVAL);
    /* the deepest accepted array reads back */
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_abuf(w, "deep", a, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    em_gguf_abuf_free(a);
    em_gguf_abuf_free(too_deep);
    em_gguf *g = open_ok(path);
    em_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_exact_bytes),
        cmocka_unit_test(test_v2_and_versions),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_truncation_and_flips),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_copy_values),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_split_bad_keys),
        cmocka_unit_test(test_writer_misuse),
        cmocka_unit_test(test_skip_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

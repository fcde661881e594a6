/* The `ember` command line, run as a program ($EMBER_BIN): `inspect` (human and --json forms,
 * the JSON checked field by field with jansson against what was written), `tensor` (F32, F16
 * and Q8_0 tensors against values computed here from the stored bits), split models, and the
 * exit codes: 0 done, 1 bad file or unknown tensor (message naming it), 2 usage errors. */
#include "testutil.h"

#include "format/gguf.h"
#include "quant/quant.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_bin;

/* em_test_path's buffers rotate: keep paths that must live across calls in a local copy. */
#define LOCAL_PATH(var, name)                                                                  \
    char var[700];                                                                             \
    snprintf(var, sizeof var, "%s", em_test_path(name))

static int setup(void **state) {
    (void)state;
    g_bin = getenv("EMBER_BIN");
    return 0;
}

#define NEED_BIN()                                                                             \
    do {                                                                                       \
        if (!g_bin || !*g_bin) skip();                                                         \
    } while (0)

static const float k_f32[6] = { 1.0f, -2.5f, 3.25f, 1e-3f, -0.0f, 65504.0f };
/* 1.0, -2.0, 65504 (largest half), 2^-24 (smallest subnormal half) */
static const uint16_t k_f16[4] = { 0x3c00, 0xc000, 0x7bff, 0x0001 };
static const float k_f16_want[4] = { 1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f };

/* Q8_0 block b: scale 0.5 * (b + 1) (exact in fp16: 0x3800, 0x3c00), values (i*5 + b) % 255 - 127 */
static void q8_blocks(uint8_t *out, int n_blocks, float *want) {
    for (int b = 0; b < n_blocks; b++) {
        uint16_t d = b == 0 ? 0x3800 : 0x3c00;
        memcpy(out + 34 * b, &d, 2);
        for (int i = 0; i < 32; i++) {
            int q = (i * 5 + b) % 255 - 127;
            out[34 * b + 2 + i] = (uint8_t)(int8_t)q;
            want[32 * b + i] = 0.5f * (float)(b + 1) * (float)q;
        }
    }
}

static void write_model(const char *path) {
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_str(w, "general.architecture", "llama", E));
    OK(em_gguf_writer_set_u32(w, "llama.block_count", 2, E));
    OK(em_gguf_writer_set_i64(w, "t.neg", -5, E));
    OK(em_gguf_writer_set_f32(w, "t.f32", 0.1f, E));
    OK(em_gguf_writer_set_f64(w, "t.f64", 0.1, E));
    OK(em_gguf_writer_set_bool(w, "t.bool", true, E));
    OK(em_gguf_writer_set_strn(w, "t.str", "q\"\\\n\xc3\xa9", 6, E));
    const char *toks[20];
    char buf[20][8];
    for (int i = 0; i < 20; i++) {
        snprintf(buf[i], sizeof buf[i], "tok%d", i);
        toks[i] = buf[i];
    }
    OK(em_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 20, E));
    static const int32_t types[3] = { 1, 3, -7 };
    OK(em_gguf_writer_set_arr(w, "t.i32s", EM_GGUF_I32, types, 3, E));
    em_gguf_abuf *outer, *sub;
    OK(em_gguf_abuf_create(&outer, EM_GGUF_ARRAY, E));
    OK(em_gguf_abuf_create(&sub, EM_GGUF_U16, E));
    uint16_t v = 9;
    OK(em_gguf_abuf_push(sub, &v, E));
    OK(em_gguf_abuf_push_arr(outer, sub, E));
    OK(em_gguf_writer_set_abuf(w, "t.nested", outer, E));
    em_gguf_abuf_free(sub);
    em_gguf_abuf_free(outer);
    static const int64_t ne_f32[] = { 3, 2 }, ne_f16[] = { 4 }, ne_q8[] = { 32, 2 };
    OK(em_gguf_writer_add_tensor(w, "w.f32", EM_TYPE_F32, 2, ne_f32, E));
    OK(em_gguf_writer_add_tensor(w, "w.f16", EM_TYPE_F16, 1, ne_f16, E));
    OK(em_gguf_writer_add_tensor(w, "w.q8", EM_TYPE_Q8_0, 2, ne_q8, E));
    uint8_t q8[68];
    float want[64];
    q8_blocks(q8, 2, want);
    OK(em_gguf_writer_write_tensor(w, "w.f32", k_f32, sizeof k_f32, E));
    OK(em_gguf_writer_write_tensor(w, "w.f16", k_f16, sizeof k_f16, E));
    OK(em_gguf_writer_write_tensor(w, "w.q8", q8, sizeof q8, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
}

static char *read_text(const char *path) {
    size_t n;
    return em_test_read(path, &n);
}

static void expect_in(const char *path, const char *fragment) {
    char *text = read_text(path);
    if (!strstr(text, fragment)) fail_msg("%s lacks '%s':\n%s", path, fragment, text);
    free(text);
}

static void test_inspect_human(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(model, "model.gguf");
    LOCAL_PATH(out, "out.txt");
    write_model(model);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s'", g_bin, model), 0);
    expect_in(out, "GGUF v3, alignment 32, 1 shard, 10 keys, 3 tensors");
    expect_in(out, "general.architecture");
    expect_in(out, "\"llama\"");
    expect_in(out, "llama.block_count");
    expect_in(out, "[20 str] \"tok0\", \"tok1\", \"tok2\", \"tok3\", \"tok4\", \"tok5\", \"tok6\", \"tok7\", ...");
    expect_in(out, "[3 i32] 1, 3, -7");
    expect_in(out, "[1 array] {[1 u16] 9}");
    expect_in(out, "w.q8");
    expect_in(out, "q8_0");
    expect_in(out, "[32, 2]");
    expect_in(out, "bytes 68");
    expect_in(out, "total: 3 tensors, 74 elements, 100 bytes");

    assert_int_equal(em_test_sh(1, "'%s' inspect --help", g_bin), 0);
    expect_in(out, "usage: ember inspect");
}

static json_t *load_json(const char *path) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) fail_msg("%s: invalid JSON at line %d: %s", path, jerr.line, jerr.text);
    return j;
}

static json_t *find_entry(json_t *list, const char *field, const char *name) {
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
        if (!strcmp(json_string_value(json_object_get(e, field)), name)) return e;
    }
    fail_msg("no entry %s = %s", field, name);
    return NULL;
}

static void test_inspect_json(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(model, "model.gguf");
    write_model(model);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s' --json", g_bin, model), 0);
    json_t *j = load_json(em_test_path("out.txt"));
    assert_string_equal(json_string_value(json_object_get(j, "file")), model);
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "alignment")), 32);
    assert_int_equal(json_integer_value(json_object_get(j, "n_shards")), 1);
    json_t *meta = json_object_get(j, "metadata");
    assert_int_equal(json_array_size(meta), 10);
    /* file order */
    assert_string_equal(json_string_value(json_object_get(json_array_get(meta, 0), "key")),
                        "general.architecture");
    json_t *e = find_entry(meta, "key", "llama.block_count");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "u32");
    assert_int_equal(json_integer_value(json_object_get(e, "value")), 2);
    e = find_entry(meta, "key", "t.neg");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "i64");
    assert_int_equal(json_integer_value(json_object_get(e, "value")), -5);
    e = find_entry(meta, "key", "t.f32"); /* %.9g of 0.1f round-trips the float */
    assert_true((float)json_real_value(json_object_get(e, "value")) == 0.1f);
    e = find_entry(meta, "key", "t.f64");
    assert_true(json_real_value(json_object_get(e, "value")) == 0.1);
    e = find_entry(meta, "key", "t.bool");
    assert_true(json_is_true(json_object_get(e, "value")));
    e = find_entry(meta, "key", "t.str");
    assert_string_equal(json_string_value(json_object_get(e, "value")), "q\"\\\n\xc3\xa9");
    e = find_entry(meta, "key", "tokenizer.ggml.tokens");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "array");
    assert_string_equal(json_string_value(json_object_get(e, "elem_type")), "str");
    json_t *arr = json_object_get(e, "value");
    assert_int_equal(json_array_size(arr), 20);
    assert_string_equal(json_string_value(json_array_get(arr, 19)), "tok19");
    e = find_entry(meta, "key", "t.i32s");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(e, "value"), 2)), -7);
    e = find_entry(meta, "key", "t.nested");
    assert_string_equal(json_string_value(json_object_get(e, "elem_type")), "array");
    json_t *item = json_array_get(json_object_get(e, "value"), 0);
    assert_string_equal(json_string_value(json_object_get(item, "elem_type")), "u16");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(item, "value"), 0)), 9);

    json_t *tensors = json_object_get(j, "tensors");
    assert_int_equal(json_array_size(tensors), 3);
    e = json_array_get(tensors, 2);
    assert_string_equal(json_string_value(json_object_get(e, "name")), "w.q8");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "q8_0");
    assert_int_equal(json_integer_value(json_object_get(e, "type_id")), 8);
    json_t *shape = json_object_get(e, "shape");
    assert_int_equal(json_array_size(shape), 2);
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), 32);
    assert_int_equal(json_integer_value(json_array_get(shape, 1)), 2);
    assert_int_equal(json_integer_value(json_object_get(e, "shard")), 0);
    assert_int_equal(json_integer_value(json_object_get(e, "offset")), 64); /* 24 -> 32, 8 -> 32 */
    assert_int_equal(json_integer_value(json_object_get(e, "bytes")), 68);
    json_decref(j);
}

/* Values JSON numbers cannot carry exactly or at all, and bytes that are not UTF-8. */
static void test_inspect_json_edges(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(path, "edges.gguf");
    LOCAL_PATH(out, "out.txt");
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, NULL, E));
    OK(em_gguf_writer_set_u64(w, "u64.max", UINT64_MAX, E));
    OK(em_gguf_writer_set_i64(w, "i64.min", INT64_MIN, E));
    OK(em_gguf_writer_set_f32(w, "f.nan", NAN, E));
    OK(em_gguf_writer_set_f32(w, "f.inf", INFINITY, E));
    OK(em_gguf_writer_set_f64(w, "f.ninf", -INFINITY, E));
    OK(em_gguf_writer_set_f32(w, "f.third", 1.0f / 3.0f, E));
    OK(em_gguf_writer_set_f64(w, "d.third", 1.0 / 3.0, E));
    OK(em_gguf_writer_set_strn(w, "s.bad", "a\xff\xc3(\x01", 5, E));
    OK(em_gguf_writer_finish(w, E));
    em_gguf_writer_free(w);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s' --json", g_bin, path), 0);
    expect_in(out, "\"value\": 18446744073709551615}");
    expect_in(out, "\"value\": -9223372036854775808}");
    expect_in(out, "\"key\": \"f.nan\", \"type\": \"f32\", \"value\": \"nan\"}");
    expect_in(out, "\"value\": \"inf\"}");
    expect_in(out, "\"value\": \"-inf\"}");
    expect_in(out, "\"value\": 0.333333343}");
    expect_in(out, "\"value\": 0.33333333333333331}");
    expect_in(out, "\"value\": \"a\\u00ff\\u00c3(\\u0001\"}");
    /* still one valid JSON object (big integers as reals) */
    json_error_t jerr;
    json_t *j = json_load_file(out, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!j) fail_msg("invalid JSON: %s", jerr.text);
    json_decref(j);
}

static void check_f32_file(const char *path, const float *want, size_t n) {
    float *got = em_test_read_f32(path, n);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4)) fail_msg("%s[%zu] = %g, want %g", path, i, got[i], want[i]);
    free(got);
}

static void test_tensor(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(model, "model.gguf");
    LOCAL_PATH(out, "t.f32");
    LOCAL_PATH(err, "err.txt");
    write_model(model);
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' w.f32 -o '%s'", g_bin, model, out), 0);
    check_f32_file(out, k_f32, 6);
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' w.f16 --output '%s'", g_bin, model, out), 0);
    check_f32_file(out, k_f16_want, 4);
    uint8_t q8[68];
    float want[64];
    q8_blocks(q8, 2, want);
    assert_int_equal(em_test_sh(1, "'%s' tensor -o '%s' '%s' w.q8", g_bin, out, model), 0);
    check_f32_file(out, want, 64);

    /* an unknown tensor: exit 1 naming it, and no output file */
    LOCAL_PATH(none, "none.f32");
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' no.such -o '%s'", g_bin, model, none), 1);
    expect_in(err, "no.such");
    assert_false(em_file_exists(none));
}

static void test_usage_and_failures(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(model, "model.gguf");
    LOCAL_PATH(err, "err.txt");
    write_model(model);
    static const char *const usage_cases[] = {
        "inspect",
        "inspect --bogus MODEL",
        "inspect MODEL extra",
        "tensor",
        "tensor MODEL",
        "tensor MODEL w.f32",
        "tensor MODEL w.f32 -o",
        "tensor MODEL w.f32 -x o.f32",
        "tensor MODEL w.f32 extra -o o.f32",
    };
    for (size_t i = 0; i < sizeof usage_cases / sizeof *usage_cases; i++) {
        char args[1024];
        const char *m = strstr(usage_cases[i], "MODEL");
        if (m) snprintf(args, sizeof args, "%.*s'%s'%s", (int)(m - usage_cases[i]), usage_cases[i], model, m + 5);
        else snprintf(args, sizeof args, "%s", usage_cases[i]);
        int rc = em_test_sh(1, "cd '%s' && '%s' %s", em_test_dir(), g_bin, args);
        if (rc != 2) fail_msg("'ember %s' exited %d, want 2", args, rc);
        expect_in(err, "usage: ember");
    }
    /* a file that is not GGUF, a missing file, a truncated file: exit 1 naming the file */
    LOCAL_PATH(junk, "junk.gguf");
    em_test_write(junk, "this is not a model at all, just text\n", 38);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s'", g_bin, junk), 1);
    expect_in(err, junk);
    expect_in(err, "not a GGUF file");
    assert_int_equal(em_test_sh(1, "'%s' inspect --json '%s'", g_bin, junk), 1);
    LOCAL_PATH(missing, "missing.gguf");
    LOCAL_PATH(xf32, "x.f32");
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s'", g_bin, missing), 1);
    expect_in(err, missing);
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' w -o '%s'", g_bin, missing, xf32), 1);
    size_t n;
    void *bytes = em_test_read(model, &n);
    LOCAL_PATH(cut, "cut.gguf");
    em_test_write(cut, bytes, n - 40);
    free(bytes);
    /* inspect reads metadata only: a cut file (an unfinished download) is shown, with a
       warning naming what is missing; reading the cut tensor fails */
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s'", g_bin, cut), 0);
    expect_in(err, "w.q8");
    expect_in(err, "bytes short");
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' w.q8 -o '%s'", g_bin, cut, xf32), 1);
    expect_in(err, "past the end");
}

static void test_split_inspect(void **state) {
    (void)state;
    NEED_BIN();
    LOCAL_PATH(path, "sp.gguf");
    LOCAL_PATH(outtxt, "out.txt");
    LOCAL_PATH(out, "b.f32");
    em_gguf_write_opts opts = { .max_shard_bytes = 400 };
    em_gguf_writer *w;
    OK(em_gguf_writer_create(&w, path, &opts, E));
    OK(em_gguf_writer_set_str(w, "general.architecture", "llama", E));
    int64_t ne = 64;
    float data[64];
    for (int i = 0; i < 64; i++) data[i] = (float)i;
    OK(em_gguf_writer_add_tensor(w, "a", EM_TYPE_F32, 1, &ne, E));
    OK(em_gguf_writer_add_tensor(w, "b", EM_TYPE_F32, 1, &ne, E));
    OK(em_gguf_writer_write_tensor(w, "a", data, sizeof data, E));
    OK(em_gguf_writer_write_tensor(w, "b", data, sizeof data, E));
    OK(em_gguf_writer_finish(w, E));
    assert_int_equal(em_gguf_writer_n_shards(w), 2);
    char second[600];
    snprintf(second, sizeof second, "%s", em_gguf_writer_shard_path(w, 1));
    em_gguf_writer_free(w);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s' --json", g_bin, second), 0);
    json_t *j = load_json(outtxt);
    assert_int_equal(json_integer_value(json_object_get(j, "n_shards")), 2);
    json_t *tensors = json_object_get(j, "tensors");
    assert_int_equal(json_array_size(tensors), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(tensors, 1), "shard")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(tensors, 1), "offset")), 0);
    find_entry(json_object_get(j, "metadata"), "key", "split.count");
    json_decref(j);
    assert_int_equal(em_test_sh(1, "'%s' tensor '%s' b -o '%s'", g_bin, second, out), 0);
    check_f32_file(out, data, 64);
    assert_int_equal(em_test_sh(1, "'%s' inspect '%s'", g_bin, second), 0);
    expect_in(outtxt, "2 shards");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_human),
        cmocka_unit_test(test_inspect_json),
        cmocka_unit_test(test_inspect_json_edges),
        cmocka_unit_test(test_tensor),
        cmocka_unit_test(test_usage_and_failures),
        cmocka_unit_test(test_split_inspect),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

/* libFuzzer target for the GGUF reader: parses the input from memory and, when it opens,
 * touches everything the API hands out (every key through the generic and the typed getters,
 * every array element at every nesting level, every string byte, the first and last byte of
 * every tensor), so ASan/UBSan see any read outside the input. Seeds: fuzz/corpus/gguf/
 * (written by tests/test_gguf with EMBER_WRITE_CORPUS set). */
#include "format/gguf.h"

#include <stdint.h>
#include <string.h>

static uint64_t g_sink; /* keeps the reads from being optimized away */

static void touch_value(const em_gguf_value *v);

static void touch_bytes(const char *p, uint64_t n) {
    uint64_t h = 0;
    for (uint64_t i = 0; i < n; i++) h = h * 31 + (uint8_t)p[i];
    g_sink += h;
}

static void touch_array(const em_gguf_arr *a) {
    uint64_t n = em_gguf_arr_count(a);
    int type = em_gguf_arr_type(a);
    g_sink += (uint64_t)type + n + strlen(em_gguf_arr_key(a));
    for (uint64_t i = 0; i < n; i++) {
        em_gguf_value e = em_gguf_arr_at(a, i);
        touch_value(&e);
        int64_t x;
        if (em_gguf_arr_get_int(a, i, &x, NULL) == EM_OK) g_sink += (uint64_t)x;
    }
    uint8_t buf[64];
    int size = em_gguf_type_size(type);
    if (size > 0 && n * (uint64_t)size <= sizeof buf &&
        em_gguf_arr_copy(a, type, buf, n, NULL) == EM_OK)
        touch_bytes((const char *)buf, n * (uint64_t)size);
}

static void touch_value(const em_gguf_value *v) {
    switch (v->type) {
    case EM_GGUF_STR: touch_bytes(v->str.ptr, v->str.len); break;
    case EM_GGUF_ARRAY: touch_array(v->arr); break;
    case EM_GGUF_F32: g_sink += (uint64_t)(v->f32 == v->f32); break;
    case EM_GGUF_F64: g_sink += (uint64_t)(v->f64 == v->f64); break;
    case EM_GGUF_BOOL: g_sink += v->b; break;
    default: g_sink += v->u; break;
    }
}

static void touch_getters(const em_gguf *g, const char *key) {
    union { uint64_t u; int64_t i; double d; float f; bool b; } x;
    em_gguf_str s;
    const em_gguf_arr *a;
    char buf[32];
    em_err err;
    g_sink += (uint64_t)em_gguf_get_u8(g, key, (uint8_t *)&x, &err);
    g_sink += (uint64_t)em_gguf_get_i16(g, key, (int16_t *)&x, &err);
    g_sink += (uint64_t)em_gguf_get_u32(g, key, (uint32_t *)&x, &err);
    g_sink += (uint64_t)em_gguf_get_i64(g, key, &x.i, &err);
    g_sink += (uint64_t)em_gguf_get_f32(g, key, &x.f, &err);
    g_sink += (uint64_t)em_gguf_get_bool(g, key, &x.b, &err);
    g_sink += (uint64_t)em_gguf_get_int(g, key, &x.i, &err);
    g_sink += (uint64_t)em_gguf_get_float(g, key, &x.d, &err);
    g_sink += (uint64_t)em_gguf_get_str(g, key, &s, &err);
    g_sink += (uint64_t)em_gguf_get_cstr(g, key, buf, sizeof buf, &err);
    g_sink += (uint64_t)em_gguf_get_arr(g, key, &a, &err);
    g_sink += strlen(err.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em_gguf *g;
    em_err err;
    if (em_gguf_open_mem(&g, data, size, "fuzz", &err) != EM_OK) {
        g_sink += strlen(err.msg);
        return 0;
    }
    g_sink += em_gguf_version(g) + em_gguf_alignment(g) + (uint64_t)em_gguf_n_shards(g);
    const em_gguf_shard *sh = em_gguf_shard_at(g, 0);
    g_sink += sh->data_offset + sh->file_size + (uint64_t)sh->n_tensors;
    for (int64_t i = 0; i < em_gguf_n_keys(g); i++) {
        const char *key = em_gguf_key(g, i);
        em_gguf_value v = em_gguf_value_at(g, i);
        if (em_gguf_find_key(g, key) != i) __builtin_trap(); /* keys are unique */
        touch_value(&v);
        touch_getters(g, key);
    }
    for (int64_t i = 0; i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        if (em_gguf_find_tensor(g, t->name) != t) __builtin_trap(); /* names are unique */
        const uint8_t *p = t->data;
        if (t->bytes) g_sink += p[0] + p[t->bytes - 1];
        if (t->file_offset + t->bytes > size) __builtin_trap();
        g_sink += t->n_elements + (uint64_t)t->type;
    }
    em_gguf_close(g);
    return 0;
}

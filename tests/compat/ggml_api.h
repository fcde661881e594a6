/* tests/compat: the slice of ggml's public C ABI (ggml.h, gguf.h) that the compat programs call,
 * declared here because the npm prebuilt ships no headers, and loaded at run time with dlopen
 * from the prebuilt's libggml-base.so.
 *
 * The declarations follow ggml.h / gguf.h of ggml-org/ggml as of August 2026 (the prebuilt
 * reports llama_version 0.5.0-dev). Nothing here is trusted blindly: ggml_lib_check_layout()
 * creates tensors through ggml and checks every struct field the programs touch (ggml_tensor's
 * type/ne/nb/data/name, ggml_type_traits, ggml_init_params) against ggml's own accessors, and
 * round-trips a one-tensor GGUF in memory (gguf_init_params, the gguf prototypes), so a
 * prebuilt with another layout fails loudly instead of producing wrong comparisons.
 *
 * Header-only (static functions) because each compat program (one .c file each) is its own executable. */
#ifndef EM_COMPAT_GGML_API_H
#define EM_COMPAT_GGML_API_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- ggml.h ------------------------------------------------------------------------ */

#define GGML_MAX_DIMS 4
#define GGML_MAX_SRC 10
#define GGML_MAX_OP_PARAMS 64
#define GGML_MAX_NAME 64

/* enum ggml_type values (the ids GGUF stores); the compat programs pass them as int. */
enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10, GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14, GGML_TYPE_Q8_K = 15, GGML_TYPE_IQ2_XXS = 16, GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18, GGML_TYPE_IQ1_S = 19, GGML_TYPE_IQ4_NL = 20, GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22, GGML_TYPE_IQ4_XS = 23, GGML_TYPE_I8 = 24, GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26, GGML_TYPE_I64 = 27, GGML_TYPE_F64 = 28, GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30, GGML_TYPE_TQ1_0 = 34, GGML_TYPE_TQ2_0 = 35, GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_NVFP4 = 40, GGML_TYPE_Q1_0 = 41, GGML_TYPE_Q2_0 = 42,
};

struct ggml_context;
struct ggml_backend_buffer;

struct ggml_init_params {
    size_t mem_size;   /* bytes */
    void *mem_buffer;  /* NULL: ggml allocates */
    bool no_alloc;     /* do not allocate tensor data */
};

/* enum fields (type, op) are int-sized in ggml's ABI. */
struct ggml_tensor {
    int type;
    struct ggml_backend_buffer *buffer;
    int64_t ne[GGML_MAX_DIMS];
    size_t nb[GGML_MAX_DIMS];
    int op;
    int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags;
    struct ggml_tensor *src[GGML_MAX_SRC];
    struct ggml_tensor *view_src;
    size_t view_offs;
    void *data;
    char name[GGML_MAX_NAME];
    void *extra;
    char padding[8];
};

/* ggml's ggml_object header that precedes every tensor in a context (ggml.c). */
#define GGML_OBJECT_SIZE 32

typedef void (*ggml_to_float_t)(const void *x, float *y, int64_t k);
typedef void (*ggml_from_float_t)(const float *x, void *y, int64_t k);

struct ggml_type_traits {
    const char *type_name;
    int64_t blck_size;
    int64_t blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    ggml_to_float_t to_float;
    ggml_from_float_t from_float_ref;
};

/* ---- gguf.h ------------------------------------------------------------------------ */

enum {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12, GGUF_TYPE_COUNT = 13,
};

struct gguf_context;

struct gguf_init_params {
    bool no_alloc;
    struct ggml_context **ctx; /* non-NULL: create a ggml context holding the tensors */
};

/* ---- the loaded library ------------------------------------------------------------ */

/* X(return type, name, parameter list): every function the compat programs call. */
#define GGML_LIB_FUNCS(X)                                                                     \
    X(struct ggml_context *, ggml_init, (struct ggml_init_params params))                      \
    X(void, ggml_free, (struct ggml_context * ctx))                                           \
    X(struct ggml_tensor *, ggml_new_tensor,                                                  \
      (struct ggml_context * ctx, int type, int n_dims, const int64_t *ne))                   \
    X(struct ggml_tensor *, ggml_set_name, (struct ggml_tensor * t, const char *name))        \
    X(const char *, ggml_get_name, (const struct ggml_tensor *t))                             \
    X(struct ggml_tensor *, ggml_get_tensor, (struct ggml_context * ctx, const char *name))   \
    X(void *, ggml_get_data, (const struct ggml_tensor *t))                                   \
    X(int64_t, ggml_nelements, (const struct ggml_tensor *t))                                 \
    X(size_t, ggml_nbytes, (const struct ggml_tensor *t))                                     \
    X(int, ggml_n_dims, (const struct ggml_tensor *t))                                        \
    X(size_t, ggml_tensor_overhead, (void))                                                   \
    X(int64_t, ggml_blck_size, (int type))                                                    \
    X(size_t, ggml_type_size, (int type))                                                     \
    X(size_t, ggml_row_size, (int type, int64_t ne))                                          \
    X(const char *, ggml_type_name, (int type))                                               \
    X(bool, ggml_is_quantized, (int type))                                                    \
    X(const struct ggml_type_traits *, ggml_get_type_traits, (int type))                      \
    X(bool, ggml_quantize_requires_imatrix, (int type))                                       \
    X(size_t, ggml_quantize_chunk,                                                            \
      (int type, const float *src, void *dst, int64_t start, int64_t nrows,                   \
       int64_t n_per_row, const float *imatrix))                                              \
    X(struct gguf_context *, gguf_init_empty, (void))                                         \
    X(struct gguf_context *, gguf_init_from_file,                                             \
      (const char *fname, struct gguf_init_params params))                                    \
    X(struct gguf_context *, gguf_init_from_buffer,                                           \
      (const void *data, size_t size, struct gguf_init_params params))                        \
    X(void, gguf_free, (struct gguf_context * ctx))                                           \
    X(uint32_t, gguf_get_version, (const struct gguf_context *ctx))                           \
    X(size_t, gguf_get_alignment, (const struct gguf_context *ctx))                           \
    X(size_t, gguf_get_data_offset, (const struct gguf_context *ctx))                         \
    X(int64_t, gguf_get_n_kv, (const struct gguf_context *ctx))                               \
    X(int64_t, gguf_find_key, (const struct gguf_context *ctx, const char *key))              \
    X(const char *, gguf_get_key, (const struct gguf_context *ctx, int64_t id))               \
    X(int, gguf_get_kv_type, (const struct gguf_context *ctx, int64_t id))                    \
    X(int, gguf_get_arr_type, (const struct gguf_context *ctx, int64_t id))                   \
    X(uint8_t, gguf_get_val_u8, (const struct gguf_context *ctx, int64_t id))                 \
    X(int8_t, gguf_get_val_i8, (const struct gguf_context *ctx, int64_t id))                  \
    X(uint16_t, gguf_get_val_u16, (const struct gguf_context *ctx, int64_t id))               \
    X(int16_t, gguf_get_val_i16, (const struct gguf_context *ctx, int64_t id))                \
    X(uint32_t, gguf_get_val_u32, (const struct gguf_context *ctx, int64_t id))               \
    X(int32_t, gguf_get_val_i32, (const struct gguf_context *ctx, int64_t id))                \
    X(float, gguf_get_val_f32, (const struct gguf_context *ctx, int64_t id))                  \
    X(uint64_t, gguf_get_val_u64, (const struct gguf_context *ctx, int64_t id))               \
    X(int64_t, gguf_get_val_i64, (const struct gguf_context *ctx, int64_t id))                \
    X(double, gguf_get_val_f64, (const struct gguf_context *ctx, int64_t id))                 \
    X(bool, gguf_get_val_bool, (const struct gguf_context *ctx, int64_t id))                  \
    X(const char *, gguf_get_val_str, (const struct gguf_context *ctx, int64_t id))           \
    X(const void *, gguf_get_val_data, (const struct gguf_context *ctx, int64_t id))          \
    X(size_t, gguf_get_arr_n, (const struct gguf_context *ctx, int64_t id))                   \
    X(const void *, gguf_get_arr_data, (const struct gguf_context *ctx, int64_t id))          \
    X(const char *, gguf_get_arr_str, (const struct gguf_context *ctx, int64_t id, size_t i)) \
    X(int64_t, gguf_get_n_tensors, (const struct gguf_context *ctx))                          \
    X(int64_t, gguf_find_tensor, (const struct gguf_context *ctx, const char *name))          \
    X(size_t, gguf_get_tensor_offset, (const struct gguf_context *ctx, int64_t id))           \
    X(const char *, gguf_get_tensor_name, (const struct gguf_context *ctx, int64_t id))       \
    X(const int64_t *, gguf_get_tensor_ne, (const struct gguf_context *ctx, int64_t id))      \
    X(int, gguf_get_tensor_type, (const struct gguf_context *ctx, int64_t id))                \
    X(size_t, gguf_get_tensor_size, (const struct gguf_context *ctx, int64_t id))             \
    X(void, gguf_set_val_u8, (struct gguf_context * ctx, const char *key, uint8_t v))         \
    X(void, gguf_set_val_i8, (struct gguf_context * ctx, const char *key, int8_t v))          \
    X(void, gguf_set_val_u16, (struct gguf_context * ctx, const char *key, uint16_t v))       \
    X(void, gguf_set_val_i16, (struct gguf_context * ctx, const char *key, int16_t v))        \
    X(void, gguf_set_val_u32, (struct gguf_context * ctx, const char *key, uint32_t v))       \
    X(void, gguf_set_val_i32, (struct gguf_context * ctx, const char *key, int32_t v))        \
    X(void, gguf_set_val_f32, (struct gguf_context * ctx, const char *key, float v))          \
    X(void, gguf_set_val_u64, (struct gguf_context * ctx, const char *key, uint64_t v))       \
    X(void, gguf_set_val_i64, (struct gguf_context * ctx, const char *key, int64_t v))        \
    X(void, gguf_set_val_f64, (struct gguf_context * ctx, const char *key, double v))         \
    X(void, gguf_set_val_bool, (struct gguf_context * ctx, const char *key, bool v))          \
    X(void, gguf_set_val_str, (struct gguf_context * ctx, const char *key, const char *v))    \
    X(void, gguf_set_arr_data,                                                                \
      (struct gguf_context * ctx, const char *key, int type, const void *data, size_t n))     \
    X(void, gguf_set_arr_str,                                                                 \
      (struct gguf_context * ctx, const char *key, const char **data, size_t n))              \
    X(void, gguf_add_tensor, (struct gguf_context * ctx, const struct ggml_tensor *t))        \
    X(void, gguf_set_tensor_data, (struct gguf_context * ctx, const char *name, const void *d)) \
    X(bool, gguf_write_to_file, (const struct gguf_context *ctx, const char *fname, bool meta)) \
    X(size_t, gguf_get_meta_size, (const struct gguf_context *ctx))                           \
    X(void, gguf_get_meta_data, (const struct gguf_context *ctx, void *data))

#define GGML_LIB_MEMBER(ret, name, params) ret(*name) params;
typedef struct ggml_lib {
    void *handle;
    GGML_LIB_FUNCS(GGML_LIB_MEMBER)
} ggml_lib;
#undef GGML_LIB_MEMBER

static inline void ggml_lib_msg(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void ggml_lib_msg(char *msg, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
}

/* Opens BINS/libggml-base.so and resolves every function; 0 or -1 with msg filled. */
static inline int ggml_lib_open(ggml_lib *lib, const char *bins_dir, char *msg, size_t cap) {
    char path[4096];
    memset(lib, 0, sizeof *lib);
    snprintf(path, sizeof path, "%s/libggml-base.so", bins_dir);
    lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib->handle) {
        ggml_lib_msg(msg, cap, "dlopen %s: %s", path, dlerror());
        return -1;
    }
    /* dlsym returns void *; converting it to a function pointer is what POSIX specifies. */
#define GGML_LIB_RESOLVE(ret, name, params)                                              \
    {                                                                                    \
        void *sym = dlsym(lib->handle, #name);                                           \
        if (!sym) {                                                                      \
            ggml_lib_msg(msg, cap, "%s: no symbol %s", path, #name);                     \
            dlclose(lib->handle);                                                        \
            lib->handle = NULL;                                                          \
            return -1;                                                                   \
        }                                                                                \
        memcpy(&lib->name, &sym, sizeof sym);                                            \
    }
    GGML_LIB_FUNCS(GGML_LIB_RESOLVE)
#undef GGML_LIB_RESOLVE
    return 0;
}

static inline void ggml_lib_close(ggml_lib *lib) {
    if (lib->handle) dlclose(lib->handle);
    lib->handle = NULL;
}

/* Checks the declared struct layouts against what ggml itself reports; 0 or -1 with msg. */
static inline int ggml_lib_check_layout(const ggml_lib *lib, char *msg, size_t cap) {
    if (lib->ggml_tensor_overhead() != sizeof(struct ggml_tensor) + GGML_OBJECT_SIZE) {
        ggml_lib_msg(msg, cap, "ggml_tensor_overhead() = %zu, declared tensor %zu + object %d",
                     lib->ggml_tensor_overhead(), sizeof(struct ggml_tensor), GGML_OBJECT_SIZE);
        return -1;
    }
    struct ggml_init_params ip = { .mem_size = 1 << 20, .mem_buffer = NULL, .no_alloc = false };
    struct ggml_context *ctx = lib->ggml_init(ip);
    if (!ctx) {
        ggml_lib_msg(msg, cap, "ggml_init failed");
        return -1;
    }
    const int64_t ne[4] = { 64, 3, 2, 5 };
    struct ggml_tensor *t = lib->ggml_new_tensor(ctx, GGML_TYPE_Q8_0, 4, ne);
    lib->ggml_set_name(t, "layout.probe");
    int bad = 0;
    bad |= t->type != GGML_TYPE_Q8_0;
    for (int i = 0; i < 4; i++) bad |= t->ne[i] != ne[i];
    bad |= t->nb[0] != 34 || t->nb[1] != 68 || t->nb[2] != 68 * 3 || t->nb[3] != 68 * 6;
    bad |= lib->ggml_get_name(t) != t->name || strcmp(t->name, "layout.probe") != 0;
    bad |= lib->ggml_get_data(t) != t->data || t->data == NULL;
    bad |= lib->ggml_nelements(t) != 64 * 3 * 2 * 5 || lib->ggml_nbytes(t) != 68 * 30;
    bad |= lib->ggml_get_tensor(ctx, "layout.probe") != t || lib->ggml_n_dims(t) != 4;
    lib->ggml_free(ctx);
    if (bad) {
        ggml_lib_msg(msg, cap, "struct ggml_tensor layout does not match the prebuilt");
        return -1;
    }
    /* struct gguf_init_params and the gguf round trip: a one-tensor GGUF built in memory by
     * ggml must load back, through params.ctx, into a tensor holding the same bytes */
    {
        static const float vals[8] = { 1, -2, 3.5f, 0, -0.25f, 1e-3f, 7, 8 };
        const int64_t ne1[1] = { 8 };
        struct ggml_init_params mp = { .mem_size = 1 << 16, .mem_buffer = NULL, .no_alloc = true };
        struct ggml_context *meta_ctx = lib->ggml_init(mp);
        struct gguf_context *g = lib->gguf_init_empty();
        struct ggml_tensor *vt = lib->ggml_new_tensor(meta_ctx, GGML_TYPE_F32, 1, ne1);
        lib->ggml_set_name(vt, "layout.vals");
        lib->gguf_set_val_u32(g, "layout.key", 0x12345678u);
        lib->gguf_add_tensor(g, vt);
        size_t meta = lib->gguf_get_meta_size(g);
        unsigned char buf[4096];
        int ok = meta + sizeof vals <= sizeof buf;
        if (ok) {
            lib->gguf_get_meta_data(g, buf);
            memcpy(buf + meta, vals, sizeof vals);
        }
        lib->gguf_free(g);
        lib->ggml_free(meta_ctx);
        struct ggml_context *data_ctx = NULL;
        struct gguf_init_params gp = { .no_alloc = false, .ctx = &data_ctx };
        g = ok ? lib->gguf_init_from_buffer(buf, meta + sizeof vals, gp) : NULL;
        const struct ggml_tensor *back = data_ctx ? lib->ggml_get_tensor(data_ctx, "layout.vals") : NULL;
        ok = g && back && back->data && !memcmp(back->data, vals, sizeof vals) &&
             lib->gguf_get_n_kv(g) == 1 && lib->gguf_get_val_u32(g, 0) == 0x12345678u &&
             lib->gguf_get_data_offset(g) == meta && lib->gguf_get_tensor_size(g, 0) == sizeof vals;
        if (g) lib->gguf_free(g);
        if (data_ctx) lib->ggml_free(data_ctx);
        if (!ok) {
            ggml_lib_msg(msg, cap, "gguf round trip through the declared API failed "
                                   "(struct gguf_init_params or a gguf prototype does not match)");
            return -1;
        }
    }
    /* type traits: every field against the scalar accessors, for a plain and a k-quant */
    const int types[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                          GGML_TYPE_MXFP4, GGML_TYPE_BF16 };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const struct ggml_type_traits *tr = lib->ggml_get_type_traits(types[i]);
        if (!tr || tr->type_name != lib->ggml_type_name(types[i]) ||
            tr->blck_size != lib->ggml_blck_size(types[i]) ||
            tr->type_size != lib->ggml_type_size(types[i]) ||
            tr->is_quantized != lib->ggml_is_quantized(types[i]) ||
            (types[i] != GGML_TYPE_F32 && tr->to_float == NULL)) {
            ggml_lib_msg(msg, cap, "struct ggml_type_traits layout does not match (type %d)",
                         types[i]);
            return -1;
        }
    }
    return 0;
}

#endif

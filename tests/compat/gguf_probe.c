/* tests/compat/gguf_probe.c: proves that Ember reads and writes GGUF exactly as ggml does,
 * with ggml's own library (the npm prebuilt, loaded through ggml_api.h) as the reference.
 *
 *   write-ggml BINS DIR   probe files written through ggml's gguf API (every metadata type,
 *                         alignments 32/8/64/256, tensors of every type, a split set); for each,
 *                         what ggml reads back, as JSON in the agreed `ember inspect --json`
 *                         format (DIR/NAME.expected.json), and every tensor dequantized by
 *                         ggml's to_float (DIR/NAME.t/I.f32). DIR/manifest.tsv lists them for
 *                         tests/ggml_compat.sh, which runs Ember on them.
 *   write-ember DIR       the same kinds of probes written by Ember's writer (format/gguf.h),
 *                         quantized by em_quantize; DIR/files.txt lists them (a split set by
 *                         its first shard).
 *   read-ggml BINS FILE   ggml loads FILE (every shard of a split set): every key, value,
 *                         tensor info and tensor byte must be what Ember meant to write, and
 *                         Ember's quantized bytes must equal ggml_quantize_chunk's; and the
 *                         file must be byte for byte what ggml writes for the same content.
 *   rewrite-ember FILE    Ember reads a ggml-written FILE and writes all it read into a new
 *                         file, which must be byte for byte FILE.
 *   cmp-f32 WANT GOT      bitwise comparison of two raw f32 files naming the first mismatches.
 *
 * A probe is a deterministic specification (probe_build): metadata entries and tensors whose
 * data come from seeds derived from their names, so the reading side rebuilds exactly what the
 * writing side meant, with no side channel. Exit status: 0 all checks passed, 1 a check
 * failed, 2 usage or setup error. Test tool: out of memory ends the process with a message. */
#include "ggml_api.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/base.h"
#include "format/gguf.h"
#include "quant/quant.h"

/* ---- small utilities ---------------------------------------------------------------- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    fputs("compat_gguf_probe: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory");
    return p;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void make_dir(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", path, strerror(errno));
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) die("write %s failed", path);
}

/* Counts failed checks; every failure is printed with what and where. */
static int g_failures;
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    fputs("FAIL: ", stdout);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    g_failures++;
}

/* Deterministic data: xorshift64* seeded from a name (FNV-1a). */
static uint64_t seed_of(const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return h | 1;
}
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static float rng_unit(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) / 8388608.0 - 1.0);
}
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static double bits_f64(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

/* ---- tensor types ------------------------------------------------------------------- */

/* The ggml types the probes store, with their layout (ggml-common.h). The table is data: it
 * is checked against ggml's own traits and against Ember's type table at run time. fp16 lists
 * the byte offsets of fp16 fields in a block, so that random raw blocks can be kept free of
 * infinite/NaN scales (which would make NaN payloads depend on operand order).
 * quantizable: the probes quantize it with ggml_quantize_chunk. The iq1/iq2 types are stored
 * as random raw blocks only: ggml's grid set-up for their quantizers takes seconds per type,
 * and random blocks reach every grid entry anyway. */
typedef struct type_row {
    int id;
    const char *name; /* ggml_type_name */
    int blck;         /* values per block */
    int size;         /* bytes per block */
    bool quantizable; /* probes quantize it from f32 */
    int fp16[2];      /* -1: unused */
} type_row;

static const type_row k_types[] = {
    { GGML_TYPE_F32, "f32", 1, 4, true, { -1, -1 } },
    { GGML_TYPE_F16, "f16", 1, 2, true, { -1, -1 } },
    { GGML_TYPE_BF16, "bf16", 1, 2, true, { -1, -1 } },
    { GGML_TYPE_Q4_0, "q4_0", 32, 18, true, { 0, -1 } },
    { GGML_TYPE_Q4_1, "q4_1", 32, 20, true, { 0, 2 } },
    { GGML_TYPE_Q5_0, "q5_0", 32, 22, true, { 0, -1 } },
    { GGML_TYPE_Q5_1, "q5_1", 32, 24, true, { 0, 2 } },
    { GGML_TYPE_Q8_0, "q8_0", 32, 34, true, { 0, -1 } },
    { GGML_TYPE_Q2_K, "q2_K", 256, 84, true, { 80, 82 } },
    { GGML_TYPE_Q3_K, "q3_K", 256, 110, true, { 108, -1 } },
    { GGML_TYPE_Q4_K, "q4_K", 256, 144, true, { 0, 2 } },
    { GGML_TYPE_Q5_K, "q5_K", 256, 176, true, { 0, 2 } },
    { GGML_TYPE_Q6_K, "q6_K", 256, 210, true, { 208, -1 } },
    { GGML_TYPE_IQ2_XXS, "iq2_xxs", 256, 66, false, { 0, -1 } },
    { GGML_TYPE_IQ2_XS, "iq2_xs", 256, 74, false, { 0, -1 } },
    { GGML_TYPE_IQ3_XXS, "iq3_xxs", 256, 98, true, { 0, -1 } },
    { GGML_TYPE_IQ1_S, "iq1_s", 256, 50, false, { 0, -1 } },
    { GGML_TYPE_IQ4_NL, "iq4_nl", 32, 18, true, { 0, -1 } },
    { GGML_TYPE_IQ3_S, "iq3_s", 256, 110, true, { 0, -1 } },
    { GGML_TYPE_IQ2_S, "iq2_s", 256, 82, false, { 0, -1 } },
    { GGML_TYPE_IQ4_XS, "iq4_xs", 256, 136, true, { 0, -1 } },
    { GGML_TYPE_IQ1_M, "iq1_m", 256, 56, false, { -1, -1 } },
    { GGML_TYPE_TQ1_0, "tq1_0", 256, 54, true, { 52, -1 } },
    { GGML_TYPE_TQ2_0, "tq2_0", 256, 66, true, { 64, -1 } },
    { GGML_TYPE_MXFP4, "mxfp4", 32, 17, true, { -1, -1 } },
    { GGML_TYPE_NVFP4, "nvfp4", 64, 36, true, { -1, -1 } }, /* UE4M3 scales: all finite */
    { GGML_TYPE_Q1_0, "q1_0", 128, 18, true, { 0, -1 } },
    { GGML_TYPE_Q2_0, "q2_0", 64, 18, true, { 0, -1 } },
    { GGML_TYPE_I8, "i8", 1, 1, false, { -1, -1 } },
    { GGML_TYPE_I16, "i16", 1, 2, false, { -1, -1 } },
    { GGML_TYPE_I32, "i32", 1, 4, false, { -1, -1 } },
    { GGML_TYPE_I64, "i64", 1, 8, false, { -1, -1 } },
    { GGML_TYPE_F64, "f64", 1, 8, false, { -1, -1 } },
};
#define N_TYPES ((int)(sizeof k_types / sizeof k_types[0]))

static const type_row *type_row_of(int id) {
    for (int i = 0; i < N_TYPES; i++)
        if (k_types[i].id == id) return &k_types[i];
    die("type %d is not in the probe table", id);
}

static bool is_float_plain(int id) {
    return id == GGML_TYPE_F32 || id == GGML_TYPE_F16 || id == GGML_TYPE_BF16;
}

/* Ember's claims about a type, from its own table. */
static bool ember_reads(int id) {
    const em_type_info *t = em_type_get(id);
    return t && t->to_float;
}
static bool ember_quantizes(int id) {
    const em_type_info *t = em_type_get(id);
    return t && t->from_float;
}

/* ---- probe specifications ----------------------------------------------------------- */

typedef struct kv_spec {
    char *key;
    int type;       /* EM_GGUF_* (GGUF's numbering); EM_GGUF_ARRAY for arrays */
    int elem_type;  /* arrays: element type */
    uint64_t n;     /* arrays: element count */
    uint8_t *data;  /* fixed-size types: the scalar, or n packed elements (bool: 1 byte) */
    char **strs;    /* STR: strs[0]; arrays of STR: n strings */
} kv_spec;

typedef struct tensor_spec {
    char name[GGML_MAX_NAME];
    int type;
    int n_dims;
    int64_t ne[4];     /* unused dimensions are 1 */
    int shard;         /* ggml-written split sets: the file that holds it */
    uint64_t n_elem, nbytes;
    float *src;        /* non-NULL: the data is this, quantized (by ggml or by Ember) */
    float *imatrix;    /* ggml types that need an importance matrix: one per column */
    uint8_t *raw;      /* src == NULL: the bytes to store */
} tensor_spec;

enum side { SIDE_GGML, SIDE_EMBER };

typedef struct probe {
    char name[64];
    enum side side;
    uint32_t alignment;        /* in effect (32 unless general.alignment says otherwise) */
    int n_shards;              /* ggml-written split sets: number of files (else 1) */
    uint64_t max_shard_bytes;  /* Ember-written split sets: the writer's budget (else 0) */
    kv_spec *kv;
    int n_kv, cap_kv;
    tensor_spec *t;
    int n_t, cap_t;
} probe;

static int gguf_elem_size(int type) {
    switch (type) {
    case EM_GGUF_U8: case EM_GGUF_I8: case EM_GGUF_BOOL: return 1;
    case EM_GGUF_U16: case EM_GGUF_I16: return 2;
    case EM_GGUF_U32: case EM_GGUF_I32: case EM_GGUF_F32: return 4;
    case EM_GGUF_U64: case EM_GGUF_I64: case EM_GGUF_F64: return 8;
    default: return 0;
    }
}

static kv_spec *kv_new(probe *p, const char *key, int type) {
    if (p->n_kv == p->cap_kv) {
        p->cap_kv = p->cap_kv ? 2 * p->cap_kv : 64;
        kv_spec *kv = realloc(p->kv, (size_t)p->cap_kv * sizeof *kv);
        if (!kv) die("out of memory");
        p->kv = kv;
    }
    kv_spec *kv = &p->kv[p->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key = xstrdup(key);
    kv->type = type;
    return kv;
}

static void kv_scalar(probe *p, const char *key, int type, const void *val) {
    kv_spec *kv = kv_new(p, key, type);
    kv->n = 1;
    kv->data = memcpy(xmalloc(8), val, (size_t)gguf_elem_size(type));
}
#define KV(p, key, gtype, ctype, v)                                                        \
    do {                                                                                   \
        ctype kv_tmp_ = (v);                                                               \
        kv_scalar((p), (key), (gtype), &kv_tmp_);                                          \
    } while (0)

static void kv_str(probe *p, const char *key, const char *s) {
    kv_spec *kv = kv_new(p, key, EM_GGUF_STR);
    kv->n = 1;
    kv->strs = xmalloc(sizeof(char *));
    kv->strs[0] = xstrdup(s);
}

static void kv_arr(probe *p, const char *key, int elem_type, const void *elems, uint64_t n) {
    kv_spec *kv = kv_new(p, key, EM_GGUF_ARRAY);
    kv->elem_type = elem_type;
    kv->n = n;
    size_t bytes = (size_t)n * (size_t)gguf_elem_size(elem_type);
    kv->data = xmalloc(bytes);
    if (bytes) memcpy(kv->data, elems, bytes);
}

static void kv_arr_str(probe *p, const char *key, const char *const *strs, uint64_t n) {
    kv_spec *kv = kv_new(p, key, EM_GGUF_ARRAY);
    kv->elem_type = EM_GGUF_STR;
    kv->n = n;
    kv->strs = xmalloc((size_t)n * sizeof(char *));
    for (uint64_t i = 0; i < n; i++) kv->strs[i] = xstrdup(strs[i]);
}

/* A long string: every printable ASCII character and some multi-byte UTF-8, repeated. */
static char *long_string(size_t n) {
    static const char unit[] = "The quick brown fox jumps over the lazy dog 0123456789 "
                               "\xc3\xa9\xe4\xb8\x96\xf0\x9f\x94\xa5 ~!@#$%^&*()_+{}|:<>?[];',./`\n";
    size_t u = sizeof unit - 1;
    char *s = xmalloc(n + 1);
    size_t i = 0;
    while (i + u <= n) {
        memcpy(s + i, unit, u);
        i += u;
    }
    memset(s + i, 'x', n - i);
    s[n] = 0;
    return s;
}

/* Every metadata type, with the values that break careless readers: extremes, u64 above
 * 2^63, negative i64, f32/f64 denormals, -0.0, infinities, NaN, empty/UTF-8/invalid-UTF-8/
 * long strings, arrays of every element type, empty arrays and a large array. */
static void add_all_metadata(probe *p) {
    KV(p, "probe.u8.zero", EM_GGUF_U8, uint8_t, 0);
    KV(p, "probe.u8.max", EM_GGUF_U8, uint8_t, 255);
    KV(p, "probe.i8.min", EM_GGUF_I8, int8_t, -128);
    KV(p, "probe.i8.max", EM_GGUF_I8, int8_t, 127);
    KV(p, "probe.i8.minus_one", EM_GGUF_I8, int8_t, -1);
    KV(p, "probe.u16.max", EM_GGUF_U16, uint16_t, 65535);
    KV(p, "probe.i16.min", EM_GGUF_I16, int16_t, -32768);
    KV(p, "probe.i16.max", EM_GGUF_I16, int16_t, 32767);
    KV(p, "probe.u32.max", EM_GGUF_U32, uint32_t, UINT32_MAX);
    KV(p, "probe.u32.zero", EM_GGUF_U32, uint32_t, 0);
    KV(p, "probe.i32.min", EM_GGUF_I32, int32_t, INT32_MIN);
    KV(p, "probe.i32.max", EM_GGUF_I32, int32_t, INT32_MAX);
    KV(p, "probe.u64.max", EM_GGUF_U64, uint64_t, UINT64_MAX);
    KV(p, "probe.u64.2p63", EM_GGUF_U64, uint64_t, 9223372036854775808ull);
    KV(p, "probe.u64.2p63_plus_1", EM_GGUF_U64, uint64_t, 9223372036854775809ull);
    KV(p, "probe.u64.2p53_plus_1", EM_GGUF_U64, uint64_t, 9007199254740993ull);
    KV(p, "probe.i64.min", EM_GGUF_I64, int64_t, INT64_MIN);
    KV(p, "probe.i64.max", EM_GGUF_I64, int64_t, INT64_MAX);
    KV(p, "probe.i64.negative", EM_GGUF_I64, int64_t, -1234567890123456789ll);

    static const uint32_t f32s[] = {
        0x3dcccccd, /* 0.1 */ 0x80000000, /* -0 */ 0x00000000, 0x00000001, /* min denormal */
        0x007fffff, /* max denormal */ 0x00800000, /* FLT_MIN */ 0x7f7fffff, /* FLT_MAX */
        0xff7fffff, 0x7f800000, /* inf */ 0xff800000, /* -inf */ 0x7fc00000, /* nan */
        0x3eaaaaab, /* 1/3 */ 0x40490fdb, /* pi */ 0x4b800001, /* 16777218 */
        0xc2f6e979, /* -123.456 */ 0x1e3ce508, /* 1e-20 */
    };
    char key[128];
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++) {
        snprintf(key, sizeof key, "probe.f32.v%02zu", i);
        KV(p, key, EM_GGUF_F32, float, bits_f32(f32s[i]));
    }
    static const uint64_t f64s[] = {
        0x3fb999999999999aull, /* 0.1 */ 0x8000000000000000ull, 0x0000000000000000ull,
        0x0000000000000001ull, /* min denormal */ 0x000fffffffffffffull, 0x0010000000000000ull,
        0x7fefffffffffffffull, /* DBL_MAX */ 0xffefffffffffffffull, 0x7ff0000000000000ull,
        0xfff0000000000000ull, 0x7ff8000000000000ull, 0x3fd5555555555555ull, /* 1/3 */
        0x400921fb54442d18ull, /* pi */ 0x4340000000000001ull, /* 2^54 + 2 */
        0x7e37e43c8800759cull, /* 1e300 */ 0x3ff0000000000001ull, /* 1 + ulp */
    };
    for (size_t i = 0; i < sizeof f64s / sizeof f64s[0]; i++) {
        snprintf(key, sizeof key, "probe.f64.v%02zu", i);
        KV(p, key, EM_GGUF_F64, double, bits_f64(f64s[i]));
    }
    KV(p, "probe.bool.true", EM_GGUF_BOOL, uint8_t, 1);
    KV(p, "probe.bool.false", EM_GGUF_BOOL, uint8_t, 0);

    kv_str(p, "probe.str.empty", "");
    kv_str(p, "probe.str.ascii", "hello, world");
    kv_str(p, "probe.str.utf8", "h\xc3\xa9llo w\xc3\xb6rld \xe2\x80\x94 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x94\xa5");
    kv_str(p, "probe.str.escapes", "quote\" backslash\\ slash/ nl\n tab\t cr\r bs\b ff\f ctl\x01\x1f del\x7f end");
    kv_str(p, "probe.str.invalid_utf8",
           "ff\xff overlong\xc0\xaf surrogate\xed\xa0\x80 toobig\xf4\x90\x80\x80 cont\x80 trunc\xe4\xb8");
    char *longs = long_string(100000);
    kv_str(p, "probe.str.long", longs);
    free(longs);
    kv_str(p, "probe.\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87 key with spaces", "key is UTF-8 with spaces");
    kv_str(p, "general.architecture", "probe");

    static const uint8_t a_u8[] = { 0, 1, 127, 128, 255 };
    static const int8_t a_i8[] = { -128, -1, 0, 1, 127 };
    static const uint16_t a_u16[] = { 0, 1, 32768, 65535 };
    static const int16_t a_i16[] = { -32768, -1, 0, 32767 };
    static const uint32_t a_u32[] = { 0, 1, 2147483648u, UINT32_MAX };
    static const int32_t a_i32[] = { INT32_MIN, -1, 0, INT32_MAX };
    static const uint64_t a_u64[] = { 0, 1, 9223372036854775808ull, UINT64_MAX };
    static const int64_t a_i64[] = { INT64_MIN, -1, 0, INT64_MAX };
    static const uint8_t a_bool[] = { 1, 0, 1, 1, 0 };
    kv_arr(p, "probe.arr.u8", EM_GGUF_U8, a_u8, 5);
    kv_arr(p, "probe.arr.i8", EM_GGUF_I8, a_i8, 5);
    kv_arr(p, "probe.arr.u16", EM_GGUF_U16, a_u16, 4);
    kv_arr(p, "probe.arr.i16", EM_GGUF_I16, a_i16, 4);
    kv_arr(p, "probe.arr.u32", EM_GGUF_U32, a_u32, 4);
    kv_arr(p, "probe.arr.i32", EM_GGUF_I32, a_i32, 4);
    kv_arr(p, "probe.arr.u64", EM_GGUF_U64, a_u64, 4);
    kv_arr(p, "probe.arr.i64", EM_GGUF_I64, a_i64, 4);
    kv_arr(p, "probe.arr.f32", EM_GGUF_F32, f32s, sizeof f32s / sizeof f32s[0]);
    kv_arr(p, "probe.arr.f64", EM_GGUF_F64, f64s, sizeof f64s / sizeof f64s[0]);
    kv_arr(p, "probe.arr.bool", EM_GGUF_BOOL, a_bool, 5);
    static const char *const a_str[] = {
        "", "a", "h\xc3\xa9llo", "\xf0\x9f\x94\xa5", "with \"quotes\" and \\", "tab\tnl\n",
        "bad\xff\xfe", "",
    };
    kv_arr_str(p, "probe.arr.str", a_str, sizeof a_str / sizeof a_str[0]);
    kv_arr(p, "probe.arr.empty_i32", EM_GGUF_I32, NULL, 0);
    kv_arr(p, "probe.arr.empty_f64", EM_GGUF_F64, NULL, 0);
    kv_arr_str(p, "probe.arr.empty_str", NULL, 0);

    /* a token-table sized array and a vocabulary-like string array */
    uint64_t s = seed_of("probe.arr.i32_big");
    int32_t *big = xmalloc(70000 * sizeof *big);
    for (int i = 0; i < 70000; i++) big[i] = (int32_t)(uint32_t)rng_next(&s);
    kv_arr(p, "probe.arr.i32_big", EM_GGUF_I32, big, 70000);
    free(big);
    char **vocab = xmalloc(3000 * sizeof *vocab);
    for (int i = 0; i < 3000; i++) {
        char tok[32];
        snprintf(tok, sizeof tok, i % 7 ? "tok%d" : "\xc4\xa0w%d\xc3\xa9", i);
        vocab[i] = xstrdup(tok);
    }
    kv_arr_str(p, "probe.arr.vocab", (const char *const *)vocab, 3000);
    for (int i = 0; i < 3000; i++) free(vocab[i]);
    free(vocab);
    KV(p, "probe.last", EM_GGUF_U32, uint32_t, 0xdeadbeef);
}

/* ---- tensor data ---------------------------------------------------------------------- */

/* Weights-like values with the cases quantizers special-case: rows of very different scale,
 * all-zero blocks, constant blocks, single outliers, one-signed blocks, -0.0. */
static void gen_weights(const char *name, float *x, uint64_t n) {
    static const float scales[] = { 1.0f, 0.01f, 37.5f, 1e-4f, 2000.0f, 0.3f };
    uint64_t s = seed_of(name);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t blk = i / 32, row = i / 256;
        float scale = scales[row % 6];
        float v = (rng_unit(&s) + rng_unit(&s) + rng_unit(&s)) * scale;
        if (blk % 7 == 3) v = (i % 5 == 0) ? -0.0f : 0.0f;
        else if (blk % 11 == 5) v = 0.5f * scale;
        else if (blk % 13 == 6 && i % 32 == 17) v *= 60.0f;
        else if (blk % 17 == 8) v = -fabsf(v);
        x[i] = v;
    }
}

/* Values for the plain float types: any bit pattern (NaNs with payloads, infinities,
 * denormals), values beyond f16's range and near its rounding boundaries. */
static void gen_float_bits(const char *name, float *x, uint64_t n) {
    uint64_t s = seed_of(name);
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
        0x7fa00000, 0xffffffff, 0x00000001, 0x807fffff, 0x477fe000, /* 65504 */
        0x477ff000, /* 65520: rounds to inf in f16 */ 0x477fefff, 0x33800000, /* 2^-24 */
        0x33000000, /* 2^-25: ties to 0 */ 0x33000001, 0x38800000, /* f16 min normal */
        0x3f808000, /* bf16 tie, even */ 0x3f818000, /* bf16 tie, odd */ 0x3f800001,
        0x387fc000, /* f16 denormal boundary */ 0x7f7fffff, 0xff7fffff,
    };
    const uint64_t ns = sizeof special / sizeof special[0];
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        uint64_t r = rng_next(&s);
        if (i < ns) u = special[i];
        else if (r % 4 == 0) u = (uint32_t)(r >> 32);                         /* any bits */
        else if (r % 4 == 1) u = f32_bits(ldexpf(rng_unit(&s), (int)(r >> 40) % 60 - 40));
        else u = f32_bits(rng_unit(&s) * 4.0f);
        x[i] = bits_f32(u);
    }
}

/* Random bytes for any type: block scales kept finite (see type_row.fp16). */
static void gen_raw(const char *name, const type_row *tr, uint8_t *b, uint64_t nbytes) {
    uint64_t s = seed_of(name);
    for (uint64_t i = 0; i < nbytes; i++) b[i] = (uint8_t)(rng_next(&s) >> 56);
    if (tr->blck == 1) {
        if (tr->id == GGML_TYPE_F64) { /* half of the values ordinary doubles */
            for (uint64_t i = 0; i + 8 <= nbytes; i += 16) {
                double d = ldexp((double)rng_unit(&s), (int)(rng_next(&s) % 300) - 150);
                memcpy(b + i, &d, 8);
            }
        }
        return;
    }
    for (uint64_t off = 0; off + (uint64_t)tr->size <= nbytes; off += (uint64_t)tr->size) {
        for (int k = 0; k < 2; k++) {
            if (tr->fp16[k] < 0) continue;
            uint8_t *hi = b + off + tr->fp16[k] + 1; /* exponent bits 10..14 = hi bits 2..6 */
            if ((*hi & 0x7c) == 0x7c) *hi &= (uint8_t)~0x04;
        }
        if (tr->id == GGML_TYPE_IQ1_M) b[off + 55] &= (uint8_t)~0x40; /* scale exponent bit 14 */
    }
}

/* Shapes cycling through 1 to 4 dimensions, never with a trailing 1 (ggml drops those). */
static int shape_for(int blck, int k, int64_t ne[4]) {
    int64_t b = blck == 1 ? 24 : blck;
    ne[0] = ne[1] = ne[2] = ne[3] = 1;
    switch (k % 4) {
    case 0: ne[0] = b * 8; return 1;
    case 1: ne[0] = b * 2; ne[1] = 3; return 2;
    case 2: ne[0] = b; ne[1] = 3; ne[2] = 2; return 3;
    default: ne[0] = b; ne[1] = 2; ne[2] = 2; ne[3] = 2; return 4;
    }
}

static tensor_spec *tensor_new(probe *p, const char *name, int type, int n_dims,
                               const int64_t ne[4]) {
    if (p->n_t == p->cap_t) {
        p->cap_t = p->cap_t ? 2 * p->cap_t : 64;
        tensor_spec *t = realloc(p->t, (size_t)p->cap_t * sizeof *t);
        if (!t) die("out of memory");
        p->t = t;
    }
    tensor_spec *t = &p->t[p->n_t++];
    memset(t, 0, sizeof *t);
    if (strlen(name) >= sizeof t->name) die("tensor name too long: %s", name);
    strcpy(t->name, name);
    const type_row *tr = type_row_of(type);
    t->type = type;
    t->n_dims = n_dims;
    t->n_elem = 1;
    for (int i = 0; i < 4; i++) {
        t->ne[i] = i < n_dims ? ne[i] : 1;
        t->n_elem *= (uint64_t)t->ne[i];
    }
    t->nbytes = t->n_elem / (uint64_t)tr->blck * (uint64_t)tr->size;
    return t;
}

/* A tensor whose data is src quantized to type (by ggml's or Ember's quantizer). */
static void tensor_from_f32(probe *p, const char *name, int type, int n_dims, const int64_t *ne,
                            bool plain_bits) {
    tensor_spec *t = tensor_new(p, name, type, n_dims, ne);
    t->src = xmalloc(t->n_elem * sizeof(float));
    if (plain_bits) gen_float_bits(name, t->src, t->n_elem);
    else gen_weights(name, t->src, t->n_elem);
    if (type == GGML_TYPE_IQ2_XXS || type == GGML_TYPE_IQ2_XS || type == GGML_TYPE_IQ1_S) {
        uint64_t s = seed_of(name) ^ 0x5555;
        t->imatrix = xmalloc((size_t)t->ne[0] * sizeof(float));
        for (int64_t i = 0; i < t->ne[0]; i++) t->imatrix[i] = 0.5f + fabsf(rng_unit(&s));
    }
}

static void tensor_raw(probe *p, const char *name, int type, int n_dims, const int64_t *ne) {
    tensor_spec *t = tensor_new(p, name, type, n_dims, ne);
    t->raw = xmalloc(t->nbytes);
    gen_raw(name, type_row_of(type), t->raw, t->nbytes);
}

/* Whether this side quantizes type from f32 itself (ggml: ggml_quantize_chunk; Ember:
 * em_quantize, for the types its table says it writes). */
static bool side_quantizes(enum side side, const type_row *tr) {
    if (!tr->quantizable) return false;
    return side == SIDE_GGML || ember_quantizes(tr->id);
}

/* Tensors of every type. variant 0: per type a quantized (".q") and a raw-bytes (".raw")
 * tensor plus exhaustive f16/bf16 bit patterns; other variants: one tensor per type with
 * another shape (offsets and padding differ from variant 0). */
static void add_type_tensors(probe *p, int variant) {
    char name[GGML_MAX_NAME];
    int64_t ne[4];
    for (int i = 0; i < N_TYPES; i++) {
        const type_row *tr = &k_types[i];
        int nd = shape_for(tr->blck, i + variant, ne);
        bool q = side_quantizes(p->side, tr);
        if (q) {
            snprintf(name, sizeof name, "%s.q", tr->name);
            tensor_from_f32(p, name, tr->id, nd, ne, is_float_plain(tr->id));
        }
        if (!q || variant == 0) {
            nd = shape_for(tr->blck, i + variant + 1, ne);
            if (variant != 0) ne[0] += tr->blck; /* odd row length: padding differs */
            snprintf(name, sizeof name, "%s.raw", tr->name);
            tensor_raw(p, name, tr->id, nd, ne);
        }
    }
    if (variant == 0) {
        /* every f16 and bf16 bit pattern, to_float checked on all of them */
        const int64_t all[4] = { 256, 256, 1, 1 };
        tensor_spec *t = tensor_new(p, "f16.all_bits", GGML_TYPE_F16, 2, all);
        t->raw = xmalloc(t->nbytes);
        for (uint32_t v = 0; v < 65536; v++) memcpy(t->raw + 2 * v, &(uint16_t){ (uint16_t)v }, 2);
        t = tensor_new(p, "bf16.all_bits", GGML_TYPE_BF16, 2, all);
        t->raw = xmalloc(t->nbytes);
        for (uint32_t v = 0; v < 65536; v++) memcpy(t->raw + 2 * v, &(uint16_t){ (uint16_t)v }, 2);
        /* f32 bit patterns copied as they are (NaN payloads, -0, denormals) */
        const int64_t sp[4] = { 64, 4, 1, 1 };
        t = tensor_new(p, "f32.bits", GGML_TYPE_F32, 2, sp);
        t->raw = xmalloc(t->nbytes);
        gen_float_bits("f32.bits", (float *)(void *)t->raw, t->n_elem);
    }
}

static void add_alignment_key(probe *p, uint32_t alignment) {
    KV(p, "general.alignment", EM_GGUF_U32, uint32_t, alignment);
    p->alignment = alignment;
}

/* The probes. Names starting "g_" are written by ggml, "e_" by Ember. */
static const char *const k_ggml_probes[] = { "g_meta", "g_empty", "g_a32", "g_a8", "g_a64",
                                             "g_a256", "g_split" };
static const char *const k_ember_probes[] = { "e_meta", "e_empty", "e_a32", "e_a64",
                                              "e_a256", "e_dims", "e_split" };

static void probe_build(probe *p, const char *name) {
    memset(p, 0, sizeof *p);
    if (strlen(name) >= sizeof p->name) die("probe name too long: %s", name);
    strcpy(p->name, name);
    p->side = name[0] == 'g' ? SIDE_GGML : SIDE_EMBER;
    p->alignment = 32;
    p->n_shards = 1;
    const char *kind = name + 2;
    if (!strcmp(kind, "meta")) {
        add_all_metadata(p);
    } else if (!strcmp(kind, "empty")) {
        /* no metadata, no tensors */
    } else if (!strcmp(kind, "a32") || !strcmp(kind, "a8") || !strcmp(kind, "a64") ||
               !strcmp(kind, "a256")) {
        uint32_t a = (uint32_t)atoi(kind + 1);
        if (a == 64) add_alignment_key(p, a); /* first key */
        kv_str(p, "general.architecture", "probe");
        kv_str(p, "general.name", name);
        if (a == 8 || a == 256) add_alignment_key(p, a); /* between other keys */
        KV(p, "probe.marker", EM_GGUF_U32, uint32_t, a);
        add_type_tensors(p, a == 32 ? 0 : a == 8 ? 1 : a == 64 ? 2 : 3);
    } else if (!strcmp(kind, "dims")) {
        /* shapes only Ember can write (ggml drops trailing 1s): as stored by converters */
        kv_str(p, "general.architecture", "probe");
        const int64_t conv[4] = { 4, 1, 8, 1 }, one[4] = { 1, 1, 1, 1 }, col[4] = { 32, 1, 1, 1 };
        const int64_t a[4] = { 1, 6, 1, 1 };
        tensor_raw(p, "conv.4d_trailing_1", GGML_TYPE_F32, 4, conv);
        tensor_raw(p, "scalar.0d", GGML_TYPE_F32, 0, one);
        tensor_raw(p, "one.1d", GGML_TYPE_F32, 1, one);
        tensor_raw(p, "q8.4d_ones", GGML_TYPE_Q8_0, 4, col);
        tensor_raw(p, "ssm_a", GGML_TYPE_F32, 4, a);
    } else if (!strcmp(kind, "split")) {
        kv_str(p, "general.architecture", "probe");
        kv_str(p, "general.name", name);
        KV(p, "probe.count", EM_GGUF_U64, uint64_t, 11);
        static const char *const toks[] = { "a", "b", "c" };
        kv_arr_str(p, "tokenizer.ggml.tokens", toks, 3);
        char tname[GGML_MAX_NAME];
        for (int i = 0; i < 11; i++) {
            int64_t ne[4] = { 256, 4 + i % 3, 1, 1 };
            snprintf(tname, sizeof tname, "blk.%d.w", i);
            int type = i % 3 == 0 ? GGML_TYPE_Q8_0 : i % 3 == 1 ? GGML_TYPE_F16 : GGML_TYPE_F32;
            if (type == GGML_TYPE_F32) tensor_raw(p, tname, type, 2, ne);
            else if (side_quantizes(p->side, type_row_of(type)))
                tensor_from_f32(p, tname, type, 2, ne, false);
            else tensor_raw(p, tname, type, 2, ne);
            p->t[p->n_t - 1].shard = i < 4 ? 0 : i < 8 ? 1 : 2;
        }
        if (p->side == SIDE_GGML) p->n_shards = 3;
        else p->max_shard_bytes = 8192;
    } else {
        die("unknown probe %s", name);
    }
}

static void probe_free(probe *p) {
    for (int i = 0; i < p->n_kv; i++) {
        kv_spec *kv = &p->kv[i];
        free(kv->key);
        free(kv->data);
        if (kv->strs)
            for (uint64_t j = 0; j < kv->n; j++) free(kv->strs[j]);
        free(kv->strs);
    }
    for (int i = 0; i < p->n_t; i++) {
        free(p->t[i].src);
        free(p->t[i].imatrix);
        free(p->t[i].raw);
    }
    free(p->kv);
    free(p->t);
}

/* The bytes a tensor holds when ggml quantized it. */
static uint8_t *ggml_bytes(const ggml_lib *L, const tensor_spec *t) {
    uint8_t *b = xmalloc(t->nbytes);
    if (!t->src) return memcpy(b, t->raw, t->nbytes);
    int64_t rows = (int64_t)(t->n_elem / (uint64_t)t->ne[0]);
    size_t n = L->ggml_quantize_chunk(t->type, t->src, b, 0, rows, t->ne[0], t->imatrix);
    if (n != t->nbytes) die("ggml_quantize_chunk(%s) wrote %zu bytes, want %" PRIu64, t->name, n, t->nbytes);
    return b;
}

/* The bytes a tensor holds when Ember quantized it. */
static uint8_t *ember_bytes(const tensor_spec *t) {
    uint8_t *b = xmalloc(t->nbytes);
    if (!t->src) return memcpy(b, t->raw, t->nbytes);
    em_err err = { 0 };
    if (em_quantize(t->type, t->src, b, (int64_t)t->n_elem, &err) != 0)
        die("em_quantize(%s): %s", t->name, err.msg);
    return b;
}

/* ---- JSON in the agreed `ember inspect --json` format --------------------------------- */

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates, at most
 * U+10FFFF), or 0 when the byte at s does not start one. */
static int utf8_seq(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else return 0;
    if (left < (size_t)n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return n;
}

/* A JSON string; bytes that are not valid UTF-8 become \u00XX of the byte (lossy). */
static void json_str(FILE *f, const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        int n = utf8_seq(s + i, len - i);
        if (n == 0) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else if (n > 1) {
            fwrite(s + i, 1, (size_t)n, f);
            i += (size_t)n;
        } else {
            if (c == '"') fputs("\\\"", f);
            else if (c == '\\') fputs("\\\\", f);
            else if (c == '\n') fputs("\\n", f);
            else if (c == '\t') fputs("\\t", f);
            else if (c == '\r') fputs("\\r", f);
            else if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc((int)c, f);
            i++;
        }
    }
    fputc('"', f);
}

static void json_f64(FILE *f, double v, bool is_f32) {
    if (isnan(v)) fputs("\"nan\"", f);
    else if (isinf(v)) fputs(v > 0 ? "\"inf\"" : "\"-inf\"", f);
    else fprintf(f, is_f32 ? "%.9g" : "%.17g", v);
}

static const char *gguf_type_label(int type) {
    static const char *const names[] = { "u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                         "bool", "str", "array", "u64", "i64", "f64" };
    return type >= 0 && type < 13 ? names[type] : "unknown";
}

/* One fixed-size value from its little-endian bytes. */
static void json_fixed(FILE *f, int type, const uint8_t *p) {
    switch (type) {
    case EM_GGUF_U8: fprintf(f, "%u", (unsigned)p[0]); break;
    case EM_GGUF_I8: fprintf(f, "%d", (int)(int8_t)p[0]); break;
    case EM_GGUF_BOOL: fputs(p[0] ? "true" : "false", f); break;
    case EM_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); fprintf(f, "%u", (unsigned)v); break; }
    case EM_GGUF_I16: { int16_t v; memcpy(&v, p, 2); fprintf(f, "%d", (int)v); break; }
    case EM_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); fprintf(f, "%" PRIu32, v); break; }
    case EM_GGUF_I32: { int32_t v; memcpy(&v, p, 4); fprintf(f, "%" PRId32, v); break; }
    case EM_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); fprintf(f, "%" PRIu64, v); break; }
    case EM_GGUF_I64: { int64_t v; memcpy(&v, p, 8); fprintf(f, "%" PRId64, v); break; }
    case EM_GGUF_F32: { float v; memcpy(&v, p, 4); json_f64(f, (double)v, true); break; }
    case EM_GGUF_F64: { double v; memcpy(&v, p, 8); json_f64(f, v, false); break; }
    default: die("json_fixed: type %d", type);
    }
}

/* Key i of a ggml context, as the agreed format prints it. */
static void json_ggml_kv(FILE *f, const ggml_lib *L, const struct gguf_context *g, int64_t i) {
    const char *key = L->gguf_get_key(g, i);
    int type = L->gguf_get_kv_type(g, i);
    fputs("{\"key\": ", f);
    json_str(f, key, strlen(key));
    fprintf(f, ", \"type\": \"%s\"", gguf_type_label(type));
    if (type == GGUF_TYPE_ARRAY) {
        int et = L->gguf_get_arr_type(g, i);
        size_t n = L->gguf_get_arr_n(g, i);
        fprintf(f, ", \"elem_type\": \"%s\", \"value\": [", gguf_type_label(et));
        const uint8_t *data = et == GGUF_TYPE_STRING ? NULL : L->gguf_get_arr_data(g, i);
        for (size_t j = 0; j < n; j++) {
            if (j) fputs(", ", f);
            if (et == GGUF_TYPE_STRING) {
                const char *s = L->gguf_get_arr_str(g, i, j);
                json_str(f, s, strlen(s));
            } else {
                json_fixed(f, et, data + j * (size_t)gguf_elem_size(et));
            }
        }
        fputc(']', f);
    } else if (type == GGUF_TYPE_STRING) {
        const char *s = L->gguf_get_val_str(g, i);
        fputs(", \"value\": ", f);
        json_str(f, s, strlen(s));
    } else {
        fputs(", \"value\": ", f);
        json_fixed(f, type, L->gguf_get_val_data(g, i));
    }
    fputc('}', f);
}

/* ---- ggml writes ---------------------------------------------------------------------- */

static void ggml_set_kv(const ggml_lib *L, struct gguf_context *g, const kv_spec *kv) {
    const uint8_t *d = kv->data;
    switch (kv->type) {
    case EM_GGUF_U8: L->gguf_set_val_u8(g, kv->key, d[0]); break;
    case EM_GGUF_I8: L->gguf_set_val_i8(g, kv->key, (int8_t)d[0]); break;
    case EM_GGUF_BOOL: L->gguf_set_val_bool(g, kv->key, d[0] != 0); break;
    case EM_GGUF_U16: { uint16_t v; memcpy(&v, d, 2); L->gguf_set_val_u16(g, kv->key, v); break; }
    case EM_GGUF_I16: { int16_t v; memcpy(&v, d, 2); L->gguf_set_val_i16(g, kv->key, v); break; }
    case EM_GGUF_U32: { uint32_t v; memcpy(&v, d, 4); L->gguf_set_val_u32(g, kv->key, v); break; }
    case EM_GGUF_I32: { int32_t v; memcpy(&v, d, 4); L->gguf_set_val_i32(g, kv->key, v); break; }
    case EM_GGUF_U64: { uint64_t v; memcpy(&v, d, 8); L->gguf_set_val_u64(g, kv->key, v); break; }
    case EM_GGUF_I64: { int64_t v; memcpy(&v, d, 8); L->gguf_set_val_i64(g, kv->key, v); break; }
    case EM_GGUF_F32: { float v; memcpy(&v, d, 4); L->gguf_set_val_f32(g, kv->key, v); break; }
    case EM_GGUF_F64: { double v; memcpy(&v, d, 8); L->gguf_set_val_f64(g, kv->key, v); break; }
    case EM_GGUF_STR: L->gguf_set_val_str(g, kv->key, kv->strs[0]); break;
    case EM_GGUF_ARRAY:
        if (kv->elem_type == EM_GGUF_STR)
            L->gguf_set_arr_str(g, kv->key, (const char **)kv->strs, kv->n);
        else
            L->gguf_set_arr_data(g, kv->key, kv->elem_type, kv->data, kv->n);
        break;
    default: die("ggml_set_kv: type %d", kv->type);
    }
}

/* A gguf context with the given metadata whose alignment is in effect for tensors added
 * next. gguf_init_empty keeps the default alignment whatever general.alignment says (only
 * the reader applies the key), so the metadata is serialized and parsed back, as a tool
 * that copies a model's metadata from a file does. */
static struct gguf_context *ggml_ctx_with_kv(const ggml_lib *L, const kv_spec *kv, int n_kv,
                                              bool reload) {
    struct gguf_context *g = L->gguf_init_empty();
    for (int i = 0; i < n_kv; i++) ggml_set_kv(L, g, &kv[i]);
    if (!reload) return g;
    size_t n = L->gguf_get_meta_size(g);
    void *meta = xmalloc(n);
    L->gguf_get_meta_data(g, meta);
    L->gguf_free(g);
    struct gguf_init_params ip = { .no_alloc = true, .ctx = NULL };
    g = L->gguf_init_from_buffer(meta, n, ip);
    free(meta);
    if (!g) die("gguf_init_from_buffer refused ggml's own metadata");
    return g;
}

/* Writes shard `shard` of p (every tensor when p has one file) at path through ggml. */
static void ggml_write_shard(const ggml_lib *L, const probe *p, int shard, const char *path,
                             uint8_t **bytes) {
    struct gguf_context *g;
    if (p->n_shards > 1) {
        /* as gguf-split: metadata in shard 0 only, then split.no, split.count and
         * split.tensors.count */
        g = ggml_ctx_with_kv(L, p->kv, shard == 0 ? p->n_kv : 0, false);
        L->gguf_set_val_u16(g, EM_GGUF_KEY_SPLIT_NO, (uint16_t)shard);
        L->gguf_set_val_u16(g, EM_GGUF_KEY_SPLIT_COUNT, (uint16_t)p->n_shards);
        L->gguf_set_val_i32(g, EM_GGUF_KEY_SPLIT_TENSORS, p->n_t);
    } else {
        g = ggml_ctx_with_kv(L, p->kv, p->n_kv, p->alignment != 32);
    }
    struct ggml_init_params ip = {
        .mem_size = (size_t)(p->n_t + 1) * L->ggml_tensor_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context *ctx = L->ggml_init(ip);
    if (!ctx) die("ggml_init failed");
    for (int i = 0; i < p->n_t; i++) {
        const tensor_spec *t = &p->t[i];
        if (t->shard != shard && p->n_shards > 1) continue;
        struct ggml_tensor *gt = L->ggml_new_tensor(ctx, t->type, t->n_dims, t->ne);
        L->ggml_set_name(gt, t->name);
        L->gguf_add_tensor(g, gt);
        L->gguf_set_tensor_data(g, t->name, bytes[i]);
    }
    if (!L->gguf_write_to_file(g, path, false)) die("gguf_write_to_file %s failed", path);
    L->ggml_free(ctx);
    L->gguf_free(g);
}

static char *shard_path(const char *dir, const char *name, int i, int n) {
    char file[128];
    if (n > 1) snprintf(file, sizeof file, "%s-%05d-of-%05d.gguf", name, i + 1, n);
    else snprintf(file, sizeof file, "%s.gguf", name);
    return path_join(dir, file);
}

/* ---- ggml reads: checks against the specification ------------------------------------ */

static bool is_split_key(const char *key) {
    return !strcmp(key, EM_GGUF_KEY_SPLIT_NO) || !strcmp(key, EM_GGUF_KEY_SPLIT_COUNT) ||
           !strcmp(key, EM_GGUF_KEY_SPLIT_TENSORS);
}

/* Key id of ggml context g against spec entry kv; reports every difference. */
static void check_kv(const ggml_lib *L, const struct gguf_context *g, int64_t id,
                     const kv_spec *kv, const char *path) {
    const char *key = L->gguf_get_key(g, id);
    if (strcmp(key, kv->key)) {
        fail("%s: key %" PRId64 " is '%s', want '%s'", path, id, key, kv->key);
        return;
    }
    int type = L->gguf_get_kv_type(g, id);
    if (type != kv->type) {
        fail("%s: key '%s' has type %s, want %s", path, key, gguf_type_label(type),
             gguf_type_label(kv->type));
        return;
    }
    if (type == GGUF_TYPE_STRING) {
        if (strcmp(L->gguf_get_val_str(g, id), kv->strs[0]))
            fail("%s: key '%s': string value differs", path, key);
        return;
    }
    if (type != GGUF_TYPE_ARRAY) {
        if (memcmp(L->gguf_get_val_data(g, id), kv->data, (size_t)gguf_elem_size(type)))
            fail("%s: key '%s': %s value differs (bitwise)", path, key, gguf_type_label(type));
        return;
    }
    int et = L->gguf_get_arr_type(g, id);
    size_t n = L->gguf_get_arr_n(g, id);
    if (et != kv->elem_type || n != kv->n) {
        fail("%s: key '%s': array of %zu %s, want %" PRIu64 " %s", path, key, n,
             gguf_type_label(et), kv->n, gguf_type_label(kv->elem_type));
        return;
    }
    if (et == GGUF_TYPE_STRING) {
        for (size_t j = 0; j < n; j++)
            if (strcmp(L->gguf_get_arr_str(g, id, j), kv->strs[j])) {
                fail("%s: key '%s': string %zu differs", path, key, j);
                return;
            }
    } else if (n && memcmp(L->gguf_get_arr_data(g, id), kv->data, n * (size_t)gguf_elem_size(et))) {
        fail("%s: key '%s': array elements differ (bitwise)", path, key);
    }
}

static void check_u64_key(const ggml_lib *L, const struct gguf_context *g, const char *path,
                          const char *key, int type, uint64_t want) {
    int64_t id = L->gguf_find_key(g, key);
    if (id < 0) {
        fail("%s: no key %s", path, key);
        return;
    }
    if (L->gguf_get_kv_type(g, id) != type) {
        fail("%s: key %s has type %s, want %s", path, key,
             gguf_type_label(L->gguf_get_kv_type(g, id)), gguf_type_label(type));
        return;
    }
    uint64_t v = type == GGUF_TYPE_UINT16 ? L->gguf_get_val_u16(g, id)
               : type == GGUF_TYPE_INT32 ? (uint64_t)(int64_t)L->gguf_get_val_i32(g, id)
                                         : L->gguf_get_val_u32(g, id);
    if (v != want) fail("%s: key %s = %" PRIu64 ", want %" PRIu64, path, key, v, want);
}

static void report_byte_diff(const char *what, const char *path, const tensor_spec *t,
                             const uint8_t *got, const uint8_t *want) {
    uint64_t first = 0, count = 0;
    for (uint64_t i = 0; i < t->nbytes; i++)
        if (got[i] != want[i]) {
            if (!count) first = i;
            count++;
        }
    const type_row *tr = type_row_of(t->type);
    fail("%s: tensor '%s' (%s): %s: %" PRIu64 " of %" PRIu64 " bytes differ, first at byte %" PRIu64
         " (block %" PRIu64 ", byte %" PRIu64 " in it): got 0x%02x want 0x%02x",
         path, t->name, tr->name, what, count, t->nbytes, first, first / (uint64_t)tr->size,
         first % (uint64_t)tr->size, got[first], want[first]);
}

/* The files of a probe as written: one, or every shard when the name is a first shard
 * PREFIX-00001-of-NNNNN.gguf. */
static char **probe_files(const char *path, int *n_out) {
    static const char first[] = "-00001-of-"; /* then NNNNN.gguf: 20 characters in all */
    size_t len = strlen(path);
    int n = 1;
    if (len > 20 && !strncmp(path + len - 20, first, 10) && !strcmp(path + len - 5, ".gguf"))
        n = atoi(path + len - 10);
    if (n < 1 || n > 99999) die("%s: bad shard count", path);
    char **files = xcalloc((size_t)n, sizeof *files);
    for (int i = 0; i < n; i++) {
        files[i] = xstrdup(path);
        if (n > 1) {
            char num[8];
            snprintf(num, sizeof num, "%05d", i + 1);
            memcpy(files[i] + len - 19, num, 5);
        }
    }
    *n_out = n;
    return files;
}

/* Probe name from a file path: the basename without "-NNNNN-of-NNNNN" and ".gguf". */
static void probe_name_of(const char *path, char *name, size_t cap) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(name, cap, "%s", base);
    char *dash = strstr(name, "-0");
    if (dash) *dash = 0;
    char *dot = strstr(name, ".gguf");
    if (dot) *dot = 0;
}

/* ggml loads every file of the probe; everything must be what the probe specifies. For
 * Ember-written probes, quantized tensors are also compared with ggml's own quantization. */
static void check_with_ggml(const ggml_lib *L, const probe *p, char **files, int n_files,
                            int *n_quant_compared) {
    int ti = 0; /* next spec tensor */
    bool split = n_files > 1;
    if (p->side == SIDE_GGML && n_files != p->n_shards)
        fail("%s: %d files, want %d", files[0], n_files, p->n_shards);
    for (int s = 0; s < n_files; s++) {
        const char *path = files[s];
        struct ggml_context *mctx = NULL;
        struct gguf_init_params ip = { .no_alloc = false, .ctx = &mctx };
        struct gguf_context *g = L->gguf_init_from_file(path, ip);
        if (!g) {
            fail("%s: ggml's gguf_init_from_file refused the file", path);
            return;
        }
        if (L->gguf_get_version(g) != 3) fail("%s: version %u", path, L->gguf_get_version(g));
        if (L->gguf_get_alignment(g) != p->alignment)
            fail("%s: ggml's alignment %zu, want %u", path, L->gguf_get_alignment(g), p->alignment);
        /* metadata: the spec's entries in order (shard 0), split keys where split */
        int64_t n_kv = L->gguf_get_n_kv(g), k = 0;
        for (int64_t id = 0; id < n_kv; id++) {
            const char *key = L->gguf_get_key(g, id);
            if (split && is_split_key(key)) continue;
            if (s > 0) {
                /* only the alignment may repeat in later shards (ggml reads it per file) */
                if (strcmp(key, "general.alignment"))
                    fail("%s: shard %d carries key '%s' (metadata belongs in shard 0)", path, s, key);
                continue;
            }
            if (k >= p->n_kv) {
                fail("%s: unexpected key '%s'", path, key);
                continue;
            }
            check_kv(L, g, id, &p->kv[k++], path);
        }
        if (s == 0 && k != p->n_kv) fail("%s: %" PRId64 " keys, want %d", path, k, p->n_kv);
        if (split) {
            check_u64_key(L, g, path, EM_GGUF_KEY_SPLIT_NO, GGUF_TYPE_UINT16, (uint64_t)s);
            check_u64_key(L, g, path, EM_GGUF_KEY_SPLIT_COUNT, GGUF_TYPE_UINT16, (uint64_t)n_files);
            check_u64_key(L, g, path, EM_GGUF_KEY_SPLIT_TENSORS, GGUF_TYPE_INT32, (uint64_t)p->n_t);
        } else if (L->gguf_find_key(g, EM_GGUF_KEY_SPLIT_COUNT) >= 0) {
            fail("%s: a single file carries split keys", path);
        }
        /* tensors: the spec's, in order, continued from the previous shard */
        int64_t n_t = L->gguf_get_n_tensors(g);
        if (split && n_t == 0) fail("%s: shard without tensors", path);
        for (int64_t id = 0; id < n_t; id++, ti++) {
            const char *name = L->gguf_get_tensor_name(g, id);
            if (ti >= p->n_t) {
                fail("%s: unexpected tensor '%s'", path, name);
                continue;
            }
            const tensor_spec *t = &p->t[ti];
            if (p->side == SIDE_GGML && split && t->shard != s)
                fail("%s: tensor '%s' in shard %d, want %d", path, t->name, s, t->shard);
            if (strcmp(name, t->name)) {
                fail("%s: tensor %" PRId64 " is '%s', want '%s'", path, id, name, t->name);
                continue;
            }
            const int64_t *ne = L->gguf_get_tensor_ne(g, id);
            int type = L->gguf_get_tensor_type(g, id);
            if (type != t->type) fail("%s: tensor '%s' type %d, want %d", path, name, type, t->type);
            if (memcmp(ne, t->ne, sizeof t->ne))
                fail("%s: tensor '%s' shape [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                     "], want [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "]",
                     path, name, ne[0], ne[1], ne[2], ne[3], t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
            if (L->gguf_get_tensor_size(g, id) != t->nbytes) {
                fail("%s: tensor '%s' size %zu, want %" PRIu64, path, name,
                     L->gguf_get_tensor_size(g, id), t->nbytes);
                continue;
            }
            const struct ggml_tensor *gt = L->ggml_get_tensor(mctx, name);
            if (!gt || !gt->data) {
                fail("%s: tensor '%s' has no data in ggml's context", path, name);
                continue;
            }
            uint8_t *want = p->side == SIDE_GGML ? ggml_bytes(L, t) : ember_bytes(t);
            if (memcmp(gt->data, want, t->nbytes))
                report_byte_diff("stored bytes", path, t, gt->data, want);
            if (p->side == SIDE_EMBER && t->src && !t->imatrix) {
                uint8_t *gq = ggml_bytes(L, t);
                if (memcmp(gq, want, t->nbytes))
                    report_byte_diff("Ember's quantization vs ggml_quantize_chunk", path, t, want, gq);
                free(gq);
                if (n_quant_compared) ++*n_quant_compared;
            }
            free(want);
        }
        if (split && p->max_shard_bytes && n_t > 1) {
            struct stat st;
            if (stat(path, &st) == 0 && (uint64_t)st.st_size > p->max_shard_bytes)
                fail("%s: %lld bytes with %" PRId64 " tensors, over the %" PRIu64 "-byte budget",
                     path, (long long)st.st_size, n_t, p->max_shard_bytes);
        }
        L->gguf_free(g);
        L->ggml_free(mctx);
    }
    if (ti != p->n_t) fail("%s: %d tensors in all, want %d", files[0], ti, p->n_t);
    if (p->side == SIDE_EMBER && p->max_shard_bytes && n_files < 2)
        fail("%s: a %" PRIu64 "-byte shard budget gave one file", files[0], p->max_shard_bytes);
}

/* ---- write-ggml --------------------------------------------------------------------- */

/* The type table against ggml's traits and Ember's table. */
static void check_type_tables(const ggml_lib *L) {
    for (int i = 0; i < N_TYPES; i++) {
        const type_row *tr = &k_types[i];
        if (strcmp(L->ggml_type_name(tr->id), tr->name) || L->ggml_blck_size(tr->id) != tr->blck ||
            L->ggml_type_size(tr->id) != (size_t)tr->size)
            die("probe type table disagrees with ggml on %s", tr->name);
        const em_type_info *e = em_type_get(tr->id);
        if (!e) fail("Ember's type table lacks %s (id %d)", tr->name, tr->id);
        else if (strcmp(e->name, tr->name) || e->block_elems != tr->blck || e->block_bytes != tr->size)
            fail("Ember's type table says %s: %d values in %d bytes; ggml says %s: %d in %d", e->name,
                 e->block_elems, e->block_bytes, tr->name, tr->blck, tr->size);
    }
}

/* A tensor dequantized by ggml: to_float where ggml has one; f32 as stored; the integer
 * types and f64 by a C conversion (ggml has no to_float for them). */
static void ggml_to_f32(const ggml_lib *L, int type, const void *data, float *out, uint64_t n) {
    const struct ggml_type_traits *tr = L->ggml_get_type_traits(type);
    const uint8_t *b = data;
    if (tr->to_float) { tr->to_float(data, out, (int64_t)n); return; }
    for (uint64_t i = 0; i < n; i++) {
        switch (type) {
        case GGML_TYPE_F32: memcpy(&out[i], b + 4 * i, 4); break;
        case GGML_TYPE_I8: out[i] = (float)(int8_t)b[i]; break;
        case GGML_TYPE_I16: { int16_t v; memcpy(&v, b + 2 * i, 2); out[i] = (float)v; break; }
        case GGML_TYPE_I32: { int32_t v; memcpy(&v, b + 4 * i, 4); out[i] = (float)v; break; }
        case GGML_TYPE_I64: { int64_t v; memcpy(&v, b + 8 * i, 8); out[i] = (float)v; break; }
        case GGML_TYPE_F64: { double v; memcpy(&v, b + 8 * i, 8); out[i] = (float)v; break; }
        default: die("no conversion to f32 for type %d", type);
        }
    }
}

/* What ggml reads back from the probe's files: the expected inspect JSON, each tensor's f32,
 * and the manifest lines the script runs Ember on. */
static void dump_expected(const ggml_lib *L, const probe *p, char **files, int n_files,
                          const char *dir, FILE *manifest) {
    char *json_path, *tdir, buf[512];
    snprintf(buf, sizeof buf, "%s.expected.json", p->name);
    json_path = path_join(dir, buf);
    snprintf(buf, sizeof buf, "%s.t", p->name);
    tdir = path_join(dir, buf);
    make_dir(tdir);
    FILE *f = fopen(json_path, "w");
    if (!f) die("create %s: %s", json_path, strerror(errno));
    fprintf(manifest, "json\t%s\t%s\n", files[0], json_path);

    struct gguf_context **g = xcalloc((size_t)n_files, sizeof *g);
    struct ggml_context **m = xcalloc((size_t)n_files, sizeof *m);
    for (int s = 0; s < n_files; s++) {
        struct gguf_init_params ip = { .no_alloc = false, .ctx = &m[s] };
        g[s] = L->gguf_init_from_file(files[s], ip);
        if (!g[s]) die("ggml cannot read its own %s", files[s]);
    }
    fputs("{\"file\": ", f);
    json_str(f, files[0], strlen(files[0]));
    fprintf(f, ", \"version\": %u, \"alignment\": %zu, \"n_shards\": %d,\n \"metadata\": [",
            L->gguf_get_version(g[0]), L->gguf_get_alignment(g[0]), n_files);
    for (int64_t i = 0; i < L->gguf_get_n_kv(g[0]); i++) {
        fputs(i ? ",\n  " : "\n  ", f);
        json_ggml_kv(f, L, g[0], i);
    }
    fputs("],\n \"tensors\": [", f);
    int idx = 0;
    for (int s = 0; s < n_files; s++) {
        for (int64_t i = 0; i < L->gguf_get_n_tensors(g[s]); i++, idx++) {
            const char *name = L->gguf_get_tensor_name(g[s], i);
            int type = L->gguf_get_tensor_type(g[s], i);
            const int64_t *ne = L->gguf_get_tensor_ne(g[s], i);
            int nd = 1; /* ggml keeps no n_dims: it writes ggml_n_dims (trailing 1s dropped) */
            for (int d = 1; d < 4; d++)
                if (ne[d] != 1) nd = d + 1;
            fputs(idx ? ",\n  " : "\n  ", f);
            fputs("{\"name\": ", f);
            json_str(f, name, strlen(name));
            fprintf(f, ", \"type\": \"%s\", \"type_id\": %d, \"shape\": [", L->ggml_type_name(type), type);
            for (int d = 0; d < nd; d++) fprintf(f, "%s%" PRId64, d ? ", " : "", ne[d]);
            fprintf(f, "], \"shard\": %d, \"offset\": %zu, \"bytes\": %zu}", s,
                    L->gguf_get_tensor_offset(g[s], i), L->gguf_get_tensor_size(g[s], i));

            const struct ggml_tensor *gt = L->ggml_get_tensor(m[s], name);
            if (!gt || !gt->data) die("%s: ggml has no data for %s", files[s], name);
            uint64_t n = (uint64_t)(ne[0] * ne[1] * ne[2] * ne[3]);
            float *out = xmalloc(n * sizeof(float));
            ggml_to_f32(L, type, gt->data, out, n);
            snprintf(buf, sizeof buf, "%d.f32", idx);
            char *fpath = path_join(tdir, buf);
            write_file(fpath, out, n * sizeof(float));
            fprintf(manifest, "tensor\t%s\t%s\t%s\t%d\t%s\n", files[0], name, fpath,
                    ember_reads(type) ? 1 : 0, L->ggml_type_name(type));
            free(fpath);
            free(out);
        }
    }
    fputs("]}\n", f);
    if (fclose(f) != 0) die("write %s failed", json_path);
    for (int s = 0; s < n_files; s++) {
        L->gguf_free(g[s]);
        L->ggml_free(m[s]);
    }
    free(g);
    free(m);
    free(json_path);
    free(tdir);
}

static int cmd_write_ggml(const ggml_lib *L, const char *dir) {
    make_dir(dir);
    check_type_tables(L);
    char *mpath = path_join(dir, "manifest.tsv");
    FILE *manifest = fopen(mpath, "w");
    if (!manifest) die("create %s: %s", mpath, strerror(errno));
    for (size_t pi = 0; pi < sizeof k_ggml_probes / sizeof k_ggml_probes[0]; pi++) {
        probe p;
        probe_build(&p, k_ggml_probes[pi]);
        uint8_t **bytes = xcalloc((size_t)p.n_t, sizeof *bytes);
        for (int i = 0; i < p.n_t; i++) bytes[i] = ggml_bytes(L, &p.t[i]);
        char **files = xcalloc((size_t)p.n_shards, sizeof *files);
        for (int s = 0; s < p.n_shards; s++) {
            files[s] = shard_path(dir, p.name, s, p.n_shards);
            ggml_write_shard(L, &p, s, files[s], bytes);
        }
        int before = g_failures;
        check_with_ggml(L, &p, files, p.n_shards, NULL); /* ggml wrote what the probe meant */
        if (g_failures != before) die("%s: ggml did not write what the probe specifies", p.name);
        dump_expected(L, &p, files, p.n_shards, dir, manifest);
        printf("wrote %s (%d keys, %d tensors, %d file%s)\n", p.name, p.n_kv, p.n_t, p.n_shards,
               p.n_shards > 1 ? "s" : "");
        for (int s = 0; s < p.n_shards; s++) free(files[s]);
        free(files);
        for (int i = 0; i < p.n_t; i++) free(bytes[i]);
        free(bytes);
        probe_free(&p);
    }
    if (fclose(manifest) != 0) die("write %s failed", mpath);
    free(mpath);
    return g_failures ? 1 : 0;
}

/* ---- write-ember -------------------------------------------------------------------- */

static int ember_set_kv(em_gguf_writer *w, const kv_spec *kv, em_err *err) {
    const uint8_t *d = kv->data;
    switch (kv->type) {
    case EM_GGUF_U8: return em_gguf_writer_set_u8(w, kv->key, d[0], err);
    case EM_GGUF_I8: return em_gguf_writer_set_i8(w, kv->key, (int8_t)d[0], err);
    case EM_GGUF_BOOL: return em_gguf_writer_set_bool(w, kv->key, d[0] != 0, err);
    case EM_GGUF_U16: { uint16_t v; memcpy(&v, d, 2); return em_gguf_writer_set_u16(w, kv->key, v, err); }
    case EM_GGUF_I16: { int16_t v; memcpy(&v, d, 2); return em_gguf_writer_set_i16(w, kv->key, v, err); }
    case EM_GGUF_U32: { uint32_t v; memcpy(&v, d, 4); return em_gguf_writer_set_u32(w, kv->key, v, err); }
    case EM_GGUF_I32: { int32_t v; memcpy(&v, d, 4); return em_gguf_writer_set_i32(w, kv->key, v, err); }
    case EM_GGUF_U64: { uint64_t v; memcpy(&v, d, 8); return em_gguf_writer_set_u64(w, kv->key, v, err); }
    case EM_GGUF_I64: { int64_t v; memcpy(&v, d, 8); return em_gguf_writer_set_i64(w, kv->key, v, err); }
    case EM_GGUF_F32: { float v; memcpy(&v, d, 4); return em_gguf_writer_set_f32(w, kv->key, v, err); }
    case EM_GGUF_F64: { double v; memcpy(&v, d, 8); return em_gguf_writer_set_f64(w, kv->key, v, err); }
    case EM_GGUF_STR: return em_gguf_writer_set_str(w, kv->key, kv->strs[0], err);
    case EM_GGUF_ARRAY:
        if (kv->elem_type == EM_GGUF_STR)
            return em_gguf_writer_set_arr_str(w, kv->key, (const char *const *)kv->strs, kv->n, err);
        if (kv->elem_type == EM_GGUF_BOOL) { /* the writer takes C bool elements */
            bool *b = xmalloc(kv->n * sizeof(bool));
            for (uint64_t i = 0; i < kv->n; i++) b[i] = kv->data[i] != 0;
            int rc = em_gguf_writer_set_arr(w, kv->key, kv->elem_type, b, kv->n, err);
            free(b);
            return rc;
        }
        return em_gguf_writer_set_arr(w, kv->key, kv->elem_type, kv->data, kv->n, err);
    default: die("ember_set_kv: type %d", kv->type);
    }
}

/* Writes probe p through Ember's writer; returns the path of its (first) file, or NULL. */
static char *ember_write(const probe *p, const char *dir) {
    char *path = shard_path(dir, p->name, 0, 1);
    em_gguf_write_opts opts = { .max_shard_bytes = p->max_shard_bytes };
    em_gguf_writer *w = NULL;
    em_err err = { 0 };
    char *first = NULL;
    if (em_gguf_writer_create(&w, path, &opts, &err) != 0) goto fail;
    for (int i = 0; i < p->n_kv; i++)
        if (ember_set_kv(w, &p->kv[i], &err) != 0) goto fail;
    for (int i = 0; i < p->n_t; i++)
        if (em_gguf_writer_add_tensor(w, p->t[i].name, p->t[i].type, p->t[i].n_dims, p->t[i].ne, &err) != 0)
            goto fail;
    for (int i = 0; i < p->n_t; i++) {
        uint8_t *b = ember_bytes(&p->t[i]);
        int rc = em_gguf_writer_write_tensor(w, p->t[i].name, b, p->t[i].nbytes, &err);
        free(b);
        if (rc != 0) goto fail;
    }
    if (em_gguf_writer_finish(w, &err) != 0) goto fail;
    first = xstrdup(em_gguf_writer_shard_path(w, 0));
    em_gguf_writer_free(w);
    free(path);
    return first;
fail:
    fail("%s: Ember's writer: %s", p->name, err.msg);
    em_gguf_writer_free(w);
    free(path);
    return NULL;
}

static int cmd_write_ember(const char *dir) {
    make_dir(dir);
    char *lpath = path_join(dir, "files.txt");
    FILE *list = fopen(lpath, "w");
    if (!list) die("create %s: %s", lpath, strerror(errno));
    for (size_t pi = 0; pi < sizeof k_ember_probes / sizeof k_ember_probes[0]; pi++) {
        probe p;
        probe_build(&p, k_ember_probes[pi]);
        char *path = ember_write(&p, dir);
        if (path) {
            fprintf(list, "%s\n", path);
            printf("wrote %s (%d keys, %d tensors)\n", path, p.n_kv, p.n_t);
        }
        free(path);
        probe_free(&p);
    }
    if (fclose(list) != 0) die("write %s failed", lpath);
    free(lpath);
    return g_failures ? 1 : 0;
}

/* ---- read-ggml, cmp-f32 --------------------------------------------------------------- */

/* ggml keeps no dimension count: it writes the count up to the last dimension above 1. */
static bool ggml_keeps_dims(const tensor_spec *t) {
    int nd = 1;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] != 1) nd = d + 1;
    return nd == t->n_dims;
}

/* Whether two files hold the same bytes; a difference is a failure naming its offset. */
static void compare_files(const char *path, const char *ggml_path) {
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    em_err err = { 0 };
    if (em_file_read_all(path, &a, &na, &err) != 0 || em_file_read_all(ggml_path, &b, &nb, &err) != 0) {
        fail("%s", err.msg);
    } else {
        size_t i = 0;
        while (i < na && i < nb && a[i] == b[i]) i++;
        if (i < na || i < nb)
            fail("%s: %zu bytes, ggml writes the same content in %zu; first difference at byte %zu",
                 path, na, nb, i);
    }
    free(a);
    free(b);
}

/* Ember-written files must be the very bytes ggml's gguf_write_to_file produces for the same
 * metadata and tensors (header, encodings, tensor infos, zero padding); a split set is
 * compared shard by shard, laid out as gguf-split does with Ember's choice of shards.
 * Skipped when a tensor keeps trailing 1-dimensions, which ggml would drop. Returns whether
 * it ran. */
static bool check_same_bytes_as_ggml(const ggml_lib *L, probe *p, char **files, int n_files) {
    for (int i = 0; i < p->n_t; i++)
        if (!ggml_keeps_dims(&p->t[i])) return false;
    if (n_files > 1) { /* the shard of each tensor, as ggml finds them */
        int ti = 0;
        for (int s = 0; s < n_files; s++) {
            struct gguf_init_params ip = { .no_alloc = true, .ctx = NULL };
            struct gguf_context *g = L->gguf_init_from_file(files[s], ip);
            if (!g) return false; /* already reported */
            for (int64_t i = 0; i < L->gguf_get_n_tensors(g) && ti < p->n_t; i++) p->t[ti++].shard = s;
            L->gguf_free(g);
        }
        p->n_shards = n_files;
    }
    uint8_t **bytes = xcalloc((size_t)p->n_t + 1, sizeof *bytes);
    for (int i = 0; i < p->n_t; i++) bytes[i] = ember_bytes(&p->t[i]);
    for (int s = 0; s < n_files; s++) {
        size_t n = strlen(files[s]) + 32;
        char *tmp = xmalloc(n);
        snprintf(tmp, n, "%s.ggml-rewrite", files[s]);
        ggml_write_shard(L, p, s, tmp, bytes);
        compare_files(files[s], tmp);
        remove(tmp);
        free(tmp);
    }
    for (int i = 0; i < p->n_t; i++) free(bytes[i]);
    free(bytes);
    return true;
}

static int cmd_read_ggml(const ggml_lib *L, const char *path) {
    char name[128];
    probe_name_of(path, name, sizeof name);
    probe p;
    probe_build(&p, name);
    int n_files;
    char **files = probe_files(path, &n_files);
    int n_quant = 0;
    check_with_ggml(L, &p, files, n_files, &n_quant);
    if (!g_failures) {
        printf("ok: ggml reads %s (%d file%s) exactly as written: %d keys, %d tensors (%d "
               "quantized by Ember, each equal to ggml_quantize_chunk's bytes)\n",
               path, n_files, n_files > 1 ? "s" : "", p.n_kv, p.n_t, n_quant);
        if (check_same_bytes_as_ggml(L, &p, files, n_files) && !g_failures)
            printf("ok: %s%s byte for byte what ggml's gguf_write_to_file writes\n", path,
                   n_files > 1 ? " and its shards are" : " is");
    }
    for (int i = 0; i < n_files; i++) free(files[i]);
    free(files);
    probe_free(&p);
    return g_failures ? 1 : 0;
}

/* ---- rewrite-ember -------------------------------------------------------------------- */

/* Ember opens a file ggml wrote and writes everything it read (every key as read, every
 * tensor's info and bytes) into a new file, which must be byte for byte ggml's file. */
static int cmd_rewrite_ember(const char *path) {
    size_t n = strlen(path) + 32;
    char *out = xmalloc(n);
    snprintf(out, n, "%s.ember-rewrite.gguf", path);
    em_gguf *g = NULL;
    em_gguf_writer *w = NULL;
    em_err err = { 0 };
    int rc = em_gguf_open_single(&g, path, &err);
    if (!rc) rc = em_gguf_writer_create(&w, out, NULL, &err);
    for (int64_t i = 0; !rc && i < em_gguf_n_keys(g); i++) {
        em_gguf_value v = em_gguf_value_at(g, i);
        rc = em_gguf_writer_set_value(w, em_gguf_key(g, i), &v, &err);
    }
    for (int64_t i = 0; !rc && i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        rc = em_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, &err);
    }
    for (int64_t i = 0; !rc && i < em_gguf_n_tensors(g); i++) {
        const em_gguf_tensor *t = em_gguf_tensor_at(g, i);
        rc = em_gguf_writer_write_tensor(w, t->name, t->data, t->bytes, &err);
    }
    if (!rc) rc = em_gguf_writer_finish(w, &err);
    if (rc) fail("%s: Ember's read-then-write: %s", path, err.msg);
    else compare_files(out, path);
    if (!g_failures) printf("ok: Ember rewrites %s byte for byte\n", path);
    em_gguf_writer_free(w);
    em_gguf_close(g);
    remove(out);
    free(out);
    return g_failures ? 1 : 0;
}

static int cmd_cmp_f32(const char *want_path, const char *got_path) {
    char *want = NULL, *got = NULL;
    size_t nw = 0, ng = 0;
    em_err err = { 0 };
    if (em_file_read_all(want_path, &want, &nw, &err) != 0 ||
        em_file_read_all(got_path, &got, &ng, &err) != 0) {
        fail("%s", err.msg);
        free(want);
        return 1;
    }
    if (nw != ng) fail("%s: %zu bytes, want %zu (%s)", got_path, ng, nw, want_path);
    size_t n = (nw < ng ? nw : ng) / 4, bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, want + 4 * i, 4);
        memcpy(&b, got + 4 * i, 4);
        if (a == b) continue;
        if (bad++ < 5)
            printf("  value %zu: got %.9g (0x%08x), want %.9g (0x%08x)\n", i, (double)bits_f32(b), b,
                   (double)bits_f32(a), a);
    }
    if (bad) {
        printf("%zu of %zu values differ from ggml's\n", bad, n);
        g_failures++;
    }
    free(want);
    free(got);
    return g_failures ? 1 : 0;
}

static int usage(void) {
    fputs("usage: compat_gguf_probe write-ggml BINS DIR | write-ember DIR | read-ggml BINS FILE |"
          " rewrite-ember FILE | cmp-f32 WANT.f32 GOT.f32\n", stderr);
    return 2;
}

static void open_ggml(ggml_lib *L, const char *bins) {
    char msg[1024];
    if (ggml_lib_open(L, bins, msg, sizeof msg) != 0) die("%s", msg);
    if (ggml_lib_check_layout(L, msg, sizeof msg) != 0) die("%s", msg);
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    ggml_lib L;
    int rc;
    if (!strcmp(cmd, "write-ggml") && argc == 4) {
        open_ggml(&L, argv[2]);
        rc = cmd_write_ggml(&L, argv[3]);
    } else if (!strcmp(cmd, "read-ggml") && argc == 4) {
        open_ggml(&L, argv[2]);
        rc = cmd_read_ggml(&L, argv[3]);
    } else if (!strcmp(cmd, "write-ember") && argc == 3) {
        return cmd_write_ember(argv[2]);
    } else if (!strcmp(cmd, "rewrite-ember") && argc == 3) {
        return cmd_rewrite_ember(argv[2]);
    } else if (!strcmp(cmd, "cmp-f32") && argc == 4) {
        return cmd_cmp_f32(argv[2], argv[3]);
    } else {
        return usage();
    }
    ggml_lib_close(&L);
    return rc;
}

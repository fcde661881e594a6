/* Tests of quant/: the type table against ggml's published block geometry, argument checks,
 * hand-built blocks with known values (decoded from the layouts as documented in
 * ../shared/reference/llamacpp-formats.md §5, not from Ember's code), quantize -> dequantize
 * error bounds, tie rounding, determinism and independence from buffer alignment.
 * Bit-for-bit agreement with ggml itself is checked by tests/compat/quant_vs_ggml.c. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "quant/quant.h"

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- type table --------------------------------------------------------------------- */

/* ggml's block geometry (ggml-common.h / type traits of the ggml library). */
static const struct {
    int id;
    const char *name;
    int elems, bytes;
} geometry[] = {
    { 0, "f32", 1, 4 },        { 1, "f16", 1, 2 },         { 2, "q4_0", 32, 18 },
    { 3, "q4_1", 32, 20 },     { 6, "q5_0", 32, 22 },      { 7, "q5_1", 32, 24 },
    { 8, "q8_0", 32, 34 },     { 9, "q8_1", 32, 36 },      { 10, "q2_K", 256, 84 },
    { 11, "q3_K", 256, 110 },  { 12, "q4_K", 256, 144 },   { 13, "q5_K", 256, 176 },
    { 14, "q6_K", 256, 210 },  { 15, "q8_K", 256, 292 },   { 16, "iq2_xxs", 256, 66 },
    { 17, "iq2_xs", 256, 74 }, { 18, "iq3_xxs", 256, 98 }, { 19, "iq1_s", 256, 50 },
    { 20, "iq4_nl", 32, 18 },  { 21, "iq3_s", 256, 110 },  { 22, "iq2_s", 256, 82 },
    { 23, "iq4_xs", 256, 136 }, { 24, "i8", 1, 1 },        { 25, "i16", 1, 2 },
    { 26, "i32", 1, 4 },       { 27, "i64", 1, 8 },        { 28, "f64", 1, 8 },
    { 29, "iq1_m", 256, 56 },  { 30, "bf16", 1, 2 },       { 34, "tq1_0", 256, 54 },
    { 35, "tq2_0", 256, 66 },  { 39, "mxfp4", 32, 17 },    { 40, "nvfp4", 64, 36 },
    { 41, "q1_0", 128, 18 },   { 42, "q2_0", 64, 18 },
};
#define N_GEOMETRY ((int)(sizeof geometry / sizeof geometry[0]))

static void test_type_table(void **state) {
    (void)state;
    int known = 0;
    for (int i = 0; i < N_GEOMETRY; i++) {
        const em_type_info *t = em_type_get(geometry[i].id);
        assert_non_null(t);
        assert_string_equal(t->name, geometry[i].name);
        assert_string_equal(em_type_name(geometry[i].id), geometry[i].name);
        assert_int_equal(t->block_elems, geometry[i].elems);
        assert_int_equal(t->block_bytes, geometry[i].bytes);
        assert_int_equal(em_type_from_name(geometry[i].name), geometry[i].id);
    }
    for (int id = -3; id < EM_TYPE_COUNT + 5; id++)
        if (em_type_get(id)) known++;
    assert_int_equal(known, N_GEOMETRY); /* nothing beyond the list above */
    /* ids ggml removed or never had */
    const int unknown[] = { -1, 4, 5, 31, 32, 33, 36, 37, 38, EM_TYPE_COUNT, 1000 };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_null(em_type_get(unknown[i]));
        assert_string_equal(em_type_name(unknown[i]), "unknown");
    }
    /* names: case-insensitive, exact otherwise */
    assert_int_equal(em_type_from_name("Q8_0"), EM_TYPE_Q8_0);
    assert_int_equal(em_type_from_name("Q4_K"), EM_TYPE_Q4_K);
    assert_int_equal(em_type_from_name("q4_k"), EM_TYPE_Q4_K);
    assert_int_equal(em_type_from_name("BF16"), EM_TYPE_BF16);
    assert_int_equal(em_type_from_name("q8"), -1);
    assert_int_equal(em_type_from_name("q8_0 "), -1);
    assert_int_equal(em_type_from_name(""), -1);
    assert_int_equal(em_type_from_name(NULL), -1);
    /* what Ember can read and write */
    const int readable[] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q4_0,
                             EM_TYPE_Q4_1, EM_TYPE_Q5_0, EM_TYPE_Q5_1, EM_TYPE_Q8_0,
                             EM_TYPE_Q2_K, EM_TYPE_Q3_K, EM_TYPE_Q4_K, EM_TYPE_Q5_K,
                             EM_TYPE_Q6_K, EM_TYPE_Q8_K, EM_TYPE_MXFP4, EM_TYPE_I8,
                             EM_TYPE_I16, EM_TYPE_I32, EM_TYPE_F64, EM_TYPE_IQ1_S,
                             EM_TYPE_IQ1_M, EM_TYPE_IQ2_XXS, EM_TYPE_IQ2_XS, EM_TYPE_IQ2_S,
                             EM_TYPE_IQ3_XXS, EM_TYPE_IQ3_S, EM_TYPE_IQ4_NL, EM_TYPE_IQ4_XS };
    for (size_t i = 0; i < sizeof readable / sizeof readable[0]; i++)
        assert_non_null(em_type_get(readable[i])->to_float);
    assert_null(em_type_get(EM_TYPE_TQ1_0)->to_float);
    assert_null(em_type_get(EM_TYPE_IQ2_XXS)->from_float); /* IQ: read only */
    assert_null(em_type_get(EM_TYPE_Q8_1)->to_float);
    assert_non_null(em_type_get(EM_TYPE_Q4_K)->from_float);
    assert_null(em_type_get(EM_TYPE_I32)->from_float);
}

static void test_row_bytes(void **state) {
    (void)state;
    uint64_t b = 1;
    em_err err = { 0 };
    assert_int_equal(em_type_row_bytes(EM_TYPE_Q8_0, 64, &b, &err), EM_OK);
    assert_int_equal(b, 68);
    assert_int_equal(em_type_row_bytes(EM_TYPE_Q4_K, 4096, &b, &err), EM_OK);
    assert_int_equal(b, 16 * 144);
    assert_int_equal(em_type_row_bytes(EM_TYPE_BF16, 7, &b, &err), EM_OK);
    assert_int_equal(b, 14);
    assert_int_equal(em_type_row_bytes(EM_TYPE_MXFP4, 0, &b, &err), EM_OK);
    assert_int_equal(b, 0);
    assert_int_equal(em_type_row_bytes(EM_TYPE_Q8_0, 33, &b, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "q8_0"));
    assert_int_equal(em_type_row_bytes(EM_TYPE_Q6_K, 128, &b, &err), EM_EFORMAT);
    assert_int_equal(em_type_row_bytes(4, 32, &b, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_type_row_bytes(-7, 32, &b, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_type_row_bytes(EM_TYPE_COUNT, 32, &b, &err), EM_EUNSUPPORTED);
    /* 2^62 f32 values are 2^64 bytes; the largest block multiple of q8_0 overflows too */
    assert_int_equal(em_type_row_bytes(EM_TYPE_F32, 1ull << 62, &b, &err), EM_EOVERFLOW);
    assert_int_equal(em_type_row_bytes(EM_TYPE_Q8_0, UINT64_MAX / 32 * 32, &b, &err),
                     EM_EOVERFLOW);
    assert_int_equal(em_type_row_bytes(EM_TYPE_F32, 1ull << 61, &b, NULL), EM_OK);
    assert_int_equal(b, 1ull << 63);
}

/* IQ dequantization on hand-made blocks whose values follow from the format description
 * alone (d = 1, small indices; grid entry 0 of each codebook is its first listed value):
 * anchors the layouts independently of ggml (tests/compat checks every bit against ggml). */
static void test_iq_known_values(void **state) {
    (void)state;
    static const float kv[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
    const uint16_t one = 0x3c00; /* fp16 1.0 */
    float y[256];
    uint8_t blk[256];

    /* IQ4_NL: y[j] = d * kv[low nibble of byte j], y[j+16] = d * kv[high nibble] */
    memset(blk, 0, sizeof blk);
    memcpy(blk, &one, 2);
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    assert_int_equal(em_dequantize(EM_TYPE_IQ4_NL, blk, y, 32, NULL), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == kv[j]);
        assert_true(y[j + 16] == kv[15 - j]);
    }

    /* IQ4_XS: scale of sub-block s = (4-bit low | 2-bit high << 4) - 32; sub-block 1 gets
     * scale 33 - 32 = 1 (low nibble 1, high bits 10 -> 0b10 << 4 = 32) */
    memset(blk, 0, sizeof blk);
    memcpy(blk, &one, 2);
    const uint16_t scales_h = 2 << 2; /* sub-block 1: high bits 2 */
    memcpy(blk + 2, &scales_h, 2);
    blk[4] = 0x10; /* sub-block 0 low 0, sub-block 1 low 1 */
    for (int j = 0; j < 16; j++) blk[8 + 16 + j] = 0xF8; /* sub-block 1: low 8, high 15 */
    assert_int_equal(em_dequantize(EM_TYPE_IQ4_XS, blk, y, 256, NULL), 0);
    assert_true(y[0] == -32.0f * -127.0f); /* sub-block 0: scale -32, index 0 */
    for (int j = 0; j < 16; j++) {
        assert_true(y[32 + j] == kv[8]);
        assert_true(y[48 + j] == kv[15]);
    }

    /* IQ1_S: index 0 = all -1; y = d * (2*s + 1) * (g + delta), delta = -0.125 when qh bit 15 */
    memset(blk, 0, sizeof blk);
    memcpy(blk, &one, 2);
    const uint16_t qh1 = 0x8000 | 1 << 12; /* sub-block 1: delta -1/8, scale 3 */
    memcpy(blk + 34 + 2, &qh1, 2);
    assert_int_equal(em_dequantize(EM_TYPE_IQ1_S, blk, y, 256, NULL), 0);
    for (int j = 0; j < 32; j++) {
        assert_true(y[j] == -0.875f);
        assert_true(y[32 + j] == -3.375f);
    }

    /* IQ2_XXS: grid entry 0 is eight 8s; scale (0.5 + 0) / 4 -> 1.0. Sign index 1 completes
     * to 0x81 (odd parity): values 0 and 7 of the first group negative. */
    memset(blk, 0, sizeof blk);
    memcpy(blk, &one, 2);
    const uint32_t signs = 1u | 3u << 28; /* group 0 sign index 1; scale 3 -> 3.5/4 */
    memcpy(blk + 2 + 4, &signs, 4);
    assert_int_equal(em_dequantize(EM_TYPE_IQ2_XXS, blk, y, 256, NULL), 0);
    for (int j = 0; j < 8; j++) assert_true(y[j] == (j == 0 || j == 7 ? -7.0f : 7.0f));
    for (int j = 8; j < 32; j++) assert_true(y[j] == 7.0f);
    for (int j = 32; j < 256; j++) assert_true(y[j] == 1.0f);
}

static void test_convert_errors(void **state) {
    (void)state;
    float f[64] = { 0 };
    uint8_t q[256] = { 0 };
    em_err err = { 0 };
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, q, f, -32, &err), EM_EINVAL);
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, q, f, 48, &err), EM_EFORMAT);
    assert_non_null(strstr(err.msg, "dequantize"));
    assert_int_equal(em_dequantize(EM_TYPE_TQ1_0, q, f, 256, &err), EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "tq1_0"));
    assert_int_equal(em_quantize(EM_TYPE_IQ2_XXS, f, q, 256, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_dequantize(5, q, f, 32, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, NULL, f, 32, &err), EM_EINVAL);
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, q, NULL, 32, &err), EM_EINVAL);
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, NULL, NULL, 0, &err), EM_OK);
    assert_int_equal(em_quantize(EM_TYPE_Q8_1, f, q, 32, &err), EM_EUNSUPPORTED);
    assert_int_equal(em_quantize(EM_TYPE_I32, f, q, 32, NULL), EM_EUNSUPPORTED);
    assert_int_equal(em_quantize(EM_TYPE_Q4_0, f, q, 31, NULL), EM_EFORMAT);
    assert_int_equal(em_quantize(EM_TYPE_Q4_0, f, q, -1, NULL), EM_EINVAL);
    /* a count whose f32 size cannot exist */
    assert_int_equal(em_dequantize(EM_TYPE_F32, q, f, INT64_MAX, NULL), EM_EOVERFLOW);
}

/* ---- ggml's half conversions (what every block scale goes through) ------------------ */

static void test_half_semantics(void **state) {
    (void)state;
    /* ggml_quantize_chunk turns any NaN into 0x7e00 (sign kept) ... */
    assert_int_equal(em_fp32_to_fp16(NAN), 0x7e00);
    const uint32_t payload_nan = 0xffa12345u;
    float f;
    memcpy(&f, &payload_nan, 4);
    assert_int_equal(em_fp32_to_fp16(f), 0xfe00);
    /* ... and to_float returns a signalling half NaN quieted, payload kept */
    assert_int_equal(fbits(em_fp16_to_fp32(0x7c01)), 0x7fc02000u);
    assert_int_equal(fbits(em_fp16_to_fp32(0xfc00)), 0xff800000u);
    /* ties to even at the fp16 precision */
    assert_int_equal(em_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(em_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
}

/* ---- hand-built blocks --------------------------------------------------------------- */

static void test_known_q8_0(void **state) {
    (void)state;
    uint8_t blk[34];
    put16(blk, 0x3800); /* 0.5 */
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    float y[32];
    assert_int_equal(em_dequantize(EM_TYPE_Q8_0, blk, y, 32, NULL), EM_OK);
    for (int j = 0; j < 32; j++) assert_true(y[j] == (float)(j * 8 - 128) * 0.5f);

    /* integers with |max| = 127 quantize with d = 1 exactly */
    float x[64];
    for (int j = 0; j < 64; j++) x[j] = (float)((j * 37) % 255 - 127);
    x[5] = 127.0f;
    x[40] = -127.0f;
    uint8_t q[68];
    assert_int_equal(em_quantize(EM_TYPE_Q8_0, x, q, 64, NULL), EM_OK);
    for (int b = 0; b < 2; b++) {
        uint16_t d;
        memcpy(&d, q + 34 * b, 2);
        assert_int_equal(d, 0x3c00);
        for (int j = 0; j < 32; j++)
            assert_int_equal((int8_t)q[34 * b + 2 + j], (int)x[32 * b + j]);
    }
}

static void test_known_q4_0(void **state) {
    (void)state;
    uint8_t blk[18];
    put16(blk, 0x4000); /* 2.0 */
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    assert_int_equal(em_dequantize(EM_TYPE_Q4_0, blk, y, 32, NULL), EM_OK);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 2.0f * (float)(j - 8));
        assert_true(y[j + 16] == 2.0f * (float)(7 - j));
    }
    /* integers in [-8, 7] with -8 present: d = -8 / -8 = 1, code = value + 8 */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)((j * 5) % 16 - 8);
    uint8_t q[18];
    assert_int_equal(em_quantize(EM_TYPE_Q4_0, x, q, 32, NULL), EM_OK);
    uint16_t d;
    memcpy(&d, q, 2);
    assert_int_equal(d, 0x3c00);
    for (int j = 0; j < 16; j++) {
        assert_int_equal(q[2 + j] & 15, (int)x[j] + 8);
        assert_int_equal(q[2 + j] >> 4, (int)x[j + 16] + 8);
    }
}

/* Q4_K: 8 sub-blocks of 32, 6-bit scale sc and min m per sub-block, y = d*sc*q - dmin*m. */
static void test_known_q4_K(void **state) {
    (void)state;
    const int sc[8] = { 1, 2, 3, 4, 40, 50, 60, 63 }, m[8] = { 0, 5, 10, 63, 17, 33, 48, 62 };
    uint8_t blk[144] = { 0 };
    put16(blk, 0x3c00);     /* d = 1 */
    put16(blk + 2, 0x3800); /* dmin = 0.5 */
    uint8_t *s = blk + 4, *qs = blk + 16;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
    /* each 64 values use 32 bytes: low nibbles first, then high nibbles */
    int qv[256];
    for (int i = 0; i < 256; i++) qv[i] = (i * 7 + i / 32) % 16;
    for (int i = 0; i < 256; i++) {
        const int grp = i / 64, r = i % 64;
        qs[32 * grp + r % 32] |= (uint8_t)(qv[i] << (r < 32 ? 0 : 4));
    }
    float y[256];
    assert_int_equal(em_dequantize(EM_TYPE_Q4_K, blk, y, 256, NULL), EM_OK);
    for (int i = 0; i < 256; i++) {
        const int j = i / 32;
        assert_true(y[i] == (float)(sc[j] * qv[i]) - 0.5f * (float)m[j]);
    }
}

/* Q6_K: per 128 values, value 32k + l takes 4 low bits from ql[l + 32*(k%2)] (low nibble
 * for k < 2, high for k >= 2) and 2 high bits from qh[l] >> 2k; y = d*scale*(q - 32). */
static void test_known_q6_K(void **state) {
    (void)state;
    uint8_t blk[210] = { 0 };
    uint8_t *ql = blk, *qh = blk + 128;
    int8_t *scales = (int8_t *)(blk + 192);
    put16(blk + 208, 0x3400); /* 0.25 */
    for (int g = 0; g < 16; g++) scales[g] = (int8_t)(g % 2 ? -(g + 1) : 3 * g + 1);
    int qv[256];
    for (int i = 0; i < 256; i++) qv[i] = (i * 13 + 5) % 64;
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, k = (i % 128) / 32, l = i % 32;
        ql[64 * h + l + 32 * (k % 2)] |= (uint8_t)((qv[i] & 15) << (4 * (k / 2)));
        qh[32 * h + l] |= (uint8_t)((qv[i] >> 4) << (2 * k));
    }
    float y[256];
    assert_int_equal(em_dequantize(EM_TYPE_Q6_K, blk, y, 256, NULL), EM_OK);
    for (int i = 0; i < 256; i++)
        assert_true(y[i] == 0.25f * (float)(scales[i / 16] * (qv[i] - 32)));
}

static void test_known_mxfp4(void **state) {
    (void)state;
    static const float e2m1[16] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3,
                                    -4, -6 };
    uint8_t blk[3 * 17];
    const uint8_t exps[3] = { 127, 0, 1 }; /* 2^0, and the subnormal scales 2^-127, 2^-126 */
    for (int b = 0; b < 3; b++) {
        blk[17 * b] = exps[b];
        for (int j = 0; j < 16; j++) blk[17 * b + 1 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    float y[96];
    assert_int_equal(em_dequantize(EM_TYPE_MXFP4, blk, y, 96, NULL), EM_OK);
    for (int b = 0; b < 3; b++) {
        for (int j = 0; j < 16; j++) {
            assert_true(y[32 * b + j] == ldexpf(e2m1[j], exps[b] - 127));
            assert_true(y[32 * b + 16 + j] == ldexpf(e2m1[15 - j], exps[b] - 127));
        }
    }
    /* values on the E2M1 grid with max 6 encode exactly at scale 2^0 */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = e2m1[(j * 3) % 16];
    x[0] = 6.0f;
    uint8_t q[17];
    float back[32];
    assert_int_equal(em_quantize(EM_TYPE_MXFP4, x, q, 32, NULL), EM_OK);
    assert_int_equal(q[0], 127);
    assert_int_equal(em_dequantize(EM_TYPE_MXFP4, q, back, 32, NULL), EM_OK);
    for (int j = 0; j < 32; j++) assert_true(back[j] == x[j]);
}

/* Q8_K rounds ties to even (ggml's nearest_int), not away from zero like roundf. */
static void test_known_q8_K(void **state) {
    (void)state;
    float x[256] = { 0 };
    x[0] = -254.0f; /* scale: -127 / -254 = 0.5 per unit */
    x[1] = 1.0f;    /* 0.5 -> 0 */
    x[2] = 3.0f;    /* 1.5 -> 2 */
    x[3] = 5.0f;    /* 2.5 -> 2 */
    x[4] = -5.0f;   /* -2.5 -> -2 */
    x[20] = 100.0f; /* 50 */
    uint8_t q[292];
    assert_int_equal(em_quantize(EM_TYPE_Q8_K, x, q, 256, NULL), EM_OK);
    float d;
    memcpy(&d, q, 4);
    assert_true(d == 2.0f);
    const int8_t *qs = (const int8_t *)(q + 4);
    assert_int_equal(qs[0], -127);
    assert_int_equal(qs[1], 0);
    assert_int_equal(qs[2], 2);
    assert_int_equal(qs[3], 2);
    assert_int_equal(qs[4], -2);
    assert_int_equal(qs[20], 50);
    int16_t bsums[16];
    memcpy(bsums, q + 260, sizeof bsums);
    assert_int_equal(bsums[0], -127 + 0 + 2 + 2 - 2);
    assert_int_equal(bsums[1], 50);
    for (int g = 2; g < 16; g++) assert_int_equal(bsums[g], 0);
    /* an all-zero block: d, codes and sums all zero */
    memset(x, 0, sizeof x);
    memset(q, 0xAB, sizeof q);
    assert_int_equal(em_quantize(EM_TYPE_Q8_K, x, q, 256, NULL), EM_OK);
    for (int i = 0; i < 292; i++) assert_int_equal(q[i], 0);
}

static void test_known_plain(void **state) {
    (void)state;
    const int8_t i8[4] = { -128, -1, 0, 127 };
    const int16_t i16[2] = { -32768, 12345 };
    const int32_t i32[2] = { -7, 16777217 };
    const double f64[2] = { 0.1, -1e300 };
    float y[4];
    assert_int_equal(em_dequantize(EM_TYPE_I8, i8, y, 4, NULL), EM_OK);
    assert_true(y[0] == -128.0f && y[1] == -1.0f && y[2] == 0.0f && y[3] == 127.0f);
    assert_int_equal(em_dequantize(EM_TYPE_I16, i16, y, 2, NULL), EM_OK);
    assert_true(y[0] == -32768.0f && y[1] == 12345.0f);
    assert_int_equal(em_dequantize(EM_TYPE_I32, i32, y, 2, NULL), EM_OK);
    assert_true(y[0] == -7.0f && y[1] == 16777216.0f);
    assert_int_equal(em_dequantize(EM_TYPE_F64, f64, y, 2, NULL), EM_OK);
    assert_true(y[0] == 0.1f && isinf(y[1]) && y[1] < 0);
    const uint16_t bf[2] = { 0x3f80, 0xc040 };
    assert_int_equal(em_dequantize(EM_TYPE_BF16, bf, y, 2, NULL), EM_OK);
    assert_true(y[0] == 1.0f && y[1] == -3.0f);
    const uint16_t h[3] = { 0x3c00, 0xc200, 0x0001 };
    assert_int_equal(em_dequantize(EM_TYPE_F16, h, y, 3, NULL), EM_OK);
    assert_true(y[0] == 1.0f && y[1] == -3.0f && y[2] == 0x1p-24f);
}

/* ---- quantize -> dequantize on random data ------------------------------------------- */

typedef struct {
    int type;
    double max_rel_rmse; /* sqrt(sum err^2 / sum x^2) on Gaussian data */
} bound;

/* Bounds sit about 1.4x above what the formats reach on the test data (unit Gaussian with
 * an outlier of 25 every 4096 values); the outlier's blocks dominate the low-bit errors. */
static const bound bounds[] = {
    { EM_TYPE_F32, 0.0 },      { EM_TYPE_F16, 3e-4 },    { EM_TYPE_BF16, 2.5e-3 },
    { EM_TYPE_Q8_0, 0.01 },    { EM_TYPE_Q8_K, 0.02 },   { EM_TYPE_Q5_0, 0.075 },
    { EM_TYPE_Q5_1, 0.06 },    { EM_TYPE_Q4_0, 0.15 },   { EM_TYPE_Q4_1, 0.12 },
    { EM_TYPE_MXFP4, 0.17 },   { EM_TYPE_Q6_K, 0.03 },   { EM_TYPE_Q5_K, 0.055 },
    { EM_TYPE_Q4_K, 0.11 },    { EM_TYPE_Q3_K, 0.21 },   { EM_TYPE_Q2_K, 0.4 },
};

static float gauss(uint64_t *s) {
    double u1 = ((double)(em_test_rand(s) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(em_test_rand(s) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static double rel_rmse(const float *x, const float *y, int64_t n) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        ref += (double)x[i] * x[i];
    }
    return ref > 0 ? sqrt(err / ref) : sqrt(err);
}

static void test_roundtrip_error(void **state) {
    (void)state;
    enum { N = 16 * 1024 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(N * 4);
    double errs[sizeof bounds / sizeof bounds[0]];
    assert_true(x && y && q);
    uint64_t s = 42;
    for (int i = 0; i < N; i++) x[i] = gauss(&s) + (i % 4096 == 7 ? 25.0f : 0.0f);
    for (size_t t = 0; t < sizeof bounds / sizeof bounds[0]; t++) {
        em_err err = { 0 };
        assert_int_equal(em_quantize(bounds[t].type, x, q, N, &err), EM_OK);
        assert_int_equal(em_dequantize(bounds[t].type, q, y, N, &err), EM_OK);
        const double e = rel_rmse(x, y, N);
        errs[t] = e;
        if (!(e <= bounds[t].max_rel_rmse))
            fail_msg("%s: relative RMSE %g above %g", em_type_name(bounds[t].type), e,
                     bounds[t].max_rel_rmse);
        if (getenv("EMBER_QUANT_VERBOSE"))
            print_message("%-6s relative RMSE %.4g\n", em_type_name(bounds[t].type), e);
        /* scaling the input by a power of two scales the output exactly, for every format
         * whose scales stay normal fp16 numbers (F16 itself has subnormal values here) */
        if (bounds[t].type == EM_TYPE_F16) continue;
        for (int i = 0; i < N; i++) x[i] *= 4.0f;
        float *y4 = malloc(N * sizeof *y4);
        assert_non_null(y4);
        assert_int_equal(em_quantize(bounds[t].type, x, q, N, &err), EM_OK);
        assert_int_equal(em_dequantize(bounds[t].type, q, y4, N, &err), EM_OK);
        for (int i = 0; i < N; i++)
            if (y4[i] != 4.0f * y[i])
                fail_msg("%s: value %d: %g vs 4 * %g", em_type_name(bounds[t].type), i,
                         (double)y4[i], (double)y[i]);
        for (int i = 0; i < N; i++) x[i] *= 0.25f;
        free(y4);
    }
    /* more bits, less error: Q6_K < Q5_K < Q4_K < Q3_K < Q2_K (bounds[10..14]) */
    for (int t = 10; t < 14; t++) assert_true(errs[t] < errs[t + 1]);
    free(x);
    free(y);
    free(q);
}

/* Zero rows come back as zeros, and rows of one repeated value come back close to it. */
static void test_special_rows(void **state) {
    (void)state;
    enum { N = 512 };
    float x[N], y[N];
    uint8_t q[N * 4];
    for (size_t t = 0; t < sizeof bounds / sizeof bounds[0]; t++) {
        const int type = bounds[t].type;
        memset(x, 0, sizeof x);
        assert_int_equal(em_quantize(type, x, q, N, NULL), EM_OK);
        assert_int_equal(em_dequantize(type, q, y, N, NULL), EM_OK);
        for (int i = 0; i < N; i++)
            if (y[i] != 0.0f) fail_msg("%s: zero row gives %g", em_type_name(type), (double)y[i]);
        for (int i = 0; i < N; i++) x[i] = -0.375f;
        assert_int_equal(em_quantize(type, x, q, N, NULL), EM_OK);
        assert_int_equal(em_dequantize(type, q, y, N, NULL), EM_OK);
        for (int i = 0; i < N; i++)
            if (fabsf(y[i] - x[i]) > 0.02f)
                fail_msg("%s: constant row gives %g", em_type_name(type), (double)y[i]);
    }
}

/* Same input, same bytes: across calls, across buffer alignments, and whether a tensor is
 * converted in one call or row by row. */
static void test_determinism_alignment(void **state) {
    (void)state;
    enum { N = 2048, ROWS = 4 };
    float *x = malloc((N + 1) * sizeof *x), *y1 = malloc(N * sizeof *y1),
          *y2 = malloc(N * sizeof *y2);
    uint8_t *a = malloc(N * 4 + 8), *b = malloc(N * 4 + 8);
    assert_true(x && y1 && y2 && a && b);
    uint64_t s = 9;
    for (int i = 0; i < N; i++) x[i] = em_test_randf(&s) * (i % 3 ? 1.0f : 3.0f);
    for (size_t t = 0; t < sizeof bounds / sizeof bounds[0]; t++) {
        const int type = bounds[t].type;
        uint64_t row_bytes;
        assert_int_equal(em_type_row_bytes(type, N / ROWS, &row_bytes, NULL), EM_OK);
        assert_int_equal(em_quantize(type, x, a, N, NULL), EM_OK);
        memset(b, 0, N * 4 + 8);
        for (int r = 0; r < ROWS; r++)
            assert_int_equal(em_quantize(type, x + r * (N / ROWS), b + 1 + r * row_bytes,
                                         N / ROWS, NULL),
                             EM_OK);
        if (memcmp(a, b + 1, ROWS * row_bytes) != 0)
            fail_msg("%s: bytes depend on call split / alignment", em_type_name(type));
        assert_int_equal(em_dequantize(type, a, y1, N, NULL), EM_OK);
        assert_int_equal(em_dequantize(type, b + 1, y2, N, NULL), EM_OK);
        for (int i = 0; i < N; i++)
            if (fbits(y1[i]) != fbits(y2[i]))
                fail_msg("%s: dequantize depends on alignment", em_type_name(type));
        memmove(x + 1, x, N * sizeof *x); /* a misaligned copy of the same floats is fine */
        assert_int_equal(em_quantize(type, x + 1, b, N, NULL), EM_OK);
        memmove(x, x + 1, N * sizeof *x);
        if (memcmp(a, b, ROWS * row_bytes) != 0)
            fail_msg("%s: second call differs", em_type_name(type));
    }
    free(x);
    free(y1);
    free(y2);
    free(a);
    free(b);
}

/* Arbitrary bytes decode without crashing (and only NaN scales give NaN for Q8_0). */
static void test_random_bytes(void **state) {
    (void)state;
    enum { N = 4096 };
    uint8_t *q = malloc(N * 2);
    float *y = malloc(N * sizeof *y);
    assert_true(q && y);
    uint64_t s = 5;
    for (int i = 0; i < N * 2; i++) q[i] = (uint8_t)em_test_rand(&s);
    for (int t = 0; t < EM_TYPE_COUNT; t++) {
        const em_type_info *info = em_type_get(t);
        if (!info || !info->to_float) continue;
        uint64_t n = (uint64_t)(N * 2 / info->block_bytes) * (uint64_t)info->block_elems;
        if (n > N) n = N / (uint64_t)info->block_elems * (uint64_t)info->block_elems;
        assert_int_equal(em_dequantize(t, q, y, (int64_t)n, NULL), EM_OK);
    }
    free(q);
    free(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_table),
        cmocka_unit_test(test_row_bytes),
        cmocka_unit_test(test_iq_known_values),
        cmocka_unit_test(test_convert_errors),
        cmocka_unit_test(test_half_semantics),
        cmocka_unit_test(test_known_q8_0),
        cmocka_unit_test(test_known_q4_0),
        cmocka_unit_test(test_known_q4_K),
        cmocka_unit_test(test_known_q6_K),
        cmocka_unit_test(test_known_mxfp4),
        cmocka_unit_test(test_known_q8_K),
        cmocka_unit_test(test_known_plain),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_special_rows),
        cmocka_unit_test(test_determinism_alignment),
        cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

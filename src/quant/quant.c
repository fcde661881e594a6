/* quant/quant.c: the type table (ggml's type ids, names, block geometry, converters) and the
 * checked entry points em_dequantize / em_quantize that dispatch through it.
 *
 * Invariants: the table is constant; a type is "known" iff it has a name; block sizes equal
 * ggml's (checked against blocks.h sizes here and against the ggml library by
 * tests/compat/quant_vs_ggml.c). Converters are only called with a block-multiple n. */
#include "quant/quant.h"

#include <strings.h>

#include "quant/convert.h"

#define PLAIN(nm, bytes, to, from) { nm, 1, bytes, to, from }
#define BLOCK(nm, elems, type, to, from) { nm, elems, (int)sizeof(type), to, from }

static const em_type_info types[EM_TYPE_COUNT] = {
    [EM_TYPE_F32] = PLAIN("f32", 4, em_dequant_f32, em_quant_f32),
    [EM_TYPE_F16] = PLAIN("f16", 2, em_dequant_f16, em_quant_f16),
    [EM_TYPE_BF16] = PLAIN("bf16", 2, em_dequant_bf16, em_quant_bf16),
    [EM_TYPE_F64] = PLAIN("f64", 8, em_dequant_f64, NULL),
    [EM_TYPE_I8] = PLAIN("i8", 1, em_dequant_i8, NULL),
    [EM_TYPE_I16] = PLAIN("i16", 2, em_dequant_i16, NULL),
    [EM_TYPE_I32] = PLAIN("i32", 4, em_dequant_i32, NULL),
    [EM_TYPE_I64] = PLAIN("i64", 8, em_dequant_i64, NULL),
    [EM_TYPE_Q4_0] = BLOCK("q4_0", QK4_0, em_block_q4_0, em_dequant_q4_0, em_quant_q4_0),
    [EM_TYPE_Q4_1] = BLOCK("q4_1", QK4_1, em_block_q4_1, em_dequant_q4_1, em_quant_q4_1),
    [EM_TYPE_Q5_0] = BLOCK("q5_0", QK5_0, em_block_q5_0, em_dequant_q5_0, em_quant_q5_0),
    [EM_TYPE_Q5_1] = BLOCK("q5_1", QK5_1, em_block_q5_1, em_dequant_q5_1, em_quant_q5_1),
    [EM_TYPE_Q8_0] = BLOCK("q8_0", QK8_0, em_block_q8_0, em_dequant_q8_0, em_quant_q8_0),
    [EM_TYPE_Q8_1] = BLOCK("q8_1", QK8_1, em_block_q8_1, NULL, NULL),
    [EM_TYPE_MXFP4] = BLOCK("mxfp4", QK_MXFP4, em_block_mxfp4, em_dequant_mxfp4, em_quant_mxfp4),
    [EM_TYPE_Q2_K] = BLOCK("q2_K", EM_QK_K, em_block_q2_K, em_dequant_q2_K, em_quant_q2_K),
    [EM_TYPE_Q3_K] = BLOCK("q3_K", EM_QK_K, em_block_q3_K, em_dequant_q3_K, em_quant_q3_K),
    [EM_TYPE_Q4_K] = BLOCK("q4_K", EM_QK_K, em_block_q4_K, em_dequant_q4_K, em_quant_q4_K),
    [EM_TYPE_Q5_K] = BLOCK("q5_K", EM_QK_K, em_block_q5_K, em_dequant_q5_K, em_quant_q5_K),
    [EM_TYPE_Q6_K] = BLOCK("q6_K", EM_QK_K, em_block_q6_K, em_dequant_q6_K, em_quant_q6_K),
    [EM_TYPE_Q8_K] = BLOCK("q8_K", EM_QK_K, em_block_q8_K, em_dequant_q8_K, em_quant_q8_K),
    /* IQ formats: read only (their quantizers need ggml's importance-matrix search). */
    [EM_TYPE_IQ2_XXS] = BLOCK("iq2_xxs", EM_QK_K, em_block_iq2_xxs, em_dequant_iq2_xxs, NULL),
    [EM_TYPE_IQ2_XS] = BLOCK("iq2_xs", EM_QK_K, em_block_iq2_xs, em_dequant_iq2_xs, NULL),
    [EM_TYPE_IQ2_S] = BLOCK("iq2_s", EM_QK_K, em_block_iq2_s, em_dequant_iq2_s, NULL),
    [EM_TYPE_IQ3_XXS] = BLOCK("iq3_xxs", EM_QK_K, em_block_iq3_xxs, em_dequant_iq3_xxs, NULL),
    [EM_TYPE_IQ3_S] = BLOCK("iq3_s", EM_QK_K, em_block_iq3_s, em_dequant_iq3_s, NULL),
    [EM_TYPE_IQ1_S] = BLOCK("iq1_s", EM_QK_K, em_block_iq1_s, em_dequant_iq1_s, NULL),
    [EM_TYPE_IQ1_M] = BLOCK("iq1_m", EM_QK_K, em_block_iq1_m, em_dequant_iq1_m, NULL),
    [EM_TYPE_IQ4_NL] = BLOCK("iq4_nl", QK4_NL, em_block_iq4_nl, em_dequant_iq4_nl, NULL),
    [EM_TYPE_IQ4_XS] = BLOCK("iq4_xs", EM_QK_K, em_block_iq4_xs, em_dequant_iq4_xs, NULL),
    /* ternary: d fp16 + packed trits (tq1_0: 48 + 4 bytes base-3, tq2_0: 64 bytes 2-bit) */
    [EM_TYPE_TQ1_0] = { "tq1_0", EM_QK_K, 54, NULL, NULL },
    [EM_TYPE_TQ2_0] = { "tq2_0", EM_QK_K, 66, NULL, NULL },
    /* nvfp4: 4 UE4M3 scales + 32 bytes of E2M1; q1_0: fp16 + 128 sign bits; q2_0: fp16 +
     * 64 2-bit codes */
    [EM_TYPE_NVFP4] = { "nvfp4", 64, 36, NULL, NULL },
    [EM_TYPE_Q1_0] = { "q1_0", 128, 18, NULL, NULL },
    [EM_TYPE_Q2_0] = { "q2_0", 64, 18, NULL, NULL },
};

const em_type_info *em_type_get(int type) {
    if (type < 0 || type >= EM_TYPE_COUNT || !types[type].name) return NULL;
    return &types[type];
}

const char *em_type_name(int type) {
    const em_type_info *t = em_type_get(type);
    return t ? t->name : "unknown";
}

int em_type_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < EM_TYPE_COUNT; i++)
        if (types[i].name && strcasecmp(types[i].name, name) == 0) return i;
    return -1;
}

int em_type_row_bytes(int type, uint64_t n, uint64_t *bytes, em_err *err) {
    const em_type_info *t = em_type_get(type);
    if (!t) return em_err_set(err, EM_EUNSUPPORTED, "unknown tensor type %d", type);
    if (n % (uint64_t)t->block_elems != 0)
        return em_err_set(err, EM_EFORMAT,
                          "row of %llu values is not a multiple of the %s block size %d",
                          (unsigned long long)n, t->name, t->block_elems);
    if (em_mul_overflow(n / (uint64_t)t->block_elems, (uint64_t)t->block_bytes, bytes))
        return em_err_set(err, EM_EOVERFLOW, "row of %llu %s values: byte size overflows",
                          (unsigned long long)n, t->name);
    return EM_OK;
}

/* Common checks of em_dequantize / em_quantize; the byte size must fit in size_t. */
static int check_convert(const em_type_info *t, int type, bool have_fn, const void *src,
                         const void *dst, int64_t n, const char *what, em_err *err) {
    if (!t) return em_err_set(err, EM_EUNSUPPORTED, "%s: unknown tensor type %d", what, type);
    if (!have_fn)
        return em_err_set(err, EM_EUNSUPPORTED, "%s: type %s is not supported", what, t->name);
    if (n < 0) return em_err_set(err, EM_EINVAL, "%s: negative count %lld", what, (long long)n);
    if (n > 0 && (!src || !dst))
        return em_err_set(err, EM_EINVAL, "%s: NULL buffer for %lld values", what, (long long)n);
    uint64_t bytes;
    int rc = em_type_row_bytes(type, (uint64_t)n, &bytes, err);
    if (rc != EM_OK) {
        em_err_prefix(err, "%s", what);
        return rc;
    }
    uint64_t fbytes;
    if (bytes > SIZE_MAX || em_mul_overflow((uint64_t)n, sizeof(float), &fbytes) ||
        fbytes > SIZE_MAX)
        return em_err_set(err, EM_EOVERFLOW, "%s: %lld values do not fit in memory", what,
                          (long long)n);
    return EM_OK;
}

int em_dequantize(int type, const void *src, float *dst, int64_t n, em_err *err) {
    const em_type_info *t = em_type_get(type);
    int rc = check_convert(t, type, t && t->to_float, src, dst, n, "dequantize", err);
    if (rc != EM_OK) return rc;
    if (n > 0) t->to_float(src, dst, n);
    return EM_OK;
}

int em_quantize(int type, const float *src, void *dst, int64_t n, em_err *err) {
    const em_type_info *t = em_type_get(type);
    int rc = check_convert(t, type, t && t->from_float, src, dst, n, "quantize", err);
    if (rc != EM_OK) return rc;
    if (n > 0) t->from_float(src, dst, n);
    return EM_OK;
}

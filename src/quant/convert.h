/* Internal to quant/: the per-type row converters behind the type table in quant.c.
 * Each converts n values (n a multiple of the type's block size, already checked by the
 * caller) between f32 and the packed layout of blocks.h, with results bit-identical to
 * ggml's to_float / reference quantizers (see dequant.c, dequant_iq.c, quantize.c, quantize_k.c). */
#ifndef EM_QUANT_CONVERT_H
#define EM_QUANT_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/quant.h"

/* ---- to f32 (dequant.c) ---- */
void em_dequant_f32(const void *src, float *dst, int64_t n);
void em_dequant_f16(const void *src, float *dst, int64_t n);
void em_dequant_bf16(const void *src, float *dst, int64_t n);
void em_dequant_f64(const void *src, float *dst, int64_t n);
void em_dequant_i8(const void *src, float *dst, int64_t n);
void em_dequant_i16(const void *src, float *dst, int64_t n);
void em_dequant_i32(const void *src, float *dst, int64_t n);
void em_dequant_i64(const void *src, float *dst, int64_t n);
void em_dequant_q4_0(const void *src, float *dst, int64_t n);
void em_dequant_q4_1(const void *src, float *dst, int64_t n);
void em_dequant_q5_0(const void *src, float *dst, int64_t n);
void em_dequant_q5_1(const void *src, float *dst, int64_t n);
void em_dequant_q8_0(const void *src, float *dst, int64_t n);
void em_dequant_mxfp4(const void *src, float *dst, int64_t n);
void em_dequant_q2_K(const void *src, float *dst, int64_t n);
void em_dequant_q3_K(const void *src, float *dst, int64_t n);
void em_dequant_q4_K(const void *src, float *dst, int64_t n);
void em_dequant_q5_K(const void *src, float *dst, int64_t n);
void em_dequant_q6_K(const void *src, float *dst, int64_t n);
void em_dequant_q8_K(const void *src, float *dst, int64_t n);
/* IQ formats (dequant_iq.c) */
void em_dequant_iq2_xxs(const void *src, float *dst, int64_t n);
void em_dequant_iq2_xs(const void *src, float *dst, int64_t n);
void em_dequant_iq2_s(const void *src, float *dst, int64_t n);
void em_dequant_iq3_xxs(const void *src, float *dst, int64_t n);
void em_dequant_iq3_s(const void *src, float *dst, int64_t n);
void em_dequant_iq1_s(const void *src, float *dst, int64_t n);
void em_dequant_iq1_m(const void *src, float *dst, int64_t n);
void em_dequant_iq4_nl(const void *src, float *dst, int64_t n);
void em_dequant_iq4_xs(const void *src, float *dst, int64_t n);

/* ---- from f32 (quantize.c: plain and 32-value blocks; quantize_k.c: 256-value blocks) ---- */
void em_quant_f32(const float *src, void *dst, int64_t n);
void em_quant_f16(const float *src, void *dst, int64_t n);
void em_quant_bf16(const float *src, void *dst, int64_t n);
void em_quant_q4_0(const float *src, void *dst, int64_t n);
void em_quant_q4_1(const float *src, void *dst, int64_t n);
void em_quant_q5_0(const float *src, void *dst, int64_t n);
void em_quant_q5_1(const float *src, void *dst, int64_t n);
void em_quant_q8_0(const float *src, void *dst, int64_t n);
void em_quant_mxfp4(const float *src, void *dst, int64_t n);
void em_quant_q2_K(const float *src, void *dst, int64_t n);
void em_quant_q3_K(const float *src, void *dst, int64_t n);
void em_quant_q4_K(const float *src, void *dst, int64_t n);
void em_quant_q5_K(const float *src, void *dst, int64_t n);
void em_quant_q6_K(const float *src, void *dst, int64_t n);
void em_quant_q8_K(const float *src, void *dst, int64_t n);

/* ---- shared numeric helpers (both directions must agree with ggml bit for bit) ---- */

/* MXFP4 code points: E2M1 values doubled (so the shared scale is halved). */
extern const int8_t em_mxfp4_values[16];

/* 2^(e-127) / 2 for an E8M0 exponent byte; e < 2 gives the fp32 subnormals 2^-128, 2^-127. */
static inline float em_e8m0_half_to_fp32(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest, ties to even, by the 1.5 * 2^23 magic-number trick ggml uses. Exact for
 * |x| < 2^22; larger or non-finite inputs give a defined but meaningless value (never UB). */
static inline int em_round_int(float x) {
    float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* C's float-to-int truncation as x86 performs it (cvttss2si): in-range values truncate
 * toward zero; NaN and out-of-range values give INT32_MIN. ggml's reference quantizers cast
 * floats straight to small integer types, so this reproduces their results without the
 * undefined behaviour of an out-of-range cast. */
static inline int32_t em_trunc_int(float x) {
    if (!(x > -2147483904.0f && x < 2147483648.0f)) return INT32_MIN;
    return (int32_t)x;
}

#endif

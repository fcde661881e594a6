/* quant/quantize.c: f32 -> plain types and the 32-value block formats (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, MXFP4), the reference algorithms of ggml without an importance matrix.
 *
 * Invariant: for finite input the bytes are identical to ggml_quantize_chunk's. That needs
 * the same float operations in the same order (no FMA contraction), ggml's fp16 rounding,
 * and ggml's float-to-small-int casts, reproduced by em_trunc_int so that NaN or infinite
 * input gives the same bytes as ggml on x86 instead of undefined behaviour. Blocks are
 * built in aligned locals and copied out: dst may sit at any address. */
#include "quant/convert.h"

#include <float.h>

#include "base/base.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- plain element types ---------------------------------------------------------- */

void em_quant_f32(const float *src, void *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void em_quant_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = em_fp32_to_fp16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

void em_quant_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = em_fp32_to_bf16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* ---- symmetric 32-value blocks ---------------------------------------------------- */

/* The value of largest magnitude (the first one on ties), sign kept. The scale is derived
 * from it so that it maps exactly onto the most negative code. */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* The 32 codes of a 4-bit block: code j in the low nibble of byte j, code j + 16 in its high
 * nibble. Codes are not masked: like ggml, an out-of-range code (non-finite input) spills
 * into the high nibble. */
static void pack_q4(const uint8_t q[32], uint8_t qs[16]) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

/* The 32 codes of a 5-bit block: low 4 bits as in pack_q4 (masked), bit 4 of code j at bit j
 * of the little-endian qh word. */
static void pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    memcpy(qh, &h, 4);
}

void em_quant_q4_0(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0, out += sizeof(em_block_q4_0)) {
        em_block_q4_0 b;
        const float d = signed_absmax(src, QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK4_0];
        b.d = em_fp32_to_fp16(d);
        /* truncation of x/d + 8.5 is rounding to nearest with ties up, in [0, 16] */
        for (int j = 0; j < QK4_0; j++)
            q[j] = (uint8_t)min_int(15, (int8_t)em_trunc_int(src[j] * id + 8.5f));
        pack_q4(q, b.qs);
        memcpy(out, &b, sizeof b);
    }
}

void em_quant_q5_0(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0, out += sizeof(em_block_q5_0)) {
        em_block_q5_0 b;
        const float d = signed_absmax(src, QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK5_0];
        b.d = em_fp32_to_fp16(d);
        for (int j = 0; j < QK5_0; j++)
            q[j] = (uint8_t)min_int(31, (int8_t)em_trunc_int(src[j] * id + 16.5f));
        pack_q5(q, b.qs, b.qh);
        memcpy(out, &b, sizeof b);
    }
}

void em_quant_q8_0(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0, out += sizeof(em_block_q8_0)) {
        em_block_q8_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            const float a = fabsf(src[j]);
            amax = amax > a ? amax : a; /* NaN is kept only when it comes last, as in ggml */
        }
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = em_fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) b.qs[j] = (int8_t)em_trunc_int(roundf(src[j] * id));
        memcpy(out, &b, sizeof b);
    }
}

/* ---- 32-value blocks with a minimum ------------------------------------------------ */

static void min_max(const float *x, int n, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

void em_quant_q4_1(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1, out += sizeof(em_block_q4_1)) {
        em_block_q4_1 b;
        float min, max;
        min_max(src, QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = em_fp32_to_fp16(d);
        b.m = em_fp32_to_fp16(min);
        uint8_t q[QK4_1];
        for (int j = 0; j < QK4_1; j++)
            q[j] = (uint8_t)min_int(15, (int8_t)em_trunc_int((src[j] - min) * id + 0.5f));
        pack_q4(q, b.qs);
        memcpy(out, &b, sizeof b);
    }
}

void em_quant_q5_1(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1, out += sizeof(em_block_q5_1)) {
        em_block_q5_1 b;
        float min, max;
        min_max(src, QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t q[QK5_1];
        b.d = em_fp32_to_fp16(d);
        b.m = em_fp32_to_fp16(min);
        /* no clamp here in ggml: (x - min) / d + 0.5 stays below 32 for finite x */
        for (int j = 0; j < QK5_1; j++) q[j] = (uint8_t)em_trunc_int((src[j] - min) * id + 0.5f);
        pack_q5(q, b.qs, b.qh);
        memcpy(out, &b, sizeof b);
    }
}

/* ---- MXFP4: shared power-of-two scale, E2M1 codes by exhaustive nearest search ---- */

static uint8_t mxfp4_nearest(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)em_mxfp4_values[0] * d - x);
    for (int k = 1; k < 16; k++) {
        const float err = fabsf((float)em_mxfp4_values[k] * d - x);
        if (err < best_err) {
            best = k;
            best_err = err;
        }
    }
    return (uint8_t)best;
}

void em_quant_mxfp4(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, src += QK_MXFP4, out += sizeof(em_block_mxfp4)) {
        em_block_mxfp4 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(src[j])) amax = fabsf(src[j]);
        /* the largest code is 6 (12 doubled): scale 2^(floor(log2 amax) - 2) */
        b.e = amax > 0.0f ? (uint8_t)em_trunc_int(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = em_e8m0_half_to_fp32(b.e);
        uint8_t q[QK_MXFP4];
        for (int j = 0; j < QK_MXFP4; j++) q[j] = mxfp4_nearest(src[j], d);
        pack_q4(q, b.qs);
        memcpy(out, &b, sizeof b);
    }
}

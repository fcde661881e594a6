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

void em_quant_q4_0(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0, out += sizeof(em_block_q4_0)) {
        em_block_q4_0 b;
        const float d = signed_absmax(src, QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b.d = em_fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            /* truncation of x/d + 8.5 is rounding to nearest with ties up, in [0, 16] */
            const int lo = min_int(15, (int8_t)em_trunc_int(src[j] * id + 8.5f));
            const int hi = min_int(15, (int8_t)em_trunc_int(src[j + QK4_0 / 2] * id + 8.5f));
            b.qs[j] = (uint8_t)((uint8_t)lo | (uint8_t)hi << 4);
        }
        memcpy(out, &b, sizeof b);
    }
}

void em_quant_q5_0(const float *src, void *dst, int64_t n) {
    uint8_t *out = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0, out += sizeof(em_block_q5_0)) {
        em_block_q5_0 b;
        const float d = signed_absmax(src, QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        b.d = em_fp32_to_fp16(d);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const uint8_t lo = (uint8_t)min_int(31, (int8_t)em_trunc_int(src[j] * id + 16.5f));
            const uint8_t hi =
                (uint8_t)min_int(31, (int8_t)em_trunc_int(src[j + QK5_0 / 2] * id + 16.5f));
            b.qs[j] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            qh |= (uint32_t)((lo >> 4) & 1) << j;
            qh |= (uint32_t)((hi >> 4) & 1) << (j + QK5_0 / 2);
        }
        memcpy(b.qh, &qh, 4);
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
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int lo = min_int(15, (int8_t)em_trunc_int((src[j] - min) * id + 0.5f));
            const int hi =
                min_int(15, (int8_t)em_trunc_int((src[j + QK4_1 / 2] - min) * id + 0.5f));
            b.qs[j] = (uint8_t)((uint8_t)lo | (uint8_t)hi << 4);
        }
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
        uint32_t qh = 0;
        b.d = em_fp32_to_fp16(d);
        b.m = em_fp32_to_fp16(min);
        for (int j = 0; j < QK5_1 / 2; j++) {
            /* no clamp here in ggml: (x - min) / d + 0.5 stays below 32 for finite x */
            const uint8_t lo = (uint8_t)em_trunc_int((src[j] - min) * id + 0.5f);
            const uint8_t hi = (uint8_t)em_trunc_int((src[j + QK5_1 / 2] - min) * id + 0.5f);
            b.qs[j] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            qh |= (uint32_t)((lo >> 4) & 1) << j;
            qh |= (uint32_t)((hi >> 4) & 1) << (j + QK5_1 / 2);
        }
        memcpy(b.qh, &qh, 4);
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
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            b.qs[j] = (uint8_t)(mxfp4_nearest(src[j], d) |
                                mxfp4_nearest(src[j + QK_MXFP4 / 2], d) << 4);
        }
        memcpy(out, &b, sizeof b);
    }
}

/* quant/dequant.c: every block format's conversion to f32, scalar.
 *
 * Invariant: the output is bit-identical to ggml's to_float for the same bytes, for any bytes
 * (finite or not). That pins down more than the formulas: each value is computed with the
 * same float operations in the same order as ggml, and nothing may be fused into an FMA
 * (Q4_K's (d*sc)*q - dmin*m rounds differently as one fma). Every byte pattern is a valid
 * input, so there is nothing to check here; n is a multiple of the block size (caller).
 * Source bytes may sit at any address (a GGUF may use 1-byte alignment), so each block is
 * copied into an aligned local before its fields are read. */
#include "quant/convert.h"

#include "base/base.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t em_mxfp4_values[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* ---- plain element types ---------------------------------------------------------- */

void em_dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* One plain element type: load each element of type T from a possibly unaligned address
 * and convert it with TO_F32. */
#define EM_DEQUANT_PLAIN(name, T, TO_F32)                                       \
    void em_dequant_##name(const void *src, float *dst, int64_t n) {            \
        const uint8_t *p = src;                                                 \
        for (int64_t i = 0; i < n; i++) {                                       \
            T v;                                                                \
            memcpy(&v, p + sizeof v * (size_t)i, sizeof v);                     \
            dst[i] = TO_F32(v);                                                 \
        }                                                                       \
    }

#define EM_AS_F32(v) ((float)(v))

EM_DEQUANT_PLAIN(f16, uint16_t, em_fp16_to_fp32)
EM_DEQUANT_PLAIN(bf16, uint16_t, em_bf16_to_fp32)

/* The integer and f64 types have no to_float in ggml; these are plain C conversions
 * (f64 rounds to nearest, large integers round to the nearest float). i64 (llama.cpp's d2t
 * token maps) is exact for |v| < 2^24, which covers token ids. */
EM_DEQUANT_PLAIN(f64, double, EM_AS_F32)
EM_DEQUANT_PLAIN(i8, int8_t, EM_AS_F32)
EM_DEQUANT_PLAIN(i16, int16_t, EM_AS_F32)
EM_DEQUANT_PLAIN(i32, int32_t, EM_AS_F32)
EM_DEQUANT_PLAIN(i64, int64_t, EM_AS_F32)

#undef EM_AS_F32
#undef EM_DEQUANT_PLAIN

/* ---- 32-value blocks: value j of the first half sits in the low nibble of byte j, value
 * j + 16 in its high nibble ---------------------------------------------------------- */

void em_dequant_q4_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_0; i++, p += sizeof(em_block_q4_0), dst += QK4_0) {
        em_block_q4_0 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = (float)((b->qs[j] & 0x0F) - 8) * d;
            dst[j + QK4_0 / 2] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}

void em_dequant_q4_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_1; i++, p += sizeof(em_block_q4_1), dst += QK4_1) {
        em_block_q4_1 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        const float m = em_fp16_to_fp32(b->m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = (float)(b->qs[j] & 0x0F) * d + m;
            dst[j + QK4_1 / 2] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}

/* Q5: the fifth bit of value j is bit j of the little-endian 32-bit qh. */
static inline int q5_value(const uint8_t *qs, uint32_t qh, int j) {
    const int half = j / 16, k = j % 16;
    const int low = half ? qs[k] >> 4 : qs[k] & 0x0F;
    return low | (int)((qh >> j) & 1) << 4;
}

void em_dequant_q5_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK5_0; i++, p += sizeof(em_block_q5_0), dst += QK5_0) {
        em_block_q5_0 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < QK5_0; j++) dst[j] = (float)(q5_value(b->qs, qh, j) - 16) * d;
    }
}

void em_dequant_q5_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK5_1; i++, p += sizeof(em_block_q5_1), dst += QK5_1) {
        em_block_q5_1 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        const float m = em_fp16_to_fp32(b->m);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        for (int j = 0; j < QK5_1; j++) dst[j] = (float)q5_value(b->qs, qh, j) * d + m;
    }
}

void em_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK8_0; i++, p += sizeof(em_block_q8_0), dst += QK8_0) {
        em_block_q8_0 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        for (int j = 0; j < QK8_0; j++) dst[j] = (float)b->qs[j] * d;
    }
}

void em_dequant_mxfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, p += sizeof(em_block_mxfp4), dst += QK_MXFP4) {
        em_block_mxfp4 blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_e8m0_half_to_fp32(b->e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            dst[j] = (float)em_mxfp4_values[b->qs[j] & 0x0F] * d;
            dst[j + QK_MXFP4 / 2] = (float)em_mxfp4_values[b->qs[j] >> 4] * d;
        }
    }
}

/* ---- 256-value super-blocks ------------------------------------------------------- */

/* Q2_K: 16 groups of 16, each with a 4-bit scale (low nibble) and 4-bit min (high nibble).
 * Each 128 values use 32 qs bytes: the 2-bit fields at shift 0, 2, 4, 6 hold values
 * [0,32), [32,64), [64,96), [96,128) of that half; group g covers 16 of those bytes. */
void em_dequant_q2_K(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_q2_K)) {
        em_block_q2_K blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        const float dmin = em_fp16_to_fp32(b->dmin);
        for (int g = 0; g < 16; g++) {
            const uint8_t *q = b->qs + 32 * (g / 8) + 16 * (g % 2);
            const int shift = 2 * ((g % 8) / 2);
            const float dl = d * (float)(b->scales[g] & 0xF);
            const float ml = dmin * (float)(b->scales[g] >> 4);
            for (int l = 0; l < 16; l++) *dst++ = dl * (float)((q[l] >> shift) & 3) - ml;
        }
    }
}

/* Q3_K's 16 signed 6-bit scales: low 4 bits in scales[0..7] (nibbles), high 2 bits packed
 * four to a byte in scales[8..11]; stored with a bias of 32. */
static int q3_K_scale(const uint8_t *sc, int g) {
    const int low = g < 8 ? sc[g] & 0xF : sc[g - 8] >> 4;
    const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (low | high << 4) - 32;
}

/* Q3_K: 2 low bits as in Q2_K, the third bit in hmask (bit g/2 of byte l picks value
 * 32 * (g/2) + l within each half); a clear bit subtracts 4. */
void em_dequant_q3_K(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_q3_K)) {
        em_block_q3_K blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        for (int g = 0; g < 16; g++) {
            const int off = 16 * (g % 2);
            const uint8_t *q = b->qs + 32 * (g / 8) + off;
            const uint8_t *hm = b->hmask + off;
            const int shift = 2 * ((g % 8) / 2);
            const uint8_t mbit = (uint8_t)(1u << (g / 2));
            const float dl = d * (float)q3_K_scale(b->scales, g);
            for (int l = 0; l < 16; l++) {
                const int v = ((q[l] >> shift) & 3) - ((hm[l] & mbit) ? 0 : 4);
                *dst++ = dl * (float)v;
            }
        }
    }
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scale and min packed in 12 bytes. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Code l (0..31) of sub-block j: nibble j%2 of qs[32*(j/2) + l]; Q5_K adds bit j of qh[l]
 * as its fifth bit. */
static inline int q4_K_code(const em_block_q4_K *b, int j, int l) {
    return (b->qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
}

static inline int q5_K_code(const em_block_q5_K *b, int j, int l) {
    return ((b->qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) + (((b->qh[l] >> j) & 1) ? 16 : 0);
}

/* y = (d * sc) * q - dmin * m, per sub-block of 32. */
#define EM_DEQUANT_K4(fmt)                                                                  \
    void em_dequant_##fmt(const void *src, float *dst, int64_t n) {                         \
        const uint8_t *p = src;                                                             \
        for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_##fmt)) {            \
            em_block_##fmt blk, *b = &blk;                                                  \
            memcpy(b, p, sizeof blk);                                                       \
            const float d = em_fp16_to_fp32(b->d);                                          \
            const float dmin = em_fp16_to_fp32(b->dmin);                                    \
            for (int j = 0; j < 8; j++) {                                                   \
                int sc, m;                                                                  \
                k4_scale_min(b->scales, j, &sc, &m);                                        \
                const float dl = d * (float)sc, ml = dmin * (float)m;                       \
                for (int l = 0; l < 32; l++) *dst++ = dl * (float)fmt##_code(b, j, l) - ml; \
            }                                                                               \
        }                                                                                   \
    }

EM_DEQUANT_K4(q4_K)
EM_DEQUANT_K4(q5_K)

#undef EM_DEQUANT_K4

/* Q6_K: per 128 values, ql[64] and qh[32]. Value 32*k + l (k = 0..3, l = 0..31) takes
 * its low nibble from ql[l + 32*(k%2)] (low nibble for k < 2, high for k >= 2) and its two
 * high bits from qh[l] >> 2k; int8 scale per 16 values. y = (d * scale) * (q - 32). */
void em_dequant_q6_K(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_q6_K)) {
        em_block_q6_K blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        const float d = em_fp16_to_fp32(b->d);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b->ql + 64 * h;
            const uint8_t *qh = b->qh + 32 * h;
            const int8_t *sc = b->scales + 8 * h;
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) {
                    const int low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0xF;
                    const int q = (low | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
                    dst[32 * k + l] = d * (float)sc[2 * k + l / 16] * (float)q;
                }
            }
            dst += 128;
        }
    }
}

void em_dequant_q8_K(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_q8_K)) {
        em_block_q8_K blk, *b = &blk;
        memcpy(b, p, sizeof blk);
        for (int j = 0; j < EM_QK_K; j++) *dst++ = b->d * (float)b->qs[j];
    }
}

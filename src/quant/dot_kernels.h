/* Internal to quant/: the per-ISA tables of dot-product kernels behind em_dot_kernel()
 * (dot.c). Each table is indexed by weight type id; a NULL entry means "no kernel at this
 * ISA", and dispatch then falls back to the next lower ISA. The tables are constant data:
 * dispatch never writes them.
 *
 * Kernel contract (em_dot_fn): w holds n values of the weight type as consecutive blocks,
 * act holds n values of em_dot_act_type(weight type); n >= 0 and a multiple of both block
 * sizes (the callers check); pointers are aligned to their block structs. Integer quants
 * of the Q8 activation types are expected in [-127, 127], as the quantizers write them: a
 * -128 multiplied by a negative int8 weight can saturate in the SIMD kernels. Q8_K bsums
 * must be the sums of their 16 quants (as em_quantize writes them); SIMD kernels use them. */
#ifndef EM_QUANT_DOT_KERNELS_H
#define EM_QUANT_DOT_KERNELS_H

#include <string.h>

#include "quant/blocks.h"
#include "quant/quant.h"

/* Defined in dot_avx2.c (compiled with -mavx2 -mfma -mf16c). */
extern const em_dot_fn em_dot_kernels_avx2[EM_TYPE_COUNT];
/* Defined in dot_avx512.c (compiled with AVX-512 F/BW/VL/DQ/VNNI). */
extern const em_dot_fn em_dot_kernels_avx512[EM_TYPE_COUNT];

/* Scalar IQ kernels (dot_iq.c), entries of dot.c's scalar table. */
#define EM_DOT_IQ_SCALAR(X) X(iq2_xxs) X(iq2_xs) X(iq2_s) X(iq3_xxs) X(iq3_s) X(iq1_s) X(iq1_m) X(iq4_nl) X(iq4_xs)
#define EM_DOT_DECLARE_SCALAR(t) float em_dot_##t##_scalar(const void *w, const void *act, int64_t n);
EM_DOT_IQ_SCALAR(EM_DOT_DECLARE_SCALAR)
#undef EM_DOT_DECLARE_SCALAR
/* AVX2 IQ kernels (dot_iq_avx2.c), entries of em_dot_kernels_avx2: every IQ type. */
#define EM_DOT_DECLARE_AVX2(t) float em_dot_##t##_avx2(const void *w, const void *act, int64_t n);
EM_DOT_IQ_SCALAR(EM_DOT_DECLARE_AVX2)
#undef EM_DOT_DECLARE_AVX2
/* AVX-512 IQ kernels (dot_iq_avx512.c), entries of em_dot_kernels_avx512. */
float em_dot_iq1_m_avx512(const void *w, const void *act, int64_t n);
float em_dot_iq4_xs_avx512(const void *w, const void *act, int64_t n);

/* 2^(e-128): the E8M0 scale of an MXFP4 block, halved because the code points are doubled
 * E2M1 values. e < 2 are fp32 subnormals. */
static inline float em_dot_e8m0_half(uint8_t e) {
    union { uint32_t u; float f; } v = { .u = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23 };
    return v.f;
}

/* MXFP4 code points (doubled E2M1 values), in nibble order. */
#define EM_DOT_MXFP4_VALUES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

/* Q4_K / Q5_K: unpack the 12 scale bytes into 8 six-bit scales and 8 six-bit mins. */
static inline void em_dot_k4_scales(const uint8_t s[12], uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

/* Q3_K: unpack the 12 scale bytes into 16 signed scales (6-bit value minus 32). Scale g
 * has its low 4 bits in byte g (g < 8) or the high nibble of byte g-8, and its high 2 bits
 * in byte 8 + g%4 at bit 2*(g/4). */
static inline void em_dot_q3k_scales(const uint8_t s[12], int8_t out[16]) {
    for (int g = 0; g < 16; g++) {
        int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
        int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        out[g] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* The same two unpackings a word at a time, for the SIMD kernels: byte j of the result is
 * scale / min j. Byte-wise stores followed by a vector load would stall store forwarding;
 * these stay in registers. (Little-endian, as every x86 target of the SIMD files.) */
static inline void em_dot_k4_scales_packed(const uint8_t s[12], uint64_t *sc, uint64_t *mn) {
    uint32_t u[3];
    memcpy(u, s, 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, mn_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *mn = mn_lo | (uint64_t)mn_hi << 32;
}

/* Q3_K: the 16 six-bit scales (not yet minus 32) as four words, scales 4k..4k+3 in word k. */
static inline void em_dot_q3k_scales_packed(const uint8_t s[12], uint32_t w[4]) {
    uint32_t u[3];
    memcpy(u, s, 12);
    w[0] = (u[0] & 0x0f0f0f0fu) | ((u[2] & 0x03030303u) << 4);
    w[1] = (u[1] & 0x0f0f0f0fu) | (((u[2] >> 2) & 0x03030303u) << 4);
    w[2] = ((u[0] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 4) & 0x03030303u) << 4);
    w[3] = ((u[1] >> 4) & 0x0f0f0f0fu) | (((u[2] >> 6) & 0x03030303u) << 4);
}

#endif

/* fp16 and bf16 conversions with the exact semantics of ggml's reference converters (the
 * ones ggml_quantize_chunk and to_float use, checked bit for bit by
 * tests/compat/quant_vs_ggml.c): fp32 -> fp16 rounds to nearest even and turns every NaN
 * into the quiet NaN 0x7e00 with its sign (payload dropped, unlike F16C); fp32 -> bf16
 * rounds to nearest even and forces NaN quiet. fp16 -> fp32 is exact, except that a
 * signalling NaN comes back quiet (ggml converts by a float multiply). */
#include "base.h"

#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float em_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan (quieted) */
        return bits_f32(sign | 0x7f800000 | (man << 13) | (man ? 0x400000u : 0));
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: value = man * 2^-24, exact in fp32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t em_fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffff;
    if (abs > 0x7f800000) /* NaN: ggml's canonical quiet NaN, sign kept */
        return sign | 0x7e00;
    if (abs >= 0x477ff000) /* rounds to >= 65520: infinity */
        return sign | 0x7c00;
    if (abs < 0x38800000) { /* below the smallest normal fp16 (2^-14): subnormal or zero */
        if (abs < 0x33000000) return sign; /* < 2^-25 rounds to zero (ties to even 0) */
        uint32_t e = abs >> 23;
        uint32_t man = (abs & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* value = man * 2^(e-150); fp16 unit is 2^-24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    /* normal: rebias exponent, round 13 dropped bits to nearest even (carry may bump exp) */
    uint32_t v = abs - 0x38000000;
    uint32_t q = v >> 13;
    uint32_t rem = v & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return sign | (uint16_t)q;
}

uint16_t em_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

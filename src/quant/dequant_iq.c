/* quant/dequant_iq.c: the IQ formats' conversion to f32 (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS), scalar.
 *
 * Invariant, as in dequant.c: bit-identical to ggml's to_float for any bytes. Each value is
 * computed with ggml's float operations in ggml's order: the group scale first (an fp16 d
 * times a small odd integer or a half-integer, then any constant factor), then the scale
 * times the grid value, then the sign (a sign flip; see signed_group), never fused into an FMA.
 * Every byte pattern is valid input: indices are masked to their grids' sizes by
 * construction. Blocks are copied to aligned locals first (sources may be unaligned).
 *
 * The layouts (per 256-value super-block, 8 sub-blocks of 32 = 4 groups of 8):
 *   IQ2_XXS: per sub-block two u32: bytes 0..3 of the first are the 4 grid indices, the
 *            second holds four 7-bit sign indices (bits 7l..7l+6) and a 4-bit scale (top).
 *   IQ2_XS:  u16 per group: 9-bit grid index, 7-bit sign index; two 4-bit scales per
 *            sub-block (low nibble: groups 0-1, high: groups 2-3).
 *   IQ2_S:   grid index = qs byte | 2 bits from qh[sub-block] (bits 2l..2l+1), explicit sign
 *            bytes in qs[32..63]; scales as IQ2_XS.
 *   IQ3_XXS: 64 bytes of 8-bit indices into a grid of 4 values (two per group of 8), then per
 *            sub-block a u32 of four 7-bit sign indices and a 4-bit scale.
 *   IQ3_S:   9-bit indices (qs byte | a bit of qh), explicit sign bytes, one 4-bit scale per
 *            sub-block.
 *   IQ1_S:   11-bit indices (qs byte | 3 bits of the sub-block's u16 qh), 3-bit scale and
 *            the sign of a +-1/8 shift in the top bits of qh.
 *   IQ1_M:   as IQ1_S, but the 3 index bits and the shift sign come per group from a qh
 *            nibble, two 3-bit scales per sub-block, and the fp16 d is spread over the top
 *            nibbles of the four u16 scale words.
 *   IQ4_NL / IQ4_XS: 4-bit indices into 16 code points; IQ4_XS has a 6-bit scale (minus 32)
 *            per sub-block. */
#include "quant/convert.h"

#include "base/base.h"
#include "quant/iq_grids.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define IQ1_DELTA 0.125f

/* Byte j of a packed grid entry. */
static inline uint8_t grid_u8(uint64_t entry, int j) { return (uint8_t)(entry >> (8 * j)); }
static inline int8_t grid_i8(uint64_t entry, int j) { return (int8_t)(uint8_t)(entry >> (8 * j)); }

/* 8 values of a grid group: y[j] = (scale * grid[j]) * sign[j]. ggml writes the sign as a
 * multiplication by -1.f or 1.f, which its compiler turns into a sign flip: the same for every
 * number, and for a NaN (a NaN d) the flip is what ggml's library does, so Ember negates
 * explicitly (a literal multiply would keep a NaN's sign, depending on the optimizer). */
static inline void signed_group(float *y, float scale, uint64_t entry, uint8_t signs) {
    for (int j = 0; j < 8; j++) {
        const float v = scale * (float)grid_u8(entry, j);
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}

/* Two 4-value grid entries as one group of 8 (IQ3). */
static inline uint64_t grid_pair(uint32_t lo, uint32_t hi) { return lo | (uint64_t)hi << 32; }

void em_dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq2_xxs)) {
        em_block_iq2_xxs blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++) {
            uint32_t aux[2];
            memcpy(aux, blk.qs + 4 * s, sizeof aux);
            const float db = d * (0.5f + (float)(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, dst += 8)
                signed_group(dst, db, em_iq2xxs_grid[(aux[0] >> (8 * l)) & 255],
                             em_iq_ksigns[(aux[1] >> (7 * l)) & 127]);
        }
    }
}

void em_dequant_iq2_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq2_xs)) {
        em_block_iq2_xs blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++) {
            const float db[2] = { d * (0.5f + (float)(blk.scales[s] & 15)) * 0.25f,
                                  d * (0.5f + (float)(blk.scales[s] >> 4)) * 0.25f };
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint16_t q = blk.qs[4 * s + l];
                signed_group(dst, db[l / 2], em_iq2xs_grid[q & 511], em_iq_ksigns[q >> 9]);
            }
        }
    }
}

void em_dequant_iq2_s(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq2_s)) {
        em_block_iq2_s blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        const uint8_t *signs = blk.qs + EM_QK_K / 8;
        for (int s = 0; s < 8; s++) {
            const float db[2] = { d * (0.5f + (float)(blk.scales[s] & 15)) * 0.25f,
                                  d * (0.5f + (float)(blk.scales[s] >> 4)) * 0.25f };
            for (int l = 0; l < 4; l++, dst += 8) {
                const int idx = blk.qs[4 * s + l] | (((blk.qh[s] >> (2 * l)) & 3) << 8);
                signed_group(dst, db[l / 2], em_iq2s_grid[idx], signs[4 * s + l]);
            }
        }
    }
}

void em_dequant_iq3_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq3_xxs)) {
        em_block_iq3_xxs blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = blk.qs + 8 * s;
            uint32_t aux;
            memcpy(&aux, blk.qs + EM_QK_K / 4 + 4 * s, sizeof aux);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, dst += 8)
                signed_group(dst, db, grid_pair(em_iq3xxs_grid[q[2 * l]], em_iq3xxs_grid[q[2 * l + 1]]),
                             em_iq_ksigns[(aux >> (7 * l)) & 127]);
        }
    }
}

void em_dequant_iq3_s(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq3_s)) {
        em_block_iq3_s blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++) {
            const int sc = (blk.scales[s / 2] >> (4 * (s % 2))) & 15;
            const float db = d * (float)(1 + 2 * sc);
            const uint8_t *q = blk.qs + 8 * s;
            for (int l = 0; l < 4; l++, dst += 8) {
                const int i0 = q[2 * l] | (((blk.qh[s] >> (2 * l)) & 1) << 8);
                const int i1 = q[2 * l + 1] | (((blk.qh[s] >> (2 * l + 1)) & 1) << 8);
                signed_group(dst, db, grid_pair(em_iq3s_grid[i0], em_iq3s_grid[i1]),
                             blk.signs[4 * s + l]);
            }
        }
    }
}

/* 8 values of an IQ1 group: dl * (grid[j] + delta). */
static inline void iq1_group(float *y, float dl, float delta, int idx) {
    const uint64_t entry = em_iq1s_grid[idx];
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid_i8(entry, j) + delta);
}

void em_dequant_iq1_s(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq1_s)) {
        em_block_iq1_s blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++) {
            const uint16_t qh = blk.qh[s];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
            for (int l = 0; l < 4; l++, dst += 8)
                iq1_group(dst, dl, delta, blk.qs[4 * s + l] | (((qh >> (3 * l)) & 7) << 8));
        }
    }
}

/* IQ1_M's fp16 super-block scale: the top nibble of each of the four u16 scale words. */
static inline uint16_t iq1m_d_bits(const uint16_t sc[4]) {
    return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                      (sc[3] & 0xf000));
}

void em_dequant_iq1_m(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq1_m)) {
        em_block_iq1_m blk;
        memcpy(&blk, p, sizeof blk);
        uint16_t sc[4];
        memcpy(sc, blk.scales, sizeof sc);
        const float d = em_fp16_to_fp32(iq1m_d_bits(sc));
        for (int s = 0; s < 8; s++) {
            const int shift = 6 * (s % 2);
            const float dl[2] = { d * (float)(2 * ((sc[s / 2] >> shift) & 7) + 1),
                                  d * (float)(2 * ((sc[s / 2] >> (shift + 3)) & 7) + 1) };
            for (int l = 0; l < 4; l++, dst += 8) {
                const int nib = (blk.qh[2 * s + l / 2] >> (4 * (l % 2))) & 15;
                const float delta = nib & 8 ? -IQ1_DELTA : IQ1_DELTA;
                iq1_group(dst, dl[l / 2], delta, blk.qs[4 * s + l] | ((nib & 7) << 8));
            }
        }
    }
}

void em_dequant_iq4_nl(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, p += sizeof(em_block_iq4_nl), dst += QK4_NL) {
        em_block_iq4_nl blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            dst[j] = d * (float)em_iq4nl_values[blk.qs[j] & 15];
            dst[j + QK4_NL / 2] = d * (float)em_iq4nl_values[blk.qs[j] >> 4];
        }
    }
}

void em_dequant_iq4_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / EM_QK_K; i++, p += sizeof(em_block_iq4_xs)) {
        em_block_iq4_xs blk;
        memcpy(&blk, p, sizeof blk);
        const float d = em_fp16_to_fp32(blk.d);
        for (int s = 0; s < 8; s++, dst += 32) {
            const int ls = ((blk.scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((blk.scales_h >> (2 * s)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const uint8_t *q = blk.qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                dst[j] = dl * (float)em_iq4nl_values[q[j] & 15];
                dst[j + 16] = dl * (float)em_iq4nl_values[q[j] >> 4];
            }
        }
    }
}

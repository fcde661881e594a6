/* quant/dot_iq_avx2.c: AVX2 (+FMA, F16C) dot kernels of the IQ weight formats, entries of
 * em_dot_kernels_avx2 (dot_avx2.c); dispatch calls them only on CPUs with AVX2, FMA, F16C.
 *
 * Each 32-value sub-block is decoded to 32 int8 weights in a register: the grid entries are
 * looked up with scalar loads (they are 8 or 4 bytes each) and inserted; the signs become a
 * byte mask that negates the activations instead (so maddubs sees unsigned magnitudes x
 * signed activations); IQ1 weights become 8g + delta (odd, |.| <= 9) and IQ4 weights the
 * code points, both multiplied with the sign trick of dot_i8. The int16 pair sums are
 * multiplied by the sub-block's integer scale(s) in madd, into int32: exactly the integer
 * sums of the scalar kernels in dot_iq.c (no saturation: pair sums stay below 2^15 because
 * activation quants are within [-127, 127]). Only float rounding differs. */
#include "quant/dot_kernels.h"
#include "quant/iq_grids.h"
#include "quant/simd.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 8")


/* 32 bits -> 32 bytes, byte k = 0xFF when bit k is set (bit 8l+j: value j of group l). */
static inline __m256i sign_mask(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* Unsigned magnitudes (< 64) times activations negated by the sign bits: 16 int16 pair sums. */
static inline __m256i signed_pairs(__m256i mag, const int8_t *y, uint32_t signbits) {
    const __m256i m = sign_mask(signbits);
    const __m256i sy = _mm256_sub_epi8(_mm256_xor_si256(em_load256(y), m), m);
    return _mm256_maddubs_epi16(mag, sy);
}

/* Signed int8 weights (|w| <= 127) times activations: 16 int16 pair sums (sign trick). */
static inline __m256i i8_pairs(__m256i w, const int8_t *y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(em_load256(y), w));
}

/* int16 pair sums times a per-half scale (values 0..15: lo, 16..31: hi) -> 8 int32. */
static inline __m256i scale_halves(__m256i pairs, int lo, int hi) {
    return _mm256_madd_epi16(pairs, _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo)));
}

static inline __m256i scale_all(__m256i pairs, int s) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16((short)s)); }

/* Four 7-bit sign indices (bits 7l..) completed through ksigns, one byte per group. */
static inline uint32_t ksign_bits(uint32_t packed) {
    return (uint32_t)em_iq_ksigns[packed & 127] | (uint32_t)em_iq_ksigns[(packed >> 7) & 127] << 8 |
           (uint32_t)em_iq_ksigns[(packed >> 14) & 127] << 16 | (uint32_t)em_iq_ksigns[(packed >> 21) & 127] << 24;
}

static inline __m256i grid64x4(const uint64_t *grid, int i0, int i1, int i2, int i3) {
    return _mm256_set_epi64x((long long)grid[i3], (long long)grid[i2], (long long)grid[i1], (long long)grid[i0]);
}

static inline __m256i grid32x8(const uint32_t *grid, const int idx[8]) {
    return _mm256_set_epi32((int)grid[idx[7]], (int)grid[idx[6]], (int)grid[idx[5]], (int)grid[idx[4]],
                            (int)grid[idx[3]], (int)grid[idx[2]], (int)grid[idx[1]], (int)grid[idx[0]]);
}

/* ---- IQ2 ---------------------------------------------------------------------------------- */

float em_dot_iq2_xxs_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_xxs *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            uint32_t aux[2];
            memcpy(aux, w[b].qs + 4 * s, sizeof aux);
            const __m256i g = grid64x4(em_iq2xxs_grid, aux[0] & 255, (aux[0] >> 8) & 255, (aux[0] >> 16) & 255,
                                       aux[0] >> 24);
            const __m256i p = signed_pairs(g, a[b].qs + 32 * s, ksign_bits(aux[1]));
            isum = _mm256_add_epi32(isum, scale_all(p, (int)(2 * (aux[1] >> 28) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d * 0.125f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

float em_dot_iq2_xs_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_xs *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint16_t *q = w[b].qs + 4 * s;
            const __m256i g = grid64x4(em_iq2xs_grid, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
            const uint32_t sb = (uint32_t)em_iq_ksigns[q[0] >> 9] | (uint32_t)em_iq_ksigns[q[1] >> 9] << 8 |
                                (uint32_t)em_iq_ksigns[q[2] >> 9] << 16 | (uint32_t)em_iq_ksigns[q[3] >> 9] << 24;
            const __m256i p = signed_pairs(g, a[b].qs + 32 * s, sb);
            const int sc = w[b].scales[s];
            isum = _mm256_add_epi32(isum, scale_halves(p, 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d * 0.125f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

float em_dot_iq2_s_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_s *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 4 * s;
            const int qh = w[b].qh[s];
            const __m256i g = grid64x4(em_iq2s_grid, q[0] | (qh & 3) << 8, q[1] | ((qh >> 2) & 3) << 8,
                                       q[2] | ((qh >> 4) & 3) << 8, q[3] | ((qh >> 6) & 3) << 8);
            uint32_t sb;
            memcpy(&sb, w[b].qs + EM_QK_K / 8 + 4 * s, sizeof sb);
            const __m256i p = signed_pairs(g, a[b].qs + 32 * s, sb);
            const int sc = w[b].scales[s];
            isum = _mm256_add_epi32(isum, scale_halves(p, 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d * 0.125f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

/* ---- IQ3 ---------------------------------------------------------------------------------- */

float em_dot_iq3_xxs_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq3_xxs *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 8 * s;
            const int idx[8] = { q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7] };
            uint32_t aux;
            memcpy(&aux, w[b].qs + EM_QK_K / 4 + 4 * s, sizeof aux);
            const __m256i p = signed_pairs(grid32x8(em_iq3xxs_grid, idx), a[b].qs + 32 * s, ksign_bits(aux));
            isum = _mm256_add_epi32(isum, scale_all(p, (int)(2 * (aux >> 28) + 1)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d * 0.25f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

float em_dot_iq3_s_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq3_s *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 8 * s;
            const int qh = w[b].qh[s];
            int idx[8];
            for (int k = 0; k < 8; k++) idx[k] = q[k] | ((qh >> k) & 1) << 8;
            uint32_t sb;
            memcpy(&sb, w[b].signs + 4 * s, sizeof sb);
            const __m256i p = signed_pairs(grid32x8(em_iq3s_grid, idx), a[b].qs + 32 * s, sb);
            isum = _mm256_add_epi32(isum, scale_all(p, 2 * ((w[b].scales[s / 2] >> (4 * (s % 2))) & 15) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

/* ---- IQ1: weights 8g + delta ---------------------------------------------------------------- */

/* 8 * grid values (-1, 0, 1 bytes) plus per-group deltas (+-1 bytes). */
static inline __m256i iq1_weights(int i0, int i1, int i2, int i3, __m256i delta) {
    const __m256i g = grid64x4(em_iq1s_grid, i0, i1, i2, i3);
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), delta);
}

float em_dot_iq1_s_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq1_s *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 4 * s;
            const int qh = w[b].qh[s];
            const __m256i delta = _mm256_set1_epi8(qh & 0x8000 ? -1 : 1);
            const __m256i wt = iq1_weights(q[0] | (qh & 7) << 8, q[1] | ((qh >> 3) & 7) << 8,
                                           q[2] | ((qh >> 6) & 7) << 8, q[3] | ((qh >> 9) & 7) << 8, delta);
            isum = _mm256_add_epi32(isum, scale_all(i8_pairs(wt, a[b].qs + 32 * s), 2 * ((qh >> 12) & 7) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d * 0.125f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

/* -1 or +1 in each byte of a group: the sign of IQ1_M's delta (bit 3 of the group's nibble). */
static inline long long iq1m_delta(int nib) { return nib & 8 ? -1LL : 0x0101010101010101LL; }

float em_dot_iq1_m_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq1_m *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint16_t sc[4];
        memcpy(sc, w[b].scales, sizeof sc);
        const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                          (sc[3] & 0xf000));
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 4 * s;
            const int h0 = w[b].qh[2 * s], h1 = w[b].qh[2 * s + 1];
            const __m256i delta = _mm256_set_epi64x(iq1m_delta(h1 >> 4), iq1m_delta(h1), iq1m_delta(h0 >> 4),
                                                    iq1m_delta(h0));
            const __m256i wt = iq1_weights(q[0] | (h0 & 7) << 8, q[1] | ((h0 >> 4) & 7) << 8,
                                           q[2] | (h1 & 7) << 8, q[3] | ((h1 >> 4) & 7) << 8, delta);
            const int ss = sc[s / 2] >> (6 * (s % 2));
            isum = _mm256_add_epi32(isum, scale_halves(i8_pairs(wt, a[b].qs + 32 * s), 2 * (ss & 7) + 1,
                                                       2 * ((ss >> 3) & 7) + 1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(dbits) * a[b].d * 0.125f), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

/* ---- IQ4 ---------------------------------------------------------------------------------- */

/* 16 bytes of 4-bit indices -> 32 code points: low nibbles (values 0..15), then high. */
static inline __m256i iq4_values(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(_mm256_setr_epi8(EM_IQ4NL_VALUES, EM_IQ4NL_VALUES), idx);
}

float em_dot_iq4_nl_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq4_nl *w = vw;
    const em_block_q8_0 *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK4_NL;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const __m256i p0 = _mm256_madd_epi16(i8_pairs(iq4_values(w[b].qs), a[b].qs), _mm256_set1_epi16(1));
        const __m256i p1 = _mm256_madd_epi16(i8_pairs(iq4_values(w[b + 1].qs), a[b + 1].qs), _mm256_set1_epi16(1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * em_h2f(a[b].d)), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b + 1].d) * em_h2f(a[b + 1].d)), _mm256_cvtepi32_ps(p1), acc1);
    }
    if (b < nb) {
        const __m256i p0 = _mm256_madd_epi16(i8_pairs(iq4_values(w[b].qs), a[b].qs), _mm256_set1_epi16(1));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * em_h2f(a[b].d)), _mm256_cvtepi32_ps(p0), acc0);
    }
    return em_hsum256_ps(_mm256_add_ps(acc0, acc1));
}

float em_dot_iq4_xs_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_iq4_xs *w = vw;
    const em_block_q8_K *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int s = 0; s < 8; s++) {
            const int ls = ((w[b].scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((w[b].scales_h >> (2 * s)) & 3) << 4);
            const __m256i p = i8_pairs(iq4_values(w[b].qs + 16 * s), a[b].qs + 32 * s);
            isum = _mm256_add_epi32(isum, scale_all(p, ls - 32));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * a[b].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

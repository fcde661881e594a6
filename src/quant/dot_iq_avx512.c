/* quant/dot_iq_avx512.c: AVX-512 (F/BW/VL/DQ + VNNI) dot kernels of IQ1_M and IQ4_XS, entries
 * of em_dot_kernels_avx512 (dot_avx512.c). The other IQ types use their AVX2 kernels at the
 * AVX-512 level too: 512-bit versions of IQ1_S, IQ2_XXS, IQ2_XS and IQ3_XXS (grid lookups by
 * vpgather or by scalar loads) measured 10-30% slower than AVX2 on the development machine,
 * their cost being the lookups, not the arithmetic.
 *
 * Two 32-value sub-blocks share a 512-bit register. IQ1_M's grid indices are widened from the
 * packed bytes in vector registers and looked up with scalar loads; IQ1 weights are 8g + delta,
 * IQ4 weights the code points: both signed, so their magnitudes meet the activations with the
 * weights' signs moved over (a mask register drives a masked subtract from zero). maddubs gives int16 pair sums (below
 * 2^15 for activation quants within [-127, 127]); madd with the per-128-bit-lane integer
 * scales gives int32. The integers equal the scalar kernels' (dot_iq.c); only float rounding
 * differs. */
#include "quant/dot_kernels.h"
#include "quant/iq_grids.h"
#include "quant/simd.h"

#include <immintrin.h>

#define UNROLL _Pragma("GCC unroll 4")

/* int16 scales per 128-bit lane (values 16k..16k+15 of the 64 get scale k) from four int16
 * packed in a word. */
static inline __m512i lane_scales(uint64_t packed4) {
    const __m512i idx = _mm512_set_epi64(0x0003000300030003LL, 0x0003000300030003LL, 0x0002000200020002LL,
                                         0x0002000200020002LL, 0x0001000100010001LL, 0x0001000100010001LL, 0, 0);
    return _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(_mm_cvtsi64_si128((long long)packed4)));
}

static inline uint64_t pack4(int l0, int l1, int l2, int l3) {
    return (uint64_t)(uint16_t)l0 | (uint64_t)(uint16_t)l1 << 16 | (uint64_t)(uint16_t)l2 << 32 |
           (uint64_t)(uint16_t)l3 << 48;
}

/* sum over 64 values of mag * (+-y), times the lane scales: 16 int32. */
static inline __m512i signed_dot(__m512i mag, const int8_t *y, __mmask64 neg, uint64_t scales) {
    const __m512i yv = _mm512_loadu_si512(y);
    const __m512i sy = _mm512_mask_sub_epi8(yv, neg, _mm512_setzero_si512(), yv);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(mag, sy), lane_scales(scales));
}

/* The same for signed weights (|w| <= 127). */
static inline __m512i i8_dot(__m512i wt, const int8_t *y, uint64_t scales) {
    return signed_dot(_mm512_abs_epi8(wt), y, _mm512_movepi8_mask(wt), scales);
}

/* Eight grid entries. Scalar loads from the spilled indices, not vpgatherqq: the gather is
 * the slower of the two on the development machine (and on most x86 cores). */
static inline __m512i gather64(const uint64_t *grid, __m512i idx) {
    uint64_t i[8];
    _mm512_storeu_si512(i, idx);
    return _mm512_set_epi64((long long)grid[i[7]], (long long)grid[i[6]], (long long)grid[i[5]],
                            (long long)grid[i[4]], (long long)grid[i[3]], (long long)grid[i[2]],
                            (long long)grid[i[1]], (long long)grid[i[0]]);
}

/* ---- IQ1: weights 8g + delta ---------------------------------------------------------------- */

/* 8 * the gathered grid bytes (-1, 0, 1): a 16-bit shift leaks at most 3 bits into the next
 * byte's low bits, which the mask clears. */
static inline __m512i iq1_weights(__m512i idx, __m512i delta) {
    const __m512i g = gather64(em_iq1s_grid, idx);
    const __m512i g8 = _mm512_and_si512(_mm512_slli_epi16(g, 3), _mm512_set1_epi8((char)0xF8));
    return _mm512_add_epi8(g8, delta);
}

float em_dot_iq1_m_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_iq1_m *w = vw;
    const em_block_q8_K *a = va;
    const __m512i shifts = _mm512_set_epi64(28, 24, 20, 16, 12, 8, 4, 0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint16_t sc[4];
        memcpy(sc, w[b].scales, sizeof sc);
        const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                          (sc[3] & 0xf000));
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int s = 0; s < 8; s += 2) {
            uint32_t qh; /* 8 nibbles: group l of the pair in bits 4l..4l+3 */
            memcpy(&qh, w[b].qh + 2 * s, 4);
            uint64_t q8;
            memcpy(&q8, w[b].qs + 4 * s, 8);
            const __m512i nib = _mm512_srlv_epi64(_mm512_set1_epi64(qh), shifts);
            const __m512i high = _mm512_slli_epi64(_mm512_and_si512(nib, _mm512_set1_epi64(7)), 8);
            const __m512i idx = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)q8)), high);
            const __mmask8 minus = _mm512_test_epi64_mask(nib, _mm512_set1_epi64(8));
            const __m512i delta = _mm512_mask_blend_epi64(minus, _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
            const int s0 = sc[s / 2], s1 = sc[s / 2] >> 6; /* sub-blocks s (bits 0..5), s+1 (6..11) */
            isum = _mm512_add_epi32(isum, i8_dot(iq1_weights(idx, delta), a[b].qs + 32 * s,
                                                 pack4(2 * (s0 & 7) + 1, 2 * ((s0 >> 3) & 7) + 1, 2 * (s1 & 7) + 1,
                                                       2 * ((s1 >> 3) & 7) + 1)));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(em_h2f(dbits) * a[b].d * 0.125f), _mm512_cvtepi32_ps(isum), acc);
    }
    return em_hsum512_ps(acc);
}

/* ---- IQ4_XS ----------------------------------------------------------------------------------- */

float em_dot_iq4_xs_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_iq4_xs *w = vw;
    const em_block_q8_K *a = va;
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(EM_IQ4NL_VALUES));
    const __m512i order = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int s = 0; s < 8; s += 2) {
            /* 32 bytes of two sub-blocks -> each one's low nibbles (values 0..15), then high */
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(w[b].qs + 16 * s));
            const __m512i both = _mm512_permutex2var_epi64(_mm512_castsi256_si512(raw), order,
                                                           _mm512_castsi256_si512(_mm256_srli_epi16(raw, 4)));
            const __m512i wt = _mm512_shuffle_epi8(table, _mm512_and_si512(both, _mm512_set1_epi8(0x0F)));
            const int sl = w[b].scales_l[s / 2], sh = w[b].scales_h >> (2 * s);
            const int l0 = ((sl & 15) | (sh & 3) << 4) - 32, l1 = ((sl >> 4) | ((sh >> 2) & 3) << 4) - 32;
            isum = _mm512_add_epi32(isum, i8_dot(wt, a[b].qs + 32 * s, pack4(l0, l0, l1, l1)));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(em_h2f(w[b].d) * a[b].d), _mm512_cvtepi32_ps(isum), acc);
    }
    return em_hsum512_ps(acc);
}

/* Internal to compute/ (include only from *_avx512.c files): many horizontal sums of 16 float
 * lanes at once. A product or score of a few hundred values is only a few vector steps, so
 * summing each output's 16 lanes on its own (8 dependent shuffles and adds) costs about as
 * much as the products. Here 16 accumulators are summed together by a transposition tree:
 * each level adds the same lane pairs, with the same operand first, as one level of the
 * single-vector sum used across compute/ and quant/ (lanes i + i+8, then i + i+4, i + i+2,
 * i + i+1, the lower lane first: em_hsum512_ps of quant/simd.h, dot_lanes of ops.c), so
 * every sum is bit for bit that sum (NaN payloads included), at about three vector
 * operations per output instead of eight. */
#ifndef EM_COMPUTE_HSUM_AVX512_H
#define EM_COMPUTE_HSUM_AVX512_H

#include <immintrin.h>

#define EM_HSUM_UNROLL _Pragma("GCC unroll 8")

/* Levels 2..4 of the tree: in[k] holds lanes i + i+8 (i < 8) of v[2k] in lanes 0..7 and of
 * v[2k+1] in lanes 8..15; returns the 16 sums in the order v[0], v[4], v[8], v[12], v[1],
 * v[5], ... (lane 4a + b holds the sum of v[4b + a]). The 8-lane sum of an AVX2 kernel
 * (halves 8 -> 4 -> 2 -> 1) is these levels applied to one half. */
static inline __m512 em_hsum_tree_from_halves(const __m512 in[8]) {
    __m512 l2[4], l3[2];
    EM_HSUM_UNROLL for (int k = 0; k < 4; k++) /* lanes i + i+4 of each 8 */
        l2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    EM_HSUM_UNROLL for (int k = 0; k < 2; k++) /* lanes i + i+2 of each 4 */
        l3[k] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * k], l2[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(l2[2 * k], l2[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 0 + lane 1 of each pair */
    return _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Lane k: the 16-lane sum of v[k], k < 16. */
static inline __m512 em_hsum512_x16(const __m512 *v) {
    __m512 l1[8];
    EM_HSUM_UNROLL for (int k = 0; k < 8; k++) /* lanes i + i+8 */
        l1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, em_hsum_tree_from_halves(l1));
}

#endif

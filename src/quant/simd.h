/* quant/simd.h: the small SIMD helpers the kernel files share (include only from files
 * compiled for AVX2+F16C, *_avx2.c / *_avx512.c, in quant/, compute/ and model/): the
 * horizontal sum of 8 or 16 float lanes, halved 16 -> 8 -> 4 -> 2 -> 1 with the lower lane
 * first (the one order: kernels that must agree bit for bit, a product and its multi-row
 * form, reduce through these same definitions), F16 -> F32 of one value, unaligned loads,
 * and the polynomial of the vector exps (compute/ops_avx512.c, model/kda_avx2.c). */
#ifndef EM_QUANT_SIMD_H
#define EM_QUANT_SIMD_H

#include <immintrin.h>
#include <stdint.h>

static inline float em_hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float em_h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline __m256i em_load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* exp(r) for a reduced argument r (|r| <= ln2 / 2) as the degree-7 Taylor polynomial in
 * Horner form, 1/5040 first: one operation order for every vector width (FMADD, SET1: that
 * width's fused multiply-add and broadcast). The caller scales by 2^k and handles the ends. */
#define EM_EXP_TAYLOR7(FMADD, SET1, r)                                                             \
    FMADD(FMADD(FMADD(FMADD(FMADD(FMADD(FMADD(SET1(1.0f / 5040.0f), r, SET1(1.0f / 720.0f)), r,   \
                                        SET1(1.0f / 120.0f)),                                      \
                                  r, SET1(1.0f / 24.0f)),                                          \
                            r, SET1(1.0f / 6.0f)),                                                 \
                      r, SET1(0.5f)),                                                              \
                r, SET1(1.0f)),                                                                    \
          r, SET1(1.0f))

#ifdef __AVX512F__
static inline float em_hsum512_ps(__m512 v) {
    return em_hsum256_ps(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

static inline __m512i em_load512(const void *p) { return _mm512_loadu_si512(p); }
#endif

#endif

/* draft/dspark_attn_avx512.c: the drafter's attention inner loops on AVX-512 (this file alone
 * gets the ISA flags; dspark.c calls it only when em_isa_default() says the CPU has them, and
 * only for head sizes that are a multiple of 16). Same arithmetic as the portable loops of
 * dspark.c up to the order of additions: scores are fp32 dot products, the V rows are summed
 * with fp32 fused multiply-adds. No state, no allocation. */
#include "draft/dspark_impl.h"

#include <immintrin.h>
#include <math.h>

/* Sum of the 16 lanes of each of a0..a3, as 4 floats. */
static inline __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
    __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
    __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
    __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
    __m128 c0 = _mm_add_ps(_mm256_castps256_ps128(b0), _mm256_extractf128_ps(b0, 1));
    __m128 c1 = _mm_add_ps(_mm256_castps256_ps128(b1), _mm256_extractf128_ps(b1, 1));
    __m128 c2 = _mm_add_ps(_mm256_castps256_ps128(b2), _mm256_extractf128_ps(b2, 1));
    __m128 c3 = _mm_add_ps(_mm256_castps256_ps128(b3), _mm256_extractf128_ps(b3, 1));
    return _mm_hadd_ps(_mm_hadd_ps(c0, c1), _mm_hadd_ps(c2, c3));
}

static inline __m512 dot_part(const float *k, const float *q, int hd) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(k), _mm512_loadu_ps(q));
    for (int c = 16; c < hd; c += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(k + c), _mm512_loadu_ps(q + c), acc);
    return acc;
}

void dsp_scores_avx512(const float *q, const float *k, int64_t stride, int64_t n, int hd, float scale, float *out) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * stride;
        __m128 s = hsum4(dot_part(k0, q, hd), dot_part(k0 + stride, q, hd), dot_part(k0 + 2 * stride, q, hd),
                         dot_part(k0 + 3 * stride, q, hd));
        _mm_storeu_ps(out + j, _mm_mul_ps(s, _mm_set1_ps(scale)));
    }
    for (; j < n; j++) out[j] = _mm512_reduce_add_ps(dot_part(k + j * stride, q, hd)) * scale;
}

void dsp_weighted_sum_avx512(const float *p, const float *v, int64_t stride, int64_t n, int hd, float *out) {
    for (int c = 0; c < hd; c += 64) { /* 4 registers of the output at a time */
        const int w = hd - c < 64 ? hd - c : 64; /* a multiple of 16 */
        __m512 a0 = _mm512_loadu_ps(out + c), a1 = w > 16 ? _mm512_loadu_ps(out + c + 16) : _mm512_setzero_ps();
        __m512 a2 = w > 32 ? _mm512_loadu_ps(out + c + 32) : _mm512_setzero_ps();
        __m512 a3 = w > 48 ? _mm512_loadu_ps(out + c + 48) : _mm512_setzero_ps();
        const float *vr = v + c;
        for (int64_t j = 0; j < n; j++, vr += stride) {
            __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr), a0);
            if (w > 16) a1 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 16), a1);
            if (w > 32) a2 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 32), a2);
            if (w > 48) a3 = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vr + 48), a3);
        }
        _mm512_storeu_ps(out + c, a0);
        if (w > 16) _mm512_storeu_ps(out + c + 16, a1);
        if (w > 32) _mm512_storeu_ps(out + c + 32, a2);
        if (w > 48) _mm512_storeu_ps(out + c + 48, a3);
    }
}

void dsp_softmax_avx512(float *x, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + j));
    float mx = _mm512_reduce_max_ps(m);
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    for (j = 0; j < n; j++) x[j] = expf(x[j] - mx);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (j = 0; j + 16 <= n; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    for (; j < n; j++) sum += x[j];
    const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), inv));
    for (; j < n; j++) x[j] *= _mm512_cvtss_f32(inv);
}

/* AVX-512 forms of the row ops of ops.c that sit in hot loops (MLA's scores and context sums,
 * the MoE combine). Each gives exactly the scalar loop's floats: the same IEEE operations per
 * element (axpy: a multiply rounded, then an add rounded, no fused multiply-add; the
 * attention rows: the fused multiply-adds and lane order that ops.c spells out), only
 * sixteen at a time. */
#include "compute/ops_kernels.h"

#include <immintrin.h>

void em_axpy_avx512(float a, const float *x, int64_t n, float *y) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_mul_ps(va, _mm512_loadu_ps(x + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* 16 -> 8 -> 4 -> 2 -> 1, as dot_lanes of ops.c. */
static inline float sum_halves(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* Four rows at a time (four independent fma chains); the last values through a mask
 * (masked-off lanes load 0: fma(0, 0, acc), as ops.c). */
void em_dot_rows_avx512(const float *x, int64_t ldx, int64_t m, const float *q, int64_t n, float scale, float *s) {
    const int64_t full = n / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (n - full)) - 1);
    int64_t u = 0;
    for (; u + 4 <= m; u += 4) {
        const float *x0 = x + u * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k < full; k += 16) {
            const __m512 vq = _mm512_loadu_ps(q + k);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x0 + k), vq, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x1 + k), vq, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x2 + k), vq, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x3 + k), vq, a3);
        }
        if (tail) {
            const __m512 vq = _mm512_maskz_loadu_ps(tail, q + k);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x0 + k), vq, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x1 + k), vq, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x2 + k), vq, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x3 + k), vq, a3);
        }
        s[u] = sum_halves(a0) * scale;
        s[u + 1] = sum_halves(a1) * scale;
        s[u + 2] = sum_halves(a2) * scale;
        s[u + 3] = sum_halves(a3) * scale;
    }
    for (; u < m; u++) {
        const float *xu = x + u * ldx;
        __m512 a = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k < full; k += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(xu + k), _mm512_loadu_ps(q + k), a);
        if (tail) a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, xu + k), _mm512_maskz_loadu_ps(tail, q + k), a);
        s[u] = sum_halves(a) * scale;
    }
}

/* Columns in blocks of 8 x 16 held in registers while every row streams past. */
void em_weighted_rows_avx512(const float *p, const float *x, int64_t ldx, int64_t m, int64_t n, float *y) {
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m512 a[8];
        for (int b = 0; b < 8; b++) a[b] = _mm512_setzero_ps();
        for (int64_t u = 0; u < m; u++) {
            const __m512 pu = _mm512_set1_ps(p[u]);
            const float *xu = x + u * ldx + i;
            for (int b = 0; b < 8; b++) a[b] = _mm512_fmadd_ps(pu, _mm512_loadu_ps(xu + 16 * b), a[b]);
        }
        for (int b = 0; b < 8; b++) _mm512_storeu_ps(y + i + 16 * b, a[b]);
    }
    for (; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 a = _mm512_setzero_ps();
        for (int64_t u = 0; u < m; u++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(p[u]), _mm512_maskz_loadu_ps(mk, x + u * ldx + i), a);
        _mm512_mask_storeu_ps(y + i, mk, a);
    }
}

/* em_expf_poly of ops.c sixteen at a time (the same operations; 2^k by scalef, exact as
 * scalbnf is, subnormal results rounded once the same way). */
void em_exp_shift_avx512(float *x, int64_t n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx), lo = _mm512_set1_ps(-103.0f), hi = _mm512_set1_ps(88.7228394f);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2hi = _mm512_set1_ps(0.693145751953125f),
                 ln2lo = _mm512_set1_ps(1.42860682030941723e-06f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx);
        const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(v, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 r = _mm512_fnmadd_ps(k, ln2lo, _mm512_fnmadd_ps(k, ln2hi, v));
        __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
        __m512 e = _mm512_scalef_ps(p, k);
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, lo, _CMP_LT_OQ), _mm512_setzero_ps());
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, hi, _CMP_GT_OQ), _mm512_set1_ps(__builtin_inff()));
        e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
        _mm512_mask_storeu_ps(x + i, m, e);
    }
}

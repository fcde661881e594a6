/* AVX-512 forms of the row ops of ops.c that sit in hot loops (MLA's context sums, the MoE
 * combine). Each gives exactly the scalar loop's floats: the same IEEE operations per element
 * (a multiply rounded, then an add rounded: no fused multiply-add), only sixteen at a time. */
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

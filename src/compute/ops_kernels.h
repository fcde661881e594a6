/* Internal to compute/: SIMD forms of row ops (ops_avx512.c), bit-identical to the scalar
 * loops of ops.c, which dispatches to them (em_isa_default() == EM_ISA_AVX512). */
#ifndef EM_COMPUTE_OPS_KERNELS_H
#define EM_COMPUTE_OPS_KERNELS_H

#include <stdint.h>

/* y += a * x over n values; x and y do not overlap, or are the same array. */
void em_axpy_avx512(float a, const float *x, int64_t n, float *y);
/* em_dot_rows / em_weighted_rows of ops.c, the same floats. */
void em_dot_rows_avx512(const float *x, int64_t ldx, int64_t m, const float *q, int64_t n, float scale, float *s);
/* x[i] = em_expf_poly(x[i] - mx) for i < n. */
void em_exp_shift_avx512(float *x, int64_t n, float mx);
void em_weighted_rows_avx512(const float *p, const float *x, int64_t ldx, int64_t m, int64_t n, float *y);
/* em_dot_rows_multi / em_weighted_rows_multi of ops.c, the same floats. */
void em_dot_rows_multi_avx512(const float *x, int64_t ldx, int64_t m, const float *q, int64_t ldq, int nq, int64_t n,
                              float scale, float *s, int64_t lds);
void em_weighted_rows_multi_avx512(const float *p, int64_t ldp, const int64_t *m, int nq, const float *x, int64_t ldx,
                                   int64_t n, float *y, int64_t ldy);

#endif

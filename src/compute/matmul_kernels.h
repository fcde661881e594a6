/* Internal to compute/: multi-row product kernels that take several weight rows and several
 * activation rows at once (register tiles), for the weight types where that beats one dot
 * product per (weight row, activation row) pair. matmul.c decides when to call them. */
#ifndef EM_COMPUTE_MATMUL_KERNELS_H
#define EM_COMPUTE_MATMUL_KERNELS_H

#include "quant/quant.h"

/* y[j * ldy + r] = W[r] . act[j] for r in [0, nr), j in [0, nj): Q8_0 weight rows (row r at
 * w + r * row_bytes) times Q8_0 activation rows (row j at act + j * stride), cols values each
 * (a multiple of 32). Each output is bit for bit what the AVX-512 dot kernel
 * (em_dot_kernel(EM_TYPE_Q8_0, EM_ISA_AVX512)) returns for that pair: the same integer
 * products, the same float operations in the same order (so a row's result never depends
 * on the rows it was tiled with); tail is the AVX2 Q8_0 dot kernel, which that kernel also
 * uses for the last cols/32 % 4 blocks. Defined in matmul_avx512.c; call only on CPUs with
 * AVX-512 F/BW/VL/DQ/VNNI. */
void em_mm_q8_0_avx512(const void *w, uint64_t row_bytes, int64_t nr, const void *act,
                       uint64_t stride, int64_t nj, int64_t cols, float *y, int64_t ldy,
                       em_dot_fn tail);

/* y[j * ldy + 16g + r] = row 16g + r . act[j] for the n_groups groups of 16 rows at packed
 * (packed.c's layout, cols values a row) and j in [0, nj): packed.c's order of operations,
 * bit for bit in both. The AVX-512 one needs F/BW/VL/DQ/VNNI; the reference runs anywhere. */
void em_mm_q8_0x16_avx512(const void *packed, int64_t n_groups, int64_t cols, const void *act, uint64_t stride,
                          int64_t nj, float *y, int64_t ldy);
void em_mm_q8_0x16_ref(const void *packed, int64_t n_groups, int64_t cols, const void *act, uint64_t stride,
                       int64_t nj, float *y, int64_t ldy);

/* Converts n floats (a multiple of 32) to Q8_0 blocks at out, byte for byte what
 * em_quantize(EM_TYPE_Q8_0, ...) writes. AVX-512 F/BW/VL/DQ only. */
void em_act_q8_0_avx512(const float *x, void *out, int64_t n);

#endif

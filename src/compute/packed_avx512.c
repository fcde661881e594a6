/* The AVX-512 VNNI product of packed Q8_0 weights (packed.c's layout: 16 rows interleaved)
 * and Q8_0 activation rows. The 16 lanes of a register are the 16 rows of a group: per block,
 * eight dpbusd of the group's unsigned quants (q + 128) with the activation's 4 bytes of each
 * step broadcast, started from -128 * sum(q_a) so the int32 lanes end at the exact sum of
 * q_w q_a; then one scale product and one fma for 16 outputs. Activation rows go 8 at a time
 * (8 accumulators of each kind stay in registers), blocks in chunks of CHUNK_BLOCKS so the
 * per-chunk tables of activation scales and corrections stay small; between chunks an
 * output's accumulator waits in y (a float stored and loaded: the same value).
 *
 * Invariant: every output is packed.c's acc = fma(d_w * d_a, (float)sum, acc) over blocks in
 * order from 0, lane by lane, so bit for bit em_mm_q8_0x16_ref whatever the rows, their
 * number or the chunking (tests/test_compute.c). */
#include "compute/matmul_kernels.h"

#include <immintrin.h>
#include <string.h>

#include "base/base.h"
#include "compute/compute.h"
#include "quant/blocks.h"

#define ROWS_AT_ONCE 8
#define CHUNK_BLOCKS 64
#define UNROLL _Pragma("GCC unroll 8")

typedef struct act_tab {
    float d[ROWS_AT_ONCE][CHUNK_BLOCKS];
    int32_t negc[ROWS_AT_ONCE][CHUNK_BLOCKS]; /* -128 * sum of the block's quants */
} act_tab;

static void fill_tab(const uint8_t *act, uint64_t stride, int J, int64_t b0, int64_t nbc, act_tab *t) {
    const __m256i ones = _mm256_set1_epi8(1);
    for (int j = 0; j < J; j++) {
        const em_block_q8_0 *a = (const em_block_q8_0 *)(const void *)(act + (uint64_t)j * stride) + b0;
        for (int64_t b = 0; b < nbc; b++) {
            /* sum of 32 int8: dpbusd(1, q) per 4 bytes, then the 8 lanes (exact integers) */
            const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, _mm256_loadu_si256((const __m256i *)a[b].qs));
            t->negc[j][b] = -128 * _mm512_reduce_add_epi32(_mm512_zextsi256_si512(s));
            t->d[j][b] = _cvtsh_ss(a[b].d);
        }
    }
}

static inline int32_t quad(const em_block_q8_0 *a, int k) {
    int32_t v;
    memcpy(&v, a->qs + 4 * k, sizeof v);
    return v;
}

/* One group of 16 rows against J activation rows, blocks [b0, b0 + nbc). */
static inline __attribute__((always_inline)) void group_rows(const uint8_t *q, const uint16_t *scales, int64_t b0,
                                                              int64_t nbc, const uint8_t *act, uint64_t stride,
                                                              const act_tab *t, float *y, int64_t ldy,
                                                              const int J) {
    __m512 acc[ROWS_AT_ONCE];
    UNROLL for (int j = 0; j < J; j++) acc[j] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(y + j * ldy);
    for (int64_t bc = 0; bc < nbc; bc++) {
        const int64_t b = b0 + bc;
        const uint8_t *qb = q + (uint64_t)b * EM_PACK_QUANT_BYTES;
        __m512i s[ROWS_AT_ONCE];
        UNROLL for (int j = 0; j < J; j++) s[j] = _mm512_set1_epi32(t->negc[j][bc]);
        UNROLL for (int k = 0; k < 8; k++) {
            const __m512i w = _mm512_loadu_si512((const void *)(qb + k * 64));
            UNROLL for (int j = 0; j < J; j++) {
                const em_block_q8_0 *a = (const em_block_q8_0 *)(const void *)(act + (uint64_t)j * stride) + b;
                s[j] = _mm512_dpbusd_epi32(s[j], w, _mm512_set1_epi32(quad(a, k)));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(scales + b * EM_PACK_ROWS)));
        UNROLL for (int j = 0; j < J; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(t->d[j][bc])), _mm512_cvtepi32_ps(s[j]), acc[j]);
    }
    UNROLL for (int j = 0; j < J; j++) _mm512_storeu_ps(y + j * ldy, acc[j]);
}

void em_mm_q8_0x16_avx512(const void *packed, int64_t n_groups, int64_t cols, const void *act, uint64_t stride,
                          int64_t nj, float *y, int64_t ldy) {
    const int64_t nb = cols / 32;
    const uint64_t group_bytes = EM_PACK_GROUP_BYTES((uint64_t)nb);
    act_tab t;
    for (int64_t j0 = 0; j0 < nj; j0 += ROWS_AT_ONCE) {
        const int J = nj - j0 < ROWS_AT_ONCE ? (int)(nj - j0) : ROWS_AT_ONCE;
        const uint8_t *a = (const uint8_t *)act + (uint64_t)j0 * stride;
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK_BLOCKS) {
            const int64_t nbc = nb - b0 < CHUNK_BLOCKS ? nb - b0 : CHUNK_BLOCKS;
            fill_tab(a, stride, J, b0, nbc, &t);
            for (int64_t g = 0; g < n_groups; g++) {
                const uint8_t *q = (const uint8_t *)packed + (uint64_t)g * group_bytes;
                const uint16_t *scales = (const uint16_t *)(const void *)(q + (uint64_t)nb * EM_PACK_QUANT_BYTES);
                float *yg = y + j0 * ldy + g * EM_PACK_ROWS;
                switch (J) {
                case 8: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 8); break;
                case 7: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 7); break;
                case 6: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 6); break;
                case 5: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 5); break;
                case 4: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 4); break;
                case 3: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 3); break;
                case 2: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 2); break;
                default: group_rows(q, scales, b0, nbc, a, stride, &t, yg, ldy, 1); break;
                }
            }
        }
    }
}

/* Q8_0 matrices packed 16 rows at a time for the CPU's products (em_mat.packed). Owns the
 * packed layout, the packing, the decision whether a matrix is packed, and the portable
 * twin of the AVX-512 kernel (packed_avx512.c).
 *
 * Why: a Q8_0 row against a Q8_0 activation row in the rows' own layout spends, per two
 * blocks, a VNNI product, a conversion, a scale product and an fma on 64 multiply-adds,
 * and a horizontal sum per output. With 16 rows interleaved, the 16 lanes of a register are
 * 16 outputs: one VNNI product per 4 columns of 16 rows (the activation's 4 bytes broadcast),
 * the scale product and fma once per block for 16 outputs, no horizontal sums. Measured
 * 3-4x the multiply-adds a second on the shapes of the default pair at every width 1..8
 * (models/README.md).
 *
 * Layout of a group of 16 rows (rows 16g .. 16g + 15) of nb blocks, EM_PACK_GROUP_BYTES(nb):
 *   quants: nb x 8 steps x 64 bytes; step k of block b holds, for row r = 0..15, the bytes
 *           qs[4k .. 4k + 3] of the row's block b, each XOR 0x80 (so unsigned: q + 128);
 *   scales: nb x 16 fp16, the rows' block scales d.
 *
 * Invariant (the one the products rely on): output (row r, activation row j) is
 *   acc = 0; for b in 0..nb-1: acc = fma(d_w * d_a, (float)sum_i q_w[i] q_a[i], acc)
 * in fp32 with the integer sum exact, whichever kernel, width or thread computes it. So a
 * verify row is bit for bit the single-row decode of the same token (width invariance), and
 * em_mm_q8_0x16_ref below is the reference the AVX-512 kernel is tested against. These
 * floats differ from the unpacked path's (another order of the same exact block sums), so a
 * matrix is packed or not for the whole life of a model, never per call. */
#include "compute/compute.h"

#include <stdlib.h>
#include <string.h>

#include "compute/matmul_kernels.h"
#include "quant/blocks.h"

/* A model packs at most PACK_MAX_BYTES of dense matrices (and as much again of experts).
 * Packing pays where the products are compute-bound: weights read from cache, or many rows
 * (prefill, verify). Streamed from DRAM at one row the packed kernel ran 25% slower than the
 * rows as stored (bench_quant --path packed against --path matmul, 128 MiB of Q8_0, 2
 * threads: 26-29 against 35-38 GB/s), so a model too large for the cache keeps its layout. */
#define PACK_MAX_BYTES (64ull << 20)

uint64_t em_mat_pack_budget(void) {
    const char *env = getenv("EMBER_PACK");
    return em_isa_default() != EM_ISA_AVX512 || (env && !strcmp(env, "off")) ? 0 : PACK_MAX_BYTES;
}

bool em_mat_packable(const em_mat *m) {
    return m->type == EM_TYPE_Q8_0 && m->data && !m->packed && m->rows > 0 && m->rows % EM_PACK_ROWS == 0 &&
           m->cols > 0 && m->cols % 32 == 0 && m->cols / 32 <= EM_PACK_MAX_BLOCKS &&
           m->row_bytes == (uint64_t)m->cols / 32 * sizeof(em_block_q8_0);
}

uint64_t em_mat_packed_bytes(const em_mat *m) {
    return (uint64_t)(m->rows / EM_PACK_ROWS) * EM_PACK_GROUP_BYTES((uint64_t)m->cols / 32);
}

/* One group: 16 rows of nb blocks (row r at rows + r * row_bytes) into out, the layout above. */
static void pack_group(const uint8_t *rows, uint64_t row_bytes, int64_t nb, uint8_t *out) {
    uint16_t *scales = (uint16_t *)(void *)(out + (uint64_t)nb * EM_PACK_QUANT_BYTES);
    for (int r = 0; r < EM_PACK_ROWS; r++) {
        const em_block_q8_0 *row = (const em_block_q8_0 *)(const void *)(rows + (uint64_t)r * row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            scales[b * EM_PACK_ROWS + r] = row[b].d;
            for (int k = 0; k < 8; k++) { /* 4 bytes at a time, each ^ 0x80 */
                uint32_t q;
                memcpy(&q, row[b].qs + 4 * k, 4);
                q ^= 0x80808080u;
                memcpy(out + (uint64_t)b * EM_PACK_QUANT_BYTES + k * 64 + r * 4, &q, 4);
            }
        }
    }
}

void em_mat_pack(em_mat *m, void *dst) {
    const int64_t nb = m->cols / 32;
    const uint64_t group = EM_PACK_GROUP_BYTES((uint64_t)nb);
    for (int64_t g = 0; g < m->rows / EM_PACK_ROWS; g++)
        pack_group((const uint8_t *)m->data + (uint64_t)g * EM_PACK_ROWS * m->row_bytes, m->row_bytes, nb,
                   (uint8_t *)dst + (uint64_t)g * group);
    m->packed = dst;
}

/* A group of 16 rows takes exactly the bytes of its packed form, so each group is copied
 * aside and packed back over itself. */
void em_mat_pack_inplace(em_mat *m, void *data, void *tmp) {
    const int64_t nb = m->cols / 32;
    const uint64_t group = EM_PACK_GROUP_BYTES((uint64_t)nb);
    for (int64_t g = 0; g < m->rows / EM_PACK_ROWS; g++) {
        uint8_t *at = (uint8_t *)data + (uint64_t)g * group;
        memcpy(tmp, at, group);
        pack_group(tmp, m->row_bytes, nb, at);
    }
    m->data = data;
    m->packed = data;
}

void em_mm_q8_0x16_ref(const void *packed, int64_t n_groups, int64_t cols, const void *act, uint64_t stride,
                       int64_t nj, float *y, int64_t ldy) {
    const int64_t nb = cols / 32;
    for (int64_t g = 0; g < n_groups; g++) {
        const uint8_t *q = (const uint8_t *)packed + (uint64_t)g * EM_PACK_GROUP_BYTES(nb);
        const uint16_t *scales = (const uint16_t *)(const void *)(q + (uint64_t)nb * EM_PACK_QUANT_BYTES);
        for (int64_t j = 0; j < nj; j++) {
            const em_block_q8_0 *a = (const em_block_q8_0 *)(const void *)((const uint8_t *)act + (uint64_t)j * stride);
            for (int r = 0; r < EM_PACK_ROWS; r++) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    int32_t sum = 0;
                    for (int k = 0; k < 8; k++)
                        for (int i = 0; i < 4; i++)
                            sum += (int32_t)(int8_t)(q[(uint64_t)b * EM_PACK_QUANT_BYTES + k * 64 + r * 4 + i] ^ 0x80) *
                                   a[b].qs[4 * k + i];
                    const float d = em_fp16_to_fp32(scales[b * EM_PACK_ROWS + r]) * em_fp16_to_fp32(a[b].d);
                    acc = fmaf(d, (float)sum, acc);
                }
                y[j * ldy + g * EM_PACK_ROWS + r] = acc;
            }
        }
    }
}

/* quant/dot_iq.c: the scalar reference dot kernels of the IQ weight formats (IQ1_S, IQ1_M,
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S with Q8_K activations; IQ4_NL with Q8_0; IQ4_XS with
 * Q8_K: ggml's pairings), listed in dot.c's scalar table.
 *
 * Every IQ value is an integer times a scale that is constant per block:
 *   IQ2_*:   d * (2s+1)/8 * g        (g a grid magnitude with its sign; s the 4-bit scale)
 *   IQ3_XXS: d * (2s+1)/4 * g,   IQ3_S: d * (2s+1) * g
 *   IQ1_*:   d * (2s+1)/8 * (8g + delta)   (g in {-1,0,1}, delta = +-1: the +-1/8 shift)
 *   IQ4_*:   d * (ls-32) * k       (k a code point; IQ4_NL has no ls)
 * so, as for the other formats, each block's products are summed exactly in int32 (weights
 * x activation quants x the small integer scale) and then scaled once by d_w * d_a * factor.
 * That equals dequantize-then-f32-dot up to float rounding. Bounds: |g| <= 62, |8g+delta| <= 9,
 * |k| <= 127, |ls-32| <= 32, quants <= 127: a block sum stays below 2^28. The SIMD kernels
 * (dot_avx2.c, dot_avx512.c) compute the same integers. */
#include "quant/dot_kernels.h"
#include "quant/iq_grids.h"

static inline float h2f(uint16_t h) { return em_fp16_to_fp32(h); }

/* Value j (0..7) of a packed grid entry, as an unsigned magnitude (IQ2/IQ3) or signed (IQ1). */
static inline int grid_mag(uint64_t entry, int j) { return (uint8_t)(entry >> (8 * j)); }
static inline int grid_s8(uint64_t entry, int j) { return (int8_t)(uint8_t)(entry >> (8 * j)); }

/* sum_j (+-g_j) * a_j over a group of 8: bit j of signs negates value j. */
static inline int32_t signed_group_dot(uint64_t entry, uint8_t signs, const int8_t *a) {
    int32_t sum = 0;
    for (int j = 0; j < 8; j++) {
        const int v = grid_mag(entry, j) * a[j];
        sum += (signs >> j) & 1 ? -v : v;
    }
    return sum;
}

static inline uint64_t grid_pair(uint32_t lo, uint32_t hi) { return lo | (uint64_t)hi << 32; }

float em_dot_iq2_xxs_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_xxs *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            uint32_t aux[2];
            memcpy(aux, w[b].qs + 4 * s, sizeof aux);
            int32_t sub = 0;
            for (int l = 0; l < 4; l++)
                sub += signed_group_dot(em_iq2xxs_grid[(aux[0] >> (8 * l)) & 255],
                                        em_iq_ksigns[(aux[1] >> (7 * l)) & 127], a[b].qs + 32 * s + 8 * l);
            isum += (int32_t)(2 * (aux[1] >> 28) + 1) * sub;
        }
        sum += h2f(w[b].d) * a[b].d * 0.125f * (float)isum;
    }
    return sum;
}

float em_dot_iq2_xs_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_xs *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            for (int l = 0; l < 4; l++) {
                const uint16_t q = w[b].qs[4 * s + l];
                const int ls = 2 * ((w[b].scales[s] >> (4 * (l / 2))) & 15) + 1;
                isum += ls * signed_group_dot(em_iq2xs_grid[q & 511], em_iq_ksigns[q >> 9],
                                              a[b].qs + 32 * s + 8 * l);
            }
        }
        sum += h2f(w[b].d) * a[b].d * 0.125f * (float)isum;
    }
    return sum;
}

float em_dot_iq2_s_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq2_s *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        const uint8_t *signs = w[b].qs + EM_QK_K / 8;
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            for (int l = 0; l < 4; l++) {
                const int idx = w[b].qs[4 * s + l] | (((w[b].qh[s] >> (2 * l)) & 3) << 8);
                const int ls = 2 * ((w[b].scales[s] >> (4 * (l / 2))) & 15) + 1;
                isum += ls * signed_group_dot(em_iq2s_grid[idx], signs[4 * s + l], a[b].qs + 32 * s + 8 * l);
            }
        }
        sum += h2f(w[b].d) * a[b].d * 0.125f * (float)isum;
    }
    return sum;
}

float em_dot_iq3_xxs_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq3_xxs *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 8 * s;
            uint32_t aux;
            memcpy(&aux, w[b].qs + EM_QK_K / 4 + 4 * s, sizeof aux);
            int32_t sub = 0;
            for (int l = 0; l < 4; l++)
                sub += signed_group_dot(grid_pair(em_iq3xxs_grid[q[2 * l]], em_iq3xxs_grid[q[2 * l + 1]]),
                                        em_iq_ksigns[(aux >> (7 * l)) & 127], a[b].qs + 32 * s + 8 * l);
            isum += (int32_t)(2 * (aux >> 28) + 1) * sub;
        }
        sum += h2f(w[b].d) * a[b].d * 0.25f * (float)isum;
    }
    return sum;
}

float em_dot_iq3_s_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq3_s *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            const uint8_t *q = w[b].qs + 8 * s;
            const int qh = w[b].qh[s];
            int32_t sub = 0;
            for (int l = 0; l < 4; l++) {
                const int i0 = q[2 * l] | (((qh >> (2 * l)) & 1) << 8);
                const int i1 = q[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
                sub += signed_group_dot(grid_pair(em_iq3s_grid[i0], em_iq3s_grid[i1]), w[b].signs[4 * s + l],
                                        a[b].qs + 32 * s + 8 * l);
            }
            isum += (2 * ((w[b].scales[s / 2] >> (4 * (s % 2))) & 15) + 1) * sub;
        }
        sum += h2f(w[b].d) * a[b].d * (float)isum;
    }
    return sum;
}

/* sum_j (8 g_j + delta) * a_j over an IQ1 group of 8 (delta = +-1). */
static inline int32_t iq1_group_dot(int idx, int delta, const int8_t *a) {
    const uint64_t entry = em_iq1s_grid[idx];
    int32_t sum = 0;
    for (int j = 0; j < 8; j++) sum += (8 * grid_s8(entry, j) + delta) * a[j];
    return sum;
}

float em_dot_iq1_s_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq1_s *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            const uint16_t qh = w[b].qh[s];
            const int delta = qh & 0x8000 ? -1 : 1;
            int32_t sub = 0;
            for (int l = 0; l < 4; l++)
                sub += iq1_group_dot(w[b].qs[4 * s + l] | (((qh >> (3 * l)) & 7) << 8), delta,
                                     a[b].qs + 32 * s + 8 * l);
            isum += (2 * ((qh >> 12) & 7) + 1) * sub;
        }
        sum += h2f(w[b].d) * a[b].d * 0.125f * (float)isum;
    }
    return sum;
}

float em_dot_iq1_m_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq1_m *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint16_t sc[4];
        memcpy(sc, w[b].scales, sizeof sc);
        const uint16_t dbits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                          (sc[3] & 0xf000));
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            for (int l = 0; l < 4; l++) {
                const int nib = (w[b].qh[2 * s + l / 2] >> (4 * (l % 2))) & 15;
                const int ls = 2 * ((sc[s / 2] >> (6 * (s % 2) + 3 * (l / 2))) & 7) + 1;
                isum += ls * iq1_group_dot(w[b].qs[4 * s + l] | ((nib & 7) << 8), nib & 8 ? -1 : 1,
                                           a[b].qs + 32 * s + 8 * l);
            }
        }
        sum += h2f(dbits) * a[b].d * 0.125f * (float)isum;
    }
    return sum;
}

float em_dot_iq4_nl_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq4_nl *w = vw;
    const em_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK4_NL; b++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            isum += em_iq4nl_values[w[b].qs[j] & 15] * a[b].qs[j];
            isum += em_iq4nl_values[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        }
        sum += h2f(w[b].d) * h2f(a[b].d) * (float)isum;
    }
    return sum;
}

float em_dot_iq4_xs_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_iq4_xs *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int s = 0; s < 8; s++) {
            const int ls = ((w[b].scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((w[b].scales_h >> (2 * s)) & 3) << 4);
            const uint8_t *q = w[b].qs + 16 * s;
            const int8_t *y = a[b].qs + 32 * s;
            int32_t sub = 0;
            for (int j = 0; j < 16; j++)
                sub += em_iq4nl_values[q[j] & 15] * y[j] + em_iq4nl_values[q[j] >> 4] * y[j + 16];
            isum += (ls - 32) * sub;
        }
        sum += h2f(w[b].d) * a[b].d * (float)isum;
    }
    return sum;
}

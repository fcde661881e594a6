/* AVX-512 VNNI register-tiled product of Q8_0 weight rows and Q8_0 activation rows (the
 * prefill and wide-verify path of em_matmul_act). A tile of TILE_R weight rows x TILE_J
 * activation rows walks the rows four blocks at a time: every 64-byte load of quants feeds
 * several products, the offset correction dpbusd(0x80, y) and the scale conversions are made
 * once per activation (weight) row instead of once per pair, and the per-block scale
 * products come from pre-spread vectors. Rows of up to 2048 values (the verify and decode
 * shapes of small and mid-size models) take the activation-major form, and rows of 1..3
 * blocks their own form; both keep the accumulators of 16 (8) outputs and form their
 * horizontal sums together (hsum_avx512.h), since for short rows those sums cost as much as
 * the products.
 *
 * Invariant: each output is computed with exactly the operations of dot_q8_0_avx512
 * (quant/dot_avx512.c) in the same order: per two blocks the exact int32 sums p of the
 * products of each 4-value group (there dpbusd(u, y) - dpbusd(0x80, y) with u = q_w ^ 0x80;
 * here also formed other ways, each exact, so the same integers), acc = fma(d_w * d_a spread
 * over the two blocks' lanes, float(p), acc) into two accumulators (blocks 4k, 4k+1 and
 * 4k+2, 4k+3), the same horizontal sum of acc0 + acc1 (the same lane pairs in the same
 * order, also when 16 outputs are summed together), and the AVX2 kernel for the last
 * cols/32 % 4 blocks. So the result is bit-identical to the dot product the single-row
 * path would give, and a row never depends on which rows it was tiled with
 * (tests/test_compute.c checks this). If that dot kernel's arithmetic changes, this file
 * must follow. */
#include "compute/matmul_kernels.h"

#include <immintrin.h>

#include "compute/hsum_avx512.h"
#include "quant/blocks.h"
#include "quant/simd.h"

#define TILE_R 2
#define TILE_J 4
#define UNROLL _Pragma("GCC unroll 8")

static inline __m512i pair_quants(const em_block_q8_0 *b) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i hi = _mm256_loadu_si256((const __m256i *)b[1].qs);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* d of four consecutive blocks as floats (fp16 -> fp32 is exact however it is done). */
static inline __m128 scales4(const em_block_q8_0 *b) {
    return _mm_cvtph_ps(_mm_setr_epi16((short)b[0].d, (short)b[1].d, (short)b[2].d, (short)b[3].d, 0, 0, 0, 0));
}

/* Lanes 0..7 get s[first], lanes 8..15 s[first + 1]: the scales of two blocks over the int32
 * lanes their dpbusd sums land in. */
static inline __m512 spread_pair(__m128 s, int first) {
    const __m512i idx = _mm512_set_epi32(first + 1, first + 1, first + 1, first + 1, first + 1, first + 1, first + 1,
                                         first + 1, first, first, first, first, first, first, first, first);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

/* One tile of R weight rows x J activation rows (R <= TILE_R, J <= TILE_J, constants at
 * every call so the arrays live in registers). */
static inline __attribute__((always_inline)) void tile(const uint8_t *w, uint64_t row_bytes, const uint8_t *act,
                                                        uint64_t stride, int64_t nb, float *y, int64_t ldy,
                                                        em_dot_fn tail, const int R, const int J) {
    const __m512i off = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512 acc0[TILE_R][TILE_J], acc1[TILE_R][TILE_J];
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int j = 0; j < J; j++) acc0[r][j] = acc1[r][j] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        __m512i u0[TILE_R], u1[TILE_R];
        __m512 w0[TILE_R], w1[TILE_R];
        UNROLL for (int r = 0; r < R; r++) {
            const em_block_q8_0 *wr = (const em_block_q8_0 *)(const void *)(w + (uint64_t)r * row_bytes) + b;
            u0[r] = _mm512_xor_si512(pair_quants(wr), off);
            u1[r] = _mm512_xor_si512(pair_quants(wr + 2), off);
            const __m128 s = scales4(wr);
            w0[r] = spread_pair(s, 0);
            w1[r] = spread_pair(s, 2);
        }
        UNROLL for (int j = 0; j < J; j++) {
            const em_block_q8_0 *aj = (const em_block_q8_0 *)(const void *)(act + (uint64_t)j * stride) + b;
            const __m512i y0 = pair_quants(aj), y1 = pair_quants(aj + 2);
            const __m512i c0 = _mm512_dpbusd_epi32(zero, off, y0), c1 = _mm512_dpbusd_epi32(zero, off, y1);
            const __m128 s = scales4(aj);
            const __m512 a0 = spread_pair(s, 0), a1 = spread_pair(s, 2);
            UNROLL for (int r = 0; r < R; r++) {
                const __m512i p0 = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u0[r], y0), c0);
                const __m512i p1 = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u1[r], y1), c1);
                acc0[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(w0[r], a0), _mm512_cvtepi32_ps(p0), acc0[r][j]);
                acc1[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(w1[r], a1), _mm512_cvtepi32_ps(p1), acc1[r][j]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++)
        UNROLL for (int j = 0; j < J; j++) {
            float sum = em_hsum512_ps(_mm512_add_ps(acc0[r][j], acc1[r][j]));
            if (b < nb)
                sum += tail(w + (uint64_t)r * row_bytes + (uint64_t)b * sizeof(em_block_q8_0),
                            act + (uint64_t)j * stride + (uint64_t)b * sizeof(em_block_q8_0), (nb - b) * 32);
            y[j * ldy + r] = sum;
        }
}

/* R weight rows against activation rows [0, nj) in tiles of TILE_J. */
static inline __attribute__((always_inline)) void row_group(const uint8_t *w, uint64_t row_bytes,
                                                             const uint8_t *act, uint64_t stride, int64_t nj,
                                                             int64_t nb, float *y, int64_t ldy, em_dot_fn tail,
                                                             const int R) {
    int64_t j = 0;
    for (; j + TILE_J <= nj; j += TILE_J)
        tile(w, row_bytes, act + (uint64_t)j * stride, stride, nb, y + j * ldy, ldy, tail, R, TILE_J);
    const uint8_t *a = act + (uint64_t)j * stride;
    float *yj = y + j * ldy;
    switch (nj - j) {
    case 3: tile(w, row_bytes, a, stride, nb, yj, ldy, tail, R, 3); break;
    case 2: tile(w, row_bytes, a, stride, nb, yj, ldy, tail, R, 2); break;
    case 1: tile(w, row_bytes, a, stride, nb, yj, ldy, tail, R, 1); break;
    default: break;
    }
}

/* ---- the activation-major form ------------------------------------------------------------
 * For a few activation rows against many weight rows (decoding and verification): what
 * depends only on an activation row (its quants made unsigned, ua = y ^ 0x80, and its scales
 * spread over the lanes) is made once per call, in PRE_J rows x up to PRE_STEPS groups of
 * four blocks on the stack, and each weight row then meets up to PRE_J activation rows with
 * its own quants, scales and correction made once. Here the activation is the unsigned side
 * of dpbusd and the weight the signed one: per pair and two blocks p = dpbusd(-c_w, ua, x)
 * with c_w = dpbusd(0x80, x), which is sum (y + 128) x - 128 sum x = sum x y, the same exact
 * int32 as the other forms (no sum comes near 2^31), then the same mul and fma as above. So
 * the correction belongs to the weight row (made once for all its activation rows) and a
 * pair loads only ua and the scales. */
#define PRE_J 8
#define PRE_STEPS 32 /* the precomputed steps: rows up to 4096 values */
/* Up to 2048 values every width takes the activation-major form; wider rows only when few
 * activation rows (decoding, narrow verifies) meet them. Measured with bench_quant --path
 * matmul, 2 threads, weight GB/s against the tiles above: 4096 columns, 1 row +12-20%, 2 rows
 * +12%, 4 rows -4%, 16 rows -14%; 2304 and 3072 columns, 1 row +20-30%, 2304 and 2 rows +9%. */
#define PRE_STEPS_ANY 16
#define WIDE_ROWS 2
/* Software prefetch of the weight rows about PREFETCH_BYTES ahead of the row being read (at
 * least one row), into L2 (T1). Measured with bench_quant --path matmul on the development
 * VM (2 threads, 512 MiB of Q8_0, one activation row, as % of a plain read of the same bytes
 * just before): a fixed 4 rows ahead gave 81% on 2176-byte rows and 87% on 544-byte ones, 8
 * rows 78% and 91%, so the distance is in bytes; into L2 instead of L1 (T1, not T0) 87-88%
 * and 93-94% (likely: the L1 fill buffers stay free for the loads); 6 or 12 KiB ahead alike. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 6144
#endif

/* The rows of a task are a short stream the hardware prefetcher barely learns, so each row
 * asks for the one PREFETCH_BYTES ahead. Also past the task's end: a prefetch never faults,
 * and the rows there are mostly the same thread's next task (em_pool hands each thread a
 * contiguous share) or the next matrix of the file, so the stream does not restart cold. */
static inline void prefetch_rows(const uint8_t *row, uint64_t skip, uint64_t bytes) {
    const uintptr_t a = (uintptr_t)row + skip; /* may lie past the object: never dereferenced */
    for (uint64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(a + o), _MM_HINT_T1);
}

typedef struct act_pre {
    __m512i ua[2]; /* the quants of blocks 4k, 4k+1 and 4k+2, 4k+3, back to back, ^ 0x80 */
    __m512 s[2];   /* d_a spread over those blocks' lanes */
} act_pre;

/* d of blocks 0..3 of a run of Q8_0 blocks: words 0 and 17 of the 64 bytes at b[0] and at b[2]. */
static inline __m128 scales4_fast(const em_block_q8_0 *b) {
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 32 + 17, 32, 17, 0);
    const __m512i lo = _mm512_loadu_si512((const void *)b), hi = _mm512_loadu_si512((const void *)(b + 2));
    return _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, idx, hi)));
}
_Static_assert(sizeof(em_block_q8_0) == 34, "q8_0 block layout");

static void act_precompute(const uint8_t *act, uint64_t stride, int64_t nj, int64_t steps, act_pre *pre) {
    const __m512i off = _mm512_set1_epi8((char)0x80);
    for (int64_t j = 0; j < nj; j++) {
        const em_block_q8_0 *a = (const em_block_q8_0 *)(const void *)(act + (uint64_t)j * stride);
        for (int64_t k = 0; k < steps; k++, a += 4) {
            act_pre *p = &pre[j * steps + k];
            p->ua[0] = _mm512_xor_si512(pair_quants(a), off);
            p->ua[1] = _mm512_xor_si512(pair_quants(a + 2), off);
            const __m128 sc = scales4_fast(a);
            p->s[0] = spread_pair(sc, 0);
            p->s[1] = spread_pair(sc, 2);
        }
    }
}

/* A weight row's quants x of blocks b, b + 1 and their correction -dpbusd(0x80, x). */
static inline __m512i weight_pair(const em_block_q8_0 *b, __m512i *negc) {
    const __m512i x = pair_quants(b), zero = _mm512_setzero_si512();
    *negc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)0x80), x));
    return x;
}

/* ---- many horizontal sums at once ------------------------------------------------------------
 * A product of a few hundred columns is only a few steps of the loops above per output, so
 * the horizontal sum of each output would cost about as much as its products. Instead the
 * accumulators of RED_R outputs are kept and summed together by em_hsum512_x16 (hsum_avx512.h),
 * bit for bit em_hsum512_ps's sums. */
#define RED_R 16

/* One weight row against J activation rows (J <= PRE_J, a constant at every call): the
 * accumulators acc0 + acc1 of output j go to part[j * RED_R] (summed by em_hsum512_x16). */
static inline __attribute__((always_inline)) void row_vs_acts(const uint8_t *w, const act_pre *pre, int64_t steps,
                                                               __m512 *part, const int J) {
    __m512 acc0[PRE_J], acc1[PRE_J];
    UNROLL for (int j = 0; j < J; j++) acc0[j] = acc1[j] = _mm512_setzero_ps();
    const em_block_q8_0 *wr = (const em_block_q8_0 *)(const void *)w;
    for (int64_t k = 0; k < steps; k++, wr += 4) {
        __m512i c0, c1;
        const __m512i x0 = weight_pair(wr, &c0), x1 = weight_pair(wr + 2, &c1);
        const __m128 sw = scales4_fast(wr);
        const __m512 w0 = spread_pair(sw, 0), w1 = spread_pair(sw, 2);
        UNROLL for (int j = 0; j < J; j++) {
            const act_pre *p = &pre[j * steps + k];
            const __m512i p0 = _mm512_dpbusd_epi32(c0, p->ua[0], x0);
            const __m512i p1 = _mm512_dpbusd_epi32(c1, p->ua[1], x1);
            acc0[j] = _mm512_fmadd_ps(_mm512_mul_ps(w0, p->s[0]), _mm512_cvtepi32_ps(p0), acc0[j]);
            acc1[j] = _mm512_fmadd_ps(_mm512_mul_ps(w1, p->s[1]), _mm512_cvtepi32_ps(p1), acc1[j]);
        }
    }
    UNROLL for (int j = 0; j < J; j++) part[j * RED_R] = _mm512_add_ps(acc0[j], acc1[j]);
}

/* Two weight rows against J activation rows (J <= 4, a constant at every call): each
 * activation row's precomputed vectors are loaded once for both weight rows. Outputs as
 * row_vs_acts, rows r and r + 1 at part[j * RED_R] and part[j * RED_R + 1]. */
static inline __attribute__((always_inline)) void rows2_vs_acts(const uint8_t *w, uint64_t row_bytes, const act_pre *pre,
                                                                int64_t steps, __m512 *part, const int J) {
    __m512 acc0[2][4], acc1[2][4];
    UNROLL for (int j = 0; j < J; j++) acc0[0][j] = acc1[0][j] = acc0[1][j] = acc1[1][j] = _mm512_setzero_ps();
    const em_block_q8_0 *wa = (const em_block_q8_0 *)(const void *)w;
    const em_block_q8_0 *wb = (const em_block_q8_0 *)(const void *)(w + row_bytes);
    for (int64_t k = 0; k < steps; k++, wa += 4, wb += 4) {
        __m512i ca0, ca1, cb0, cb1;
        const __m512i xa0 = weight_pair(wa, &ca0), xa1 = weight_pair(wa + 2, &ca1);
        const __m512i xb0 = weight_pair(wb, &cb0), xb1 = weight_pair(wb + 2, &cb1);
        const __m128 sa = scales4_fast(wa), sb = scales4_fast(wb);
        const __m512 wa0 = spread_pair(sa, 0), wa1 = spread_pair(sa, 2), wb0 = spread_pair(sb, 0), wb1 = spread_pair(sb, 2);
        UNROLL for (int j = 0; j < J; j++) {
            const act_pre *p = &pre[j * steps + k];
            const __m512i u0 = p->ua[0], u1 = p->ua[1];
            const __m512 s0 = p->s[0], s1 = p->s[1];
            acc0[0][j] = _mm512_fmadd_ps(_mm512_mul_ps(wa0, s0), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(ca0, u0, xa0)), acc0[0][j]);
            acc1[0][j] = _mm512_fmadd_ps(_mm512_mul_ps(wa1, s1), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(ca1, u1, xa1)), acc1[0][j]);
            acc0[1][j] = _mm512_fmadd_ps(_mm512_mul_ps(wb0, s0), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cb0, u0, xb0)), acc0[1][j]);
            acc1[1][j] = _mm512_fmadd_ps(_mm512_mul_ps(wb1, s1), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cb1, u1, xb1)), acc1[1][j]);
        }
    }
    UNROLL for (int j = 0; j < J; j++) {
        part[j * RED_R] = _mm512_add_ps(acc0[0][j], acc1[0][j]);
        part[j * RED_R + 1] = _mm512_add_ps(acc0[1][j], acc1[1][j]);
    }
}

/* Rows r, r + 1 against activation rows [0, J), J <= 4 (with more, loading the pairs' vectors
 * twice costs more than sharing them saves: measured). */
static void rows2_vs_all(const uint8_t *w, uint64_t row_bytes, const act_pre *pre, int64_t steps, __m512 *part,
                         int64_t J) {
    switch (J) {
    case 4: rows2_vs_acts(w, row_bytes, pre, steps, part, 4); break;
    case 3: rows2_vs_acts(w, row_bytes, pre, steps, part, 3); break;
    case 2: rows2_vs_acts(w, row_bytes, pre, steps, part, 2); break;
    default: rows2_vs_acts(w, row_bytes, pre, steps, part, 1); break;
    }
}

/* The R (<= RED_R) outputs of one activation row: the sums of part[0..R), plus the AVX2
 * kernel over blocks [b, nb) of each pair when the rows have such a tail. */
static void store_sums(__m512 *part, int R, const uint8_t *w, uint64_t row_bytes, const uint8_t *act, int64_t b,
                       int64_t nb, float *y, em_dot_fn tail) {
    for (int r = R; r < RED_R; r++) part[r] = _mm512_setzero_ps(); /* lanes that are not stored */
    const __m512 sums = em_hsum512_x16(part);
    if (b == nb) {
        _mm512_mask_storeu_ps(y, (__mmask16)((1u << R) - 1), sums);
        return;
    }
    float s[RED_R];
    _mm512_storeu_ps(s, sums);
    const uint64_t o = (uint64_t)b * sizeof(em_block_q8_0);
    for (int r = 0; r < R; r++) y[r] = s[r] + tail(w + (uint64_t)r * row_bytes + o, act + o, (nb - b) * 32);
}

static void acts_major(const uint8_t *w, uint64_t row_bytes, int64_t nr, const uint8_t *act, uint64_t stride,
                       int64_t nj, int64_t nb, float *y, int64_t ldy, em_dot_fn tail) {
    act_pre pre[PRE_J * PRE_STEPS];
    __m512 part[PRE_J * RED_R];
    const int64_t steps = nb / 4;
    const int64_t ahead = (int64_t)((PREFETCH_BYTES + row_bytes - 1) / row_bytes); /* rows */
    for (int64_t j0 = 0; j0 < nj; j0 += PRE_J) {
        const int64_t J = nj - j0 < PRE_J ? nj - j0 : PRE_J;
        const uint8_t *a = act + (uint64_t)j0 * stride;
        float *yj = y + j0 * ldy;
        act_precompute(a, stride, J, steps, pre);
        prefetch_rows(w, 0, (uint64_t)(ahead < nr ? ahead : nr) * row_bytes); /* the first rows, all at once */
        for (int64_t r0 = 0; r0 < nr; r0 += RED_R) {
            const int R = nr - r0 < RED_R ? (int)(nr - r0) : RED_R;
            const uint8_t *wr = w + (uint64_t)r0 * row_bytes;
            int r = 0;
            if (J > 1 && J <= 4)
                for (; r + 2 <= R; r += 2, wr += 2 * row_bytes) {
                    prefetch_rows(wr, (uint64_t)ahead * row_bytes, 2 * row_bytes);
                    rows2_vs_all(wr, row_bytes, pre, steps, part + r, J);
                }
            for (; r < R; r++, wr += row_bytes) {
                prefetch_rows(wr, (uint64_t)ahead * row_bytes, row_bytes);
                switch (J) {
                case 8: row_vs_acts(wr, pre, steps, part + r, 8); break;
                case 7: row_vs_acts(wr, pre, steps, part + r, 7); break;
                case 6: row_vs_acts(wr, pre, steps, part + r, 6); break;
                case 5: row_vs_acts(wr, pre, steps, part + r, 5); break;
                case 4: row_vs_acts(wr, pre, steps, part + r, 4); break;
                case 3: row_vs_acts(wr, pre, steps, part + r, 3); break;
                case 2: row_vs_acts(wr, pre, steps, part + r, 2); break;
                default: row_vs_acts(wr, pre, steps, part + r, 1); break;
                }
            }
            for (int64_t j = 0; j < J; j++)
                store_sums(part + j * RED_R, R, w + (uint64_t)r0 * row_bytes, row_bytes, a + (uint64_t)j * stride,
                           4 * steps, nb, yj + j * ldy + r0, tail);
        }
    }
}

/* ---- rows of fewer than four blocks ---------------------------------------------------------
 * The AVX-512 dot kernel hands rows of 1..3 blocks whole to the AVX2 Q8_0 kernel, so these
 * outputs must be that kernel's floats: per block the 8 int32 sums of
 * madd(maddubs(|x|, sign(y, x)), 1), the scale d_w * d_a rounded in fp32, an fma into acc0
 * (even blocks) or acc1 (odd blocks), then its horizontal sum of acc0 + acc1. Here two
 * activation rows share a register (lanes 0..7 and 8..15), each lane doing exactly that
 * lane's operations, instead of one call per pair. sign(y, x) zeroes y where x = 0; here
 * y stays, and the product with |x| = 0 is the same 0. The int32 sums come from
 * dpbusd(0, |x|, sign(y, x)): the same byte products summed in 32 bits, and maddubs never
 * saturates on them (|x| <= 128 and sign(y, x) >= -128 make every pair sum >= -32768 and
 * <= 32512), so they are the same integers. The horizontal sums of eight weight rows' pairs
 * are formed together (em_hsum_tree_from_halves: em_hsum256_ps's tree on each half). */
static inline __m512i quants_2x(const em_block_q8_0 *a, const em_block_q8_0 *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a->qs)),
                              _mm256_loadu_si256((const __m256i *)b->qs), 1);
}

#define SHORT_R 8

/* Rows r0.. (R of them, R <= SHORT_R) against the activation pair ya / da, NB blocks each (a
 * constant at every call: the accumulators stay in registers). */
static inline __attribute__((always_inline)) void short_group(const uint8_t *w, uint64_t row_bytes, int R,
                                                               const __m512i *ya, const __m512 *da, __m512 *v,
                                                               const int NB) {
    const __m512i zero = _mm512_setzero_si512();
    for (int r = 0; r < R; r++, w += row_bytes) {
        const em_block_q8_0 *wb = (const em_block_q8_0 *)(const void *)w;
        __m512 acc[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() };
        UNROLL for (int b = 0; b < NB; b++) {
            const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)wb[b].qs));
            /* sign(y, x) but for zeroing where x = 0, which |x| = 0 does anyway */
            const __m512i sy = _mm512_mask_sub_epi8(ya[b], _mm512_movepi8_mask(x), zero, ya[b]);
            const __m512i p = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(x), sy);
            const __m512 d = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(wb[b].d)), da[b]);
            acc[b & 1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc[b & 1]);
        }
        v[r] = _mm512_add_ps(acc[0], acc[1]);
    }
}

static void short_rows(const uint8_t *w, uint64_t row_bytes, int64_t nr, const uint8_t *act, uint64_t stride,
                        int64_t nj, int64_t nb, float *y, int64_t ldy) {
    /* tree lanes (see em_hsum_tree_from_halves) -> row r of activation j at lane r, of j+1 at 8 + r */
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (int64_t j = 0; j < nj; j += 2) {
        const bool pair = j + 1 < nj;
        const em_block_q8_0 *a0 = (const em_block_q8_0 *)(const void *)(act + (uint64_t)j * stride);
        const em_block_q8_0 *a1 = pair ? (const em_block_q8_0 *)(const void *)(act + (uint64_t)(j + 1) * stride) : a0;
        __m512i ya[3];
        __m512 da[3];
        for (int64_t b = 0; b < nb; b++) {
            ya[b] = quants_2x(a0 + b, a1 + b);
            da[b] = _mm512_castsi512_ps(_mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_castps_si256(_mm256_set1_ps(_cvtsh_ss(a0[b].d)))),
                _mm256_castps_si256(_mm256_set1_ps(_cvtsh_ss(a1[b].d))), 1));
        }
        for (int64_t r0 = 0; r0 < nr; r0 += SHORT_R) {
            const int R = nr - r0 < SHORT_R ? (int)(nr - r0) : SHORT_R;
            __m512 v[SHORT_R];
            const uint8_t *wr = w + (uint64_t)r0 * row_bytes;
            switch (nb) {
            case 3: short_group(wr, row_bytes, R, ya, da, v, 3); break;
            case 2: short_group(wr, row_bytes, R, ya, da, v, 2); break;
            default: short_group(wr, row_bytes, R, ya, da, v, 1); break;
            }
            for (int r = R; r < SHORT_R; r++) v[r] = _mm512_setzero_ps(); /* lanes that are not stored */
            const __m512 sums = _mm512_permutexvar_ps(order, em_hsum_tree_from_halves(v));
            const __mmask8 m = (__mmask8)((1u << R) - 1);
            _mm256_mask_storeu_ps(y + j * ldy + r0, m, _mm512_castps512_ps256(sums));
            if (pair) _mm256_mask_storeu_ps(y + (j + 1) * ldy + r0, m, _mm512_extractf32x8_ps(sums, 1));
        }
    }
}

void em_mm_q8_0_avx512(const void *w, uint64_t row_bytes, int64_t nr, const void *act,
                       uint64_t stride, int64_t nj, int64_t cols, float *y, int64_t ldy,
                       em_dot_fn tail) {
    const uint8_t *wb = w;
    const int64_t nb = cols / 32;
    if (nb < 4) {
        short_rows(wb, row_bytes, nr, act, stride, nj, nb, y, ldy);
        return;
    }
    if (nb / 4 <= PRE_STEPS_ANY || (nb / 4 <= PRE_STEPS && nj <= WIDE_ROWS)) {
        acts_major(wb, row_bytes, nr, act, stride, nj, nb, y, ldy, tail);
        return;
    }
    /* Rows under a page: the software prefetch of acts_major. Measured (bench_quant --path
     * matmul, % of a plain read of the same bytes): 2304 columns (Kimi-Linear-48B's width)
     * 58% -> 75-82%, 3072 unchanged; at 4096 it cost 5 points, so longer rows are left to
     * the hardware prefetchers. */
    const uint64_t ahead = row_bytes < 4096 ? (PREFETCH_BYTES + row_bytes - 1) / row_bytes * row_bytes : 0;
    if (ahead) prefetch_rows(wb, 0, ahead);
    int64_t r = 0;
    for (; r + TILE_R <= nr; r += TILE_R) {
        if (ahead) prefetch_rows(wb + (uint64_t)r * row_bytes, ahead, TILE_R * row_bytes);
        row_group(wb + (uint64_t)r * row_bytes, row_bytes, act, stride, nj, nb, y + r, ldy, tail, TILE_R);
    }
    if (r < nr) row_group(wb + (uint64_t)r * row_bytes, row_bytes, act, stride, nj, nb, y + r, ldy, tail, 1);
}

/* ---- activation rows to Q8_0 ---------------------------------------------------------------
 * The reference quantizer (em_quantize, Q8_0) per 32 values: amax = max |x|, d = amax / 127,
 * id = 1 / d (0 when d is 0), q = (int8) roundf(x * id), d stored as fp16 (nearest even).
 * Here the same IEEE operations sixteen at a time; roundf's halves-away-from-zero is exact
 * through the truncated value and its exact remainder. A block holding a NaN or an infinity
 * goes to the reference (its NaN rules depend on the value order). */
#define FP_SPECIAL (0x01 | 0x08 | 0x10 | 0x80) /* fpclass: QNaN, +inf, -inf, SNaN */

static inline __m512 round_half_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t)); /* exact */
    const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
    return _mm512_mask_add_ps(t, up, t, one);
}

void em_act_q8_0_avx512(const float *x, void *out, int64_t n) {
    em_block_q8_0 *o = out;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        if (_mm512_fpclass_ps_mask(v0, FP_SPECIAL) | _mm512_fpclass_ps_mask(v1, FP_SPECIAL)) {
            (void)em_quantize(EM_TYPE_Q8_0, x, &o[i], 32, NULL);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(v0, vid)));
        const __m512i q1 = _mm512_cvttps_epi32(round_half_away(_mm512_mul_ps(v1, vid)));
        o[i].d = (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT), 0);
        _mm_storeu_si128((__m128i *)(void *)o[i].qs, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(void *)(o[i].qs + 16), _mm512_cvtepi32_epi8(q1));
    }
}
